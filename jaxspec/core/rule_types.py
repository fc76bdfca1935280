"""The shared types of the verification rules: what a rule returns (:class:`AcceptResult`,
built by :func:`accept_result`), what a rule is (:class:`Rule`), the static structure of a
drafted tree the rules read (:class:`TreeStructure`, :func:`tree_structure`) and the one
boundary check of a rule's inputs (:func:`check_inputs`).

The rules themselves import this module and nothing of each other: the token rule
(:mod:`jaxspec.core.token_rule`), block verification (:mod:`jaxspec.core.block`) and
traversal verification (:mod:`jaxspec.core.traversal`); the registry and
:func:`~jaxspec.core.rules.speculative_accept` (:mod:`jaxspec.core.rules`) import them all.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_concrete
from jaxspec.core import tree as treelib
from jaxspec.core.sampling import array_dtype, check_scheme, check_tokens, row_sum_tol

__all__ = ["AcceptResult", "Rule", "TreeStructure", "accept_result", "check_drawable", "check_inputs", "tree_structure"]


class AcceptResult(NamedTuple):
    """Outcome of one round for one tree (add a leading batch axis under ``vmap``).

    Attributes:
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



class Rule(Protocol):
    """A verification rule for one drafted tree: pure, jit- and vmap-able, no input checks
    (the caller validated them with :func:`check_inputs`)::

        rule(key, parents int32[N], tokens int32[N], target_probs float32[N + 1, V],
             draft_probs float32[N + 1, V], scheme: str) -> AcceptResult

    with the conventions of docs/DESIGN.md §1: row 0 is the law at the root, row ``i + 1``
    the law after node i; ``draft_probs[r]`` is the law the children of row ``r`` were drawn
    from under ``scheme`` (``"iid"``, ``"without_replacement"`` or ``"deterministic"``). It
    returns the accepted path and one extra token (:func:`accept_result` builds the value).
    The built-in rules are :func:`jaxspec.core.token_rule.accept_core`,
    :func:`jaxspec.core.block.block_accept` and :func:`jaxspec.core.traversal.traversal_accept`.
    """

    def __call__(self, key: jax.Array, parents, tokens: jax.Array, target_probs: jax.Array,
                 draft_probs: jax.Array, scheme: str) -> AcceptResult: ...


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



def check_drawable(parents, tokens, draft_probs, scheme: str) -> None:
    """With concrete inputs under a sampling scheme (``iid``, ``without_replacement``):
    ``ValueError`` naming the first node whose token its draft law could not have drawn,
    ``draft_probs[parent row][token] == 0``. Such a token is accepted with certainty
    (``p / q = inf``): the sign that ``draft_probs`` is not the law the tokens were drawn
    from (other warps than the draws'), which no lossless rule can repair. Without
    replacement a sibling may have ``q = 0`` once the earlier siblings took all of ``q``'s
    mass. The ``deterministic`` scheme reads no ``q``."""
    if scheme == "deterministic" or not all(is_concrete(x) for x in (parents, tokens, draft_probs)):
        return
    par = np.asarray(parents, np.int64)
    tok = np.asarray(tokens, np.int64)
    q = np.asarray(draft_probs, np.float64)
    tol = row_sum_tol(np.asarray(draft_probs).dtype)
    taken: dict[int, list[int]] = {}
    for i, (p, t) in enumerate(zip(par.tolist(), tok.tolist())):
        row = p + 1
        earlier = taken.setdefault(row, [])
        if q[row, t] <= 0.0:
            left = 1.0 - q[row, sorted(set(earlier))].sum() if scheme == "without_replacement" else 1.0
            if left > tol:
                raise ValueError(
                    f"tokens[{i}] = {t}: draft_probs[{row}][{t}] = 0, so the draft law of node {i}'s parent row "
                    f"could not have drawn it; expected draft_probs to be the law the tokens were drawn from "
                    f"(after the same warps)")
        earlier.append(t)


def check_inputs(parents, tokens, target_probs, draft_probs, scheme):
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

