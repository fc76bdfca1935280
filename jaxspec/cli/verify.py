"""``jaxspec verify``: run the exactness harness (:func:`jaxspec.exactness.verify`) from
the command line.

::

    jaxspec verify                                    # tiny random pair, 10^6 samples, generate's defaults
    jaxspec verify --tree branch:3,2 --scheme without_replacement --temperature 0.7 --top-k 3
    jaxspec verify --mutant depth-row                 # watch the harness reject a bug
    jaxspec verify --target default-target --draft default-draft --top-k 4 --prompt "def "
    jaxspec verify --samples 1e5 --json --plots plots/
    jaxspec verify --prompt-bucket none               # the unpadded program: the same tokens, cheaper
    jaxspec verify --target smollm2-135m --draft layers:8 --samples 4096 --horizon 8   # no enumeration: PIT

A law too large to enumerate (``V**L`` cells over :data:`~jaxspec.exactness.exact_laws.MAX_CELLS`,
any real vocabulary without a small ``--top-k``) is tested without enumeration
(``--method auto``): the conditional PIT and hashed two-sample tests
(:mod:`jaxspec.exactness.sampled`), each with the smallest deviation it detects.

Exit status: 0 when every test passes, 1 when any is rejected, 3 when none is rejected but
the run has no statistical power (``INCONCLUSIVE``: a test that cannot reject whatever the
samples, e.g. a χ² test with every cell pooled into one, or a smallest detectable TV >= 1;
see :attr:`jaxspec.exactness.report.VerifyReport.verdict`) or is a ``--mutant``'s that no
test rejected (``NOT REJECTED``, never ``PASSED``: a mutant is a known bug, and the run says
which deviations its sample count can detect), 2 on bad input or any other failure (an
unwritable ``--plots`` folder, a device error): never 1 unless a test rejected.
"""

from __future__ import annotations

import argparse
import math
import sys

from jaxspec.cli.common import (
    CLIError,
    Handler,
    arg_type,
    check_output_dir,
    check_tokenizer_fits,
    command,
    flag_mesh,
    flag_sampling,
    jax_platform_failure,
    load_flag_model,
    QUANTIZE_MODES,
    mesh_flag,
    nonneg_float,
    positive_int,
    resolve_tokenizer,
    seed_int,
    unit_float,
    utf8_text,
    warn_if_head_for_another_target,
)
from jaxspec.cli.compile_cache import enable_compilation_cache
from jaxspec.errors import SettingError

__all__ = ["verify_command"]

EXIT_STATUS = {"passed": 0, "rejected": 1, "inconclusive": 3}  # 2: bad input or another failure
MAX_SAMPLES = 10**12  # --samples: days of sampling on one accelerator; int64 counts stay exact


def _bucket(s: str) -> int | None:
    """``--prompt-bucket``: a positive integer, or ``none`` (no padding)."""
    if s.strip().lower() == "none":
        return None
    return positive_int(s)


def _count(s: str) -> int:
    """A positive integer up to :data:`MAX_SAMPLES`, also written like ``1e6`` or ``10**6``."""
    too_large = argparse.ArgumentTypeError(f"expected a positive integer <= 1e12 (10**12), got {s!r}")
    try:
        if "**" in s:
            a, b = (int(x) for x in s.split("**"))
            if b < 0:
                raise ValueError
            if abs(a) > 1 and b > 64:  # far past the bound: do not compute a huge power
                raise too_large
            v = a**b
        else:
            f = float(s)
            if f == math.inf:
                raise too_large
            if f != int(f):
                raise ValueError
            v = int(f)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a positive integer (e.g. 1000000 or 1e6), got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    if v > MAX_SAMPLES:
        raise too_large
    return v


#: the smallest block size ``verify`` picks by itself (:data:`jaxspec.exactness.harness.CHUNK_MIN`)
CHUNK_FLOOR = 256
#: blocks are int32-indexed, one per device past the last (:func:`jaxspec.exactness.sample_counts.count_samples`)
MAX_BLOCKS = 2**31 - 1


