"""A draft model as a drafter (:class:`ModelDraft`, the :mod:`jaxspec.decode.drafter`
protocol): static trees level by level, dynamic trees EAGLE-2 style. Pure functions of
(draft model, cache, tokens, keys), traced inside :func:`jaxspec.decode.generate.generate`.

Cache layout of a round for row b (``L = lengths[b]`` committed tokens; the root, the last
emitted token, is *not* yet in the cache)::

    slot   L      L+1     L+2    ...   L+N
           root   node 0  node 1 ...   node N-1        position L + depth (root: depth 0)

Both the draft and the target write this layout (static trees: except the deepest level,
see below), so one ``commit(offsets=[0] + (accepted_nodes + 1), num=accepted + 1)`` keeps
the root and the accepted path in both.

Static tree (breadth first, see :mod:`jaxspec.core.treespec`), ``D`` draft forwards: the
first forwards two tokens, ``[prev, root]`` at slots ``L - 1, L`` (``prev`` = the last
committed token), and draws the root's children; forward ``d`` (``1 <= d < D``) covers
depth ``d``, whose nodes see the prefix, the root and their own ancestors
(``tree_cache_mask`` over ``[root] + nodes``), and draws their children. The deepest
level is never forwarded: its logits would be unused, and its draft K/V is only needed
when an accepted path ends there, in which case that node is the last committed token,
``prev`` of the next round, and is recomputed by that round's first forward (for any
other ``prev`` the recomputation rewrites identical K/V). With ``L == 0`` (a one-token
prompt, first round) there is no ``prev``: the pair is ``[root, root]`` at slots 0, 1 and
the junk K/V at slot 1 is overwritten by node 0 or never committed as valid.
Children are drawn with ``sampling.draw`` under the sibling scheme from the *warped*
draft row, and those rows are returned: they are the ``draft_probs`` of the acceptance
rule.

Dynamic tree (:class:`~jaxspec.core.treespec.DynamicTree`): forward the root, take its top-k
tokens; at each further depth forward the top-k frontier nodes (by cumulative draft
log-probability) into scratch slots ``L + 1 + (d - 1) * topk + i``, each proposing its
top-k children; keep the best ``num_nodes`` of all candidates (closed under ancestors:
a child's score never exceeds its parent's, and ties go to the lower, shallower index),
breadth first; finally forward the chosen tree once in the standard layout (fresh K/V for
every node): ``depth + 1`` draft forwards. Candidates are fixed choices (scheme
``"deterministic"``), so no draft rows are needed by the acceptance rule.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jaxspec.core import sampling
from jaxspec.core import tree as treelib
from jaxspec.core.sampling import Warp
from jaxspec.core.treespec import DynamicTree, StaticTree
from jaxspec.decode.defaults import DEFAULT_SCHEME
from jaxspec.decode.drafter import Context, DraftLaw, DraftRequest, Outcome, Prompt, Proposal
from jaxspec.nn import sharding
from jaxspec.nn.cache import KVCache
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.nn.model import prefill

__all__ = ["ModuleDraft", "ModelDraft", "model_scheme", "model_forwards", "propose_with_model", "propose_static",
           "propose_dynamic", "draw_children"]


def model_scheme(request: DraftRequest) -> str:
    """The sibling scheme a drafter that runs a model serves: any scheme on a static tree
    (default :data:`~jaxspec.decode.defaults.DEFAULT_SCHEME`, ``without_replacement``),
    ``deterministic`` on a DynamicTree (its candidates
    are fixed choices; any other scheme there is refused by the settings table,
    :mod:`jaxspec.decode.combinations`, before a drafter is asked)."""
    if isinstance(request.tree, DynamicTree):
        return "deterministic"
    return DEFAULT_SCHEME if request.scheme is None else request.scheme


def model_forwards(tree) -> int:
    """Draft forwards per round of a model: D for a static tree of depth D (the deepest
    level is never forwarded), depth + 1 for a DynamicTree."""
    return tree.depth + (1 if isinstance(tree, DynamicTree) else 0)


def propose_with_model(model, cache: KVCache, ctx: Context, keys, law: DraftLaw) -> Proposal:
    """A model's proposal (:func:`propose_static`, or :func:`propose_dynamic` for a
    DynamicTree) from ``cache`` (lengths ``L``); the proposal's state is the cache with the
    tree written."""
    if isinstance(law.tree, DynamicTree):
        tokens, parents, _, cache = propose_dynamic(model, cache, ctx.root, law.tree, law.warp, law.temperature)
        return Proposal(tokens, cache, parents=parents)
    tokens, probs, cache = propose_static(model, cache, ctx.prev, ctx.root, keys, law.tree, law.scheme, law.warp,
                                          law.temperature, draw=law.draw)
    return Proposal(tokens, cache, probs=probs)


@dataclasses.dataclass(frozen=True)
class ModuleDraft:
    """The static half of a drafter made from an ``nnx`` module (a draft model, a feature
    head): ``definition`` its ``nnx.GraphDef``, ``config`` its configuration; the module's
    ``nnx.state`` is the params; ``tree`` the tree the module drafts best (a feature head's
    ``preferred_tree``), which :func:`jaxspec.generate` drafts when given ``tree=None``."""

    definition: nnx.GraphDef
    config: ModelConfig
    tree: str | None = None

    @classmethod
    def of(cls, module, definition=None):
        """``(drafter, params)`` of ``module`` (params ``None`` when its ``definition`` is
        passed in: the caller has split it already)."""
        tree = getattr(module, "preferred_tree", None)
        if definition is not None:
            return cls(definition, module.config, tree), None
        gdef, state = nnx.split(module)
        return cls(gdef, module.config, tree), state


@dataclasses.dataclass(frozen=True)
class ModelDraft(ModuleDraft):
    """A draft :class:`~jaxspec.nn.model.Transformer` as a drafter. Its state is its own KV
    cache, in the target's slot layout (so the round's cache commit keeps the same slots in
    both). :func:`jaxspec.generate` builds it from a draft model (:meth:`of`)."""

    def check(self, target, request: DraftRequest) -> str:
        v = target.config.vocab_size
        if self.config.vocab_size != v:
            raise ValueError(f"draft: vocab_size = {self.config.vocab_size}; expected the target's vocab_size = {v}")
        if request.mesh is not None:
            sharding.check_model_on_mesh("draft", self.config, request.mesh)
        return model_scheme(request)

    def forwards(self, tree) -> int:
        return model_forwards(tree)

    def init(self, params, target, prompt: Prompt) -> KVCache:
        """The draft's prefill of ``prompt[:-1]`` (lengths = prompt length - 1)."""
        model = nnx.merge(self.definition, params)
        return prefill(model, prompt.tokens, prompt.lengths - 1, prompt.capacity)[1]

    def propose(self, params, target, state: KVCache, ctx: Context, keys, law: DraftLaw) -> Proposal:
        return propose_with_model(nnx.merge(self.definition, params), state, ctx, keys, law)

    def commit(self, params, state: KVCache, outcome: Outcome, commit_cache) -> KVCache:
        return commit_cache(state, outcome.accepted_nodes, outcome.num)


