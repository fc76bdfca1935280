"""``jaxspec generate``: tree speculative sampling on the embedded default pair, or on any
pair of local model folders sharing a tokenizer: the byte-level tokenizer of the embedded
models, or a Hugging Face ``tokenizer.json`` in the target's folder (needs the
``tokenizers`` package: the ``hf`` extra). A pair whose vocabularies differ is refused.

::

    jaxspec generate --prompt "def fibonacci(n):"
    jaxspec generate --prompt "import os" --temperature 0 --tree branch:4,2,1 --scheme deterministic
    jaxspec generate --prompt "class Foo:" --baseline          # target-only sampling
    jaxspec generate --prompt "for i in" --json
    jaxspec generate --prompt "def f(x):" --tree auto       # tree chosen for this device
    jaxspec generate --prompt "def f(x):" --tree auto --retune --auto-budgets 4,8,16
    jaxspec generate --target models/SmolLM2-360M --draft models/SmolLM2-135M --prompt "def f(x):"
    jaxspec generate --draft ngram --prompt "$(cat notes.txt)"   # prompt lookup: no draft model
    jaxspec generate --prompt "def f(x):" --compare --temperature 0   # speculative vs target-only

At temperature 0 the speculative and baseline texts are identical (greedy decoding of the
target); at any temperature the speculative text has exactly the law of target sampling.

``--compare`` runs both modes on the same prompt, seed and settings: one untimed first call
each (compilation), then ``--turns`` timed turns in which each mode runs once
(:func:`jaxspec.bench.common.interleaved_turns`, so that a changing machine load hits both
alike); the figures are medians. It prints the speculative text and
``speculative X tok/s vs target-only Y tok/s (Z×); same tokens: yes`` to stderr, and under
``"compare"`` in ``--json``. The timed calls do not stream (streaming runs a round a call,
and target-only, one call per token, would pay more for it than speculation).

``--tree auto`` runs :func:`jaxspec.tuning.autotree.auto_tree` for the pair, scheme and warp
(acceptance on held-out text, round costs timed on this device with the verification rule
``generate`` will use; cached under ``$JAXSPEC_CACHE_DIR`` or ``~/.cache/jaxspec``,
``--retune`` measures again), prints the table and the chosen tree to stderr (and under
``"auto_tree"`` in ``--json``). A prediction is not a measurement: it then times the chosen
tree against target-only decoding with the real ``generate`` calls, as ``--compare`` does,
and where speculation is slower it says so and falls back to target-only decoding
(``"auto_tree"`` records what was measured and what was chosen).
"""

from __future__ import annotations

import argparse
import json
import dataclasses
import sys
import time

from jaxspec.cli import gen_setup as setup
from jaxspec.cli import gen_timing as timing
from jaxspec.cli.common import (
    CLIError,
    Handler,
    check_tokenizer_fits,
    command,
    flag_mesh,
    flag_sampling,
    in_flag_words,
    is_head_flag,
    load_flag_model,
    QUANTIZE_MODES,
    mesh_flag,
    positive_int,
    resolve_tokenizer,
    seed_int,
    utf8_text,
    warn_if_head_for_another_target,
)
from jaxspec.cli.compile_cache import enable_compilation_cache
from jaxspec.cli.compile_time import long_compile_note
from jaxspec.decode.defaults import DEFAULT_SCHEME, DEFAULT_TREE  # the library's (a module without JAX)
from jaxspec.errors import SettingError

__all__ = ["generate_command"]

DEFAULT_TEMPERATURE = 1.0  # jaxspec.generate's and jaxspec.verify's: the model's own law
DEFAULT_AUTO_MAX_DEPTH = 8
DEFAULT_TURNS = 3  # timed turns of each mode for --compare and --tree auto's check
DEFAULT_TARGET, DEFAULT_DRAFT = setup.DEFAULT_TARGET, setup.DEFAULT_DRAFT
DTYPES = ("float32", "bfloat16")
# the dtype a GGUF target loads in without --dtype: the faster of the two for decoding on CPU
# (benchmarks/gguf_smollm2.py measures both; benchmarks/README.md has the figures)
GGUF_DEFAULT_DTYPE = "float32"


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None


