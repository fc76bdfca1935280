"""The statistics behind exactness claims (jaxspec.stats). Fixed seeds throughout."""

import math

import numpy as np
import pytest
import scipy.stats

from jaxspec.exactness.stats import (
    ChiSquareResult,
    bonferroni,
    chisquare_gof,
    chisquare_two_sample,
    min_detectable_tv,
    table,
    total_variation,
    tv_upper_bound,
)


def test_exact_uniform_sample_accepted():
    rng = np.random.default_rng(0)
    k, n = 16, 200_000
    counts = rng.multinomial(n, np.full(k, 1 / k))
    r = chisquare_gof(counts, np.full(k, 1 / k))
    assert r.dof == k - 1 and r.n == n and r.pooled_cells == ()
    assert r.pvalue > 1e-4, f"{r}\n{r.table()}"


def test_shifted_law_rejected():
    rng = np.random.default_rng(1)
    k, n = 16, 200_000
    shifted = np.full(k, 1 / k)
    shifted[0] += 0.01
    shifted[1] -= 0.01
    counts = rng.multinomial(n, shifted)
    r = chisquare_gof(counts, np.full(k, 1 / k))
    assert r.pvalue < 1e-12, str(r)
    # the detectable-TV approximation agrees that TV 0.01 is within reach
    assert min_detectable_tv(n, k, alpha=1e-6) < 0.01


def test_pooling_literal_example():
    # expected = [50, 30, 15, 3, 2]: cells 3, 4 pooled into one cell of expected 5
    r = chisquare_gof([52, 28, 14, 4, 2], [0.5, 0.3, 0.15, 0.03, 0.02])
    assert r.pooled_cells == (3, 4) and r.dof == 3
    np.testing.assert_allclose(r.observed, [52, 28, 14, 6])
    np.testing.assert_allclose(r.expected, [50, 30, 15, 5])
    stat = 4 / 50 + 4 / 30 + 1 / 15 + 1 / 5
    assert math.isclose(r.statistic, stat)
    assert math.isclose(r.pvalue, scipy.stats.chi2.sf(stat, 3))
    # expected = [60, 36, 2, 1, 1]: pooled cell has 4 < 5 -> absorbs the smallest dense cell
    r = chisquare_gof([60, 36, 2, 1, 1], [0.6, 0.36, 0.02, 0.01, 0.01])
    assert r.pooled_cells == (1, 2, 3, 4) and r.dof == 1
    np.testing.assert_allclose(r.expected, [60, 40])
    assert "pooled" in str(r) and "pooled(4)" in r.table()


def test_matches_scipy_unpooled():
    counts = np.array([18, 22, 31, 29])
    probs = np.array([0.2, 0.2, 0.3, 0.3])
    r = chisquare_gof(counts, probs)
    ref = scipy.stats.chisquare(counts, probs * counts.sum())
    assert math.isclose(r.statistic, ref.statistic, rel_tol=1e-12)
    assert math.isclose(r.pvalue, ref.pvalue, rel_tol=1e-9)
    assert r.dof == 3


def test_zero_probability_cell_with_observations_is_certain_rejection():
    r = chisquare_gof([500, 499, 1], [0.5, 0.5, 0.0])
    assert r.pvalue == 0.0 and math.isinf(r.statistic)
    assert "zero-probability" in r.note and "[2]" in r.note
    assert "2(p=0)" in r.table().splitlines()[1]  # the worst cell is listed first
    # zero-probability cells without observations are simply dropped
    r = chisquare_gof([500, 500, 0], [0.5, 0.5, 0.0])
    assert r.dof == 1 and r.pvalue == 1.0


