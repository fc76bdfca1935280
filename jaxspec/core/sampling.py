"""Probability warps and draft-side draws (see docs/DESIGN.md §2).

Two halves:

* **Warps** turn logits into the law being sampled: temperature, then top-k, then top-p
  (the Hugging Face order). The same function defines the target law and the draft's
  proposal law, so ``q`` is always computed exactly as the draws were made.
* **Draws** propose sibling tokens from a draft row and return, next to each token, the
  exact law it was drawn from (``q_k`` of DESIGN §2). :func:`sibling_laws` is the single
  definition of those laws; the acceptance rule uses the same laws in closed form (the
  draft row restricted to the untried tokens over their mass, or a point mass once that
  mass is 0), checked against it in tests/test_accept.py.

Example (V = 4)::

    >>> probs = warp_probs(jnp.log(jnp.array([0.1, 0.4, 0.2, 0.3])), top_k=2)
    >>> # keeps tokens 1 and 3: [0, 4/7, 0, 3/7]
    >>> tokens, laws = draw_without_replacement(jax.random.key(0), probs, 2)
    >>> # tokens is a permutation of [1, 3]; laws[0] = probs, laws[1] = one-hot(tokens[1])

Everything is pure ``jnp``, float32, and works under ``jax.jit`` and ``jax.vmap``
(``top_k``, ``n`` and ``scheme`` are static Python values).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxspec.errors import SettingError
from jaxspec.core.numerics import clean, inverse_cdf

__all__ = [
    "SCHEMES",
    "Warp",
    "validate_warp_args",
    "warp_probs",
    "warp_logits",
    "top_k_mask",
    "top_p_mask",
    "sample_categorical",
    "sibling_laws",
    "draw_iid",
    "draw_without_replacement",
    "draw_deterministic",
    "draw",
]

SCHEMES = ("iid", "without_replacement", "deterministic")


# --------------------------------------------------------------------------- validation


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _concrete_float(x):
    """``float(x)`` for a concrete scalar, ``None`` for a traced value."""
    if _is_traced(x):
        return None
    try:
        return float(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"expected a real scalar, got {x!r}") from e


def _index(shape, flat: int) -> str:
    """``[i]`` or ``[i, j, ...]`` for flat index ``flat`` into ``shape``."""
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def _check_logits(logits):
    """float32[..., V] logits; the shape always, the values when concrete.

    A shape is static, so it is checked under ``jit`` too. Concrete values may be finite
    or ``-inf`` (a masked token); NaN and ``+inf`` (including float32 overflow) have no
    law and raise. Traced values pass unvalidated.
    """
    x = jnp.asarray(logits, jnp.float32)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"logits: expected an array with a vocabulary axis [..., V], V >= 1, got shape {x.shape}"
        )
    if not _is_traced(x):
        a = np.asarray(x)
        bad = np.isnan(a) | (a == np.inf)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            orig = np.asarray(logits).ravel()[i] if not _is_traced(logits) else a.ravel()[i]
            raise ValueError(
                f"logits{_index(a.shape, i)} = {float(orig)!r}: expected a finite logit or -inf "
                f"(a masked token) in float32"
            )
    return x


def check_key(key):
    """The PRNG key argument as a typed key array: a scalar ``jax.random.key`` (traced or
    not) as is, a legacy ``uint32[2]`` ``PRNGKey`` wrapped; anything else -> ``ValueError``
    naming ``key``."""
    try:
        arr = key if isinstance(key, jax.Array) else jnp.asarray(key)
    except Exception:
        arr = None
    if arr is not None and jnp.issubdtype(arr.dtype, jax.dtypes.prng_key) and arr.shape == ():
        return arr
    if arr is not None and arr.dtype == jnp.uint32 and arr.shape == (2,):
        return jax.random.wrap_key_data(arr)
    raise ValueError(
        f"key: expected a scalar jax.random.key (or a legacy uint32[2] PRNGKey), got {key!r}"
    )


_F32_MAX = float(np.finfo(np.float32).max)


def _real_number(x) -> float:
    """``float(x)`` for a real number (a Python or numpy number, a 0-d array); a string,
    a bool or anything else ``float`` would coerce -> ``TypeError``."""
    if isinstance(x, (str, bytes, bool, np.bool_)) or (hasattr(x, "dtype") and (
            jnp.issubdtype(x.dtype, jnp.bool_) or not jnp.issubdtype(x.dtype, jnp.number))):
        raise TypeError(f"not a real number: {x!r}")
    return float(x)


def validate_warp_args(temperature=1.0, top_k=None, top_p=None, min_p=None) -> None:
    """Check concrete warp arguments; traced ``temperature``/``top_p``/``min_p`` are skipped.

    Raises :class:`~jaxspec.checks.SettingError` (a ``ValueError``) naming the argument, the
    bad value and what was expected::

        >>> validate_warp_args(temperature=-1.0)
        Traceback (most recent call last):
        jaxspec.errors.SettingError: temperature = -1.0: expected a finite number >= 0 (0 means greedy)
    """
    if not _is_traced(temperature):
        greedy = "expected a finite number >= 0 (0 means greedy)"
        try:
            t = _real_number(temperature)
        except (TypeError, ValueError):
            raise SettingError({"temperature": temperature}, greedy) from None
        if not math.isfinite(t) or t < 0:
            raise SettingError({"temperature": temperature}, greedy)
        if t > _F32_MAX:
            raise SettingError({"temperature": temperature}, f"expected at most {_F32_MAX:.4g} (the largest "
                               "float32 number; the logits are divided by it in float32)")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
            raise SettingError({"top_k": top_k}, "expected an integer >= 1 (or None: no top-k)")
    for name, value, lo_open, what in (("top_p", top_p, True, "(0, 1] (or None: no top-p)"),
                                       ("min_p", min_p, False, "[0, 1] (or None: no min-p)")):
        if value is None or _is_traced(value):
            continue
        try:
            x = _real_number(value)
        except (TypeError, ValueError):
            raise SettingError({name: value}, f"expected a number in {what}") from None
        if not ((0.0 < x if lo_open else 0.0 <= x) and x <= 1.0):  # also rejects NaN
            raise SettingError({name: value}, f"expected a number in {what}")


# --------------------------------------------------------------------------- warps


def top_k_mask(logits, k: int):
    """bool[..., V]: exactly ``min(k, V)`` largest entries, ties broken by lowest index.

    Example: ``top_k_mask([1., 3., 3., 3.], 2) == [F, T, T, F]``.
    """
    x = jnp.asarray(logits, jnp.float32)  # [..., V]
    v = x.shape[-1]
    k = min(int(k), v)
    kth = lax.top_k(x, k)[0][..., -1:]  # [..., 1] the k-th largest value
    above = x > kth  # strictly inside
    tie = x == kth  # IEEE compare: -0.0 == 0.0
    n_tie_slots = k - jnp.sum(above, axis=-1, keepdims=True)  # >= 1
    return above | (tie & (jnp.cumsum(tie, axis=-1) <= n_tie_slots))


def top_p_mask(probs, top_p):
    """bool[..., V]: smallest prefix (probability descending, ties by lowest index) whose
    cumulative mass is >= ``top_p``; at least one token. ``top_p >= 1`` keeps everything.

    Example: ``top_p_mask([.25, .25, .25, .25], .5) == [T, T, F, F]`` and
    ``top_p_mask([.2, .5, .3], .75) == [F, T, T]``.
    """
    p = jnp.asarray(probs, jnp.float32)  # [..., V]
    desc = -jnp.sort(-p, axis=-1)  # [..., V] values, descending
    cum = jnp.cumsum(desc, axis=-1)
    exclusive = jnp.concatenate([jnp.zeros_like(cum[..., :1]), cum[..., :-1]], axis=-1)
    n_keep = jnp.maximum(jnp.sum(exclusive < top_p, axis=-1, keepdims=True), 1)  # [..., 1]
    kth = jnp.take_along_axis(desc, n_keep - 1, axis=-1)  # [..., 1]
    above = p > kth
    tie = p == kth
    n_tie_slots = n_keep - jnp.sum(above, axis=-1, keepdims=True)
    keep = above | (tie & (jnp.cumsum(tie, axis=-1) <= n_tie_slots))
    return keep | (jnp.asarray(top_p) >= 1.0)


def _normalize_masked(z, mask):
    """softmax of ``z`` restricted to ``mask``; never NaN (all-masked -> all zeros)."""
    m = jnp.max(jnp.where(mask, z, -jnp.inf), axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(mask, jnp.exp(z - m), 0.0)
    s = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(s > 0, s, 1.0), s > 0


def warp_probs(logits, *, temperature=1.0, top_k: int | None = None, top_p=None, min_p=None):
    """float32[..., V] law defined by temperature, then top-k, then top-p, then min-p.

    * ``temperature == 0``: greedy, a one-hot at the argmax (ties -> lowest index).
      Python floats branch statically; a traced temperature selects with ``jnp.where``.
    * ``top_k`` (static int): exactly ``min(k, V)`` tokens kept (a ``k >= V`` keeps
      every token, as Hugging Face's top-k does), boundary ties -> lowest index. The
      ranking uses the raw float32 logits (a positive temperature does not change the
      order in exact arithmetic, and dividing first could round distinct logits together).
    * ``top_p``: applied to the renormalized top-k law (:func:`top_p_mask`).
    * ``min_p``: keeps the tokens whose probability is at least ``min_p`` times the largest
      one's (Hugging Face's and vLLM's min-p), read from the law after temperature, top-k
      and top-p (the ratio of two kept tokens does not depend on which others were cut).
      The most likely token always stays; ``min_p = 0`` keeps every token, ``1`` only the
      most likely (and its exact ties).
    * ``-inf`` logits get probability exactly 0. If every logit is ``-inf`` (no valid
      law) the result is a one-hot at index 0 instead of NaN.
    * Concrete logits must be finite or ``-inf``: NaN or ``+inf`` raises ``ValueError``
      (traced logits are not checked). ``logits`` needs a vocabulary axis (ndim >= 1).

    Example::

        >>> probs = warp_probs(jnp.log(jnp.array([.1, .2, .3, .4])), top_k=3, top_p=0.5)
        >>> (probs * 7).round(4).tolist()   # [0, 0, 3/7, 4/7]: top-3 -> [0, 2/9, 3/9, 4/9] -> mass >= .5 needs 2 tokens
        [0.0, 0.0, 3.0, 4.0]
    """
    validate_warp_args(temperature, top_k, top_p, min_p)
    x = _check_logits(logits)  # [..., V]
    v = x.shape[-1]
    greedy = jax.nn.one_hot(jnp.argmax(x, axis=-1), v, dtype=jnp.float32)  # [..., V]
    t_static = _concrete_float(temperature)
    if t_static == 0.0:
        return greedy

    t = jnp.asarray(temperature, jnp.float32)
    t_safe = jnp.where(t > 0, t, 1.0)
    m = jnp.max(x, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    z = (x - m) / t_safe  # [..., V], <= 0 or -inf: no overflow for tiny temperatures
    mask = x > -jnp.inf
    if top_k is not None:
        mask = mask & top_k_mask(x, top_k)
    probs, ok = _normalize_masked(z, mask)
    if top_p is not None and not (_concrete_float(top_p) == 1.0):
        mask = mask & top_p_mask(probs, top_p)
        probs, ok = _normalize_masked(z, mask)
    if min_p is not None and not (_concrete_float(min_p) == 0.0):
        top = jnp.max(probs, axis=-1, keepdims=True)  # [..., 1]
        mask = mask & (probs >= jnp.asarray(min_p, jnp.float32) * top)
        probs, ok = _normalize_masked(z, mask)
    probs = jnp.where(ok, probs, greedy)
    if t_static is None:
        probs = jnp.where(t == 0, greedy, probs)
    return probs


def warp_logits(logits, *, temperature=1.0, top_k: int | None = None, top_p=None, min_p=None):
    """float32[..., V] log of :func:`warp_probs` (``-inf`` where the probability is 0)."""
    return jnp.log(warp_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))


@dataclasses.dataclass(frozen=True)
class Warp:
    """The static half of a warp (hashable): ``top_k``, ``top_p``, ``min_p``. The
    temperature is a traced scalar passed at call time, so temperatures share one
    compilation."""

    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __call__(self, logits, temperature):
        """float32[..., V] law: temperature, then top-k, top-p and min-p
        (:func:`warp_probs`; ``temperature == 0`` is greedy)."""
        return warp_probs(logits, temperature=temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)



# --------------------------------------------------------------------------- categorical


#: tolerance for "rows sum to 1" when probability rows are checked outside jit (the draws
#: here and :func:`jaxspec.speculative_accept`); see :func:`row_sum_tol` for low precision
ROW_SUM_TOL = 1e-3


def row_sum_tol(dtype) -> float:
    """The row-sum tolerance for rows stored in ``dtype``: :data:`ROW_SUM_TOL`, or the
    dtype's machine epsilon when that is coarser (a bfloat16 row of a law sums to 1 only
    within a few of its ulps: 2**-7 for bfloat16)."""
    if not jnp.issubdtype(dtype, jnp.floating):
        return ROW_SUM_TOL
    return max(ROW_SUM_TOL, float(jnp.finfo(dtype).eps))

def sample_categorical(key, probs):
    """int32[...]: one exact draw per row of (possibly unnormalized) ``probs`` [..., V].

    One uniform per draw, inverse CDF in float32. Never returns a zero-probability token
    and never NaNs; a row summing to 0 returns index 0. Concrete ``probs`` must be finite
    and nonnegative (``ValueError`` otherwise; traced ones are not checked).

        >>> int(sample_categorical(jax.random.key(0), jnp.array([0., 2., 0., 1.]))) in (1, 3)
        True
    """
    key = check_key(key)
    if np.ndim(probs) == 0 or np.shape(probs)[-1] == 0:
        raise ValueError(
            f"probs: expected an array with a vocabulary axis [..., V], V >= 1, got shape {np.shape(probs)}"
        )
    _check_law_values(probs, "probs", normalized=False)
    p = jnp.asarray(probs, jnp.float32)
    u = jax.random.uniform(key, p.shape[:-1], jnp.float32)
    return inverse_cdf(u, p)


# --------------------------------------------------------------------------- sibling laws


def _check_row(probs, n: int, *, distinct: bool):
    """The draft row as float32[V]: shape and ``n`` always; when the row is concrete,
    finite, nonnegative entries summing to 1 within :func:`row_sum_tol`
    (the tolerance :func:`~jaxspec.core.rules.speculative_accept` checks its rows with).
    Traced rows (drafting under ``jit``/``vmap``) pass unvalidated."""
    p = jnp.asarray(probs, jnp.float32)
    if p.ndim != 1:
        raise ValueError(f"probs: expected a 1-D draft row float32[V], got shape {p.shape}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n: expected a static Python int >= 1, got {n!r}")
    if distinct and n > p.shape[0]:
        raise ValueError(
            f"n: expected at most V={p.shape[0]} distinct siblings for this scheme, got {n}"
        )
    _check_law_values(probs, "probs", normalized=True)
    return p


def _check_law_values(probs, name: str, *, normalized: bool) -> None:
    """Concrete ``probs`` [..., V]: finite and nonnegative, and with ``normalized`` each
    row summing to 1 within :func:`row_sum_tol` of its dtype; ``ValueError`` naming
    ``name``, the entry and the value. Traced values are not checked."""
    if _is_traced(probs):
        return
    a = np.asarray(probs)
    tol = row_sum_tol(a.dtype)
    a = a.astype(np.float64)
    bad = ~(np.isfinite(a) & (a >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ValueError(
            f"{name}{_index(a.shape, i)} = {float(a.ravel()[i])!r}: expected finite, "
            "nonnegative probabilities"
        )
    if normalized:
        sums = a.sum(axis=-1).reshape(-1)
        off = np.flatnonzero(np.abs(sums - 1.0) > tol)
        if off.size:
            where = "" if a.ndim == 1 else _index(a.shape[:-1], int(off[0]))
            raise ValueError(
                f"{name}{where} sums to {sums[off[0]]:.6g}; expected a law summing to 1 "
                f"(tolerance {tol:g})"
            )


def array_dtype(x):
    """The dtype of an array or of a (nested) list / scalar as numpy reads it."""
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def check_tokens(tokens, v: int, name: str = "tokens") -> jax.Array:
    """``tokens`` as int32[n]: 1-D and of an integer dtype always, ids in ``[0, v)`` when
    concrete; ``ValueError`` naming ``name`` otherwise."""
    shape = np.shape(tokens)
    dtype = array_dtype(tokens)
    if len(shape) != 1:
        raise ValueError(f"{name}: expected a 1-D array of token ids int32[n], got shape {shape}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{name}: expected an integer dtype, got {dtype}")
    if not _is_traced(tokens):
        t = np.asarray(tokens)
        bad = np.flatnonzero((t < 0) | (t >= v))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name}[{i}] = {int(t[i])}: expected a token id in [0, {v})")
    return jnp.asarray(tokens, jnp.int32)


def check_scheme(scheme):
    """The one check of a sibling-scheme argument (draws, the acceptance rule, generate)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme = {scheme!r}; expected one of {', '.join(SCHEMES)}")


