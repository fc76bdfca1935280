"""Training a feature draft head (:class:`~jaxspec.nn.head.FeatureHead`, EAGLE style) on a
frozen target, with the engine of :mod:`jaxspec.training.train` (:func:`~jaxspec.training.train.fit`)::

    target = load_model("default-target")
    result = train_head(target, TrainConfig(steps=2000, lr=3e-3, warmup_steps=50), "runs/head")
    # runs/head/checkpoint/   resumable (params + opt state + step + data RNG)
    # runs/head/final/        save_head(..., target=target): load_head("runs/head/final")
    result.alpha_before, result.alpha_after   # mean over held-out positions of sum_v min(p, q)

Objective (EAGLE-1), at every position p of a window ``tokens[0 .. T-1]``, with ``f`` the
target's features (:func:`~jaxspec.nn.model.forward_features`: last residual after the
final norm) and ``f_hat = head.teacher_forced(target, tokens, f + u)`` the head's prediction
of ``f[p]`` from ``(f[p - 1] + u[p - 1], token p)``::

    loss = feature_weight * mean_{p, d} smooth_l1(f_hat[p, d] - f[p, d])        (beta = 1)
         + mean_p KL(softmax(target.unembed(f[p])) || softmax(target.unembed(f_hat[p])))

The target's features and logits are computed inside the jitted step from its parameters
(passed as ``consts``, never differentiated) under ``jax.lax.stop_gradient``. The KL term
is the soft cross entropy of EAGLE's classification loss less the target's entropy (a
constant): the same gradients, and 0 for a perfect head.

``feature_weight`` (default 1.0): the target's features are RMS-normalised (RMS ~ 1 on the
shipped target), so the per-element smooth-L1 term starts near 0.5 and the KL term near a
few nats: with weight 1 the KL, which is what acceptance depends on (alpha >= 1 -
sqrt(KL / 2), Pinsker), drives the training and the regression is a dense auxiliary signal
over all D dimensions that keeps ``f_hat`` near the target's feature manifold, which the
head reads back as its own input at deeper draft levels. (EAGLE-1 weighs regression 1 and
classification 0.1 on Vicuna features; here the soft-label term matters more because
the objective is alpha at temperature 1.) 0 trains on the KL alone.

``noise`` (default 0.05): uniform noise ``u ~ U(-noise, noise)`` on the *input* features
during training (the regression and KL targets stay clean), as EAGLE does, so that the head
tolerates the error of its own predicted features, which it reads in place of the target's
from draft depth 2 on. 0.05 is ~5% of the features' RMS (EAGLE's ``U(-0.1, 0.1) * 512 / T``
is of that order at its sequence lengths). The noise is drawn from a key folded from
``TrainConfig.seed`` and the batch's tokens, so a resumed run draws the same noise.
Evaluation uses no noise.

``unroll`` (default 1): from draft depth 2 on the head reads its own predicted feature,
not the target's. With ``unroll = S`` the objective is the mean over depths ``s = 1 .. S``
of the per-position objective above at depth s, the head computing depth s from its own
depth ``s - 1`` predictions and attending to what its cache holds when it drafts that
depth (:meth:`~jaxspec.nn.head.FeatureHead.unrolled`; EAGLE-3's training-time test,
gradients flowing through the earlier depths). The noise is on the true input features
only. ``unroll = 1`` is the objective above.

Held-out evaluation (teacher forced, the target's true features as inputs, every position
of ``eval_windows`` windows): ``alpha`` = mean ``sum_v min(p, q)`` (p the target's law, q
the head's), ``val_kl``, ``val_feature_loss`` (smooth L1), ``val_loss`` (the objective,
noise-free) and ``val_nll`` (the head law's cross entropy on the next byte), nats/byte;
with ``unroll >= 2`` also ``alpha_depth_s`` for ``s = 2 .. unroll``, the acceptance at draft
depth s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxspec.nn.config import ModelConfig
from jaxspec.nn.head import FeatureHead, init_head, save_head, target_digest
from jaxspec.nn.head import head_config as default_head_config
from jaxspec.nn.model import Transformer, forward_features
from jaxspec.training.corpus import Corpus, load_corpus
from jaxspec.training.train import (
    CHECKPOINT_DIR,
    FINAL_DIR,
    META_FILE,
    TrainConfig,
    TrainResult,
    find_checkpoint,
    fit,
    kl_per_position,
    overlap_per_position,
    read_checkpoint_meta,
    validation_windows,
    write_summary,
)

__all__ = ["DEFAULT_FEATURE_WEIGHT", "DEFAULT_NOISE", "HeadLoss", "HeadResult", "MAX_UNROLL", "evaluate_head", "head_params",
           "train_head", "smooth_l1", "depth_weights"]

KIND = "train-head"
MAX_UNROLL = 8
DEFAULT_FEATURE_WEIGHT = 1.0
DEFAULT_NOISE = 0.05


@dataclasses.dataclass(frozen=True)
class HeadResult(TrainResult):
    """:class:`~jaxspec.training.train.TrainResult` of :func:`train_head` (``model`` is the
    :class:`~jaxspec.nn.head.FeatureHead`), with alpha before and after training."""

    alpha_before: float = float("nan")
    alpha_after: float = float("nan")  # nan when stopped early


def head_params(head: FeatureHead) -> int:
    """Number of scalar parameters the head owns (fc, its layer, its norm: not the
    target's embedding and LM head)."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(head, nnx.Param)))


# ----------------------------------------------------------------------------- losses
def smooth_l1(pred: jax.Array, feats: jax.Array) -> jax.Array:
    """Smooth L1 (beta = 1; Huber with delta 1) averaged over the feature axis: [B, T, D] -> [B, T]."""
    return jnp.mean(optax.huber_loss(pred.astype(jnp.float32), feats.astype(jnp.float32), delta=1.0), axis=-1)


def _noise_key(seed: int, batch: jax.Array) -> jax.Array:
    """A key from ``seed`` and the batch's tokens: the same batch (as a resumed run draws
    it again) gets the same noise."""
    flat = batch.reshape(-1).astype(jnp.uint32)
    mix = jnp.sum(flat * (2 * jnp.arange(flat.size, dtype=jnp.uint32) + 1) * jnp.uint32(2654435761))
    return jax.random.fold_in(jax.random.key(seed), mix)


def depth_weights(steps: int, t: int) -> jax.Array:
    """``float32[steps, T]``: 1 where depth ``s`` (row ``s - 1``) can reach position p (``p >=
    s - 1``; :meth:`~jaxspec.nn.head.FeatureHead.unrolled`), else 0."""
    return (jnp.arange(t)[None, :] >= jnp.arange(steps)[:, None]).astype(jnp.float32)


def _depth_terms(target: Transformer, feats, tl, preds) -> tuple[jax.Array, jax.Array, list[jax.Array]]:
    """Per depth and position, of predictions ``preds [S, B, T, D]`` against the target's
    ``feats [B, T, D]`` and logits ``tl [B, T, V]``: smooth L1 and KL(target || head), each
    ``[S, B, T]``, and the head's logits per depth (S x ``[B, T, V]``)."""
    hl = [target.unembed(pr) for pr in preds]
    return (jnp.stack([smooth_l1(pr, feats) for pr in preds]), jnp.stack([kl_per_position(tl, h) for h in hl]), hl)


@dataclasses.dataclass(frozen=True)
class HeadLoss:
    """The training objective (module docstring); hashable, a static of the jitted step.
    Called as ``loss(head, batch int32[B, T+1], target_params) -> scalar``."""

    target_graphdef: Any
    feature_weight: float
    noise: float
    seed: int
    unroll: int = 1

    def __call__(self, head: FeatureHead, batch: jax.Array, target_params) -> jax.Array:
        target = nnx.merge(self.target_graphdef, target_params)
        x = batch[:, :-1]  # [B, T]
        feats = jax.lax.stop_gradient(forward_features(target, x))  # [B, T, D]
        tl = jax.lax.stop_gradient(target.unembed(feats))  # [B, T, V]
        inputs = feats
        if self.noise > 0:
            u = jax.random.uniform(_noise_key(self.seed, batch), feats.shape, jnp.float32, -self.noise, self.noise)
            inputs = feats + u
        preds = head.unrolled(target, x, inputs, self.unroll)  # [S, B, T, D]
        sl1, kl, _ = _depth_terms(target, feats, tl, preds)  # [S, B, T]
        per = kl + self.feature_weight * sl1 if self.feature_weight > 0 else kl
        w = depth_weights(self.unroll, x.shape[1])[:, None, :]  # [S, 1, T]
        per_depth = jnp.sum(per * w, axis=(1, 2)) / (jnp.sum(w, axis=(1, 2)) * x.shape[0])  # [S]
        return jnp.mean(per_depth)


@functools.partial(nnx.jit, static_argnums=3)
def _eval_head(head: FeatureHead, target: Transformer, batch: jax.Array, depths: int):
    """Sums over the batch's positions, per depth: ``[S]`` smooth L1, KL, overlap, NLL."""
    x = batch[:, :-1]
    feats = forward_features(target, x)
    tl = target.unembed(feats)
    preds = head.unrolled(target, x, feats, depths)
    sl1, kl, hl = _depth_terms(target, feats, tl, preds)
    overlap = jnp.stack([overlap_per_position(tl, h) for h in hl])
    nll = jnp.stack([optax.softmax_cross_entropy_with_integer_labels(h, batch[:, 1:]) for h in hl])
    w = depth_weights(depths, x.shape[1])[:, None, :]
    return tuple(jnp.sum(a * w, axis=(1, 2)) for a in (sl1, kl, overlap, nll))


def evaluate_head(head: FeatureHead, target: Transformer, windows: np.ndarray, *, batch_size: int = 16,
                  feature_weight: float = DEFAULT_FEATURE_WEIGHT, unroll: int = 1) -> dict[str, float]:
    """Held-out metrics of ``head`` on ``windows`` (``int32[N, T+1]``; the last token is only
    a label), means over positions: ``alpha`` (``sum_v min(p, q)``), ``val_kl``,
    ``val_feature_loss``, ``val_loss`` and ``val_nll`` at depth 1 (teacher forced on the
    target's true features, every one of the ``N * T`` positions); ``val_loss`` is the
    training objective (``feature_weight * val_feature_loss + val_kl``, averaged over depths
    ``1 .. unroll``). For ``unroll`` >= 2 also ``alpha_depth_s`` for ``s = 2 .. unroll``:
    the acceptance of the head's law at draft depth s along the true sequence
    (:meth:`~jaxspec.nn.head.FeatureHead.unrolled`; positions ``p >= s - 1``)."""
    sums = np.zeros((4, unroll))
    for i in range(0, len(windows), batch_size):
        out = _eval_head(head, target, jnp.asarray(windows[i : i + batch_size]), unroll)
        sums += np.stack([np.asarray(v, dtype=np.float64) for v in out])
    t = windows.shape[1] - 1
    means = sums / (windows.shape[0] * (t - np.arange(unroll)))  # [4, S]: depth s has T - s + 1 positions
    feat, kl, alpha, nll = means
    out = {"alpha": float(alpha[0]), "val_kl": float(kl[0]), "val_feature_loss": float(feat[0]),
           "val_loss": float(np.mean(feature_weight * feat + kl)), "val_nll": float(nll[0])}
    out.update({f"alpha_depth_{s}": float(alpha[s - 1]) for s in range(2, unroll + 1)})
    return out


# ----------------------------------------------------------------------------- train_head
def _check_inputs(target, config, hc, feature_weight, noise, unroll, stop_at) -> ModelConfig:
    if not isinstance(target, Transformer):
        raise ValueError(f"train_head: target is a {type(target).__name__}; expected a jaxspec Transformer")
    if not isinstance(config, TrainConfig):
        raise ValueError(f"train_head: config is a {type(config).__name__}; expected a TrainConfig")
    tc = target.config
    if hc is None:
        hc = default_head_config(tc)
    if not isinstance(hc, ModelConfig):
        raise ValueError(f"train_head: head_config is a {type(hc).__name__}; expected a ModelConfig (see "
                         "jaxspec.nn.head.head_config)")
    for field in ("hidden_size", "vocab_size"):
        hv, tv = getattr(hc, field), getattr(tc, field)
        if hv != tv:
            raise ValueError(f"train_head: head_config.{field} = {hv}; expected the target's {field} = {tv} (the "
                             "head reads the target's features and embeddings and drafts through its LM head)")
    if hc.num_hidden_layers != 1:
        raise ValueError(f"train_head: head_config.num_hidden_layers = {hc.num_hidden_layers}; expected 1 "
                         "(see jaxspec.nn.head.head_config)")
    if config.seq_len > tc.max_position_embeddings:
        raise ValueError(
            f"TrainConfig.seq_len = {config.seq_len}: expected <= the target's context length "
            f"{tc.max_position_embeddings} (the target scores every position of a window)"
        )
    if config.seq_len > hc.max_position_embeddings:
        raise ValueError(f"TrainConfig.seq_len = {config.seq_len}: expected <= the head's context length "
                         f"head_config.max_position_embeddings = {hc.max_position_embeddings}")
    for name, v in (("feature_weight", feature_weight), ("noise", noise)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"train_head: {name} = {v!r}; expected a finite number >= 0")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= MAX_UNROLL:
        raise ValueError(f"train_head: unroll = {unroll!r}; expected an integer from 1 to {MAX_UNROLL} (the draft "
                         "depths trained on the head's own predicted features)")
    if unroll > config.seq_len:
        raise ValueError(f"train_head: unroll = {unroll}; expected <= TrainConfig.seq_len = {config.seq_len}")
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int) or stop_at < 1):
        raise ValueError(f"train_head: stop_at = {stop_at!r}; expected a positive integer or None")
    return hc


