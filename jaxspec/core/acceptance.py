"""The lossless acceptance rule for a draft tree (docs/DESIGN.md §2).

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
  choice and ``q_k`` is a point mass on it (see ``jaxspec.core.sampling.draw_without_replacement``).
* ``"deterministic"`` — fixed candidates: ``q_k`` is a point mass, so accept with ``p(x)``
  and on reject zero ``x`` in ``p`` and renormalize. Duplicates are harmless.

Branch-free form. The residual sequence along each row's sibling list depends only on the
tokens, never on the uniforms, so every node's acceptance probability is computed up
front, vectorized over rows, one step per sibling rank. No residual *vector* is ever
stored: the residual keeps the closed form ``max(p - c(y) q, 0) / s`` with a scalar ``c``
per row (and, without replacement, a frozen ``c`` per tried token), so a rejection costs
one fused reduction over the vocabulary for the rows that still have a sibling to judge
(a chain needs none; the deterministic scheme is pure scalar arithmetic). Without
replacement each row also needs the draft mass of its untried tokens before every
sibling; that depends on the tokens alone, so it is one more pass per row, made up front
(:func:`_untried_masses`), not one per rank. The uniforms
then pick the path with a few mask reductions, and only the one row the extra token is
emitted from is evaluated over the vocabulary. No data-dependent loop, so ``jax.vmap``
over millions of chains costs every lane the same.

Two evaluation orders of that one rule. A static tree with a row of >= 2 children under
``iid`` / ``without_replacement`` takes the *path walk* (:func:`_path_walk`): one step per
depth (a static loop), each gathering the current row and judging its siblings there, so
only the rows on the path are read over the vocabulary -- at most ``sum_d (K_d - 1)``
rejection steps a round (one pass each, plus one per depth without replacement) instead
of one per rejected sibling of every row (the uniforms decide which row each step reads; every lane
still does the same work). Chains, the
deterministic scheme (no vocabulary pass at all) and traced trees (depth unknown at trace
time) take the *all-rows* form (:func:`_walk` + :func:`choose_path`, which follows the
path by the first failed test on a chain, depth by depth on another static tree, by
``[N, N]`` masks on a traced one). Both use the same
uniforms and laws and agree token for token (tests/test_accept.py) when batched alike. A traced tree may give
any row up to N children, so under ``without_replacement`` it keeps the tried tokens in a
dense per-token form stepped by a ``lax.scan`` over sibling ranks (:func:`_rank_walk_dense`):
one traced step whatever N, instead of O(N^2) entries.

Randomness: one independent uniform per node (each node is tested at most once) and one
more, from a separate key, for the residual/bonus draw. No number is used twice.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_concrete
from jaxspec.core import tree as treelib
from jaxspec.core.numerics import accept_ratio, sum_last
from jaxspec.core.sampling import (
    array_dtype,
    check_key,
    check_scheme,
    check_tokens,
    row_sum_tol,
    sample_categorical,
)

__all__ = ["AcceptResult", "speculative_accept", "accept_probabilities"]


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


class TreeStructure(NamedTuple):
    children: object  # int[N + 1, K] children of each row in sibling order, -1 padded
    rows_by_rank: tuple | None  # per rank k: static rows with > k children (concrete only)
    earlier_sibling: object  # bool[N, N] [j, j']: j' is an earlier sibling of j
    mask: object  # bool[N, N] ancestor-or-self
    depth: object  # int[N]
    parent_row: object  # int[N] = parents + 1, the row that judges each node
    rank: object  # int[N] sibling rank of each node (0 = first child)


def tree_structure(parents) -> TreeStructure:
    if is_concrete(parents):
        par = treelib.validate_parents(parents)
        n = par.shape[0]
        counts = np.bincount(par + 1, minlength=n + 1)
        k = int(counts.max()) if n else 0
        children = np.full((n + 1, max(k, 1)), -1, np.int32)
        fill = np.zeros(n + 1, np.int64)
        for j, p in enumerate(par.tolist()):
            children[p + 1, fill[p + 1]] = j
            fill[p + 1] += 1
        rows = tuple(np.flatnonzero(counts > r).astype(np.int32) for r in range(k))
        idx = np.arange(n)
        earlier = (par[None, :] == par[:, None]) & (idx[None, :] < idx[:, None])
        mask = treelib.ancestor_mask(par)  # numpy: a constant under jit
        depth = mask.sum(axis=1).astype(np.int32)
        rank = earlier.sum(axis=1).astype(np.int32)
        return TreeStructure(children, rows, earlier, mask, depth, par + 1, rank)
    par = jnp.asarray(parents, jnp.int32)
    n = par.shape[0]
    idx = jnp.arange(n)
    earlier = (par[None, :] == par[:, None]) & (idx[None, :] < idx[:, None])
    mask = treelib.tree_mask(par)
    return TreeStructure(
        treelib.tree_children(par),
        None,
        earlier,
        mask,
        jnp.sum(mask, axis=1, dtype=jnp.int32),
        par + 1,
        jnp.sum(earlier, axis=1, dtype=jnp.int32),
    )


# ----------------------------------------------------------------------------------
# Residual laws in closed form
# ----------------------------------------------------------------------------------
#
# Rejecting siblings one by one never needs the residual *vector*: it stays of the form
#
#     res(y) = 0                               if y is a tried token that was zeroed
#              max(p(y) - c(y) q(y), 0)        otherwise,      p^(k) = res / s,
#
# with c(y) one scalar ``c`` for every token not yet tried and, for a tried token, the
# value c had right after it was rejected (it is frozen from then on). Rejecting the k-th
# child x with proposal law q_k maps (c, s) as follows:
#
# * iid (q_k = q):  max(res / s - q, 0) = max(p - (c + s) q, 0) / s, so c <- c + s;
# * without replacement (q_k = q restricted to the untried tokens / z, z = their q-mass):
#   untried tokens get c <- c + s / z, tried ones keep theirs, and x is frozen at the new
#   c; when the earlier siblings exhaust q's support (z = 0) q_k is a point mass on x,
#   which zeroes x and leaves c alone;
# * deterministic (q_k = point mass): x is zeroed (pure scalar arithmetic, see
#   ``_deterministic_accept``);
#
# and then s <- sum(res) (one fused reduction over the vocabulary per row that still has
# a sibling to judge; none for a chain; without replacement, the untried q-masses z of
# every rank come from one more pass per row, see ``_untried_masses``). A rejection whose
# residual sums to 0 in float keeps the previous law instead; for the last sibling of a
# row the emitted law falls back to the target row (``_row_law``).
# Both are events of probability 0 for drafts the scheme can produce. A draft it cannot
# produce (without replacement: a repeated sibling token, or a q(x) = 0 token before q's
# support is exhausted) is outside the contract: the result stays finite, but which of
# the two conventions applies may then depend on float rounding.
# ``p`` enters unnormalized at k = 0 (s = 1), exactly as the sequential rule reads it.


class _Law(NamedTuple):
    """The residual law of rows (leading axes) in closed form, unnormalized.

    c:        float32[...]     c of the untried tokens
    toks:     int32[..., J]    tried tokens in sibling order (-1 = empty entry)
    tok_c:    float32[..., J]  their frozen c
    tok_zero: bool[..., J]     zeroed instead (a point-mass proposal rejected them)
    zero:     None, or the *dense* form (traced trees without replacement, see
              :func:`_rank_walk_dense`): then ``c`` is float32[..., V], every token's c,
              ``zero`` bool[..., V] the zeroed tokens, and there are no entries (J = 0).
              Only ever evaluated over the whole vocabulary.
    """

    c: jax.Array
    toks: jax.Array
    tok_c: jax.Array
    tok_zero: jax.Array
    zero: jax.Array | None = None


def _law_eval(law: _Law, y, p, q):
    """res at tokens ``y`` with ``p = p(y)``, ``q = q(y)`` (all broadcast against the
    law's leading axes; pass ``y = arange(V)`` and full rows for the whole vector).
    Returns (res, c(y), zeroed(y)). The first entry of a repeated token wins."""
    c = law.c
    if law.zero is not None:  # dense form: y is the whole vocabulary
        zero = law.zero
    else:
        zero = jnp.zeros(jnp.broadcast_shapes(jnp.shape(y), jnp.shape(c)), jnp.bool_)
    for j in reversed(range(law.toks.shape[-1])):
        hit = law.toks[..., j] == y
        c = jnp.where(hit, law.tok_c[..., j], c)
        zero = jnp.where(hit, law.tok_zero[..., j], zero)
    return jnp.where(zero, 0.0, jnp.maximum(p - c * q, 0.0)), c, zero


def _law_rows(law: _Law, p, q):
    """float32[R, V]: ``res`` of each row of ``law`` (leading axis R) for rows p, q [R, V]."""
    iota = jnp.arange(p.shape[-1], dtype=jnp.int32)
    expand = _Law(law.c[:, None], law.toks[:, None, :], law.tok_c[:, None, :], law.tok_zero[:, None, :])
    return _law_eval(expand, iota[None, :], p, q)[0]


def _child_tokens(st, tokens):
    """int32[N + 1, K]: the token of each row's k-th child, -1 where there is none."""
    ch = st.children
    if isinstance(ch, np.ndarray):
        safe = np.maximum(ch, 0)
    else:
        safe = jnp.maximum(ch, 0)
    return jnp.where(jnp.asarray(ch) >= 0, tokens[safe], -1)


def _deterministic_accept(st, tokens, px):
    """Scalar form for point-mass siblings: p^(k) = p with earlier tokens zeroed, renormalized.

    a_j = 0 for a duplicate of an earlier sibling, else p(x_j) / (1 - removed mass).
    No pass over the vocabulary.
    """
    if st.rows_by_rank is not None:  # static tree
        return _deterministic_accept_static(st, tokens, px)
    earlier = jnp.asarray(st.earlier_sibling)  # [N, N]
    same_tok = tokens[:, None] == tokens[None, :]
    dup = jnp.any(earlier & same_tok, axis=1)  # [N]
    removed = jnp.sum(jnp.where(earlier & ~dup[None, :], px[None, :], 0.0), axis=1)
    left = 1.0 - removed
    a = jnp.where(left > 0, px / jnp.where(left > 0, left, 1.0), 0.0)
    return jnp.where(dup, 0.0, jnp.clip(a, 0.0, 1.0))


def _deterministic_accept_static(st, tokens, px):
    """:func:`_deterministic_accept` for a static tree: the duplicate test compares each
    node with its d-th earlier sibling for d = 1 .. K - 1 (static indices, a shifted
    slice on breadth-first trees) and the removed mass is one product with the static
    earlier-sibling matrix -- instead of the ``[N, N]`` masked compare and row sum of the
    general form, which XLA's CPU backend runs as a slow reduction kernel."""
    rank = np.asarray(st.rank)
    if rank.max(initial=0) == 0:  # no row has two children: nothing is ever removed
        return jnp.clip(px, 0.0, 1.0)
    dup = jnp.zeros(tokens.shape, jnp.bool_)
    for d in range(1, int(rank.max()) + 1):
        valid = rank >= d  # nodes with a d-th earlier sibling (sibling order = index order)
        idx = np.array([np.flatnonzero(st.earlier_sibling[j])[-d] if ok else j
                        for j, ok in enumerate(valid.tolist())], np.int64)
        dup = dup | ((_shift_pick(tokens, valid, idx) == tokens) & valid)
    kept = jnp.where(dup, 0.0, px)
    earlier_t = np.asarray(st.earlier_sibling, np.float32).T  # [j', j]: j' an earlier sibling of j
    removed = jnp.matmul(kept, earlier_t, precision=jax.lax.Precision.HIGHEST)  # [N]
    left = 1.0 - removed
    a = jnp.where(left > 0, px / jnp.where(left > 0, left, 1.0), 0.0)
    return jnp.where(dup, 0.0, jnp.clip(a, 0.0, 1.0))


def _shift_pick(a, valid, idx):
    """``a[idx]`` where ``valid`` (static numpy; anything elsewhere): a zero-padded shifted
    slice when every valid ``idx[j]`` is ``j - d`` for one ``d > 0``, else a static gather."""
    offs = np.unique(np.flatnonzero(valid) - idx[valid])
    if offs.size == 1 and offs[0] > 0:
        d = int(offs[0])
        return jnp.concatenate([jnp.zeros((d,), a.dtype), a[: a.shape[0] - d]])
    return a[idx]


def _pick(a, idx):
    """``a[idx]`` along the leading axis for a static numpy index: a slice when ``idx``
    is a contiguous range (breadth-first trees: almost always), so XLA fuses it instead
    of emitting a gather and a transposing copy; ``a`` itself for the identity."""
    idx = np.asarray(idx)
    if idx.size and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        if idx[0] == 0 and idx.size == a.shape[0]:
            return a
        return a[int(idx[0]) : int(idx[0]) + idx.size]
    return a[idx]


def _take(P, rows, toks):
    """float32[R]: ``P[rows[i], toks[i]]`` (rows static numpy, toks traced)."""
    return jnp.take_along_axis(_pick(P, rows), toks[:, None], axis=1)[:, 0]


def _keep(mask, new, old):
    """``new`` where ``mask`` (None = everywhere: static rows are all in play)."""
    return new if mask is None else jnp.where(mask, new, old)


def _walk(st, tokens, P, Q, scheme):
    """Every node's acceptance probability and every row's final residual law.

    Returns ``(accept float32[N], law)``: ``accept[j]`` = P(node j accepted | tried);
    ``law`` (:class:`_Law` with leading axis N + 1) = the residual of row r once all of
    its children were rejected -- for a leaf row, the row itself (the bonus law).

    One step per sibling rank, vectorized over the rows that have a child of that rank
    (static trees: exactly those rows; traced trees: every row, masked -- under
    without replacement as one ``lax.scan`` step over a dense law, :func:`_rank_walk_dense`).
    """
    n = tokens.shape[0]
    kids = _child_tokens(st, tokens)  # [N + 1, K], -1 where no child
    static = st.rows_by_rank is not None
    if scheme == "deterministic":
        px = _take(P, st.parent_row, tokens) if static else P[st.parent_row, tokens]
        accept = _deterministic_accept(st, tokens, px)
        law = _Law(
            jnp.zeros((n + 1,), jnp.float32),
            kids,
            jnp.zeros(kids.shape, jnp.float32),
            jnp.ones(kids.shape, jnp.bool_),
        )
        return accept, law
    track = scheme == "without_replacement"  # iid: the residual ignores which tokens
    if track and not static:  # one scan step instead of O(K^2) entries (K = N when traced)
        per_rank, law = _rank_walk_dense(kids, P, Q)
        return _gather_accept(st, per_rank, n, False), law
    per_rank, fin_c, fin_entry, cont_entry, c_final = _rank_walk(
        kids, P, Q, track, st.rows_by_rank if static else None)
    accept = _gather_accept(st, per_rank, n, static)
    if static:
        law = _assemble_static(st, kids, fin_c, fin_entry, cont_entry, track)
    else:
        law = _assemble_traced(kids, c_final, fin_entry, cont_entry, track)
    return accept, law


def _rank_walk(kids, P, Q, track, rows_by_rank=None):
    """The per-sibling-rank steps of :func:`_walk` for the iid / without-replacement
    schemes, on the rows ``P, Q: float32[R, V]`` whose children's tokens are
    ``kids: int32[R, K]`` (-1 = no child).

    ``rows_by_rank`` (static trees): rank k covers exactly the rows with > k children;
    ``None``: every rank covers every row, masked (traced trees, and the one gathered row
    of :func:`_path_walk`). Returns ``(per_rank, fin_c, fin_entry, cont_entry, c_final)``:
    per rank, the acceptance probabilities of its children and the law entries that
    :func:`_assemble_static` / :func:`_assemble_traced` turn into each row's final law;
    ``c_final`` is only meaningful when ``rows_by_rank`` is None.
    """
    num_ranks = kids.shape[1]
    static = rows_by_rank is not None
    rows = rows_by_rank[0] if static else np.arange(kids.shape[0])  # rows in play
    c = jnp.zeros(rows.shape, jnp.float32)
    s = jnp.ones(rows.shape, jnp.float32)
    z = jnp.ones(rows.shape, jnp.float32)  # wr: q-mass of the untried tokens (k = 0: q)
    exh = jnp.zeros(rows.shape, jnp.bool_)  # wr: that mass is 0 -> point-mass proposals
    ent_tok, ent_c, ent_zero = [], [], []  # wr: entries of the tried ranks, each [R]
    per_rank, fin_c, fin_entry, cont_entry = [], [], [], []
    c_final = jnp.zeros((kids.shape[0],), jnp.float32)  # traced: c after each row's last child
    if track and num_ranks > 1:  # the untried q-masses depend on the tokens only: up front
        z_rows = rows_by_rank[1] if static else rows
        z_after = _untried_masses(kids, Q, z_rows)
    for k in range(num_ranks):
        x = _pick(kids[:, k], rows)  # [R]
        has = None if static else x >= 0
        xi = jnp.maximum(x, 0)
        px, qx = _take(P, rows, xi), _take(Q, rows, xi)  # [R]
        law = _Law(c, _stack(ent_tok, x), _stack(ent_c, c), _stack(ent_zero, exh))
        res_x, c_x, zero_x = _law_eval(law, x, px, qx)
        if track:
            z_safe = jnp.where(z > 0, z, 1.0)
            seen = jnp.any(law.toks == x[:, None], axis=-1)
            qk = jnp.where(exh, 1.0, jnp.where(seen, 0.0, qx / z_safe))
            c_new = jnp.where(exh, c, c + s / z_safe)
        else:
            qk = qx
            c_new = c + s
        per_rank.append(accept_ratio(res_x / s, qk))
        fin_c.append(c_new)  # for rows whose last child this is (no fallback check)
        fin_entry.append((x, c_new, exh))
        if not static:
            c_final = jnp.where(has, c_new, c_final)
        if k + 1 == num_ranks:
            break
        # reject x and move on, for the rows that have a (k + 1)-th child
        if static:
            nxt = rows_by_rank[k + 1]
            sub = np.searchsorted(rows, nxt)  # positions of the next rows within `rows`
            sel = lambda a, sub=sub: _pick(a, sub)  # noqa: E731
            more = None
        else:
            nxt = rows
            sel = lambda a: a  # noqa: E731
            more = kids[:, k + 1] >= 0
        if track:
            law_new = _Law(
                sel(c_new),
                jnp.stack([sel(t) for t in ent_tok] + [sel(x)], -1),
                jnp.stack([sel(t) for t in ent_c] + [sel(c_new)], -1),
                jnp.stack([sel(t) for t in ent_zero] + [sel(exh)], -1),
            )
        else:
            law_new = _no_entries(sel(c_new))
        pv, qv = _pick(P, nxt), _pick(Q, nxt)  # [R', V]
        res_rows = _law_rows(law_new, pv, qv)  # [R', V]
        s_new = sum_last(res_rows)  # [R'] one pass over the rows
        if track:  # the q-mass of the tokens not tried yet: computed before the loop
            z_new = _pick(z_after[k], np.searchsorted(z_rows, nxt)) if static else z_after[k]
        fb = s_new <= 0  # a probability-0 rejection: keep the previous law
        c = _keep(more, jnp.where(fb, sel(c), law_new.c), sel(c))
        s = _keep(more, jnp.where(fb, sel(s), s_new), sel(s))
        if not track:
            rows = nxt
            continue
        cont = (sel(x), jnp.where(fb, sel(c_x), law_new.c), jnp.where(fb, sel(zero_x), sel(exh)))
        cont_entry.append(cont)
        exh = _keep(more, z_new <= 0, sel(exh))
        z = _keep(more, z_new, sel(z))
        ent_tok = [sel(t) for t in ent_tok] + [_keep(more, sel(x), jnp.full_like(sel(x), -1))]
        ent_c = [sel(t) for t in ent_c] + [cont[1]]
        ent_zero = [sel(t) for t in ent_zero] + [cont[2]]
        rows = nxt
    return per_rank, fin_c, fin_entry, cont_entry, c_final


def _untried_masses(kids, Q, rows):
    """Without replacement: ``z_after[k]`` float32[R] for ranks ``k < K - 1``: the q-mass of
    the tokens that are not among children ``0 .. k`` of each row of ``rows`` (static
    numpy indices) -- the mass sibling ``k + 1`` was drawn from. Only meaningful for rows
    with a (k + 1)-th child; ``kids: int32[N + 1, K]`` (-1 = no child), ``Q: [N + 1, V]``.

    One pass over the vocabulary per row instead of one per rank: ``base``, the mass
    outside every token tried before the row's last child; then ``z_after[k] = base +``
    the q of the later tried tokens that are new (not an earlier sibling's token). Only
    nonnegative numbers are added, so a small untried mass (a peaked draft whose first
    siblings hold nearly all of q) keeps its relative accuracy; subtracting the tried
    mass from 1 would not. The rank loop's sequential residual passes do not wait on it.
    """
    x = _pick(kids, rows)  # [R, K]
    k = x.shape[1]
    q_rows = _pick(Q, rows)  # [R, V]
    last_tried = jnp.sum(x >= 0, axis=1) - 2  # children 0 .. n - 2 are tried before the last
    iota = jnp.arange(Q.shape[-1], dtype=jnp.int32)
    tried = jnp.zeros(q_rows.shape, jnp.bool_)
    terms = []
    for j in range(k - 1):
        xj = x[:, j]
        valid = (xj >= 0) & (j <= last_tried)
        tried = tried | ((xj[:, None] == iota[None, :]) & valid[:, None])
        new = valid
        for i in range(j):
            new = new & (x[:, i] != xj)
        terms.append(jnp.where(new, _take(Q, rows, jnp.maximum(xj, 0)), 0.0))
    base = sum_last(jnp.where(tried, 0.0, q_rows))  # [R], the one pass
    z_after = [None] * (k - 1)
    later = jnp.zeros_like(base)  # the sum of the terms of the ranks after r
    for r in reversed(range(k - 1)):
        z_after[r] = base + later
        later = later + terms[r]
    return z_after


def _rank_walk_dense(kids, P, Q):
    """Without replacement on every row at once, the law kept *dense*: per-token ``c``
    ``[R, V]``, zeroed and tried masks ``[R, V]``, instead of one entry per tried
    sibling. The same laws and arithmetic as :func:`_rank_walk` (entries are frozen c's;
    here a tried token's c simply stops moving), traced as one ``lax.scan`` step whatever K
    instead of O(K^2) entry updates: for traced trees K is N, the most children a row can
    have.

    Returns ``(accept, law)``: float32[K, R] acceptance probabilities per rank; ``law``
    the dense final law of every row (its residual once all its children were rejected;
    for a leaf row, the row itself).
    """
    r, num_ranks = kids.shape
    iota = jnp.arange(P.shape[-1], dtype=jnp.int32)
    # next sibling to judge, per rank: kids[:, k + 1] >= 0 (none after the last rank)
    more_next = jnp.concatenate([kids[:, 1:] >= 0, jnp.zeros((r, 1), jnp.bool_)], axis=1)

    def rank_step(state, xs):
        c, s, z, exh, ctok, zero, tried, c_fin, zero_fin = state
        x, more = xs  # [R] the k-th child's token (-1: none), [R] a (k + 1)-th exists
        has = x >= 0
        xi = jnp.maximum(x, 0)[:, None]
        px, qx = (jnp.take_along_axis(a, xi, axis=1)[:, 0] for a in (P, Q))
        c_x = jnp.take_along_axis(ctok, xi, axis=1)[:, 0]
        seen = jnp.take_along_axis(tried, xi, axis=1)[:, 0]
        zero_x = jnp.take_along_axis(zero, xi, axis=1)[:, 0]  # only tried tokens are zeroed
        res_x = jnp.where(zero_x, 0.0, jnp.maximum(px - c_x * qx, 0.0))
        z_safe = jnp.where(z > 0, z, 1.0)
        qk = jnp.where(exh, 1.0, jnp.where(seen, 0.0, qx / z_safe))
        c_new = jnp.where(exh, c, c + s / z_safe)
        accept = accept_ratio(res_x / s, qk)
        # the law once x is rejected: untried tokens (x among them if new) move to c_new,
        # tried ones keep theirs; x is zeroed instead when the proposal was a point mass
        is_x = (iota[None, :] == x[:, None]) & ~tried  # [R, V]
        ctok_new = jnp.where(tried, ctok, c_new[:, None])
        zero_new = zero | (is_x & exh[:, None])
        c_fin = jnp.where(has[:, None], ctok_new, c_fin)  # rows whose last child this is
        zero_fin = jnp.where(has[:, None], zero_new, zero_fin)
        # move on, for the rows with a next sibling
        tried_new = tried | is_x
        s_new = sum_last(jnp.where(zero_new, 0.0, jnp.maximum(P - ctok_new * Q, 0.0)))
        z_new = sum_last(jnp.where(tried_new, 0.0, Q))
        ok = more & (s_new > 0)  # s_new <= 0: a probability-0 rejection keeps the law
        state = (
            jnp.where(ok, c_new, c),
            jnp.where(ok, s_new, s),
            jnp.where(more, z_new, z),
            jnp.where(more, z_new <= 0, exh),
            jnp.where(ok[:, None], ctok_new, ctok),
            jnp.where(ok[:, None], zero_new, zero),  # a kept law keeps x unzeroed too
            jnp.where(more[:, None], tried_new, tried),  # ... but x was tried all the same
            c_fin,
            zero_fin,
        )
        return state, accept

    zeros_rv = jnp.zeros(P.shape, jnp.float32)
    false_rv = jnp.zeros(P.shape, jnp.bool_)
    init = (jnp.zeros((r,), jnp.float32), jnp.ones((r,), jnp.float32), jnp.ones((r,), jnp.float32),
            jnp.zeros((r,), jnp.bool_), zeros_rv, false_rv, false_rv, zeros_rv, false_rv)
    # a scan, not a Python loop: one traced step whatever K (XLA would otherwise fuse the
    # chain of per-rank updates into every consumer, quadratic again)
    state, accept = jax.lax.scan(rank_step, init, (kids.T, more_next.T))  # accept [K, R]
    empty = jnp.zeros((r, 0), jnp.int32)
    law = _Law(state[7], empty, empty.astype(jnp.float32), empty.astype(jnp.bool_), state[8])
    return accept, law


def _no_entries(c) -> _Law:
    """The law ``max(p - c q, 0)`` with no tried-token entries (J = 0), rows like ``c``."""
    shape = jnp.shape(c) + (0,)
    return _Law(c, jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.bool_))