def sibling_laws(probs, tokens, scheme: str):
    """float32[n, V]: the law ``q_k`` each sibling ``tokens[k]`` was drawn from.

    This is the one definition shared by the draws below and the acceptance rule.
    ``probs`` float32[V] is the draft row, ``tokens`` int32[n] the siblings in order
    (``ValueError`` for other shapes or dtypes, and for concrete rows that are not a law
    or concrete tokens outside ``[0, V)``).

    * ``iid``: every law is ``probs`` itself (bit-for-bit).
    * ``without_replacement``: ``q_0 = probs`` (bit-for-bit); for k >= 1, ``probs`` with
      ``tokens[:k]`` set to 0, divided by its float32 sum. If that sum is 0 (support
      exhausted) ``q_k`` is a one-hot on ``tokens[k]`` (the sibling was a deterministic
      choice). The same one-hot is used for k = 0 if the row itself sums to 0.
    * ``deterministic``: one-hot on ``tokens[k]`` (duplicates allowed).

    Example, ``probs = [.5, .3, .2, 0]``, ``tokens = [1, 0, 2]``, without replacement::

        q_0 = [.5, .3, .2, 0],  q_1 = [5/7, 0, 2/7, 0],  q_2 = [0, 0, 1, 0]
    """
    check_scheme(scheme)
    if np.ndim(probs) != 1 or np.shape(probs)[0] == 0:
        raise ValueError(f"probs: expected a 1-D draft row float32[V], V >= 1, got shape {np.shape(probs)}")
    _check_law_values(probs, "probs", normalized=True)
    p = jnp.asarray(probs, jnp.float32)  # [V]
    return _sibling_laws(p, check_tokens(tokens, p.shape[0]), scheme)


