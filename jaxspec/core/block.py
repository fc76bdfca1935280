"""Block verification of a drafted chain (Sun, Mendlovic, Leviathan et al., ICLR 2025;
mathematics in ``shared/RULES.md``): lossless, and never fewer accepted tokens in
expectation than the token-level rule.

For a chain of ``g`` drafted tokens ``X_1..X_g`` with target rows ``p_0..p_g`` and the
laws ``q_0..q_{g-1}`` they were drawn from (``q_i`` is a point mass on ``X_{i+1}`` under
the ``deterministic`` scheme)::

    w_0 = 1,  w_i = min(1, w_{i-1} p_{i-1}(X_i) / q_{i-1}(X_i))      clipped at every step
    r_i = sum_x [w_i p_i(x) - q_i(x)]_+                            i = 1 .. g - 1
    h_i = r_i / (r_i + 1 - w_i)  (1 when the denominator is 0),  h_g = w_g
    tau = the LAST i with eta_i < h_i (0 if none), one uniform eta_i per position
    emit X_1..X_tau, then one token from p_g if tau = g, else from [w_tau p_tau - q_tau]_+

Branch-free: every stopping probability is computed up front (``g - 1`` fused passes
over the vocabulary, none for ``deterministic``, where ``r_i = w_i (1 - p_i(X_{i+1}))``),
the uniforms pick ``tau`` with one reduction, and only row ``tau`` is read again to
emit. The randomness follows the token rule's: one uniform per node from one key, one
more key for the emitted token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.numerics import sum_last
from jaxspec.core.rule_types import AcceptResult, accept_result
from jaxspec.core.sampling import sample_categorical

__all__ = ["block_accept", "block_emit", "block_weights", "block_stop_probabilities", "is_chain"]


def is_chain(parents) -> bool:
    """True for concrete ``parents == [-1, 0, 1, ..., N - 2]`` (N >= 1)."""
    par = np.asarray(parents)
    return par.ndim == 1 and par.size >= 1 and bool(np.all(par == np.arange(-1, par.size - 1)))


def _drafted_q(tokens, Q, scheme):
    """float32[g]: ``q_{i}(X_{i+1})``, the probability the draft gave each drafted token
    (1 under ``deterministic``: a point mass)."""
    g = tokens.shape[0]
    if scheme == "deterministic":
        return jnp.ones((g,), jnp.float32)
    return Q[jnp.arange(g), tokens]


def block_weights(tokens, P, Q, scheme):
    """float32[g + 1]: ``w_0 = 1`` and ``w_i = min(1, w_{i-1} p_{i-1}(X_i) / q_{i-1}(X_i))``.

    A drafted token the draft gave probability 0 (possible only through float rounding)
    keeps the weight 1 if the target gives it mass, else 0: the limit of the ratio."""
    g = tokens.shape[0]
    px = P[jnp.arange(g), tokens]  # [g] p_{i-1}(X_i)
    qx = _drafted_q(tokens, Q, scheme)
    ws = [jnp.ones((), jnp.float32)]
    for i in range(g):  # static and short: the clip makes it sequential
        prod = ws[-1] * px[i]
        w = jnp.where(qx[i] > 0, jnp.minimum(1.0, prod / jnp.where(qx[i] > 0, qx[i], 1.0)),
                      (prod > 0).astype(jnp.float32))
        ws.append(w)
    return jnp.stack(ws)


def block_stop_probabilities(tokens, P, Q, scheme, w):
    """float32[g]: ``h_1..h_g`` (index ``i - 1``) from the weights ``w`` [g + 1]."""
    g = tokens.shape[0]
    if g == 1:
        return w[1:]
    wi = w[1:g]  # [g - 1]: w_1 .. w_{g-1}
    if scheme == "deterministic":  # q_i a point mass on X_{i+1}: no vocabulary pass
        p_next = P[jnp.arange(1, g), tokens[1:]]  # p_i(X_{i+1})
        r = wi * (1.0 - p_next)
    else:
        r = sum_last(jnp.maximum(wi[:, None] * P[1:g] - Q[1:g], 0.0))  # [g - 1]
    den = r + 1.0 - wi
    h = jnp.where(den > 0, r / jnp.where(den > 0, den, 1.0), 1.0)
    return jnp.concatenate([jnp.clip(h, 0.0, 1.0), w[g:]])


def block_accept(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """Block verification of a chain (``parents = [-1, 0, ..., N - 2]``), with the
    signature and conventions of :class:`jaxspec.core.rule_types.Rule` (one row,
    pure, no input checks). ``scheme`` says how each token was drawn: ``iid`` and
    ``without_replacement`` are the same on a chain (one child per row);
    ``deterministic`` means a point mass."""
    tokens = jnp.asarray(tokens, jnp.int32)
    g = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)  # [g + 1, V]
    Q = jnp.asarray(draft_probs, jnp.float32)  # [g + 1, V]
    key_accept, key_emit = jax.random.split(key)
    eta = jax.random.uniform(key_accept, (g,), jnp.float32)  # one per position, used once
    w = block_weights(tokens, P, Q, scheme)
    h = block_stop_probabilities(tokens, P, Q, scheme, w)
    idx = jnp.arange(1, g + 1, dtype=jnp.int32)
    tau = jnp.max(jnp.where(eta < h, idx, 0)).astype(jnp.int32)  # the LAST passing position
    return block_emit(key_emit, tokens, P, Q, scheme, tau, w[tau])


def block_emit(key, tokens, P, Q, scheme, tau, weight) -> AcceptResult:
    """The :class:`~jaxspec.AcceptResult` of ``tau`` accepted tokens: the extra token from
    ``p_g`` when ``tau = g``, else from ``[weight * p_tau - q_tau]_+`` (``weight = w_tau``)."""
    g = tokens.shape[0]
    p_tau = P[tau]
    if scheme == "deterministic":
        q_tau = jax.nn.one_hot(tokens[jnp.minimum(tau, g - 1)], P.shape[-1], dtype=jnp.float32)
    else:
        q_tau = Q[tau]
    residual = jnp.maximum(weight * p_tau - q_tau, 0.0)
    emit = jnp.where(tau == g, p_tau, residual)
    extra = sample_categorical(key, emit).astype(jnp.int32)
    nodes = jnp.arange(g, dtype=jnp.int32)
    accepted_nodes = jnp.where(nodes < tau, nodes, -1)
    return accept_result(tokens, tau, tau - 1, accepted_nodes, extra)