def _stack(entries, like):
    """[R, J] from J arrays [R] (J may be 0: an empty [R, 0] of ``like``'s dtype)."""
    if entries:
        return jnp.stack(entries, axis=-1)
    return jnp.zeros(jnp.shape(like) + (0,), jnp.result_type(like))


def _gather_accept(st, per_rank, n, subsets):
    """float32[N] in node order from the per-rank acceptance vectors (``subsets``: each
    covers rows_by_rank[k]; else every row)."""
    if subsets:
        order = np.concatenate([st.children[r, k] for k, r in enumerate(st.rows_by_rank)])
        return _pick(jnp.concatenate(per_rank), np.argsort(order))  # static permutation
    table = jnp.stack(per_rank) if isinstance(per_rank, list) else per_rank  # [K, N + 1]
    return table[jnp.asarray(st.rank), jnp.asarray(st.parent_row)]


def _assemble_static(st, kids, fin_c, fin_entry, cont_entry, track):
    """Per-row final laws [N + 1] of a static tree, by static gathers from the per-rank
    vectors (row r ends after its K_r-th child: rank K_r - 1)."""
    rows_by_rank = st.rows_by_rank
    n1 = kids.shape[0]
    num_children = np.zeros(n1, np.int64)
    for rows in rows_by_rank:
        num_children[rows] += 1
    pos = [{int(r): i for i, r in enumerate(rows)} for rows in rows_by_rank]
    offsets = np.cumsum([0] + [len(r) for r in rows_by_rank])
    dummy = int(offsets[-1])  # index of the appended default entry
    c_idx = np.array(
        [offsets[kr - 1] + pos[kr - 1][r] if kr else dummy for r, kr in enumerate(num_children)]
    )
    c_final = jnp.concatenate(fin_c + [jnp.zeros((1,), jnp.float32)])[c_idx]
    k = kids.shape[1]
    if not track:
        return _no_entries(c_final)
    # entry (r, j): the continuing version (rank j + 1 exists), else the final one
    fin_off = offsets
    cont_off = offsets[-1] + 1 + np.cumsum([0] + [len(r) for r in rows_by_rank[1:]])
    idx = np.full((n1, k), dummy, np.int64)
    for r in range(n1):
        for j in range(int(num_children[r])):
            if j + 1 < num_children[r]:
                idx[r, j] = cont_off[j] + pos[j + 1][r]
            else:
                idx[r, j] = fin_off[j] + pos[j][r]
    tok_c = jnp.concatenate(
        [e[1] for e in fin_entry] + [jnp.zeros((1,), jnp.float32)] + [e[1] for e in cont_entry]
    )[idx]
    tok_zero = jnp.concatenate(
        [e[2] for e in fin_entry] + [jnp.zeros((1,), jnp.bool_)] + [e[2] for e in cont_entry]
    )[idx]
    return _Law(c_final, kids, tok_c, tok_zero)


