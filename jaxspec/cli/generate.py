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
import pathlib
import re
import statistics
import sys
import time

from jaxspec.cli.common import (
    CLIError,
    Handler,
    check_tokenizer_fits,
    command,
    flag_mesh,
    is_head_flag,
    load_flag_model,
    mesh_flag,
    positive_int,
    resolve_scheme,
    resolve_tokenizer,
    seed_int,
    utf8_text,
    warn_if_head_for_another_target,
)
from jaxspec.cli.compile_cache import enable_compilation_cache

__all__ = ["generate_command"]

DEFAULT_TREE = "chain:4"  # jaxspec.generate's default too (tests/test_generate.py checks they agree)
DEFAULT_TEMPERATURE = 1.0  # jaxspec.generate's and jaxspec.verify's: the model's own law
DEFAULT_SCHEME = "without_replacement"  # static trees; dynamic trees take only "deterministic"
DEFAULT_AUTO_MAX_DEPTH = 8
DEFAULT_TURNS = 3  # timed turns of each mode for --compare and --tree auto's check
DEFAULT_TARGET, DEFAULT_DRAFT = "default-target", "default-draft"  # the embedded pair
DTYPES = ("float32", "bfloat16")
# the dtype a GGUF target loads in without --dtype: the faster of the two for decoding on CPU
# (benchmarks/gguf_smollm2.py measures both; benchmarks/README.md has the figures)
GGUF_DEFAULT_DTYPE = "float32"

# library argument names -> the flags that set them, in messages that reach the command line
_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
          "max_new_tokens": "--max-new-tokens"}


def _flag_words(message: str, tree: str | None = None) -> str:
    """A library message in the command line's words: ``scheme='iid'`` -> ``--scheme iid``,
    ``top_k`` -> ``--top-k``, a leading ``tree:`` -> ``--tree SPEC:``, no "None or"."""
    message = re.sub(r"\bscheme\s*=\s*'(\w+)'", r"--scheme \1", message)
    message = re.sub(r"\brule\s*=\s*'(\w+)'", r"--rule \1", message)
    message = re.sub(r"(?<![\w-])(temperature|top_k|top_p|max_new_tokens)\b",
                     lambda m: _FLAGS[m.group(1)], message)
    message = message.replace("expected None or ", "expected ")
    if tree is not None:
        message = re.sub(r"^tree\b", lambda m: f"--tree {tree}", message)
    return message


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


def _budgets(s: str | None) -> tuple[int, ...] | None:
    """``--auto-budgets`` "4,8,16" -> (4, 8, 16); None stays None (the default list)."""
    if s is None:
        return None
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise CLIError(f"--auto-budgets = {s!r}: expected comma-separated node counts >= 1, e.g. 4,8,16")
    return vals


