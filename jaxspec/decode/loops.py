"""The compiled loops of a generation (un-jitted programs; :mod:`jaxspec.decode.programs`
jits them): the prefill, :func:`~jaxspec.decode.round.speculative_round` in a
``lax.while_loop`` until every row has ended (or, with ``rows``, a queue of prompts through
fewer rows), and the target-only loop beside it.

Randomness: row b uses ``fold_in(key, b)``, its round r ``fold_in(row_key, r)`` (each row
counts its own rounds), so a row's draws depend neither on the rows beside it nor on when
it started."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.decode.config import ARConfig, SpecConfig
from jaxspec.decode.drafter import Prompt, feature_taps
from jaxspec.decode.result import GenerateResult
from jaxspec.decode.round import (
    Emitted,
    RoundInputs,
    RoundState,
    autoregressive_step,
    speculative_round,
    start_emitted,
)
from jaxspec.nn import sharding
from jaxspec.nn.cache import KVCache
from jaxspec.nn.model import prefill

__all__ = ["speculative_program", "autoregressive_program", "start_program", "row_keys", "merged", "spec_init",
           "spec_body", "spec_result", "ar_init", "ar_body", "ar_result", "set_row"]


def row_keys(key, b: int):
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b, dtype=jnp.int32))


def _fold_all(keys, r):
    """Row b's key for its round ``r[b]`` (``r``: int32[B], each row's own count of rounds,
    so a row's draws do not depend on the rows beside it, nor on when it started; or one
    int32 for every row)."""
    return jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(r, keys.shape[:1]))


def _start(model, tokens, lens, cfg, features: bool = False, taps: tuple[int, ...] = ()):
    """Prefill ``prompt[:-1]`` (cache lengths = len - 1); the last prompt token is the root.
    Returns ``(cache, root, logits or features of the prompt)``."""
    committed = lens - 1
    out, cache = prefill(model, tokens, committed, cfg.capacity, features=features, taps=taps)
    root = jnp.take_along_axis(tokens, committed[:, None], axis=1)[:, 0]
    return _place_cache(cache, model, cfg), root, out


def _rows(tree, cfg):
    """Per-row loop state kept split by rows over the mesh's data axis (identity without)."""
    return sharding.constrain_rows(tree, cfg.mesh, rows=cfg.split_rows)


def _place_cache(cache, model, cfg):
    """The cache's layout on ``cfg.mesh`` (rows over data, KV heads over model), so that
    the loop carry keeps it; the identity without a mesh."""
    return sharding.constrain_cache(cache, model.config, cfg.mesh, rows=cfg.split_rows)


def _count_round(rounds, accepted, was_active, res, stat_d):
    """Rounds ``int32[B]`` and accepted nodes per depth ``int32[B, D]`` after a round, counted
    for the rows active at its start."""
    return (rounds + was_active.astype(jnp.int32),
            accepted + jnp.where(was_active[:, None], res.accepted_per_depth[:, :stat_d], 0))


class _SpecLoop(NamedTuple):
    r: jax.Array  # int32 round index
    st: RoundState
    rounds: jax.Array  # int32[B]
    accepted: jax.Array  # int32[B, D]


def _start_state(cfg: SpecConfig, target, draft, tokens, lens) -> RoundState:
    """The loop state before the first round of prompts ``tokens int32[B, P]`` (lengths
    ``lens``): the target's cache prefilled, the drafter's state started from the prompts
    and the target's prompt features (:meth:`~jaxspec.decode.drafter.Drafter.init`),
    nothing emitted. ``draft``: ``(drafter, params)``."""
    drafter, dparams = draft
    tcache, root, tfeats = _start(target, tokens, lens, cfg, features=True, taps=feature_taps(drafter))
    dstate = drafter.init(dparams, target, Prompt(tokens, lens, tfeats, cfg.capacity, cfg.tree))
    prev = jnp.take_along_axis(tokens, jnp.maximum(lens - 2, 0)[:, None], axis=1)[:, 0]
    return RoundState(prev=prev, root=root, tcache=tcache, dstate=dstate,
                      emitted=start_emitted(tokens.shape[0], cfg.max_new_tokens))