def train_head(
    target: Transformer,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    head_config: ModelConfig | None = None,
    resume: bool = False,
    corpus: Corpus | None = None,
    progress: bool = True,
    export_dir: str | os.PathLike | None = None,
    stop_at: int | None = None,
    feature_weight: float = DEFAULT_FEATURE_WEIGHT,
    noise: float = DEFAULT_NOISE,
    unroll: int = 1,
) -> HeadResult:
    """Train a feature draft head for the frozen ``target`` on the corpus (objective, noise
    and metrics: the module docstring).

    ``head_config``: the head's :class:`~jaxspec.nn.config.ModelConfig` (default
    :func:`jaxspec.nn.head.head_config` of the target's: its width, heads and MLP, one
    layer); its ``hidden_size`` and ``vocab_size`` must be the target's. The head starts
    from a random init (``config.seed``). Writes ``out_dir/checkpoint/`` every
    ``checkpoint_every`` steps and, after the last step, the head with
    :func:`~jaxspec.nn.head.save_head` (the target's digest recorded) to ``export_dir``
    (default ``out_dir/final``) and ``out_dir/summary.json``. ``stop_at``: stop after that
    step with a checkpoint (no export); ``resume=True`` later finishes the same run, which
    must have the same target, corpus, head config, TrainConfig trajectory fields,
    ``feature_weight``, ``noise`` and ``unroll``. ``unroll``: train draft depths ``1 ..
    unroll`` (module docstring; 1 trains depth 1 only). A diverging run raises
    :class:`~jaxspec.training.train.TrainingDiverged` and exports nothing.
    """
    hc = _check_inputs(target, config, head_config, feature_weight, noise, unroll, stop_at)
    feature_weight, noise = float(feature_weight), float(noise)
    out_dir = Path(out_dir)
    loss_meta = {"feature_weight": feature_weight, "noise": noise, "unroll": unroll}
    found = find_checkpoint(out_dir / CHECKPOINT_DIR) if resume else None
    if found is not None:  # fit checks the rest; the objective's settings are this trainer's
        stored = read_checkpoint_meta(found).get("head_loss")
        if stored is not None and not isinstance(stored, dict):
            raise ValueError(f"resume: {found / META_FILE}: 'head_loss' = {repr(stored)[:80]}; expected a JSON "
                             "object (the checkpoint is damaged)")
        for name, v in loss_meta.items():
            was = None if stored is None else stored.get(name, 1 if name == "unroll" else None)  # unroll came later
            if stored is not None and was != v:
                raise ValueError(f"resume: {found}: {name} = {v!r} now but {was!r} in the "
                                 "checkpoint; expected the checkpoint's value")
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus() if corpus is None else corpus
    val = validation_windows(corpus, config)
    head = init_head(hc, jax.random.key(config.seed))

    def evaluate(h):
        return evaluate_head(h, target, val, batch_size=config.batch_size, feature_weight=feature_weight,
                             unroll=unroll)

    before = evaluate(head)
    tg, tp = nnx.split(target)
    digest = target_digest(target)
    model, history, wall, total, step = fit(
        kind=KIND, model=head, loss_fn=HeadLoss(tg, feature_weight, noise, config.seed, unroll), consts=(tp,),
        evaluate=evaluate, cfg=config, corpus=corpus, out_dir=out_dir, resume=resume, progress=progress,
        extra_meta={"target_digest": digest, "head_loss": loss_meta}, stop_at=stop_at,
    )
    if step < config.steps:
        return HeadResult(model=model, history=history, final_dir=None, step=step, wall_time_s=wall,
                          total_train_time_s=total, alpha_before=before["alpha"])
    after = history[-1]
    final = save_head(model, Path(export_dir) if export_dir else out_dir / FINAL_DIR, target=target,
                      extra={"train_head": {**loss_meta, "alpha_before": before["alpha"],
                                            "alpha_after": after["alpha"], "steps": config.steps}})
    write_summary(out_dir, {
        "kind": KIND, "params": head_params(model), "model_config": hc.to_dict(),
        "train_config": dataclasses.asdict(config), **loss_meta, "target_digest": digest,
        "alpha_before": before["alpha"], "alpha_after": after["alpha"], "before": before,
        "train_time_s": round(total, 1), "history": history, "final_dir": str(final),
    })
    return HeadResult(model=model, history=history, final_dir=final, step=step, wall_time_s=wall,
                      total_train_time_s=total, alpha_before=before["alpha"], alpha_after=after["alpha"])
