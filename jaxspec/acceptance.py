"""The lossless acceptance rule for a draft tree (DESIGN.md §2).

Walk from the root. At the current row, with target law ``p`` and draft law ``q``, try
the children in sibling (index) order. Child ``x`` with proposal law ``q_k``:

* accept with probability ``min(1, p(x) / q_k(x))`` and move into ``x`` (its rows);
* on reject, ``p <- normalize(max(p - q_k, 0))`` and try the next sibling;
* when no child is left (or an accepted leaf is reached) emit one token from ``p``.

Sibling schemes (``q_k`` for the k-th child of a row whose draft law is ``q``):

* ``"iid"`` — siblings drawn independently from ``q``: ``q_k = q``.
* ``"without_replacement"`` — sibling k drawn from ``q`` with the earlier siblings' tokens
  removed and renormalized: that renormalized law is ``q_k`` (in the ratio and in the
  residual). If the earlier siblings exhaust ``q``'s support, sibling k is a deterministic
  choice and ``q_k`` is a point mass on it (see ``jaxspec.sampling.draw_without_replacement``).
* ``"deterministic"`` — fixed candidates: ``q_k`` is a point mass, so accept with ``p(x)``
  and on reject zero ``x`` in ``p`` and renormalize. Duplicates are harmless.

Branch-free form. The residual sequence along each row's sibling list depends only on the
tokens, never on the uniforms, so every node's acceptance probability is computed up
front, vectorized over rows, one step per sibling rank (full residual vectors only for
rows that still have a sibling to judge: a chain needs none; the deterministic scheme is
pure scalar arithmetic). The uniforms then pick the path with a few mask reductions, and
only the one row the extra token is emitted from gets its residual recomputed (one row,
one step per sibling). No data-dependent loop, so ``jax.vmap`` over millions of chains
costs every lane the same.

Randomness: one independent uniform per node (each node is tested at most once) and one
more, from a separate key, for the residual/bonus draw. No number is used twice.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import tree as _tree
from jaxspec.sampling import sample_categorical

__all__ = ["SCHEMES", "AcceptResult", "speculative_accept", "accept_probabilities"]

SCHEMES = ("iid", "without_replacement", "deterministic")

#: tolerance for "rows sum to 1" when inputs are checked outside jit
ROW_SUM_TOL = 1e-3


class AcceptResult(NamedTuple):
    """Outcome of one round for one tree (add a leading batch axis under ``vmap``).

    tokens:             int32[N + 1] emitted tokens (accepted path, then the residual or
                        bonus token), -1 padded.
    num_tokens:         int32[] = num_accepted + 1.
    num_accepted:       int32[] accepted draft nodes.
    accepted_nodes:     int32[N] node indices of the accepted path in depth order, -1 padded.
    accepted_per_depth: int32[N] 1 at ``d - 1`` when a node of depth ``d`` was accepted.
    last_node:          int32[] deepest accepted node, -1 when none; the emitted extra token
                        was drawn from (the residual of) row ``last_node + 1``.
    """

    tokens: jax.Array
    num_tokens: jax.Array
    num_accepted: jax.Array
    accepted_nodes: jax.Array
    accepted_per_depth: jax.Array
    last_node: jax.Array


# ----------------------------------------------------------------------------------
# Static tree structure (numpy when parents are concrete, jnp when traced)
# ----------------------------------------------------------------------------------


class _Structure(NamedTuple):
    children: object  # int[N + 1, K] children of each row in sibling order, -1 padded
    rows_by_rank: tuple | None  # per rank k: static rows with > k children (concrete only)
    earlier_sibling: object  # bool[N, N] [j, j']: j' is an earlier sibling of j
    mask: object  # bool[N, N] ancestor-or-self
    depth: object  # int[N]
    parent_row: object  # int[N] = parents + 1, the row that judges each node


def _structure(parents) -> _Structure:
    if _tree.is_concrete(parents):
        par = _tree.validate_parents(parents)
        n = par.shape[0]
        counts = np.bincount(par + 1, minlength=n + 1)
        k = int(counts.max())
        children = np.full((n + 1, k), -1, np.int32)
        fill = np.zeros(n + 1, np.int64)
        for j, p in enumerate(par.tolist()):
            children[p + 1, fill[p + 1]] = j
            fill[p + 1] += 1
        rows = tuple(np.flatnonzero(counts > r).astype(np.int32) for r in range(k))
        idx = np.arange(n)
        earlier = (par[None, :] == par[:, None]) & (idx[None, :] < idx[:, None])
        mask = np.eye(n, dtype=bool)  # numpy: under jit, jnp ops on constants are staged
        for j, p in enumerate(par.tolist()):
            if p >= 0:
                mask[j] |= mask[p]
        depth = mask.sum(axis=1).astype(np.int32)
        return _Structure(children, rows, earlier, mask, depth, par + 1)
    par = jnp.asarray(parents, jnp.int32)
    n = par.shape[0]
    idx = jnp.arange(n)
    earlier = (par[None, :] == par[:, None]) & (idx[None, :] < idx[:, None])
    mask = _tree.tree_mask(par)
    return _Structure(
        _tree.tree_children(par),
        None,
        earlier,
        mask,
        jnp.sum(mask, axis=1, dtype=jnp.int32),
        par + 1,
    )


# ----------------------------------------------------------------------------------
# Residual tables
# ----------------------------------------------------------------------------------


def _normalize_or_keep(res, fallback):
    """normalize(res) per row; rows whose mass is 0 (p == q in float) keep ``fallback``.

    A zero residual means the rejection it follows had probability 0 (up to float
    rounding), so the fallback is never used by an exact-arithmetic path.
    """
    s = jnp.sum(res, axis=-1, keepdims=True)
    return jnp.where(s > 0, res / jnp.where(s > 0, s, 1.0), fallback)


def _keep_if_positive(q, fallback):
    s = jnp.sum(q, axis=-1, keepdims=True)
    return jnp.where(s > 0, q, fallback)


def _ratio(px, qx):
    """min(1, p/q) without NaN/inf: q == 0 -> 1 if p > 0 else 0."""
    safe_q = jnp.where(qx > 0, qx, 1.0)
    return jnp.where(qx > 0, jnp.minimum(1.0, px / safe_q), (px > 0).astype(px.dtype))


def _sibling_law(q_row, q_rem, onehot, k, scheme):
    """``q_k`` for rows whose k-th child has one-hot ``onehot`` [R, V]."""
    if scheme == "iid":
        return q_row
    if scheme == "deterministic":
        return onehot
    if scheme == "without_replacement":
        # k = 0: the row itself (bit-for-bit, as jaxspec.sampling.sibling_laws);
        # exhausted support -> a point mass on the (deterministic) candidate
        return _keep_if_positive(q_rem, onehot) if k == 0 else _normalize_or_keep(q_rem, onehot)
    raise ValueError(f"scheme = {scheme!r}; expected one of {SCHEMES}")


def _deterministic_accept(st, tokens, p_rows):
    """Scalar form for point-mass siblings: p^(k) = p with earlier tokens zeroed, renormalized.

    a_j = 0 for a duplicate of an earlier sibling, else p(x_j) / (1 - removed mass).
    No pass over the vocabulary.
    """
    earlier = jnp.asarray(st.earlier_sibling)  # [N, N]
    px = p_rows  # [N] target prob of each node's token under its parent's row
    same_tok = tokens[:, None] == tokens[None, :]
    dup = jnp.any(earlier & same_tok, axis=1)  # [N]
    removed = jnp.sum(jnp.where(earlier & ~dup[None, :], px[None, :], 0.0), axis=1)
    left = 1.0 - removed
    a = jnp.where(left > 0, px / jnp.where(left > 0, left, 1.0), 0.0)
    return jnp.where(dup, 0.0, jnp.clip(a, 0.0, 1.0))


def _node_accept_probs(st, tokens, P, Q, scheme):
    """float32[N]: P(node accepted | tried). Full residual vectors are materialized only
    for rows that still have a next sibling to judge; a chain needs none."""
    n = tokens.shape[0]
    v = P.shape[-1]
    parent_row = jnp.asarray(st.parent_row)
    if scheme == "deterministic":
        return _deterministic_accept(st, tokens, P[parent_row, tokens])
    accept = jnp.zeros((n,), jnp.float32)
    per_rank = []  # static trees: acceptance per rank, in rows_by_rank order
    num_ranks = st.children.shape[1]
    p_rows = q_rem = None  # residual / remaining-q vectors of the rows in play
    for k in range(num_ranks):
        if st.rows_by_rank is not None:
            rows = st.rows_by_rank[k]  # static rows with a k-th child
            child = st.children[rows, k]  # static node ids
        else:
            rows = np.arange(n + 1)
            child = st.children[:, k]  # traced, -1 where absent
        has = child >= 0  # [R]
        x = tokens[jnp.maximum(child, 0)]  # [R]
        if k == 0:
            px = P[rows, x]
            qx = Q[rows, x]
        else:
            px = jnp.take_along_axis(p_rows, x[:, None], axis=1)[:, 0]
            onehot = jax.nn.one_hot(x, v, dtype=jnp.float32)
            qk = _sibling_law(Q[rows], q_rem, onehot, k, scheme)
            qx = jnp.take_along_axis(qk, x[:, None], axis=1)[:, 0]
        if st.rows_by_rank is not None:
            per_rank.append(_ratio(px, qx))  # static node order: gathered below
        else:
            accept = accept.at[jnp.where(has, child, n)].set(_ratio(px, qx), mode="drop")
        if k + 1 == num_ranks:
            break
        # residual after rejecting the k-th child, for the rows that have a (k+1)-th one
        if st.rows_by_rank is not None:
            nxt = st.rows_by_rank[k + 1]
            sub = np.searchsorted(rows, nxt)  # positions of the next rows within `rows`
        else:
            nxt, sub = rows, rows
        xs, hs = x[sub], has[sub]
        onehot = jax.nn.one_hot(xs, v, dtype=jnp.float32)  # [R', V]
        p_prev = P[nxt] if k == 0 else p_rows[sub]
        q_prev = Q[nxt] if k == 0 else q_rem[sub]
        qk = _sibling_law(Q[nxt], q_prev, onehot, k, scheme)
        p_new = _normalize_or_keep(jnp.maximum(p_prev - qk, 0.0), p_prev)
        p_rows = jnp.where(hs[:, None], p_new, p_prev)
        q_rem = jnp.where(hs[:, None], q_prev * (1.0 - onehot), q_prev)
    if st.rows_by_rank is not None:
        order = np.concatenate([st.children[r, k] for k, r in enumerate(st.rows_by_rank)])
        accept = jnp.concatenate(per_rank)[np.argsort(order)]  # static permutation
    return accept


def _row_residual(st, row, tokens, P, Q, scheme):
    """float32[V]: the law emitted at ``row`` (traced scalar) once all its children were
    rejected; for a leaf row, the row itself (the bonus law)."""
    v = P.shape[-1]
    p = P[row]
    q_row = Q[row]
    kids = jnp.asarray(st.children)[row]  # [K], -1 padded
    if scheme == "deterministic":
        x = tokens[jnp.maximum(kids, 0)]
        hit = jnp.zeros((v,), jnp.bool_).at[jnp.where(kids >= 0, x, v)].set(True, mode="drop")
        return _normalize_or_keep(jnp.where(hit, 0.0, p), p)
    q_rem = q_row
    for k in range(kids.shape[0]):
        has = kids[k] >= 0
        onehot = jax.nn.one_hot(tokens[jnp.maximum(kids[k], 0)], v, dtype=jnp.float32)
        qk = _sibling_law(q_row, q_rem, onehot, k, scheme)
        p = jnp.where(has, _normalize_or_keep(jnp.maximum(p - qk, 0.0), p), p)
        q_rem = jnp.where(has, q_rem * (1.0 - onehot), q_rem)
    return p


def accept_probabilities(parents, tokens, target_probs, draft_probs, *, scheme: str):
    """Per-node acceptance probability and per-row final residual (no randomness).

    Returns ``(accept_prob float32[N], residual float32[N + 1, V])``: ``accept_prob[j]`` is
    the probability that node j is accepted *given that it is tried*; ``residual[r]`` is
    the law emitted at row r when all of its children are rejected (for a leaf row,
    the row itself: the bonus law). Pure and jit-safe; no input validation. (The rule
    itself computes only the one residual row it emits from.)
    """
    st = _structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    accept = _node_accept_probs(st, tokens, P, Q, scheme)
    rows = jnp.arange(tokens.shape[0] + 1)
    residual = jax.vmap(lambda r: _row_residual(st, r, tokens, P, Q, scheme))(rows)
    return accept, residual


# ----------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------


def _accept_core(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    st = _structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)  # [N + 1, V]
    Q = jnp.asarray(draft_probs, jnp.float32)  # [N + 1, V]
    accept_prob = _node_accept_probs(st, tokens, P, Q, scheme)  # [N]
    key_accept, key_emit = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)  # one per node, used once
    acc = u < accept_prob  # [N]
    # A node is chosen when it accepts and no earlier sibling did (siblings in order).
    chosen = acc & ~jnp.any(jnp.asarray(st.earlier_sibling) & acc[None, :], axis=1)
    # On the path when it and every ancestor are chosen.
    mask = jnp.asarray(st.mask)
    depth = jnp.asarray(st.depth, jnp.int32)
    on_path = ~jnp.any(mask & ~chosen[None, :], axis=1)  # [N]
    num_accepted = jnp.sum(on_path, dtype=jnp.int32)
    idx = jnp.arange(n, dtype=jnp.int32)
    last = jnp.where(num_accepted > 0, jnp.argmax(jnp.where(on_path, depth, 0)), -1)
    last = last.astype(jnp.int32)
    emit_row = _row_residual(st, last + 1, tokens, P, Q, scheme)  # [V]
    extra = sample_categorical(key_emit, emit_row).astype(jnp.int32)

    # accepted_nodes[d] = the on-path node of depth d + 1 (unique), -1 past the path;
    # masked reductions rather than scatters (cheaper under vmap)
    at_depth = (depth[None, :] == idx[:, None] + 1) & on_path[None, :]  # [D=N, N]
    accepted_nodes = jnp.where(
        jnp.any(at_depth, axis=1), jnp.argmax(at_depth, axis=1).astype(jnp.int32), -1
    )
    path_tokens = jnp.where(accepted_nodes >= 0, tokens[jnp.maximum(accepted_nodes, 0)], -1)
    out = jnp.concatenate([path_tokens, jnp.full((1,), -1, jnp.int32)])  # [N + 1]
    out = jnp.where(jnp.arange(n + 1) == num_accepted, extra, out)
    per_depth = (accepted_nodes >= 0).astype(jnp.int32)
    return AcceptResult(
        tokens=out,
        num_tokens=num_accepted + 1,
        num_accepted=num_accepted,
        accepted_nodes=accepted_nodes,
        accepted_per_depth=per_depth,
        last_node=last,
    )


def _check_inputs(parents, tokens, target_probs, draft_probs, scheme):
    """Boundary validation: shapes and dtypes always, values when concrete."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme = {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if _tree.is_concrete(parents):
        par = _tree.validate_parents(parents)
        n = par.shape[0]
    else:
        if parents.ndim != 1:
            raise ValueError(f"parents: expected shape [N], got {parents.shape}")
        par = None
        n = parents.shape[0]
    tok_shape = np.shape(tokens)
    if tok_shape != (n,):
        raise ValueError(f"tokens: expected shape ({n},) to match parents, got {tok_shape}")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"tokens: expected an integer dtype, got {jnp.result_type(tokens)}")
    shapes = {}
    for name, arr in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        shape = np.shape(arr)
        if len(shape) != 2 or shape[0] != n + 1:
            raise ValueError(f"{name}: expected shape ({n + 1}, V) = [N + 1, V], got {shape}")
        if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
            raise ValueError(f"{name}: expected a floating dtype, got {jnp.result_type(arr)}")
        shapes[name] = shape
    v = shapes["target_probs"][1]
    if shapes["draft_probs"][1] != v:
        raise ValueError(
            f"draft_probs: vocabulary size {shapes['draft_probs'][1]} differs from "
            f"target_probs' {v}"
        )
    if _tree.is_concrete(tokens):
        t = np.asarray(tokens)
        bad = np.flatnonzero((t < 0) | (t >= v))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"tokens[{i}] = {int(t[i])}: expected a token id in [0, {v})")
    used_draft_rows = None if par is None else np.unique(par + 1)
    for name, arr, rows in (
        ("target_probs", target_probs, None),
        ("draft_probs", draft_probs, used_draft_rows),
    ):
        if not _tree.is_concrete(arr):
            continue
        a = np.asarray(arr, np.float64)
        if rows is not None:
            a_rows, idx = a[rows], rows
        else:
            a_rows, idx = a, np.arange(a.shape[0])
        if not np.all(np.isfinite(a_rows)) or np.any(a_rows < 0):
            r = int(idx[np.flatnonzero(~np.all(np.isfinite(a_rows) & (a_rows >= 0), axis=1))[0]])
            raise ValueError(f"{name}[{r}]: expected finite, nonnegative probabilities")
        sums = a_rows.sum(axis=1)
        off = np.flatnonzero(np.abs(sums - 1.0) > ROW_SUM_TOL)
        if off.size:
            r = int(idx[off[0]])
            raise ValueError(
                f"{name}[{r}] sums to {sums[off[0]]:.6g}; expected each row to sum to 1 "
                f"(tolerance {ROW_SUM_TOL})"
            )


