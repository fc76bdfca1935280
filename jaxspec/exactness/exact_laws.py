"""Exact reference values of the exactness harness (:mod:`jaxspec.exactness`), enumerated
from the models, never sampled:

* :func:`exact_law`: the law of the first ``L`` tokens sampled after a prompt from the
  warped target, as a prefix tree over its support (one batched
  :func:`~jaxspec.nn.model.forward_logits` per level, rows warped by
  :func:`~jaxspec.core.sampling.warp_probs` and renormalized in float64);
* :func:`expected_acceptance`: the first round's expected accepted nodes per depth, over
  every draft draw of a static tree, with the acceptance rule re-read from docs/DESIGN.md §2 in
  float64 numpy (independent of :mod:`jaxspec.core.acceptance`).

Cells: token sequences of positive exact probability (``V**L`` of them at most, only
``top_k**L`` under a top-k). More than :data:`MAX_CELLS` cells is refused: pass a ``top_k``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.core.sampling import warp_probs
from jaxspec.core.treespec import StaticTree
from jaxspec.nn.head import FeatureHead
from jaxspec.nn.model import Transformer, forward_features, forward_logits

__all__ = ["MAX_CELLS", "MAX_ACCEPT_TERMS", "ExactLaw", "exact_law", "cells_bound", "expected_acceptance"]

#: most joint cells (token sequences of positive probability) a run may have
MAX_CELLS = 1 << 20
#: most draft draws enumerated for the exact acceptance expectation
MAX_ACCEPT_TERMS = 2_000_000


# --------------------------------------------------------------------------- exact laws


@functools.lru_cache(maxsize=16)
def _logits_at_fn(graphdef):
    @jax.jit
    def f(state, tokens, pos):  # tokens int32[n, T], pos int32[] -> float32[n, V]
        return forward_logits(nnx.merge(graphdef, state), tokens)[:, pos]

    return f


@functools.lru_cache(maxsize=16)
def _head_logits_at_fn(head_def, target_def, prompt_len: int, width: int):
    @jax.jit
    def f(states, tokens, pos):  # tokens int32[n, T], pos int32[] -> float32[n, V]
        head, target = nnx.merge(head_def, states[0]), nnx.merge(target_def, states[1])
        feats = forward_features(target, tokens)  # [n, T, D]: entry p is the input of position p + 1
        d = pos - (prompt_len - 1)  # drafted tokens on the path
        for k in range(width):  # from the root's position on, the head reads its own predictions
            p = prompt_len - 1 + k
            pred = head.teacher_forced(target, tokens, feats)[:, p]
            feats = feats.at[:, p].set(jnp.where(k < d, pred, feats[:, p]))
        return head.logits(target, head.teacher_forced(target, tokens, feats)[:, pos][:, None])[:, 0]

    return f


def _next_laws(model: Transformer | FeatureHead, prompt: Sequence[int], paths: np.ndarray, warp: dict, *,
               width: int, batch: int, raw: bool = False, target: Transformer | None = None) -> np.ndarray:
    """float64[n, V]: warped next-token law after ``prompt + paths[i]`` (``paths`` int[n, d]),
    renormalized in float64 (``raw``: the float32 rows of :func:`warp_probs`).

    A feature head (``model`` a :class:`~jaxspec.nn.head.FeatureHead`, with its ``target``):
    its law in the first round of a generation from ``prompt``, where the pairs up to the
    root (the last prompt token) read the target's features and every drafted node reads
    its parent's predicted feature, computed here by teacher forcing on the whole sequence,
    one position at a time (not through the round's cache).

    Every call has the shape ``[batch, len(prompt) + width]`` (paths right-padded; the
    causal forward never looks right), so one compilation serves every level."""
    if isinstance(model, FeatureHead):
        hdef, hstate = nnx.split(model)
        tdef, tstate = nnx.split(target)
        f, state = _head_logits_at_fn(hdef, tdef, len(prompt), width), (hstate, tstate)
    else:
        gdef, state = nnx.split(model)
        f = _logits_at_fn(gdef)
    n, d = paths.shape
    t = len(prompt)
    seqs = np.zeros((n, t + width), np.int32)
    seqs[:, :t] = prompt
    seqs[:, t : t + d] = paths
    out = []
    for s in range(0, n, batch):
        rows = seqs[s : s + batch]
        padded = np.concatenate([rows, np.zeros((batch - rows.shape[0], t + width), np.int32)])
        logits = f(state, jnp.asarray(padded), jnp.int32(t - 1 + d))[: rows.shape[0]]
        out.append(np.asarray(warp_probs(logits, **warp)))
    probs = np.concatenate(out, axis=0)
    if raw:
        return probs
    probs = probs.astype(np.float64)
    return probs / probs.sum(axis=1, keepdims=True)


def _batch_for(v: int, top_k: int | None, levels: int) -> int:
    """Rows per enumeration forward: enough for the widest level, at most 2048."""
    k = v if top_k is None else min(v, top_k)
    widest = k ** max(levels - 1, 0)
    return int(min(2048, 1 << max(3, math.ceil(math.log2(max(widest, 1))))))


@dataclasses.dataclass(frozen=True, eq=False)
class ExactLaw:
    """The exact law of the first ``L`` tokens, as a prefix tree over the support.

    ``cells int32[C, L]`` (lexicographic), ``probs float64[C]``, ``marginals float64[L, V]``;
    ``levels[l] = (parent int32[n_l], token int32[n_l])``: nodes of depth ``l + 1`` sorted
    by (parent, token); the leaves (depth ``L``) are the cells.
    """

    cells: np.ndarray
    probs: np.ndarray
    marginals: np.ndarray
    levels: tuple[tuple[np.ndarray, np.ndarray], ...]


def cells_bound(vocab_size: int, horizon: int, *, temperature: float = 1.0, top_k: int | None = None,
                cap: int = MAX_CELLS) -> int:
    """The most joint cells the law of ``horizon`` tokens can have, known before any model
    is run: ``min(top_k, vocab_size)**horizon`` (``vocab_size**horizon`` without a top-k;
    a top-p can only cut it), one at temperature 0. Saturates: ``cap + 1`` stands for any
    count above ``cap`` (a horizon of 10**20 is not raised to its power)."""
    if temperature == 0:
        return 1
    k = vocab_size if top_k is None else min(int(top_k), vocab_size)
    if k <= 1:
        return 1
    n = 1
    for _ in range(horizon):
        n *= k
        if n > cap:
            return cap + 1
    return n


def exact_law(target: Transformer, prompt: Sequence[int], horizon: int, *, temperature: float = 1.0,
              top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
              max_cells: int = MAX_CELLS) -> ExactLaw:
    """Enumerate the law of the first ``horizon`` tokens sampled after ``prompt`` from the
    warped target: one batched :func:`forward_logits` per level over the live prefixes."""
    v = target.config.vocab_size
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    prefixes = np.zeros((1, 0), np.int32)
    probs = np.ones(1)
    levels = []
    batch = _batch_for(v, top_k, horizon)
    for lvl in range(horizon):
        # one batch of prefixes at a time: only the positive entries of the [n, V] laws are
        # kept, so a level too wide is refused before its dense laws are all in memory
        pars, toks, steps, count = [], [], [], 0
        for s in range(0, len(prefixes), batch):
            laws = _next_laws(target, prompt, prefixes[s : s + batch], warp, width=horizon - 1, batch=batch)
            par, tok = np.nonzero(laws > 0)  # row-major: sorted by (parent, token)
            count += par.size
            if count > max_cells:
                raise ValueError(
                    f"horizon = {horizon}: more than {max_cells} token sequences of positive probability at "
                    f"position {lvl + 1} (countable cells); pass a smaller top_k (or horizon)"
                )
            pars.append(par + s)
            toks.append(tok)
            steps.append(laws[par, tok])
        par, tok = np.concatenate(pars), np.concatenate(toks)
        probs = probs[par] * np.concatenate(steps)
        prefixes = np.concatenate([prefixes[par], tok[:, None].astype(np.int32)], axis=1)
        levels.append((par.astype(np.int32), tok.astype(np.int32)))
    probs = probs / probs.sum()
    marg = np.zeros((horizon, v))
    for i in range(horizon):
        marg[i] = np.bincount(prefixes[:, i], weights=probs, minlength=v)
    return ExactLaw(prefixes, probs, marg, tuple(levels))


# --------------------------------------------------------------------------- exact acceptance


def _draws(q: np.ndarray, q32: np.ndarray, m: int, scheme: str):
    """Every ordered sibling tuple the draft can draw from row ``q`` with its probability,
    as :func:`jaxspec.core.sampling.draw` draws them."""
    v = q.shape[0]
    if scheme == "deterministic":  # top-m of the float32 row, ties -> lower index
        order = np.lexsort((np.arange(v), -q32))[:m]
        yield tuple(int(x) for x in order), 1.0
        return
    support = [int(x) for x in np.flatnonzero(q > 0)]
    if scheme == "iid":
        def rec(prefix, pr):
            if len(prefix) == m:
                yield tuple(prefix), pr
                return
            for x in support:
                yield from rec(prefix + [x], pr * q[x])
        yield from rec([], 1.0)
        return
    fill = [int(x) for x in np.flatnonzero(q <= 0)]  # exhausted support: zeros by index
    take = min(m, len(support))

    def rec_wor(prefix, pr, left):
        if len(prefix) == take:
            yield tuple(prefix) + tuple(fill[: m - take]), pr
            return
        for x in support:
            if x not in prefix:
                yield from rec_wor(prefix + [x], pr * q[x] / left, left - q[x])
    yield from rec_wor([], 1.0, 1.0)


def _q_k(q, xs, k, scheme):
    v = q.shape[0]
    if scheme == "iid":
        return q
    onehot = np.eye(v)[xs[k]]
    if scheme == "deterministic" or k == 0 and q.sum() <= 0:
        return onehot
    rem = q.copy()
    rem[list(xs[:k])] = 0.0
    s = rem.sum()
    return rem / s if s > 0 else onehot


def _tried(p, q, xs, scheme):
    """P(sibling k accepted | tried), k = 0..m-1, as docs/DESIGN.md §2 reads (float64)."""
    out = []
    for k, x in enumerate(xs):
        qk = _q_k(q, xs, k, scheme)
        out.append(min(1.0, p[x] / qk[x]) if qk[x] > 0 else float(p[x] > 0))
        res = np.maximum(p - qk, 0.0)
        s = res.sum()
        p = res / s if s > 0 else p
    return out


def _num_draws(s: int, m: int, scheme: str) -> int:
    if scheme == "deterministic":
        return 1
    if scheme == "iid":
        return s**m
    return math.perm(s, min(s, m))


def expected_acceptance(target: Transformer, draft: Transformer, prompt: Sequence[int], tree: StaticTree,
                        scheme: str, target_warp: dict, draft_warp: dict,
                        max_terms: int = MAX_ACCEPT_TERMS, rule: str = "token") -> np.ndarray:
    """float64[D]: for the first round after ``prompt``, ``E[accepted nodes at depth d]``
    (= P(the accepted path reaches depth d)), enumerated over every draft draw of the tree.

    Independent of the library's acceptance code: the rule is re-read from docs/DESIGN.md §2 in
    float64 numpy; the rows are the models' own warped next-token laws after the prompt
    plus each drafted path. ``rule="block"`` (chains): block verification, re-read from
    shared/RULES.md (``P(tau >= d)``, integrated over the uniforms in closed form). Raises
    ``ValueError`` when more than ``max_terms`` draws would be enumerated, or for a rule
    this function does not know.
    """
    if rule not in ("token", "block"):
        raise ValueError(f"rule = {rule!r}: the exact acceptance is enumerated for 'token' and 'block' only")
    par = np.asarray(tree.parents, np.int64)
    n, depth_max = par.shape[0], tree.depth
    kids = [[] for _ in range(n + 1)]
    for j, p in enumerate(par.tolist()):
        kids[p + 1].append(j)
    node_depth = np.asarray(tree.depths)
    row_level = np.concatenate([[0], node_depth])
    # level by level: the paths a row of that level can be reached by, and their laws
    laws: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    level_paths = [()]
    terms = 0
    v = target.config.vocab_size
    if scheme == "deterministic":  # candidates per path: the top siblings only
        batch = _batch_for(v, max(len(k) for k in kids), depth_max)
    else:
        batch = _batch_for(v, draft_warp.get("top_k"), depth_max)
    for lvl in range(depth_max):
        rows = [r for r in range(n + 1) if row_level[r] == lvl and kids[r]]
        arr = np.asarray(level_paths, np.int32).reshape(len(level_paths), lvl)
        kw = dict(width=max(depth_max - 1, 0), batch=batch)
        p_rows = _next_laws(target, prompt, arr, target_warp, **kw)
        q32 = _next_laws(draft, prompt, arr, draft_warp, raw=True, target=target, **kw)  # raw: ranking
        q_rows = q32.astype(np.float64) / q32.astype(np.float64).sum(axis=1, keepdims=True)
        nxt = set()
        for i, path in enumerate(level_paths):
            laws[path] = (p_rows[i], q_rows[i], q32[i])
            s = int(np.count_nonzero(q_rows[i] > 0))
            for r in rows:
                terms += _num_draws(s, len(kids[r]), scheme)
            if terms > max_terms:
                raise ValueError(f"more than {max_terms} draft draws to enumerate")
            if lvl + 1 < depth_max:
                m = max(len(kids[r]) for r in rows) if rows else 0
                for xs, _ in _draws(q_rows[i], q32[i], m, scheme):
                    nxt.update(path + (x,) for x in xs)
        level_paths = sorted(nxt)
        if not level_paths:
            break

    if rule == "block":
        if not np.array_equal(par, np.arange(-1, n - 1)):
            raise ValueError("rule = 'block': expected a chain")
        return _block_expected(laws, depth_max, scheme)

    @functools.lru_cache(maxsize=None)
    def e_row(row: int, path: tuple) -> np.ndarray:
        out = np.zeros(depth_max)
        ch = kids[row]
        if not ch:
            return out
        p, q, q32_row = laws[path]
        for xs, pr in _draws(q, q32_row, len(ch), scheme):
            a = _tried(p, q, xs, scheme)
            reach = 1.0
            for k, node in enumerate(ch):
                w = pr * reach * a[k]
                if w > 0:
                    out[node_depth[node] - 1] += w
                    out += w * e_row(node + 1, path + (xs[k],))
                reach *= 1.0 - a[k]
        return out

    return e_row(0, ())


def _block_expected(laws: dict, g: int, scheme: str) -> np.ndarray:
    """float64[g]: ``P(tau >= d)`` of block verification on a chain of ``g``, summed over
    every drafted chain (``laws[path] = (p_i, q_i, raw q_i)`` after each drafted prefix).

    Along a chain: ``w_0 = 1``, ``w_{i+1} = min(1, w_i p_i(x) / q_i(x))``, ``r_i = sum
    [w_i p_i - q_i]_+`` with ``q_i`` a point mass on the drafted token under
    ``deterministic``, ``h_i = r_i / (r_i + 1 - w_i)`` (1 when that denominator is 0),
    ``h_g = w_g``; with independent tests ``tau = max{i : passed}``, so
    ``P(tau >= d) = 1 - prod_{j >= d} (1 - h_j)``."""
    out = np.zeros(g)

    def walk(path: tuple, w: float, hs: list, prob: float) -> None:
        i = len(path)
        if i == g:
            h = np.asarray(hs + [w])
            tail = np.cumprod((1.0 - h)[::-1])[::-1]  # prod_{j >= d} (1 - h_j)
            out[:] += prob * (1.0 - tail)
            return
        p, q, q32 = laws[path]
        for xs, pr in _draws(q, q32, 1, scheme):
            x = xs[0]
            qk = np.eye(q.shape[0])[x] if scheme == "deterministic" else q
            h_new = hs
            if i >= 1:
                r = float(np.maximum(w * p - qk, 0.0).sum())
                den = r + 1.0 - w
                h_new = hs + [min(1.0, r / den) if den > 0 else 1.0]
            w_next = min(1.0, w * p[x] / qk[x]) if qk[x] > 0 else float(w * p[x] > 0)
            walk(path + (x,), w_next, h_new, prob * pr)

    walk((), 1.0, [], 1.0)
    return out
