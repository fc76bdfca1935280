"""Warps and draft-side draws (jaxspec.sampling).

Statistical tests use fixed seeds and a threshold fixed in advance: p > 1e-4 per test.
"""

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.core import numerics, sampling
from jaxspec.core.sampling import (
    draw,
    draw_deterministic,
    draw_iid,
    draw_without_replacement,
    sample_categorical,
    sibling_laws,
    top_k_mask,
    top_p_mask,
    validate_warp_args,
    warp_logits,
    warp_probs,
)
from jaxspec.exactness.stats import chisquare_gof

P_MIN = 1e-4  # fixed in advance, not tuned
N_DRAWS = 1 << 18  # 262144 vmapped draws per statistical test

# --------------------------------------------------------------------------- warps


def test_top_k_ties_at_boundary_lowest_index_wins():
    logits = jnp.array([1.0, 3.0, 3.0, 3.0, 0.0])
    np.testing.assert_array_equal(top_k_mask(logits, 2), [False, True, True, False, False])
    probs = warp_probs(logits, top_k=2)
    np.testing.assert_allclose(probs, [0, 0.5, 0.5, 0, 0], atol=1e-7)
    # strictly larger entries always kept, the boundary tie filled by index
    probs = warp_probs(jnp.array([2.0, 1.0, 5.0, 2.0, 2.0]), top_k=3)
    assert (np.asarray(probs) > 0).tolist() == [True, False, True, True, False]
    # -0.0 and 0.0 are a tie
    np.testing.assert_array_equal(top_k_mask(jnp.array([0.0, -0.0, 0.0]), 2), [True, True, False])
    # k >= V keeps everything
    assert bool(jnp.all(top_k_mask(logits, 10)))


def test_top_k_exactly_k_batched():
    logits = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 2.0, 1.0]])
    m = top_k_mask(logits, 3)
    np.testing.assert_array_equal(m, [[True, True, True, False], [True, True, True, False]])


def test_top_p_boundary_and_ties():
    # mass reached exactly at the boundary: the prefix stops there
    np.testing.assert_array_equal(top_p_mask(jnp.array([0.5, 0.25, 0.125, 0.125]), 0.75),
                                  [True, True, False, False])
    # just above the boundary: one more token
    np.testing.assert_array_equal(top_p_mask(jnp.array([0.5, 0.25, 0.125, 0.125]), 0.76),
                                  [True, True, True, False])
    # ties: lowest index first
    np.testing.assert_array_equal(top_p_mask(jnp.full(4, 0.25), 0.5), [True, True, False, False])
    np.testing.assert_array_equal(top_p_mask(jnp.array([0.2, 0.5, 0.3]), 0.75), [False, True, True])
    # at least one token, even for a tiny top_p
    np.testing.assert_array_equal(top_p_mask(jnp.array([0.1, 0.6, 0.3]), 1e-9), [False, True, False])
    # top_p == 1 keeps everything, zero-probability tokens included (they stay 0 anyway)
    assert bool(jnp.all(top_p_mask(jnp.array([0.7, 0.3, 0.0]), 1.0)))