def _sibling_laws(p, tokens, scheme: str):
    """:func:`sibling_laws` of checked ``p: float32[V]``, ``tokens: int32[n]``."""
    v, n = p.shape[-1], tokens.shape[0]
    onehot = jax.nn.one_hot(tokens, v, dtype=jnp.float32)  # [n, V]
    if scheme == "iid":
        return jnp.broadcast_to(p, (n, v))
    if scheme == "deterministic":
        return onehot
    # removed[k, j]: token j is among tokens[:k]
    removed = jnp.cumsum(onehot, axis=0) - onehot > 0  # [n, V]
    masked = jnp.where(removed, 0.0, p)  # [n, V]
    total = jnp.sum(masked, axis=-1, keepdims=True)  # [n, 1]
    renorm = masked / jnp.where(total > 0, total, 1.0)
    first = (jnp.arange(n) == 0)[:, None]
    laws = jnp.where(first, p, renorm)
    return jnp.where(total > 0, laws, onehot)


# --------------------------------------------------------------------------- draws


def draw_iid(key, probs, n: int):
    """``n`` i.i.d. draws from ``probs`` float32[V] -> (tokens int32[n], laws float32[n, V]).

    Every law equals ``probs``. One uniform per draw (:func:`sample_categorical`).
    A concrete row is checked as in :func:`draw`.
    """
    key = check_key(key)
    p = _check_row(probs, n, distinct=False)
    u = jax.random.uniform(key, (n,), jnp.float32)
    tokens = inverse_cdf(u, p)  # one cdf, n uniforms -> [n]
    return tokens, _sibling_laws(p, tokens, "iid")