def _with_lengths(cache: KVCache, lengths) -> KVCache:
    return cache.replace(lengths=lengths)


def propose_static(model, cache: KVCache, prev, root, keys, tree: StaticTree, scheme: str, warp: Warp, temperature,
                   draw=sampling.draw):
    """Draft a static tree for every row (``D`` draft forwards for a tree of depth D).

    Args:
      model: the draft :class:`~jaxspec.nn.model.Transformer`.
      cache: draft cache, ``lengths`` = committed tokens ``L`` (root not included); the
        K/V at slot ``L - 1`` may be stale (recomputed here).
      prev: ``int32[B]`` the committed token at slot ``L - 1`` (ignored where ``L == 0``).
      root: ``int32[B]`` last emitted token of each row.
      keys: ``[B]`` keys, one per row for this round (``fold_in(key, tree_row)`` per draw).
      tree: breadth-first :class:`StaticTree`.
      warp, temperature: the draft's proposal law.
      draw: the draw of one row's children (:class:`~jaxspec.decode.round.RoundParts`' ``draw``).

    Returns:
      ``node_tokens int32[B, N]``, ``draft_probs float32[B, N + 1, V]`` (row 0 at the root,
      row ``i + 1`` after node i; rows of leaves are unused), and the cache with slot
      ``L - 1`` refreshed, the root at slot ``L`` and node j at ``L + 1 + j`` for the
      nodes above the deepest level (``lengths`` unchanged).
    """
    b = root.shape[0]
    n = tree.num_nodes
    lengths = cache.lengths  # [B]
    v = model.config.vocab_size
    full_mask = tree.full_mask  # [N + 1, N + 1] numpy
    mask_all = tree_cache_mask(lengths, full_mask, cache.capacity)  # [B, N + 1, S]
    depth_full = full_mask.sum(axis=1) - 1  # [N + 1], root 0
    pos_all = lengths[:, None] + jnp.asarray(depth_full, jnp.int32)[None, :]  # [B, N + 1]
    node_tokens = jnp.zeros((b, n), jnp.int32)
    draft_probs = jnp.zeros((b, n + 1, v), jnp.float32)
    bounds = [(0, 1)] + [(s + 1, e + 1) for s, e in tree.levels]  # row slices per level
    for lvl, (a, z) in enumerate(bounds[:-1]):  # the deepest level is not forwarded
        if lvl == 0:  # [prev, root] at slots L - 1, L; or [root, root] at 0, 1 when L == 0
            has_prev = lengths >= 1
            start = jnp.maximum(lengths - 1, 0)
            pair = jnp.stack([jnp.where(has_prev, prev, root), root], axis=1)  # [B, 2]
            pos = start[:, None] + jnp.arange(2, dtype=jnp.int32)[None, :]
            mask = causal_cache_mask(start, 2, cache.capacity)  # [B, 2, S]
            logits, cache = model(pair, pos, _with_lengths(cache, start), mask)
            logits = jnp.where(has_prev[:, None], logits[:, 1], logits[:, 0])[:, None]  # [B, 1, V]
        else:
            toks = node_tokens[:, a - 1 : z - 1]  # [B, z - a]
            logits, cache = model(toks, pos_all[:, a:z], _with_lengths(cache, lengths + a), mask_all[:, a:z])
        probs = warp(logits, temperature)  # [B, z - a, V]
        draft_probs = draft_probs.at[:, a:z].set(probs)
        node_tokens = draw_children(tree, lvl, a, probs, keys, scheme, node_tokens, draw)
    return node_tokens, draft_probs, _with_lengths(cache, lengths)