@command("generate", help="generate text with tree speculative decoding")
def generate_command(p: argparse.ArgumentParser) -> Handler:
    from jaxspec.core.rules import CHOICES

    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", type=utf8_text,
                       help="raw prompt text (tokenized with the target's tokenizer: a GGUF file's, a folder's "
                            "tokenizer.json, else UTF-8 bytes)")
    given.add_argument("--chat", type=utf8_text, metavar="MESSAGE",
                       help="a user message, put in the target's chat template (GGUF files and folders whose "
                            "tokenizer has one) with the assistant's turn opened; generation stops at the "
                            "model's end-of-turn token")
    p.add_argument("--max-new-tokens", type=_int, default=128, help="token budget (default 128)")
    p.add_argument(
        "--temperature", type=_float, default=DEFAULT_TEMPERATURE,
        help=f"target temperature, 0 = greedy (default {DEFAULT_TEMPERATURE})",
    )
    p.add_argument("--top-k", type=positive_int, default=None, help="target top-k (>= 1)")
    p.add_argument("--top-p", type=_float, default=None, help="target top-p in (0, 1]")
    p.add_argument("--min-p", type=_float, default=None,
                   help="target min-p in [0, 1]: keep the tokens at least this fraction as likely as the most "
                        "likely one")
    p.add_argument(
        "--tree", default=None,
        help="tree spec: 'chain:K', 'branch:3,2,1', 'parents:-1,0,0', "
        f"'dynamic:depth=4,topk=4,nodes=16', or 'auto' (measured for this device) (default {DEFAULT_TREE}; "
        "with a packaged target's own drafter, the tree chosen for it, e.g. chain:1 for smollm2-135m)",
    )
    p.add_argument(
        "--auto-budgets", default=None, metavar="N,N,...",
        help="--tree auto: candidate node counts (default 2,4,6,8,12,16,24,32)",
    )
    p.add_argument("--auto-max-depth", type=_int, default=None,
                   help=f"--tree auto: deepest level (default {DEFAULT_AUTO_MAX_DEPTH})")
    p.add_argument("--retune", action="store_true", help="--tree auto: measure again, ignoring the cache")
    p.add_argument(
        "--scheme", default=None,
        choices=("iid", "without_replacement", "deterministic"),
        help=f"sibling scheme (default {DEFAULT_SCHEME}; dynamic trees: deterministic, the only "
        "scheme they accept)",
    )
    p.add_argument("--rule", choices=CHOICES, default="auto",
                   help="verification rule (default auto: block on a chain, token on other trees; block: chains; "
                        "traversal: static trees)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed, in [0, 2**32) (default 0)")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: an embedded or packaged name (e.g. smollm2-135m), a folder or a .gguf file "
                        f"(default {DEFAULT_TARGET})")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help=f"parameter dtype of the models (default {GGUF_DEFAULT_DTYPE} for GGUF targets, measured "
                        "faster on CPU: benchmarks/README.md; float32 otherwise)")
    p.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                   help="int8: int8 weights and activations in the models' linear layers and LM head (W8A8, "
                        "docs/QUANTIZATION.md; float32 with a warning where int8 is not faster on this CPU)")
    p.add_argument("--draft", default=None,
                   help=f"draft model name or folder (default {DEFAULT_DRAFT} with the default target, "
                        "smollm2-135m-head with --target smollm2-135m; required with another --target, unless "
                        "--baseline), 'ngram' for prompt lookup "
                        "drafts copied from the prompt and the output ('ngram:4', 'ngram:max=4,min=2'; "
                        "docs/PROMPT_LOOKUP.md), or 'layers:K' for self-speculation: the target's first K "
                        "layers draft (docs/DRAFTERS.md)")
    p.add_argument("--baseline", action="store_true", help="target-only sampling (no draft)")
    p.add_argument("--compare", action="store_true",
                   help="run speculative and target-only decoding on the same prompt, seed and settings, timed "
                        "in turns after an untimed first call each, and print both tokens/s and their ratio")
    p.add_argument("--turns", type=positive_int, default=None,
                   help=f"--compare and --tree auto's check against target-only: timed turns of each mode "
                        f"(default {DEFAULT_TURNS}; the figures are medians)")
    p.add_argument("--mesh", type=mesh_flag, default=None, metavar="data=N,model=M",
                   help="run on a device mesh: rows over 'data', parameters and KV heads over 'model' "
                        "(on CPU, host devices are made to fit)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--no-warmup", action="store_true",
                   help="generate once, streaming from the start (default: a silent first call compiles, "
                        "then a second, timed call streams; with this flag the timing includes compilation)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not use the persistent compilation cache ($JAXSPEC_COMPILATION_CACHE, default "
                        "~/.cache/jaxspec/compilation; 'off' disables it everywhere)")
    p.add_argument("--program-store", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the traced programs beside the compiled ones, so that the next process skips "
                        "tracing and lowering too (first tokens in about a third of the time; keyed by the "
                        "versions of jax, jaxlib and flax, XLA_FLAGS, the device kind and jaxspec's source; "
                        "default on: --no-program-store or $JAXSPEC_PROGRAM_STORE=off opts out)")

    def run(args: argparse.Namespace) -> int:
        mesh = flag_mesh(args.mesh)  # before anything starts JAX's backends
        if not args.no_compile_cache:
            enable_compilation_cache(store_programs=args.program_store)
        plan = _plan(args, mesh)
        pair = _load(args, plan)
        if plan.auto:
            auto = setup.auto_tree_for(args, pair.target, pair.draft, pair.tok, len(pair.ids), plan.sampling)
            plan = dataclasses.replace(plan, tree=auto.parents, auto_result=auto)
        modes = _modes(args, plan, pair)  # prepared once: the library's checks, before compiling
        if not args.baseline and plan.lookup is None:  # the library accepted the pair: only acceptance can suffer
            warn_if_head_for_another_target("--draft", args.draft, pair.target, args.target)
        if not (args.baseline or plan.auto) and (note := long_compile_note(plan.tree, args.tree)):
            print(f"warning: {note}", file=sys.stderr, flush=True)
        result, line = _run_modes(args, plan, pair, modes)
        if args.json:
            print(json.dumps(result))
        if line is not None:
            print(f"-- {line}", file=sys.stderr)
        return 0

    return run


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the flags ask for, checked before any model is loaded."""

    sampling: object  # jaxspec.Sampling
    tree: object  # the parsed tree (None for --tree auto and --baseline)
    auto: bool  # --tree auto, speculating
    paired: bool  # both modes timed side by side (--compare, --tree auto)
    turns: int
    lookup: object  # the drafter --draft ngram / layers:K names, else None
    mesh: object
    auto_result: object = None  # --tree auto's measurement, once made


@dataclasses.dataclass(frozen=True)
class _Pair:
    tok: object
    target: object
    draft: object  # None with --baseline
    ids: list
    prompt_text: str
    stop: tuple


def _plan(args, mesh) -> _Plan:
    """The flags' own checks and the settings table's (jaxspec.decode.combinations), before
    any model is loaded: a refusal names the flags."""
    from jaxspec.core.treespec import parse_tree
    from jaxspec.decode.combinations import check_settings

    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens = {args.max_new_tokens}: expected an integer >= 1")
    sampling = flag_sampling(args.temperature, args.top_k, args.top_p, args.min_p)
    setup.default_draft_and_tree(args, DEFAULT_TREE)
    auto_spec = args.tree.strip().lower() == "auto"
    auto = auto_spec and not args.baseline  # --baseline uses no tree
    if args.compare and args.baseline:
        raise CLIError("--compare and --baseline: --compare runs target-only decoding beside speculative "
                       "decoding; pass one of them")
    paired = args.compare or auto
    if paired and args.no_warmup:
        first = "--compare" if args.compare else "--tree auto"
        raise CLIError(f"{first} and --no-warmup: {first} times both modes after an untimed first call "
                       "each (compilation); drop --no-warmup")
    if args.turns is not None and not paired:
        raise CLIError("--turns: applies only to --compare and --tree auto (without --baseline)")
    budgets = setup.auto_budgets(args.auto_budgets)  # validated whatever the tree, then applicability
    if args.auto_max_depth is not None and args.auto_max_depth < 1:
        raise CLIError(f"--auto-max-depth = {args.auto_max_depth}: expected an integer >= 1")
    if not auto_spec:
        given = [f for f, v in (("--auto-budgets", args.auto_budgets), ("--auto-max-depth", args.auto_max_depth),
                                ("--retune", args.retune or None)) if v is not None]
        if given:
            raise CLIError(f"{given[0]}: applies only to --tree auto, got --tree {args.tree}")
    args.auto_budgets = budgets
    if args.auto_max_depth is None:
        args.auto_max_depth = DEFAULT_AUTO_MAX_DEPTH
    tree = None
    if not auto_spec:  # a malformed spec is an error in --baseline mode too
        try:
            tree = parse_tree(args.tree)
        except ValueError as e:
            raise CLIError(f"--tree: {e}") from None
    lookup = setup.lookup_draft(args)  # a drafter for --draft ngram[:...] or layers:K, else None
    if auto and args.scheme is None:  # auto_tree times one scheme: generate's default for static trees
        args.scheme = DEFAULT_SCHEME
    if not args.baseline:
        known = dict(scheme=args.scheme, rule=args.rule, mesh=mesh, auto=auto, draft=_draft_kind(args, lookup))
        check_settings(**known, **({} if tree is None else {"tree": tree}))
    return _Plan(sampling, tree, auto, paired, args.turns or DEFAULT_TURNS, lookup, mesh)


def _draft_kind(args, lookup) -> str:
    """The drafter's kind for the settings table, known from the flag alone."""
    if lookup is not None:
        return "layers" if hasattr(lookup, "layers") else "lookup"
    # no --draft: the embedded draft model (or, for another target, an error _load names)
    return "head" if args.draft is not None and is_head_flag("--draft", args.draft) else "model"