def _assemble_traced(kids, c_final, fin_entry, cont_entry, track):
    """Per-row final laws [N + 1] of a traced tree (every rank vector covers every row)."""
    n1, k = kids.shape
    if not track:
        return _no_entries(c_final)
    cols_c, cols_z = [], []
    for j in range(k):
        if j + 1 < k:
            more = kids[:, j + 1] >= 0
            cols_c.append(jnp.where(more, cont_entry[j][1], fin_entry[j][1]))
            cols_z.append(jnp.where(more, cont_entry[j][2], fin_entry[j][2]))
        else:
            cols_c.append(fin_entry[j][1])
            cols_z.append(fin_entry[j][2])
    return _Law(c_final, kids, jnp.stack(cols_c, -1), jnp.stack(cols_z, -1))


def _row_law(law: _Law, row, P, Q):
    """float32[V]: the (unnormalized) law emitted at ``row`` (a traced scalar); a row
    whose residual sums to 0 in float falls back to its target row ``p`` (an event of
    probability 0 for drafts the scheme can produce, see the comment above ``_Law``;
    never NaN, never a token p excludes)."""
    return _eval_law(jax.tree.map(lambda a: a[row], law), row, P, Q)


def _eval_law(r: _Law, row, P, Q):
    """:func:`_row_law` for the law ``r`` of one row (no leading axis)."""
    return _eval_law_rows(r, P[row], Q[row])


