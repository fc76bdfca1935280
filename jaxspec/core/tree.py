"""Tree topology: one convention everywhere (see docs/DESIGN.md §1).

A tree of ``N`` draft nodes is an int32 array ``parents[N]`` in topological order:
``parents[i] < i`` and ``parents[i] == -1`` means "child of the root". The root is the
last committed token; it is not a node. Siblings are ordered by index.

Example, ``parents = [-1, -1, 0, 0, 1, 2]``::

        root
       /    \\
      0      1
     / \\     |
    2   3    4
    |
    5

    >>> parents = [-1, -1, 0, 0, 1, 2]
    >>> print(tree_mask(parents).astype(int))  # ancestor-or-self: row i = what node i attends to
    [[1 0 0 0 0 0]
     [0 1 0 0 0 0]
     [1 0 1 0 0 0]
     [1 0 0 1 0 0]
     [0 1 0 0 1 0]
     [1 0 1 0 0 1]]
    >>> print(tree_depths(parents))
    [1 1 2 2 2 3]

Every function here is pure ``jnp`` and works both when ``parents`` is a compile-time
constant (list, numpy array) and when it is traced data (dynamic trees): no Python
control flow on its values. Concrete input is validated (:func:`validate_parents`);
traced input cannot be and is not validated.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_concrete

__all__ = [
    "ancestor_mask",
    "full_tree_mask",
    "static_depths",
    "validate_parents",
    "tree_mask",
    "tree_depths",
    "tree_positions",
    "tree_paths",
    "tree_children",
    "sibling_ranks",
    "chain",
    "branching",
    "from_parents",
    "max_siblings",
]


def validate_parents(parents, *, name: str = "parents") -> np.ndarray:
    """Check a concrete parents array and return it as ``np.int32[N]``.

    Raises ``ValueError`` naming the offending index, its value and the rule broken.
    """
    if not is_concrete(parents):
        raise TypeError(f"{name}: cannot validate a traced array; pass concrete values")
    try:
        arr = np.asarray(parents)
    except Exception as e:  # pragma: no cover - exotic inputs
        raise ValueError(f"{name}: expected a 1-D integer sequence, got {type(parents).__name__}") from e
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of parent indices, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one node, got an empty array")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(np.floor(arr) == arr):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name}: expected integer parent indices, got dtype {arr.dtype}")
    for i, p in enumerate(arr.tolist()):
        if p < -1:
            raise ValueError(
                f"{name}[{i}] = {p}: parent indices must be >= -1 (-1 means child of the root)"
            )
        if p >= i:
            raise ValueError(
                f"{name}[{i}] = {p}: parents must be topologically ordered, parents[i] < i"
            )
    return arr.astype(np.int32)


def check_traced_parents(parents, *, name: str = "parents") -> None:
    """What can be checked of a traced parents array: its shape and dtype (known under
    ``jit``); its values cannot be. ``ValueError`` naming ``name`` otherwise."""
    shape, dtype = jnp.shape(parents), jnp.result_type(parents)
    if len(shape) != 1:
        raise ValueError(f"{name}: expected a 1-D array of parent indices, got shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name}: expected at least one node, got an empty array")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{name}: expected integer parent indices, got dtype {dtype}")


def _as_parents(parents) -> jax.Array:
    """Validate when concrete (shape and dtype only when traced), then return an int32
    jnp array."""
    if is_concrete(parents):
        return jnp.asarray(validate_parents(parents))
    check_traced_parents(parents)
    return jnp.asarray(parents, dtype=jnp.int32)


def ancestor_mask(parents):
    """Ancestor-or-self mask ``bool[N, N]`` (``mask[i, j]`` iff j is i or an ancestor of i),
    as numpy for concrete ``parents`` -- a compile-time constant when used under jit, where
    jnp operations on constants would be staged into the program -- and as a jnp array
    (:func:`tree_mask`) for traced ones."""
    if not is_concrete(parents):
        return tree_mask(parents)
    par = validate_parents(parents)
    mask = np.eye(par.shape[0], dtype=bool)
    for j, p in enumerate(par.tolist()):  # topological order: the parent's row is final
        if p >= 0:
            mask[j] |= mask[p]
    return mask


def static_depths(parents) -> np.ndarray:
    """``int32[N]`` depth of each node of concrete ``parents`` (1 for children of the
    root), in O(N) time and memory: trees too large for an N x N mask are measured and
    refused by their size, not by running out of memory."""
    par = validate_parents(parents)
    depth = np.zeros(par.shape[0], np.int32)
    for j, p in enumerate(par.tolist()):
        depth[j] = 1 if p < 0 else depth[p] + 1
    return depth


def full_tree_mask(parents):
    """``bool[N + 1, N + 1]`` ancestor-or-self mask over ``[root] + nodes``: the tree
    ``[-1] + (parents + 1)``; numpy for concrete ``parents``, jnp for traced ones::

        parents [-1, 0]  ->  [[1, 0, 0],
                              [1, 1, 0],
                              [1, 1, 1]]
    """
    if is_concrete(parents):
        par = validate_parents(parents)
        return ancestor_mask(np.concatenate([[-1], par + 1]).astype(np.int32))
    par = jnp.asarray(parents, jnp.int32)
    return tree_mask(jnp.concatenate([jnp.full((1,), -1, jnp.int32), par + 1]))


def tree_mask(parents) -> jax.Array:
    """Ancestor-or-self mask ``bool[N, N]``: ``mask[i, j]`` iff j is i or an ancestor of i.

    Concrete ``parents`` are validated and built in numpy (:func:`ancestor_mask`); traced
    ones by a scan over nodes in topological order (row i = e_i | row parents[i]).
    """
    if is_concrete(parents):
        return jnp.asarray(ancestor_mask(parents))
    parents = _as_parents(parents)
    n = parents.shape[0]
    eye = jnp.eye(n, dtype=jnp.bool_)

    def body(i, mask):
        p = parents[i]
        parent_row = jnp.where(p >= 0, mask[jnp.maximum(p, 0)], jnp.zeros((n,), jnp.bool_))
        return mask.at[i].set(eye[i] | parent_row)

    return jax.lax.fori_loop(0, n, body, eye)


def tree_depths(parents) -> jax.Array:
    """``int32[N]``: depth of each node, 1 for children of the root."""
    return jnp.sum(tree_mask(parents), axis=1, dtype=jnp.int32)


def _check_committed_len(committed_len) -> None:
    """Concrete ``committed_len``: integer counts >= 1 (integral floats allowed)."""
    a = None if isinstance(committed_len, (bool, np.bool_, str)) else np.asarray(committed_len)
    if a is None or a.dtype.kind not in "iuf":
        bad_at, value = None, committed_len
    else:
        flat = a.ravel()
        bad = ~(flat >= 1)  # also NaN
        if a.dtype.kind == "f":
            bad |= ~np.isfinite(flat) | (np.floor(flat) != flat)
        if not bad.any():
            return
        bad_at = int(np.flatnonzero(bad)[0]) if a.ndim else None
        value = flat[bad_at or 0].item()
    where = "" if bad_at is None else f"[{bad_at}]"
    raise ValueError(
        f"committed_len{where} = {value!r}: expected the number of committed tokens, an "
        "integer >= 1 (the root, the last committed token, sits at position committed_len - 1)"
    )


def tree_positions(parents, committed_len) -> jax.Array:
    """Position ids ``committed_len - 1 + depth`` (the root sits at ``committed_len - 1``).

    ``committed_len`` (the number of committed tokens, root included) may be a scalar or
    an array ``[B]``; the result is ``int32[N]`` or ``int32[B, N]``. Concrete values must
    be integers >= 1 (``ValueError`` otherwise); traced values are not checked.
    """
    if is_concrete(committed_len):
        _check_committed_len(committed_len)
    depth = tree_depths(parents)
    committed_len = jnp.asarray(committed_len, jnp.int32)
    return committed_len[..., None] - 1 + depth


def tree_paths(parents) -> jax.Array:
    """Root-to-node paths ``int32[N, N]``, -1 padded.

    ``paths[i, d]`` is the ancestor-or-self of node i at depth ``d + 1``; entries past
    ``depth[i]`` are -1. Example above: ``paths[5] = [0, 2, 5, -1, -1, -1]``.
    """
    mask = tree_mask(parents)  # [N, N]
    depth = jnp.sum(mask, axis=1, dtype=jnp.int32)  # [N]
    n = mask.shape[0]
    d = jnp.arange(1, n + 1, dtype=jnp.int32)  # [N] candidate depths
    # hit[i, d, j]: j is on i's path and sits at depth d+1
    hit = mask[:, None, :] & (depth[None, None, :] == d[None, :, None])
    found = jnp.any(hit, axis=2)
    return jnp.where(found, jnp.argmax(hit, axis=2).astype(jnp.int32), -1)


def sibling_ranks(parents) -> jax.Array:
    """``int32[N]``: 0 for the first child of its parent, 1 for the second, ..."""
    parents = _as_parents(parents)
    n = parents.shape[0]
    idx = jnp.arange(n)
    earlier_same = (parents[None, :] == parents[:, None]) & (idx[None, :] < idx[:, None])
    return jnp.sum(earlier_same, axis=1, dtype=jnp.int32)


def tree_children(parents) -> jax.Array:
    """Children in sibling order, ``int32[N + 1, N]``, -1 padded.

    Row 0 lists the root's children, row ``i + 1`` those of node i (the probability-row
    convention). Example above: row 0 = ``[0, 1, -1, ...]``, row 1 = ``[2, 3, -1, ...]``.
    """
    parents = _as_parents(parents)
    n = parents.shape[0]
    ranks = sibling_ranks(parents)
    out = jnp.full((n + 1, n), -1, dtype=jnp.int32)
    return out.at[parents + 1, ranks].set(jnp.arange(n, dtype=jnp.int32))


def max_siblings(parents) -> int:
    """Largest number of children of any row (static; needs concrete ``parents``)."""
    arr = validate_parents(parents)
    return int(np.bincount(arr + 1, minlength=arr.shape[0] + 1).max())


# ----------------------------------------------------------------------------------
# Constructors (return validated numpy int32 arrays: compile-time constants)
# ----------------------------------------------------------------------------------


def chain(k: int) -> np.ndarray:
    """A chain of ``k`` nodes: ``[-1, 0, 1, ..., k-2]``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"chain: k = {k!r}; expected an integer >= 1")
    return np.arange(-1, k - 1, dtype=np.int32)


def branching(widths: Sequence[int]) -> np.ndarray:
    """Per-level branching: ``(3, 2, 1)`` = 3 root children, 2 children each, 1 child each.

    Nodes are numbered breadth first, siblings consecutive, so the result is
    topologically ordered. ``branching((3, 2, 1))`` has 3 + 6 + 6 = 15 nodes.
    """
    try:
        widths = tuple(widths)
    except TypeError:
        raise ValueError(
            f"branching: widths = {widths!r}; expected a sequence of integers >= 1 "
            "(one width per level), e.g. (3, 2)"
        ) from None
    if not widths:
        raise ValueError("branching: widths = (); expected at least one level")
    for lvl, w in enumerate(widths):
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise ValueError(f"branching: widths[{lvl}] = {w!r}; expected an integer >= 1")
    parents: list[int] = []
    frontier = [-1]
    for w in widths:
        nxt = []
        for p in frontier:
            for _ in range(w):
                nxt.append(len(parents))
                parents.append(p)
        frontier = nxt
    return np.asarray(parents, dtype=np.int32)


def from_parents(parents: Sequence[int]) -> np.ndarray:
    """An explicit parents list, validated."""
    return validate_parents(parents)
