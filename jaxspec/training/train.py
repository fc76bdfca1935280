"""Training the embedded models: a target from scratch, then a draft distilled from it.

Both loops share one engine (:func:`fit`, public so that other trainers reuse it: the
feature head's, :mod:`jaxspec.training.head`): optax AdamW with linear warmup + cosine decay
and global-norm clipping, a jit-compiled step over ``nnx.split`` state (params and
optimizer state donated), a tqdm bar with loss and tokens/s, periodic validation and
resumable checkpoints::

    result = train(PRESETS["target"], TrainConfig(steps=600, warmup_steps=40), "runs/target")
    # runs/target/checkpoint/{state.safetensors,state.json}  params + opt state + step + data RNG
    # runs/target/final/{config.json,model.safetensors}      HF Llama layout (jaxspec.save_model)
    result.history[-1]        # {"step": 600, "val_loss": ..., ...}  nats/byte on held-out modules

    target = load_model("runs/target/final")
    result = distill(target, PRESETS["draft"], TrainConfig(steps=300, lr=2e-3, warmup_steps=20), "runs/draft")
    result.alpha_before, result.alpha_after   # mean over held-out positions of sum_v min(p, q)

docs/TRAINING.md records the recipe of the shipped default pair.

Objectives: ``train`` minimizes next-byte cross entropy; ``distill`` minimizes
``KL(softmax(target) || softmax(draft))`` at temperature 1, with the target's logits computed
on the fly inside the same jitted step. Losses and validation are in nats per token; tokens
are bytes (BOS / EOS file separators are < 0.02% of positions), so this is nats/byte.

Resuming (``resume=True``) restores params, optimizer state, step and the batch sampler's
RNG, and continues the *same* run: the result equals an uninterrupted run's bit for bit on
the same machine. The run's configuration must match the checkpoint's.

Divergence: a non-finite training loss (read every step for the progress bar), a non-finite
validation metric, or non-finite parameters / optimizer state when a checkpoint is about to
be written (the last step always writes one, so this also guards the exported model) stop
the run with :class:`TrainingDiverged`. Nothing non-finite is ever saved: the last
checkpoint on disk, if any, stays the last finite one, and no final model is exported.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from jaxspec.formats.checkpoint import save_model
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import Transformer, forward_logits, init_model
from jaxspec.formats.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE
from jaxspec.training.checkpoints import (
    META_FILE,
    find_checkpoint,
    flat_arrays,
    nonfinite_arrays,
    read_checkpoint_meta,
    read_checkpoint_state,
    save_checkpoint,
    unflat_arrays,
)
from jaxspec.training.corpus import BatchSampler, Corpus, eval_windows, load_corpus
from jaxspec.training.metrics import (
    acceptance_alpha,
    evaluate_loss,
    evaluate_pair,
    flops_per_token,
    kl_per_position,
    overlap_per_position,
    token_nll,
)

__all__ = [
    "kl_per_position",
    "overlap_per_position",
    "PRESETS",
    "TrainConfig",
    "TrainResult",
    "DistillResult",
    "TrainingDiverged",
    "train",
    "distill",
    "flops_per_token",
    "acceptance_alpha",
    "evaluate_loss",
    "fit",
    "validation_windows",
    "write_summary",
    "FINAL_DIR",
    "CHECKPOINT_DIR",
    "META_FILE",
    "find_checkpoint",
    "read_checkpoint_meta",
    "read_checkpoint_state",
]

# Model presets (byte vocabulary; EOS_ID, which ends every corpus document, is their
# eos_token_id). "target"/"draft" are the shipped default pair.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, eos_token_id=EOS_ID,
    ),
    "target": ModelConfig(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS_ID,
    ),
    "draft": ModelConfig(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, eos_token_id=EOS_ID,
    ),
}

CHECKPOINT_DIR = "checkpoint"
FINAL_DIR = "final"
# Fields that define the optimization trajectory: a resumed run must match them.
_TRAJECTORY_FIELDS = (
    "steps", "batch_size", "seq_len", "lr", "warmup_steps", "min_lr_ratio",
    "weight_decay", "b1", "b2", "clip_norm", "seed",
)
# config.json keys that tell loaders how to tokenize the embedded models (written by every
# save, so a model of a custom ModelConfig without eos_token_id is saved with EOS_ID too).
TOKENIZER_CONFIG = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "jaxspec_tokenizer": "byte"}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimization and bookkeeping settings (shared by :func:`train` and :func:`distill`)."""

    steps: int = 800
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio (cosine)
    weight_decay: float = 0.1  # on matrices only (ndim >= 2)
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0
    eval_every: int = 100
    eval_windows: int = 64  # held-out windows of seq_len per evaluation
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "eval_every", "eval_windows", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} = {v!r}: expected a positive integer")
        for name in ("warmup_steps", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"TrainConfig.{name} = {v!r}: expected a non-negative integer")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"TrainConfig.warmup_steps = {self.warmup_steps}: expected < steps = {self.steps}")
        checks = {
            "lr": lambda v: v > 0, "clip_norm": lambda v: v > 0, "weight_decay": lambda v: v >= 0,
            "min_lr_ratio": lambda v: 0 <= v <= 1, "b1": lambda v: 0 <= v < 1, "b2": lambda v: 0 <= v < 1,
        }
        for name, ok in checks.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"TrainConfig.{name} = {v!r}: out of range")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    model: Transformer
    history: list[dict[str, float]]  # one entry per evaluation
    final_dir: Path | None  # None when stopped early (stop_at < steps): resume to finish
    step: int  # steps completed
    wall_time_s: float  # this process's time in the training loop (excluding earlier runs)
    total_train_time_s: float  # across resumptions


