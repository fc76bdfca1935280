"""Statistics behind every exactness claim (docs/DESIGN.md §4). Plain numpy/scipy, not jitted.

* :func:`chisquare_gof` — counts vs an exact law (e.g. an enumerated target law).
* :func:`chisquare_two_sample` — two samples (e.g. speculative vs target-only) from one law?
* :func:`total_variation`, :func:`tv_upper_bound`, :func:`min_detectable_tv` — how close,
  and how close the test could have noticed.
* :func:`bonferroni`, :func:`table` — thresholds and readable failure messages.

Example::

    >>> counts = np.bincount(np.random.default_rng(0).integers(0, 4, 10_000), minlength=4)
    >>> r = chisquare_gof(counts, np.full(4, 0.25))
    >>> print(r)
    chi2=... dof=3 p=... n=10000
    >>> assert r.pvalue > bonferroni(1e-4, m=1), str(r) + "\\n" + r.table()

Sparse cells (expected count < ``min_expected``) are pooled into one cell, so that the χ²
approximation of the null distribution holds; the result records which cells were pooled.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
from scipy import optimize, stats

__all__ = [
    "ChiSquareResult",
    "chisquare_gof",
    "chisquare_two_sample",
    "total_variation",
    "tv_upper_bound",
    "min_detectable_tv",
    "bonferroni",
    "table",
]


@dataclasses.dataclass(frozen=True)
class ChiSquareResult:
    """Outcome of a χ² test.

    ``pooled_cells``: original cell indices merged into the single "pooled" cell (empty if
    none). ``observed``/``expected`` (float64[cells] or [2, cells] for two samples) and
    ``labels`` describe the cells actually tested, for :meth:`table`.
    """

    statistic: float
    dof: int
    pvalue: float
    n: int
    pooled_cells: tuple[int, ...] = ()
    note: str = ""
    observed: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)
    expected: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)
    labels: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        s = f"chi2={self.statistic:.4g} dof={self.dof} p={self.pvalue:.4g} n={self.n}"
        if self.pooled_cells:
            s += f" ({len(self.pooled_cells)} sparse cells pooled)"
        if self.note:
            s += f" [{self.note}]"
        return s

    def table(self, max_rows: int = 12) -> str:
        """Observed vs expected of the tested cells, worst first (see :func:`table`)."""
        if self.observed is None:
            return "(no cells)"
        return table(self.observed, self.expected, labels=self.labels or None, max_rows=max_rows)


# --------------------------------------------------------------------------- helpers


def _as_counts(counts, name: str) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of counts, got shape {c.shape}")
    if c.size and (not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(np.floor(c) != c)):
        raise ValueError(f"{name}: expected nonnegative integer counts, got {c!r}")
    return c.astype(np.float64)


def _as_probs(probs, shape) -> np.ndarray:
    """``probs`` as float64[K] of ``shape``: finite, nonnegative, summing to 1 (within
    1e-4); renormalized to sum exactly to 1."""
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != shape:
        raise ValueError(f"probs: expected shape {shape} (same as counts), got {p.shape}")
    if np.any(~np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(
            f"probs: expected finite nonnegative probabilities with a positive sum, got {p!r}"
        )
    if abs(p.sum() - 1.0) > 1e-4:
        raise ValueError(f"probs: expected probabilities summing to 1, got sum {p.sum():.6g}")
    return p / p.sum()


#: default pooling threshold of the χ² tests: cells expected to hold fewer observations are pooled
MIN_EXPECTED = 5.0


def _check_min_expected(x) -> float:
    """A finite pooling threshold >= 0 (0: no cell is sparse, nothing is pooled)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not (
        math.isfinite(float(x)) and float(x) >= 0.0
    ):
        raise ValueError(
            f"min_expected: expected a finite number >= 0 (0 disables pooling), got {x!r}"
        )
    return float(x)