def _load(args, plan: _Plan) -> _Pair:
    """The tokenizer, the models and the prompt's ids; the drafter's scheme in ``args.scheme``."""
    from jaxspec.decode.generate import resolve_stop_tokens
    from jaxspec.formats.gguf import is_gguf_source

    tok = resolve_tokenizer("--target", args.target)
    dtype = args.dtype if args.dtype is not None else (GGUF_DEFAULT_DTYPE if is_gguf_source(args.target) else None)
    if not args.baseline and plan.lookup is None:
        args.draft = setup.draft_name(args)
        if not is_head_flag("--draft", args.draft):  # a head reads the target's embedding: its tokenizer
            setup.check_same_tokenizer(tok, resolve_tokenizer("--draft", args.draft), args)
    ids, prompt_text = setup.prompt_ids(args, tok)
    target = load_flag_model("--target", args.target, dtype=dtype, quantize=args.quantize)
    draft = None
    if not args.baseline:
        draft = plan.lookup or load_flag_model("--draft", args.draft, draft=True, dtype=dtype,
                                               quantize=args.quantize)
    check_tokenizer_fits("--target", args.target, tok, target.config.vocab_size)
    setup.check_room(args, len(ids), target, draft, plan.tree, plan.auto)
    # the library's default stop tokens: the target's eos_token_id, else its own tokenizer's end-of-text id
    stop = resolve_stop_tokens(None, target, tok)
    return _Pair(tok, target, draft, ids, prompt_text, stop)


