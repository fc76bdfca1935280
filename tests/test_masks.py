"""Attention masks over the KV cache: literal 0/1 matrices, per-row tree masks, jit."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.core.tree import tree_mask

LENGTHS = [2, 1]


def test_causal_cache_mask_literal():
    m = causal_cache_mask(jnp.array(LENGTHS), 2, 5)
    expected = np.array(
        [
            [[1, 1, 1, 0, 0],  # row 0 (lengths 2), t0 sees slots <= 2
             [1, 1, 1, 1, 0]],
            [[1, 1, 0, 0, 0],  # row 1 (lengths 1), t0 sees slots <= 1
             [1, 1, 1, 0, 0]],
        ],
        dtype=bool,
    )
    assert m.dtype == jnp.bool_ and m.shape == (2, 2, 5)
    np.testing.assert_array_equal(np.asarray(m), expected)


def test_tree_cache_mask_literal():
    # parents [-1, -1, 0]: nodes 0 and 1 are siblings, node 2 is node 0's child.
    m = tree_cache_mask(jnp.array(LENGTHS), tree_mask([-1, -1, 0]), 6)
    expected = np.array(
        [
            [[1, 1, 1, 0, 0, 0],  # row 0: prefix slots 0,1; node j at slot 2 + j
             [1, 1, 0, 1, 0, 0],
             [1, 1, 1, 0, 1, 0]],
            [[1, 1, 0, 0, 0, 0],  # row 1: prefix slot 0; node j at slot 1 + j
             [1, 0, 1, 0, 0, 0],
             [1, 1, 0, 1, 0, 0]],
        ],
        dtype=bool,
    )
    assert m.dtype == jnp.bool_ and m.shape == (2, 3, 6)
    np.testing.assert_array_equal(np.asarray(m), expected)


def test_tree_cache_mask_chain_equals_causal():
    lengths = jnp.array([3, 0, 5])
    chain = tree_mask([-1, 0, 1, 2])
    np.testing.assert_array_equal(
        np.asarray(tree_cache_mask(lengths, chain, 10)), np.asarray(causal_cache_mask(lengths, 4, 10))
    )


def test_tree_cache_mask_per_row_trees_and_capacity_edge():
    lengths = jnp.array([1, 3])
    tm = jnp.stack([tree_mask([-1, 0, 1]), tree_mask([-1, -1, -1])])  # [B, N, N]
    m = np.asarray(tree_cache_mask(lengths, tm, 5))
    # row 0: chain at slots 1..3
    np.testing.assert_array_equal(m[0], [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    # row 1: three root children at slots 3, 4 and (past capacity) 5: each sees only itself
    np.testing.assert_array_equal(m[1], [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1], [1, 1, 1, 0, 0]])


def _cache_mask_reference(lengths, parents, S):
    """Independent numpy reference: node i of row b sees every slot s < lengths[b], and
    slot lengths[b] + j iff j is an ancestor-or-self of i (walking parents); nothing else."""
    n = len(parents)
    m = np.zeros((len(lengths), n, S), bool)
    for b, ln in enumerate(lengths):
        for i in range(n):
            m[b, i, :ln] = True
            j = i
            while j >= 0:
                if ln + j < S:
                    m[b, i, ln + j] = True
                j = parents[j]
    return m


def test_tree_cache_mask_jit_traced_parents():
    parents = [-1, -1, 0, 0, 1, 2]
    lengths = [2, 4]
    f = jax.jit(lambda p, l: tree_cache_mask(l, tree_mask(p), 12))
    got = np.asarray(f(jnp.array(parents, jnp.int32), jnp.array(lengths)))
    want = _cache_mask_reference(lengths, parents, 12)
    # row 0, node 5 (parents 5 -> 2 -> 0): prefix slots 0, 1 and nodes 0, 2, 5 at slots 2, 4, 7
    np.testing.assert_array_equal(want[0, 5], [1, 1, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(tree_cache_mask(jnp.array(lengths), tree_mask(parents), 12)), want)