def _check_int(x, name: str, lo: int, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < lo:
        raise ValueError(f"{name}: expected an int >= {lo} ({what}), got {x!r}")
    return int(x)


def pool_cells(crit: np.ndarray, min_expected: float) -> tuple[list[np.ndarray], np.ndarray]:
    """Group cell indices: dense cells alone, sparse ones (crit < min_expected) together.

    If the pooled group is still below ``min_expected`` it absorbs the dense cell with the
    smallest ``crit`` (lowest index on ties). Returns (groups, pooled indices).
    """
    idx = np.arange(crit.size)
    sparse = idx[crit < min_expected]
    dense = [int(i) for i in idx[crit >= min_expected]]
    if sparse.size == 0:
        return [np.array([i]) for i in dense], sparse
    pooled = sparse
    if crit[pooled].sum() < min_expected and dense:
        j = min(dense, key=lambda i: (crit[i], i))
        dense.remove(j)
        pooled = np.sort(np.append(pooled, j))
    return [np.array([i]) for i in dense] + [pooled], pooled


def _labels(groups, index_map) -> tuple[str, ...]:
    out = []
    for g in groups:
        if g.size == 1:
            out.append(str(int(index_map[g[0]])))
        else:
            out.append(f"pooled({g.size})")
    return tuple(out)


def _pvalue(stat: float, dof: int) -> float:
    if dof <= 0:
        return 1.0
    return float(stats.chi2.sf(stat, dof))


# --------------------------------------------------------------------------- tests


def chisquare_gof(counts, probs, *, min_expected: float = MIN_EXPECTED) -> ChiSquareResult:
    """χ² goodness of fit of ``counts`` int[K] to the law ``probs`` float[K].

    Cells with expected count ``n * probs < min_expected`` are pooled into one cell (grown
    by the smallest dense cell if still too small; ``min_expected = 0`` pools nothing, a
    finite number >= 0 is required); zero-probability cells without
    observations are dropped; observations in a zero-probability cell give ``pvalue == 0.0``
    (a certain rejection, statistic ``inf``). ``dof = cells - 1``; one cell -> p = 1.

    Example (pooling): ``counts = [50, 30, 15, 3, 2]``, ``probs = [.5, .3, .15, .03, .02]``
    -> cells 3 and 4 (expected 3 and 2) form one cell of expected 5; dof = 3.
    """
    min_expected = _check_min_expected(min_expected)
    c = _as_counts(counts, "counts")
    p = _as_probs(probs, c.shape)
    n = int(c.sum())
    if n == 0:
        raise ValueError("counts: expected at least one observation, got all zeros")

    zero = p == 0
    impossible = zero & (c > 0)
    keep = np.flatnonzero(~zero)
    expected_all = n * p
    groups, pooled = pool_cells(expected_all[keep], min_expected)
    obs = np.array([c[keep[g]].sum() for g in groups])
    exp = np.array([expected_all[keep[g]].sum() for g in groups])
    dof = len(groups) - 1
    pooled_cells = tuple(int(keep[i]) for i in pooled)
    labels = _labels(groups, keep)
    if impossible.any():
        bad = np.flatnonzero(impossible)
        note = (
            f"{int(c[bad].sum())} observations in zero-probability cells "
            f"{bad[:10].tolist()}{'...' if bad.size > 10 else ''}: certain rejection"
        )
        obs, exp = np.append(obs, c[bad]), np.append(exp, np.zeros(bad.size))
        labels = labels + tuple(f"{int(i)}(p=0)" for i in bad)
        return ChiSquareResult(math.inf, dof, 0.0, n, pooled_cells, note, obs, exp, labels)
    stat = float(np.sum((obs - exp) ** 2 / exp))
    note = "single cell after pooling: test is vacuous" if dof <= 0 else ""
    return ChiSquareResult(stat, dof, _pvalue(stat, dof), n, pooled_cells, note, obs, exp, labels)


def chisquare_two_sample(counts_a, counts_b, *, min_expected: float = MIN_EXPECTED) -> ChiSquareResult:
    """χ² homogeneity test: were ``counts_a`` and ``counts_b`` (int[K], any sizes) drawn
    from the same law?

    The 2 x K contingency table; expected ``E[r, j] = n_r * (a_j + b_j) / (n_a + n_b)``.
    Cells never observed are dropped; a cell is sparse when its *smaller* expected count,
    ``min(n_a, n_b) * (a_j + b_j) / N``, is below ``min_expected``; sparse cells are pooled
    as in :func:`chisquare_gof`. ``dof = cells - 1``; ``n = n_a + n_b``.

    Example: ``chisquare_two_sample([40, 60], [400, 600]).pvalue == 1.0``.
    """
    min_expected = _check_min_expected(min_expected)
    a = _as_counts(counts_a, "counts_a")
    b = _as_counts(counts_b, "counts_b")
    if a.shape != b.shape:
        raise ValueError(f"counts_b: expected shape {a.shape} (same as counts_a), got {b.shape}")
    na, nb = a.sum(), b.sum()
    if na == 0 or nb == 0:
        name = "counts_a" if na == 0 else "counts_b"
        raise ValueError(f"{name}: expected at least one observation, got all zeros")
    total = na + nb
    comb = a + b
    keep = np.flatnonzero(comb > 0)
    crit = min(na, nb) * comb[keep] / total
    groups, pooled = pool_cells(crit, min_expected)
    obs = np.array([[a[keep[g]].sum() for g in groups], [b[keep[g]].sum() for g in groups]])
    col = obs.sum(axis=0)
    exp = np.stack([na * col / total, nb * col / total])
    dof = len(groups) - 1
    stat = float(np.sum((obs - exp) ** 2 / exp))
    note = f"n_a={int(na)} n_b={int(nb)}"
    if dof <= 0:
        note += "; single cell after pooling: test is vacuous"
    return ChiSquareResult(
        stat, dof, _pvalue(stat, dof), int(total), tuple(int(keep[i]) for i in pooled),
        note, obs, exp, _labels(groups, keep),
    )


# --------------------------------------------------------------------------- distances


def total_variation(counts, probs) -> float:
    """TV between the empirical law of ``counts`` int[K] and ``probs`` float[K]:
    ``0.5 * sum |counts / n - probs|``. Example: ``total_variation([3, 1], [.5, .5]) == .25``.
    ``probs`` is checked as in :func:`chisquare_gof` (finite, nonnegative, sums to 1).
    """
    c = _as_counts(counts, "counts")
    p = _as_probs(probs, c.shape)
    n = c.sum()
    if n == 0:
        raise ValueError("counts: expected at least one observation, got all zeros")
    return float(0.5 * np.abs(c / n - p).sum())


def tv_upper_bound(counts, probs, *, alpha: float = 1e-3) -> float:
    """Upper confidence bound, level ``1 - alpha``, on TV(true law, ``probs``).

    Uses the L1 deviation inequality of Weissman et al. (2003),
    ``P(||p_hat - p||_1 >= eps) <= (2^K - 2) exp(-n eps^2 / 2)``, so with probability
    ``>= 1 - alpha``: ``TV(p_hat, p) < sqrt(2 (K ln 2 + ln(1/alpha)) / n) / 2``; the bound is
    ``total_variation(counts, probs)`` plus that radius (triangle inequality), capped at 1.
    Valid for any n (no asymptotics) but loose for large K.
    """
    check_alpha(alpha, "alpha")
    c = _as_counts(counts, "counts")
    k, n = c.size, c.sum()
    radius = 0.5 * math.sqrt(2.0 * (k * math.log(2.0) + math.log(1.0 / alpha)) / n)
    return min(1.0, total_variation(c, probs) + radius)


def min_detectable_tv(n: int, k: int, *, alpha: float, power: float = 0.9) -> float:
    """Approximate TV such that *every* law at least that far from the null is rejected by a
    level-``alpha`` χ² test on ``n`` samples over ``k`` cells with probability ``>= power``.

    Approximation: under an alternative ``p1`` the statistic is noncentral χ²(k - 1, λ) with
    ``λ = n * chi2div(p1 || p0)``; let λ* solve ``P(ncx2(k-1, λ*) > crit_alpha) = power``.
    Cauchy–Schwarz gives ``chi2div >= 4 TV^2``, so ``TV >= sqrt(λ* / n) / 2`` guarantees
    ``λ >= λ*``. Returns ``sqrt(λ* / n) / 2`` (ignores pooling; local-alternative asymptotics).

    Example: ``min_detectable_tv(10**6, 16, alpha=1e-4)`` ≈ 0.0035.
    """
    check_alpha(alpha, "alpha")
    check_alpha(power, "power")
    n = _check_int(n, "n", 1, "the number of samples")
    k = _check_int(k, "k", 2, "the number of cells")
    df = k - 1
    crit = stats.chi2.isf(alpha, df)

    def excess(lam):
        return stats.ncx2.sf(crit, df, lam) - power

    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
    lam = optimize.brentq(excess, 0.0, hi, xtol=1e-10, rtol=1e-10)
    return 0.5 * math.sqrt(lam / n)


# --------------------------------------------------------------------------- reporting


def check_alpha(x, name):
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0.0 < float(x) < 1.0:
        raise ValueError(f"{name}: expected a number in (0, 1), got {x!r}")


def bonferroni(alpha_family: float, m: int) -> float:
    """Per-test level for ``m`` tests with family-wise error ``alpha_family``:
    ``alpha_family / m``. Example: ``bonferroni(1e-3, 10) == 1e-4``."""
    check_alpha(alpha_family, "alpha_family")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m: expected the number of tests, an int >= 1, got {m!r}")
    return alpha_family / m


def table(observed, expected, *, labels=None, max_rows: int = 12) -> str:
    """Short observed-vs-expected listing, largest standardized residuals first.

    ``observed``, ``expected``: float[K] (or [R, K], e.g. the two rows of a two-sample
    test, listed as ``cell/row``); ``labels``: one per cell (K, default ``0..K-1``);
    ``max_rows``: an int >= 0, the rest summarized as ``... m more cells``. Example::

        >>> print(table([12, 8], [10, 10]))
        cell    observed      expected  (o-e)/sqrt(e)
           0          12         10.00          +0.63
           1           8         10.00          -0.63
    """
    max_rows = _check_int(max_rows, "max_rows", 0, "cells listed")
    o = np.atleast_2d(np.asarray(observed, dtype=np.float64))
    e = np.atleast_2d(np.asarray(expected, dtype=np.float64))
    if o.ndim != 2:
        raise ValueError(f"observed: expected float[K] or [R, K], got shape {o.shape}")
    if o.shape != e.shape:
        raise ValueError(f"expected: expected shape {o.shape} (same as observed), got {e.shape}")
    rows, k = o.shape
    base = list(labels) if labels is not None else [str(i) for i in range(k)]
    if len(base) != k:
        raise ValueError(f"labels: expected {k} labels (one per cell), got {len(base)}: {labels!r}")
    names, obs, exp = [], o.ravel(), e.ravel()
    for r in range(rows):
        names += [b if rows == 1 else f"{b}/{'ab'[r] if rows == 2 else r}" for b in base]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(exp > 0, (obs - exp) / np.sqrt(exp), np.where(obs > 0, np.inf, 0.0))
    order = np.argsort(-np.abs(z), kind="stable")
    w = max([4, *(len(str(s)) for s in names)])
    lines = [f"{'cell':>{w}}  {'observed':>10}  {'expected':>12}  (o-e)/sqrt(e)"]
    for i in order[:max_rows]:
        lines.append(f"{names[i]:>{w}}  {obs[i]:>10.0f}  {exp[i]:>12.2f}  {z[i]:>+13.2f}")
    if order.size > max_rows:
        lines.append(f"... {order.size - max_rows} more cells")
    return "\n".join(lines)
