"""The token rule's residual laws in closed form, and the all-rows walk
(:func:`walk_all_rows`): every node's acceptance probability and every row's final
residual law, computed up front, vectorized over rows, one step per sibling rank. The rule
itself (:mod:`jaxspec.core.token_rule`) picks the path with the uniforms; its path walk
reuses :func:`rank_walk` on the one row it gathers per depth. Mathematics and the
evaluation orders: the docstring of :mod:`jaxspec.core.token_rule`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.numerics import accept_ratio, sum_last

__all__ = ["ResidualLaw", "assemble_traced", "eval_law_rows", "node_accept_probs", "rank_walk", "row_law",
           "row_residual", "walk_all_rows"]


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
# row the emitted law falls back to the target row (``row_law``).
# Both are events of probability 0 for drafts the scheme can produce. A draft it cannot
# produce (without replacement: a repeated sibling token, or a q(x) = 0 token before q's
# support is exhausted) is outside the contract: the result stays finite, but which of
# the two conventions applies may then depend on float rounding.
# ``p`` enters unnormalized at k = 0 (s = 1), exactly as the sequential rule reads it.


class ResidualLaw(NamedTuple):
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


def _law_eval(law: ResidualLaw, y, p, q):
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


def _law_rows(law: ResidualLaw, p, q):
    """float32[R, V]: ``res`` of each row of ``law`` (leading axis R) for rows p, q [R, V]."""
    iota = jnp.arange(p.shape[-1], dtype=jnp.int32)
    expand = ResidualLaw(law.c[:, None], law.toks[:, None, :], law.tok_c[:, None, :], law.tok_zero[:, None, :])
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


def walk_all_rows(st, tokens, P, Q, scheme):
    """Every node's acceptance probability and every row's final residual law.

    Returns ``(accept float32[N], law)``: ``accept[j]`` = P(node j accepted | tried);
    ``law`` (:class:`ResidualLaw` with leading axis N + 1) = the residual of row r once all of
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
        law = ResidualLaw(
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
    per_rank, fin_c, fin_entry, cont_entry, c_final = rank_walk(
        kids, P, Q, track, st.rows_by_rank if static else None)
    accept = _gather_accept(st, per_rank, n, static)
    if static:
        law = _assemble_static(st, kids, fin_c, fin_entry, cont_entry, track)
    else:
        law = assemble_traced(kids, c_final, fin_entry, cont_entry, track)
    return accept, law


def rank_walk(kids, P, Q, track, rows_by_rank=None):
    """The per-sibling-rank steps of :func:`walk_all_rows` for the iid / without-replacement
    schemes, on the rows ``P, Q: float32[R, V]`` whose children's tokens are
    ``kids: int32[R, K]`` (-1 = no child).

    ``rows_by_rank`` (static trees): rank k covers exactly the rows with > k children;
    ``None``: every rank covers every row, masked (traced trees, and the one gathered row
    of the path walk, :mod:`jaxspec.core.token_rule`). Returns ``(per_rank, fin_c, fin_entry, cont_entry, c_final)``:
    per rank, the acceptance probabilities of its children and the law entries that
    :func:`_assemble_static` / :func:`assemble_traced` turn into each row's final law;
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
        law = ResidualLaw(c, _stack(ent_tok, x), _stack(ent_c, c), _stack(ent_zero, exh))
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
            law_new = ResidualLaw(
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
    sibling. The same laws and arithmetic as :func:`rank_walk` (entries are frozen c's;
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
    law = ResidualLaw(state[7], empty, empty.astype(jnp.float32), empty.astype(jnp.bool_), state[8])
    return accept, law


def _no_entries(c) -> ResidualLaw:
    """The law ``max(p - c q, 0)`` with no tried-token entries (J = 0), rows like ``c``."""
    shape = jnp.shape(c) + (0,)
    return ResidualLaw(c, jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.bool_))


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
    return ResidualLaw(c_final, kids, tok_c, tok_zero)


def assemble_traced(kids, c_final, fin_entry, cont_entry, track):
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
    return ResidualLaw(c_final, kids, jnp.stack(cols_c, -1), jnp.stack(cols_z, -1))


def row_law(law: ResidualLaw, row, P, Q):
    """float32[V]: the (unnormalized) law emitted at ``row`` (a traced scalar); a row
    whose residual sums to 0 in float falls back to its target row ``p`` (an event of
    probability 0 for drafts the scheme can produce, see the comment above ``ResidualLaw``;
    never NaN, never a token p excludes)."""
    return _eval_law(jax.tree.map(lambda a: a[row], law), row, P, Q)


def _eval_law(r: ResidualLaw, row, P, Q):
    """:func:`row_law` for the law ``r`` of one row (no leading axis)."""
    return eval_law_rows(r, P[row], Q[row])


def eval_law_rows(r: ResidualLaw, p, q):
    """:func:`_eval_law` given that row's target and draft rows ``p, q: float32[V]``."""
    res = _law_eval(r, jnp.arange(p.shape[-1], dtype=jnp.int32), p, q)[0]
    return jnp.where(sum_last(res) > 0, res, p)


def node_accept_probs(st, tokens, P, Q, scheme):
    """float32[N]: P(node accepted | tried)."""
    return walk_all_rows(st, tokens, P, Q, scheme)[0]


def row_residual(st, row, tokens, P, Q, scheme):
    """float32[V]: the normalized law emitted at ``row`` (traced scalar) once all its
    children were rejected; for a leaf row, the row itself (the bonus law)."""
    law = row_law(walk_all_rows(st, tokens, P, Q, scheme)[1], row, P, Q)
    return law / jnp.sum(law)


