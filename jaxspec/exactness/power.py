"""How many samples a test needs to have power: the sample counts behind a report's
``samples_needed`` (:func:`jaxspec.verify`), each the fewest at which one of its planned
tests could reject at all."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _scipy_stats

from jaxspec.exactness import stats

__all__ = ["binomial_min_pvalue", "gof_samples", "binomial_samples", "tv_samples"]


def binomial_min_pvalue(n: int, e: float) -> float:
    """The smallest p-value of the two-sided exact binomial test of ``Binomial(n, e)`` over
    every outcome: that of an extreme (0 or ``n``; the law is unimodal)."""
    return min(float(_scipy_stats.binomtest(k, n, e).pvalue) for k in (0, n))


def gof_samples(probs) -> int:
    """The fewest samples for which the χ² pooling of ``probs`` leaves at least two cells
    (dof >= 1); 1 for a law of one cell."""
    p = np.asarray(probs, np.float64)
    p = p[p > 0]
    if p.size < 2:
        return 1
    q = np.sort(p)[::-1]
    # two dense cells, or one dense cell and a dense pool of the others
    m = max(float(q[1]), min(float(q[0]), float(q[1:].sum())))
    if m * 2**53 <= stats.MIN_EXPECTED:  # a sliver of mass off one cell: a lower bound is enough
        return 2**53
    n = max(1, math.ceil(stats.MIN_EXPECTED / m))
    while len(stats.pool_cells(n * p, stats.MIN_EXPECTED)[0]) < 2:
        n += 1
    return n


def binomial_samples(e: float, threshold: float) -> int:
    """The fewest samples whose most extreme outcome rejects ``Binomial(n, e)`` at ``threshold``."""
    m = min(e, 1.0 - e)
    n = 1 if m <= 0.0 else max(1, math.floor(math.log(threshold) / math.log(m)))
    while n > 1 and binomial_min_pvalue(n - 1, e) <= threshold:
        n -= 1
    while binomial_min_pvalue(n, e) > threshold:
        n += 1
    return n


def tv_samples(n: int, mdt: float, bound: float) -> int:
    """The fewest samples whose smallest detectable TV is below ``bound``, from its value
    ``mdt`` at ``n`` samples (it scales as ``1 / sqrt(n)``)."""
    return max(1, math.floor(n * (mdt / bound) ** 2) + 1)