def set_row(state, one, row):
    """``state`` (a pytree of per-row arrays: rows on axis 0, a KV cache's on axis 1) with
    row ``row`` replaced by the only row of ``one``, a state of the same structure."""
    def put(full, new):
        if isinstance(full, KVCache):
            return KVCache(k=full.k.at[:, row].set(new.k[:, 0]), v=full.v.at[:, row].set(new.v[:, 0]),
                           lengths=full.lengths.at[row].set(new.lengths[0]))
        return full.at[row].set(new[0])

    return jax.tree.map(put, state, one, is_leaf=lambda x: isinstance(x, KVCache))


def merged(cfg: SpecConfig, target_state, draft_state):
    """``(target, (drafter, params))`` inside a compiled program."""
    return nnx.merge(cfg.target_def, target_state), (cfg.draft_def, draft_state)


def _placed(cfg: SpecConfig, target, draft, lp: _SpecLoop) -> _SpecLoop:
    """The loop state in its layout on ``cfg.mesh`` (caches as :func:`_place_cache`, every
    other per-row array split by rows), the same after the prefill as after every round, so
    that a streamed round's program meets one input layout; the identity without a mesh."""
    if cfg.mesh is None:
        return lp
    st = lp.st
    st = st._replace(tcache=_place_cache(st.tcache, target, cfg),
                     dstate=sharding.constrain_state(st.dstate, cfg.mesh, rows=cfg.split_rows),
                     prev=_rows(st.prev, cfg), root=_rows(st.root, cfg), emitted=_rows(st.emitted, cfg))
    rounds, accepted = _rows((lp.rounds, lp.accepted), cfg)
    return lp._replace(st=st, rounds=rounds, accepted=accepted)


def spec_init(cfg: SpecConfig, target, draft, tokens, lens) -> _SpecLoop:
    b = tokens.shape[0]
    return _placed(cfg, target, draft, _SpecLoop(
        r=jnp.int32(0),
        st=_start_state(cfg, target, draft, tokens, lens),
        rounds=jnp.zeros((b,), jnp.int32),
        accepted=jnp.zeros((b, cfg.stat_depth), jnp.int32),
    ))


def spec_body(cfg: SpecConfig, target, draft, row_keys, temperature, draft_temperature, stop_tokens):
    """One round of the loop, ``_SpecLoop -> _SpecLoop`` (``row_keys``: :func:`row_keys`)."""
    round_cfg = cfg.round_config

    def body(lp: _SpecLoop) -> _SpecLoop:
        was_active = lp.st.emitted.active
        st, res = speculative_round(round_cfg, RoundInputs(
            target, draft[1], lp.st, _fold_all(row_keys, lp.rounds), temperature, draft_temperature, stop_tokens))
        rounds, accepted = _count_round(lp.rounds, lp.accepted, was_active, res, cfg.stat_depth)
        return _placed(cfg, target, draft, _SpecLoop(r=lp.r + 1, st=st, rounds=rounds, accepted=accepted))

    return body


def spec_result(cfg: SpecConfig, lp: _SpecLoop) -> GenerateResult:
    return _rows(_result(cfg, lp.st.emitted.out, lp.st.emitted.n_out, lp.rounds, lp.accepted), cfg)


def speculative_program(
    cfg: SpecConfig, target_state, draft_state, key, tokens, lens, temperature, draft_temperature, stop_tokens
) -> GenerateResult:
    """The function :func:`generate` compiles for ``cfg`` (un-jitted; :func:`compiled`
    jits it): prefill (:func:`_start_state`), then
    :func:`~jaxspec.decode.round.speculative_round` in a ``lax.while_loop`` until every row
    has ended. With ``cfg.rows`` below the number of prompts, :func:`_queue_program`."""
    target, draft = merged(cfg, target_state, draft_state)
    if cfg.rows is not None and cfg.rows < tokens.shape[0]:
        return _queue_program(cfg, target, draft, key, tokens, lens, temperature, draft_temperature, stop_tokens)
    m = cfg.max_new_tokens

    def cond(lp: _SpecLoop):
        return jnp.any(lp.st.emitted.active) & (lp.r < m)

    body = spec_body(cfg, target, draft, row_keys(key, tokens.shape[0]), temperature, draft_temperature,
                      stop_tokens)
    return spec_result(cfg, jax.lax.while_loop(cond, body, spec_init(cfg, target, draft, tokens, lens)))