def _modes(args, plan: _Plan, pair: _Pair) -> dict:
    """``{"speculative": f, "target_only": g}``: each ``f(on_round=None)`` one generation.
    Each mode is prepared once (:func:`jaxspec.decode.generate.prepare`: the library's
    checks, the drafter's included, and the configuration it compiles, before anything
    compiles), for each ``on_round`` it is called with; ``args.scheme`` becomes the scheme
    the drafter serves. A library refusal names the flag: a :class:`jaxspec.SettingError` by
    the command line's main, another ``ValueError`` here (:func:`in_flag_words`)."""
    import jax

    from jaxspec.decode.generate import prepare, prepare_autoregressive

    key = jax.random.key(args.seed)
    common = dict(max_new_tokens=args.max_new_tokens, sampling=plan.sampling, mesh=plan.mesh, stop_tokens=pair.stop)
    prepared = {}

    def prepared_mode(mode, on_round):
        if (mode, on_round) not in prepared:
            try:
                prepared[mode, on_round] = (
                    prepare(pair.target, pair.draft, [pair.ids], tree=plan.tree, scheme=args.scheme, rule=args.rule,
                            on_round=on_round, **common) if mode == "speculative" else
                    prepare_autoregressive(pair.target, [pair.ids], on_round=on_round, **common))
            except SettingError:
                raise  # named by flag by the command line's main
            except ValueError as e:
                raise CLIError(in_flag_words(e, args)) from None
        return prepared[mode, on_round]

    # the mode that runs first is checked now, before any message or compilation
    first = prepared_mode("target_only" if args.baseline else "speculative", None)
    if not args.baseline:
        args.scheme = first.config.scheme
    return {mode: (lambda on_round=None, mode=mode: prepared_mode(mode, on_round).run(key))
            for mode in ("speculative", "target_only")}