def _eval_law_rows(r: _Law, p, q):
    """:func:`_eval_law` given that row's target and draft rows ``p, q: float32[V]``."""
    res = _law_eval(r, jnp.arange(p.shape[-1], dtype=jnp.int32), p, q)[0]
    return jnp.where(sum_last(res) > 0, res, p)


def node_accept_probs(st, tokens, P, Q, scheme):
    """float32[N]: P(node accepted | tried)."""
    return _walk(st, tokens, P, Q, scheme)[0]


def row_residual(st, row, tokens, P, Q, scheme):
    """float32[V]: the normalized law emitted at ``row`` (traced scalar) once all its
    children were rejected; for a leaf row, the row itself (the bonus law)."""
    law = _row_law(_walk(st, tokens, P, Q, scheme)[1], row, P, Q)
    return law / jnp.sum(law)


def accept_probabilities(parents, tokens, target_probs, draft_probs, *, scheme: str):
    """Per-node acceptance probability and per-row final residual (no randomness).

    Returns ``(accept_prob float32[N], residual float32[N + 1, V])``: ``accept_prob[j]`` is
    the probability that node j is accepted *given that it is tried*; ``residual[r]`` is
    the law emitted at row r when all of its children are rejected (for a leaf row,
    the row itself: the bonus law), normalized. Pure and jit-safe; the inputs are
    validated like :func:`speculative_accept`'s (shapes and dtypes always, values when
    concrete). (The rule itself evaluates only the one residual row it emits from.)
    """
    _check_inputs(parents, tokens, target_probs, draft_probs, scheme)
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    accept, law = _walk(st, tokens, P, Q, scheme)
    rows = jnp.arange(tokens.shape[0] + 1)
    residual = jax.vmap(lambda r: _row_law(law, r, P, Q))(rows)
    return accept, residual / jnp.sum(residual, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------


def choose_path(st, accept_prob, u):
    """Branch-free path choice: a node is *chosen* when its test passes and no earlier
    sibling's did (siblings in order); it is on the path when it and every ancestor are
    chosen. -> (num_accepted int32, last int32 (-1 when none), accepted_nodes int32[N]:
    the on-path node of depth d + 1 at d, -1 past the path).

    Three forms of that one choice, by what is known at trace time (they agree on every
    input: tests/test_accept.py): a static chain takes the first failed test
    (:func:`_choose_chain`); another static tree follows the first passing child depth by
    depth (:func:`_choose_by_depth`, ``O(depth * K)``); a traced tree reduces ``[N, N]``
    ancestor and sibling masks (:func:`_choose_by_masks`)."""
    acc = u < accept_prob  # [N]
    if st.rows_by_rank is None:
        return _choose_by_masks(st, acc)
    if st.children.shape[1] == 1:  # every row has at most one child: the chain 0 -> 1 -> ...
        return _choose_chain(acc)
    return _choose_by_depth(st, acc)


def _choose_chain(acc):
    """:func:`choose_path` for the chain ``parents = [-1, 0, 1, ...]``: node ``i`` is on
    the path iff tests ``0..i`` all passed, so the path ends before the first failed test
    (one min-reduction instead of the ancestor and sibling mask reductions of
    :func:`_choose_by_masks`)."""
    n = acc.shape[0]
    idx = jnp.arange(n, dtype=jnp.int32)
    num_accepted = jnp.min(jnp.where(acc, n, idx)).astype(jnp.int32)
    return num_accepted, num_accepted - 1, jnp.where(idx < num_accepted, idx, -1)


def _choose_by_depth(st, acc):
    """:func:`choose_path` for a static tree: from the root, move into the first child
    (in sibling order) whose test passed, one static step per depth."""
    cur = jnp.zeros((), jnp.int32)  # current row: last accepted node + 1
    alive = jnp.ones((), jnp.bool_)
    path = []
    for rows_d, k_d in _depth_levels(st):
        kid = _children_at(st, rows_d, k_d, cur)
        go, node = _follow(kid, (kid >= 0) & acc[jnp.maximum(kid, 0)], alive)
        path.append(jnp.where(go, node, -1))
        cur = jnp.where(go, node + 1, cur)
        alive = go
    return _path_result(path, acc.shape[0], cur)


def _choose_by_masks(st, acc):
    """:func:`choose_path` for a traced tree, by ``[N, N]`` mask reductions."""
    n = acc.shape[0]
    chosen = acc & ~jnp.any(jnp.asarray(st.earlier_sibling) & acc[None, :], axis=1)
    mask = jnp.asarray(st.mask)
    depth = jnp.asarray(st.depth, jnp.int32)
    on_path = ~jnp.any(mask & ~chosen[None, :], axis=1)  # [N]
    num_accepted = jnp.sum(on_path, dtype=jnp.int32)
    # Masked max-reductions, not scatters or argmax (both slow under vmap on CPU). Node
    # indices grow along every path (parents[i] < i): the deepest on-path node is the
    # on-path node of largest index, -1 when there is none.
    idx = jnp.arange(n, dtype=jnp.int32)
    last = jnp.max(jnp.where(on_path, idx, -1))
    at_depth = (depth[None, :] == idx[:, None] + 1) & on_path[None, :]  # [D = N, N]
    accepted_nodes = jnp.max(jnp.where(at_depth, idx[None, :], -1), axis=1)  # [N]
    return num_accepted, last, accepted_nodes


def _depth_levels(st):
    """Static ``(rows_d, K_d)`` per depth ``d`` of a static tree that has a child: the rows
    whose node has depth d (row 0, the root, at d = 0) and the most children one has."""
    num_kids = (st.children >= 0).sum(axis=1)
    row_depth = np.concatenate([[0], np.asarray(st.depth)])  # row r: depth of its node
    return [(rows_d, int(num_kids[rows_d].max()))  # K_d >= 1 below the deepest level
            for rows_d in (np.flatnonzero(row_depth == d) for d in range(int(row_depth.max())))]


def _at_current(a, rows_d, cur):
    """``a[cur]`` along the leading (row) axis, ``cur`` the walk's current row (one of
    ``rows_d``): a static index when depth d has a single row (always so at the root)."""
    return a[int(rows_d[0])] if rows_d.size == 1 else a[cur]


def _children_at(st, rows_d, k_d, cur):
    """int32[K_d]: the children of row ``cur`` (one of ``rows_d``), -1 padded."""
    return _at_current(jnp.asarray(st.children[:, :k_d]), rows_d, cur)


def _follow(kid, passed, alive):
    """``(go, node)``: ``node`` the first child of ``kid: int32[K]`` whose test ``passed``
    (-1 when none did), ``go`` whether the walk (``alive`` so far) moves into it."""
    k = kid.shape[0]
    first = jnp.min(jnp.where(passed, jnp.arange(k, dtype=jnp.int32), k))
    node = jnp.max(jnp.where(jnp.arange(k) == first, kid, -1))
    return alive & (first < k), node


def _path_result(path, n, cur):
    """``(num_accepted, last, accepted_nodes int32[N])`` of a walk's per-depth nodes."""
    accepted_nodes = jnp.stack(path + [jnp.full((), -1, jnp.int32)] * (n - len(path)))
    return jnp.sum(accepted_nodes >= 0, dtype=jnp.int32), cur - 1, accepted_nodes


def _path_walk(st, tokens, P, Q, u, scheme):
    """The rule for a static tree under ``iid`` / ``without_replacement``, judging only
    the rows on the path: walk depth by depth, gather the current row (``p, q: [V]``),
    run the sibling steps of :func:`_rank_walk` on that one row, follow the first child
    whose test passes. A row with K children costs K - 1 rejection steps over the
    vocabulary (one pass each; without replacement one more per row for the untried draft
    masses), so a round costs at most ``sum_d (K_d - 1)`` of them (K_d: the most children
    of a row at depth d) instead of one per rejected sibling of *every* row -- 8 instead of
    47 for (4, 3, 4) (11 without replacement: one draft-mass pass per row, not per rank). Same
    uniforms, same laws, same result as the all-rows form (checked in tests/test_accept.py).

    Returns ``(num_accepted, last, accepted_nodes int32[N], law, p, q)`` with ``law`` the
    final law of row ``last + 1`` (a :class:`_Law` without leading axis) and ``p, q:
    float32[V]`` the rows it is evaluated on (``q`` is zeros for a bonus law at small V:
    it has c = 0 and no entries, so ``q`` plays no part).
    """
    track = scheme == "without_replacement"
    width = st.children.shape[1] if track else 0  # entries of the final law
    cur = jnp.zeros((), jnp.int32)  # current row: last accepted node + 1
    alive = jnp.ones((), jnp.bool_)  # every node so far was accepted
    fin = _Law(jnp.zeros((), jnp.float32), jnp.full((width,), -1, jnp.int32),
               jnp.zeros((width,), jnp.float32), jnp.zeros((width,), jnp.bool_))
    path, stops = [], []
    for rows_d, k_d in _depth_levels(st):
        kid = _children_at(st, rows_d, k_d, cur)  # [K_d]
        p, q = _at_current(P, rows_d, cur), _at_current(Q, rows_d, cur)  # [V] each
        x = jnp.where(kid >= 0, tokens[jnp.maximum(kid, 0)], -1)
        per_rank, _, fin_entry, cont_entry, c_final = _rank_walk(x[None], p[None], q[None], track)
        a = jnp.concatenate(per_rank)  # [K_d]
        go, node = _follow(kid, (kid >= 0) & (u[jnp.maximum(kid, 0)] < a), alive)
        law = jax.tree.map(lambda t: t[0], _assemble_traced(x[None], c_final, fin_entry, cont_entry, track))
        if track and k_d < width:
            pad = width - k_d
            law = _Law(law.c, jnp.pad(law.toks, (0, pad), constant_values=-1),
                       jnp.pad(law.tok_c, (0, pad)), jnp.pad(law.tok_zero, (0, pad)))
        stop = alive & ~go
        fin = jax.tree.map(lambda new, old: jnp.where(stop, new, old), law, fin)
        stops.append((stop, p, q))
        path.append(jnp.where(go, node, -1))
        cur = jnp.where(go, node + 1, cur)
        alive = go
    if P.shape[-1] > _CARRY_ROWS_MAX_V:
        p_fin, q_fin = P[cur], Q[cur]
    else:
        # alive here: an accepted leaf at the deepest level -> the bonus law (fin is c = 0,
        # so q plays no part): only its p row is fetched. A walk that stopped at depth d
        # emits from the rows that step already gathered.
        p_fin, q_fin = P[cur], jnp.zeros_like(P[0])
        for stop, p, q in reversed(stops):
            p_fin, q_fin = jnp.where(stop, p, p_fin), jnp.where(stop, q, q_fin)
    return (*_path_result(path, tokens.shape[0], cur), fin, p_fin, q_fin)


#: the path walk emits from the rows it already gathered (selected by the stopping depth)
#: when V is at most this; above it, fetching the emitted row's p and q again is cheaper
#: than re-reading every depth's rows, whose selection grows with D * V (the measurements
#: behind the threshold are in benchmarks/README.md)
_CARRY_ROWS_MAX_V = 1024


def _use_path_walk(st, scheme) -> bool:
    """The path walk pays off when some row has >= 2 children to judge over the
    vocabulary (a chain needs no pass at all; the deterministic scheme never does)."""
    return (st.rows_by_rank is not None and scheme != "deterministic"
            and len(st.rows_by_rank) >= 2)


def accept_core(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)  # [N + 1, V]
    Q = jnp.asarray(draft_probs, jnp.float32)  # [N + 1, V]
    key_accept, key_emit = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)  # one per node, used once
    if _use_path_walk(st, scheme):
        num_accepted, last, accepted_nodes, law, p, q = _path_walk(st, tokens, P, Q, u, scheme)
        emit = _eval_law_rows(law, p, q)
    else:
        accept_prob, law = _walk(st, tokens, P, Q, scheme)  # [N], rows' final laws
        num_accepted, last, accepted_nodes = choose_path(st, accept_prob, u)
        emit = _row_law(law, last + 1, P, Q)
    extra = sample_categorical(key_emit, emit).astype(jnp.int32)
    return accept_result(tokens, num_accepted, last, accepted_nodes, extra)