def _most_samples(chunk: int, devices: int = 1) -> int:
    return (MAX_BLOCKS + 1 - devices) * chunk


def _check_blocks(args, chunk: int | None, devices: int | None = None) -> None:
    """Refuse ``--samples`` that take more blocks of ``chunk`` samples (``--chunk-size``, or
    the smallest default chunk, or the default the harness picks) than a block index holds,
    naming both flags."""
    if chunk is None:
        return
    if devices is None:
        import jax

        devices = int(args.mesh.shape["data"]) if args.mesh is not None else jax.device_count()
    most = _most_samples(chunk, devices)
    if args.samples <= most:
        return
    blocks = -(-args.samples // chunk)
    if args.chunk_size is not None:
        whose = f"--chunk-size {chunk}"
    elif args.target is not None and chunk == CHUNK_FLOOR:
        whose = f"no --chunk-size (a --target's default chunk can be {chunk})"
    else:
        whose = f"no --chunk-size (the default chunk for these models and tree is {chunk})"
    need = -(-args.samples // (MAX_BLOCKS + 1 - devices))
    raise CLIError(f"--samples {args.samples} and {whose}: {blocks} blocks; expected at most "
                   f"{MAX_BLOCKS + 1 - devices} blocks (an int32 block index over {devices} device(s)): "
                   f"--samples <= {most}, or --chunk-size >= {need}")


_probability = arg_type(float, lambda x: 0.0 < x < 1.0, "a number in (0, 1)")
_top_p = arg_type(float, lambda x: 0.0 < x <= 1.0, "a number in (0, 1]")


def _parse_prompt(text: str | None, vocab_size: int, target: str | None = None):
    """Comma-separated token ids, or text tokenized as ``jaxspec generate`` does
    (:func:`jaxspec.cli.common.resolve_tokenizer`: the ``tokenizer.json`` of the ``--target``
    folder, else the byte tokenizer, for a vocabulary of its size). ``target`` None: the tiny
    random pair, which has no tokenizer (only the byte tokenizer, if its vocabulary fits)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if parts and all(p.lstrip("-").isdigit() for p in parts):
        ids = [int(p) for p in parts]
        for i, t in enumerate(ids):
            if not 0 <= t < vocab_size:
                raise CLIError(f"--prompt[{i}] = {t}: expected a token id in [0, {vocab_size}) (the target's "
                               "vocabulary)")
        return ids
    from jaxspec.formats.tokenizer import VOCAB_SIZE, ByteTokenizer

    if target is None:
        if vocab_size != VOCAB_SIZE:
            raise CLIError(f"--prompt {text!r}: expected comma-separated token ids (text needs the byte "
                           f"tokenizer's vocabulary of {VOCAB_SIZE}, or a --target with a tokenizer.json; the "
                           f"target has {vocab_size})")
        tok = ByteTokenizer()
    else:
        tok = resolve_tokenizer("--target", target)
        check_tokenizer_fits("--target", target, tok, vocab_size,
                             alternative=f"; or pass --prompt as comma-separated token ids, not {text!r}")
    ids = tok.encode(text)
    if not ids:
        raise CLIError(f"--prompt {text!r}: expected at least one token")
    return ids


@command("verify", help="test that speculative decoding samples exactly the target's law (chi-square, TV, acceptance)",
         error_status=2)
def verify_command(p: argparse.ArgumentParser) -> Handler:
    from jaxspec.core.rules import CHOICES
    from jaxspec.core.sampling import SCHEMES
    from jaxspec.decode.inputs import PROMPT_BUCKET
    from jaxspec.exactness.harness import DEFAULT_TREE, METHODS, MUTANT_CONFIG
    from jaxspec.exactness.mutants import MUTANTS

    p.epilog = ("exit status: 0 PASSED (every test passed), 1 REJECTED (a test rejected), 3 INCONCLUSIVE (no test "
                "rejected, but the run has no statistical power: a test that cannot reject whatever the samples, "
                "e.g. a chi-square test with every cell pooled into one (dof 0), or a smallest detectable TV >= 1; "
                "the summary says how many --samples are needed; or NOT REJECTED: a --mutant no test rejected, "
                "with the smallest TV this --samples can detect), 2 bad input or another failure")
    sampling_default = "for --scheme iid / without_replacement, 1 for deterministic"

    g = p.add_argument_group("decoder")
    g.add_argument("--tree", default=None,
                   help=f"tree spec: chain:K, branch:3,2,1, parents:-1,0,0, dynamic:depth=D,topk=K,nodes=N "
                        f"(default: jaxspec generate's, {DEFAULT_TREE}; with --mutant, the tree it breaks: "
                        f"{MUTANT_CONFIG['token'][0]}, or {MUTANT_CONFIG['block'][0]} for block verification's)")
    g.add_argument("--scheme", choices=SCHEMES, default=None,
                   help="sibling scheme (default: jaxspec generate's, the draft's own: without_replacement for a "
                        "draft model on a static tree; deterministic for dynamic trees, the only scheme they "
                        "accept; iid with --mutant and no --tree)")
    g.add_argument("--rule", choices=CHOICES, default="auto",
                   help="verification rule (default: auto, block on a chain and token on other trees; block: "
                        "chains; traversal: static trees)")
    g.add_argument("--temperature", type=nonneg_float, default=1.0, help="target temperature (default: 1)")
    g.add_argument("--top-k", type=positive_int, help="target top-k (enumeration of a large vocabulary needs a small one)")
    g.add_argument("--top-p", type=_top_p, help="target top-p")
    g.add_argument("--min-p", type=unit_float, help="target min-p in [0, 1]")
    g.add_argument("--draft-temperature", type=nonneg_float,
                   help=f"draft temperature (default: the target's --temperature {sampling_default})")
    g.add_argument("--draft-top-k", type=positive_int,
                   help="draft top-k (default: the target's --top-k for --scheme iid / without_replacement, "
                        "none for deterministic)")
    g.add_argument("--draft-top-p", type=_top_p,
                   help="draft top-p (default: the target's --top-p for --scheme iid / without_replacement, "
                        "none for deterministic)")
    g.add_argument("--draft-min-p", type=unit_float,
                   help="draft min-p (default: the target's --min-p for --scheme iid / without_replacement, "
                        "none for deterministic)")
    g.add_argument("--mutant", choices=MUTANTS,
                   help="run a deliberately broken decoder: it must be rejected (exit 1); not rejected, it is "
                        "NOT REJECTED with exit 3 and the smallest TV this --samples can detect")
    g = p.add_argument_group("models and prompt")
    g.add_argument("--target", help="target model name, folder or GGUF file (default: the tiny random pair)")
    g.add_argument("--draft", help="with --target: a draft model name or folder, a feature head, 'ngram' for "
                                   "prompt lookup or 'layers:K' for the target's first K layers (as jaxspec "
                                   "generate takes)")
    g.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                   help="int8: test the W8A8 models (jaxspec.load_model(..., quantize='int8')), the tiny "
                        "random pair too")
    g.add_argument("--prompt", type=utf8_text,
                   help="comma-separated token ids, or text (tokenized as jaxspec generate does: with the "
                        "--target folder's tokenizer.json, else as UTF-8 bytes for a 264-token vocabulary) "
                        "(default: 1,2,3)")
    g.add_argument("--prompt-bucket", type=_bucket, default=PROMPT_BUCKET, metavar="N",
                   help=f"test the program with the prompt padded to a multiple of N tokens (default: jaxspec "
                        f"generate's, {PROMPT_BUCKET}); 'none': the prompt's own width (the same tokens, "
                        "tests/test_prompt_bucket.py, and cheaper to sample)")
    g = p.add_argument_group("statistics")
    g.add_argument("--samples", type=_count, default=10**6,
                   help="samples per run (default: 1e6), at most 1e12 and at most 2**31 - 1 blocks of --chunk-size "
                        "samples: with a --target and no --chunk-size (whose default can be 256), at most "
                        f"{_most_samples(CHUNK_FLOOR):.3g}")
    g.add_argument("--horizon", type=positive_int, default=3, help="tokens whose joint law is tested (default: 3)")
    g.add_argument("--method", choices=METHODS, default="auto",
                   help="enumerate: chi-square against the exact joint law (at most MAX_CELLS = 2**20 cells); "
                        "sampled: no enumeration, any vocabulary (the conditional PIT against the target's "
                        "next-token laws, and hashed cells against target-only sampling); auto (default): "
                        "enumerate where the law fits, else sampled")
    g.add_argument("--alpha", type=_probability, default=1e-3, help="family-wise error rate (default: 1e-3)")
    g.add_argument("--seed", type=seed_int, default=0, help="sampling seed, in [0, 2**32) (default: 0)")
    g.add_argument("--chunk-size", type=positive_int,
                   help="rows per device per step (default: 16384 on CPU, 65536 on accelerators, cut down to "
                        "256 / 4096 for large models or vocabularies so that a step takes seconds)")
    g.add_argument("--no-acceptance", action="store_true", help="skip the acceptance-per-depth run")
    g.add_argument("--mesh", type=mesh_flag, default=None, metavar="data=N,model=M",
                   help="blocks of samples over 'data', each block's model forwards split over 'model' "
                        "(default: blocks over every device; on CPU, host devices are made to fit)")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the report as JSON (instead of the summary)")
    g.add_argument("--plots", metavar="DIR", help="write marginals.png, joint.png, acceptance.png into DIR "
                                                  "(sampled: pit.png, hashed.png, acceptance.png)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--no-compile-cache", action="store_true",
                   help="do not use the persistent compilation cache ($JAXSPEC_COMPILATION_CACHE)")
    g.add_argument("--program-store", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the traced programs beside the compiled ones, so that the next process skips "
                        "tracing and lowering too (first tokens in about a third of the time; keyed by the "
                        "versions of jax, jaxlib and flax, XLA_FLAGS, the device kind and jaxspec's source; "
                        "default on: --no-program-store or $JAXSPEC_PROGRAM_STORE=off opts out)")

    def run(args: argparse.Namespace) -> int:
        args.mesh = flag_mesh(args.mesh)  # before anything starts JAX's backends
        _check_blocks(args, args.chunk_size or (CHUNK_FLOOR if args.target is not None else None))  # before loading
        if not args.no_compile_cache:
            enable_compilation_cache(store_programs=args.program_store)
        try:
            return _run(args)
        except (OSError, RuntimeError, FloatingPointError) as e:  # exit 1 means "a test rejected"
            raise CLIError(jax_platform_failure(e) or str(e) or type(e).__name__) from None

    return run


def _config_vocab(name: str) -> int | None:
    """The vocabulary size in the config of the model ``name`` (a GGUF file's metadata, a
    folder's ``config.json``), read without its weights; None where it cannot be read (the
    loader then names what is wrong)."""
    from jaxspec.formats.checkpoint import read_config, resolve_model_path
    from jaxspec.formats.gguf import gguf_config, is_gguf_source

    try:
        if is_gguf_source(name):
            return gguf_config(resolve_model_path(name)).vocab_size
        v = read_config(name).get("vocab_size")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    except (ValueError, OSError, ImportError):
        return None


def _laws(args):
    """The target's :class:`jaxspec.Sampling` from the flags, and the draft's: None when no
    ``--draft-*`` flag is given, else a dict of the fields the flags give, which the
    library's :func:`jaxspec.core.settings.draft_law` sets over its default (the target's
    law under ``iid`` / ``without_replacement``, no warp under ``deterministic``) with the
    scheme the drafter serves."""
    names = ("temperature", "top_k", "top_p", "min_p")
    target = flag_sampling(*(getattr(args, n) for n in names))
    given = {n: getattr(args, f"draft_{n}") for n in names if getattr(args, f"draft_{n}") is not None}
    if given:  # each value checked, named by its flag (the fields not given at Sampling's defaults)
        from jaxspec.core.settings import Sampling

        flag_sampling(*(given.get(n, getattr(Sampling(), n)) for n in names), prefix="--draft-")
    return target, given or None


def _run(args: argparse.Namespace) -> int:
    from jaxspec.core.treespec import parse_tree
    from jaxspec.decode.combinations import check_settings
    from jaxspec.exactness.harness import DEFAULT_TREE, MUTANT_CONFIG, verify
    from jaxspec.exactness.mutants import MUTANT_RULE

    if args.target is not None and args.draft is None:  # a packaged target's own drafter, as generate uses it
        from jaxspec.cli.gen_setup import packaged_draft

        args.draft, own_tree = packaged_draft(args.target)
        if args.draft is not None and args.tree is None and not args.mutant:
            args.tree = own_tree
    if (args.target is None) != (args.draft is None):
        raise CLIError("--target and --draft: pass both (a packaged target such as smollm2-135m has a default "
                       "--draft), or neither for the tiny random pair")
    try:
        if args.tree is None:  # generate's tree, or the one the mutant breaks (and its scheme)
            args.tree, default_scheme = (MUTANT_CONFIG[MUTANT_RULE[args.mutant]] if args.mutant
                                         else (DEFAULT_TREE, None))
            args.scheme = default_scheme if args.scheme is None else args.scheme
        tree = parse_tree(args.tree)
    except ValueError as e:
        raise CLIError(f"--tree: {e}") from None
    check_settings(tree=tree, scheme=args.scheme, rule=args.rule)  # before any model is loaded
    sampling, draft_sampling = _laws(args)
    if args.plots is not None:
        check_output_dir("--plots", args.plots)  # an empty path too
    if args.target is not None and args.method == "enumerate":  # the cells, from the config alone
        from jaxspec.exactness.sampled import too_many_cells

        vocab = _config_vocab(args.target)
        refusal = None if vocab is None else too_many_cells(sampling, vocab, args.horizon)
        if refusal is not None:
            raise refusal  # named by flag by the command line's main
    if args.target is not None:
        from jaxspec.cli.gen_setup import modelless_drafter

        target = load_flag_model("--target", args.target, quantize=args.quantize)
        draft = modelless_drafter(args.draft)
        if draft is None:
            draft = load_flag_model("--draft", args.draft, draft=True, quantize=args.quantize)
            warn_if_head_for_another_target("--draft", args.draft, target, args.target)
    else:
        from jaxspec.exactness.harness import default_pair
        from jaxspec.nn.quant import apply_quantize

        target, draft = (apply_quantize(m, args.quantize) for m in default_pair(0))
    vocab = target.config.vocab_size
    prompt = _parse_prompt(args.prompt, vocab, args.target)
    h = args.horizon
    if args.chunk_size is None:  # the block size the harness will pick, checked before any compilation
        import jax

        from jaxspec.exactness.harness import default_chunk

        devices = list(args.mesh.devices.flat) if args.mesh is not None else jax.devices()
        _check_blocks(args, default_chunk(devices, target, draft, tree.num_nodes, h))
    try:
        report = verify(
            target, draft, tree=args.tree, scheme=args.scheme, rule=args.rule, sampling=sampling,
            draft_sampling=draft_sampling, prompt=prompt, horizon=h,
            num_samples=args.samples, chunk_size=args.chunk_size, seed=args.seed, mutant=args.mutant,
            alpha=args.alpha, check_acceptance=not args.no_acceptance, progress=not args.no_progress,
            mesh=args.mesh, prompt_bucket=args.prompt_bucket, method=args.method,
        )
    except SettingError:
        raise  # named by flag by the command line's main
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(report.to_json() if args.json else report.summary())
    if args.plots is not None:
        for path in report.save_plots(args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return EXIT_STATUS[report.verdict]