def test_warp_order_temperature_then_top_k_then_top_p():
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    # top-3 -> [0, 2/9, 3/9, 4/9]; top_p 0.5 needs {3, 2} (4/9 < .5)
    np.testing.assert_allclose(warp_probs(logits, top_k=3, top_p=0.5), [0, 0, 3 / 7, 4 / 7], atol=1e-6)
    # top_p alone on the full law: 0.4 < 0.5 -> {3, 2}
    np.testing.assert_allclose(warp_probs(logits, top_p=0.5), [0, 0, 3 / 7, 4 / 7], atol=1e-6)
    # top_p alone 0.75: 0.4 + 0.3 = 0.7 < 0.75 -> 3 tokens
    np.testing.assert_allclose(warp_probs(logits, top_p=0.75), [0, 2 / 9, 3 / 9, 4 / 9], atol=1e-6)
    # temperature 2: p ~ sqrt(p)
    s = np.sqrt([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(warp_probs(logits, temperature=2.0), s / s.sum(), rtol=1e-5)
    # temperature changes the law seen by top_p: at T=2, top_p=0.5 -> {3, 2}: sqrt(.4)/sum < .5
    t2 = warp_probs(logits, temperature=2.0, top_p=0.5)
    np.testing.assert_allclose(t2, [0, 0, s[2] / (s[2] + s[3]), s[3] / (s[2] + s[3])], rtol=1e-5)


def test_temperature_zero_is_greedy_one_hot():
    logits = jnp.array([1.0, 4.0, 4.0, -jnp.inf])
    expected = [0.0, 1.0, 0.0, 0.0]  # tie -> lowest index
    np.testing.assert_array_equal(warp_probs(logits, temperature=0.0), expected)
    np.testing.assert_array_equal(warp_probs(logits, temperature=0, top_k=2, top_p=0.3), expected)
    # traced temperature: jnp.where branch
    f = jax.jit(lambda x, t: warp_probs(x, temperature=t))
    np.testing.assert_array_equal(f(logits, 0.0), expected)
    np.testing.assert_allclose(f(logits, 1.0), warp_probs(logits), rtol=1e-6)
    # tiny positive temperature: no overflow, no NaN
    tiny = warp_probs(jnp.array([1.0, 2.0, -jnp.inf]), temperature=1e-30)
    np.testing.assert_array_equal(tiny, [0.0, 1.0, 0.0])


def test_neg_inf_logits_get_exact_zero():
    logits = jnp.array([-jnp.inf, 0.0, -jnp.inf, 1.0])
    for kw in [{}, {"top_k": 3}, {"top_p": 0.99}, {"temperature": 0.5, "top_k": 4, "top_p": 1.0}]:
        p = np.asarray(warp_probs(logits, **kw))
        assert p[0] == 0.0 and p[2] == 0.0, kw
        assert np.isclose(p.sum(), 1.0) and np.all(np.isfinite(p))
    lp = warp_logits(logits)
    assert lp[0] == -jnp.inf and np.isclose(float(jnp.exp(lp[3])), np.e / (1 + np.e))
    # all -inf: no NaN
    assert np.all(np.isfinite(np.asarray(warp_probs(jnp.full(3, -jnp.inf)))))


def test_warp_traced_top_p_jit_vmap():
    logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    f = jax.jit(lambda x, t, p: warp_probs(x, temperature=t, top_k=3, top_p=p))
    out = f(logits, 1.0, 0.5)
    np.testing.assert_allclose(out, [[0, 0, 3 / 7, 4 / 7], [4 / 7, 3 / 7, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(f(logits, 1.0, 1.0), warp_probs(logits, top_k=3), atol=1e-7)
    g = jax.vmap(lambda x, p: warp_probs(x, top_p=p))
    np.testing.assert_allclose(g(logits, jnp.array([0.5, 0.75])),
                               [[0, 0, 3 / 7, 4 / 7], [4 / 9, 3 / 9, 2 / 9, 0]], atol=1e-6)
    assert out.dtype == jnp.float32


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_validation_names_argument(kwargs, name):
    with pytest.raises(ValueError, match=name) as e:
        validate_warp_args(**kwargs)
    assert repr(list(kwargs.values())[0]) in str(e.value)
    with pytest.raises(ValueError, match=name):
        warp_probs(jnp.zeros(4), **kwargs)


def test_draw_validation():
    p = jnp.full(4, 0.25)
    with pytest.raises(ValueError, match="scheme"):
        draw(jax.random.key(0), p, 2, "bogus")
    with pytest.raises(ValueError, match="n: .*at most V=4"):
        draw_without_replacement(jax.random.key(0), p, 5)
    with pytest.raises(ValueError, match="n: "):
        draw_iid(jax.random.key(0), p, 0)
    with pytest.raises(ValueError, match="probs"):
        draw_deterministic(jnp.ones((2, 4)), 1)


# --------------------------------------------------------------------------- categorical


def _counts(tokens, k):
    return np.bincount(np.asarray(tokens).ravel(), minlength=k)


def test_sample_categorical_frequencies_and_never_zero():
    probs = jnp.array([0.0, 2.0, 0.0, 1.0, 5.0, 0.0, 0.01, 0.0])  # unnormalized
    keys = jax.random.split(jax.random.key(1), N_DRAWS)
    tokens = jax.jit(jax.vmap(sample_categorical, in_axes=(0, None)))(keys, probs)
    assert tokens.dtype == jnp.int32
    c = _counts(tokens, 8)
    assert c[[0, 2, 5, 7]].sum() == 0
    p = np.asarray(probs, np.float64) / float(np.sum(np.asarray(probs, np.float64)))
    r = chisquare_gof(c, p)
    assert r.pvalue > P_MIN, f"{r}\n{r.table()}"
    # batched rows: one draw per row
    batch = jnp.stack([probs, probs[::-1]])
    t = sample_categorical(jax.random.key(2), batch)
    assert t.shape == (2,) and float(batch[0, t[0]]) > 0 and float(batch[1, t[1]]) > 0


def test_sample_categorical_edge_cases():
    probs = jnp.array([0.0, 0.3, 0.0, 0.7, 0.0])
    inv = numerics.inverse_cdf
    assert int(inv(jnp.float32(0.0), probs)) == 1
    assert int(inv(jnp.float32(np.nextafter(np.float32(1), np.float32(0))), probs)) == 3
    assert int(inv(jnp.float32(1.0), probs)) == 3  # clamp to the last positive token
    # total 0 -> lowest index; traced NaN / negative entries (concrete ones raise) never
    # chosen, never NaN
    assert int(sample_categorical(jax.random.key(0), jnp.zeros(5))) == 0
    weird = jnp.array([jnp.nan, -1.0, 0.0, 2.0, 0.0])
    keys = jax.random.split(jax.random.key(3), 1000)
    draws = jax.jit(jax.vmap(sample_categorical, in_axes=(0, None)))(keys, weird)
    assert np.all(np.asarray(draws) == 3)


def test_sample_categorical_never_picks_zero_sparse_large_vocab():
    rng = np.random.default_rng(0)
    v = 4096
    p = np.where(rng.random(v) < 0.05, rng.random(v) ** 8, 0.0).astype(np.float32)
    p[-1] = 0.0
    probs = jnp.asarray(p)
    keys = jax.random.split(jax.random.key(4), 1 << 16)
    t = np.asarray(jax.jit(jax.vmap(sample_categorical, in_axes=(0, None)))(keys, probs))
    assert np.all(p[t] > 0)


# --------------------------------------------------------------------------- draws


def _pair_law_without_replacement(p):
    """Exact law of the ordered pair (t0, t1) of sequential sampling without replacement."""
    v = len(p)
    out = np.zeros((v, v))
    for a, b in itertools.permutations(range(v), 2):
        if p[a] > 0 and p[a] < 1:
            out[a, b] = p[a] * p[b] / (1 - p[a])
    return out


def _pair_counts(tokens, v):
    t = np.asarray(tokens)
    return np.bincount(t[:, 0] * v + t[:, 1], minlength=v * v)


@pytest.mark.parametrize("p", [[0.1, 0.2, 0.3, 0.4], [0.5, 0.3, 0.0, 0.2]])
def test_without_replacement_pair_law(p):
    probs = jnp.asarray(p, jnp.float32)
    keys = jax.random.split(jax.random.key(10), N_DRAWS)
    f = jax.jit(jax.vmap(lambda k: draw_without_replacement(k, probs, 3)))
    tokens, laws = f(keys)
    assert tokens.shape == (N_DRAWS, 3) and laws.shape == (N_DRAWS, 3, 4)
    law = _pair_law_without_replacement(np.asarray(p, np.float64)).ravel()
    r = chisquare_gof(_pair_counts(tokens, 4), law)
    assert r.pvalue > P_MIN, f"{r}\n{r.table()}"
    # all siblings distinct, zero-probability token never among the first two
    t = np.asarray(tokens)
    assert np.all((t[:, 0] != t[:, 1]) & (t[:, 1] != t[:, 2]) & (t[:, 0] != t[:, 2]))
    zero = [i for i, x in enumerate(p) if x == 0]
    assert not np.isin(t[:, :2], zero).any()
    # reported laws are the renormalized rows, recomputed here in float64
    pp = np.asarray(p, np.float64)
    for i in range(5):
        ti, li = t[i], np.asarray(laws[i])
        np.testing.assert_array_equal(li[0], np.asarray(probs))
        for k in (1, 2):
            m = pp.copy()
            m[ti[:k]] = 0
            np.testing.assert_allclose(li[k], m / m.sum(), rtol=1e-6, atol=1e-7)


def test_iid_pair_law():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    probs = jnp.asarray(p, jnp.float32)
    keys = jax.random.split(jax.random.key(11), N_DRAWS)
    tokens, laws = jax.jit(jax.vmap(lambda k: draw_iid(k, probs, 2)))(keys)
    r = chisquare_gof(_pair_counts(tokens, 4), np.outer(p, p).ravel())
    assert r.pvalue > P_MIN, f"{r}\n{r.table()}"
    np.testing.assert_array_equal(laws[0], np.stack([probs, probs]))


def test_without_replacement_support_exhaustion():
    probs = jnp.array([0.0, 0.6, 0.0, 0.4, 0.0])
    keys = jax.random.split(jax.random.key(12), 2000)
    tokens, laws = jax.jit(jax.vmap(lambda k: draw_without_replacement(k, probs, 5)))(keys)
    t = np.asarray(tokens)
    assert set(map(tuple, t[:, :2])) == {(1, 3), (3, 1)}
    np.testing.assert_array_equal(t[:, 2:], np.broadcast_to([0, 2, 4], (2000, 3)))
    onehots = np.eye(5, dtype=np.float32)
    i = int(np.argmax(t[:, 0] == 3))  # a draw with tokens = [3, 1, 0, 2, 4]
    np.testing.assert_array_equal(laws[i, 0], probs)
    np.testing.assert_array_equal(laws[i, 1], onehots[1])  # {1} left: renormalized = one-hot
    np.testing.assert_array_equal(laws[i, 2:], onehots[[0, 2, 4]])
    # a single positive token; n = V
    tokens, laws = draw_without_replacement(jax.random.key(0), jnp.array([0.0, 0.0, 1.0]), 3)
    np.testing.assert_array_equal(tokens, [2, 0, 1])
    np.testing.assert_array_equal(laws, [[0, 0, 1], [1, 0, 0], [0, 1, 0]])


def test_deterministic_draw():
    tokens, laws = draw_deterministic(jnp.array([0.1, 0.3, 0.3, 0.3]), 2)
    np.testing.assert_array_equal(tokens, [1, 2])
    np.testing.assert_array_equal(laws, [[0, 1, 0, 0], [0, 0, 1, 0]])
    tokens, _ = draw(None, jnp.array([0.0, 0.0, 0.2, 0.8]), 3, "deterministic")
    np.testing.assert_array_equal(tokens, [3, 2, 0])


def test_sibling_laws_literal_and_duplicates():
    probs = jnp.array([0.5, 0.3, 0.2, 0.0])
    laws = sibling_laws(probs, jnp.array([1, 0, 2]), "without_replacement")
    np.testing.assert_allclose(laws, [[0.5, 0.3, 0.2, 0], [5 / 7, 0, 2 / 7, 0], [0, 0, 1, 0]], atol=1e-7)
    # deterministic duplicates are fine: each is a point mass
    np.testing.assert_array_equal(sibling_laws(probs, jnp.array([0, 0]), "deterministic"),
                                  [[1, 0, 0, 0], [1, 0, 0, 0]])


def _laws_float64(row, tokens, scheme):
    """Independent float64 numpy reference for the laws ``q_k`` (documented in
    :func:`jaxspec.sampling.sibling_laws`): iid -> the row for every sibling; without
    replacement -> ``q_0`` = the row, ``q_k`` = the row with ``tokens[:k]`` zeroed divided
    by its float64 sum, a one-hot on ``tokens[k]`` if that sum is 0; deterministic ->
    one-hot on ``tokens[k]``."""
    row = np.asarray(row, np.float64)
    tokens = np.asarray(tokens)
    laws = []
    for k, x in enumerate(tokens.tolist()):
        onehot = np.zeros_like(row)
        onehot[x] = 1.0
        if scheme == "iid":
            laws.append(row)
        elif scheme == "deterministic":
            laws.append(onehot)
        else:
            masked = row.copy()
            masked[tokens[:k]] = 0.0
            tot = masked.sum()
            laws.append(onehot if tot == 0 else row if k == 0 else masked / tot)
    return np.stack(laws)


def test_laws_float64_reference_literal():
    """The reference itself, on the documented example of :func:`sibling_laws`."""
    row, toks = [0.5, 0.3, 0.2, 0.0], [1, 0, 2]
    np.testing.assert_allclose(_laws_float64(row, toks, "without_replacement"),
                               [[0.5, 0.3, 0.2, 0], [5 / 7, 0, 2 / 7, 0], [0, 0, 1, 0]], rtol=1e-12)
    np.testing.assert_array_equal(_laws_float64([0, 0.6, 0, 0.4], [3, 1, 0], "without_replacement"),
                                  [[0, 0.6, 0, 0.4], [0, 1, 0, 0], [1, 0, 0, 0]])  # exhausted
    np.testing.assert_array_equal(_laws_float64(row, toks, "iid"), [row] * 3)
    np.testing.assert_array_equal(_laws_float64(row, [2, 2], "deterministic"), [[0, 0, 1, 0]] * 2)


@pytest.mark.parametrize("scheme", sampling.SCHEMES)
def test_draw_jit_vmap_and_laws_match_sibling_laws(scheme):
    probs = warp_probs(jnp.log(jnp.array([0.05, 0.15, 0.3, 0.2, 0.3])), top_k=4)
    f = jax.jit(draw, static_argnums=(2, 3))
    tokens, laws = f(jax.random.key(5), probs, 3, scheme)
    assert tokens.dtype == jnp.int32 and laws.dtype == jnp.float32 and laws.shape == (3, 5)
    # draw_* return sibling_laws' own helper: compare with an independent float64 reference
    np.testing.assert_allclose(laws, _laws_float64(probs, tokens, scheme), rtol=1e-5, atol=1e-7)
    keys = jax.random.split(jax.random.key(6), 8)
    bt, bl = jax.vmap(lambda k, p: draw(k, p, 3, scheme), in_axes=(0, None))(keys, probs)
    assert bt.shape == (8, 3) and bl.shape == (8, 3, 5)
    assert np.all(np.asarray(probs)[np.asarray(bt)] > 0)
    for i in range(8):
        np.testing.assert_allclose(bl[i], _laws_float64(probs, bt[i], scheme), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scheme", sampling.SCHEMES)
@pytest.mark.parametrize("v", [65, 264, 32000])
def test_draws_beyond_one_level_vocab(scheme, v):
    """Draws on vocabularies past the one-level inverse CDF (V > 64: the default models'
    264, a Llama-sized 32000), jitted and vmapped over keys with the row shared: tokens in
    the row's support, laws = an independent float64 reference; iid tokens are the float64
    ``searchsorted`` of the same uniforms (n uniforms against one row)."""
    rng = np.random.default_rng(v)
    row = rng.dirichlet(np.full(v, 0.3)).astype(np.float32)
    row[rng.random(v) < 0.5] = 0.0  # sparse: a zero cell must never be drawn
    row /= row.sum()
    probs = jnp.asarray(row)
    keys = jax.random.split(jax.random.key(v), 16)
    tokens, laws = jax.jit(jax.vmap(lambda k: draw(k, probs, 4, scheme)))(keys)
    t = np.asarray(tokens)
    assert t.shape == (16, 4) and laws.shape == (16, 4, v)
    assert (row[t] > 0).all()
    # float32 laws vs the float64 reference: float32 rounding apart
    for i in (0, 3, 15):
        np.testing.assert_allclose(laws[i], _laws_float64(row, t[i], scheme), rtol=1e-5, atol=1e-9)
    if scheme == "iid":
        u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (4,), jnp.float32))(keys))
        cdf = np.cumsum(row.astype(np.float64))
        target = u * cdf[-1]
        want = np.searchsorted(cdf, target, side="right")
        # a uniform within float32 rounding of a cell boundary may fall either side
        near = np.abs(cdf[np.minimum(want, v - 1)] - target) < 1e-5
        near |= np.abs(cdf[np.maximum(want - 1, 0)] - target) < 1e-5
        assert ((t == want) | near).all() and (t == want).mean() > 0.9


def test_iid_marginal_law_large_vocab():
    """n = 3 i.i.d. siblings from one V = 264 row (two-level inverse CDF): each sibling's
    marginal is the row (chi-square, cells with expected count < 5 pooled)."""
    rng = np.random.default_rng(264)
    p = rng.dirichlet(np.full(264, 0.5))
    probs = jnp.asarray(p, jnp.float32)
    keys = jax.random.split(jax.random.key(13), N_DRAWS)
    tokens = np.asarray(jax.jit(jax.vmap(lambda k: draw_iid(k, probs, 3)[0]))(keys))
    expected = np.asarray(probs, np.float64) / float(np.asarray(probs, np.float64).sum())
    for k in range(3):
        r = chisquare_gof(np.bincount(tokens[:, k], minlength=264), expected)
        assert r.pvalue > P_MIN / 3, f"sibling {k}: {r}\n{r.table()}"


@pytest.mark.parametrize("v", [37, 264, 1009, 32000])
def test_inverse_cdf_matches_float64_searchsorted(v):
    """The one- and two-level inverse CDF (blocks of ~sqrt(V), a tail block when V has no
    divisor near sqrt(V), e.g. the prime 1009) picks searchsorted(cdf, u * total, 'right')
    of the float64 cdf, except for uniforms within float32 rounding of a cell boundary;
    sparse rows never yield a zero-probability cell."""
    rng = np.random.default_rng(v)
    rows = rng.dirichlet(np.full(v, 0.3), size=64).astype(np.float32)
    keep = rng.random((32, v)) < 0.05
    keep[np.arange(32), rng.integers(0, v, 32)] = True
    rows[::2] *= keep  # sparse, unnormalized rows (at least one positive cell)
    rows[0] = 0.0
    rows[0, v - 1] = 2.0  # all mass in the last (tail) cell
    u = rng.random((64, 50)).astype(np.float32)
    got = np.asarray(jax.jit(jax.vmap(jax.vmap(numerics.inverse_cdf, in_axes=(0, None))))(u, rows))
    # the same draws with the 50 uniforms of a row passed together against it (broadcast)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(numerics.inverse_cdf))(u, rows)), got)
    cdf = np.cumsum(rows.astype(np.float64), axis=1)
    want = np.stack([np.searchsorted(cdf[i], u[i] * cdf[i, -1], side="right") for i in range(64)])
    assert (rows[np.arange(64)[:, None], got] > 0).all()
    near = np.abs(cdf[np.arange(64)[:, None], np.minimum(want, v - 1)] - u * cdf[:, -1:]) < 1e-5 * cdf[:, -1:]
    near |= np.abs(cdf[np.arange(64)[:, None], np.maximum(want - 1, 0)] - u * cdf[:, -1:]) < 1e-5 * cdf[:, -1:]
    assert ((got == want) | near).all()
    assert (got == want).mean() > 0.99


# --------------------------------------------------------------------------- input values


@pytest.mark.parametrize(
    "logits, where",
    [
        ([0.0, np.inf, 1.0, 2.0], r"logits\[1\] = inf"),
        ([0.0, 1.0, np.nan, 2.0], r"logits\[2\] = nan"),
        ([[0.0, 1.0], [np.nan, -np.inf]], r"logits\[1, 0\] = nan"),
    ],
)
def test_warp_rejects_nan_and_plus_inf_logits(logits, where):
    # +inf used to give [0, nan, 0, 0]; NaN silently got probability 0
    for f in (warp_probs, warp_logits):
        with pytest.raises(ValueError, match=where + r": expected a finite logit or -inf"):
            f(jnp.asarray(logits, jnp.float32))
    with pytest.raises(ValueError, match=where):
        warp_probs(np.asarray(logits), temperature=0.0)  # numpy input, greedy too


def test_warp_masked_logits_and_traced_logits_still_work():
    np.testing.assert_allclose(warp_probs(jnp.array([0.0, -jnp.inf, 0.0])), [0.5, 0.0, 0.5])
    np.testing.assert_array_equal(warp_probs(jnp.array([-jnp.inf, 1.0]), temperature=0.0), [0, 1])
    # traced logits pass unvalidated (no Python control flow on traced values): a NaN
    # logit raises nothing under jit and what it yields is unspecified, so only the shape
    # is checked for it; finite and -inf traced logits still give the warped law (numpy
    # reference below)
    out = jax.jit(warp_probs)(jnp.array([0.0, jnp.nan, 1.0]))
    assert out.shape == (3,)
    logits = jnp.array([[0.0, -jnp.inf, 1.0], [2.0, 0.5, -1.0]])
    out = np.asarray(jax.jit(functools.partial(warp_probs, temperature=0.5, top_k=2))(logits))
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
    e = np.exp(2.0 * np.array([[0.0, -np.inf, 1.0], [2.0, 0.5, -np.inf]]))  # T = 0.5, top-2
    np.testing.assert_allclose(out, e / e.sum(axis=-1, keepdims=True), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(), (3, 0)])
def test_warp_needs_a_vocabulary_axis(shape):
    with pytest.raises(ValueError, match=r"logits: expected .*vocabulary axis.*got shape " + re_shape(shape)):
        warp_probs(jnp.zeros(shape))
    with pytest.raises(ValueError, match=r"logits: expected .*vocabulary axis"):
        jax.jit(warp_probs)(jnp.zeros(shape))  # a shape is static: checked under jit too


def re_shape(shape):
    return re.escape(str(tuple(shape)))


BAD_ROWS = [
    ([0.5, np.nan, 0.25, 0.25], r"probs\[1\] = nan: expected finite, nonnegative probabilities"),
    ([0.5, -0.25, 0.5, 0.25], r"probs\[1\] = -0.25: expected finite, nonnegative probabilities"),
    ([0.5, np.inf, 0.0, 0.0], r"probs\[1\] = inf: expected finite"),
    ([1.0, 1.0, 1.0, 1.0], r"probs sums to 4; expected a law summing to 1 \(tolerance 0.001\)"),
    ([0.0, 0.0, 0.0, 0.0], r"probs sums to 0; expected"),
]


@pytest.mark.parametrize("row, match", BAD_ROWS)
@pytest.mark.parametrize("scheme", sampling.SCHEMES)
def test_draws_reject_bad_concrete_rows(scheme, row, match):
    with pytest.raises(ValueError, match=match):
        draw(jax.random.key(0), jnp.asarray(row, jnp.float32), 2, scheme)
    f = {"iid": lambda p: draw_iid(jax.random.key(0), p, 2),
         "without_replacement": lambda p: draw_without_replacement(jax.random.key(0), p, 2),
         "deterministic": lambda p: draw_deterministic(p, 2)}[scheme]
    with pytest.raises(ValueError, match=match):
        f(np.asarray(row))


@pytest.mark.parametrize("scheme", sampling.SCHEMES)
def test_draws_row_tolerance_and_traced_rows(scheme):
    from jaxspec.core.sampling import ROW_SUM_TOL as tol  # the tolerance speculative_accept uses

    near = jnp.array([0.5, 0.25, 0.25 + tol / 2, 0.0])  # within tolerance: fine
    draw(jax.random.key(0), near, 2, scheme)
    with pytest.raises(ValueError, match="sums to"):
        draw(jax.random.key(0), jnp.array([0.5, 0.25, 0.25 + 2 * tol, 0.0]), 2, scheme)
    # traced rows (generation drafts under jit and vmap) are data: not validated
    bad = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.25, 0.25, 0.25, 0.25]])
    keys = jax.random.split(jax.random.key(1), 2)
    tokens, laws = jax.jit(jax.vmap(lambda k, p: draw(k, p, 2, scheme)))(keys, bad)
    assert tokens.shape == (2, 2) and laws.shape == (2, 2, 4)


