"""Numerical kernels shared by the draws and the acceptance rules: exact float32 sums
and prefix sums, the inverse-CDF draw, and the clipped likelihood ratio.

Pure ``jnp``; shapes are ``[..., V]`` with the vocabulary last. Sums go through ``matmul``
with ``precision=HIGHEST`` rather than ``jnp.sum`` / ``cumsum``: that keeps full float32
accuracy on TPU and GPU (whose default matmul precision drops mantissa bits), and XLA's
CPU backend runs a long fused reduce or a ``cumsum`` scan slower than a vectorized matmul
(benchmarks/README.md, acceptance throughput).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "HIGHEST", "ONE_LEVEL_MAX_V", "clean", "prefix_sums", "sum_last", "first_above", "block_size",
    "inverse_cdf", "accept_ratio",
]


def clean(probs):
    """float32, negative / NaN entries -> +0.0."""
    p = jnp.asarray(probs, jnp.float32)
    return jnp.where(p > 0, p, 0.0)


#: vocabularies up to this size get a one-level inverse CDF; larger ones two levels
ONE_LEVEL_MAX_V = 64


HIGHEST = lax.Precision.HIGHEST  # exact f32 sums on every backend (no bf16 / TF32 passes)


def prefix_sums(x):
    """Inclusive prefix sums over the last axis as a product with a constant upper
    triangle: one vectorized matmul instead of ``cumsum``'s log-depth scan (which XLA's
    CPU backend runs as a chain of slices). ``precision=HIGHEST`` keeps full float32
    accuracy on TPU and GPU, whose default matmul precision drops mantissa bits."""
    m = x.shape[-1]
    tri = np.triu(np.ones((m, m), np.float32))  # tri[i, j] = 1 if i <= j
    return jnp.matmul(x, tri, precision=HIGHEST)


def sum_last(x):
    """Sum over the last axis as a product with a ones vector (``precision=HIGHEST``):
    XLA's CPU backend runs a fused elementwise-then-reduce over a long row slower than
    materializing it and calling its vectorized matmul."""
    return jnp.matmul(x, np.ones((x.shape[-1],), np.float32), precision=HIGHEST)


def first_above(p, cdf, target):
    """int32[...]: the first cell with ``p > 0`` and ``cdf > target``; if none qualifies
    (``target`` rounded up to the total) the last cell with ``p > 0``; 0 if ``p`` has no
    positive cell. A masked first-index search, so a float32 prefix sum that is not
    exactly monotone can never select a zero-probability cell.

    One min-reduction over a key that ranks every qualifying cell (by index) before every
    other positive cell (by reverse index) before the rest -- XLA's CPU backend runs
    ``argmax`` (a two-operand reduction) slower than a plain ``min``.
    """
    v = p.shape[-1]
    iota = jnp.arange(v, dtype=jnp.int32)
    pos = p > 0
    hit = pos & (cdf > target[..., None])
    key = jnp.min(jnp.where(hit, iota, jnp.where(pos, 2 * v - 1 - iota, 2 * v)), axis=-1)
    return jnp.where(key < v, key, jnp.where(key < 2 * v, 2 * v - 1 - key, 0)).astype(jnp.int32)


def block_size(v: int) -> int:
    """Cells per block of the two-level search: a divisor of V near sqrt(V) when there
    is one (no tail block), else ceil(sqrt(V))."""
    root = math.isqrt(v - 1) + 1
    for d in range(root, 2 * root + 1):
        if v % d == 0:
            return d
    for d in range(root - 1, max(root // 2, 1) - 1, -1):
        if v % d == 0:
            return d
    return root


def inverse_cdf(u, probs):
    """int32[...]: inverse-CDF draw with uniforms ``u`` from ``probs`` [..., V]
    (unnormalized is fine: the target is ``u * total``). ``u``'s shape broadcasts
    against ``probs.shape[:-1]`` (e.g. ``n`` uniforms for one shared row: :func:`draw_iid`);
    the result has the broadcast shape, and a row shared by several uniforms is summed
    once (``jnp.vectorize`` batches only the axes an argument has).
    """
    u = jnp.asarray(u, jnp.float32)
    if u.shape != jnp.shape(probs)[:-1]:
        return jnp.vectorize(_inverse_cdf_rows, signature="(),(v)->()")(u, probs)
    return _inverse_cdf_rows(u, probs)


def _inverse_cdf_rows(u, probs):
    """:func:`inverse_cdf` for ``u`` [...] and ``probs`` [..., V] with the same leading
    shape.

    Semantics of ``searchsorted(cdf, u * total, side='right')``: the first cell whose
    cumulative mass exceeds the target; never a zero-probability cell (see
    :func:`first_above`); a row with no positive cell returns 0.

    Small V: one prefix sum. Large V: two levels -- sums of blocks of about sqrt(V)
    cells (one fused pass over the row, nothing V-wide is written), the first block whose
    cumulative mass exceeds the target, then the first cell within that block whose
    cumulative mass exceeds what is left. The law is the same (exact in real
    arithmetic); the work is one read of the row plus O(sqrt(V)^2).
    """
    p = clean(probs)  # [..., V]
    v = p.shape[-1]
    if v <= ONE_LEVEL_MAX_V:
        cdf = prefix_sums(p)  # [..., V]
        return first_above(p, cdf, u * cdf[..., -1])
    bs = block_size(v)
    nfull, tail = divmod(v, bs)
    lead = p.shape[:-1]
    main = p[..., : nfull * bs].reshape(*lead, nfull, bs)  # [..., nfull, bs]
    bsum = sum_last(main)  # [..., nfull]
    if tail:
        last = jnp.pad(p[..., nfull * bs :], [(0, 0)] * len(lead) + [(0, bs - tail)])  # [..., bs]
        bsum = jnp.concatenate([bsum, sum_last(last)[..., None]], axis=-1)
    bcdf = prefix_sums(bsum)  # [..., nb]
    target = u * bcdf[..., -1]
    b = first_above(bsum, bcdf, target)  # [...], a block with positive mass (or 0)
    before = jnp.where(
        b > 0, jnp.take_along_axis(bcdf, jnp.maximum(b - 1, 0)[..., None], axis=-1)[..., 0], 0.0
    )
    row = jnp.take_along_axis(main, jnp.minimum(b, nfull - 1)[..., None, None], axis=-2)[..., 0, :]
    if tail:
        row = jnp.where((b == nfull)[..., None], last, row)  # [..., bs]
    j = first_above(row, prefix_sums(row), target - before)
    return (b * bs + j).astype(jnp.int32)


def accept_ratio(px, qx):
    """min(1, p/q) without NaN/inf: q == 0 -> 1 if p > 0 else 0."""
    safe_q = jnp.where(qx > 0, qx, 1.0)
    return jnp.where(qx > 0, jnp.minimum(1.0, px / safe_q), (px > 0).astype(px.dtype))