def draw_without_replacement(key, probs, n: int):
    """Sequential sampling without replacement -> (tokens int32[n], laws float32[n, V]).

    Gumbel-top-k on ``log(probs)``: ordered top-n of ``log p + Gumbel`` has exactly the law
    of drawing from ``probs``, removing the token, renormalizing, drawing again, ...
    ``laws[k]`` is :func:`sibling_laws` (``probs`` with ``tokens[:k]`` zeroed, renormalized).

    Support exhaustion: if fewer than ``n`` tokens have positive probability, siblings
    ``m, m+1, ...`` (``m`` = support size) are the zero-probability tokens in increasing
    index order — deterministic, distinct from the earlier ones — and each law is a
    one-hot on the chosen token. (The acceptance rule then accepts such a sibling with
    probability ``p(x)``: still lossless.) Requires ``n <= V``; a concrete row is checked
    as in :func:`draw`.
    """
    key = check_key(key)
    p = _check_row(probs, n, distinct=True)
    v = p.shape[0]
    pc = clean(p)
    pos = pc > 0
    g = jax.random.gumbel(key, (v,), jnp.float32)
    keys = jnp.where(pos, jnp.log(jnp.where(pos, pc, 1.0)) + g, -jnp.inf)
    top = lax.top_k(keys, n)[1]  # [n] positive tokens first, by Gumbel key
    m = jnp.sum(pos)
    # j-th zero-probability token by index, j = 0..n-1
    zero_rank = jnp.cumsum(~pos) - 1  # [V]
    want = jnp.arange(n)[:, None]  # [n, 1]
    zeros_in_order = jnp.argmax((~pos)[None, :] & (zero_rank[None, :] == want), axis=-1)
    k = jnp.arange(n)
    fill = zeros_in_order[jnp.clip(k - m, 0, n - 1)]
    tokens = jnp.where(k < m, top, fill).astype(jnp.int32)
    return tokens, _sibling_laws(p, tokens, "without_replacement")


def draw_deterministic(probs, n: int):
    """Top-``n`` tokens of ``probs`` float32[V] (ties -> lowest index); laws one-hot.

    Example: ``draw_deterministic([.1, .3, .3, .3], 2)`` -> tokens ``[1, 2]``. A concrete
    row is checked as in :func:`draw`.
    """
    p = _check_row(probs, n, distinct=True)
    tokens = lax.top_k(clean(p), n)[1].astype(jnp.int32)  # lower index first on ties
    return tokens, _sibling_laws(p, tokens, "deterministic")


def draw(key, probs, n: int, scheme: str):
    """Dispatch to :func:`draw_iid`, :func:`draw_without_replacement` or
    :func:`draw_deterministic` (which ignores ``key``). ``scheme`` must be static.

    A concrete ``probs`` row must be a law: finite, nonnegative, summing to 1 within
    :func:`row_sum_tol` (else ``ValueError``); traced rows are not checked.
    """
    check_scheme(scheme)
    if scheme == "iid":
        return draw_iid(key, probs, n)
    if scheme == "without_replacement":
        return draw_without_replacement(key, probs, n)
    return draw_deterministic(probs, n)
