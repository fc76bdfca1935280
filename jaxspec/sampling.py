"""Probability warps and draft-side draws (see DESIGN.md §2).

Two halves:

* **Warps** turn logits into the law being sampled: temperature, then top-k, then top-p
  (the Hugging Face order). The same function defines the target law and the draft's
  proposal law, so ``q`` is always computed exactly as the draws were made.
* **Draws** propose sibling tokens from a draft row and return, next to each token, the
  exact law it was drawn from (``q_k`` of DESIGN §2). :func:`sibling_laws` is the single
  definition of those laws; the acceptance rule derives ``q_k`` with it too, so that the
  laws used to accept are bit-for-bit the laws used to draw.

Example (V = 4)::

    >>> probs = warp_probs(jnp.log(jnp.array([0.1, 0.4, 0.2, 0.3])), top_k=2)
    >>> # keeps tokens 1 and 3: [0, 4/7, 0, 3/7]
    >>> tokens, laws = draw_without_replacement(jax.random.key(0), probs, 2)
    >>> # tokens is a permutation of [1, 3]; laws[0] = probs, laws[1] = one-hot(tokens[1])

Everything is pure ``jnp``, float32, and works under ``jax.jit`` and ``jax.vmap``
(``top_k``, ``n`` and ``scheme`` are static Python values).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "SCHEMES",
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


def validate_warp_args(temperature=1.0, top_k=None, top_p=None) -> None:
    """Check concrete warp arguments; traced ``temperature``/``top_p`` are skipped.

    Raises ``ValueError`` naming the argument, the bad value and what was expected::

        >>> validate_warp_args(temperature=-1.0)
        ValueError: temperature: expected a finite number >= 0 (0 means greedy), got -1.0
    """
    if not _is_traced(temperature):
        try:
            t = float(temperature)
        except (TypeError, ValueError):
            raise ValueError(
                f"temperature: expected a finite number >= 0 (0 means greedy), got {temperature!r}"
            ) from None
        if not math.isfinite(t) or t < 0:
            raise ValueError(
                f"temperature: expected a finite number >= 0 (0 means greedy), got {temperature!r}"
            )
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
            raise ValueError(f"top_k: expected None or a static Python int >= 1, got {top_k!r}")
    if top_p is not None and not _is_traced(top_p):
        try:
            p = float(top_p)
        except (TypeError, ValueError):
            raise ValueError(f"top_p: expected None or a number in (0, 1], got {top_p!r}") from None
        if not (0.0 < p <= 1.0):  # also rejects NaN
            raise ValueError(f"top_p: expected None or a number in (0, 1], got {top_p!r}")


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


def draft_warp_args(scheme, temperature, top_k, top_p, draft_temperature=None,
                    draft_top_k=None, draft_top_p=None):
    """The draft's proposal warp ``(temperature, top_k, top_p)``: each ``draft_*`` left as
    ``None`` inherits the target's value under the sampling schemes (``iid``,
    ``without_replacement``); under ``deterministic`` (the draft only ranks candidates) it
    means temperature 1 and no top-k / top-p. The one rule shared by generation, the
    exactness harness and acceptance measurement."""
    defaults = (1.0, None, None) if scheme == "deterministic" else (temperature, top_k, top_p)
    given = (draft_temperature, draft_top_k, draft_top_p)
    return tuple(d if g is None else g for d, g in zip(defaults, given))


def warp_probs(logits, *, temperature=1.0, top_k: int | None = None, top_p=None):
    """float32[..., V] law defined by temperature, then top-k, then top-p.

    * ``temperature == 0``: greedy, a one-hot at the argmax (ties -> lowest index).
      Python floats branch statically; a traced temperature selects with ``jnp.where``.
    * ``top_k`` (static int): exactly k tokens kept, boundary ties -> lowest index. The
      ranking uses the raw float32 logits (a positive temperature does not change the
      order in exact arithmetic, and dividing first could round distinct logits together).
    * ``top_p``: applied to the renormalized top-k law (:func:`top_p_mask`).
    * ``-inf`` logits get probability exactly 0. If every logit is ``-inf`` (no valid
      law) the result is a one-hot at index 0 instead of NaN.

    Example::

        >>> warp_probs(jnp.log(jnp.array([.1, .2, .3, .4])), top_k=3, top_p=0.5)
        [0, 0, 3/7, 4/7]        # top-3 -> [0, 2/9, 3/9, 4/9] -> mass >= .5 needs 2 tokens
    """
    validate_warp_args(temperature, top_k, top_p)
    x = jnp.asarray(logits, jnp.float32)  # [..., V]
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
    probs = jnp.where(ok, probs, greedy)
    if t_static is None:
        probs = jnp.where(t == 0, greedy, probs)
    return probs


def warp_logits(logits, *, temperature=1.0, top_k: int | None = None, top_p=None):
    """float32[..., V] log of :func:`warp_probs` (``-inf`` where the probability is 0)."""
    return jnp.log(warp_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p))


# --------------------------------------------------------------------------- categorical


def _clean(probs):
    """float32, negative / NaN entries -> +0.0."""
    p = jnp.asarray(probs, jnp.float32)
    return jnp.where(p > 0, p, 0.0)


def _inverse_cdf(u, probs):
    """int32[...]: inverse-CDF draw with uniforms ``u`` [...] from ``probs`` [..., V].

    Semantics of ``searchsorted(cdf, u * total, side='right')`` (first index whose cdf
    exceeds the target), evaluated as a masked first-index reduction so that a parallel
    float32 cumsum that is not exactly monotone can never select a zero-probability
    token. If no cell qualifies (``u * total`` rounded up to ``total``) the last
    positive-probability token is returned; if the total is 0, index 0.
    """
    p = _clean(probs)  # [..., V]
    v = p.shape[-1]
    cdf = jnp.cumsum(p, axis=-1)  # [..., V]
    total = cdf[..., -1]  # [...]
    target = (u * total)[..., None]  # [..., 1]
    pos = p > 0
    hit = pos & (cdf > target)
    first = jnp.argmax(hit, axis=-1)
    last_pos = v - 1 - jnp.argmax(pos[..., ::-1], axis=-1)  # == v - 1 if none positive
    any_pos = jnp.any(pos, axis=-1)
    out = jnp.where(jnp.any(hit, axis=-1), first, jnp.where(any_pos, last_pos, 0))
    return out.astype(jnp.int32)


def sample_categorical(key, probs):
    """int32[...]: one exact draw per row of (possibly unnormalized) ``probs`` [..., V].

    One uniform per draw, inverse CDF in float32. Never returns a zero-probability token
    and never NaNs; a row summing to 0 returns index 0.

        >>> sample_categorical(jax.random.key(0), jnp.array([0., 2., 0., 1.]))  # 1 or 3
    """
    p = jnp.asarray(probs, jnp.float32)
    u = jax.random.uniform(key, p.shape[:-1], jnp.float32)
    return _inverse_cdf(u, p)


# --------------------------------------------------------------------------- sibling laws


def _check_row(probs, n: int, *, distinct: bool):
    p = jnp.asarray(probs, jnp.float32)
    if p.ndim != 1:
        raise ValueError(f"probs: expected a 1-D draft row float32[V], got shape {p.shape}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n: expected a static Python int >= 1, got {n!r}")
    if distinct and n > p.shape[0]:
        raise ValueError(
            f"n: expected at most V={p.shape[0]} distinct siblings for this scheme, got {n}"
        )
    return p


def _check_scheme(scheme):
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")


def sibling_laws(probs, tokens, scheme: str):
    """float32[n, V]: the law ``q_k`` each sibling ``tokens[k]`` was drawn from.

    This is the one definition shared by the draws below and the acceptance rule.
    ``probs`` float32[V] is the draft row, ``tokens`` int32[n] the siblings in order.

    * ``iid``: every law is ``probs`` itself (bit-for-bit).
    * ``without_replacement``: ``q_0 = probs`` (bit-for-bit); for k >= 1, ``probs`` with
      ``tokens[:k]`` set to 0, divided by its float32 sum. If that sum is 0 (support
      exhausted) ``q_k`` is a one-hot on ``tokens[k]`` (the sibling was a deterministic
      choice). The same one-hot is used for k = 0 if the row itself sums to 0.
    * ``deterministic``: one-hot on ``tokens[k]`` (duplicates allowed).

    Example, ``probs = [.5, .3, .2, 0]``, ``tokens = [1, 0, 2]``, without replacement::

        q_0 = [.5, .3, .2, 0],  q_1 = [5/7, 0, 2/7, 0],  q_2 = [0, 0, 1, 0]
    """
    _check_scheme(scheme)
    p = jnp.asarray(probs, jnp.float32)  # [V]
    tokens = jnp.asarray(tokens, jnp.int32)  # [n]
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
    """
    p = _check_row(probs, n, distinct=False)
    u = jax.random.uniform(key, (n,), jnp.float32)
    tokens = _inverse_cdf(u, p)  # one cdf, n uniforms -> [n]
    return tokens, sibling_laws(p, tokens, "iid")


