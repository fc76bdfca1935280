"""The target's features on token sequences, computed once and kept on disk, so that training a
draft head on a real model does not run the target at every step.

For each sequence the cache holds, at every position p, the target's feature (its last residual
after the final norm, :func:`~jaxspec.nn.model.forward_features`; float16 on disk) and the
log-normalizer of its logits there (``lse[p] = logsumexp(unembed(feature[p]))``, float32), from
which the target's probability of any id v is ``exp(unembed_rows(feature[p], [v]) - lse[p])``
without the full LM head::

    cache = build_feature_cache(target, sequences, "runs/head/features")   # resumable
    cache.tokens   # int32[N]       the sequences, concatenated
    cache.feats    # float16[N, D]  the target's features
    cache.lse      # float32[N]     logsumexp of the target's logits
    cache.seq      # int32[N]       which sequence each position belongs to
    cache.taps     # float16[N, k, D] with feature_layers=(...): the unit-RMS residuals after
                   #                those layers (forward_taps), a multi-layer head's input; else None

Sequences are written in shards of :data:`SHARD` sequences (``shard_00000.npz`` ...), each
renamed into place when complete, so a stopped build resumes at the first missing shard;
``meta.json`` records the target's digest and a digest of the sequences, and a build over a
folder made for another target or other sequences is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxspec.nn.head import target_digest
from jaxspec.nn.model import Transformer, check_tap_layers, forward_features, forward_taps

__all__ = ["SHARD", "FeatureCache", "build_feature_cache", "load_feature_cache", "select_sequences",
           "sequences_digest"]

SHARD = 32  # sequences per shard file
META = "meta.json"


@dataclasses.dataclass(frozen=True)
class FeatureCache:
    """The cached arrays (module docstring), all positions of all sequences in order."""

    tokens: np.ndarray  # int32[N]
    feats: np.ndarray  # float16[N, D]
    lse: np.ndarray  # float32[N]
    seq: np.ndarray  # int32[N]
    target_digest: str
    digest: str  # of the sequences
    taps: np.ndarray | None = None  # float16[N, k, D] at feature_layers
    feature_layers: tuple[int, ...] | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.seq[-1]) + 1 if self.seq.size else 0


def sequences_digest(sequences: Sequence[Sequence[int]]) -> str:
    """A short digest of the token sequences (their order, lengths and ids)."""
    h = hashlib.sha256()
    for s in sequences:
        a = np.asarray(s, np.int32)
        h.update(np.int64(a.size).tobytes())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


@functools.partial(nnx.jit, static_argnums=2)
def _features_and_lse(target: Transformer, tokens: jax.Array, layers: tuple[int, ...]):
    """``int32[B, T]`` -> features float32[B, T, D], lse float32[B, T], taps float32[B, T, k, D]."""
    feats, taps = forward_taps(target, tokens, layers) if layers else (forward_features(target, tokens), None)
    return feats, jax.nn.logsumexp(target.unembed(feats), axis=-1), taps


def _bucket(n: int, step: int = 64) -> int:
    """A padded length: few distinct shapes, so few compilations."""
    return -(-n // step) * step


def _shard_arrays(target: Transformer, seqs: list[list[int]], batch_tokens: int, layers: tuple[int, ...]):
    """One shard's arrays: tokens, float16 features, lse and float16 taps (None without
    ``layers``), concatenated over ``seqs``."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    feats, lse, taps = [None] * len(seqs), [None] * len(seqs), [None] * len(seqs)
    i = 0
    while i < len(order):
        t = _bucket(len(seqs[order[i]]))
        group = []
        while i < len(order) and _bucket(len(seqs[order[i]])) <= t and (len(group) + 1) * t <= max(batch_tokens, t):
            group.append(order[i])
            i += 1
        t = _bucket(max(len(seqs[j]) for j in group))
        # rows padded to a power of two: a shard's groups come in every size, and each new
        # [rows, t] shape compiled the whole target again (SmolLM2: about 100 shapes, seconds and
        # tens of MB each, 7 GB held after a fifth of 3,673 answers); padding rows are discarded
        rows = 1 << (len(group) - 1).bit_length()
        batch = np.zeros((rows, t), np.int32)  # right padding: causal, so it changes no real position
        for r, j in enumerate(group):
            batch[r, : len(seqs[j])] = seqs[j]
        f, z, tp = _features_and_lse(target, jnp.asarray(batch), layers)
        f, z = np.asarray(f), np.asarray(z)
        for r, j in enumerate(group):
            feats[j], lse[j] = f[r, : len(seqs[j])].astype(np.float16), z[r, : len(seqs[j])]
            if layers:
                taps[j] = np.asarray(tp[r, : len(seqs[j])]).astype(np.float16)
    return (np.concatenate([np.asarray(s, np.int32) for s in seqs]), np.concatenate(feats), np.concatenate(lse),
            np.concatenate(taps) if layers else None)


def _check_sequences(sequences, vocab: int) -> list[list[int]]:
    out = []
    for i, s in enumerate(sequences):
        a = np.asarray(s)
        if a.ndim != 1 or a.size < 2 or not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= vocab:
            raise ValueError(f"build_feature_cache: sequences[{i}] = {repr(s)[:60]}; expected at least 2 token ids "
                             f"in 0..{vocab - 1}")
        out.append([int(x) for x in a])
    if not out:
        raise ValueError("build_feature_cache: sequences is empty; expected at least one sequence")
    return out


