"""Tree topology optimization under a positional acceptance model (Sequoia-style).

**The model.** ``acceptance[k]`` (k = 0..K-1) is the probability that the k-th child (in
sibling order) of a node is the one accepted, the same at every node; ranks >= K count
as 0. A node whose root-to-node path takes sibling ranks ``r_1, ..., r_d`` is accepted
with probability ``acceptance[r_1] * ... * acceptance[r_d]``, so::

    E[accepted] = sum over nodes of the product of acceptance[rank] along its path
    E[tokens per round] = E[accepted] + 1

When every row of every round has the same target and draft laws (and sibling draws are
independent across rows) this is exact; on real text it is the standard approximation.

**The optimizer.** :func:`optimize_tree` maximizes ``E[accepted]`` over ordered trees of
``budget`` nodes and depth <= ``max_depth`` by dynamic programming over (depth left,
sibling rank, nodes left): ``O(max_depth * K * budget^2)`` float64 work, vectorized over
the node counts.

Example, ``acceptance = [0.6, 0.2, 0.1]``, ``budget = 6``, ``max_depth = 3``::

              root
            /      \\              node probabilities (products along paths)
           0        1             0: .6     1: .2     2: .36
          / \\       |             3: .12    4: .12    5: .216
         2   3      4             E[accepted] = 1.616, E[tokens] = 2.616
         |
         5

    optimize_tree([.6, .2, .1], 6, 3).parents == [-1, -1, 0, 0, 1, 2]

**Budget: exactly ``budget`` nodes.** Every node adds a nonnegative term, so the best tree
of at most ``budget`` nodes is also the best of exactly ``budget`` nodes, and the result
always has exactly ``budget`` nodes (static shapes). When the model credits the extra
nodes with nothing (e.g. ``acceptance = [0.8, 0, 0]``: a chain of ``max_depth`` nodes and
then nothing is worth anything), ties are broken toward *smaller earlier subtrees*, so the
surplus ends up as trailing leaf children of the root (ranks past the useful ones), where
it never changes the acceptance of the useful nodes. :func:`node_probabilities` shows
which nodes are worth their slot.

**Measuring the vector.** :func:`measure_acceptance` runs a target/draft pair over
held-out windows (teacher forcing: the law at every position of every window is one
sample of "a node's row") and averages, per rank k, the probability that the k-th sibling
drawn under the sibling scheme is the one accepted; :func:`positional_acceptance` does
the same from probability rows directly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.checks import is_int
from jaxspec.core import sampling as core_sampling
from jaxspec.core.settings import Sampling, check_sampling, draft_law
from jaxspec.core import tree as treelib
from jaxspec.core.token_rule import accept_probabilities
from jaxspec.nn.model import forward_logits

__all__ = [
    "OptimizedTree",
    "AcceptanceEstimate",
    "optimize_tree",
    "expected_accepted",
    "node_probabilities",
    "positional_acceptance",
    "measure_acceptance",
    "branching_widths",
]

#: slack allowed on ``sum(acceptance) <= 1`` (measured vectors carry float error)
SUM_TOL = 1e-6


class OptimizedTree(NamedTuple):
    """Result of :func:`optimize_tree`.

    Attributes:
      parents:           np.int32[budget], breadth first (each depth level a contiguous
                         block, siblings consecutive and in rank order), valid for
                         :func:`jaxspec.core.tree.validate_parents`.
      expected_tokens:   predicted tokens per round, ``expected_accepted + 1``.
      expected_accepted: predicted accepted draft nodes per round (the DP optimum).
    """

    parents: np.ndarray
    expected_tokens: float
    expected_accepted: float


class AcceptanceEstimate(NamedTuple):
    """Result of :func:`measure_acceptance` / :func:`positional_acceptance`.

    Attributes:
      mean:          float64[max_rank], ``mean[k]`` = estimated P(the k-th sibling is the one
                     accepted); entries in [0, 1], summing to <= 1.
      stderr:        float64[max_rank], standard error of ``mean`` treating positions as
                     independent (per-position values are exact for ``deterministic`` and
                     averaged over ``num_draws`` sibling draws otherwise, so the error covers
                     both the text and the draws; neighbouring positions of one window are
                     correlated, so read it as a lower bound; NaN for a single position).
      num_positions: number of positions (rows) averaged.
    """

    mean: np.ndarray
    stderr: np.ndarray
    num_positions: int


# ----------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------


def _check_acceptance(acceptance) -> np.ndarray:
    try:
        a = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"acceptance: expected a 1-D sequence of probabilities, got {acceptance!r}"
        ) from None
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(
            f"acceptance: expected a non-empty 1-D array of probabilities, got shape {a.shape}"
        )
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        i = int(np.flatnonzero(~(np.isfinite(a) & (a >= 0)))[0])
        raise ValueError(f"acceptance[{i}] = {float(a[i])}: expected a finite probability >= 0")
    total = float(a.sum())
    if total > 1.0 + SUM_TOL:
        raise ValueError(
            f"acceptance: sums to {total:.9g}; expected a sum <= 1 (each entry is the "
            "probability that the k-th sibling is the accepted one; tolerance "
            f"{SUM_TOL:g})"
        )
    return a


def _check_positive_int(name: str, value) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------------
# Expectation of a given tree
# ----------------------------------------------------------------------------------


def node_probabilities(parents, acceptance) -> np.ndarray:
    """float64[N]: P(node i is accepted) under the positional model = product of
    ``acceptance[rank]`` along its root-to-node path (ranks >= len(acceptance) count 0).

    Example: ``node_probabilities([-1, -1, 0], [.6, .3]) == [.6, .3, .36]``.
    """
    par = treelib.validate_parents(parents)
    a = _check_acceptance(acceptance)
    n = par.shape[0]
    ranks = np.zeros(n, np.int64)
    seen = np.zeros(n + 1, np.int64)  # children seen so far per row (row = parent + 1)
    prob = np.zeros(n, np.float64)
    for i, p in enumerate(par.tolist()):
        ranks[i] = seen[p + 1]
        seen[p + 1] += 1
        own = a[ranks[i]] if ranks[i] < a.shape[0] else 0.0
        prob[i] = own * (prob[p] if p >= 0 else 1.0)  # parents[i] < i: prob[p] is final
    return prob


def expected_accepted(parents, acceptance) -> float:
    """Positional-model ``E[accepted]`` of any tree: sum of :func:`node_probabilities`.

    Example: chain of 5 with ``acceptance = [0.7]``: ``0.7 + ... + 0.7**5 = 1.94117``.
    """
    return float(node_probabilities(parents, acceptance).sum())


# ----------------------------------------------------------------------------------
# The dynamic program
# ----------------------------------------------------------------------------------


def _solve(a: np.ndarray, budget: int, max_depth: int):
    """Tables of the DP.

    ``F[d, n]``: best value of a forest of exactly n nodes hung under one node, depth <= d
    (-inf when infeasible: n > 0 and d = 0). ``G_k[n]``: best value of children of ranks
    k, k+1, ... holding n nodes (a rank-k child exists iff n > 0). A rank-k child with a
    subtree of s nodes is worth ``a[k] * (1 + F[d-1, s-1])``; for k >= K nothing more is
    worth anything and the rest are leaves (``G_K = 0``). ``choice[d, k, n]`` is the
    smallest optimal s (argmax takes the first maximum).
    """
    b = budget
    d_max = min(max_depth, b)
    nz = np.flatnonzero(a > 0)
    k_max = min(int(nz[-1]) + 1 if nz.size else 0, b)  # trailing zero ranks: G_K = 0
    F = np.full((d_max + 1, b + 1), -np.inf)
    F[:, 0] = 0.0
    choice = np.ones((d_max + 1, max(k_max, 1), b + 1), np.int64)
    n_idx = np.arange(b + 1)
    s_idx = np.arange(1, b + 1)
    rem = n_idx[:, None] - s_idx[None, :]  # [b + 1, b] nodes left for later ranks
    valid = rem >= 0
    rem = np.maximum(rem, 0)
    for d in range(1, d_max + 1):
        sub = F[d - 1, :b]  # [b] best forest under the child, s - 1 = 0..b-1 nodes
        feasible = np.isfinite(sub)
        g = np.zeros(b + 1)  # G_K: leaves only, worth 0
        for k in range(k_max - 1, -1, -1):
            c = np.where(feasible, a[k] * (1.0 + np.where(feasible, sub, 0.0)), -np.inf)
            m = np.where(valid, c[None, :] + g[rem], -np.inf)  # [b + 1, b]
            best_s = np.argmax(m, axis=1)
            g_new = m[n_idx, best_s]
            g_new[0] = 0.0
            choice[d, k] = best_s + 1
            g = g_new
        F[d] = g
    return F, choice, d_max, k_max


def _build(choice, k_max: int, d: int, n: int) -> list:
    """Children of a node (each a list of its own children) holding n nodes, depth <= d."""
    kids = []
    k = 0
    while n > 0:
        s = int(choice[d, k, n]) if k < k_max else 1
        kids.append(_build(choice, k_max, d - 1, s - 1))
        n -= s
        k += 1
    return kids


def _breadth_first(root_children: list) -> np.ndarray:
    parents: list[int] = []
    frontier = [(-1, root_children)]
    while frontier:
        nxt = []
        for parent, kids in frontier:
            for sub in kids:
                nxt.append((len(parents), sub))
                parents.append(parent)
        frontier = nxt
    return np.asarray(parents, np.int32)


def optimize_tree(acceptance, budget: int, max_depth: int) -> OptimizedTree:
    """Best tree of exactly ``budget`` nodes, depth <= ``max_depth``, for a positional
    acceptance vector (see the module docstring for the model and the example).

    Args:
      acceptance: float[K], ``acceptance[k]`` = P(the k-th child of a node is the accepted
        one); entries >= 0, sum <= 1 (+1e-6). Ranks >= K count as 0.
      budget: number of draft nodes (>= 1); the result has exactly this many.
      max_depth: largest allowed depth (>= 1; depth 1 = children of the root).

    Returns:
      :class:`OptimizedTree`: ``parents`` breadth first with siblings in rank order, and
      the optimum ``expected_accepted`` (equal to :func:`expected_accepted` of
      ``parents``) and ``expected_tokens = expected_accepted + 1``.

    Raises:
      ValueError: naming the argument, for a bad acceptance vector, budget or max_depth.
    """
    a = _check_acceptance(acceptance)
    budget = _check_positive_int("budget", budget)
    max_depth = _check_positive_int("max_depth", max_depth)
    F, choice, d_max, k_max = _solve(a, budget, max_depth)
    parents = _breadth_first(_build(choice, k_max, d_max, budget))
    value = float(F[d_max, budget])
    return OptimizedTree(parents=treelib.validate_parents(parents), expected_tokens=value + 1.0,
                         expected_accepted=value)


def branching_widths(num_nodes: int, max_depth: int) -> list[tuple[int, ...]]:
    """Every per-level branching ``(b_1, ..., b_d)`` (all ``b_i >= 1``, ``d <= max_depth``)
    with exactly ``num_nodes`` nodes, ``b_1 + b_1 b_2 + ... + b_1 ... b_d``, in
    lexicographic order: the trees :func:`jaxspec.core.tree.branching` builds, the usual
    hand-picked alternatives to :func:`optimize_tree`.

    Example: ``branching_widths(6, 3) == [(1, 1, 4), (1, 5), (2, 1, 1), (2, 2), (3, 1), (6,)]``.
    """
    num_nodes = _check_positive_int("num_nodes", num_nodes)
    max_depth = _check_positive_int("max_depth", max_depth)
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], width: int, used: int) -> None:
        if used == num_nodes:
            out.append(prefix)
            return
        if len(prefix) == max_depth:
            return
        b = 1
        while used + width * b <= num_nodes:  # the next level adds width * b nodes
            extend(prefix + (b,), width * b, used + width * b)
            b += 1

    extend((), 1, 0)
    return out


# ----------------------------------------------------------------------------------
# Measuring the positional acceptance vector
# ----------------------------------------------------------------------------------


def _rank_probs_one(p, q, keys, max_rank: int, scheme: str):
    """float32[max_rank]: P(sibling k is the accepted one) at one row, averaged over the
    draws made with ``keys`` [num_draws] (exact, key unused, for ``deterministic``).

    p, q: float32[V] target law and draft proposal law of the row.
    """
    if scheme == "deterministic":
        tokens, _ = core_sampling.draw_deterministic(q, max_rank)  # draft top-k, ties by index
        # reach k = 1 - sum_{j<k} p(x_j); accept given reached = p(x_k) / reach -> p(x_k)
        return p[tokens]
    star = np.full((max_rank,), -1, np.int32)  # every sibling a child of the root
    v = p.shape[-1]
    P = jnp.broadcast_to(p, (max_rank + 1, v))  # only row 0 (the root's) is read
    Q = jnp.broadcast_to(q, (max_rank + 1, v))

    def one_draw(key):
        tokens, _ = core_sampling.draw(key, q, max_rank, scheme)
        acc, _ = accept_probabilities(star, tokens, P, Q, scheme=scheme)  # [R] | tried
        reach = jnp.cumprod(jnp.concatenate([jnp.ones((1,), acc.dtype), 1.0 - acc[:-1]]))
        return acc * reach

    return jnp.mean(jax.vmap(one_draw)(keys), axis=0)


@functools.partial(jax.jit, static_argnames=("max_rank", "scheme"))
def _rank_probs(P, Q, keys, *, max_rank: int, scheme: str):
    """float32[M, max_rank] for rows P, Q float32[M, V], keys [M, num_draws]."""
    return jax.vmap(lambda p, q, k: _rank_probs_one(p, q, k, max_rank, scheme))(P, Q, keys)


_forward = nnx.jit(forward_logits)  # one compile per model structure and window shape


@functools.partial(jax.jit, static_argnames=("max_rank", "scheme", "target_warp", "draft_warp"))
def _warped_rank_probs(t_logits, d_logits, keys, *, max_rank, scheme, target_warp, draft_warp):
    """float32[M, max_rank] from raw logits float32[M, V] of both models, keys [M, draws]."""
    P = core_sampling.warp_probs(t_logits, **dict(target_warp))
    Q = core_sampling.warp_probs(d_logits, **dict(draft_warp))
    return jax.vmap(lambda p, q, k: _rank_probs_one(p, q, k, max_rank, scheme))(P, Q, keys)


class _Moments:
    """Streaming float64 sum / sum of squares per rank."""

    def __init__(self, r: int):
        self.n, self.s, self.ss = 0, np.zeros(r), np.zeros(r)

    def add(self, x):
        x = np.asarray(x, np.float64)
        self.n += x.shape[0]
        self.s += x.sum(axis=0)
        self.ss += np.square(x).sum(axis=0)

    def result(self) -> AcceptanceEstimate:
        mean = self.s / self.n
        if self.n > 1:
            var = np.maximum(self.ss / self.n - np.square(mean), 0.0) * self.n / (self.n - 1)
        else:  # one position: no spread to estimate from
            var = np.full_like(mean, np.nan)
        return AcceptanceEstimate(mean=mean, stderr=np.sqrt(var / self.n), num_positions=self.n)


def _check_scheme_rank(scheme, max_rank, v: int) -> int:
    core_sampling.check_scheme(scheme)
    max_rank = _check_positive_int("max_rank", max_rank)
    if scheme != "iid" and max_rank > v:
        raise ValueError(
            f"max_rank: {max_rank} distinct siblings requested but the vocabulary has {v} "
            f"tokens; scheme={scheme!r} needs max_rank <= vocab_size"
        )
    return max_rank


def check_draws(scheme, key, num_draws) -> tuple[int, jax.Array | None]:
    """``(num_draws, key)`` checked: the key as a typed key (None allowed under deterministic)."""
    num_draws = _check_positive_int("num_draws", num_draws)
    if scheme != "deterministic" and key is None:
        raise ValueError(f"key: scheme={scheme!r} draws siblings at random; pass a jax.random.key")
    return num_draws, None if key is None else core_sampling.check_key(key)


def _keys(key, chunk: int, m: int, num_draws: int):
    if key is None:  # deterministic: unused, any placeholder of the right shape
        key = jax.random.key(0)
    return jax.random.split(jax.random.fold_in(key, chunk), (m, num_draws))


def positional_acceptance(
    target_probs, draft_probs, *, max_rank: int, scheme: str, key=None, num_draws: int = 16,
    chunk_size: int = 4096,
) -> AcceptanceEstimate:
    """Positional acceptance from probability rows: each row pair (p, q) is one node's
    target and draft law, and the estimate averages over rows.

    Args:
      target_probs, draft_probs: float[M, V] target laws and the draft's proposal laws
        (after warps; rows sum to 1).
      max_rank: number of sibling ranks to measure (the K of :func:`optimize_tree`).
      scheme: ``"deterministic"`` (siblings = draft top-k, ties by lowest index:
        P(k-th accepted) = p(x_k) exactly), ``"iid"`` or ``"without_replacement"``
        (siblings drawn with :func:`jaxspec.core.sampling.draw`; the conditional probability
        that sibling k is the accepted one given the draws is exact,
        :func:`jaxspec.core.acceptance.accept_probabilities`, averaged over ``num_draws``).
      key: ``jax.random.key`` (required unless deterministic).
      num_draws: sibling draws per row for the random schemes.
      chunk_size: rows per jitted call (memory ~ chunk_size * num_draws * max_rank * V).
    """
    P = np.asarray(target_probs, np.float32)
    Q = np.asarray(draft_probs, np.float32)
    if P.ndim != 2 or P.shape[0] == 0:
        raise ValueError(f"target_probs: expected shape [M, V] with M >= 1, got {P.shape}")
    if Q.shape != P.shape:
        raise ValueError(f"draft_probs: expected shape {P.shape} like target_probs, got {Q.shape}")
    max_rank = _check_scheme_rank(scheme, max_rank, P.shape[1])
    num_draws, key = check_draws(scheme, key, num_draws)
    chunk_size = _check_positive_int("chunk_size", chunk_size)
    mom = _Moments(max_rank)
    for c, start in enumerate(range(0, P.shape[0], chunk_size)):
        p, q = P[start : start + chunk_size], Q[start : start + chunk_size]
        m = p.shape[0]
        if m < chunk_size and start > 0:  # pad the tail to the compiled shape
            pad = chunk_size - m
            p = np.concatenate([p, np.repeat(p[:1], pad, 0)])
            q = np.concatenate([q, np.repeat(q[:1], pad, 0)])
        keys = _keys(key, c, p.shape[0], num_draws)
        mom.add(np.asarray(_rank_probs(p, q, keys, max_rank=max_rank, scheme=scheme))[:m])
    return mom.result()


def _warp_key(law: Sampling) -> tuple:
    """The law's static warp and temperature as a hashable key of the jitted function."""
    w = law.warp
    return (("temperature", law.temperature), ("top_k", w.top_k), ("top_p", w.top_p), ("min_p", w.min_p))