def draw_without_replacement(key, probs, n: int):
    """Sequential sampling without replacement -> (tokens int32[n], laws float32[n, V]).

    Gumbel-top-k on ``log(probs)``: ordered top-n of ``log p + Gumbel`` has exactly the law
    of drawing from ``probs``, removing the token, renormalizing, drawing again, ...
    ``laws[k]`` is :func:`sibling_laws` (``probs`` with ``tokens[:k]`` zeroed, renormalized).

    Support exhaustion: if fewer than ``n`` tokens have positive probability, siblings
    ``m, m+1, ...`` (``m`` = support size) are the zero-probability tokens in increasing
    index order — deterministic, distinct from the earlier ones — and each law is a
    one-hot on the chosen token. (The acceptance rule then accepts such a sibling with
    probability ``p(x)``: still lossless.) Requires ``n <= V``.
    """
    p = _check_row(probs, n, distinct=True)
    v = p.shape[0]
    pc = _clean(p)
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
    return tokens, sibling_laws(p, tokens, "without_replacement")


def draw_deterministic(probs, n: int):
    """Top-``n`` tokens of ``probs`` float32[V] (ties -> lowest index); laws one-hot.

    Example: ``draw_deterministic([.1, .3, .3, .3], 2)`` -> tokens ``[1, 2]``.
    """
    p = _check_row(probs, n, distinct=True)
    tokens = lax.top_k(_clean(p), n)[1].astype(jnp.int32)  # lower index first on ties
    return tokens, sibling_laws(p, tokens, "deterministic")


def draw(key, probs, n: int, scheme: str):
    """Dispatch to :func:`draw_iid`, :func:`draw_without_replacement` or
    :func:`draw_deterministic` (which ignores ``key``). ``scheme`` must be static."""
    _check_scheme(scheme)
    if scheme == "iid":
        return draw_iid(key, probs, n)
    if scheme == "without_replacement":
        return draw_without_replacement(key, probs, n)
    return draw_deterministic(probs, n)
