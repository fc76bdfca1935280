"""Drafting with a feature head (:class:`~jaxspec.nn.head.FeatureHead`; the drafter
:class:`HeadDraft`): static trees level by level from the target's own features, inside the
compiled loop.

The head's pair at position p is (target feature at ``p - 1``, token p). Its cache slot p
holds the K/V of that pair computed from the *target's* feature, true through the root's
slot ``L``; the draft nodes' pairs read the head's own predicted features instead (EAGLE).

State between rounds (:class:`HeadState`), for row b with ``L`` committed target tokens::

    cache.lengths = Lh          head slots < Lh hold true pairs (Lh = L - count + 1)
    feats [W, D], toks [W]      the pending pairs of positions Lh .. L: the target's
    count                       features of the last round's root and accepted path, and
                                its accepted tokens and extra token (the new root, last)

``W = depth + 1``, the most tokens a round commits. A round forwards:

* level 0: the ``W`` pending pairs at slots ``Lh ..`` (``count`` of them real; the padding
  writes junk past the root's slot ``L``, which no valid query reads: the nodes' forwards
  overwrite it before a descendant attends to it, and the next round's level 0 rewrites every
  slot from ``L + 1`` on). The output at the root, the predicted feature at ``L``, gives the law of
  the root's children;
* level d (1 <= d < D): the depth-d nodes, each pair (its parent's predicted feature, its
  token) at slot ``L + 1 + j`` under the tree mask (prefix, root, ancestors);

so a tree of depth D costs D head forwards, as a draft model's does. The children are
drawn from the warped head law under the sibling scheme (:func:`~jaxspec.decode.draft.draw_children`),
and those laws are the ``draft_probs`` of the acceptance rule: exactly as with a draft
model, so every rule and scheme stays lossless.

After verification, :func:`commit_head` keeps the target's features of ``[root] + the
accepted path`` from the verification forward (no second target pass) as the next round's
pending pairs, with ``Lh = L + 1``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.core import sampling
from jaxspec.core.sampling import Warp
from jaxspec.core.treespec import DynamicTree, StaticTree
from jaxspec.decode.draft import ModuleDraft, draw_children, model_scheme
from jaxspec.decode.drafter import Context, DraftLaw, DraftRequest, Outcome, Prompt, Proposal
from jaxspec.errors import SettingError
from jaxspec.nn.cache import KVCache, init_cache
from jaxspec.nn.head import FeatureHead, check_head_config_for
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.nn.model import Transformer

__all__ = ["HeadDraft", "HeadState", "start_head", "propose_head", "commit_head"]


class HeadState(NamedTuple):
    """A feature head's loop state (a pytree; the round's draft state)."""

    cache: KVCache  # head cache, lengths = Lh
    feats: jax.Array  # float32[B, W, D] target features of the pending pairs
    toks: jax.Array  # int32[B, W] their tokens (the root at index count - 1)
    count: jax.Array  # int32[B] pending pairs, 1 .. W


def start_head(head: FeatureHead, target: Transformer, feats, tokens, committed, capacity: int,
               width: int) -> HeadState:
    """The state after the prompt: ``feats float32[B, T, D]`` are the target's prefill
    features of the padded prompts ``tokens int32[B, T]``, ``committed int32[B]`` the
    tokens in the target cache (the prompt less its last token, the root). The head
    forwards every prompt pair once; the root's pair is left pending."""
    b, t = tokens.shape
    prev = jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)  # [B, T, D]
    cache = init_cache(head.config, b, capacity)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _, cache = head(target, prev, tokens, positions, cache, causal_cache_mask(cache.lengths, t, capacity))
    last = jnp.take_along_axis(prev, committed[:, None, None], axis=1)  # [B, 1, D]: f at committed - 1
    root = jnp.take_along_axis(tokens, committed[:, None], axis=1)  # [B, 1]
    pend_f = jnp.zeros((b, width, feats.shape[-1]), jnp.float32).at[:, :1].set(last)
    pend_t = jnp.zeros((b, width), jnp.int32).at[:, :1].set(root)
    return HeadState(cache.replace(lengths=committed), pend_f, pend_t, jnp.ones((b,), jnp.int32))