def accept_result(tokens, num_accepted, last, accepted_nodes, extra) -> AcceptResult:
    """The :class:`AcceptResult` of a chosen path (``accepted_nodes`` in depth order, -1
    padded) and the ``extra`` token emitted after it."""
    n = tokens.shape[0]
    path_tokens = jnp.where(accepted_nodes >= 0, tokens[jnp.maximum(accepted_nodes, 0)], -1)
    out = jnp.concatenate([path_tokens, jnp.full((1,), -1, jnp.int32)])  # [N + 1]
    out = jnp.where(jnp.arange(n + 1) == num_accepted, extra, out)
    return AcceptResult(
        tokens=out,
        num_tokens=num_accepted + 1,
        num_accepted=num_accepted,
        accepted_nodes=accepted_nodes,
        accepted_per_depth=(accepted_nodes >= 0).astype(jnp.int32),
        last_node=last,
    )


def _check_inputs(parents, tokens, target_probs, draft_probs, scheme):
    """Boundary validation: shapes and dtypes always, values when concrete."""
    check_scheme(scheme)
    if is_concrete(parents):
        par = treelib.validate_parents(parents)
        n = par.shape[0]
    else:
        treelib.check_traced_parents(parents)
        par = None
        n = parents.shape[0]
    tok_shape = np.shape(tokens)
    if tok_shape != (n,):
        raise ValueError(f"tokens: expected shape ({n},) to match parents, got {tok_shape}")
    shapes = {}
    for name, arr in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        shape = np.shape(arr)
        if len(shape) != 2 or shape[0] != n + 1:
            raise ValueError(f"{name}: expected shape ({n + 1}, V) = [N + 1, V], got {shape}")
        if not jnp.issubdtype(array_dtype(arr), jnp.floating):
            raise ValueError(f"{name}: expected a floating dtype, got {array_dtype(arr)}")
        shapes[name] = shape
    v = shapes["target_probs"][1]
    if shapes["draft_probs"][1] != v:
        raise ValueError(
            f"draft_probs: vocabulary size {shapes['draft_probs'][1]} differs from "
            f"target_probs' {v}"
        )
    check_tokens(tokens, v)  # integer dtype always, ids in [0, V) when concrete
    used_draft_rows = None if par is None else np.unique(par + 1)
    for name, arr, rows in (
        ("target_probs", target_probs, None),
        ("draft_probs", draft_probs, used_draft_rows),
    ):
        if not is_concrete(arr):
            continue
        a = np.asarray(arr)
        tol = row_sum_tol(a.dtype)
        a = a.astype(np.float64)
        if rows is not None:
            a_rows, idx = a[rows], rows
        else:
            a_rows, idx = a, np.arange(a.shape[0])
        if not np.all(np.isfinite(a_rows)) or np.any(a_rows < 0):
            r = int(idx[np.flatnonzero(~np.all(np.isfinite(a_rows) & (a_rows >= 0), axis=1))[0]])
            raise ValueError(f"{name}[{r}]: expected finite, nonnegative probabilities")
        sums = a_rows.sum(axis=1)
        off = np.flatnonzero(np.abs(sums - 1.0) > tol)
        if off.size:
            r = int(idx[off[0]])
            raise ValueError(
                f"{name}[{r}] sums to {sums[off[0]]:.6g}; expected each row to sum to 1 "
                f"(tolerance {tol:g})"
            )


def speculative_accept(key, parents, tokens, target_probs, draft_probs, *, scheme: str, rule="token"):
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
      rule: the verification rule: ``"token"`` (token by token, every tree), ``"block"``
        (block verification, chains), ``"traversal"``, or a function with the signature
        of :func:`accept_core` (see :mod:`jaxspec.core.rules` for the combinations each
        built-in rule is proved lossless on; others are refused).

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
    key = check_key(key)
    _check_inputs(parents, tokens, target_probs, draft_probs, scheme)
    if isinstance(rule, str) and rule == "token":
        return accept_core(key, parents, tokens, target_probs, draft_probs, scheme)
    from jaxspec.core import rules  # noqa: PLC0415 (rules imports this module)

    if isinstance(rule, str) and not is_concrete(parents):
        raise ValueError(f"rule = {rule!r}: needs concrete parents (a static tree); traced parents take rule='token'")
    fn = rules.check_rule(rule, scheme, parents)
    return fn(key, parents, tokens, target_probs, draft_probs, scheme)