class _Stream:
    """The ``on_round`` function: prints row 0's new text as each round completes.

    Decodes everything emitted so far and prints the part not yet printed (works for any
    tokenizer); a trailing replacement character (an incomplete UTF-8 sequence) is held
    back until the next round completes it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.enabled = False
        self.printed = ""

    def __call__(self, tokens, lengths):
        if not self.enabled:
            return
        import numpy as np

        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        text = self.tokenizer.decode(tokens[0, : int(lengths[0])].tolist())
        text = text.rstrip("\ufffd")
        if text.startswith(self.printed):
            sys.stdout.write(text[len(self.printed) :])
            sys.stdout.flush()
            self.printed = text

    def finish(self, text: str) -> None:
        rest = text[len(self.printed) :] if text.startswith(self.printed) else ""
        sys.stdout.write(rest + "\n")
        sys.stdout.flush()
        self.enabled = False


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
    p.add_argument(
        "--tree", default=DEFAULT_TREE,
        help="tree spec: 'chain:K', 'branch:3,2,1', 'parents:-1,0,0', "
        f"'dynamic:depth=4,topk=4,nodes=16', or 'auto' (measured for this device) (default {DEFAULT_TREE})",
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
    p.add_argument("--draft", default=None,
                   help=f"draft model name or folder (default {DEFAULT_DRAFT} with the default target; "
                        "required with another --target, unless --baseline), 'ngram' for prompt lookup "
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

    def run(args: argparse.Namespace) -> int:
        import jax
        import numpy as np

        mesh = flag_mesh(args.mesh)  # before anything starts JAX's backends
        if not args.no_compile_cache:
            enable_compilation_cache()

        from jaxspec.core import sampling
        from jaxspec.core.rules import resolve_rule, rule_name
        from jaxspec.core.treespec import DynamicTree, parse_tree
        from jaxspec.decode.generate import (
            build_ar_config,
            build_config,
            generate,
            generate_autoregressive,
            resolve_stop_tokens,
        )
        from jaxspec.nn.gguf import is_gguf_source
        from jaxspec.nn.tokenizer import ByteTokenizer

        if args.max_new_tokens < 1:
            raise CLIError(f"--max-new-tokens = {args.max_new_tokens}: expected an integer >= 1")
        try:
            sampling.validate_warp_args(args.temperature, args.top_k, args.top_p)
        except ValueError as e:
            raise CLIError(_flag_words(str(e))) from None
        tree = None
        auto_spec = args.tree.strip().lower() == "auto"
        auto = auto_spec and not args.baseline  # --baseline uses no tree
        if args.compare and args.baseline:
            raise CLIError("--compare and --baseline: --compare runs target-only decoding beside speculative "
                           "decoding; pass one of them")
        paired = args.compare or auto  # both modes timed side by side
        if paired and args.no_warmup:
            first = "--compare" if args.compare else "--tree auto"
            raise CLIError(f"{first} and --no-warmup: {first} times both modes after an untimed first call "
                           "each (compilation); drop --no-warmup")
        if args.turns is not None and not paired:
            raise CLIError("--turns: applies only to --compare and --tree auto (without --baseline)")
        turns = args.turns if args.turns is not None else DEFAULT_TURNS
        budgets = _budgets(args.auto_budgets)  # validated whatever the tree, then applicability
        if auto and mesh is not None:
            raise CLIError("--tree auto and --mesh: --tree auto times trees on one device; pass a --tree "
                           "such as chain:4 with --mesh")
        if args.auto_max_depth is not None and args.auto_max_depth < 1:
            raise CLIError(f"--auto-max-depth = {args.auto_max_depth}: expected an integer >= 1")
        if not auto_spec:
            given = [f for f, v in (("--auto-budgets", args.auto_budgets), ("--auto-max-depth", args.auto_max_depth),
                                    ("--retune", args.retune or None)) if v is not None]
            if given:
                raise CLIError(f"{given[0]}: applies only to --tree auto, got --tree {args.tree}")
        if auto and args.rule not in ("token", "auto"):
            raise CLIError(f"--rule {args.rule}: --tree auto chooses among branching trees, which only "
                           "--rule token verifies; pass a --tree chain:K with --rule block")
        args.auto_budgets = budgets
        if args.auto_max_depth is None:
            args.auto_max_depth = DEFAULT_AUTO_MAX_DEPTH
        if not auto_spec:  # a malformed spec is an error in --baseline mode too
            try:
                tree = parse_tree(args.tree)
            except ValueError as e:
                raise CLIError(f"--tree: {e}") from None
        lookup = _lookup_draft(args)  # a drafter for --draft ngram[:...] or layers:K, else None
        if lookup is not None and auto:
            raise CLIError(f"--tree auto: chooses a tree by timing a draft model; with --draft {args.draft} "
                           "pass a tree such as --tree chain:4")
        if lookup is not None and not hasattr(lookup, "layers"):  # prompt lookup: fixed static proposals
            if isinstance(tree, DynamicTree):
                raise CLIError(f"--tree {args.tree}: a dynamic tree ranks a draft model's candidates; with "
                               f"--draft {args.draft} pass a static tree such as --tree chain:4")
            if args.scheme not in (None, "deterministic"):
                raise CLIError(f"--scheme {args.scheme}: --draft {args.draft} proposes fixed tokens; expected "
                               "--scheme deterministic (its default)")
            args.scheme = "deterministic"
        if not args.baseline:  # --baseline uses no scheme (its JSON reports none)
            args.scheme = resolve_scheme(args.scheme, args.tree, isinstance(tree, DynamicTree), DEFAULT_SCHEME)
        tok = resolve_tokenizer("--target", args.target)
        dtype = args.dtype if args.dtype is not None else (GGUF_DEFAULT_DTYPE if is_gguf_source(args.target) else None)
        if not args.baseline and lookup is None:
            args.draft = _draft_name(args)
            if is_head_flag("--draft", args.draft):  # a head reads the target's embedding: its tokenizer
                if auto:
                    raise CLIError(f"--tree auto: times a draft model's trees; with the feature head --draft "
                                   f"{args.draft} pass a static tree such as --tree chain:4")
                if isinstance(tree, DynamicTree):
                    raise CLIError(f"--tree {args.tree}: a feature head drafts static trees; with --draft "
                                   f"{args.draft} pass one such as --tree chain:4")
            else:
                _check_same_tokenizer(tok, resolve_tokenizer("--draft", args.draft), args)
        ids, prompt_text = _prompt_ids(args, tok)
        shown = "" if args.chat is not None else prompt_text  # a chat prints the answer alone, not the template
        target = load_flag_model("--target", args.target, dtype=dtype)
        if args.baseline:
            draft = None
        else:
            draft = lookup if lookup is not None else load_flag_model("--draft", args.draft, draft=True, dtype=dtype)
            if lookup is None:
                warn_if_head_for_another_target("--draft", args.draft, target, args.target)
        if draft is not None and lookup is None and draft.config.vocab_size != target.config.vocab_size:
            raise CLIError(
                f"--draft {args.draft}: vocab_size {draft.config.vocab_size} differs from the target's "
                f"{target.config.vocab_size} ({args.target}); the draft and the target must share one vocabulary"
            )
        check_tokenizer_fits("--target", args.target, tok, target.config.vocab_size)
        _check_room(args, len(ids), target, draft, None if args.baseline else tree, auto)
        if not auto:  # the remaining checks of the library, before compiling
            try:
                if args.baseline:
                    build_ar_config(target, prompt_length=len(ids), max_new_tokens=args.max_new_tokens,
                                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, mesh=mesh)
                else:
                    build_config(target, draft, prompt_length=len(ids), max_new_tokens=args.max_new_tokens,
                                 tree=tree, scheme=args.scheme, rule=args.rule, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, mesh=mesh)
            except ValueError as e:
                raise CLIError(_flag_words(str(e), args.tree)) from None
        auto_result = None
        if auto:
            auto_result = _auto_tree(args, target, draft, tok, len(ids))
            tree = auto_result.parents
        key = jax.random.key(args.seed)
        common = dict(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, mesh=mesh,
        )
        # the library's default stop tokens: the target's eos_token_id (config.json); a folder whose
        # config.json has none stops at the end-of-text token its tokenizer_config.json names
        stop = resolve_stop_tokens(None, target)
        if (not stop and not isinstance(tok, ByteTokenizer) and tok.eos_id is not None
                and tok.eos_id < target.config.vocab_size):
            stop = (tok.eos_id,)
        common["stop_tokens"] = stop

        def speculative(on_round=None):
            return generate(key, target, draft, [ids], tree=tree, scheme=args.scheme, rule=args.rule,
                            on_round=on_round, **common)

        def target_only(on_round=None):
            return generate_autoregressive(key, target, [ids], on_round=on_round, **common)

        baseline = args.baseline
        comparison = None
        if paired:
            if not args.json:  # stdout stays pure JSON with --json
                print(f"compiling and warming up both modes (first calls, not timed), then {turns} timed "
                      f"turns of each ...", file=sys.stderr, flush=True)
            times, outs, firsts = _time_modes({"speculative": speculative, "target_only": target_only}, turns)
            comparison = _comparison(times, outs, firsts, turns, args.temperature)
            if auto:
                baseline = _check_auto_choice(auto_result, comparison)
            mode = "target_only" if baseline else "speculative"
            out, t_first = outs[mode], firsts[mode]
            t_run = comparison[mode]["seconds"]
        else:
            stream = _Stream(tok)
            # --json prints nothing per round: the one-program loop. Text streams: the rounds run one
            # call each and the host prints between them (no callback enters a program, so either
            # form is stored in the persistent compilation cache and a second run loads it)
            on_round = None if args.json else stream

            def call():
                return target_only(on_round) if baseline else speculative(on_round)

            if not args.json:
                what = "compiling (the timing includes it)" if args.no_warmup else \
                    "compiling and warming up (first call, not timed)"
                print(f"{what} ...", file=sys.stderr, flush=True)
            t_first = None
            if not args.no_warmup:
                t0 = time.perf_counter()
                out = jax.block_until_ready(call())  # compiles, and runs once silently
                t_first = time.perf_counter() - t0
            if not args.json:
                sys.stdout.write(shown)
                sys.stdout.flush()
                stream.enabled = True  # the timed run streams each round as it completes
            t0 = time.perf_counter()
            out = jax.block_until_ready(call())
            t_run = time.perf_counter() - t0
            if t_first is None:
                t_first = t_run
        n = int(np.asarray(out.lengths)[0])
        new_ids = [int(t) for t in np.asarray(out.tokens)[0, :n]]
        text = tok.decode(new_ids)
        s = out.summary()  # one row: its own statistics, under the names summary() gives them
        result = {
            "text": text,
            "prompt": args.prompt,
            "chat": args.chat,  # the user message of --chat (then "prompt" is null)
            "prompt_text": prompt_text,  # the text the ids encode: --prompt, or the rendered chat template
            "dtype": target.config.dtype,
            "tokens": new_ids,  # "tokens" is always a list of ids; "num_tokens" (from s) the count
            "mode": "baseline" if baseline else "speculative",
            "draft": None if baseline else (lookup.spec if lookup is not None else args.draft),
            "tree": None if baseline else args.tree,
            "scheme": None if baseline else args.scheme,
            "rule": None if baseline else rule_name(resolve_rule(args.rule, tree)),
            "temperature": args.temperature,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "seed": args.seed,
            "stop_tokens": list(stop),
            "mesh": args.mesh and {"data": args.mesh.get("data", 1), "model": args.mesh.get("model", 1)},
            **s,  # num_tokens, target_calls, draft_calls, rounds, loop_rounds, tokens_per_target_call, ...
            "tokens_per_second": n / t_run if t_run > 0 else None,
            "seconds": t_run,  # --compare / --tree auto: the median of the timed turns
            "seconds_with_compile": t_first,
            "timing_includes_compile": bool(args.no_warmup),
        }
        if comparison is not None:
            result["compare"] = comparison
        if auto_result is not None:
            result["auto_tree"] = _auto_summary(auto_result, comparison, baseline)
        if args.json:
            print(json.dumps(result))
        else:
            if paired:  # not streamed: the timed calls run without a host callback
                sys.stdout.write(shown + text + "\n")
                sys.stdout.flush()
                timing = f"median of {turns} turns; first call with compilation {t_first:.1f} s"
            else:
                stream.finish(text)
                timing = ("including compilation" if args.no_warmup
                          else f"compiled; first call with compilation {t_first:.1f} s")
            print(
                f"-- {result['mode']}: num_tokens {n}, rounds {s['rounds']}, "
                f"tokens_per_target_call {s['tokens_per_target_call']:.2f}, "
                f"tokens_per_second {result['tokens_per_second']:.1f} ({timing})",
                file=sys.stderr,
            )
        if comparison is not None:
            print(f"-- {_comparison_line(comparison)}", file=sys.stderr)
        return 0

    return run


def _prompt_ids(args, tok) -> tuple[list[int], str]:
    """The prompt's token ids and the text they encode: ``--prompt`` as raw text, or
    ``--chat``'s message rendered by the tokenizer's chat template with the assistant's turn
    opened (the template's own special tokens, BOS included, as the model was trained)."""
    if args.prompt is not None:
        ids = tok.encode(args.prompt)
        if not ids:
            raise CLIError("--prompt: expected a non-empty prompt")
        return ids, args.prompt
    if not args.chat.strip():
        raise CLIError("--chat: expected a non-empty message")
    if getattr(tok, "chat_template", None) is None:
        raise CLIError(f"--chat: the target {args.target} has no chat template (its tokenizer carries none); "
                       "pass the raw text with --prompt")
    messages = [{"role": "user", "content": args.chat}]
    try:
        return tok.encode_chat(messages), tok.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as e:
        raise CLIError(f"--chat: {e}") from None


def _lookup_draft(args):
    """The drafter without a model of its own: :class:`~jaxspec.NgramDraft` for ``--draft
    ngram[:...]``, :class:`~jaxspec.LayerSkipDraft` for ``--draft layers:K`` (None for a
    model, or with ``--baseline``); a malformed spec is a :class:`CLIError` naming the flag."""
    if args.baseline or args.draft is None:
        return None
    spec = args.draft.strip().lower()
    if pathlib.Path(args.draft).exists() or not (spec.startswith("ngram") or spec.partition(":")[0] == "layers"):
        return None  # a model: a folder (even one called ngram), a name or a file
    from jaxspec.decode.layer_skip import LayerSkipDraft
    from jaxspec.decode.ngram import NgramDraft

    try:
        return (NgramDraft if spec.startswith("ngram") else LayerSkipDraft).parse(args.draft)
    except ValueError as e:
        raise CLIError(f"--draft: {e}") from None


def _draft_name(args) -> str:
    """``--draft``, or, without one, the embedded draft for the embedded target (the
    default ``--target``); another ``--target`` without ``--draft`` is a :class:`CLIError`
    (the embedded draft drafts for no other model) asking for ``--draft`` or ``--baseline``."""
    if args.draft is not None:
        return args.draft
    from jaxspec.nn.checkpoint import resolve_model_path
    from jaxspec.nn.gguf import is_gguf_source

    if not is_gguf_source(args.target) and (
            resolve_model_path(args.target).resolve() == resolve_model_path(DEFAULT_TARGET).resolve()):
        return DEFAULT_DRAFT
    raise CLIError(
        f"--target {args.target}: expected a --draft for it (a draft model sharing its tokenizer, or "
        f"'ngram' for prompt lookup, which needs no model), or --baseline for target-only sampling; "
        f"{DEFAULT_DRAFT} drafts only for {DEFAULT_TARGET}"
    )


def _check_room(args, prompt_len: int, target, draft, tree, auto: bool) -> None:
    """Refuse, before compiling, a prompt and ``--max-new-tokens`` that do not fit the
    context of the target (and of the draft): the KV cache holds the prompt, the new
    tokens and, when speculating, the tree's slots + 1 (as :func:`jaxspec.decode.generate.build_config`).
    ``--tree auto`` checks the prompt here and its budgets in :func:`_auto_tree`."""
    limits = {"target": target.config.max_position_embeddings}
    if draft is not None and hasattr(draft, "config"):  # not an n-gram draft: a model with a context
        limits["draft"] = draft.config.max_position_embeddings
    ctx = min(limits.values())
    whose = " and the ".join(f"{name}'s" for name, n in limits.items() if n == ctx)
    context = f"the {whose} context of {ctx} tokens (max_position_embeddings)"
    if draft is None:  # --baseline: prompt + new tokens
        reserve, tree_words = 0, ""
    elif auto:  # the smallest candidate tree
        from jaxspec.tuning.autotree import DEFAULT_BUDGETS

        smallest = min(args.auto_budgets or DEFAULT_BUDGETS)
        reserve, tree_words = smallest + 1, f"the smallest --tree auto candidate ({smallest} nodes + 1)"
    else:
        slots = tree.cache_slots
        reserve, tree_words = slots + 1, f"--tree {args.tree} ({slots} slots + 1)"
        if ctx - reserve < 2:  # not even a 1-token prompt and one new token fit
            raise CLIError(
                f"--tree {args.tree}: {slots} tree slots + 1; expected at most {ctx - 3} slots, so that the "
                f"tree, a 1-token prompt and one new token fit {context}"
            )
    room = ctx - prompt_len - reserve  # the most new tokens that fit
    if room < 1:
        parts = "the prompt, at least one new token and " + tree_words if tree_words else \
            "the prompt and at least one new token"
        raise CLIError(
            f"--prompt: {prompt_len} tokens; expected at most {prompt_len + room - 1} tokens, so that "
            f"{parts} fit {context}"
        )
    if not auto and args.max_new_tokens > room:
        parts = f", this {prompt_len}-token prompt and {tree_words}" if tree_words else \
            f" and this {prompt_len}-token prompt"
        raise CLIError(
            f"--max-new-tokens = {args.max_new_tokens}: expected <= {room}, so that the new tokens{parts} "
            f"fit {context}"
        )


def _check_same_tokenizer(tok, dtok, args) -> None:
    """Refuse a draft whose tokenizer differs from the target's (ids would mean other text)."""
    from jaxspec.nn.tokenizer import ByteTokenizer

    def what(t):
        return "the byte-level tokenizer (no tokenizer.json)" if isinstance(t, ByteTokenizer) else t.source

    if isinstance(tok, ByteTokenizer) and isinstance(dtok, ByteTokenizer):
        return
    same = (
        type(tok) is type(dtok)
        and tok.vocab_size == dtok.vocab_size
        and tok.vocab() == dtok.vocab()
    )
    if not same:
        raise CLIError(
            f"--draft {args.draft}: its vocabulary differs from the target's ({what(dtok)}, "
            f"{dtok.vocab_size} tokens vs {what(tok)}, {tok.vocab_size} tokens); speculative decoding "
            "needs a draft and a target that share one tokenizer"
        )


def _auto_tree(args, target, draft, tok, prompt_len: int):
    """Run (or read from the cache) :func:`jaxspec.tuning.autotree.auto_tree`; report to stderr."""
    import jax

    from jaxspec.nn.tokenizer import ByteTokenizer
    from jaxspec.tuning.autotree import DEFAULT_BUDGETS, auto_tree

    ctx = min(target.config.max_position_embeddings, draft.config.max_position_embeddings)
    asked = args.auto_budgets or DEFAULT_BUDGETS
    room = ctx - prompt_len - args.max_new_tokens - 1  # generate's cache: prompt + new + N + 1
    budgets = tuple(sorted({n for n in asked if n <= room}))
    if not budgets:
        most = ctx - prompt_len - 1 - min(asked)  # the most new tokens with the smallest budget
        raise CLIError(
            f"--tree auto: no budget in {list(asked)} fits the context of {ctx} tokens with a "
            f"{prompt_len}-token prompt and --max-new-tokens {args.max_new_tokens} (room for {room} nodes); "
            f"expected --max-new-tokens <= {most} for the smallest budget, {min(asked)}"
        )
    held_out = None
    if not isinstance(tok, ByteTokenizer):  # held-out text in the model's own tokens
        from jaxspec.training.corpus import load_corpus

        val = load_corpus().val
        text = bytes(val[val < 256].astype("uint8")[:400_000]).decode("utf-8", errors="replace")
        held_out = tok.encode(text)
    try:
        res = auto_tree(
            target, draft, scheme=args.scheme, rule=args.rule,  # the rule generate will use
            temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, budgets=budgets, max_depth=args.auto_max_depth,
            key=jax.random.key(0),  # the tuning draws, independent of --seed: one cache entry
            held_out_tokens=held_out, retune=args.retune, progress=True,
        )
    except ValueError as e:
        raise CLIError(f"--tree auto: {_flag_words(str(e))}") from None
    if res.from_cache:
        how = f"cached in {res.cache_path}"
    else:
        how = "measured, not cached" if res.cache_path is None else f"measured, saved to {res.cache_path}"
    print(
        f"-- auto tree ({how}):\n{res.table()}\n-- picked {res.budget} nodes, depth {res.depth}: "
        f"parents:{','.join(map(str, res.parents))}; predicted tau {res.predicted_tau:.2f}, "
        f"predicted speedup {res.predicted_speedup:.2f}x over target-only",
        file=sys.stderr,
    )
    if res.predicted_speedup < 1.0:
        print("-- note: no candidate is predicted to beat target-only decoding on this device; "
              "measuring the pick anyway", file=sys.stderr)
    return res


def _time_modes(fns: dict, turns: int):
    """Time the modes side by side, as the benchmarks do
    (:func:`jaxspec.bench.common.interleaved_turns`): one untimed first call each (it
    compiles), then ``turns`` turns in which every mode runs once, each call ended by
    ``block_until_ready``. ``fns`` maps a name to a function of no argument.

    Returns ``({name: [wall seconds per turn]}, {name: output of its last call},
    {name: wall seconds of its first call, compilation included})``.
    """
    import jax

    from jaxspec.bench.common import interleaved_turns

    firsts = {}

    def timed(name, fn):
        def call(i):
            if i >= 0:
                return fn()
            t0 = time.perf_counter()  # the warm-up call: timed here, with its compilation
            out = jax.block_until_ready(fn())
            firsts[name] = time.perf_counter() - t0
            return out

        return call

    times, outs = interleaved_turns({k: timed(k, f) for k, f in fns.items()}, turns)
    return times, outs, firsts


def _row_tokens(out) -> list[int]:
    import numpy as np

    return np.asarray(out.tokens)[0, : int(np.asarray(out.lengths)[0])].tolist()


def _comparison(times: dict, outs: dict, firsts: dict, turns: int, temperature: float) -> dict:
    """The ``"compare"`` entry of ``--json``: each mode's figures (median seconds of the
    timed turns, tokens/s from it), the ratio of tokens/s, its range over single turns,
    and whether both modes emitted the same tokens (expected at temperature 0 only)."""
    modes = {}
    for name in ("speculative", "target_only"):
        s = outs[name].summary()
        sec = statistics.median(times[name])
        modes[name] = {
            "num_tokens": s["num_tokens"],
            "tokens_per_second": s["num_tokens"] / sec if sec > 0 else None,
            "seconds": sec,
            "seconds_turns": list(times[name]),
            "seconds_with_compile": firsts[name],
            "tokens_per_target_call": s["tokens_per_target_call"],
            "rounds": s["rounds"],
        }
    sp, tg = modes["speculative"], modes["target_only"]
    ratio = (sp["tokens_per_second"] / tg["tokens_per_second"]
             if sp["tokens_per_second"] and tg["tokens_per_second"] else None)
    per_turn = [(sp["num_tokens"] / a) / (tg["num_tokens"] / b)
                for a, b in zip(times["speculative"], times["target_only"], strict=True) if a > 0 and b > 0]
    return {
        "turns": turns,
        **modes,
        "speedup": ratio,  # speculative tokens/s over target-only tokens/s
        "speedup_turn_range": [min(per_turn), max(per_turn)] if per_turn else None,
        "same_tokens": _row_tokens(outs["speculative"]) == _row_tokens(outs["target_only"]),
        "same_tokens_expected": temperature == 0,
    }


def _comparison_line(c: dict) -> str:
    """``speculative X tok/s vs target-only Y tok/s (Z×); same tokens: yes``."""
    def rate(mode):
        tps = c[mode]["tokens_per_second"]
        return "n/a" if tps is None else f"{tps:.1f}"

    ratio = c["speedup"]
    line = f"speculative {rate('speculative')} tok/s vs target-only {rate('target_only')} tok/s ("
    line += "n/a)" if ratio is None else f"{ratio:.2f}×" + ("; speculative is slower here)" if ratio < 1 else ")")
    if c["same_tokens"]:
        same = "yes"
    elif c["same_tokens_expected"]:
        same = "NO, expected yes at temperature 0 (both are greedy decoding of the target)"
    else:
        same = "no (expected at temperature > 0: the same law, other draws)"
    return f"{line}; same tokens: {same}"


def _check_auto_choice(res, c: dict) -> bool:
    """Report on stderr how the ``--tree auto`` pick fared against target-only in the
    timed comparison; True (fall back to target-only) where it was slower."""
    slower = c["speedup"] is None or c["speedup"] < 1.0
    measured = "n/a" if c["speedup"] is None else f"{c['speedup']:.2f}×"
    if slower:
        print(f"-- --tree auto: speculative decoding with the picked tree is slower than target-only here "
              f"(measured {measured}, predicted {res.predicted_speedup:.2f}×): falling back to target-only "
              "decoding", file=sys.stderr)
    else:
        print(f"-- --tree auto: the picked tree beats target-only here (measured {measured}, predicted "
              f"{res.predicted_speedup:.2f}×): generating with it", file=sys.stderr)
    return slower


def _auto_summary(res, comparison: dict | None = None, fell_back: bool = False) -> dict:
    """The ``"auto_tree"`` entry of ``--json``: the prediction, the table, and what the
    check against target-only measured (``measured_speedup``) and chose (``chosen``:
    ``"tree"`` or ``"target-only"``)."""
    return {
        "chosen": "target-only" if fell_back else "tree",
        "fallback": fell_back,
        "measured_speedup": None if comparison is None else comparison["speedup"],
        "measured_tokens_per_second": None if comparison is None else {
            k: comparison[k]["tokens_per_second"] for k in ("speculative", "target_only")},
        "parents": list(res.parents),
        "budget": res.budget,
        "depth": res.depth,
        "predicted_tau": res.predicted_tau,
        "predicted_speedup": res.predicted_speedup,
        "predicted_tokens_per_second": res.tokens_per_s,
        "target_step_seconds": res.target_step_s,
        "acceptance": list(res.acceptance),
        "from_cache": res.from_cache,
        "cache_path": res.cache_path,
        "table": [
            {"budget": r.budget, "depth": r.depth, "rule": r.rule, "predicted_tau": r.predicted_tau,
             "verify_seconds": r.verify_s, "round_seconds": r.round_s,
             "predicted_tokens_per_second": r.tokens_per_s, "predicted_speedup": r.speedup}
            for r in res.rows
        ],
    }