def _result(cfg: SpecConfig, out, n_out, rounds, accepted) -> GenerateResult:
    return GenerateResult(
        tokens=out,
        lengths=n_out,
        rounds=rounds,
        target_calls=rounds,
        draft_calls=rounds * cfg.draft_calls_per_round,
        tau=n_out.astype(jnp.float32) / jnp.maximum(rounds, 1).astype(jnp.float32),
        accepted_per_depth=accepted,
    )


class _QueueLoop(NamedTuple):
    r: jax.Array  # int32 loop iteration
    st: RoundState  # the R rows
    rounds: jax.Array  # int32[R] rounds of each row's current prompt
    accepted: jax.Array  # int32[R, D]
    slot: jax.Array  # int32[R] the prompt each row holds
    next: jax.Array  # int32 the next prompt of the queue
    done: GenerateResult  # per prompt [N, ...]: written when its row ends


def _queue_program(cfg: SpecConfig, target, draft, key, tokens, lens, temperature, draft_temperature,
                   stop_tokens) -> GenerateResult:
    """Continuous batching with static shapes: ``cfg.rows`` rows decode the ``N`` prompts.
    The first ``R`` prompts start in rows ``0 .. R-1``; after each round, every row that
    has ended (stop token or budget) writes its prompt's tokens and statistics to the
    ``[N, ...]`` result, then takes the next prompt of the queue: that prompt alone is
    prefilled (a one-row :func:`_start_state`) and written over the row's whole state.

    Prompt j's randomness is ``fold_in(fold_in(key, j), round)``, its round counted from its
    own start, as in a batch of all N prompts, so with a draft model or a feature head the
    result is that of :func:`generate` on the N prompts at once (up to the last bits of
    batch-size dependent float sums), only computed with R rows. (An n-gram draft's round
    kind depends on the other rows: the same law, other tokens.)"""
    n, r_rows, m, stat_d = tokens.shape[0], cfg.rows, cfg.max_new_tokens, cfg.stat_depth
    round_cfg = cfg.round_config
    prompt_keys = row_keys(key, n)

    def refill(c):
        st, rounds, accepted, slot, nxt = c
        row = jnp.argmax(~st.emitted.active)  # the first ended row
        one = _start_state(cfg, target, draft, jax.lax.dynamic_slice_in_dim(tokens, nxt, 1),
                           jax.lax.dynamic_slice_in_dim(lens, nxt, 1))
        return (set_row(st, one, row), rounds.at[row].set(0), accepted.at[row].set(0), slot.at[row].set(nxt),
                nxt + 1)

    def can_refill(c):
        st, _, _, _, nxt = c
        return jnp.any(~st.emitted.active) & (nxt < n)

    def write(done: GenerateResult, rows_mask, st, rounds, accepted, slot) -> GenerateResult:
        idx = jnp.where(rows_mask, slot, n)  # n: dropped
        new = _result(cfg, st.emitted.out, st.emitted.n_out, rounds, accepted)
        return jax.tree.map(lambda d, x: d.at[idx].set(x, mode="drop"), done, new)

    def body(lp: _QueueLoop) -> _QueueLoop:
        was_active = lp.st.emitted.active
        st, res = speculative_round(round_cfg, RoundInputs(
            target, draft[1], lp.st, _fold_all(prompt_keys[lp.slot], lp.rounds), temperature, draft_temperature,
            stop_tokens))
        rounds, accepted = _count_round(lp.rounds, lp.accepted, was_active, res, stat_d)
        done = write(lp.done, was_active & ~st.emitted.active, st, rounds, accepted, lp.slot)
        st, rounds, accepted, slot, nxt = jax.lax.while_loop(can_refill, refill,
                                                             (st, rounds, accepted, lp.slot, lp.next))
        return _QueueLoop(lp.r + 1, st, rounds, accepted, slot, nxt, done)

    def cond(lp: _QueueLoop):
        return jnp.any(lp.st.emitted.active) & (lp.r < cap)

    cap = min(n * m, 2**31 - 1)  # never reached: a round emits >= 1 token per active row
    zeros = jnp.zeros((n,), jnp.int32)
    init = _QueueLoop(
        r=jnp.int32(0),
        st=_start_state(cfg, target, draft, tokens[:r_rows], lens[:r_rows]),
        rounds=jnp.zeros((r_rows,), jnp.int32),
        accepted=jnp.zeros((r_rows, stat_d), jnp.int32),
        slot=jnp.arange(r_rows, dtype=jnp.int32),
        next=jnp.int32(r_rows),
        done=_result(cfg, jnp.full((n, m), -1, jnp.int32), zeros, zeros, jnp.zeros((n, stat_d), jnp.int32)),
    )
    lp = jax.lax.while_loop(cond, body, init)
    return write(lp.done, lp.st.emitted.active, lp.st, lp.rounds, lp.accepted, lp.slot)  # none, unless capped


