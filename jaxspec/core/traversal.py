"""Traversal verification of a drafted tree (Weng et al., NeurIPS 2025, arXiv 2505.12398;
mathematics in ``shared/RULES.md``): judged from the leaves up, lossless under the three
sibling schemes (exact enumeration, tests/test_rules_enumeration.py), block verification
on a chain, and never fewer accepted tokens in expectation than the token rule.

State per row (row 0 the root, row ``i + 1`` node i): a target-side law ``Mb`` (initially
the target row), a weight ``alpha`` that is *stored* for the root (1) and for every row that
has lost a child, and ``removed``, the number of deleted children. Children are deleted
first-remaining-first, so the remaining children of row u are ``kids[u][removed[u]:]``.
The draft-side law of u is the law its first remaining child k was drawn from, ``q_k``
(the token rule's per-sibling law: ``q`` for iid; ``q`` without the earlier siblings'
tokens, renormalized, without replacement; a point mass for deterministic). Repeat::

    l = the node reached from the root through first remaining children; on the way a
        child c (token x) of row u has alpha_c = its stored value, else
        min(1, alpha_u Mb_u(x) / q_k(x))
    l is the root:              emit one token from Mb_root, stop
    with probability alpha_l:   accept root -> l, emit one token from Mb_l (the bonus for
                                a leaf that never lost a child, else the residual its
                                deleted children left), stop
    else, u = parent(l):        z = [alpha_u Mb_u - q_k]_+,  r = sum z,  Mb_u <- z / r,
                                alpha_u <- r / (r + (1 - alpha_u)) (the root keeps 1),
                                delete l

A stored alpha never goes stale: a row is stored only while on the current path, and its
ancestors change only when a path child of theirs is rejected, which deletes the subtree
holding it. Every other alpha depends only on its parent's (unchanged) alpha and Mb, so each
step needs just the alphas of the new path. Here the alpha of a row's next child is also
stored when its previous sibling is rejected (from the new alpha_u and Mb_u; both stay
fixed until that child is deleted). A node whose alpha is not stored then has a parent that
never lost a child, whose Mb is still its target row: the walk reads ``P`` at the node's
token, precomputed, and never the carried ``Mb``.

Branch-free: ``N`` masked steps (a ``lax.fori_loop``; each deletes one node or stops, and
after ``N`` deletions only the root is left), each a static walk over the depths (a few
scalar gathers per depth into ``[N + 1]``-sized state, no vocabulary pass) and one fused
pass over the vocabulary on the parent's row (form ``q_k``, ``z``, ``r``; write ``Mb_u`` in
place): ``O(V + N)`` a step. The emitted row is read once more to sample.
``q_k`` is rebuilt on demand from ``Q[u]`` and the earlier siblings' tokens, never stored
per sibling; without replacement the masses it is normalized by come from one pass per row
with >= 2 children, made up front (they depend on the tokens only). The randomness follows
the token rule's: one uniform per node from one key (each node is tested at most once: a
test either stops the round or deletes the node), one more key for the emitted token.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.numerics import HIGHEST, accept_ratio, sum_last
from jaxspec.core.rule_types import AcceptResult, accept_result, tree_structure
from jaxspec.core.sampling import sample_categorical

__all__ = ["traversal_accept", "traversal_with_update", "parent_alpha"]


def traversal_accept(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """Traversal verification of a static tree, with the signature and conventions of
    :class:`jaxspec.core.rule_types.Rule` (one tree, concrete ``parents``, pure, no
    input checks): ``target_probs[N + 1, V]`` row 0 at the root, row ``i + 1`` after node
    i; ``draft_probs[r]`` the law the children of row r were drawn from under ``scheme``
    (``"iid"``, ``"without_replacement"`` or ``"deterministic"``)."""
    return traversal_with_update(key, parents, tokens, target_probs, draft_probs, scheme, parent_alpha)


def parent_alpha(r, alpha_u, qx):
    """The parent's new weight once its path child is rejected: ``r / (r + (1 - alpha_u))``.

    The denominator keeps ``1 - alpha_u`` whole: ``(r + 1) - alpha_u`` would round ``r``
    against 1 and lose its relative accuracy when ``r`` is small. 1 when the denominator
    is 0 (``alpha_u = 1`` and nothing left), clipped at 1 against rounding. ``qx`` (the
    rejected child's ``q_k(x)``) is unused: it is the hook's argument for the mutant."""
    del qx
    den = r + (1.0 - alpha_u)
    return jnp.where(den > 0, jnp.minimum(r / jnp.where(den > 0, den, 1.0), 1.0), 1.0)


def traversal_with_update(key, parents, tokens, target_probs, draft_probs, scheme, parent_alpha):
    """:func:`traversal_accept` with the parent update ``parent_alpha(r, alpha_u, q_k(x))``
    as an argument (the tests swap in a mutant; not part of the public signature)."""
    st = tree_structure(parents)  # numpy: parents are concrete
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)  # [N + 1, V]
    Q = jnp.asarray(draft_probs, jnp.float32)  # [N + 1, V]
    key_accept, key_emit = jax.random.split(key)
    uni = jax.random.uniform(key_accept, (n,), jnp.float32)  # one per node, used once

    children = jnp.asarray(st.children)  # [N + 1, K] sibling order, -1 padded
    width = st.children.shape[1]
    num_kids = jnp.asarray((st.children >= 0).sum(axis=1).astype(np.int32))  # [N + 1]
    depth = int(np.max(st.depth))
    sib = _earlier_siblings(st)  # int[N, K - 1] earlier siblings in order, -1 padded
    sib_tok = jnp.where(sib >= 0, tokens[np.maximum(sib, 0)], -1)  # [N, K - 1]
    qx, z, exh = _drawn_at_token(st, sib, sib_tok, tokens, Q, scheme)  # [N] each
    px = P[np.asarray(st.parent_row), tokens]  # [N] the target row of the parent at the token
    t = _Walk(children, width, num_kids, depth, px, qx, tokens, sib_tok, z, exh, scheme)

    def step(_, state):
        mb, alpha, stored, removed, done, fin_row, fin_path = state
        leaf, a_leaf, u, a_u, path = _walk(t, alpha, stored, removed)
        node = jnp.maximum(leaf - 1, 0)  # ℓ as a node (meaningless at the root)
        at_root = leaf == 0
        passed = uni[node] < a_leaf
        stop = ~done & (at_root | passed)
        reject = ~done & ~at_root & ~passed
        fin_row = jnp.where(stop, leaf, fin_row)
        fin_path = jnp.where(stop, path, fin_path)
        # the rejection: one fused pass over the parent's row (masked for stopped lanes)
        row = mb[u]  # [V]
        zr = jnp.maximum(a_u * row - _drawn_law(t, node, Q[u]), 0.0)  # [V]
        r = sum_last(zr)
        # r = 0 happens with probability 0 (it needs Mb_u = q_k and alpha_u = 1, and then
        # ℓ is accepted surely); keep the previous law rather than a zero row
        new_row = jnp.where(reject & (r > 0), zr / jnp.where(r > 0, r, 1.0), row)
        new_alpha = jnp.where(u == 0, 1.0, parent_alpha(r, a_u, qx[node]))
        # u's next child (if any) is now its first remaining one: its alpha, from the new
        # alpha_u and Mb_u, is stored now and stays valid until it is deleted itself (u's
        # alpha and Mb change only then). So the walk never reads Mb, and the one scalar
        # read here comes after the row is written: every read of the carried Mb then
        # precedes its update, which XLA does in place (a read of the old buffer that the
        # update does not wait on makes it copy the whole of Mb every step).
        k_next = removed[u] + 1
        nxt = jnp.maximum(children[u, jnp.minimum(k_next, width - 1)], 0)
        has_next = reject & (k_next < num_kids[u])
        mb = mb.at[u].set(new_row)
        a_next = accept_ratio(new_alpha * mb[u, tokens[nxt]], qx[nxt])  # the new row
        alpha = alpha.at[u].set(jnp.where(reject, new_alpha, alpha[u]))
        stored = stored.at[u].set(stored[u] | reject)
        alpha = alpha.at[nxt + 1].set(jnp.where(has_next, a_next, alpha[nxt + 1]))
        stored = stored.at[nxt + 1].set(stored[nxt + 1] | has_next)
        removed = removed.at[u].add(reject.astype(jnp.int32))
        return mb, alpha, stored, removed, done | stop, fin_row, fin_path

    init = (
        P,  # Mb [N + 1, V]
        jnp.ones((n + 1,), jnp.float32),  # alpha [N + 1], meaningful where stored
        jnp.zeros((n + 1,), jnp.bool_).at[0].set(True),  # stored [N + 1]: the root, alpha 1
        jnp.zeros((n + 1,), jnp.int32),  # removed children per row [N + 1]
        jnp.zeros((), jnp.bool_),  # done
        jnp.zeros((), jnp.int32),  # the row emitted from: the root unless a test passes
        jnp.full((depth,), -1, jnp.int32),  # the accepted path per depth [D]
    )
    # N steps: each stops or deletes one node; a lane still running after N deletions has
    # only the root left, which init already names as the row to emit from
    mb, _, _, _, _, fin_row, fin_path = jax.lax.fori_loop(0, n, step, init)
    extra = sample_categorical(key_emit, mb[fin_row]).astype(jnp.int32)
    accepted_nodes = jnp.concatenate([fin_path, jnp.full((n - depth,), -1, jnp.int32)])
    num_accepted = jnp.sum(fin_path >= 0, dtype=jnp.int32)
    return accept_result(tokens, num_accepted, fin_row - 1, accepted_nodes, extra)


class _Walk(NamedTuple):
    """The fixed inputs of a traversal: the tree's layout and the per-node values read
    while walking it (one row per node, computed once before the loop)."""

    children: jax.Array  # int32[N + 1, K] sibling order, -1 padded
    width: int  # K
    num_kids: jax.Array  # int32[N + 1]
    depth: int
    px: jax.Array  # float32[N] the target row of each node's parent at its token
    qx: jax.Array  # float32[N] q_k(x): the law each node was drawn from, at its token
    tokens: jax.Array  # int32[N]
    sib_tok: jax.Array  # int32[N, K - 1] earlier siblings' tokens, -1 padded
    z: jax.Array  # float32[N] the untried mass of the parent's draft row
    exh: jax.Array  # bool[N] that mass is exhausted (a point mass)
    scheme: str


def _walk(t: _Walk, alpha, stored, removed):
    """From the root through first remaining children: (ℓ's row, alpha_ℓ, its parent's
    row, the parent's alpha, the path's nodes per depth int32[D], -1 past ℓ). One gather
    per depth into [N + 1]-sized state, none into Mb: a node whose alpha is not stored yet
    has a parent that never lost a child (see the step of :func:`traversal_with_update`),
    so its parent's Mb is still the target row and ``px`` holds the value it needs. Once a
    row has no child left the walk stays there."""
    cur = jnp.zeros((), jnp.int32)
    a_cur = jnp.ones((), jnp.float32)
    par, a_par = cur, a_cur
    path = []
    for _ in range(t.depth):
        k = removed[cur]
        has = k < t.num_kids[cur]
        c = jnp.maximum(t.children[cur, jnp.minimum(k, t.width - 1)], 0)
        a_c = jnp.where(stored[c + 1], alpha[c + 1], accept_ratio(a_cur * t.px[c], t.qx[c]))
        par, a_par = jnp.where(has, cur, par), jnp.where(has, a_cur, a_par)
        cur, a_cur = jnp.where(has, c + 1, cur), jnp.where(has, a_c, a_cur)
        path.append(jnp.where(has, c, -1))
    return cur, a_cur, par, a_par, jnp.stack(path)


def _drawn_law(t: _Walk, node, q_row):
    """float32[V]: q_k, the law ``node`` (traced) was drawn from, from its parent's draft
    row ``q_row`` and its earlier siblings' tokens (as ``sibling_laws``)."""
    if t.scheme == "iid":
        return q_row
    iota = jnp.arange(q_row.shape[-1], dtype=jnp.int32)
    onehot = (iota == t.tokens[node]).astype(jnp.float32)
    if t.scheme == "deterministic":
        return onehot
    tried = jnp.zeros(q_row.shape, jnp.bool_)
    for j in range(t.width - 1):
        tried = tried | (iota == t.sib_tok[node, j])  # -1 (no sibling) matches nothing
    zn = t.z[node]
    renorm = jnp.where(tried, 0.0, q_row) / jnp.where(zn > 0, zn, 1.0)
    return jnp.where(t.exh[node], onehot, renorm)


def _earlier_siblings(st) -> np.ndarray:
    """int32[N, max(K - 1, 1)]: node j's earlier siblings in sibling order, -1 padded."""
    n = st.parent_row.shape[0]
    width = max(st.children.shape[1] - 1, 1)
    sib = np.full((n, width), -1, np.int32)
    for j in range(n):
        rank = int(st.rank[j])
        sib[j, :rank] = st.children[st.parent_row[j], :rank]
    return sib


def _drawn_at_token(st, sib, sib_tok, tokens, Q, scheme):
    """Per node j, from the law ``q_j`` it was drawn from: ``(q_j(x_j), z_j, exhausted_j)``,
    each [N]. ``z_j`` is the draft mass ``q_j`` was renormalized by (1 unless without
    replacement at rank >= 1), ``exhausted_j`` that it is 0, so that ``q_j`` is a point mass
    on ``x_j``. These depend on the tokens only, not on the walk."""
    n = tokens.shape[0]
    prow = np.asarray(st.parent_row)
    ones = jnp.ones((n,), jnp.float32)
    no = jnp.zeros((n,), jnp.bool_)
    if scheme == "deterministic":  # a point mass on the node's own token
        return ones, ones, no
    q_tok = Q[prow, tokens]  # [N]
    if scheme == "iid":
        return q_tok, ones, no
    seen = jnp.any(sib_tok == tokens[:, None], axis=1)  # a repeat of an earlier sibling
    z = _untried_masses(st, seen, q_tok, tokens, Q)
    exh = z <= 0
    qx = jnp.where(exh, 1.0, jnp.where(seen, 0.0, q_tok / jnp.where(exh, 1.0, z)))
    return qx, z, exh


def _untried_masses(st, seen, q_tok, tokens, Q):
    """Without replacement: float32[N], the draft mass of the tokens none of node j's
    earlier siblings holds (1 for a first child: ``q_0`` is the row itself).

    One pass over the vocabulary per row with >= 2 children, not one per node: ``base``,
    the mass outside the tokens of children ``0 .. K_r - 2`` of the row; then node j of rank
    k adds the q of the tokens of children ``k .. K_r - 2`` that are new (first occurrences),
    a static 0/1 matrix product. Only nonnegative numbers are added, so a small untried mass
    keeps its relative accuracy (``1 - tried mass`` would not)."""
    n = tokens.shape[0]
    rank = np.asarray(st.rank)
    prow = np.asarray(st.parent_row)
    if rank.max() == 0:  # no row has two children
        return jnp.ones((n,), jnp.float32)
    kids = np.asarray(st.children)
    nk = (kids >= 0).sum(axis=1)
    rows = np.flatnonzero(nk >= 2)  # [R]
    v = Q.shape[-1]
    iota = jnp.arange(v, dtype=jnp.int32)
    tried = jnp.zeros((rows.size, v), jnp.bool_)
    for i in range(int(nk[rows].max()) - 1):
        valid = i <= nk[rows] - 2  # static [R]: child i is tried before the row's last
        x = jnp.where(valid, tokens[np.maximum(kids[rows, i], 0)], -1)  # [R]
        tried = tried | (x[:, None] == iota[None, :])
    base = sum_last(jnp.where(tried, 0.0, Q[rows]))  # [R], the one pass
    later = np.zeros((n, n), np.float32)  # [j, j']: j' a sibling of rank k_j .. K_r - 2
    pos = np.zeros(n, np.int64)
    for j in np.flatnonzero(rank >= 1):
        r = prow[j]
        pos[j] = np.searchsorted(rows, r)
        for jj in kids[r, rank[j] : nk[r] - 1]:
            later[j, jj] = 1.0
    new = jnp.where(seen, 0.0, q_tok)  # each distinct token's q once, at its first sibling
    z = base[pos] + jnp.matmul(later, new, precision=HIGHEST)
    return jnp.where(rank >= 1, z, 1.0)