def draw_children(tree: StaticTree, lvl: int, first_row: int, probs, keys, scheme: str, node_tokens,
                  draw=sampling.draw):
    """Draw the children of level ``lvl``'s rows (``[root] + nodes`` rows ``first_row ..``,
    whose warped draft laws are ``probs float32[B, R, V]``) under the sibling scheme, row r
    with key ``fold_in(keys[b], r)`` and ``draw`` (the round's ``DraftLaw.draw``);
    returns ``node_tokens int32[B, N]`` with them set."""
    b = probs.shape[0]
    for rows, children in tree.level_groups[lvl]:
        c = children.shape[1]
        row_probs = probs[:, rows - first_row]  # [B, R, V]
        row_keys = jax.vmap(lambda k: jax.vmap(lambda r: jax.random.fold_in(k, r))(jnp.asarray(rows)))(keys)

        def draw_one(k, p, c=c):
            return draw(k, p, c, scheme)[0]

        tok = jax.vmap(jax.vmap(draw_one))(row_keys, row_probs)  # [B, R, c]
        node_tokens = node_tokens.at[:, children.reshape(-1)].set(tok.reshape(b, -1))
    return node_tokens


def propose_dynamic(model, cache: KVCache, root, tree: DynamicTree, warp: Warp, temperature):
    """Draft an EAGLE-2 style tree for every row (deterministic: no keys).

    Returns ``node_tokens int32[B, N]``, ``parents int32[B, N]`` (breadth first, siblings
    by decreasing draft probability), ``full_mask bool[B, N + 1, N + 1]`` (ancestor-or-self
    over ``[root] + nodes``, see :func:`jaxspec.core.tree.full_tree_mask`), and the cache with the root at
    slot ``L`` and node j at ``L + 1 + j`` (``lengths`` unchanged). Scores are cumulative
    ``log warp(draft)``.
    """
    b = root.shape[0]
    k, depth, n = tree.topk, tree.depth, tree.num_nodes
    pool, e = tree.pool_size, tree.expansion_slots
    s_cap = cache.capacity
    lengths = cache.lengths  # [B]
    rows = jnp.arange(b)[:, None]
    s = jnp.arange(s_cap, dtype=jnp.int32)[None, None, :]  # [1, 1, S]
    prefix_and_root = s <= lengths[:, None, None]  # [B, 1, S]

    # depth 1: the root's top-k
    logits, cache = model(root[:, None], lengths[:, None], cache, prefix_and_root)
    logp = jnp.log(warp(logits[:, 0], temperature))  # [B, V]
    score, tok = lax.top_k(logp, k)  # [B, K], ties -> lower token id
    pool_tok = jnp.zeros((b, pool), jnp.int32).at[:, :k].set(tok)
    pool_score = jnp.full((b, pool), -jnp.inf, jnp.float32).at[:, :k].set(score)
    pool_par = jnp.full((b, pool), -1, jnp.int32)
    frontier = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))  # pool indices
    anc = jnp.zeros((b, k, max(e, 1)), jnp.bool_)  # frontier's ancestors among scratch slots

    j = s - (lengths[:, None, None] + 1)  # [B, 1, S] scratch slot index
    in_scratch = (j >= 0) & (j < e)
    for d in range(1, depth):  # expand depth-d frontier into depth d + 1 candidates
        base = (d - 1) * k
        anc = anc.at[:, jnp.arange(k), base + jnp.arange(k)].set(True)  # self
        sees = jnp.take_along_axis(anc, jnp.broadcast_to(jnp.clip(j, 0, e - 1), (b, k, s_cap)), axis=2)
        mask = prefix_and_root | (in_scratch & sees)  # [B, K, S]
        toks = jnp.take_along_axis(pool_tok, frontier, axis=1)  # [B, K]
        pos = jnp.broadcast_to(lengths[:, None] + d, (b, k))
        logits, cache = model(toks, pos, _with_lengths(cache, lengths + 1 + base), mask)
        logp = jnp.log(warp(logits, temperature))  # [B, K, V]
        cscore, ctok = lax.top_k(logp, k)  # [B, K, K]
        child_score = jnp.take_along_axis(pool_score, frontier, axis=1)[:, :, None] + cscore
        start = k + (d - 1) * k * k
        pool_tok = pool_tok.at[:, start : start + k * k].set(ctok.reshape(b, k * k))
        pool_score = pool_score.at[:, start : start + k * k].set(child_score.reshape(b, k * k))
        pool_par = pool_par.at[:, start : start + k * k].set(jnp.repeat(frontier, k, axis=1))
        _, sel = lax.top_k(child_score.reshape(b, k * k), k)  # [B, K] next frontier
        anc = jnp.take_along_axis(anc, (sel // k)[:, :, None], axis=1)  # parents' ancestors
        frontier = (start + sel).astype(jnp.int32)

    # keep the best n candidates (ties -> lower pool index: ancestors first), breadth first
    _, chosen = lax.top_k(pool_score, n)
    chosen = jnp.sort(chosen, axis=1).astype(jnp.int32)  # [B, N]
    inv = jnp.full((b, pool), -1, jnp.int32).at[rows, chosen].set(jnp.arange(n, dtype=jnp.int32))
    par_pool = jnp.take_along_axis(pool_par, chosen, axis=1)
    parents = jnp.where(par_pool >= 0, jnp.take_along_axis(inv, jnp.maximum(par_pool, 0), axis=1), -1)
    node_tokens = jnp.take_along_axis(pool_tok, chosen, axis=1)

    # one forward of the chosen tree in the standard layout (draft K/V of every node)
    full_mask = jax.vmap(treelib.full_tree_mask)(parents)  # [B, N + 1, N + 1]
    depth_nodes = jnp.sum(full_mask[:, 1:], axis=2, dtype=jnp.int32) - 1  # [B, N]
    mask_nodes = tree_cache_mask(lengths, full_mask, s_cap)[:, 1:]  # [B, N, S]
    _, cache = model(node_tokens, lengths[:, None] + depth_nodes, _with_lengths(cache, lengths + 1), mask_nodes)
    return node_tokens, parents.astype(jnp.int32), full_mask, _with_lengths(cache, lengths)

