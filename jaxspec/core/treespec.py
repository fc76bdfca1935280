"""Tree specifications for :func:`jaxspec.generate`: what shape of draft tree a round uses.

``generate(tree=...)`` accepts, and :func:`resolve_tree` normalizes into a hashable,
frozen :class:`StaticTree` or :class:`DynamicTree` (part of the compile-cache key)::

    4                        -> chain of 4 nodes             parents [-1, 0, 1, 2]
    (3, 2, 1)                -> per-level branching (all >= 1), 3 + 6 + 6 = 15 nodes
    [-1, 0, 0, 1]            -> explicit parents (first entry -1, parents[i] < i)
    DynamicTree(depth=4, topk=4, num_nodes=16)   -> EAGLE-2 style, chosen per round
    "chain:4" | "4" | "branch:3,2,1" | "parents:-1,0,0,1" | "dynamic:depth=4,topk=4,nodes=16"

Static trees are relabeled breadth first (a stable sort by depth, so siblings keep their
order and the law of the emitted text is unchanged): each depth level is then a
contiguous block of node indices and the draft proposes a tree one level per forward.
Example, ``parents = [-1, 0, -1, 1]`` (node 1 is a child of node 0, node 2 of the root)::

    original  parents [-1, 0, -1, 1]   depths [1, 2, 1, 3]
    relabeled parents [-1, -1, 0, 2]   depths [1, 1, 2, 3]   levels [0:2] [2:3] [3:4]

A dynamic tree keeps ``N = num_nodes`` static and makes ``parents`` data (see
:mod:`jaxspec.decode.generate`); its candidates are fixed choices, so only the
``"deterministic"`` sibling scheme is valid for it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from jaxspec.checks import is_int
from jaxspec.core import tree as treelib

__all__ = ["StaticTree", "DynamicTree", "resolve_tree", "parse_tree", "MAX_TREE_NODES", "MAX_TREE_DEPTH",
           "MAX_DYNAMIC_POOL"]

#: the most nodes a tree may have: the verification forward covers every node and the tree
#: masks are N x N (the trees that pay have tens of nodes)
MAX_TREE_NODES = 1024
#: the deepest a tree may be: each level is one draft forward, unrolled in the compiled program
MAX_TREE_DEPTH = 64
#: the most candidates a DynamicTree may draft per round (``topk + (depth - 1) * topk**2``)
MAX_DYNAMIC_POOL = 1 << 16


def check_tree_size(what: str, nodes: int, depth: int) -> None:
    """``ValueError`` naming ``what`` when a tree of ``nodes`` nodes and ``depth`` levels
    exceeds :data:`MAX_TREE_NODES` or :data:`MAX_TREE_DEPTH`: checked before any array of
    the tree is built."""
    if nodes > MAX_TREE_NODES:
        raise ValueError(f"{what}: {nodes} nodes exceed MAX_TREE_NODES = {MAX_TREE_NODES} (the verification forward "
                         "covers every node and the tree masks are N x N; trees that pay have tens of nodes)")
    if depth > MAX_TREE_DEPTH:
        raise ValueError(f"{what}: depth {depth} exceeds MAX_TREE_DEPTH = {MAX_TREE_DEPTH} (each level is one draft "
                         "forward, unrolled in the compiled program)")


def _branching_size(widths) -> int:
    """Nodes of a per-level branching tree, counted without building it (Python integers:
    exact for any widths)."""
    total, level = 0, 1
    for w in widths:
        level *= max(int(w), 0)
        total += level
    return total


@dataclasses.dataclass(frozen=True)
class StaticTree:
    """A compile-time tree, stored breadth first: ``parents`` is a tuple of ints.

    Build with :meth:`from_parents` (any topological order; relabels breadth first).
    Derived numpy structure (depths, level slices, children groups) is cached.
    """

    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.parents) > MAX_TREE_NODES:
            check_tree_size("tree", len(self.parents), 0)
        par = treelib.validate_parents(np.asarray(self.parents, np.int64), name="tree")
        depth = _depths(par)
        check_tree_size("tree", par.size, int(depth.max(initial=0)))
        if np.any(np.diff(depth) < 0):
            raise ValueError(
                f"StaticTree.parents = {list(self.parents)}: expected breadth-first order "
                "(use StaticTree.from_parents to relabel)"
            )
        object.__setattr__(self, "parents", tuple(int(p) for p in par))

    @classmethod
    def from_parents(cls, parents) -> StaticTree:
        """Relabel a validated parents array breadth first (stable: siblings keep order)."""
        par = treelib.validate_parents(parents, name="tree")
        depth = _depths(par)
        order = np.argsort(depth, kind="stable")  # new index -> old index
        new_of_old = np.empty_like(order)
        new_of_old[order] = np.arange(order.size)
        old_par = par[order]
        new_par = np.where(old_par >= 0, new_of_old[np.maximum(old_par, 0)], -1)
        return cls(tuple(int(p) for p in new_par))

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def cache_slots(self) -> int:
        """KV-cache slots a round writes past the committed tokens, besides the root: N."""
        return self.num_nodes

    @functools.cached_property
    def parents_array(self) -> np.ndarray:
        """``int32[N]`` (breadth first)."""
        return np.asarray(self.parents, np.int32)

    @functools.cached_property
    def depths(self) -> np.ndarray:
        """``int32[N]``, 1 for children of the root; nondecreasing."""
        return _depths(self.parents_array)

    @property
    def depth(self) -> int:
        """Number of levels ``D`` (the deepest node's depth)."""
        return int(self.depths.max())

    @functools.cached_property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """``(start, end)`` node slices of depths ``1 .. D``."""
        out = []
        for d in range(1, self.depth + 1):
            idx = np.flatnonzero(self.depths == d)
            out.append((int(idx[0]), int(idx[-1]) + 1))
        return tuple(out)

    @functools.cached_property
    def full_mask(self) -> np.ndarray:
        """``bool[N + 1, N + 1]``: ancestor-or-self mask over ``[root] + nodes``
        (the tree ``[-1] + (parents + 1)``)."""
        return treelib.full_tree_mask(self.parents_array)

    @functools.cached_property
    def level_groups(self) -> tuple[tuple[tuple[np.ndarray, np.ndarray], ...], ...]:
        """Per parent level ``l = 0 .. D-1`` (0 = the root, ``l`` = nodes of depth ``l``):
        groups ``(rows int32[R], children int32[R, c])`` of probability rows (``row =
        node + 1``, 0 = root) having exactly ``c`` children, children in sibling order."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for j, p in enumerate(self.parents):
            kids[p + 1].append(j)
        row_level = np.concatenate([[0], self.depths])  # level of each row
        out = []
        for lvl in range(self.depth):
            rows = [r for r in np.flatnonzero(row_level == lvl).tolist() if kids[r]]
            groups = []
            for c in sorted({len(kids[r]) for r in rows}):
                rs = [r for r in rows if len(kids[r]) == c]
                groups.append(
                    (np.asarray(rs, np.int32), np.asarray([kids[r] for r in rs], np.int32))
                )
            out.append(tuple(groups))
        return tuple(out)

    @property
    def max_siblings(self) -> int:
        return int(np.bincount(self.parents_array + 1, minlength=self.num_nodes + 1).max())

    def __str__(self) -> str:
        return f"parents:{','.join(map(str, self.parents))}"


@dataclasses.dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 style tree chosen per round from the draft's cumulative log-probabilities.

    Depth 1: the ``topk`` most likely draft tokens after the root. Each further depth
    ``d <= depth``: the ``topk`` best nodes of depth ``d - 1`` (by cumulative draft
    log-probability) are expanded, each with its ``topk`` most likely children. Of all
    ``topk + (depth - 1) * topk**2`` candidates the best ``num_nodes`` (ties: shallower /
    earlier first, so ancestors always come along) form the tree, in breadth-first order.
    Parents are data of static size ``num_nodes``. Sibling scheme: ``"deterministic"``.
    """

    depth: int
    topk: int
    num_nodes: int

    def __post_init__(self):
        for name in ("depth", "topk", "num_nodes"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"DynamicTree.{name} = {v!r}: expected an integer >= 1")
            object.__setattr__(self, name, int(v))
        if self.num_nodes < self.depth:
            # a tree of num_nodes nodes is at most num_nodes deep, but every depth level costs a
            # draft forward per round: the extra levels would be drafted and never used
            raise ValueError(
                f"DynamicTree.num_nodes = {self.num_nodes} < depth = {self.depth}: a tree of "
                f"{self.num_nodes} nodes reaches depth {self.num_nodes} at most, while each round would "
                f"run {self.depth} draft forwards; expected num_nodes >= depth (e.g. depth={self.num_nodes})"
            )
        check_tree_size(f"DynamicTree(num_nodes={self.num_nodes}, depth={self.depth})", self.num_nodes, self.depth)
        if self.pool_size > MAX_DYNAMIC_POOL:
            raise ValueError(f"DynamicTree.topk = {self.topk}: topk + (depth - 1) * topk**2 = {self.pool_size} "
                             f"candidates per round exceed MAX_DYNAMIC_POOL = {MAX_DYNAMIC_POOL}")
        if self.num_nodes > self.pool_size:
            raise ValueError(
                f"DynamicTree.num_nodes = {self.num_nodes}: expected at most "
                f"topk + (depth - 1) * topk**2 = {self.pool_size} candidates"
            )

    @property
    def pool_size(self) -> int:
        """Candidates drafted per round: ``topk + (depth - 1) * topk**2``."""
        return self.topk + (self.depth - 1) * self.topk**2

    @property
    def expansion_slots(self) -> int:
        """Scratch cache slots used while expanding: ``(depth - 1) * topk``."""
        return (self.depth - 1) * self.topk

    @property
    def cache_slots(self) -> int:
        """KV-cache slots a round writes past the committed tokens, besides the root: the
        tree's N nodes or the expansion's scratch, whichever is more."""
        return max(self.num_nodes, self.expansion_slots)

    def __str__(self) -> str:
        return f"dynamic:depth={self.depth},topk={self.topk},nodes={self.num_nodes}"


def _depths(par: np.ndarray) -> np.ndarray:
    return treelib.static_depths(par)


def resolve_tree(tree) -> StaticTree | DynamicTree:
    """Normalize a ``tree=`` argument (see the module docstring); ``ValueError`` names it."""
    if isinstance(tree, (StaticTree, DynamicTree)):
        return tree
    if isinstance(tree, str):
        return parse_tree(tree)
    if is_int(tree):
        if tree < 1:
            raise ValueError(f"tree = {tree!r}: expected a chain length >= 1")
        check_tree_size(f"tree = {tree!r}", int(tree), int(tree))
        return StaticTree.from_parents(treelib.chain(int(tree)))
    if isinstance(tree, (Sequence, np.ndarray)) and not isinstance(tree, (bytes, bytearray)):
        try:
            arr = np.asarray(tree)
        except Exception:  # pragma: no cover - ragged / exotic input
            arr = None
        if arr is None or arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise ValueError(
                f"tree = {tree!r}: expected a non-empty 1-D integer sequence (parents "
                "starting with -1, or per-level branching widths >= 1)"
            )
        if int(arr[0]) == -1:
            check_tree_size(f"tree = parents of length {arr.size}", arr.size, 0)
            return StaticTree.from_parents(arr)
        if np.all(arr >= 1):
            check_tree_size(f"tree = {tuple(arr.tolist())}", _branching_size(arr.tolist()), arr.size)
            return StaticTree.from_parents(treelib.branching(tuple(int(w) for w in arr)))
        raise ValueError(
            f"tree = {list(arr.tolist())}: expected parents (first entry -1) or per-level "
            "branching widths (all >= 1)"
        )
    raise ValueError(
        f"tree = {tree!r}: expected an int (chain), a branching tuple, a parents sequence, "
        "a DynamicTree or a spec string such as 'branch:3,2,1'"
    )


def _ints(spec: str, body: str) -> list[int]:
    """The comma-separated integers after ':' (none for an empty body); an empty entry
    (``3,,2``, a trailing comma) or a non-integer is an error naming the spec."""
    if not body.strip():
        return []
    items = body.split(",")
    for i, x in enumerate(items):
        if not x.strip():
            raise ValueError(f"tree spec {spec!r}: entry {i} is empty; expected comma-separated integers after ':'")
    try:
        return [int(x) for x in items]
    except ValueError:
        raise ValueError(f"tree spec {spec!r}: expected comma-separated integers after ':'") from None


def parse_tree(spec: str) -> StaticTree | DynamicTree:
    """Parse a command-line tree spec.

    ``"chain:4"`` or ``"4"``, ``"branch:3,2,1"``, ``"parents:-1,0,0,1"``,
    ``"dynamic:depth=4,topk=4,nodes=16"``. Errors name the spec. ``"auto"`` (a tree
    chosen per device by :func:`jaxspec.tuning.autotree.auto_tree`) needs the models, so it is
    refused here with a message saying so.

    >>> parse_tree("branch:2,1")  # two children of the root, one child each; breadth first
    StaticTree(parents=(-1, -1, 0, 1))
    >>> parse_tree("dynamic:depth=4,topk=4,nodes=16")
    DynamicTree(depth=4, topk=4, num_nodes=16)
    >>> parse_tree("chain:x")
    Traceback (most recent call last):
    ValueError: tree spec 'chain:x': expected comma-separated integers after ':'
    """
    if not isinstance(spec, str):
        raise ValueError(f"tree spec = {spec!r}: expected a string")
    s = spec.strip()
    kind, sep, body = s.partition(":")
    kind = kind.strip().lower()
    try:
        if not sep:
            if kind == "auto":
                raise ValueError(
                    "'auto' is chosen by measuring a target/draft pair on this device, so it "
                    "needs the models: call jaxspec.auto_tree(target, draft, ...) and pass its "
                    "parents, or run `jaxspec generate --tree auto`"
                )
            if s.lstrip("-").isdigit():
                return resolve_tree(int(s))
            raise ValueError("expected 'chain:K', 'K', 'branch:...', 'parents:...' or 'dynamic:...'")
        if kind == "chain":
            vals = _ints(spec, body)
            if len(vals) != 1:
                raise ValueError("expected one integer, e.g. 'chain:4'")
            if vals[0] >= 1:
                check_tree_size(f"tree spec {spec!r}", vals[0], vals[0])
            return resolve_tree(vals[0])
        if kind in ("branch", "branching"):
            vals = _ints(spec, body)
            if not vals:
                raise ValueError("expected widths, e.g. 'branch:3,2,1'")
            if all(w >= 1 for w in vals):
                check_tree_size(f"tree spec {spec!r}", _branching_size(vals), len(vals))
            return StaticTree.from_parents(treelib.branching(tuple(vals)))
        if kind == "parents":
            vals = _ints(spec, body)
            if not vals:
                raise ValueError("expected parents, e.g. 'parents:-1,0,0,1'")
            check_tree_size(f"tree spec {spec!r}", len(vals), 0)
            return StaticTree.from_parents(vals)
        if kind == "dynamic":
            names = {"depth": "depth", "topk": "topk", "k": "topk", "nodes": "num_nodes", "num_nodes": "num_nodes"}
            kw = {}
            for i, item in enumerate(body.split(",")):
                if not item.strip():
                    raise ValueError(f"entry {i} is empty; expected e.g. 'dynamic:depth=4,topk=4,nodes=16'")
                key, eq, val = item.partition("=")
                key = key.strip().lower()
                if not eq or key not in names:
                    raise ValueError(f"unknown field {item.strip()!r}; expected depth=, topk=, nodes=")
                if names[key] in kw:
                    raise ValueError(f"field {key!r} given twice; expected each of depth=, topk=, nodes= once")
                try:
                    kw[names[key]] = int(val)
                except ValueError:
                    raise ValueError(f"{key} = {val.strip()!r} is not an integer") from None
            missing = [k for k in ("depth", "topk", "num_nodes") if k not in kw]
            if missing:
                raise ValueError(f"missing {missing}; expected e.g. 'dynamic:depth=4,topk=4,nodes=16'")
            return DynamicTree(**kw)
        raise ValueError(f"unknown kind {kind!r}; expected chain, branch, parents or dynamic")
    except ValueError as e:
        msg = str(e)
        if msg.startswith(f"tree spec {spec!r}"):
            raise
        raise ValueError(f"tree spec {spec!r}: {msg}") from None
