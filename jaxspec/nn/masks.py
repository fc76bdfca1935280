"""Attention masks over the KV cache. Masks are *inputs* to the model, never derived in it.

A mask is ``bool[B, T, S]``: new token t of row b may attend to cache slot s. A forward
writes its T new tokens at slots ``lengths[b] + t`` (see :mod:`jaxspec.nn.cache`), so a
mask row covers the committed prefix (slots ``< lengths[b]``) plus the new tokens.

Example: ``lengths = [2, 1]``, ``S = 6``, the tree ``parents = [-1, -1, 0]`` (nodes 0 and
1 are children of the root, node 2 is a child of node 0)::

    tree_mask(parents)        tree_cache_mask(lengths, tree_mask, S)
         0 1 2                row 0 (lengths 2)        row 1 (lengths 1)
      0 [1 0 0]                  slot 0 1 2 3 4 5         slot 0 1 2 3 4 5
      1 [0 1 0]               node 0 [1 1 1 0 0 0]     node 0 [1 1 0 0 0 0]
      2 [1 0 1]               node 1 [1 1 0 1 0 0]     node 1 [1 0 1 0 0 0]
                              node 2 [1 1 1 0 1 0]     node 2 [1 1 0 1 0 0]

Node 1 never sees its sibling node 0 (slot ``lengths + 0``): no causal triangle over the
flattened tree. ``causal_cache_mask(lengths, T=2, S=5)`` for the same lengths::

    row 0: t0 [1 1 1 0 0]     row 1: t0 [1 1 0 0 0]
           t1 [1 1 1 1 0]            t1 [1 1 1 0 0]

Pure ``jnp``; ``lengths`` and ``tree_mask`` may be traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["causal_cache_mask", "tree_cache_mask"]


def causal_cache_mask(lengths, T: int, S: int) -> jax.Array:
    """``bool[B, T, S]``: token t of row b sees slots ``s <= lengths[b] + t``."""
    lengths = jnp.asarray(lengths, jnp.int32)  # [B]
    t = jnp.arange(T, dtype=jnp.int32)[None, :, None]  # [1, T, 1]
    s = jnp.arange(S, dtype=jnp.int32)[None, None, :]  # [1, 1, S]
    return s <= lengths[:, None, None] + t


def tree_cache_mask(lengths, tree_mask, S: int) -> jax.Array:
    """``bool[B, N, S]``: node i of row b sees every slot ``s < lengths[b]`` and slot
    ``lengths[b] + j`` iff ``tree_mask[i, j]`` (ancestor-or-self).

    ``tree_mask`` is ``bool[N, N]`` (shared by all rows) or ``bool[B, N, N]`` (per row).
    """
    lengths = jnp.asarray(lengths, jnp.int32)  # [B]
    tree_mask = jnp.asarray(tree_mask, jnp.bool_)
    b = lengths.shape[0]
    n = tree_mask.shape[-1]
    tm = jnp.broadcast_to(tree_mask, (b, n, n))  # [B, N, N]
    s = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
    j = s - lengths[:, None]  # [B, S], node index held by slot s
    in_tree = (j >= 0) & (j < n)  # [B, S]
    jc = jnp.broadcast_to(jnp.clip(j, 0, n - 1)[:, None, :], (b, n, S))  # [B, N, S]
    sees_node = jnp.take_along_axis(tm, jc, axis=2)  # [B, N, S]
    prefix = (j < 0)[:, None, :]  # [B, 1, S]
    return prefix | (in_tree[:, None, :] & sees_node)
