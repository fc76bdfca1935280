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

Sliding windows are the model's business, not the caller's: a layer with a window ``W``
narrows whatever mask it is given with :func:`window_mask`, reading the key positions from the
cache layout (:func:`cache_key_positions`). A token at position p then sees committed keys at
positions ``(p - W, p]`` and, in a tree, its ancestors (whose positions are below p by their
depth difference, so all of them while the tree is shallower than the window). With
``lengths = [5]``, ``W = 3`` and a chain of two new tokens at positions 5, 6::

    causal_cache_mask([5], 2, 8)        window_mask(..., W=3)
         slot 0 1 2 3 4 5 6 7               slot 0 1 2 3 4 5 6 7
    t0 (p=5) [1 1 1 1 1 1 0 0]          t0   [0 0 0 1 1 1 0 0]
    t1 (p=6) [1 1 1 1 1 1 1 0]          t1   [0 0 0 0 1 1 1 0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["causal_cache_mask", "tree_cache_mask", "cache_key_positions", "window_mask"]


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


def cache_key_positions(lengths, positions, S: int) -> jax.Array:
    """``int32[B, S]``: the position of the key held by each cache slot during a forward that
    writes ``positions int32[B, T]`` at slots ``lengths[b] + t``. Committed slots hold
    position = slot (prompts start at position 0 and commits keep the prefix contiguous); a
    new token's slot holds its own position (its tree depth for a tree node); slots past
    them hold the slot index (the caller's mask hides them).

    A draft that forwards its tree level by level (``lengths`` advanced past the earlier
    levels' scratch slots) has those nodes labelled by slot, at or above their true position:
    the same window while the tree is shallower than it. Verification, whose ``lengths`` is
    the committed length, is exact at any depth."""
    lengths = jnp.asarray(lengths, jnp.int32)  # [B]
    positions = jnp.asarray(positions, jnp.int32)  # [B, T]
    t = positions.shape[1]
    s = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
    j = s - lengths[:, None]  # [B, S], new-token index held by slot s
    new = jnp.take_along_axis(positions, jnp.clip(j, 0, t - 1), axis=1)  # [B, S]
    return jnp.where((j >= 0) & (j < t), new, s)


def window_mask(mask, positions, key_positions, window: int) -> jax.Array:
    """``mask bool[B, T, S]`` narrowed to keys within ``window`` positions of each query:
    key position k is kept for a query at position p iff ``k > p - window`` (Hugging Face's
    sliding window: W keys, the query's own included)."""
    positions = jnp.asarray(positions, jnp.int32)  # [B, T]
    return mask & (key_positions[:, None, :] > positions[:, :, None] - window)
