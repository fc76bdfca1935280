"""One speculative round, top to bottom, and the target-only step beside it.

:func:`speculative_round` is the only place a round is wired: :func:`jaxspec.generate`'s
loop, :func:`jaxspec.auto_tree`'s timing and the exactness harness all call it. For row b
(``L`` committed tokens in both caches; the root, the last emitted token, not yet cached;
slot layout in :mod:`jaxspec.decode.draft`)::

    propose: the drafter proposes N nodes (jaxspec.Drafter.propose)
    verify:  ONE target forward over [root] + nodes under the tree mask,
             positions L + depth; row 0 = law after the root, row i+1 = law after node i
    accept:  the acceptance rule, vmapped over rows -> accepted path + 1 extra token
    commit:  the target cache keeps [root] + the accepted path (accepted + 1 tokens);
             the drafter commits the same outcome to its state (jaxspec.Drafter.commit)
    emit:    the accepted tokens and the extra token are appended to each active row's
             output (stop tokens and the budget honoured); the extra token is the new root

The round knows no kind of drafter: whatever proposes the tree implements the protocol of
:mod:`jaxspec.decode.drafter`. A proposal without laws (fixed choices) gives the rule zero
draft rows, which the ``deterministic`` scheme never reads; a proposal with parents per row
(a dynamic tree) gives a tree mask per row; and when a proposal says that no active row has
a draft worth verifying (``has_draft``), the round runs one target step instead of
``verify`` and ``accept`` (a ``lax.cond`` whose choice reads only what the drafter saw, never
the round's acceptance randomness).

The acceptance step is the function of ``rule=`` (:class:`RoundConfig` ``accept``); the
other replaceable steps form :class:`RoundParts`, whose defaults are the library's own. A
researcher replaces one to try an idea, and :mod:`jaxspec.exactness.mutants` replaces one
(or the rule) to break the decoder on purpose::

    import jax.numpy as jnp
    from jaxspec.decode.round import RoundParts

    def causal(mask):  # a plain causal triangle over the flattened tree: siblings leak
        return jnp.broadcast_to(jnp.tril(jnp.ones(mask.shape[-2:], bool)), mask.shape)

    parts = RoundParts(verify_mask=causal)   # generate(..., parts=parts) / verify(parts=...)

Each step runs under a :func:`jax.named_scope` (``propose``, ``verify``, ``accept``,
``commit``, ``emit``), so a profile reads like this docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxspec.core import sampling
from jaxspec.core import tree as treelib
from jaxspec.core.rule_types import AcceptResult
from jaxspec.core.sampling import Warp
from jaxspec.core.token_rule import accept_core
from jaxspec.core.treespec import DynamicTree, StaticTree
from jaxspec.decode.drafter import Context, Drafter, DraftLaw, Outcome, feature_taps
from jaxspec.nn.cache import KVCache, commit
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask

__all__ = [
    "RoundParts",
    "RoundConfig",
    "RoundInputs",
    "RoundState",
    "Emitted",
    "tree_verify_mask",
    "split_round_keys",
    "commit_path",
    "emit_tokens",
    "start_emitted",
    "speculative_round",
    "autoregressive_step",
]


# --------------------------------------------------------------------------- the parts


def tree_verify_mask(full_mask):
    """The library's verification mask: ``bool[..., N + 1, N + 1]`` ancestor-or-self over
    ``[root] + nodes``, used as given (a node sees its ancestors and itself, never a
    sibling branch)."""
    return full_mask


def split_round_keys(keys):
    """The library's key split: each row's round key (``[B]``) -> ``(draft keys [B],
    acceptance keys [B])``, the two halves of ``jax.random.split`` of it. Rows never share
    a key, and the drafter never sees the acceptance key."""
    split = jax.vmap(jax.random.split)(keys)  # [B, 2]
    return split[:, 0], split[:, 1]


def commit_path(cache: KVCache, accepted_nodes, num) -> KVCache:
    """The library's commit: keep the root and the accepted path.

    ``accepted_nodes int32[B, N]`` (node indices along the path, -1 padded) and ``num
    int32[B]`` (accepted + 1, 0 for a finished row): slots ``L + [0] + (accepted_nodes +
    1)`` move to ``L .. L + num - 1``, and ``lengths += num``. So the next round writes
    its root, the emitted token, at slot ``L + num``.
    """
    b = accepted_nodes.shape[0]
    offsets = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), accepted_nodes + 1], axis=1)  # [B, N + 1]
    return commit(cache, offsets, num)


@dataclasses.dataclass(frozen=True)
class RoundParts:
    """The replaceable steps of :func:`speculative_round` besides the acceptance rule
    (hashable; part of the compiled configuration, so pass the same functions to reuse a
    compilation). The acceptance step is set one way only, by ``rule=`` (a built-in name or
    a function: :mod:`jaxspec.core.rules`), and travels in :class:`RoundConfig` ``accept``.

    Attributes:
      verify_mask: ``bool[..., N + 1, N + 1] -> bool[..., N + 1, N + 1]``: given the
                   ancestor-or-self mask over ``[root] + nodes`` (``[B, ...]`` for dynamic
                   trees), the mask the target's verification forward uses.
      commit:      ``(cache, accepted_nodes int32[B, N], num int32[B]) -> cache``, applied to
                   the target's cache and handed to the drafter's ``commit`` (a draft model
                   applies it to its own cache; a feature head keeps its own layout): which
                   slots are kept, and so where the next round's root is written.
      keys:        ``keys [B] -> (draft keys [B], acceptance keys [B])``: the round's
                   randomness per row, split between the drafter and the rule.
      draw:        ``(key, probs float32[V], n, scheme) -> (tokens int32[n], laws)``: how
                   the library's drafters (a draft model, a feature head, layer skip) draw
                   the ``n`` children of one tree row from its warped law
                   (:func:`jaxspec.core.sampling.draw`); a drafter of your own may ignore it.
    """

    verify_mask: Callable = tree_verify_mask
    commit: Callable = commit_path
    keys: Callable = split_round_keys
    draw: Callable = sampling.draw


@dataclasses.dataclass(frozen=True)
class RoundConfig:
    """The static description of a round (hashable): the tree, the sibling scheme, the
    static halves of the target's and the draft's warps, the drafter (its params travel in
    :class:`RoundInputs`), the acceptance step and the other parts.

    ``accept``: ``(key, parents int32[N], tokens int32[N], target_probs float32[N + 1, V],
    draft_probs float32[N + 1, V], scheme) -> AcceptResult`` for one row, with the
    conventions of :func:`jaxspec.speculative_accept` (pure, no input checks; vmapped over
    rows): the function of ``rule=`` (:func:`jaxspec.core.rules.check_rule`)."""

    tree: StaticTree | DynamicTree
    scheme: str
    target_warp: Warp
    draft_warp: Warp
    drafter: Drafter
    accept: Callable = accept_core
    parts: RoundParts = RoundParts()


# --------------------------------------------------------------------------- emission


class Emitted(NamedTuple):
    """Tokens emitted so far (a pytree of the loop state)."""

    out: jax.Array  # int32[B, M], -1 where nothing was emitted yet
    n_out: jax.Array  # int32[B]
    active: jax.Array  # bool[B]: False once the row hit a stop token or its budget


def start_emitted(batch: int, budget: int) -> Emitted:
    """Nothing emitted yet, every row active, room for ``budget`` tokens per row."""
    return Emitted(
        jnp.full((batch, budget), -1, jnp.int32), jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), jnp.bool_)
    )


def emit_tokens(state: Emitted, toks, num, stop_tokens) -> Emitted:
    """Append ``toks[b, :num[b]]`` (``int32[B, K]``) to the active rows; a row ends at its
    first stop token (``int32[n]``, -1 padded; kept in the output) or when its ``M`` slots
    are full, and the tokens of the round after either end are dropped."""
    b, k = toks.shape
    m = state.out.shape[1]
    idx = jnp.arange(k, dtype=jnp.int32)[None, :]  # [1, K]
    valid = state.active[:, None] & (idx < num[:, None]) & (state.n_out[:, None] + idx < m)
    is_stop = jnp.isin(toks, stop_tokens) & valid
    stop_before = (jnp.cumsum(is_stop, axis=1) - is_stop) > 0
    valid = valid & ~stop_before
    hit_stop = jnp.any(is_stop & valid, axis=1)
    count = jnp.sum(valid, axis=1, dtype=jnp.int32)
    dst = jnp.where(valid, state.n_out[:, None] + idx, m)  # m: out of range, dropped
    out = state.out.at[jnp.arange(b)[:, None], dst].set(toks, mode="drop")
    n_out = state.n_out + count
    active = state.active & ~hit_stop & (n_out < m)
    return Emitted(out, n_out, active)


# --------------------------------------------------------------------------- the round


class RoundState(NamedTuple):
    """What a round reads and returns (a pytree; the loop carries it)."""

    prev: jax.Array  # int32[B] the last committed token (cache slot L - 1)
    root: jax.Array  # int32[B] the last emitted token (not yet cached)
    tcache: KVCache  # target cache, lengths = L
    dstate: Any  # the drafter's state (a draft model: its cache, lengths = L)
    emitted: Emitted


class RoundInputs(NamedTuple):
    """What one call of :func:`speculative_round` reads besides its static
    :class:`RoundConfig` (a pytree of arrays, and the target module).

    Attributes:
      target: the target :class:`~jaxspec.nn.model.Transformer` (merged from its state).
      dparams: the drafter's params (:class:`~jaxspec.decode.drafter.Drafter`; ``None`` for a
        drafter without arrays).
      state: the :class:`RoundState`; finished rows (``state.emitted.active`` False) run the
        same computation (static shapes) but commit and emit nothing.
      keys: ``[B]`` keys of this round, one per row; each is split (``parts.keys``) into a
        draft key (one ``fold_in`` per tree row) and an acceptance key.
      temperature: the target's temperature, a traced float32 scalar.
      draft_temperature: the draft's, likewise.
      stop_tokens: ``int32[n]``, -1 padded.
    """

    target: Any
    dparams: Any
    state: RoundState
    keys: jax.Array
    temperature: jax.Array
    draft_temperature: jax.Array
    stop_tokens: jax.Array


def speculative_round(cfg: RoundConfig, inputs: RoundInputs) -> tuple[RoundState, AcceptResult]:
    """One round for every row: propose, verify, accept, commit, emit.

    Args:
      cfg: the static :class:`RoundConfig` (tree, scheme, warps, drafter, acceptance step,
        parts).
      inputs: the call's :class:`RoundInputs` (target, drafter params, loop state, keys,
        temperatures, stop tokens).

    Returns:
      the next :class:`RoundState` and the batched :class:`~jaxspec.AcceptResult`
      (``tokens int32[B, N + 1]``, ``num_tokens int32[B]``, ...) of the round.
    """
    target, dparams, state, keys, temperature, draft_temperature, stop_tokens = inputs
    drafter = cfg.drafter
    parts = cfg.parts
    b = state.root.shape[0]
    n = cfg.tree.num_nodes
    k_draft, k_acc = parts.keys(keys)  # [B] each
    lengths = state.tcache.lengths  # [B]
    emitted = state.emitted

    with jax.named_scope("propose"):
        ctx = Context(state.prev, state.root, lengths, emitted.out, emitted.n_out, emitted.active, state.tcache)
        law = DraftLaw(cfg.tree, cfg.scheme, cfg.draft_warp, draft_temperature, parts.draw)
        prop = drafter.propose(dparams, target, state.dstate, ctx, k_draft, law)
        node_tokens = prop.tokens  # [B, N]
        draft_probs = prop.probs
        if draft_probs is None:  # fixed candidates: the rule reads no draft row (deterministic scheme)
            draft_probs = jnp.zeros((b, n + 1, target.config.vocab_size), jnp.float32)
        parents, full_mask, depth_full = _tree_layout(cfg.tree, prop.parents)

    def verify_tree(tcache):
        with jax.named_scope("verify"):
            mask = tree_cache_mask(lengths, parts.verify_mask(full_mask), tcache.capacity)  # [B, N + 1, S]
            seq = jnp.concatenate([state.root[:, None], node_tokens], axis=1)  # [B, N + 1]
            # [B, N + 1, D], or [B, N + 1, (k + 1) D] with the taps a multi-layer drafter reads
            feats, tcache = target.features(seq, lengths[:, None] + depth_full, tcache, mask, feature_taps(drafter))
            d = target.config.hidden_size
            target_probs = cfg.target_warp(target.unembed(feats[..., -d:]), temperature)  # [B, N + 1, V]

        with jax.named_scope("accept"):
            def accept_row(k, par, toks, tp, dp):
                return cfg.accept(k, par, toks, tp, dp, cfg.scheme)

            res = jax.vmap(accept_row, in_axes=(0, None if prop.parents is None else 0, 0, 0, 0))(
                k_acc, parents, node_tokens, target_probs, draft_probs
            )
        return res, tcache, feats

    def target_step(tcache):
        """No row has a draft worth verifying: one target step, the tree skipped."""
        return _tree_skipped(target, cfg.target_warp, tcache, state.root, k_acc, temperature, n, feature_taps(drafter))

    if prop.has_draft is None:
        res, tcache, feats = verify_tree(state.tcache)
    else:  # the choice reads only the history, never this round's randomness: still exact
        res, tcache, feats = jax.lax.cond(jnp.any(prop.has_draft & emitted.active), verify_tree, target_step,
                                          state.tcache)

    was_active = emitted.active
    with jax.named_scope("commit"):
        num = jnp.where(was_active, res.num_tokens, 0)
        tcache = parts.commit(tcache, res.accepted_nodes, num)
        dstate = drafter.commit(dparams, prop.state, Outcome(res.tokens, num, res.accepted_nodes, was_active, feats),
                                parts.commit)

    with jax.named_scope("emit"):
        emitted = emit_tokens(emitted, res.tokens, res.num_tokens, stop_tokens)
        extra = jnp.take_along_axis(res.tokens, (res.num_tokens - 1)[:, None], axis=1)[:, 0]
        last_acc = jnp.take_along_axis(res.tokens, jnp.maximum(res.num_accepted - 1, 0)[:, None], axis=1)[:, 0]
        prev = jnp.where(res.num_accepted > 0, last_acc, state.root)  # the new last committed token
    return RoundState(jnp.where(was_active, prev, state.prev), jnp.where(was_active, extra, state.root), tcache,
                      dstate, emitted), res


def _tree_layout(tree, parents):
    """``(parents, full_mask, depth_full)`` of the round's tree: the static tree's
    compile-time constants (``parents`` numpy ``[N]``, ``full_mask [N + 1, N + 1]``,
    ``depth_full [1, N + 1]``), or, for a proposal's per-row ``parents int32[B, N]``, the
    same per row (``[B, N + 1, N + 1]``, ``[B, N + 1]``)."""
    if parents is None:
        full_mask = tree.full_mask
        return tree.parents_array, full_mask, jnp.asarray(full_mask.sum(axis=1) - 1, jnp.int32)[None, :]
    full_mask = jax.vmap(treelib.full_tree_mask)(parents)
    return parents, full_mask, jnp.sum(full_mask, axis=2, dtype=jnp.int32) - 1


def _tree_skipped(target, warp: Warp, tcache: KVCache, root, keys, temperature, n: int, taps: tuple[int, ...] = ()):
    """A round with no tree: one target step from the root; nothing accepted, the drawn
    token is the extra one. ``(AcceptResult, cache, features [B, N + 1, D])``."""
    b = root.shape[0]
    tok, tcache, feat = _target_draw(target, warp, tcache, root, keys, temperature, taps)
    res = AcceptResult(
        tokens=jnp.full((b, n + 1), -1, jnp.int32).at[:, 0].set(tok),
        num_tokens=jnp.ones((b,), jnp.int32),
        num_accepted=jnp.zeros((b,), jnp.int32),
        accepted_nodes=jnp.full((b, n), -1, jnp.int32),
        accepted_per_depth=jnp.zeros((b, n), jnp.int32),
        last_node=jnp.full((b,), -1, jnp.int32),
    )
    feats = jnp.zeros((b, n + 1, feat.shape[-1]), feat.dtype).at[:, :1].set(feat)  # [B, N + 1, D]
    return res, tcache, feats


def _target_draw(target, warp: Warp, cache: KVCache, root, keys, temperature, taps: tuple[int, ...] = ()):
    """Forward the root (``int32[B]``) at slot ``L`` and draw one token per row (``keys
    [B]``) from the warped law: ``(token int32[B], cache with the root's K/V, the root's
    features float32[B, 1, D]`` (``[B, 1, (k + 1) D]`` with ``taps``, :meth:`Transformer.features`));
    ``lengths`` unchanged. The target-only step, and a speculative round with nothing to verify."""
    lengths = cache.lengths
    with jax.named_scope("verify"):
        mask = causal_cache_mask(lengths, 1, cache.capacity)  # [B, 1, S]
        feats, cache = target.features(root[:, None], lengths[:, None], cache, mask, taps)
        probs = warp(target.unembed(feats[..., -target.config.hidden_size:])[:, 0], temperature)  # [B, V]
    with jax.named_scope("accept"):
        tok = jax.vmap(sampling.sample_categorical)(keys, probs)  # [B]
    return tok, cache, feats


def autoregressive_step(
    target, warp: Warp, cache: KVCache, root, emitted: Emitted, keys, temperature, stop_tokens
) -> tuple[jax.Array, KVCache, Emitted]:
    """One target-only step for every row: forward the root (``int32[B]``) at slot ``L``,
    warp, draw one token per row (``keys [B]``), emit it; active rows commit the root.
    Returns ``(next root int32[B], cache, emitted)``."""
    b = root.shape[0]
    lengths = cache.lengths
    tok, cache, _ = _target_draw(target, warp, cache, root, keys, temperature)
    was_active = emitted.active
    with jax.named_scope("commit"):
        cache = cache.replace(lengths=lengths + was_active.astype(jnp.int32))
    with jax.named_scope("emit"):
        emitted = emit_tokens(emitted, tok[:, None], jnp.ones((b,), jnp.int32), stop_tokens)
    return jnp.where(was_active, tok, root), cache, emitted
