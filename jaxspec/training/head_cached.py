"""Training a feature draft head for a real target from cached features
(:mod:`jaxspec.training.feature_cache`), optionally with a reduced draft vocabulary::

    cache = build_feature_cache(target, sequences, "runs/head/features")
    ids = frequent_ids(cache, 4096)                       # the 4096 ids the target says most
    result = train_head_cached(target, cache, TrainConfig(steps=2000, seq_len=128), "runs/head",
                               draft_vocab=ids, unroll=3)
    load_head("runs/head/final")                          # a FeatureHead drafting those ids

The objective is :mod:`jaxspec.training.head`'s (feature regression plus the target's law
against the head's, averaged over draft depths ``1 .. unroll``: EAGLE-3's training-time
test), read from the cache instead of a forward of the target at every step. With a reduced
vocabulary of ids ``K`` the law term is ``sum_{v in K} p(v) (log p(v) - log q(v))``, p the
target's exact probabilities (``exp(logit - lse)``, the cached log-normalizer) and q the
head's softmax over K: it is minimised by q proportional to p on K, which maximises the
acceptance ``sum_{v in K} min(p(v), q(v))`` (at most p(K), the target's mass on K).

Batches are windows of ``seq_len`` consecutive cached positions; a window that runs into the
next sequence counts only its first sequence's positions. One sequence in
``VAL_EVERY`` is held out; the held-out metrics are ``alpha`` (acceptance at depth 1, teacher
forced), ``alpha_depth_s``, ``coverage`` (the target's mean mass on the draft vocabulary,
alpha's ceiling), ``val_kl`` and ``val_feature_loss``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.nn.config import ModelConfig
from jaxspec.nn.head import FeatureHead, head_config as default_head_config, init_head, save_head, target_digest
from jaxspec.nn.model import Transformer, check_tap_layers
from jaxspec.training.feature_cache import FeatureCache
from jaxspec.training.head import (
    DEFAULT_FEATURE_WEIGHT,
    DEFAULT_NOISE,
    HeadResult,
    depth_weights,
    head_params,
    smooth_l1,
)
from jaxspec.training.train import FINAL_DIR, TrainConfig, fit, write_summary

__all__ = ["VAL_EVERY", "frequent_ids", "coverage", "train_head_cached", "evaluate_cached"]

VAL_EVERY = 20  # sequence i is held out when i % VAL_EVERY == VAL_EVERY - 1
KIND = "train-head"


def frequent_ids(cache: FeatureCache, k: int, *, vocab_size: int | None = None) -> np.ndarray:
    """The ``k`` ids most frequent among the cache's tokens (ties: the smaller id first),
    ``int32[k]``, the most frequent first; ``vocab_size`` pads a short list with unseen ids."""
    v = int(vocab_size or (cache.tokens.max() + 1))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= v:
        raise ValueError(f"frequent_ids: k = {k!r}; expected an integer from 1 to the vocabulary's {v}")
    counts = np.bincount(cache.tokens, minlength=v)
    return np.lexsort((np.arange(v), -counts))[:k].astype(np.int32)


@dataclasses.dataclass(frozen=True)
class _Corpus:
    """What :func:`~jaxspec.training.train.fit` reads of a corpus: the stream its batch sampler
    cuts windows from (here cached positions) and a digest for resuming."""

    train: np.ndarray  # int32[n]: positions of the training sequences, in order
    digest: str


def _splits(cache: FeatureCache) -> tuple[np.ndarray, np.ndarray]:
    held = (cache.seq % VAL_EVERY) == VAL_EVERY - 1
    pos = np.arange(cache.seq.size, dtype=np.int32)
    return pos[~held], pos[held]


def _val_windows(cache: FeatureCache, val_pos: np.ndarray, t: int) -> np.ndarray:
    """``int32[n, t + 1]``: the first ``t + 1`` positions of each held-out sequence that long
    (shorter ones: from their start, running into the next held-out one, masked)."""
    starts = [p for p in val_pos if p == 0 or cache.seq[p] != cache.seq[p - 1]]
    idx = np.searchsorted(val_pos, starts)
    rows = [val_pos[i : i + t + 1] for i in idx if i + t + 1 <= val_pos.size]
    if not rows:
        raise ValueError(f"train_head_cached: the held-out sequences hold fewer than seq_len + 1 = {t + 1} positions; "
                         "expected more sequences or a shorter TrainConfig.seq_len")
    return np.stack(rows)


def _depth_terms(head: FeatureHead, target: Transformer, idx, data, depths: int, noise_key=None, noise=0.0):
    """Per depth and position ``[S, B, T]``: the law term, smooth L1, overlap and a mask, for
    windows of cached positions ``idx int32[B, T]``; ``data`` = (tokens, feats, lse, seq[, taps])."""
    tokens, feats, lse, seq = data[:4]
    tok, f, z, sid = tokens[idx], feats[idx].astype(jnp.float32), lse[idx], seq[idx]
    taps = data[4][idx].astype(jnp.float32) if head.feature_layers is not None else None  # [B, T, k, D]
    valid = (sid == sid[:, :1]).astype(jnp.float32)  # [B, T]: the window's first sequence only
    inputs = f if noise_key is None else f + jax.random.uniform(noise_key, f.shape, jnp.float32, -noise, noise)
    if taps is not None and noise_key is not None:
        taps = taps + jax.random.uniform(jax.random.fold_in(noise_key, 1), taps.shape, jnp.float32, -noise, noise)
    preds = head.unrolled(target, tok, inputs, depths, taps)  # [S, B, T, D]
    if head.draft_vocab is None:
        rows = target.unembed
    else:
        ids = head.draft_vocab.get_value()
        rows = functools.partial(target.unembed_rows, ids=ids)
    logp = jax.lax.stop_gradient(rows(f) - z[..., None])  # [B, T, K]: the target's exact log-probabilities
    p = jnp.exp(logp)
    law, sl1, overlap = [], [], []
    for s in range(depths):
        logq = jax.nn.log_softmax(rows(preds[s]), axis=-1)
        law.append(jnp.sum(p * (logp - logq), axis=-1))
        overlap.append(jnp.sum(jnp.minimum(p, jnp.exp(logq)), axis=-1))
        sl1.append(smooth_l1(preds[s], f))
    mask = depth_weights(depths, idx.shape[1])[:, None, :] * valid[None]  # [S, B, T]
    return jnp.stack(law), jnp.stack(sl1), jnp.stack(overlap), jnp.sum(p, axis=-1), mask


@dataclasses.dataclass(frozen=True)
class CachedHeadLoss:
    """``loss(head, batch int32[B, T+1], target_params, tokens, feats, lse, seq) -> scalar``;
    hashable (a static of the jitted step)."""

    target_graphdef: Any
    feature_weight: float
    noise: float
    seed: int
    unroll: int

    def __call__(self, head, batch, target_params, *data):
        target = nnx.merge(self.target_graphdef, target_params)
        idx = batch[:, :-1]
        key = jax.random.fold_in(jax.random.key(self.seed), jnp.sum(idx[:, 0]).astype(jnp.uint32))
        law, sl1, _, _, mask = _depth_terms(head, target, idx, data, self.unroll, key if self.noise > 0 else None,
                                            self.noise)
        per = law + self.feature_weight * sl1
        per_depth = jnp.sum(per * mask, axis=(1, 2)) / jnp.maximum(jnp.sum(mask, axis=(1, 2)), 1.0)  # [S]
        return jnp.mean(per_depth)


@functools.partial(nnx.jit, static_argnums=4)
def _eval_sums(head, target, idx, data, depths: int):
    law, sl1, overlap, cover, mask = _depth_terms(head, target, idx, data, depths)
    return (jnp.sum(law * mask, axis=(1, 2)), jnp.sum(sl1 * mask, axis=(1, 2)), jnp.sum(overlap * mask, axis=(1, 2)),
            jnp.sum(cover * mask[0]), jnp.sum(mask, axis=(1, 2)))


def evaluate_cached(head: FeatureHead, target: Transformer, cache: FeatureCache, windows: np.ndarray, *,
                    unroll: int = 1, batch_size: int = 8, data: tuple | None = None) -> dict[str, float]:
    """Held-out metrics over ``windows`` (``int32[n, T + 1]`` cached positions): ``alpha``,
    ``alpha_depth_s``, ``coverage``, ``val_kl``, ``val_feature_loss`` (module docstring).
    ``data``: the cache's device arrays when the caller holds them already (a copy of
    SmolLM2's cache with two taps is 2.8 GB; training passes its own)."""
    data = _device_data(cache, head) if data is None else data
    sums = None
    for i in range(0, len(windows), batch_size):
        out = _eval_sums(head, target, jnp.asarray(windows[i : i + batch_size, :-1]), data, unroll)
        out = [np.asarray(o, np.float64) for o in out]
        sums = out if sums is None else [a + b for a, b in zip(sums, out)]
    law, sl1, overlap, cover, n = sums
    res = {"alpha": float(overlap[0] / n[0]), "coverage": float(cover / n[0]), "val_kl": float(law[0] / n[0]),
           "val_feature_loss": float(sl1[0] / n[0])}
    res.update({f"alpha_depth_{s}": float(overlap[s - 1] / n[s - 1]) for s in range(2, unroll + 1)})
    return res


