"""The ``jaxspec`` command line.

Each subcommand is one function registered with :func:`command`: it receives its
``argparse`` subparser, adds its arguments and returns the handler that runs it. Put it in
this module or in a module ``jaxspec/cli_<name>.py``, which is imported (and so registered)
automatically::

    @command("generate", help="generate text with tree speculative decoding")
    def _generate(p: argparse.ArgumentParser) -> Handler:
        p.add_argument("--prompt", required=True)

        def run(args: argparse.Namespace) -> int:
            ...
            return 0

        return run

Handlers report bad input by raising :class:`CLIError` (or ``ValueError`` /
``FileNotFoundError`` from the library): :func:`main` prints ``jaxspec <cmd>: error: <msg>``
to stderr and returns exit status 2 (1 for other runtime failures), never a traceback.

    jaxspec train --out runs/target --steps 1200
    jaxspec distill --target runs/target/final --out runs/draft --steps 600
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main", "command", "CLIError", "build_parser"]

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Handler]]] = {}


class CLIError(Exception):
    """Bad user input: reported as one line on stderr, exit status 2."""


def command(name: str, *, help: str):  # noqa: A002 (argparse's word)
    """Register ``setup(parser) -> handler`` as subcommand ``name``."""

    def register(setup: Callable[[argparse.ArgumentParser], Handler]):
        if name in _COMMANDS:
            raise ValueError(f"command {name!r} is already registered")
        _COMMANDS[name] = (help, setup)
        return setup

    return register


# ----------------------------------------------------------------------------- argument types
def arg_type(convert, ok, what: str):
    """An argparse ``type=``: ``convert`` the string, then require ``ok(value)``; the
    message says what was expected and what was given."""

    def parse(s: str):
        try:
            v = convert(s)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v

    parse.__name__ = what.replace(" ", "_")
    return parse


_positive_int = arg_type(int, lambda v: v >= 1, "a positive integer")
_nonneg_int = arg_type(int, lambda v: v >= 0, "a non-negative integer")
# numbers the computation holds in float32: at most float32's largest finite number
_F32_MAX = 3.4028234663852886e38  # float(numpy.finfo(numpy.float32).max), without importing numpy
_positive_float = arg_type(float, lambda v: 0 < v <= _F32_MAX, "a positive number (at most 3.4e38)")
_nonneg_float = arg_type(float, lambda v: 0 <= v <= _F32_MAX, "a non-negative number (at most 3.4e38)")
_unit_float = arg_type(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
# --seed: jax.random.key keeps 32 bits of the seed (2**32 + s would give the key of s)
_seed = arg_type(int, lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)")


def check_output_dir(flag: str, path: str | os.PathLike) -> Path:
    """Refuse, before any long work, an output folder that cannot be written.

    ``path`` must be an existing folder, or creatable: its nearest existing ancestor is a
    folder this process can create entries in. That is tried with a temporary folder,
    removed at once (``os.access`` answers yes to root for places such as ``/proc``).
    Raises :class:`CLIError` naming ``flag`` (``--out``, ``OUT_DIR``, ...) and ``path``;
    returns ``Path(path)``.
    """
    if not str(path).strip():
        raise CLIError(f"{flag} {str(path)!r}: expected a folder path, got an empty one")
    p = Path(path).expanduser()
    here = Path(os.path.abspath(p))
    anc = here
    while not os.path.lexists(anc) and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        if anc == here:
            raise CLIError(f"{flag} {path}: expected a folder, got an existing file")
        raise CLIError(f"{flag} {path}: cannot create this folder: {anc} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".jaxspec-write-test-", dir=anc))
    except OSError as e:
        where = "this folder" if anc == here else f"{anc}"
        raise CLIError(f"{flag} {path}: cannot write into {where} ({e.strerror or e})") from None
    return p


# ----------------------------------------------------------------------------- train / distill
_MODEL_FLAGS = {  # flag -> ModelConfig field
    "hidden_size": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "context": "max_position_embeddings",
}


def _add_model_args(p: argparse.ArgumentParser, default_preset: str) -> None:
    from jaxspec.train import PRESETS

    g = p.add_argument_group("model size (a preset, optionally overridden field by field)")
    g.add_argument("--preset", choices=sorted(PRESETS), default=default_preset, help=f"default: {default_preset}")
    g.add_argument("--hidden-size", type=_positive_int)
    g.add_argument("--layers", type=_positive_int, help="num_hidden_layers")
    g.add_argument("--heads", type=_positive_int, help="num_attention_heads")
    g.add_argument("--kv-heads", type=_positive_int, help="num_key_value_heads")
    g.add_argument("--intermediate-size", type=_positive_int)
    g.add_argument("--context", type=_positive_int, help="max_position_embeddings")
    g.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=None)


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from jaxspec.train import TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("optimization")
    g.add_argument("--steps", type=_positive_int, default=d.steps, help=f"default: {d.steps}")
    g.add_argument("--batch-size", type=_positive_int, default=d.batch_size, help=f"default: {d.batch_size}")
    g.add_argument("--seq-len", type=_positive_int, default=d.seq_len, help=f"default: {d.seq_len}")
    g.add_argument("--lr", type=_positive_float, default=d.lr, help=f"peak learning rate (default: {d.lr})")
    g.add_argument("--warmup-steps", type=_nonneg_int, default=d.warmup_steps, help=f"default: {d.warmup_steps}")
    g.add_argument("--min-lr-ratio", type=_unit_float, default=d.min_lr_ratio,
                   help=f"final lr / peak lr, in [0, 1] (default: {d.min_lr_ratio})")
    g.add_argument("--weight-decay", type=_nonneg_float, default=d.weight_decay, help=f"default: {d.weight_decay}")
    g.add_argument("--clip-norm", type=_positive_float, default=d.clip_norm, help=f"default: {d.clip_norm}")
    g.add_argument("--eval-every", type=_positive_int, default=d.eval_every, help=f"default: {d.eval_every}")
    g.add_argument("--eval-windows", type=_positive_int, default=d.eval_windows, help=f"default: {d.eval_windows}")
    g.add_argument("--checkpoint-every", type=_positive_int, default=d.checkpoint_every,
                   help=f"default: {d.checkpoint_every}")
    g.add_argument("--seed", type=_seed, default=d.seed, help=f"default: {d.seed}")
    g = p.add_argument_group("files")
    g.add_argument("--out", required=True, help="run folder (checkpoint/, final/, summary.json)")
    g.add_argument("--export", help="folder for the final model (default: OUT/final)")
    g.add_argument("--resume", action="store_true", help="continue the run from OUT/checkpoint")
    g.add_argument("--stop-at", type=_positive_int, metavar="STEP",
                   help="stop after STEP steps with a checkpoint (finish later with --resume)")
    g.add_argument("--max-files", type=_positive_int, help="use only the first N files of each corpus split")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _flag_names(message: str, args) -> str:
    """A library message with the config fields that flags set named by their flags:
    ``TrainConfig.min_lr_ratio`` -> ``--min-lr-ratio``, ``ModelConfig.num_attention_heads``
    and a bare ``num_attention_heads`` -> ``--heads``. Fields without a flag stay."""
    model = {field: flag for flag, field in _MODEL_FLAGS.items()}
    model["tie_word_embeddings"] = "tie_embeddings"
    flags = {f"ModelConfig.{field}": flag for field, flag in model.items()}
    flags.update(model)  # ModelConfig field names are distinctive enough to map bare
    flags.update({f"TrainConfig.{name}": name for name in vars(args)})
    flags["stop_at"] = "stop_at"  # a train() / distill() argument, named bare in their messages

    def sub(m):
        flag = flags.get(m.group(0))
        return m.group(0) if flag is None else "--" + flag.replace("_", "-")

    return re.sub(r"\b(?:(?:ModelConfig|TrainConfig)\.)?\w+", sub, message)


def _model_config(args):
    from jaxspec.train import PRESETS

    overrides = {field: getattr(args, flag) for flag, field in _MODEL_FLAGS.items() if getattr(args, flag) is not None}
    if args.tie_embeddings is not None:
        overrides["tie_word_embeddings"] = args.tie_embeddings
    if "hidden_size" in overrides or "num_attention_heads" in overrides:
        overrides["head_dim"] = None  # the presets' head_dim is hidden_size / heads: recompute it
    try:
        return dataclasses.replace(PRESETS[args.preset], **overrides)
    except ValueError as e:
        raise CLIError(_flag_names(str(e), args)) from None


def _train_config(args, model_config=None):
    from jaxspec.train import TrainConfig

    if args.warmup_steps >= args.steps:
        raise CLIError(f"--warmup-steps = {args.warmup_steps}: expected < --steps = {args.steps}")
    if model_config is not None and args.seq_len > model_config.max_position_embeddings:
        raise CLIError(
            f"--seq-len = {args.seq_len}: expected <= --context = {model_config.max_position_embeddings} "
            "(the model's max_position_embeddings)"
        )
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    try:
        return TrainConfig(**{n: getattr(args, n) for n in names if hasattr(args, n)})
    except ValueError as e:
        raise CLIError(_flag_names(str(e), args)) from None


def _check_output_dirs(args) -> None:
    """--out and --export of train / distill: writable folders, checked before training."""
    check_output_dir("--out", args.out)
    if args.export:
        check_output_dir("--export", args.export)


def _corpus(args):
    from jaxspec.corpus import load_corpus

    return load_corpus(max_files=args.max_files)


@command("train", help="train a target model from scratch on the stdlib corpus")
def _train(p: argparse.ArgumentParser) -> Handler:
    _add_model_args(p, "target")
    _add_train_args(p)

    def run(args) -> int:
        from jaxspec.train import train

        mc = _model_config(args)
        tc = _train_config(args, mc)
        _check_output_dirs(args)
        print(f"train: {mc.num_params():,} parameters; {tc.steps} steps of {tc.batch_size}x{tc.seq_len} tokens",
              file=sys.stderr)
        try:
            r = train(mc, tc, args.out, resume=args.resume, corpus=_corpus(args), progress=not args.no_progress,
                      export_dir=args.export, stop_at=args.stop_at)
        except ValueError as e:
            raise CLIError(_flag_names(str(e), args)) from None
        except KeyboardInterrupt:
            _say_where_to_resume("train", args.out)
            raise
        if r.final_dir is None:
            return _stopped(r)
        last = r.history[-1]
        print(json.dumps({"val_loss": last["val_loss"], "train_time_s": round(r.total_train_time_s, 1),
                          "params": mc.num_params(), "model": str(r.final_dir)}))
        return 0

    return run


@command("distill", help="distill a draft from a target (KL to the target's next-token law)")
def _distill(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--target", default="default-target", help="target model name or folder (default: default-target)")
    p.add_argument("--init", help="start the draft from this model (name or folder) instead of a random init")
    p.add_argument("--max-compute-ratio", type=_positive_float, default=0.125,
                   help="refuse drafts costing more than this fraction of the target's FLOPs per token (default: 0.125)")
    _add_model_args(p, "draft")
    _add_train_args(p)

    def run(args) -> int:
        from jaxspec.train import distill

        mc = _model_config(args)
        tc = _train_config(args, mc)
        _check_output_dirs(args)
        target = load_flag_model("--target", args.target)
        init = load_flag_model("--init", args.init) if args.init else None
        try:
            r = distill(target, mc, tc, args.out, resume=args.resume, corpus=_corpus(args),
                        progress=not args.no_progress, export_dir=args.export, init_draft=init,
                        max_compute_ratio=args.max_compute_ratio, stop_at=args.stop_at)
        except ValueError as e:
            msg = _flag_names(str(e), args)
            if "per-token FLOPs" in msg:
                msg += " (--max-compute-ratio)"
            raise CLIError(msg) from None
        except KeyboardInterrupt:
            _say_where_to_resume("distill", args.out)
            raise
        if r.final_dir is None:
            return _stopped(r)
        print(json.dumps({"alpha_before": r.alpha_before, "alpha_after": r.alpha_after,
                          "val_kl": r.history[-1]["val_kl"], "train_time_s": round(r.total_train_time_s, 1),
                          "params": mc.num_params(), "model": str(r.final_dir)}))
        return 0

    return run


def _stopped(r) -> int:
    print(json.dumps({"stopped_at_step": r.step, "train_time_s": round(r.total_train_time_s, 1),
                      "resume": "rerun the same command with --resume, and without --stop-at "
                                "(or with a later --stop-at)"}))
    return 0


def _say_where_to_resume(command: str, out) -> None:
    """On Ctrl-C during training: where the last checkpoint is (stderr), so that the run
    can be finished with --resume, or that there is none yet."""
    from jaxspec.train import CHECKPOINT_DIR, _META_FILE, _find_checkpoint

    found = _find_checkpoint(Path(out) / CHECKPOINT_DIR)
    if found is None:
        print(f"jaxspec {command}: no checkpoint was written yet (one comes every --checkpoint-every steps)",
              file=sys.stderr)
        return
    step = json.loads((found / _META_FILE).read_text())["step"]
    print(f"jaxspec {command}: the last checkpoint (step {step}) is in {found}; rerun the same command "
          "with --resume to continue from it", file=sys.stderr)


def load_flag_model(flag: str, name: str):
    """``load_model(name)`` for a command's flag; its errors name the flag that gave
    ``name`` (``--draft: load_model: unknown model 'foo'; ...``)."""
    from jaxspec.checkpoint import load_model

    try:
        return load_model(name)
    except (ValueError, FileNotFoundError) as e:
        raise CLIError(f"{flag}: {e}") from None


def resolve_scheme(scheme: str | None, tree_spec: str, dynamic: bool, default: str) -> str:
    """The ``--scheme`` of a command with a ``--tree``: when not given, ``deterministic``
    for a dynamic tree (the only scheme it takes) and ``default`` otherwise; an explicit
    scheme a dynamic tree cannot use is a :class:`CLIError` naming both flags."""
    if scheme is None:
        return "deterministic" if dynamic else default
    if dynamic and scheme != "deterministic":
        raise CLIError(f"--scheme {scheme}: a dynamic tree (--tree {tree_spec}) ranks fixed candidates; "
                       "expected --scheme deterministic (the default for dynamic trees)")
    return scheme


# ----------------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxspec", description="Lossless tree speculative decoding in JAX/XLA."
    )
    try:
        from jaxspec import __version__
    except ImportError:  # pragma: no cover
        __version__ = "?"
    parser.add_argument("--version", action="version", version=f"jaxspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (help_, setup) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_handler=setup(p))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 on success)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help / --version (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args._handler(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except (OSError, FloatingPointError, RuntimeError) as e:
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        return 1


def _register_command_modules() -> None:
    """Import every ``jaxspec/cli_<name>.py``: each registers its commands with :func:`command`."""
    for path in sorted(Path(__file__).resolve().parent.glob("cli_*.py")):
        importlib.import_module(f"jaxspec.{path.stem}")


_register_command_modules()

if __name__ == "__main__":  # ``python -m jaxspec.cli``: run the registry of the importable module
    from jaxspec.cli import main as _main

    sys.exit(_main())
