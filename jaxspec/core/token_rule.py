"""The token rule: the lossless acceptance rule for a draft tree, token by token from the
root (docs/DESIGN.md §2). :func:`accept_core` is the rule (a :class:`~jaxspec.core.rule_types.Rule`);
:func:`accept_probabilities` its per-node laws, without randomness.

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
(``_untried_masses`` in :mod:`jaxspec.core.residual`), not one per rank. The uniforms
then pick the path with a few mask reductions, and only the one row the extra token is
emitted from is evaluated over the vocabulary. No data-dependent loop, so ``jax.vmap``
over millions of chains costs every lane the same.

Two evaluation orders of that one rule: the all-rows form (the reference, which also gives
:func:`accept_probabilities`) and the path walk (the fast form for branching trees). A static tree with a row of >= 2 children under
``iid`` / ``without_replacement`` takes the *path walk* (:func:`_path_walk`): one step per
depth (a static loop), each gathering the current row and judging its siblings there, so
only the rows on the path are read over the vocabulary -- at most ``sum_d (K_d - 1)``
rejection steps a round (one pass each, plus one per depth without replacement) instead
of one per rejected sibling of every row (the uniforms decide which row each step reads; every lane
still does the same work). Chains, the
deterministic scheme (no vocabulary pass at all) and traced trees (depth unknown at trace
time) take the *all-rows* form (:func:`~jaxspec.core.residual.walk_all_rows` + :func:`choose_path`, which follows the
path by the first failed test on a chain, depth by depth on another static tree, by
``[N, N]`` masks on a traced one). Both use the same
uniforms and laws and agree token for token (tests/test_accept.py) when batched alike. A traced tree may give
any row up to N children, so under ``without_replacement`` it keeps the tried tokens in a
dense per-token form stepped by a ``lax.scan`` over sibling ranks (``_rank_walk_dense`` in :mod:`jaxspec.core.residual`):
one traced step whatever N, instead of O(N^2) entries.

Randomness: one independent uniform per node (each node is tested at most once) and one
more, from a separate key, for the residual/bonus draw. No number is used twice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.residual import ResidualLaw, assemble_traced, eval_law_rows, rank_walk, row_law, walk_all_rows
from jaxspec.core.rule_types import AcceptResult, accept_result, check_inputs, tree_structure
from jaxspec.core.sampling import sample_categorical

__all__ = ["accept_core", "accept_probabilities", "choose_path"]


def accept_probabilities(parents, tokens, target_probs, draft_probs, *, scheme: str):
    """Per-node acceptance probability and per-row final residual (no randomness).

    Returns ``(accept_prob float32[N], residual float32[N + 1, V])``: ``accept_prob[j]`` is
    the probability that node j is accepted *given that it is tried*; ``residual[r]`` is
    the law emitted at row r when all of its children are rejected (for a leaf row,
    the row itself: the bonus law), normalized. Pure and jit-safe; the inputs are
    validated like :func:`~jaxspec.core.rules.speculative_accept`'s (shapes and dtypes always, values when
    concrete). (The rule itself evaluates only the one residual row it emits from.)
    """
    check_inputs(parents, tokens, target_probs, draft_probs, scheme)
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    accept, law = walk_all_rows(st, tokens, P, Q, scheme)
    rows = jnp.arange(tokens.shape[0] + 1)
    residual = jax.vmap(lambda r: row_law(law, r, P, Q))(rows)
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
    run the sibling steps of :func:`rank_walk` on that one row, follow the first child
    whose test passes. A row with K children costs K - 1 rejection steps over the
    vocabulary (one pass each; without replacement one more per row for the untried draft
    masses), so a round costs at most ``sum_d (K_d - 1)`` of them (K_d: the most children
    of a row at depth d) instead of one per rejected sibling of *every* row -- 8 instead of
    47 for (4, 3, 4) (11 without replacement: one draft-mass pass per row, not per rank). Same
    uniforms, same laws, same result as the all-rows form (checked in tests/test_accept.py).

    Returns ``(num_accepted, last, accepted_nodes int32[N], law, p, q)`` with ``law`` the
    final law of row ``last + 1`` (a :class:`ResidualLaw` without leading axis) and ``p, q:
    float32[V]`` the rows it is evaluated on (``q`` is zeros for a bonus law at small V:
    it has c = 0 and no entries, so ``q`` plays no part).
    """
    track = scheme == "without_replacement"
    width = st.children.shape[1] if track else 0  # entries of the final law
    cur = jnp.zeros((), jnp.int32)  # current row: last accepted node + 1
    alive = jnp.ones((), jnp.bool_)  # every node so far was accepted
    fin = ResidualLaw(jnp.zeros((), jnp.float32), jnp.full((width,), -1, jnp.int32),
               jnp.zeros((width,), jnp.float32), jnp.zeros((width,), jnp.bool_))
    path, stops = [], []
    for rows_d, k_d in _depth_levels(st):
        kid = _children_at(st, rows_d, k_d, cur)  # [K_d]
        p, q = _at_current(P, rows_d, cur), _at_current(Q, rows_d, cur)  # [V] each
        x = jnp.where(kid >= 0, tokens[jnp.maximum(kid, 0)], -1)
        per_rank, _, fin_entry, cont_entry, c_final = rank_walk(x[None], p[None], q[None], track)
        a = jnp.concatenate(per_rank)  # [K_d]
        go, node = _follow(kid, (kid >= 0) & (u[jnp.maximum(kid, 0)] < a), alive)
        law = jax.tree.map(lambda t: t[0], assemble_traced(x[None], c_final, fin_entry, cont_entry, track))
        if track and k_d < width:
            pad = width - k_d
            law = ResidualLaw(law.c, jnp.pad(law.toks, (0, pad), constant_values=-1),
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
    """The token rule for one tree (a :class:`~jaxspec.core.rule_types.Rule`: pure, no
    input checks): the path walk on a static branching tree under ``iid`` /
    ``without_replacement``, the all-rows form otherwise (same uniforms, same laws)."""
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)  # [N + 1, V]
    Q = jnp.asarray(draft_probs, jnp.float32)  # [N + 1, V]
    key_accept, key_emit = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)  # one per node, used once
    if _use_path_walk(st, scheme):
        num_accepted, last, accepted_nodes, law, p, q = _path_walk(st, tokens, P, Q, u, scheme)
        emit = eval_law_rows(law, p, q)
    else:
        accept_prob, law = walk_all_rows(st, tokens, P, Q, scheme)  # [N], rows' final laws
        num_accepted, last, accepted_nodes = choose_path(st, accept_prob, u)
        emit = row_law(law, last + 1, P, Q)
    extra = sample_categorical(key_emit, emit).astype(jnp.int32)
    return accept_result(tokens, num_accepted, last, accepted_nodes, extra)

