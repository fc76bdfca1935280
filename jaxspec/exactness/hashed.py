"""A two-sample exactness test that needs no enumeration: hashed cells.

Under exactness the speculative decoder's ``L`` tokens have the target-only law, so *any*
fixed function of them has the same law under both decoders. :func:`hash_cells` is such a
function onto ``B`` cells; :func:`hashed_tests` runs the two-sample χ² of
:func:`~jaxspec.exactness.stats.chisquare_two_sample` on the cell counts of the two samples,
for the hash of each prefix of the first ``k`` tokens (``k`` in ``lengths``, default 1 .. L:
short prefixes keep the law's few likely sequences in cells of their own, where a long one
spreads a large vocabulary's sequences thinly over every cell), Bonferroni over the lengths::

    spec = generate(key, target, draft, prompts, max_new_tokens=L, stop_tokens=()).tokens
    ref = generate_autoregressive(key2, target, prompts, max_new_tokens=L, stop_tokens=()).tokens
    result = hashed_tests(spec, ref, num_cells=64, alpha=1e-3)
    assert result.passed, result.summary()

It complements the enumeration path (small V) and the PIT (:mod:`jaxspec.exactness.pit`,
one law at a time): it compares whole sequences, with no model in the test.

The hash (fixed; numpy ``uint64`` arithmetic wraps modulo 2^64 on every platform)::

    h = splitmix64(seed)
    for each token x (as int64, so -1 is 2^64 - 1): h = (h ^ x) * 0x9E3779B97F4A7C15; h ^= h >> 32
    cell = splitmix64(h) mod B

``splitmix64(z)``: ``z += 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspec.checks import is_int
from jaxspec.errors import SettingError
from jaxspec.exactness import stats

__all__ = ["GOLDEN", "hash_cells", "HashedResult", "hashed_two_sample", "hashed_tests"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """uint64[...] -> uint64[...] (the SplitMix64 output function, wrapping)."""
    z = z + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _check_samples(samples, name: str) -> np.ndarray:
    s = np.asarray(samples)
    if s.ndim != 2 or 0 in s.shape or not np.issubdtype(s.dtype, np.integer):
        raise SettingError({name: f"{s.dtype}{list(s.shape)}"}, "expected int[S, L] with S, L >= 1")
    return s.astype(np.int64)


def hash_cells(samples, num_cells: int, seed: int = 0) -> np.ndarray:
    """int64[S]: the cell in ``[0, num_cells)`` of each row of ``samples`` int[S, L] (token
    ids; ``-1`` after a row's end is a value like any other), by the hash of the module
    docstring. Deterministic across platforms; ``seed`` (an integer >= 0) picks another
    hash from the same family.

    Example: ``hash_cells([[1, 2, 3]], 1 << 16)`` is ``[...]`` on every machine (the
    values are pinned in tests/test_hashed.py)."""
    s = _check_samples(samples, "samples")
    if not is_int(num_cells) or num_cells < 1:
        raise SettingError({"num_cells": num_cells}, "expected an integer >= 1")
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise SettingError({"seed": seed}, "expected an integer in [0, 2**64)")
    with np.errstate(over="ignore"):
        h = np.full(s.shape[0], _splitmix64(np.array([seed], np.uint64))[0], np.uint64)  # [S]
        for t in range(s.shape[1]):
            h = (h ^ s[:, t].astype(np.uint64)) * GOLDEN
            h ^= h >> np.uint64(32)
        return (_splitmix64(h) % np.uint64(num_cells)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class HashedResult:
    """Two-sample χ² tests on hashed cells, one per prefix length. ``tests``: the
    :class:`~jaxspec.exactness.stats.ChiSquareResult` of each length in ``lengths``;
    ``detectable``: per test, the smallest TV between the two laws *of the hashed cells*
    that the test detects with power 0.9 at ``threshold``
    (:func:`~jaxspec.exactness.stats.min_detectable_tv` with the smaller sample's size)."""

    lengths: tuple[int, ...]
    tests: tuple[stats.ChiSquareResult, ...]
    detectable: tuple[float, ...]
    num_cells: int
    threshold: float

    @property
    def passed(self) -> bool:
        return all(r.pvalue > self.threshold for r in self.tests)

    @property
    def min_pvalue(self) -> float:
        return min(r.pvalue for r in self.tests)

    def summary(self) -> str:
        head = (f"hashed two-sample chi2 ({self.num_cells} cells): {'passed' if self.passed else 'REJECTED'} "
                f"(threshold {self.threshold:.2g} each)")
        return "\n".join([head] + [f"  first {k} tokens: {r} (detects TV {d:.3g})"
                                   for k, r, d in zip(self.lengths, self.tests, self.detectable)])


def hashed_two_sample(samples_a, samples_b, *, num_cells: int = 64, seed: int = 0) -> stats.ChiSquareResult:
    """Two-sample χ² of the hashed cells of ``samples_a`` int[Sa, L] and ``samples_b``
    int[Sb, L] (the same ``L``; any sample sizes)."""
    a, b = _check_samples(samples_a, "samples_a"), _check_samples(samples_b, "samples_b")
    if a.shape[1] != b.shape[1]:
        raise SettingError({"samples_b": f"[{b.shape[0]}, {b.shape[1]}]"},
                           f"expected {a.shape[1]} tokens a row, as samples_a has")
    ca = np.bincount(hash_cells(a, num_cells, seed), minlength=num_cells)  # [B]
    cb = np.bincount(hash_cells(b, num_cells, seed), minlength=num_cells)  # [B]
    return stats.chisquare_two_sample(ca, cb)


def hashed_tests(samples_a, samples_b, *, num_cells: int = 64, lengths=None, seed: int = 0,
                 alpha: float = 1e-3) -> HashedResult:
    """:func:`hashed_two_sample` of the first ``k`` tokens of every row, for each ``k`` in
    ``lengths`` (default ``1 .. L``), family-wise ``alpha`` split by Bonferroni."""
    a, b = _check_samples(samples_a, "samples_a"), _check_samples(samples_b, "samples_b")
    horizon = a.shape[1]
    lengths = tuple(range(1, horizon + 1)) if lengths is None else tuple(lengths)
    if not lengths or any(not is_int(k) or not 1 <= k <= horizon for k in lengths):
        raise SettingError({"lengths": lengths}, f"expected prefix lengths in [1, {horizon}]")
    stats.check_alpha(alpha, "alpha")
    threshold = stats.bonferroni(alpha, len(lengths))
    tests = tuple(hashed_two_sample(a[:, :k], b[:, :k], num_cells=num_cells, seed=seed) for k in lengths)
    n = min(a.shape[0], b.shape[0])
    detect = tuple(stats.min_detectable_tv(n, max(r.dof + 1, 2), alpha=threshold) for r in tests)
    return HashedResult(lengths, tests, detect, int(num_cells), threshold)