@dataclasses.dataclass(frozen=True)
class DistillResult(TrainResult):
    alpha_before: float = float("nan")
    alpha_after: float = float("nan")


class TrainingDiverged(FloatingPointError, RuntimeError):
    """The run diverged: a loss, a validation metric or the parameters became inf / NaN.

    Raised by :func:`train`, :func:`distill` and :func:`jaxspec.training.head.train_head`
    (any :func:`fit`) with no final model written. ``step``: the step at which it was
    detected; ``metric``: what was non-finite (``"loss"``, ``"params"`` or a validation
    metric: ``"val_loss"``, ``"val_kl"``, ``"alpha"``, ...); ``loss``: its value (for
    ``"params"``, the step's training loss); ``last_checkpoint``: the folder of the last
    (finite) checkpoint of this run, or None, and ``last_checkpoint_step`` its step.
    (A ``FloatingPointError`` too, which earlier versions raised for a non-finite loss.)
    """

    def __init__(self, message: str, *, step: int, metric: str, loss: float,
                 last_checkpoint: Path | None, last_checkpoint_step: int | None):
        super().__init__(message)
        self.step, self.metric, self.loss = step, metric, loss
        self.last_checkpoint, self.last_checkpoint_step = last_checkpoint, last_checkpoint_step


# ----------------------------------------------------------------------------- engine
def _optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.steps, end_value=cfg.lr * cfg.min_lr_ratio,
    )
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask),
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "loss_fn", "cfg"), donate_argnums=(0, 1))
def _train_step(params, opt_state, batch, consts, fixed, *, graphdef, loss_fn, cfg: TrainConfig):
    """One optimizer step: ``-> (params, opt_state, loss, grad_norm)``; params and
    optimizer state are donated; ``fixed`` is the model's state that is not ``nnx.Param``
    (e.g. a head's draft vocabulary ids), never differentiated. ``graphdef``, ``loss_fn`` and
    ``cfg`` are hashable statics, so repeated runs of one configuration reuse the compiled step."""

    def objective(p):
        return loss_fn(nnx.merge(graphdef, p, fixed), batch, *consts)

    loss, grads = jax.value_and_grad(objective)(params)
    updates, opt_state = _optimizer(cfg).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)


