"""The KV cache: an explicit pytree passed into the model and returned by it.

``KVCache(k, v, lengths)``:

- ``k``, ``v``: ``[L, B, S, Hkv, D]`` (layers, rows, capacity slots, kv heads, head dim);
  ``k`` is stored *after* rotary embedding.
- ``lengths``: ``int32[B]``, committed tokens per row. Slots ``>= lengths[b]`` are
  scratch: a forward writes its ``T`` new tokens at slots ``lengths[b] + t`` without
  advancing ``lengths``; :func:`advance` or :func:`commit` then decides what is kept.

Lifecycle of one speculative round for row b (``Lb = lengths[b]``)::

    forward(tree of N nodes)   -> node j's K/V at slot Lb + j       (lengths unchanged)
    commit(offsets=[0, 2, 5])  -> slots Lb, Lb+1, Lb+2 <- slots Lb+0, Lb+2, Lb+5
                                  lengths[b] = Lb + 3

Writes beyond the capacity ``S`` are dropped (never wrapped or clamped onto other slots);
keeping ``lengths + T <= S`` is the caller's job.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.nn.config import ModelConfig

__all__ = ["KVCache", "init_cache", "commit", "advance"]


@struct.dataclass
class KVCache:
    k: jax.Array  # [L, B, S, Hkv, D]
    v: jax.Array  # [L, B, S, Hkv, D]
    lengths: jax.Array  # int32[B]

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


def init_cache(config: ModelConfig, batch_size: int, capacity: int, dtype=None) -> KVCache:
    """An empty cache (zeros, ``lengths = 0``); ``dtype`` defaults to ``config.dtype``."""
    for name, v in (("batch_size", batch_size), ("capacity", capacity)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"init_cache: {name} = {v!r}; expected a positive integer")
    dtype = config.param_dtype if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"init_cache: dtype = {dtype}; expected a floating dtype (float32, bfloat16, ...)")
    shape = (config.num_hidden_layers, batch_size, capacity, config.num_key_value_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def advance(cache: KVCache, num) -> KVCache:
    """``lengths += num`` (scalar or ``int32[B]``): keep the tokens just written, in place."""
    num = jnp.broadcast_to(jnp.asarray(num, jnp.int32), cache.lengths.shape)
    return cache.replace(lengths=cache.lengths + num)


def commit(cache: KVCache, offsets, num) -> KVCache:
    """Keep a subset of the last forward's new tokens, moved to contiguous slots.

    Args:
      offsets: ``int32[B, M]``, indices ``t`` of new tokens (written at slot
        ``lengths[b] + t`` by the last forward), -1 padded.
      num: ``int32[B]``, how many offsets of each row to keep (``num[b] <= M``).

    For each row b and ``m < num[b]``: slot ``lengths[b] + m`` receives the K/V of slot
    ``lengths[b] + offsets[b, m]``; then ``lengths += num``. All sources are gathered
    before any write, so overlapping moves are safe. Pure ``jnp``; jit/vmap safe.
    """
    offsets = jnp.asarray(offsets, jnp.int32)  # [B, M]
    num = jnp.broadcast_to(jnp.asarray(num, jnp.int32), cache.lengths.shape)  # [B]
    b, m = offsets.shape
    s = cache.capacity
    lengths = cache.lengths[:, None]  # [B, 1]
    rows = jnp.arange(b, dtype=jnp.int32)[:, None]  # [B, 1]
    idx = jnp.arange(m, dtype=jnp.int32)[None, :]  # [1, M]
    keep = idx < num[:, None]  # [B, M]

    src = jnp.clip(lengths + jnp.maximum(offsets, 0), 0, s - 1)  # [B, M]
    dst = jnp.where(keep, lengths + idx, s)  # [B, M]; s = out of range -> dropped

    def move(x):  # x: [L, B, S, Hkv, D]
        gathered = x[:, rows, src]  # [L, B, M, Hkv, D], read before any write
        return x.at[:, rows, dst].set(gathered, mode="drop")

    return KVCache(k=move(cache.k), v=move(cache.v), lengths=cache.lengths + num)
