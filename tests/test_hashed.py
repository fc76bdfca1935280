"""The hashed two-sample test (jaxspec/exactness/hashed.py): the fixed hash (pinned values,
and a pure-Python reading of the docstring's definition), and the test's level and power
on samples drawn with numpy. Its end-to-end use on the decoder (V = 4 next to the
enumeration, V = 49,152 on every mutant) is in tests/test_pit.py."""

import numpy as np
import pytest

from jaxspec.exactness.hashed import hash_cells, hashed_tests, hashed_two_sample

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _splitmix(z):
    z = (z + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _reference(row, num_cells, seed=0):
    """The docstring's hash with Python integers (modulo 2^64 by hand)."""
    h = _splitmix(seed)
    for x in row:
        h = ((h ^ (x & MASK)) * GOLDEN) & MASK
        h ^= h >> 32
    return _splitmix(h) % num_cells


def test_pinned_values():
    rows = [[1, 2, 3], [3, 2, 1], [-1, -1, -1], [0, 0, 0]]
    assert hash_cells(rows, 1 << 16).tolist() == [15655, 64736, 26488, 43851]
    assert hash_cells([[1, 2, 3]], 64, seed=7).tolist() == [25]
    assert hash_cells([[1, 2, 3]], 2**63 + 5).tolist() == [8402618744585403682]


def test_matches_the_documented_definition():
    rng = np.random.default_rng(0)
    rows = rng.integers(-1, 49_152, (200, 6))
    for cells, seed in ((64, 0), (1000, 3), (2**40 + 1, 2**63)):
        got = hash_cells(rows, cells, seed)
        assert got.tolist() == [_reference(r, cells, seed) for r in rows.tolist()]
        assert got.dtype == np.int64 and got.min() >= 0 and got.max() < cells


def test_spreads_rows_evenly():
    rows = np.stack(np.meshgrid(np.arange(200), np.arange(200), indexing="ij"), -1).reshape(-1, 2)
    counts = np.bincount(hash_cells(rows, 16), minlength=16)  # 40,000 distinct rows
    assert counts.min() > 2300 and counts.max() < 2700  # 2500 +- ~8 sd of the multinomial


def _sample(rng, n, length, sharp):
    """int[n, length]: a Markov chain over 1000 tokens (a fixed random transition table);
    ``sharp`` scales its logits."""
    table = np.random.default_rng(5).standard_normal((1000, 1000)) * sharp
    p = np.exp(table - table.max(1, keepdims=True))
    c = np.cumsum(p / p.sum(1, keepdims=True), axis=1)
    x = np.zeros((n, length), np.int64)
    prev = np.zeros(n, np.int64)
    for t in range(length):
        x[:, t] = np.minimum((rng.random((n, 1)) > c[prev]).sum(1), 999)
        prev = x[:, t]
    return x


def test_level_and_power_on_numpy_samples():
    """Two samples of 4000 rows of 5 tokens from one law pass (p > 1e-3 each prefix length,
    Bonferroni); from laws with logit scales 3.0 and 2.6 they are rejected (adjusted
    p < 1e-6)."""
    rng = np.random.default_rng(1)
    a, b = _sample(rng, 4000, 5, 3.0), _sample(rng, 4000, 5, 3.0)
    r = hashed_tests(a, b, num_cells=64)
    print(r.summary())
    assert r.passed and r.lengths == (1, 2, 3, 4, 5)
    c = _sample(rng, 4000, 5, 2.6)
    r = hashed_tests(a, c, num_cells=64)
    print(r.summary())
    assert r.min_pvalue * len(r.tests) < 1e-6


def test_two_sample_of_identical_counts_is_one():
    x = np.arange(40).reshape(20, 2)
    assert hashed_two_sample(x, x, num_cells=4).pvalue == pytest.approx(1.0)


@pytest.mark.parametrize("call, message", [
    (lambda: hash_cells(np.zeros(3, int), 4), r"samples = .*expected int\[S, L\]"),
    (lambda: hash_cells(np.zeros((2, 2), int), 0), r"num_cells = 0: expected an integer >= 1"),
    (lambda: hash_cells(np.zeros((2, 2), int), 4, seed=-1), r"seed = -1: expected an integer in \[0, 2\*\*64\)"),
    (lambda: hashed_two_sample(np.zeros((2, 2), int), np.zeros((2, 3), int)), r"samples_b = .*expected 2 tokens"),
    (lambda: hashed_tests(np.zeros((2, 2), int), np.zeros((2, 2), int), lengths=(3,)), r"lengths = .*\[1, 2\]"),
    (lambda: hashed_tests(np.zeros((2, 2), float), np.zeros((2, 2), int)), r"samples_a = 'float64\[2, 2\]'"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