# --------------------------------------------------------------------------- boundary checks


@pytest.mark.parametrize("probs, match", [
    (jnp.array(1.0), r"probs: expected an array with a vocabulary axis \[\.\.\., V\], V >= 1, got shape \(\)"),
    (jnp.zeros((2, 0)), r"probs: expected an array with a vocabulary axis .* got shape \(2, 0\)"),
    (jnp.array([np.nan, 0.0, 1.0]), r"probs\[0\] = nan: expected finite, nonnegative"),
    (jnp.array([[0.5, 0.5], [0.5, -1.0]]), r"probs\[1, 1\] = -1\.0: expected finite, nonnegative"),
])
def test_sample_categorical_rejects_bad_rows(probs, match):
    with pytest.raises(ValueError, match=match):
        sample_categorical(jax.random.key(0), probs)


def test_sample_categorical_and_draws_check_the_key():
    row = jnp.array([0.5, 0.5])
    for call in (lambda k: sample_categorical(k, row), lambda k: draw_iid(k, row, 1),
                 lambda k: draw_without_replacement(k, row, 1)):
        with pytest.raises(ValueError, match=r"^key: expected a scalar jax.random.key"):
            call(0)
        with pytest.raises(ValueError, match=r"^key: expected a scalar jax.random.key"):
            call(jax.random.split(jax.random.key(0), 2))  # a batch of keys: vmap instead
        call(jax.random.PRNGKey(0))  # a legacy uint32[2] key is fine