def measure_acceptance(
    target,
    draft,
    tokens,
    *,
    max_rank: int,
    scheme: str,
    sampling: Sampling | None = None,
    draft_sampling: Sampling | None = None,
    key=None,
    num_draws: int = 16,
    batch_size: int = 8,
) -> AcceptanceEstimate:
    """Positional acceptance vector of a target/draft pair on held-out windows.

    Both models run :func:`jaxspec.nn.model.forward_logits` over ``tokens`` (teacher forcing);
    the law after every position of every window is one sample row: ``p`` = target warped
    by ``sampling``, ``q`` = draft warped by ``draft_sampling``, and
    :func:`positional_acceptance` semantics apply to the B * T rows.

    Args:
      target, draft: :class:`~jaxspec.nn.model.Transformer` with the same vocabulary.
      tokens: int[B, T] held-out windows.
      max_rank, scheme, key, num_draws: as :func:`positional_acceptance`.
      sampling: the target law, a :class:`jaxspec.Sampling` (``None``: ``Sampling()``).
      draft_sampling: the draft's proposal law; ``None`` follows :func:`jaxspec.generate`:
        the target's law for ``iid`` / ``without_replacement``, ``Sampling()`` for
        ``deterministic`` (:func:`jaxspec.core.settings.draft_law`).
      batch_size: windows per jitted call (the last batch is padded to this size).

    Returns:
      :class:`AcceptanceEstimate` (mean, stderr float64[max_rank], num_positions = B * T).

    Example::

        est = measure_acceptance(target, draft, windows, max_rank=4, scheme="deterministic")
        tree = optimize_tree(est.mean, budget=32, max_depth=8).parents
    """
    v = None
    for name, model in (("target", target), ("draft", draft)):
        cfg = getattr(model, "config", None)
        if cfg is None or not hasattr(cfg, "vocab_size"):
            raise ValueError(f"{name}: expected a jaxspec Transformer, got {type(model).__name__}")
        if v is None:
            v = cfg.vocab_size
        elif cfg.vocab_size != v:
            raise ValueError(
                f"draft: vocab_size = {cfg.vocab_size}; expected the target's vocab_size = {v}"
            )
    tok = np.asarray(tokens)
    if tok.ndim != 2 or tok.shape[0] == 0 or tok.shape[1] == 0:
        raise ValueError(f"tokens: expected a non-empty int array [B, T], got shape {tok.shape}")
    if tok.dtype.kind not in "iu":
        raise ValueError(f"tokens: expected an integer dtype, got {tok.dtype}")
    if tok.min() < 0 or tok.max() >= v:
        raise ValueError(
            f"tokens: expected token ids in [0, {v}), got range [{tok.min()}, {tok.max()}]"
        )
    max_rank = _check_scheme_rank(scheme, max_rank, v)
    num_draws, key = check_draws(scheme, key, num_draws)
    batch_size = _check_positive_int("batch_size", batch_size)
    law = check_sampling("sampling", sampling, Sampling())
    target_warp = _warp_key(law)
    draft_warp = _warp_key(draft_law(scheme, law, check_sampling("draft_sampling", draft_sampling)))
    tok = tok.astype(np.int32)
    b, t = tok.shape
    bs = min(batch_size, b)
    mom = _Moments(max_rank)
    for c, start in enumerate(range(0, b, bs)):
        rows = tok[start : start + bs]
        m = rows.shape[0]
        if m < bs:  # pad the tail to the compiled shape; padded rows are dropped
            rows = np.concatenate([rows, np.repeat(rows[:1], bs - m, 0)])
        keys = _keys(key, c, bs * t, num_draws)
        rows = jnp.asarray(rows)
        t_logits = _forward(target, rows).reshape(bs * t, v)  # [B * T, V]
        d_logits = _forward(draft, rows).reshape(bs * t, v)
        out = _warped_rank_probs(
            t_logits, d_logits, keys, max_rank=max_rank, scheme=scheme,
            target_warp=target_warp, draft_warp=draft_warp,
        )
        mom.add(np.asarray(out)[: m * t])
    return mom.result()