def test_two_sample_same_and_different():
    rng = np.random.default_rng(2)
    p = np.array([0.4, 0.3, 0.2, 0.09, 0.01])
    a = rng.multinomial(100_000, p)
    b = rng.multinomial(37_000, p)  # different sizes
    r = chisquare_two_sample(a, b)
    assert r.dof == 4 and r.n == 137_000 and r.pvalue > 1e-4, f"{r}\n{r.table()}"
    q = np.array([0.38, 0.32, 0.2, 0.09, 0.01])
    r = chisquare_two_sample(a, rng.multinomial(37_000, q))
    assert r.pvalue < 1e-6, str(r)
    # against scipy's contingency test on an unpooled table (no Yates: dof > 1)
    ref = scipy.stats.chi2_contingency(np.stack([a, b]), correction=False)
    r = chisquare_two_sample(a, b)
    assert math.isclose(r.statistic, ref.statistic, rel_tol=1e-10) and r.dof == ref.dof


def test_two_sample_pooling_and_empty_cells():
    # N = 401, min(n_a, n_b) = 200: cells 2, 3 have smaller expected 200*3/401 = 1.5 and
    # 200*4/401 = 2.0 -> pooled (3.5 < 5) and grown by the smallest dense cell (1);
    # cell 4 is never observed -> dropped
    r = chisquare_two_sample([100, 98, 1, 1, 0], [99, 97, 2, 3, 0])
    assert r.pooled_cells == (1, 2, 3) and r.dof == 1
    assert r.observed.tolist() == [[100, 100], [99, 102]]
    # pooled cells 2, 3: 200*6/392 = 3.06 each -> 6.1 >= 5, nothing else absorbed
    r = chisquare_two_sample([100, 90, 3, 3], [100, 90, 3, 3])
    assert r.pooled_cells == (2, 3) and r.dof == 2 and r.statistic == 0.0


def test_distances_and_bounds():
    assert total_variation([3, 1], [0.5, 0.5]) == 0.25
    ub = tv_upper_bound([5000, 5000], [0.5, 0.5], alpha=1e-3)
    assert math.isclose(ub, 0.5 * math.sqrt(2 * (2 * math.log(2) + math.log(1e3)) / 10_000))
    # the bound covers the truth on a shifted sample
    rng = np.random.default_rng(3)
    p0, p1 = np.full(8, 1 / 8), np.array([0.2, 0.05] + [0.125] * 6)
    true_tv = 0.5 * np.abs(p1 - p0).sum()
    assert tv_upper_bound(rng.multinomial(50_000, p1), p0) >= true_tv
    # detectable TV shrinks like 1/sqrt(n)
    a, b = min_detectable_tv(10_000, 16, alpha=1e-4), min_detectable_tv(40_000, 16, alpha=1e-4)
    assert math.isclose(a / b, 2.0, rel_tol=1e-6)
    assert 0.003 < min_detectable_tv(10**6, 16, alpha=1e-4) < 0.004


def test_bonferroni_table_and_str():
    assert bonferroni(1e-3, 10) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="m: .*got 0"):
        bonferroni(1e-3, 0)
    with pytest.raises(ValueError, match="alpha_family"):
        bonferroni(2.0, 3)
    t = table([12, 8, 10], [10, 10, 10])
    lines = t.splitlines()
    assert lines[0].split()[:3] == ["cell", "observed", "expected"] and len(lines) == 4
    assert lines[1].split()[0] == "0" and lines[-1].split()[-1] == "+0.00"
    r = ChiSquareResult(3.5, 2, 0.17, 1000)
    s = str(r)
    assert "chi2=3.5" in s and "dof=2" in s and "p=0.17" in s and "n=1000" in s


def test_input_validation_names_argument():
    with pytest.raises(ValueError, match="probs: .*summing to 1"):
        chisquare_gof([1, 2], [0.5, 0.6])
    with pytest.raises(ValueError, match="probs: expected shape"):
        chisquare_gof([1, 2], [1.0])
    with pytest.raises(ValueError, match="counts: "):
        chisquare_gof([1.5, 2], [0.5, 0.5])
    with pytest.raises(ValueError, match="counts_b"):
        chisquare_two_sample([1, 2], [0, 0])
    with pytest.raises(ValueError, match="alpha"):
        tv_upper_bound([1, 2], [0.5, 0.5], alpha=0.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "5", True, None])