@pytest.mark.parametrize("tokens, match", [
    (jnp.array([1.9, 0.2]), r"tokens: expected an integer dtype, got float32"),
    (1, r"tokens: expected a 1-D array of token ids int32\[n\], got shape \(\)"),
    (jnp.array([7]), r"tokens\[0\] = 7: expected a token id in \[0, 3\)"),
    (jnp.array([0, -1]), r"tokens\[1\] = -1: expected a token id in \[0, 3\)"),
])
def test_sibling_laws_rejects_bad_tokens(tokens, match):
    with pytest.raises(ValueError, match=match):
        sibling_laws(jnp.array([0.5, 0.3, 0.2]), tokens, "without_replacement")


def test_sibling_laws_rejects_bad_rows_but_not_traced_ones():
    with pytest.raises(ValueError, match=r"probs\[0\] = nan"):
        sibling_laws(jnp.array([np.nan, 0.5, 0.5]), jnp.array([1, 0]), "without_replacement")
    with pytest.raises(ValueError, match=r"probs: expected a 1-D draft row"):
        sibling_laws(jnp.full((2, 2), 0.5), jnp.array([1]), "iid")
    # traced rows and tokens are data (drafting under jit): shapes and dtypes only
    laws = jax.jit(lambda p, t: sibling_laws(p, t, "without_replacement"))(
        jnp.array([0.5, 0.3, 0.2]), jnp.array([1, 0]))
    np.testing.assert_allclose(laws[1], [5 / 7, 0.0, 2 / 7], atol=1e-6)
    with pytest.raises(ValueError, match="tokens: expected an integer dtype"):
        jax.jit(lambda p, t: sibling_laws(p, t, "iid"))(jnp.array([0.5, 0.5]), jnp.array([0.0]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_p="0.5"), r"top_p = '0.5': expected a number in \(0, 1\]"),
    (dict(temperature="1"), r"temperature = '1': expected a finite number >= 0"),
    (dict(temperature=True), r"temperature = True: expected"),
    (dict(top_p=np.bool_(True)), r"top_p = np\.True_: expected"),
    (dict(min_p="0.1"), r"min_p = '0.1': expected a number in \[0, 1\]"),
])
def test_warp_arguments_must_be_numbers(kwargs, match):
    with pytest.raises(ValueError, match=match):
        warp_probs(jnp.zeros(4), **kwargs)
    warp_probs(jnp.zeros(4), temperature=np.float32(0.5), top_p=np.array(0.9))  # numpy numbers are fine