def start_program(cfg: SpecConfig | ARConfig, target_state, draft_state, tokens, lens):
    """The prefill that :func:`speculative_program` (``cfg`` a :class:`SpecConfig`: the
    first round's :class:`~jaxspec.decode.round.RoundState`) or
    :func:`autoregressive_program` (an :class:`ARConfig`: ``(cache, root)``; pass
    ``draft_state=None``) starts its loop from (un-jitted), so that a benchmark can take it
    out of a call's time."""
    if isinstance(cfg, ARConfig):
        return _start(nnx.merge(cfg.target_def, target_state), tokens, lens, cfg)[:2]
    return _start_state(cfg, *merged(cfg, target_state, draft_state), tokens, lens)


class _ARLoop(NamedTuple):
    r: jax.Array  # int32 step index
    root: jax.Array  # int32[B] the last token, whose forward comes next
    cache: KVCache
    emitted: Emitted


def ar_init(cfg: ARConfig, model, tokens, lens) -> _ARLoop:
    cache, root, _ = _start(model, tokens, lens, cfg)  # the cache placed on cfg.mesh by _start
    root, emitted = _rows((root, start_emitted(tokens.shape[0], cfg.max_new_tokens)), cfg)  # as after a step
    return _ARLoop(jnp.int32(0), root, cache, emitted)


def ar_body(cfg: ARConfig, model, row_keys, temperature, stop_tokens):
    def body(lp: _ARLoop) -> _ARLoop:
        root, cache, emitted = autoregressive_step(
            model, cfg.warp, lp.cache, lp.root, lp.emitted, _fold_all(row_keys, lp.r), temperature, stop_tokens
        )
        cache = _place_cache(cache, model, cfg)
        root, emitted = _rows((root, emitted), cfg)
        return _ARLoop(lp.r + 1, root, cache, emitted)

    return body


def ar_result(cfg: ARConfig, lp: _ARLoop) -> GenerateResult:
    lengths = lp.emitted.n_out
    return _rows(GenerateResult(
        tokens=lp.emitted.out,
        lengths=lengths,
        rounds=lengths,
        target_calls=lengths,
        draft_calls=jnp.zeros_like(lengths),
        tau=(lengths > 0).astype(jnp.float32),
        accepted_per_depth=jnp.zeros((lengths.shape[0], 0), jnp.int32),
    ), cfg)


def autoregressive_program(cfg: ARConfig, target_state, key, tokens, lens, temperature, stop_tokens) -> GenerateResult:
    """The function :func:`generate_autoregressive` compiles for ``cfg`` (un-jitted):
    prefill, then :func:`~jaxspec.decode.round.autoregressive_step` in a
    ``lax.while_loop``."""
    model = nnx.merge(cfg.target_def, target_state)
    m = cfg.max_new_tokens

    def cond(lp: _ARLoop):
        return jnp.any(lp.emitted.active) & (lp.r < m)

    body = ar_body(cfg, model, row_keys(key, tokens.shape[0]), temperature, stop_tokens)
    return ar_result(cfg, jax.lax.while_loop(cond, body, ar_init(cfg, model, tokens, lens)))