def propose_head(head: FeatureHead, target: Transformer, state: HeadState, keys, tree: StaticTree, scheme: str,
                 warp: Warp, temperature, draw=sampling.draw):
    """Draft a static tree for every row (``D`` head forwards for a tree of depth D).

    Returns ``node_tokens int32[B, N]``, ``draft_probs float32[B, N + 1, V]`` (row 0 at the
    root, row ``i + 1`` after node i) and the state with the drafted K/V written (commit it
    with :func:`commit_head`). ``keys [B]`` as in :func:`~jaxspec.decode.draft.propose_static`.
    """
    cache = state.cache
    b, w = state.toks.shape
    n = tree.num_nodes
    v = target.config.vocab_size
    lh = cache.lengths  # [B]
    root_slot = lh + state.count - 1  # [B] == the target's L
    full_mask = tree.full_mask  # [N + 1, N + 1] numpy
    mask_all = tree_cache_mask(root_slot, full_mask, cache.capacity)  # [B, N + 1, S]
    depth_full = full_mask.sum(axis=1) - 1  # [N + 1], root 0
    pos_all = root_slot[:, None] + jnp.asarray(depth_full, jnp.int32)[None, :]  # [B, N + 1]
    parent_rows = tree.parents_array + 1  # [N] numpy: each node's row in [root] + nodes
    # a reduced vocabulary (its K ids) is warped and drawn over those K ids, and its laws are
    # scattered into V for the rule: the tokens are drawn from exactly the laws the rule reads,
    # and a level costs K-wide work instead of V-wide (at K = 8,192 of 49,152, a sixth)
    ids = None if head.draft_vocab is None else head.draft_vocab.get_value()  # int32[K]
    node_tokens = jnp.zeros((b, n), jnp.int32)
    node_k = jnp.zeros((b, n), jnp.int32)  # the drafted tokens as indices into ids (without ids: the tokens)
    draft_probs = jnp.zeros((b, n + 1, v), jnp.float32)
    node_h = jnp.zeros((b, n + 1, head.config.hidden_size), jnp.float32)  # predicted features
    bounds = [(0, 1)] + [(s + 1, e + 1) for s, e in tree.levels]
    for lvl, (a, z) in enumerate(bounds[:-1]):  # the deepest level is not forwarded
        if lvl == 0:  # the pending true pairs; the root's is the last real one
            pos = lh[:, None] + jnp.arange(w, dtype=jnp.int32)[None, :]
            h, cache = head(target, state.feats, state.toks, pos, cache, causal_cache_mask(lh, w, cache.capacity))
            h = jnp.take_along_axis(h, (state.count - 1)[:, None, None], axis=1)  # [B, 1, D]
        else:
            toks = node_tokens[:, a - 1 : z - 1]  # [B, z - a]
            feats = node_h[:, parent_rows[a - 1 : z - 1]]  # [B, z - a, D]
            h, cache = head(target, feats, toks, pos_all[:, a:z], cache.replace(lengths=root_slot + a),
                            mask_all[:, a:z])
        node_h = node_h.at[:, a:z].set(h)
        probs = warp(head.draft_logits(target, h), temperature)  # [B, z - a, K] (K = V: no reduced vocabulary)
        node_k = draw_children(tree, lvl, a, probs, keys, scheme, node_k, draw)
        if ids is None:
            draft_probs, node_tokens = draft_probs.at[:, a:z].set(probs), node_k
        else:
            draft_probs, node_tokens = draft_probs.at[:, a:z, ids].set(probs), jnp.take(ids, node_k)  # [B, N]
    return node_tokens, draft_probs, state._replace(cache=cache.replace(lengths=lh))