def _device_data(cache: FeatureCache, head: FeatureHead) -> tuple:
    """The cache's arrays as the loss reads them: tokens, feats, lse, seq, and a multi-layer
    head's taps (checked to be the layers it fuses)."""
    arrays = [cache.tokens, cache.feats, cache.lse, cache.seq]
    if head.feature_layers is not None:
        if cache.taps is None or cache.feature_layers is None or not set(head.feature_layers) <= set(cache.feature_layers):
            raise ValueError(f"train_head_cached: feature_layers = {head.feature_layers}; expected layers the feature "
                             f"cache holds (it holds {cache.feature_layers}: build_feature_cache(feature_layers=...))")
        cols = [cache.feature_layers.index(i) for i in head.feature_layers]
        arrays.append(cache.taps if cols == list(range(cache.taps.shape[1])) else cache.taps[:, cols])
    return tuple(jnp.asarray(a) for a in arrays)


def coverage(target: Transformer, cache: FeatureCache, ids_by_k: dict[int, np.ndarray], *, positions: int = 4096,
             seed: int = 0) -> dict[int, float]:
    """The target's mean probability mass on each candidate draft vocabulary (``K -> ids``),
    over ``positions`` cached positions drawn at random: the ceiling of a reduced head's
    acceptance at temperature 1, by which K is chosen."""
    rng = np.random.default_rng(seed)
    pos = np.sort(rng.choice(cache.seq.size, size=min(positions, cache.seq.size), replace=False))
    f = jnp.asarray(cache.feats[pos].astype(np.float32))[None]  # [1, P, D]
    z = jnp.asarray(cache.lse[pos])[None]
    out = {}
    for k, ids in ids_by_k.items():
        logits = target.unembed_rows(f, jnp.asarray(ids, jnp.int32))  # [1, P, K]
        out[k] = float(jnp.mean(jnp.sum(jnp.exp(logits - z[..., None]), axis=-1)))
    return out