def build_feature_cache(target: Transformer, sequences: Sequence[Sequence[int]], folder: str | os.PathLike, *,
                        batch_tokens: int = 4096, feature_layers: Sequence[int] | None = None,
                        progress: bool = True) -> FeatureCache:
    """Compute (or finish computing) the cache of ``target`` over ``sequences`` in ``folder``
    and return it (:func:`load_feature_cache`). ``batch_tokens``: padded tokens per forward;
    ``feature_layers``: also keep the taps after those target layers (a multi-layer head's
    input, :func:`~jaxspec.nn.model.forward_taps`)."""
    layers = () if feature_layers is None else tuple(feature_layers)
    if feature_layers is not None:
        check_tap_layers("build_feature_cache", list(layers), target.config.num_hidden_layers)
    seqs = _check_sequences(sequences, target.config.vocab_size)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"target_digest": target_digest(target), "digest": sequences_digest(seqs), "num_sequences": len(seqs),
            "shard": SHARD, "hidden_size": target.config.hidden_size, "feature_layers": list(layers) or None}
    path = folder / META
    if path.exists():
        old = json.loads(path.read_text())
        for k in ("target_digest", "digest", "shard", "feature_layers"):
            if old.get(k) != meta[k]:
                raise ValueError(f"build_feature_cache: {folder} holds a cache with {k} = {old.get(k)!r}, not this "
                                 f"run's {meta[k]!r}; expected the same target and sequences (or a new folder)")
    else:
        path.write_text(json.dumps(meta, indent=2) + "\n")
    shards = range(0, len(seqs), SHARD)
    bar = tqdm(total=len(seqs), desc="features", disable=not progress, dynamic_ncols=True)
    for k, start in enumerate(shards):
        out = folder / f"shard_{k:05d}.npz"
        if not out.exists():
            tokens, feats, lse, taps = _shard_arrays(target, seqs[start:start + SHARD], batch_tokens, layers)
            tmp = folder / f"shard_{k:05d}.tmp.npz"
            np.savez(tmp, tokens=tokens, feats=feats, lse=lse, **({} if taps is None else {"taps": taps}),
                     lengths=np.asarray([len(s) for s in seqs[start:start + SHARD]], np.int32))
            os.replace(tmp, out)
        bar.update(len(seqs[start:start + SHARD]))
    bar.close()
    return load_feature_cache(folder)


def load_feature_cache(folder: str | os.PathLike) -> FeatureCache:
    """The cache in ``folder``, every shard present (else ``FileNotFoundError`` naming the first
    missing one: finish it with :func:`build_feature_cache`)."""
    folder = Path(folder)
    if not (folder / META).is_file():
        raise FileNotFoundError(f"load_feature_cache: {folder / META} is missing; expected a folder written by "
                                "build_feature_cache")
    meta = json.loads((folder / META).read_text())
    layers = meta.get("feature_layers")
    parts = {"tokens": [], "feats": [], "lse": [], "seq": [], "taps": []}
    n = 0
    for k in range(-(-meta["num_sequences"] // meta["shard"])):
        path = folder / f"shard_{k:05d}.npz"
        if not path.exists():
            raise FileNotFoundError(f"load_feature_cache: {path} is missing; build_feature_cache finishes the cache")
        with np.load(path) as z:
            for name in ("tokens", "feats", "lse") + (("taps",) if layers else ()):
                parts[name].append(z[name])
            lengths = z["lengths"]
        parts["seq"].append(np.repeat(np.arange(n, n + lengths.size, dtype=np.int32), lengths))
        n += lengths.size
    return FeatureCache(tokens=np.concatenate(parts["tokens"]), feats=np.concatenate(parts["feats"]),
                        lse=np.concatenate(parts["lse"]), seq=np.concatenate(parts["seq"]),
                        target_digest=meta["target_digest"], digest=meta["digest"],
                        taps=np.concatenate(parts["taps"]) if layers else None,
                        feature_layers=tuple(layers) if layers else None)


def select_sequences(cache: FeatureCache, ids) -> FeatureCache:
    """The cache of sequences ``ids`` (distinct indices, in the order given), renumbered
    ``0 ..``; its digest names the selection, so a training run on it resumes only on it."""
    ids = np.asarray(ids, np.int64)
    n = cache.num_sequences
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= n or np.unique(ids).size != ids.size:
        raise ValueError(f"select_sequences: ids = {ids.size} indices; expected distinct sequence indices in "
                         f"0..{n - 1}")
    digest = hashlib.sha256(cache.digest.encode() + ids.astype(np.int64).tobytes()).hexdigest()[:16]
    if np.array_equal(ids, np.arange(n)):  # every sequence in order: the same arrays, no copy (GBs with taps)
        return dataclasses.replace(cache, digest=digest)
    starts = np.r_[0, np.flatnonzero(np.diff(cache.seq)) + 1]
    ends = np.r_[starts[1:], cache.seq.size]
    pos = np.concatenate([np.arange(starts[i], ends[i]) for i in ids])
    seq = np.repeat(np.arange(ids.size, dtype=np.int32), ends[ids] - starts[ids])
    return dataclasses.replace(cache, tokens=cache.tokens[pos], feats=cache.feats[pos], lse=cache.lse[pos], seq=seq,
                               taps=None if cache.taps is None else cache.taps[pos], digest=digest)