def commit_head(state: HeadState, target_feats, tokens, accepted_nodes, num, active) -> HeadState:
    """The state of the next round: the pending pairs become the target's features of
    ``[root] + accepted path`` (``target_feats float32[B, N + 1, D]`` from the verification
    forward, rows ``[0] + (accepted_nodes + 1)``) with the round's emitted tokens
    (``tokens int32[B, N + 1]``: accepted, then the extra token), ``num int32[B]`` of them;
    the root's pair is now committed (``Lh = L + 1``). Rows not ``active`` keep their state."""
    w = state.toks.shape[1]
    b = tokens.shape[0]
    rows = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), accepted_nodes + 1], axis=1)[:, :w]  # [B, W]
    feats = jnp.take_along_axis(target_feats, rows[:, :, None], axis=1)  # [B, W, D]
    toks = jnp.maximum(tokens[:, :w], 0)  # -1 padding past num: never read as a real pair
    lh = state.cache.lengths + state.count  # L + 1
    keep = active[:, None]
    return HeadState(
        cache=state.cache.replace(lengths=jnp.where(active, lh, state.cache.lengths)),
        feats=jnp.where(keep[:, :, None], feats, state.feats),
        toks=jnp.where(keep, toks, state.toks),
        count=jnp.where(active, num, state.count),
    )


def _fused(head: FeatureHead, features) -> jax.Array:
    """The features a true pair reads (:meth:`~jaxspec.nn.head.FeatureHead.fused`) from the
    round's target features ``[B, T, D]``, or ``[B, T, (k + 1) D]`` (the taps, then the
    features) for a multi-layer head: float32 ``[B, T, D]``."""
    if head.feature_layers is None:
        return features
    b, t, _ = features.shape
    d = head.config.hidden_size
    k = len(head.feature_layers)
    return head.fused(features[..., k * d:], features[..., : k * d].reshape(b, t, k, d))


@dataclasses.dataclass(frozen=True)
class HeadDraft(ModuleDraft):
    """A :class:`~jaxspec.nn.head.FeatureHead` as a drafter (static trees, one device): the
    head's ``nnx.state`` is the params and :class:`HeadState` its state (module
    docstring). :func:`jaxspec.generate` builds it from a head (:meth:`of`)."""

    feature_layers: tuple[int, ...] | None = None  # a multi-layer head's (FeatureHead.feature_layers)

    @classmethod
    def of(cls, module, definition=None):
        drafter, params = super().of(module, definition)
        return dataclasses.replace(drafter, feature_layers=getattr(module, "feature_layers", None)), params

    def check(self, target, request: DraftRequest) -> str:
        check_head_config_for("draft", self.config, target, self.feature_layers)
        if isinstance(request.tree, DynamicTree):
            raise SettingError({"tree": request.tree}, "a feature head drafts static trees (a chain such as 'chain:4', "
                               "or 'branch:3,1,1'); a DynamicTree takes a draft model")
        if request.mesh is not None:
            raise SettingError({"mesh": request.mesh}, "a feature-head draft runs on one device; expected mesh None, "
                               "or a draft model")
        return model_scheme(request)  # DynamicTree is refused above: the default scheme, or the one asked for

    def forwards(self, tree) -> int:
        return tree.depth

    def init(self, params, target, prompt: Prompt) -> HeadState:
        head = nnx.merge(self.definition, params)
        return start_head(head, target, _fused(head, prompt.features), prompt.tokens, prompt.lengths - 1, prompt.capacity,
                          prompt.tree.depth + 1)

    def propose(self, params, target, state: HeadState, ctx: Context, keys, law: DraftLaw) -> Proposal:
        head = nnx.merge(self.definition, params)
        tokens, probs, state = propose_head(head, target, state, keys, law.tree, law.scheme, law.warp,
                                            law.temperature, draw=law.draw)
        return Proposal(tokens, state, probs=probs)

    def commit(self, params, state: HeadState, outcome: Outcome, commit_cache) -> HeadState:
        """The target's features of the kept path become the head's next pairs (the head
        keeps its own cache layout; ``commit_cache`` is the target's)."""
        head = nnx.merge(self.definition, params)
        return commit_head(state, _fused(head, outcome.features), outcome.tokens, outcome.accepted_nodes, outcome.num,
                           outcome.active)
