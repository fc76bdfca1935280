"""Tree topology spec: literal matrices, eager and under jit, and validation errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.core import tree as T
BRANCHING = [-1, -1, 0, 0, 1, 2]
BRANCHING_MASK = np.array(
    [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ],
    dtype=bool,
)
CHAIN4_MASK = np.tril(np.ones((4, 4), dtype=bool))


def _modes():
    """Eager, jit with constant parents, jit with traced parents."""
    return {
        "eager": lambda f, p: f(p),
        "jit_const": lambda f, p: jax.jit(lambda: f(np.asarray(p, np.int32)))(),
        "jit_traced": lambda f, p: jax.jit(f)(jnp.asarray(p, jnp.int32)),
    }


@pytest.mark.parametrize("mode", list(_modes()))
def test_mask_branching_literal(mode):
    m = _modes()[mode](jaxspec.tree_mask, BRANCHING)
    assert m.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(m), BRANCHING_MASK)


@pytest.mark.parametrize("mode", list(_modes()))
def test_mask_chain_literal(mode):
    m = _modes()[mode](jaxspec.tree_mask, jaxspec.chain(4))
    np.testing.assert_array_equal(np.asarray(m), CHAIN4_MASK)


@pytest.mark.parametrize("mode", list(_modes()))
def test_depths_paths_children(mode):
    run = _modes()[mode]
    np.testing.assert_array_equal(run(jaxspec.tree_depths, BRANCHING), [1, 1, 2, 2, 2, 3])
    paths = np.asarray(run(jaxspec.tree_paths, BRANCHING))
    np.testing.assert_array_equal(paths[5], [0, 2, 5, -1, -1, -1])
    np.testing.assert_array_equal(paths[4], [1, 4, -1, -1, -1, -1])
    np.testing.assert_array_equal(paths[0], [0, -1, -1, -1, -1, -1])
    ch = np.asarray(run(jaxspec.tree_children, BRANCHING))
    assert ch.shape == (7, 6)
    np.testing.assert_array_equal(ch[0], [0, 1, -1, -1, -1, -1])  # root
    np.testing.assert_array_equal(ch[1], [2, 3, -1, -1, -1, -1])  # node 0
    np.testing.assert_array_equal(ch[2], [4, -1, -1, -1, -1, -1])  # node 1
    np.testing.assert_array_equal(ch[3], [5, -1, -1, -1, -1, -1])  # node 2
    assert (ch[4:] == -1).all()
    np.testing.assert_array_equal(run(T.sibling_ranks, BRANCHING), [0, 1, 0, 1, 0, 0])


def test_positions():
    np.testing.assert_array_equal(jaxspec.tree_positions(BRANCHING, 10), [10, 10, 11, 11, 11, 12])
    pos = jaxspec.tree_positions(BRANCHING, jnp.array([3, 7]))
    np.testing.assert_array_equal(pos, [[3, 3, 4, 4, 4, 5], [7, 7, 8, 8, 8, 9]])


def test_mask_matches_paths_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 12))
        parents = np.array([rng.integers(-1, i) for i in range(n)], np.int32)
        mask = np.asarray(jax.jit(jaxspec.tree_mask)(parents))
        for i in range(n):
            anc = {i}
            p = parents[i]
            while p >= 0:
                anc.add(int(p))
                p = parents[p]
            assert set(np.flatnonzero(mask[i]).tolist()) == anc


def test_constructors():
    np.testing.assert_array_equal(jaxspec.chain(3), [-1, 0, 1])
    np.testing.assert_array_equal(jaxspec.branching((2, 1)), [-1, -1, 0, 1])
    b = jaxspec.branching((3, 2, 1))
    assert b.shape == (15,)
    np.testing.assert_array_equal(np.bincount(np.asarray(jaxspec.tree_depths(b))), [0, 3, 6, 6])
    np.testing.assert_array_equal(b[:9], [-1, -1, -1, 0, 0, 1, 1, 2, 2])
    assert T.max_siblings(b) == 3
    np.testing.assert_array_equal(jaxspec.from_parents(BRANCHING), BRANCHING)
    assert jaxspec.from_parents(BRANCHING).dtype == np.int32


@pytest.mark.parametrize(
    "parents, match",
    [
        ([[-1, 0]], r"1-D"),
        ([], r"empty"),
        ([-1, -2], r"parents\[1\] = -2.*>= -1"),
        ([-1, 1], r"parents\[1\] = 1.*parents\[i\] < i"),
        ([0], r"parents\[0\] = 0.*parents\[i\] < i"),
        ([-1, 0.5], r"integer"),
    ],
)
def test_validation_errors(parents, match):
    with pytest.raises(ValueError, match=match):
        jaxspec.tree_mask(parents)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_constructor_errors(bad):
    with pytest.raises(ValueError, match="chain: k"):
        jaxspec.chain(bad)
    with pytest.raises(ValueError, match=r"widths\[1\]"):
        jaxspec.branching((2, bad))


def test_traced_input_is_not_validated():
    # Documented: traced parents are data; the function still runs (no Python check).
    out = jax.jit(jaxspec.tree_depths)(jnp.array([-1, 0, 1], jnp.int32))
    np.testing.assert_array_equal(out, [1, 2, 3])


@pytest.mark.parametrize("bad", [2, None, 2.5, np.array(3)])
def test_branching_needs_a_sequence(bad):
    # branching(2) used to raise TypeError: 'int' object is not iterable
    with pytest.raises(ValueError, match=r"branching: widths = .*; expected a sequence of integers >= 1"):
        jaxspec.branching(bad)
    np.testing.assert_array_equal(jaxspec.branching(np.array([2, 1])), [-1, -1, 0, 1])
    np.testing.assert_array_equal(jaxspec.branching(w for w in (2, 1)), [-1, -1, 0, 1])


@pytest.mark.parametrize(
    "committed_len, match",
    [
        (-5, r"committed_len = -5"),
        (0, r"committed_len = 0"),
        (2.5, r"committed_len = 2.5"),
        (True, r"committed_len = True"),
        (np.array([3, 0]), r"committed_len\[1\] = 0"),
        (jnp.array([3.0, 4.5]), r"committed_len\[1\] = 4.5"),
        ("7", r"committed_len = '7'"),
    ],
)
def test_positions_validate_committed_len(committed_len, match):
    with pytest.raises(ValueError, match=match + r": expected .*integer >= 1"):
        jaxspec.tree_positions([-1, 0], committed_len)


def test_positions_committed_len_forms():
    # integral floats and numpy ints are counts; a traced length is data (not validated)
    np.testing.assert_array_equal(jaxspec.tree_positions([-1, 0], 3.0), [3, 4])
    np.testing.assert_array_equal(jaxspec.tree_positions([-1, 0], np.int64(1)), [1, 2])
    out = jax.jit(jaxspec.tree_positions, static_argnums=0)((-1, 0), jnp.array([0, 5]))
    np.testing.assert_array_equal(out, [[0, 1], [5, 6]])


@pytest.mark.parametrize("fn", [T.tree_mask, T.tree_depths])
def test_traced_parents_shape_and_dtype_are_checked(fn):
    with pytest.raises(ValueError, match="parents: expected integer parent indices, got dtype float32"):
        jax.jit(fn)(jnp.array([-1.0, 0.5, 0.9]))  # would silently truncate to [-1, 0, 0]
    with pytest.raises(ValueError, match=r"parents: expected a 1-D array of parent indices, got shape \(1, 2\)"):
        jax.jit(fn)(jnp.array([[-1, 0]]))
    np.testing.assert_array_equal(jax.jit(T.tree_depths)(jnp.array([-1, 0, 0])), [1, 2, 2])


def test_validate_parents_non_finite_float():
    with pytest.raises(ValueError, match="parents: expected integer parent indices, got dtype float64"):
        T.validate_parents([-1, float("inf")])
    np.testing.assert_array_equal(T.validate_parents([-1.0, 0.0]), [-1, 0])  # integral floats are fine