def _run_modes(args, plan: _Plan, pair: _Pair, modes: dict) -> tuple[dict, str | None]:
    """Generate (streaming the text, unless --json or the modes are timed side by side);
    returns the JSON result and the comparison line for stderr (None without one)."""
    import jax

    shown = "" if args.chat is not None else pair.prompt_text  # a chat prints the answer alone
    baseline, comparison = args.baseline, None
    if plan.paired:
        if not args.json:  # stdout stays pure JSON with --json
            print(f"compiling and warming up both modes (first calls, not timed), then {plan.turns} timed "
                  f"turns of each ...", file=sys.stderr, flush=True)
        times, outs, firsts = timing.time_modes(modes, plan.turns)
        comparison = timing.comparison(times, outs, firsts, plan.turns, plan.sampling.temperature)
        if plan.auto:
            baseline = timing.check_auto_choice(plan.auto_result, comparison)
        mode = "target_only" if baseline else "speculative"
        out, t_first, t_run = outs[mode], firsts[mode], comparison[mode]["seconds"]
    else:
        stream = timing.Stream(pair.tok)
        # --json prints nothing per round: the one-program loop. Text streams: the rounds run one
        # call each and the host prints between them (no callback enters a program, so either
        # form is stored in the persistent compilation cache and a second run loads it)
        fn = modes["target_only" if baseline else "speculative"]
        on_round = None if args.json else stream
        if not args.json:
            what = "compiling (the timing includes it)" if args.no_warmup else \
                "compiling and warming up (first call, not timed)"
            print(f"{what} ...", file=sys.stderr, flush=True)
        t_first = None
        if not args.no_warmup:
            t0 = time.perf_counter()
            jax.block_until_ready(fn(on_round))  # compiles, and runs once silently
            t_first = time.perf_counter() - t0
        if not args.json:
            sys.stdout.write(shown)
            sys.stdout.flush()
            stream.enabled = True  # the timed run streams each round as it completes
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(on_round))
        t_run = time.perf_counter() - t0
        t_first = t_run if t_first is None else t_first
    result = _result(args, plan, pair, out, baseline, t_run, t_first)
    if comparison is not None:
        result["compare"] = comparison
    if plan.auto_result is not None:
        result["auto_tree"] = timing.auto_summary(plan.auto_result, comparison, baseline)
    if not args.json:
        if plan.paired:  # not streamed: the timed calls run without a host callback
            sys.stdout.write(shown + result["text"] + "\n")
            sys.stdout.flush()
            how = f"median of {plan.turns} turns; first call with compilation {t_first:.1f} s"
        else:
            stream.finish(result["text"])
            how = "including compilation" if args.no_warmup else f"compiled; first call with compilation {t_first:.1f} s"
        print(f"-- {result['mode']}: num_tokens {result['num_tokens']}, rounds {result['rounds']}, "
              f"tokens_per_target_call {result['tokens_per_target_call']:.2f}, "
              f"tokens_per_second {result['tokens_per_second']:.1f} ({how})", file=sys.stderr)
    return result, None if comparison is None else timing.comparison_line(comparison)


def _result(args, plan: _Plan, pair: _Pair, out, baseline: bool, t_run: float, t_first: float) -> dict:
    """The ``--json`` object (without ``compare`` and ``auto_tree``)."""
    import numpy as np

    from jaxspec.core.rules import resolve_rule, rule_name

    n = int(np.asarray(out.lengths)[0])
    new_ids = [int(t) for t in np.asarray(out.tokens)[0, :n]]
    s = out.summary()  # one row: its own statistics, under the names summary() gives them
    return {
        "text": pair.tok.decode(new_ids),
        "prompt": args.prompt,
        "chat": args.chat,  # the user message of --chat (then "prompt" is null)
        "prompt_text": pair.prompt_text,  # the text the ids encode: --prompt, or the rendered chat template
        "dtype": pair.target.config.dtype,
        "tokens": new_ids,  # "tokens" is always a list of ids; "num_tokens" (from s) the count
        "mode": "baseline" if baseline else "speculative",
        "draft": None if baseline else getattr(plan.lookup, "spec", args.draft),
        "tree": None if baseline else args.tree,
        "scheme": None if baseline else args.scheme,
        "rule": None if baseline else rule_name(resolve_rule(args.rule, plan.tree)),
        **plan.sampling.to_dict(),  # temperature, top_k, top_p, min_p
        "seed": args.seed,
        "stop_tokens": list(pair.stop),
        "mesh": args.mesh and {"data": args.mesh.get("data", 1), "model": args.mesh.get("model", 1)},
        **s,  # num_tokens, target_calls, draft_calls, rounds, loop_rounds, tokens_per_target_call, ...
        "tokens_per_second": n / t_run if t_run > 0 else None,
        "seconds": t_run,  # --compare / --tree auto: the median of the timed turns
        "seconds_with_compile": t_first,
        "timing_includes_compile": bool(args.no_warmup),
    }