def test_min_expected_validated(bad):
    # NaN used to pool nothing and keep nothing: a 'pass' with dof = -1, p = 1
    with pytest.raises(ValueError, match=r"min_expected: expected a finite number >= 0") as e:
        chisquare_gof([50, 50], [0.5, 0.5], min_expected=bad)
    assert repr(bad) in str(e.value)
    with pytest.raises(ValueError, match=r"min_expected: "):
        chisquare_two_sample([50, 50], [40, 60], min_expected=bad)


def test_min_expected_zero_disables_pooling():
    counts, probs = [50, 30, 15, 3, 2], [0.5, 0.3, 0.15, 0.03, 0.02]
    r = chisquare_gof(counts, probs, min_expected=0)
    assert r.pooled_cells == () and r.dof == 4
    expected = scipy.stats.chisquare(counts, 100 * np.asarray(probs))
    assert math.isclose(r.pvalue, expected.pvalue, rel_tol=1e-9)
    r = chisquare_two_sample([100, 90, 3, 3], [100, 90, 3, 3], min_expected=0.0)
    assert r.pooled_cells == () and r.dof == 3


@pytest.mark.parametrize(
    "probs, match",
    [
        ([0.5, 1.0, 1.5, 2.0], r"probs: expected probabilities summing to 1, got sum 5"),
        ([float("nan"), 0.2, 0.3, 0.4], r"probs: expected finite nonnegative"),
        ([-0.1, 0.3, 0.4, 0.4], r"probs: expected finite nonnegative"),
        ([0.25, 0.25, 0.5], r"probs: expected shape \(4,\)"),
    ],
)
def test_total_variation_validates_probs(probs, match):
    c = [10, 20, 30, 40]
    with pytest.raises(ValueError, match=match):
        total_variation(c, probs)
    with pytest.raises(ValueError, match=match):
        tv_upper_bound(c, probs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n": 2.5}, "n"),
        ({"n": float("nan")}, "n"),
        ({"n": True}, "n"),
        ({"n": 0}, "n"),
        ({"k": 4.5}, "k"),
        ({"k": 1}, "k"),
    ],
)
def test_min_detectable_tv_validates_counts(kwargs, name):
    args = {"n": 1000, "k": 4, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}: expected an int") as e:
        min_detectable_tv(args["n"], args["k"], alpha=0.01)
    assert repr(kwargs[name]) in str(e.value)
    # numpy integers are sample counts too
    assert min_detectable_tv(np.int64(1000), np.int32(4), alpha=0.01) == min_detectable_tv(1000, 4, alpha=0.01)


def test_table_validates_labels_and_max_rows():
    o, e = [12, 8, 10, 9], [10, 10, 10, 10]
    with pytest.raises(ValueError, match=r"labels: expected 4 labels \(one per cell\), got 1"):
        table(o, e, labels=["a"])
    with pytest.raises(ValueError, match=r"labels: expected 2 labels"):
        table([[1, 2], [3, 4]], [[2, 2], [3, 3]], labels=["a", "b", "c", "d"])
    for bad in (-1, 2.5, True, None):
        with pytest.raises(ValueError, match=r"max_rows: expected an int >= 0") as err:
            table(o, e, max_rows=bad)
        assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match=r"max_rows: "):
        ChiSquareResult(1.0, 1, 0.3, 10, observed=np.array([5.0, 5.0]),
                        expected=np.array([5.0, 5.0])).table(max_rows=-1)
    with pytest.raises(ValueError, match=r"observed: expected .*\[K\] or \[R, K\]"):
        table(np.ones((2, 2, 2)), np.ones((2, 2, 2)))
    # the valid forms still work: labels per cell, max_rows = 0 lists only the summary
    lines = table(o, e, labels="abcd", max_rows=2).splitlines()
    assert [s.split()[0] for s in lines[1:3]] == ["a", "b"] and lines[-1] == "... 2 more cells"
    assert table(o, e, max_rows=0).splitlines()[1:] == ["... 4 more cells"]
    assert len(table([], []).splitlines()) == 1  # header only (was a TypeError)