def speculative_accept(key, parents, tokens, target_probs, draft_probs, *, scheme: str):
    """Accept a path of a draft tree and emit ``accepted + 1`` tokens, losslessly.

    Args:
      key: a ``jax.random.key``; split internally into one key for the per-node uniforms
        and one for the residual/bonus draw.
      parents: int32[N] tree (``parents[i] < i``, -1 = child of the root). A concrete array
        (list, numpy) makes the tree a compile-time constant and is validated; a traced
        array (dynamic trees) is used as data, unvalidated.
      tokens: int32[N] the drafted token of each node.
      target_probs: float32[N + 1, V] target law; row 0 at the root, row i + 1 after node i.
      draft_probs: float32[N + 1, V] draft law the children of each row were drawn from
        (after the same warps, in float32). Rows of leaves are not used.
      scheme: ``"iid"``, ``"without_replacement"`` or ``"deterministic"``.

    Returns:
      :class:`AcceptResult`. Unbatched and pure: batch with ``jax.vmap`` over split keys.

    Example (a chain of 2 where the draft equals the target accepts everything)::

        p = jnp.full((3, 4), 0.25)
        r = speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]), p, p,
                               scheme="iid")
        # r.num_tokens == 3, r.tokens[:2] == [1, 2], r.tokens[2] = bonus token

    Raises:
      ValueError: for an unknown scheme, bad shapes or dtypes, out-of-range tokens, or
        (when the arrays are concrete) probability rows that do not sum to 1.
    """
    _check_inputs(parents, tokens, target_probs, draft_probs, scheme)
    return _accept_core(key, parents, tokens, target_probs, draft_probs, scheme)