def fit(
    *,
    kind: str,
    model: Transformer,
    loss_fn: Callable,
    consts: tuple,
    evaluate: Callable[[Transformer], dict[str, float]],
    cfg: TrainConfig,
    corpus: Corpus,
    out_dir: Path,
    resume: bool,
    progress: bool,
    extra_meta: dict,
    stop_at: int | None,
) -> tuple[Transformer, list[dict], float, float, int]:
    """The training loop shared by :func:`train`, :func:`distill` and
    :func:`jaxspec.training.head.train_head`: ``cfg.steps`` optimizer steps on ``model``
    (any ``nnx.Module`` with a ``.config`` ModelConfig) from the corpus's train split.

    ``loss_fn(model, batch int32[B, T+1], *consts) -> scalar`` must be hashable (a static of
    the jitted step; ``consts`` are its array arguments, e.g. a frozen target's params).
    ``evaluate(model) -> {name: float}`` runs every ``cfg.eval_every`` steps and at the end;
    each value must be finite. ``kind`` names the run in messages and checkpoints;
    ``extra_meta`` joins the checkpoint metadata (``target_digest`` is checked on resume).
    Writes ``out_dir/checkpoint``; resumes it when ``resume``; stops after ``stop_at``.
    Raises :class:`TrainingDiverged` (see the module docstring).

    Returns ``(model, history, wall_time_s, total_train_time_s, step)``.
    """
    ckpt_dir = out_dir / CHECKPOINT_DIR
    graphdef, params, fixed = nnx.split(model, nnx.Param, ...)  # only nnx.Param is trained
    tx = _optimizer(cfg)
    opt_state = tx.init(params)
    sampler = BatchSampler(corpus.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    meta_base = {
        "kind": kind,
        "model_config": model.config.to_dict(),
        "train_config": dataclasses.asdict(cfg),
        "corpus_digest": corpus.digest,
        **extra_meta,
    }
    start, history, prior_time = 0, [], 0.0
    found = find_checkpoint(ckpt_dir) if resume else None
    if resume and found is None:
        raise FileNotFoundError(f"{kind}: --resume given but no checkpoint in {ckpt_dir}")
    if found is not None:
        meta = read_checkpoint_meta(found)
        arrays = read_checkpoint_state(found)  # readable before it is compared with this run
        _check_resumable(meta, meta_base, found)
        bad = nonfinite_arrays(arrays)
        if bad:  # written by a version that saved diverged states
            raise ValueError(
                f"resume: {found}: the checkpoint (step {meta['step']}) holds non-finite values in {len(bad)} "
                f"tensors (e.g. {bad[0]}): the run had diverged; start a new run with a lower TrainConfig.lr"
            )
        state = unflat_arrays({"params": params, "opt_state": opt_state}, arrays, found)
        params, opt_state = state["params"], state["opt_state"]
        try:
            sampler.set_state(meta["sampler_state"])
        except (ValueError, TypeError, KeyError):
            raise _damaged(found / META_FILE, "'sampler_state' is not a state of the batch sampler's "
                                               "random generator") from None
        start, history, prior_time = meta["step"], meta["history"], meta["train_time_s"]
        if stop_at is not None and stop_at <= start:
            raise ValueError(
                f"{kind}: stop_at = {stop_at}: the checkpoint in {found} is already at step {start}; "
                f"expected a later step (or none, to finish the {cfg.steps} steps)"
            )
    elif not resume and find_checkpoint(ckpt_dir) is not None:
        raise ValueError(f"{kind}: {ckpt_dir} already holds a checkpoint; pass resume=True (--resume) or use a new out dir")

    tokens_per_step = cfg.batch_size * cfg.seq_len
    bar = tqdm(total=cfg.steps, initial=start, desc=kind, disable=not progress, mininterval=5.0,
               dynamic_ncols=True, file=sys.stderr)
    t_start = time.perf_counter()
    t_last, n_last = t_start, 0
    ema_num = ema_den = 0.0  # bias-corrected EMA of the training loss

    def diverged(step, metric, value, what):
        """Raise :class:`TrainingDiverged`, naming the last checkpoint on disk (all finite:
        :func:`checkpoint` writes no other)."""
        found = find_checkpoint(ckpt_dir)
        ckpt_step = json.loads((found / META_FILE).read_text())["step"] if found is not None else None
        kept = (f"No final model was written; the last finite checkpoint (step {ckpt_step}) is kept in {found} "
                "(it resumes only with this run's settings, so start the new run in another folder)"
                if found is not None else "No final model and no checkpoint were written")
        raise TrainingDiverged(
            f"{kind}: the run diverged at step {step}: {what}. {kept}. Lower the learning rate "
            f"(TrainConfig.lr = {cfg.lr:g}) or lengthen the warmup (TrainConfig.warmup_steps = {cfg.warmup_steps}) "
            "and train again",
            step=step, metric=metric, loss=value, last_checkpoint=found, last_checkpoint_step=ckpt_step,
        )

    def checkpoint(step, loss):
        arrays = flat_arrays({"params": params, "opt_state": opt_state})  # on the host: checked for free
        bad = sorted(nonfinite_arrays(arrays), key=lambda k: not k.startswith("['params']"))  # params first
        if bad:
            diverged(step, "params", loss, f"{len(bad)} parameter / optimizer-state tensors are not finite "
                                           f"(e.g. {bad[0]}; training loss {loss:.6g})")
        meta = {**meta_base, "step": step, "sampler_state": sampler.get_state(), "history": history,
                "train_time_s": prior_time + time.perf_counter() - t_start}
        save_checkpoint(ckpt_dir, arrays, meta)

    last = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
    step = start
    try:
        for step in range(start + 1, last + 1):
            batch = jnp.asarray(sampler.next())
            params, opt_state, loss, gnorm = _train_step(
                params, opt_state, batch, consts, fixed, graphdef=graphdef, loss_fn=loss_fn, cfg=cfg
            )
            loss = float(loss)  # the one host read per step (EMA / progress bar); NaN is sticky in params
            if not math.isfinite(loss):
                diverged(step, "loss", loss, f"the training loss is {loss}")
            ema_num, ema_den = 0.95 * ema_num + 0.05 * loss, 0.95 * ema_den + 0.05
            ema = ema_num / ema_den
            n_last += 1
            now = time.perf_counter()
            if now - t_last >= 5.0 or step == cfg.steps:
                bar.set_postfix(loss=f"{ema:.3f}", gnorm=f"{float(gnorm):.2f}",
                                tok_s=f"{n_last * tokens_per_step / (now - t_last):.0f}")
                t_last, n_last = now, 0
            bar.update(1)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                metrics = evaluate(nnx.merge(graphdef, params, fixed))
                elapsed = prior_time + time.perf_counter() - t_start
                entry = {"step": step, "train_loss": ema, **metrics, "time_s": round(elapsed, 1)}
                bar.write(f"{kind} step {step}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                            for k, v in entry.items() if k != "step"), file=sys.stderr)
                for k, v in metrics.items():
                    if not math.isfinite(v):
                        diverged(step, k, v, f"{k} (validation) is {v}")
                history.append(entry)
            # The last step always checkpoints, so the model returned (and exported) is checked
            # finite; a run resumed at its last step returns a checkpoint checked when loaded.
            if step % cfg.checkpoint_every == 0 or step == last:
                checkpoint(step, loss)
    finally:
        bar.close()
    wall = time.perf_counter() - t_start
    return nnx.merge(graphdef, params, fixed), history, wall, prior_time + wall, step


def _check_resumable(meta: dict, now: dict, where: Path) -> None:
    if meta.get("kind") != now["kind"]:
        raise ValueError(f"resume: {where} holds a {meta.get('kind')!r} checkpoint; this is a {now['kind']!r} run")
    if meta["model_config"] != now["model_config"]:
        raise ValueError(f"resume: {where}: model config {meta['model_config']} differs from this run's {now['model_config']}")
    for k in _TRAJECTORY_FIELDS:
        if meta["train_config"].get(k) != now["train_config"][k]:
            raise ValueError(
                f"resume: {where}: TrainConfig.{k} = {now['train_config'][k]!r} now but "
                f"{meta['train_config'].get(k)!r} in the checkpoint; expected the checkpoint's value"
            )
    if meta.get("corpus_digest") != now["corpus_digest"]:
        raise ValueError(f"resume: {where}: the corpus differs from the one the checkpoint was trained on")
    if meta.get("target_digest") != now.get("target_digest"):
        raise ValueError(f"resume: {where}: the target model differs from the one the checkpoint was distilled from")


def validation_windows(corpus: Corpus, config: TrainConfig) -> np.ndarray:
    """The held-out windows; more than the validation stream has distinct windows would
    only repeat them (and slow every evaluation) -> ValueError."""
    distinct = corpus.val.size - config.seq_len
    if config.eval_windows > distinct:
        raise ValueError(
            f"TrainConfig.eval_windows = {config.eval_windows}: the validation stream "
            f"({corpus.val.size:,} tokens) has {max(distinct, 0):,} distinct windows of seq_len + 1 tokens; "
            f"expected at most {max(distinct, 0):,}"
        )
    return eval_windows(corpus.val, config.eval_windows, config.seq_len)


_val_windows = validation_windows  # the earlier private name


def _json_safe(obj):
    """``obj`` with non-finite floats as None: strict JSON (``json.dumps(..., allow_nan=False)``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_summary(out_dir: Path, summary: dict) -> None:
    """``out_dir/summary.json``: strict JSON (non-finite floats as null), indented."""
    (out_dir / "summary.json").write_text(json.dumps(_json_safe(summary), indent=1, allow_nan=False) + "\n")


# ----------------------------------------------------------------------------- train
def _lm_loss(model: Transformer, batch: jax.Array) -> jax.Array:
    return jnp.mean(token_nll(forward_logits(model, batch[:, :-1]), batch[:, 1:]))


def train(
    model_config: ModelConfig,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    corpus: Corpus | None = None,
    progress: bool = True,
    export_dir: str | os.PathLike | None = None,
    stop_at: int | None = None,
) -> TrainResult:
    """Train a language model from scratch on the corpus (next-byte cross entropy).

    Writes ``out_dir/checkpoint/`` every ``checkpoint_every`` steps and exports the final
    model to ``export_dir`` (default ``out_dir/final``) with :func:`jaxspec.save_model`.
    ``stop_at``: stop after that step with a checkpoint (no export); ``resume=True`` later
    finishes the same run.
    """
    _check_model_config(model_config, config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus() if corpus is None else corpus
    val = validation_windows(corpus, config)
    model = init_model(model_config, jax.random.key(config.seed))
    model, history, wall, total, step = fit(
        kind="train", model=model, loss_fn=_lm_loss, consts=(),
        evaluate=lambda m: {"val_loss": evaluate_loss(m, val, config.batch_size)},
        cfg=config, corpus=corpus, out_dir=out_dir, resume=resume, progress=progress, extra_meta={},
        stop_at=stop_at,
    )
    if step < config.steps:
        return TrainResult(model=model, history=history, final_dir=None, step=step, wall_time_s=wall,
                           total_train_time_s=total)
    final = save_model(model, Path(export_dir) if export_dir else out_dir / FINAL_DIR, extra_config=TOKENIZER_CONFIG)
    write_summary(out_dir, {
        "kind": "train", "params": model_config.num_params(), "model_config": model_config.to_dict(),
        "train_config": dataclasses.asdict(config), "tokens_seen": config.steps * config.batch_size * config.seq_len,
        "train_time_s": round(total, 1), "history": history, "final_dir": str(final),
    })
    return TrainResult(model=model, history=history, final_dir=final, step=step, wall_time_s=wall,
                       total_train_time_s=total)


# ----------------------------------------------------------------------------- distill
@dataclasses.dataclass(frozen=True)
class _DistillLoss:
    """Mean KL(target || draft) over the batch; hashable (a static of the jitted step)."""

    target_graphdef: Any

    def __call__(self, draft: Transformer, batch: jax.Array, target_params) -> jax.Array:
        target = nnx.merge(self.target_graphdef, target_params)
        x = batch[:, :-1]  # [B, T]
        tl = jax.lax.stop_gradient(forward_logits(target, x))  # [B, T, V]
        return jnp.mean(kl_per_position(tl, forward_logits(draft, x)))


def _model_digest(model: Transformer) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, arr in sorted(flat_arrays(nnx.state(model)).items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def distill(
    target: Transformer,
    draft_config: ModelConfig,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    corpus: Corpus | None = None,
    progress: bool = True,
    export_dir: str | os.PathLike | None = None,
    init_draft: Transformer | None = None,
    max_compute_ratio: float | None = 1 / 8,
    stop_at: int | None = None,
) -> DistillResult:
    """Train a draft to match ``target``'s next-token distributions: minimize
    ``KL(target softmax || draft softmax)`` on the corpus.

    The draft starts from ``init_draft`` (a model of ``draft_config``) or a random init
    (``config.seed``). Reports alpha = mean over held-out positions of ``sum_v min(p, q)``
    before and after. Refuses drafts whose per-token forward FLOPs (at context
    ``config.seq_len``) exceed ``max_compute_ratio`` of the target's (None: no limit).
    ``stop_at`` and ``resume`` as in :func:`train`.
    """
    if not isinstance(target, Transformer):
        raise ValueError(f"distill: target is a {type(target).__name__}; expected a jaxspec Transformer")
    _check_model_config(draft_config, config)
    if draft_config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"distill: draft vocab_size = {draft_config.vocab_size}; expected the target's {target.config.vocab_size}"
        )
    if config.seq_len > target.config.max_position_embeddings:
        raise ValueError(
            f"TrainConfig.seq_len = {config.seq_len}: expected <= the target's context length "
            f"{target.config.max_position_embeddings} (the target scores every position of a window)"
        )
    ratio = flops_per_token(draft_config, config.seq_len) / flops_per_token(target.config, config.seq_len)
    if max_compute_ratio is not None and ratio > max_compute_ratio:
        raise ValueError(
            f"distill: the draft costs {ratio:.3f} of the target's per-token FLOPs; expected <= {max_compute_ratio:.3f}"
        )
    if init_draft is not None and init_draft.config != draft_config:
        diff = "; ".join(f"{k} = {v!r} in init_draft, {getattr(draft_config, k)!r} requested"
                         for k, v in init_draft.config.to_dict().items() if getattr(draft_config, k) != v)
        raise ValueError(f"distill: init_draft's config differs from the requested draft config: {diff}; "
                         "expected the same config")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus() if corpus is None else corpus
    val = validation_windows(corpus, config)
    draft = init_draft if init_draft is not None else init_model(draft_config, jax.random.key(config.seed))
    before = evaluate_pair(target, draft, val, config.batch_size)
    tg, tp = nnx.split(target)
    model, history, wall, total, step = fit(
        kind="distill", model=draft, loss_fn=_DistillLoss(tg), consts=(tp,),
        evaluate=lambda m: evaluate_pair(target, m, val, config.batch_size),
        cfg=config, corpus=corpus, out_dir=out_dir, resume=resume, progress=progress,
        extra_meta={"target_digest": _model_digest(target)}, stop_at=stop_at,
    )
    if step < config.steps:
        return DistillResult(model=model, history=history, final_dir=None, step=step, wall_time_s=wall,
                             total_train_time_s=total, alpha_before=before["alpha"])
    after = history[-1]
    final = save_model(model, Path(export_dir) if export_dir else out_dir / FINAL_DIR, extra_config=TOKENIZER_CONFIG)
    write_summary(out_dir, {
        "kind": "distill", "params": draft_config.num_params(), "model_config": draft_config.to_dict(),
        "train_config": dataclasses.asdict(config), "compute_ratio": ratio,
        "alpha_before": before["alpha"], "alpha_after": after["alpha"], "before": before,
        "train_time_s": round(total, 1), "history": history, "final_dir": str(final),
    })
    return DistillResult(model=model, history=history, final_dir=final, step=step, wall_time_s=wall,
                         total_train_time_s=total, alpha_before=before["alpha"], alpha_after=after["alpha"])


def _check_model_config(model_config: ModelConfig, config: TrainConfig) -> None:
    if not isinstance(model_config, ModelConfig):
        raise ValueError(f"model_config is a {type(model_config).__name__}; expected a ModelConfig")
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config is a {type(config).__name__}; expected a TrainConfig")
    if config.seq_len > model_config.max_position_embeddings:
        raise ValueError(
            f"TrainConfig.seq_len = {config.seq_len}: expected <= max_position_embeddings = "
            f"{model_config.max_position_embeddings}"
        )