def train_head_cached(
    target: Transformer,
    cache: FeatureCache,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    head_config: ModelConfig | None = None,
    draft_vocab=None,
    feature_layers: tuple[int, ...] | None = None,
    unroll: int = 1,
    feature_weight: float = DEFAULT_FEATURE_WEIGHT,
    noise: float = DEFAULT_NOISE,
    resume: bool = False,
    progress: bool = True,
    stop_at: int | None = None,
    export_dir: str | os.PathLike | None = None,
) -> HeadResult:
    """Train a head for ``target`` on ``cache`` (module docstring); checkpoints, resuming,
    the divergence guard and the export are :func:`~jaxspec.training.train.fit`'s and
    :func:`~jaxspec.training.head.train_head`'s. ``draft_vocab``: the ids of a reduced
    vocabulary (e.g. :func:`frequent_ids`), or None for the whole vocabulary; ``feature_layers``
    a multi-layer head fusing the cache's taps at those target layers (EAGLE-3)."""
    if cache.target_digest != target_digest(target):
        raise ValueError(f"train_head_cached: the cache was computed for target {cache.target_digest}, not this "
                         f"target {target_digest(target)}; expected the cache of this target")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= config.seq_len:
        raise ValueError(f"train_head_cached: unroll = {unroll!r}; expected an integer from 1 to seq_len")
    hc = head_config or default_head_config(target.config)
    if feature_layers is not None:
        check_tap_layers("train_head_cached", feature_layers, target.config.num_hidden_layers)
    head = init_head(hc, jax.random.key(config.seed), draft_vocab=draft_vocab,
                     feature_layers=None if feature_layers is None else tuple(feature_layers))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_pos, val_pos = _splits(cache)
    vocab_digest = "full" if draft_vocab is None else hashlib.sha256(
        np.asarray(draft_vocab, np.int32).tobytes()).hexdigest()[:16]
    corpus = _Corpus(train=train_pos, digest=f"{cache.digest}-{vocab_digest}")
    val = _val_windows(cache, val_pos, config.seq_len)
    data = _device_data(cache, head)
    loss_meta = {"feature_weight": float(feature_weight), "noise": float(noise), "unroll": unroll,
                 "draft_vocab_size": head.draft_vocab_size,
                 "feature_layers": None if feature_layers is None else list(feature_layers)}

    def evaluate(h):
        return evaluate_cached(h, target, cache, val, unroll=unroll, data=data)

    before = evaluate(head)
    tg, tp = nnx.split(target)
    model, history, wall, total, step = fit(
        kind=KIND, model=head, loss_fn=CachedHeadLoss(tg, float(feature_weight), float(noise), config.seed, unroll),
        consts=(tp, *data), evaluate=evaluate, cfg=config, corpus=corpus, out_dir=out_dir, resume=resume,
        progress=progress, extra_meta={"target_digest": cache.target_digest, "head_loss": loss_meta},
        stop_at=stop_at,
    )
    if step < config.steps:
        return HeadResult(model=model, history=history, final_dir=None, step=step, wall_time_s=wall,
                          total_train_time_s=total, alpha_before=before["alpha"])
    after = history[-1]
    final = save_head(model, Path(export_dir) if export_dir else out_dir / FINAL_DIR, target=target,
                      extra={"train_head": {**loss_meta, "alpha_before": before["alpha"], "alpha_after": after["alpha"],
                                            "coverage": after["coverage"], "steps": config.steps,
                                            "cache": cache.digest}})
    write_summary(out_dir, {"kind": KIND, "params": head_params(model), "model_config": hc.to_dict(),
                            "train_config": dataclasses.asdict(config), **loss_meta,
                            "alpha_before": before["alpha"], "alpha_after": after["alpha"], "before": before,
                            "train_time_s": round(total, 1), "history": history, "final_dir": str(final)})
    return HeadResult(model=model, history=history, final_dir=final, step=step, wall_time_s=wall,
                      total_train_time_s=total, alpha_before=before["alpha"], alpha_after=after["alpha"])
