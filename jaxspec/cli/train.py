"""``jaxspec train``, ``jaxspec distill`` and ``jaxspec train-head``: train a target from
scratch on the stdlib corpus, distill a draft from a target (:mod:`jaxspec.training.train`),
or train a feature draft head on a frozen target (:mod:`jaxspec.training.head`)::

    jaxspec train --out runs/target --steps 1200
    jaxspec distill --target runs/target/final --out runs/draft --steps 600
    jaxspec train-head --target runs/target/final --out runs/head --steps 600

stdout: one strict JSON object (non-finite numbers as null). A run that diverges (an inf /
NaN loss or parameters) exits 1 with ``jaxspec <cmd>: error: <kind>: the run diverged at step
N: ...`` on stderr, naming the value, the last (finite) checkpoint if any and --lr; it
exports no final model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

from jaxspec.cli.common import (
    CLIError,
    Handler,
    check_output_dir,
    command,
    load_flag_model,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    seed_int,
    unit_float,
)

__all__ = ["train_command", "distill_command", "train_head_command"]

_MODEL_FLAGS = {  # flag -> ModelConfig field
    "hidden_size": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "context": "max_position_embeddings",
}


def _add_model_args(p: argparse.ArgumentParser, default_preset: str) -> None:
    from jaxspec.training.train import PRESETS

    g = p.add_argument_group("model size (a preset, optionally overridden field by field)")
    g.add_argument("--preset", choices=sorted(PRESETS), default=default_preset, help=f"default: {default_preset}")
    g.add_argument("--hidden-size", type=positive_int)
    g.add_argument("--layers", type=positive_int, help="num_hidden_layers")
    g.add_argument("--heads", type=positive_int, help="num_attention_heads")
    g.add_argument("--kv-heads", type=positive_int, help="num_key_value_heads")
    g.add_argument("--intermediate-size", type=positive_int)
    g.add_argument("--context", type=positive_int, help="max_position_embeddings")
    g.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=None)


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from jaxspec.training.train import TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("optimization")
    g.add_argument("--steps", type=positive_int, default=d.steps, help=f"default: {d.steps}")
    g.add_argument("--batch-size", type=positive_int, default=d.batch_size, help=f"default: {d.batch_size}")
    g.add_argument("--seq-len", type=positive_int, default=d.seq_len, help=f"default: {d.seq_len}")
    g.add_argument("--lr", type=positive_float, default=d.lr, help=f"peak learning rate (default: {d.lr})")
    g.add_argument("--warmup-steps", type=nonneg_int, default=d.warmup_steps, help=f"default: {d.warmup_steps}")
    g.add_argument("--min-lr-ratio", type=unit_float, default=d.min_lr_ratio,
                   help=f"final lr / peak lr, in [0, 1] (default: {d.min_lr_ratio})")
    g.add_argument("--weight-decay", type=nonneg_float, default=d.weight_decay, help=f"default: {d.weight_decay}")
    g.add_argument("--clip-norm", type=positive_float, default=d.clip_norm, help=f"default: {d.clip_norm}")
    g.add_argument("--eval-every", type=positive_int, default=d.eval_every, help=f"default: {d.eval_every}")
    g.add_argument("--eval-windows", type=positive_int, default=d.eval_windows, help=f"default: {d.eval_windows}")
    g.add_argument("--checkpoint-every", type=positive_int, default=d.checkpoint_every,
                   help=f"default: {d.checkpoint_every}")
    g.add_argument("--seed", type=seed_int, default=d.seed, help=f"default: {d.seed}")
    g = p.add_argument_group("files")
    g.add_argument("--out", required=True, help="run folder (checkpoint/, final/, summary.json)")
    g.add_argument("--export", help="folder for the final model (default: OUT/final)")
    g.add_argument("--resume", action="store_true", help="continue the run from OUT/checkpoint")
    g.add_argument("--stop-at", type=positive_int, metavar="STEP",
                   help="stop after STEP steps with a checkpoint (finish later with --resume)")
    g.add_argument("--max-files", type=positive_int, help="use only the first N files of each corpus split")
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
    if hasattr(args, "init"):  # distill()'s init_draft comes from --init
        flags["init_draft"] = "init"
    for name in ("feature_weight", "noise", "unroll"):  # train_head() arguments, likewise (train-head only)
        if hasattr(args, name):
            flags[name] = name

    def sub(m):
        flag = flags.get(m.group(0))
        return m.group(0) if flag is None else "--" + flag.replace("_", "-")

    return re.sub(r"\b(?:(?:ModelConfig|TrainConfig)\.)?\w+", sub, message)


def _model_config(args):
    from jaxspec.training.train import PRESETS

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
    from jaxspec.training.train import TrainConfig

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


def _print_json(obj: dict) -> None:
    """One line of strict JSON on stdout: non-finite floats become null (never ``NaN``)."""
    print(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in obj.items()},
                     allow_nan=False))


def _diverged(command: str, e, args) -> int:
    """A :class:`~jaxspec.training.train.TrainingDiverged`: one line on stderr (flags named
    by their flags: --lr, --warmup-steps), exit status 1 (a runtime failure)."""
    print(f"jaxspec {command}: error: {_flag_names(str(e), args)}", file=sys.stderr)
    return 1


def _fit(command: str, args, fit, refine=None):
    """Run ``fit()``, a training call, handling what every training command handles alike:
    divergence (one line, exit 1), a bad value (a :class:`CLIError` naming flags, passed through
    ``refine(message)`` when given) and Ctrl-C (after saying where to resume). Returns
    ``(result, None)``, or ``(None, exit status)`` when the run diverged or stopped at --stop-at."""
    from jaxspec.training.train import TrainingDiverged

    try:
        r = fit()
    except TrainingDiverged as e:
        return None, _diverged(command, e, args)
    except ValueError as e:
        msg = _flag_names(str(e), args)
        raise CLIError(refine(msg) if refine else msg) from None
    except KeyboardInterrupt:
        _say_where_to_resume(command, args.out)
        raise
    return (None, _stopped(r)) if r.final_dir is None else (r, None)


def _check_output_dirs(args) -> None:
    """--out and --export of train / distill: writable folders, checked before training."""
    check_output_dir("--out", args.out)
    if args.export:
        check_output_dir("--export", args.export)


def _corpus(args):
    from jaxspec.training.corpus import load_corpus

    return load_corpus(max_files=args.max_files)


@command("train", help="train a target model from scratch on the stdlib corpus")
def train_command(p: argparse.ArgumentParser) -> Handler:
    _add_model_args(p, "target")
    _add_train_args(p)

    def run(args) -> int:
        from jaxspec.training.train import train

        mc = _model_config(args)
        tc = _train_config(args, mc)
        _check_output_dirs(args)
        print(f"train: {mc.num_params():,} parameters; {tc.steps} steps of {tc.batch_size}x{tc.seq_len} tokens",
              file=sys.stderr)
        r, status = _fit("train", args, lambda: train(
            mc, tc, args.out, resume=args.resume, corpus=_corpus(args), progress=not args.no_progress,
            export_dir=args.export, stop_at=args.stop_at))
        if r is None:
            return status
        last = r.history[-1]
        _print_json({"val_loss": last["val_loss"], "train_time_s": round(r.total_train_time_s, 1),
                     "params": mc.num_params(), "model": str(r.final_dir)})
        return 0

    return run


@command("distill", help="distill a draft from a target (KL to the target's next-token law)")
def distill_command(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--target", default="default-target", help="target model name or folder (default: default-target)")
    p.add_argument("--init", help="start the draft from this model (name or folder) instead of a random init")
    p.add_argument("--max-compute-ratio", type=positive_float, default=0.125,
                   help="refuse drafts costing more than this fraction of the target's FLOPs per token (default: 0.125)")
    _add_model_args(p, "draft")
    _add_train_args(p)

    def run(args) -> int:
        from jaxspec.training.train import distill

        mc = _model_config(args)
        tc = _train_config(args, mc)
        _check_output_dirs(args)
        target = load_flag_model("--target", args.target)
        init = load_flag_model("--init", args.init) if args.init else None
        def refine(msg: str) -> str:
            msg = msg.replace("--init's config", f"the config of --init {args.init}")
            return msg + " (--max-compute-ratio)" if "per-token FLOPs" in msg else msg

        r, status = _fit("distill", args, lambda: distill(
            target, mc, tc, args.out, resume=args.resume, corpus=_corpus(args), progress=not args.no_progress,
            export_dir=args.export, init_draft=init, max_compute_ratio=args.max_compute_ratio,
            stop_at=args.stop_at), refine)
        if r is None:
            return status
        _print_json({"alpha_before": r.alpha_before, "alpha_after": r.alpha_after,
                     "val_kl": r.history[-1]["val_kl"], "train_time_s": round(r.total_train_time_s, 1),
                     "params": mc.num_params(), "model": str(r.final_dir)})
        return 0

    return run


@command("train-head", help="train a feature draft head (EAGLE style) on a frozen target")
def train_head_command(p: argparse.ArgumentParser) -> Handler:
    from jaxspec.training.head import DEFAULT_FEATURE_WEIGHT, DEFAULT_NOISE, MAX_UNROLL
    from jaxspec.training.recipe import parse_feature_layers

    p.add_argument("--target", default="default-target", help="target model name or folder (default: default-target)")
    g = p.add_argument_group("head size (default: the target's; the width and vocabulary are always the target's)")
    g.add_argument("--heads", type=positive_int, help="num_attention_heads")
    g.add_argument("--kv-heads", type=positive_int, help="num_key_value_heads")
    g.add_argument("--intermediate-size", type=positive_int)
    g = p.add_argument_group("objective")
    g.add_argument("--feature-weight", type=nonneg_float, default=DEFAULT_FEATURE_WEIGHT,
                   help="weight of the smooth-L1 feature regression next to the KL to the target's law "
                        f"(default: {DEFAULT_FEATURE_WEIGHT})")
    g.add_argument("--noise", type=nonneg_float, default=DEFAULT_NOISE,
                   help=f"half-width of the uniform noise on the input features in training (default: {DEFAULT_NOISE})")
    g.add_argument("--unroll", type=positive_int, default=1, metavar="S",
                   help="train draft depths 1..S, depth s reading the head's own depth s-1 predictions as in "
                        f"drafting (at most {MAX_UNROLL}; default: 1)")
    g = p.add_argument_group("the whole recipe (a chat or base target; docs/TRAINING.md)")
    g.add_argument("--recipe", action="store_true",
                   help="in --out, the target writes its own instructions and answers them, then the head trains "
                        "on the target's features there (jaxspec.training.recipe; every stage resumes: run the "
                        "same command again to go on)")
    g.add_argument("--hours", type=positive_float, default=None,
                   help="with --recipe: start no new batch of data after this many hours")
    g.add_argument("--per-category", type=positive_int, default=500,
                   help="with --recipe: instructions the target writes per category (a base model: 6 times as many "
                        "windows of the corpus to continue; default 500)")
    g.add_argument("--max-new-tokens", type=positive_int, default=256,
                   help="with --recipe: an answer's token budget (default 256)")
    g.add_argument("--feature-layers", type=parse_feature_layers, default=None, metavar="auto|I,J",
                   help="with --recipe: a multi-layer head (EAGLE-3) fusing the target's residuals after these "
                        "layers with its last features ('auto': layer 1 and the middle one); default: the last only")
    _add_train_args(p)

    def run(args) -> int:
        from jaxspec.nn.head import head_config
        from jaxspec.training.head import head_params, train_head

        if args.recipe:
            return _recipe(args)
        if args.feature_layers is not None:
            raise CLIError("--feature-layers: a multi-layer head trains from cached features; expected --recipe too")
        tc = _train_config(args)
        _check_output_dirs(args)
        target = load_flag_model("--target", args.target)
        try:
            hc = head_config(target.config, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                             intermediate_size=args.intermediate_size)
        except ValueError as e:
            raise CLIError(_flag_names(str(e), args)) from None
        print(f"train-head: a head of {hc.num_hidden_layers} layer (width {hc.hidden_size}); {tc.steps} steps of "
              f"{tc.batch_size}x{tc.seq_len} tokens", file=sys.stderr)
        r, status = _fit("train-head", args, lambda: train_head(
            target, tc, args.out, head_config=hc, resume=args.resume, corpus=_corpus(args),
            progress=not args.no_progress, export_dir=args.export, stop_at=args.stop_at,
            feature_weight=args.feature_weight, noise=args.noise, unroll=args.unroll))
        if r is None:
            return status
        last = r.history[-1]
        _print_json({"alpha_before": r.alpha_before, "alpha_after": r.alpha_after,
                     **{k: v for k, v in last.items() if k.startswith("alpha_depth_")},
                     "val_kl": last["val_kl"], "train_time_s": round(r.total_train_time_s, 1),
                     "params": head_params(r.model), "model": str(r.final_dir)})
        return 0

    return run


def _recipe(args) -> int:
    """``train-head --recipe``: :func:`jaxspec.training.recipe.run_recipe` in ``--out``."""
    from jaxspec.formats.checkpoint import load_tokenizer
    from jaxspec.training.recipe import model_digest, run_recipe

    target = load_flag_model("--target", args.target)
    try:
        tok = load_tokenizer(args.target)
    except (ValueError, FileNotFoundError) as e:
        raise CLIError(f"--target {args.target}: --recipe needs the target's tokenizer: {e}") from None
    tc = _train_config(args)
    report: dict = {}

    def fit():
        report.update(run_recipe(target, tok, args.out, model_digest=model_digest(args.target, target), train_config=tc,
                                 steps=tc.steps, stop_at=args.stop_at, hours=args.hours, seed=args.seed,
                                 per_category=args.per_category, max_new_tokens=args.max_new_tokens,
                                 feature_layers=args.feature_layers, progress=not args.no_progress))
        return report.get("train")

    class _DataOnly:  # the data stages stopped at --hours: no training yet
        final_dir, step, total_train_time_s = None, 0, 0.0

    r, status = _fit("train-head", args, lambda: fit() or _DataOnly())
    if r is None:
        return status
    _print_json({**{k: v for k, v in report.items() if k != "train"}, "alpha_before": r.alpha_before,
                 "alpha_after": r.alpha_after, "model": str(r.final_dir)})
    return 0


def _stopped(r) -> int:
    _print_json({"stopped_at_step": r.step, "train_time_s": round(r.total_train_time_s, 1),
                 "resume": "rerun the same command with --resume, and without --stop-at "
                           "(or with a later --stop-at)"})
    return 0


def _say_where_to_resume(command: str, out) -> None:
    """On Ctrl-C during training: where the last checkpoint is (stderr), so that the run
    can be finished with --resume, or that there is none yet."""
    from jaxspec.training.train import CHECKPOINT_DIR, find_checkpoint, read_checkpoint_meta

    found = find_checkpoint(Path(out) / CHECKPOINT_DIR)
    if found is None:
        print(f"jaxspec {command}: no checkpoint was written yet (one comes every --checkpoint-every steps)",
              file=sys.stderr)
        return
    try:
        step = read_checkpoint_meta(found)["step"]
    except ValueError as e:
        print(f"jaxspec {command}: {e}", file=sys.stderr)
        return
    print(f"jaxspec {command}: the last checkpoint (step {step}) is in {found}; rerun the same command "
          "with --resume to continue from it", file=sys.stderr)