def test_top_k_at_least_vocab_keeps_every_token():
    """Documented: exactly min(k, V) tokens are kept (k >= V is no truncation)."""
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    for k in (4, 10):
        np.testing.assert_allclose(warp_probs(logits, top_k=k), [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    np.testing.assert_allclose(warp_probs(logits, top_k=3), [0.0, 2 / 9, 3 / 9, 4 / 9], rtol=1e-6)


def test_row_sum_tolerance_follows_the_dtype():
    from jaxspec.core.sampling import ROW_SUM_TOL, row_sum_tol

    assert row_sum_tol(jnp.float32) == ROW_SUM_TOL == row_sum_tol(np.float64)
    assert row_sum_tol(jnp.bfloat16) == 2.0 ** -7  # bfloat16's epsilon: coarser than 1e-3
    assert row_sum_tol(jnp.float16) == ROW_SUM_TOL  # float16's epsilon 2**-10 < 1e-3
    # a bfloat16 law off by more than 1e-3 after rounding is still a law
    row = jnp.array([0.1, 0.2, 0.3, 0.4], jnp.bfloat16)
    assert abs(float(jnp.sum(row.astype(jnp.float32))) - 1) > ROW_SUM_TOL
    draw(jax.random.key(0), row, 2, "iid")
    with pytest.raises(ValueError, match=r"sums to 1\.1.*tolerance 0\.0078125"):
        draw(jax.random.key(0), jnp.array([0.2, 0.2, 0.3, 0.4], jnp.bfloat16), 2, "iid")


def test_temperature_beyond_float32_is_refused():
    """The logits are divided by the temperature in float32: 1e39 would overflow to inf."""
    with pytest.raises(ValueError, match=r"^temperature = 1e\+39: expected at most 3\.403e\+38"):
        validate_warp_args(temperature=1e39)
    validate_warp_args(temperature=3e38)  # large but a float32
