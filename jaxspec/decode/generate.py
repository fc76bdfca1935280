"""Speculative generation (one jit-compiled ``lax.while_loop`` over rounds) and the
target-only baseline on the same model code.

::

    out = jaxspec.generate(key, target, draft, [[3, 1, 4], [1, 5]], max_new_tokens=32,
                           tree=(3, 2, 1), scheme="without_replacement", temperature=0.8)
    out.tokens    # int32[B, 32], -1 after each row's end
    out.lengths   # int32[B]
    out.tau       # float32[B] tokens per target call
    out.summary() # {"num_tokens": ..., "tokens_per_target_call": ..., ...}: the names of ``jaxspec generate --json``

One round is :func:`jaxspec.decode.round.speculative_round` (propose, verify, accept,
commit, emit); this module runs it in a loop, validates the arguments and keeps the
compiled functions.

Rows end independently: at the first stop token (kept; by default the target's
``config.eos_token_id``, see :func:`resolve_stop_tokens`) or when ``max_new_tokens`` are
emitted; tokens of a round past either end are dropped; a finished row emits nothing
more (its compute continues, masked: shapes are static). Randomness: row b uses
``fold_in(key, b)``, round r ``fold_in(row_key, r)``, split into a draft key (one
``fold_in`` per tree row) and an acceptance key: a batch of B identical prompts is B
independent samples.

Compilation: one ``jax.jit`` per static configuration (:class:`SpecConfig` /
:class:`ARConfig`: model graphdefs, tree, scheme, top-k/top-p, budget, cache capacity),
kept in a module-level cache. Models travel as ``nnx.split`` state arguments; keys,
prompts, temperatures and stop tokens are traced arguments: new keys, prompts of the same
shape, other temperatures, other stop tokens (same count) or new weights of the same
architecture do not retrace.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxspec.checks import is_int
from jaxspec.core import rules, sampling
from jaxspec.core.sampling import Warp
from jaxspec.core.treespec import DynamicTree, StaticTree, resolve_tree
from jaxspec.decode.round import (
    Emitted,
    RoundConfig,
    RoundParts,
    RoundState,
    autoregressive_step,
    speculative_round,
    start_emitted,
)
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.decode.drafter import Drafter, DraftRequest, Prompt
from jaxspec.decode.memory import check_generate_memory
from jaxspec.decode.output_checks import check_drafter_output, check_rule_output, is_library_code
from jaxspec.decode.program_store import StoredFunction, library_function_name, static_text
from jaxspec.nn import sharding
from jaxspec.nn.cache import KVCache
from jaxspec.nn.model import Transformer, check_transformer, prefill

__all__ = [
    "DEFAULT_TREE",
    "GenerateResult",
    "SUMMARY_KEYS",
    "resolve_stop_tokens",
    "SpecConfig",
    "ARConfig",
    "build_config",
    "build_ar_config",
    "generate",
    "generate_autoregressive",
    "run_compiled",
    "run_compiled_autoregressive",
    "compiled",
    "compiled_stream",
    "StreamPrograms",
    "speculative_program",
    "autoregressive_program",
    "start_program",
    "prepare_prompts",
    "PROMPT_BUCKET",
    "check_prompt_bucket",
    "bucket_width",
    "bucket_config",
    "stop_array",
]

#: the tree of ``generate`` and ``jaxspec generate`` when none is given: the fastest measured on
#: the default pair (benchmarks/README.md, decode_speed)
DEFAULT_TREE = "chain:4"

#: the default ``prompt_bucket`` of :func:`generate` and :func:`generate_autoregressive`:
#: prompts padded to a multiple of 32 tokens share one compiled program
PROMPT_BUCKET = 32

SCHEMES = sampling.SCHEMES


class GenerateResult(NamedTuple):
    """Output of :func:`generate` / :func:`generate_autoregressive` (a pytree).

    tokens:             int32[B, max_new_tokens] generated tokens, -1 after ``lengths[b]``.
    lengths:            int32[B] tokens generated per row (a stop token is included).
    rounds:             int32[B] rounds in which the row was still active.
    target_calls:       int32[B] target forward passes spent on the row after the prompt
                        prefill (one verification per round; ``lengths`` when autoregressive).
    draft_calls:        int32[B] draft forward passes after the prefill (per round: D for
                        a static tree of depth D, depth + 1 for a DynamicTree; 0 when
                        autoregressive).
    tau:                float32[B] ``lengths / target_calls``: tokens per target call
                        (``tokens_per_target_call`` in :meth:`summary`).
    accepted_per_depth: int32[B, D] accepted draft nodes at depth ``d + 1`` over the row's
                        rounds (all of a round's accepted nodes, even those cut by a stop
                        token or the budget; so ``lengths <= sum(accepted) + target_calls``,
                        with equality unless a round was cut).
    """

    tokens: jax.Array
    lengths: jax.Array
    rounds: jax.Array
    target_calls: jax.Array
    draft_calls: jax.Array
    tau: jax.Array
    accepted_per_depth: jax.Array

    def summary(self) -> dict:
        """Batch statistics as plain Python numbers (blocks on the device), under the names
        ``jaxspec generate --json`` prints them with (:data:`SUMMARY_KEYS`, in this order):

        num_tokens:             tokens generated, summed over rows (``lengths``). ``tokens``
                                names only lists of token ids, never a count.
        target_calls, draft_calls, rounds: the per-row fields of those names, summed over rows.
        loop_rounds:            iterations of the generation loop: the most ``rounds`` of any
                                row (rows run in lockstep, so wall time per round divides by this).
        tokens_per_target_call: ``num_tokens / target_calls`` (tau; per row: the field ``tau``).
        accept_rate_per_depth:  for depth d + 1, accepted nodes at that depth / ``rounds``.

        Every count is a sum over rows, as ``rounds`` is (the denominator of
        ``accept_rate_per_depth``; for speculative decoding it equals ``target_calls``); the
        one batch maximum has its own name, ``loop_rounds``. With one row they agree.
        """
        lengths = np.asarray(self.lengths)
        tcalls = np.asarray(self.target_calls)
        acc = np.asarray(self.accepted_per_depth)
        rounds = np.asarray(self.rounds)
        return {
            "num_tokens": int(lengths.sum()),
            "target_calls": int(tcalls.sum()),
            "draft_calls": int(np.asarray(self.draft_calls).sum()),
            "rounds": int(rounds.sum()),
            "loop_rounds": int(rounds.max(initial=0)),
            "tokens_per_target_call": float(lengths.sum() / max(tcalls.sum(), 1)),
            "accept_rate_per_depth": (acc.sum(axis=0) / max(rounds.sum(), 1)).tolist(),
        }


#: the keys of :meth:`GenerateResult.summary`, in order (``jaxspec generate --json`` has each)
SUMMARY_KEYS = ("num_tokens", "target_calls", "draft_calls", "rounds", "loop_rounds",
                "tokens_per_target_call", "accept_rate_per_depth")


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Static configuration of one compiled speculative generation (hashable)."""

    target_def: nnx.GraphDef
    draft_def: Drafter  # the drafter (jaxspec.decode.drafter); its params are a traced argument
    tree: StaticTree | DynamicTree
    scheme: str
    target_warp: Warp
    draft_warp: Warp
    max_new_tokens: int
    capacity: int
    parts: RoundParts = RoundParts()
    mesh: Mesh | None = None  # rows over "data", parameters and KV heads over "model"
    split_rows: bool = True  # False: rows are already per device (the harness's shard_map)
    rows: int | None = None  # decode at most this many prompts at once, refilling ended rows

    @property
    def round_config(self) -> RoundConfig:
        """The static description of one round of this generation."""
        return RoundConfig(self.tree, self.scheme, self.target_warp, self.draft_warp, self.parts)

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    @property
    def stat_depth(self) -> int:
        """Columns of ``accepted_per_depth``."""
        if isinstance(self.tree, StaticTree):
            return self.tree.depth
        return min(self.tree.depth, self.tree.num_nodes)

    @property
    def draft_calls_per_round(self) -> int:
        """The drafter's forwards per round (:meth:`~jaxspec.decode.drafter.Drafter.forwards`)."""
        return int(self.draft_def.forwards(self.tree))


@dataclasses.dataclass(frozen=True)
class ARConfig:
    """Static configuration of one compiled target-only generation (hashable)."""

    target_def: nnx.GraphDef
    warp: Warp
    max_new_tokens: int
    capacity: int
    mesh: Mesh | None = None
    split_rows: bool = True


# --------------------------------------------------------------------------- the loops


def _row_keys(key, b: int):
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b, dtype=jnp.int32))


def _fold_all(keys, r):
    """Row b's key for its round ``r[b]`` (``r``: int32[B], each row's own count of rounds,
    so a row's draws do not depend on the rows beside it, nor on when it started; or one
    int32 for every row)."""
    return jax.vmap(jax.random.fold_in)(keys, jnp.broadcast_to(r, keys.shape[:1]))


def _start(model, tokens, lens, cfg, features: bool = False):
    """Prefill ``prompt[:-1]`` (cache lengths = len - 1); the last prompt token is the root.
    Returns ``(cache, root, logits or features of the prompt)``."""
    committed = lens - 1
    out, cache = prefill(model, tokens, committed, cfg.capacity, features=features)
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
    tcache, root, tfeats = _start(target, tokens, lens, cfg, features=True)
    dstate = drafter.init(dparams, target, Prompt(tokens, lens, tfeats, cfg.capacity, cfg.tree))
    prev = jnp.take_along_axis(tokens, jnp.maximum(lens - 2, 0)[:, None], axis=1)[:, 0]
    return RoundState(prev=prev, root=root, tcache=tcache, dstate=dstate,
                      emitted=start_emitted(tokens.shape[0], cfg.max_new_tokens))


def _set_row(state, one, row):
    """``state`` (a pytree of per-row arrays: rows on axis 0, a KV cache's on axis 1) with
    row ``row`` replaced by the only row of ``one``, a state of the same structure."""
    def put(full, new):
        if isinstance(full, KVCache):
            return KVCache(k=full.k.at[:, row].set(new.k[:, 0]), v=full.v.at[:, row].set(new.v[:, 0]),
                           lengths=full.lengths.at[row].set(new.lengths[0]))
        return full.at[row].set(new[0])

    return jax.tree.map(put, state, one, is_leaf=lambda x: isinstance(x, KVCache))


def _merged(cfg: SpecConfig, target_state, draft_state):
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


def _spec_init(cfg: SpecConfig, target, draft, tokens, lens) -> _SpecLoop:
    b = tokens.shape[0]
    return _placed(cfg, target, draft, _SpecLoop(
        r=jnp.int32(0),
        st=_start_state(cfg, target, draft, tokens, lens),
        rounds=jnp.zeros((b,), jnp.int32),
        accepted=jnp.zeros((b, cfg.stat_depth), jnp.int32),
    ))


def _spec_body(cfg: SpecConfig, target, draft, row_keys, temperature, draft_temperature, stop_tokens):
    """One round of the loop, ``_SpecLoop -> _SpecLoop`` (``row_keys``: :func:`_row_keys`)."""
    round_cfg = cfg.round_config

    def body(lp: _SpecLoop) -> _SpecLoop:
        was_active = lp.st.emitted.active
        st, res = speculative_round(
            round_cfg, target, *draft, lp.st, _fold_all(row_keys, lp.rounds), temperature, draft_temperature,
            stop_tokens,
        )
        rounds, accepted = _count_round(lp.rounds, lp.accepted, was_active, res, cfg.stat_depth)
        return _placed(cfg, target, draft, _SpecLoop(r=lp.r + 1, st=st, rounds=rounds, accepted=accepted))

    return body


def _spec_result(cfg: SpecConfig, lp: _SpecLoop) -> GenerateResult:
    return _rows(_result(cfg, lp.st.emitted.out, lp.st.emitted.n_out, lp.rounds, lp.accepted), cfg)


def speculative_program(
    cfg: SpecConfig, target_state, draft_state, key, tokens, lens, temperature, draft_temperature, stop_tokens
) -> GenerateResult:
    """The function :func:`generate` compiles for ``cfg`` (un-jitted; :func:`compiled`
    jits it): prefill (:func:`_start_state`), then
    :func:`~jaxspec.decode.round.speculative_round` in a ``lax.while_loop`` until every row
    has ended. With ``cfg.rows`` below the number of prompts, :func:`_queue_program`."""
    target, draft = _merged(cfg, target_state, draft_state)
    if cfg.rows is not None and cfg.rows < tokens.shape[0]:
        return _queue_program(cfg, target, draft, key, tokens, lens, temperature, draft_temperature, stop_tokens)
    m = cfg.max_new_tokens

    def cond(lp: _SpecLoop):
        return jnp.any(lp.st.emitted.active) & (lp.r < m)

    body = _spec_body(cfg, target, draft, _row_keys(key, tokens.shape[0]), temperature, draft_temperature,
                      stop_tokens)
    return _spec_result(cfg, jax.lax.while_loop(cond, body, _spec_init(cfg, target, draft, tokens, lens)))


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
    prompt_keys = _row_keys(key, n)

    def refill(c):
        st, rounds, accepted, slot, nxt = c
        row = jnp.argmax(~st.emitted.active)  # the first ended row
        one = _start_state(cfg, target, draft, jax.lax.dynamic_slice_in_dim(tokens, nxt, 1),
                           jax.lax.dynamic_slice_in_dim(lens, nxt, 1))
        return (_set_row(st, one, row), rounds.at[row].set(0), accepted.at[row].set(0), slot.at[row].set(nxt),
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
        st, res = speculative_round(
            round_cfg, target, *draft, lp.st, _fold_all(prompt_keys[lp.slot], lp.rounds), temperature,
            draft_temperature, stop_tokens,
        )
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
    return _start_state(cfg, *_merged(cfg, target_state, draft_state), tokens, lens)


class _ARLoop(NamedTuple):
    r: jax.Array  # int32 step index
    root: jax.Array  # int32[B] the last token, whose forward comes next
    cache: KVCache
    emitted: Emitted


def _ar_init(cfg: ARConfig, model, tokens, lens) -> _ARLoop:
    cache, root, _ = _start(model, tokens, lens, cfg)  # the cache placed on cfg.mesh by _start
    root, emitted = _rows((root, start_emitted(tokens.shape[0], cfg.max_new_tokens)), cfg)  # as after a step
    return _ARLoop(jnp.int32(0), root, cache, emitted)


def _ar_body(cfg: ARConfig, model, row_keys, temperature, stop_tokens):
    def body(lp: _ARLoop) -> _ARLoop:
        root, cache, emitted = autoregressive_step(
            model, cfg.warp, lp.cache, lp.root, lp.emitted, _fold_all(row_keys, lp.r), temperature, stop_tokens
        )
        cache = _place_cache(cache, model, cfg)
        root, emitted = _rows((root, emitted), cfg)
        return _ARLoop(lp.r + 1, root, cache, emitted)

    return body


def _ar_result(cfg: ARConfig, lp: _ARLoop) -> GenerateResult:
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

    body = _ar_body(cfg, model, _row_keys(key, tokens.shape[0]), temperature, stop_tokens)
    return _ar_result(cfg, jax.lax.while_loop(cond, body, _ar_init(cfg, model, tokens, lens)))


# --------------------------------------------------------------------------- compile cache


def store_text(cfg: SpecConfig | ARConfig) -> str | None:
    """The text that keys ``cfg``'s programs in the program store
    (:mod:`jaxspec.decode.program_store`), or ``None`` where they are never stored: on a
    mesh, or with round parts that are not the library's own functions (a caller's
    function is known only by its name, which another process may give another function)."""
    if cfg.mesh is not None:
        return None
    if isinstance(cfg, SpecConfig) and not (
            all(library_function_name(getattr(cfg.parts, f.name)) for f in dataclasses.fields(cfg.parts))
            and type(cfg.draft_def).__module__.startswith("jaxspec.")):
        return None  # a caller's function or drafter class is known only by its name
    return static_text(cfg)


@functools.lru_cache(maxsize=64)
def compiled(cfg: SpecConfig | ARConfig) -> Callable:
    """The jitted function of a static configuration (one trace per input shape), kept in
    a module-level cache: equal configurations share one compilation. With the program
    store in use (:func:`jaxspec.decode.program_store.use_folder`, as the command line
    does), a new process loads the traced program instead of tracing it again."""
    impl = speculative_program if isinstance(cfg, SpecConfig) else autoregressive_program
    return StoredFunction(functools.partial(impl, cfg), impl.__name__, store_text(cfg))


class StreamPrograms(NamedTuple):
    """The loop of a configuration cut at its rounds, for streaming without a host
    callback (a program with one is never stored in JAX's persistent compilation cache):
    the host runs ``start``, then ``step`` (one round; its loop-state argument is donated)
    while a row is active, reading each round's tokens from the copy ``step`` returns
    beside the state, then ``result``. Each is a jitted function; the rounds are the
    loop's (another compilation of them: the same tokens up to the last bits of its float
    sums)."""

    start: Callable  # (states, tokens, lens) -> loop state
    # (leaves of states, their treedef (static), key, loop state, *scalars)
    #   -> (loop state after one round, (tokens int32[B, M], lengths int32[B], active bool[B]) copied)
    step: Callable
    result: Callable  # loop state -> GenerateResult


@functools.lru_cache(maxsize=64)
def compiled_stream(cfg: SpecConfig | ARConfig) -> StreamPrograms:
    """The :class:`StreamPrograms` of ``cfg`` (cached as :func:`compiled` is). ``states``:
    ``(target_state, draft_state)`` (``draft_state`` ``None`` for an n-gram draft) or
    ``(target_state,)``; ``scalars`` as the compiled program's last arguments. ``step``
    takes the states flattened once (``jax.tree.flatten``), so that a round's dispatch does
    not walk the models' variables again."""
    if isinstance(cfg, SpecConfig):
        if cfg.rows is not None:
            raise ValueError("rows: continuous batching does not stream (a row changes prompts); "
                             "pass on_round=None, or a configuration with rows=None")

        def start(states, tokens, lens):
            return _spec_init(cfg, *_merged(cfg, *states), tokens, lens)

        def step(leaves, treedef, key, lp, temperature, draft_temperature, stop_tokens):
            states = jax.tree.unflatten(treedef, leaves)
            body = _spec_body(cfg, *_merged(cfg, *states), _row_keys(key, lp.rounds.shape[0]), temperature,
                              draft_temperature, stop_tokens)
            lp = body(lp)
            return lp, _view(lp.st.emitted)

        result = functools.partial(_spec_result, cfg)
    else:
        def start(states, tokens, lens):
            return _ar_init(cfg, nnx.merge(cfg.target_def, states[0]), tokens, lens)

        def step(leaves, treedef, key, lp, temperature, stop_tokens):
            states = jax.tree.unflatten(treedef, leaves)
            model = nnx.merge(cfg.target_def, states[0])
            lp = _ar_body(cfg, model, _row_keys(key, lp.root.shape[0]), temperature, stop_tokens)(lp)
            return lp, _view(lp.emitted)

        result = functools.partial(_ar_result, cfg)
    text = store_text(cfg)
    return StreamPrograms(StoredFunction(start, "stream_start", text),
                          StoredFunction(step, "stream_step", text, static_argnums=(1,), donate_argnums=(3,)),
                          StoredFunction(result, "stream_result", text))


def _view(em: Emitted):
    """A copy of what the host reads after a round: not part of the loop state, which the
    next round's call takes (donated) before the host has read it."""
    return jax.tree.map(jnp.copy, (em.out, em.n_out, em.active))


def _streamed(cfg, on_round, b: int, states, key, tokens, lens, *scalars) -> GenerateResult:
    """The generation of ``cfg`` a round at a time (:func:`compiled_stream`), calling
    ``on_round(tokens int32[b, M], lengths int32[b])`` (numpy; the first ``b`` rows, those
    of the caller's prompts) after each round, in order."""
    progs = compiled_stream(cfg)
    leaves, treedef = jax.tree.flatten(states)

    def step(lp):
        return progs.step(leaves, treedef, key, lp, *scalars)

    lp, view = step(progs.start(states, tokens, lens))
    for r in range(1, cfg.max_new_tokens + 1):  # a round emits >= 1 token in every active row
        # the next round is dispatched before the host waits for this one's tokens, so the
        # device is not idle while the host reads them and calls on_round; after the last
        # round that leaves one round over rows that have all ended, which changes nothing
        ahead = step(lp) if r < cfg.max_new_tokens else None
        out, n_out, active = jax.device_get(sharding.gather(view))
        on_round(out[:b], n_out[:b])
        if ahead is None:
            break
        lp, view = ahead
        if not active[:b].any():  # a mesh's padding rows (dropped from the result) may run on
            break
    return progs.result(lp)


# --------------------------------------------------------------------------- validation


def _check_on_round(on_round):
    if on_round is not None and not callable(on_round):
        raise ValueError(
            f"on_round = {on_round!r}: expected None or a function f(tokens, lengths) called "
            "once per round"
        )
    return on_round


def _check_parts(parts) -> RoundParts:
    if parts is None:
        return RoundParts()
    if not isinstance(parts, RoundParts):
        raise ValueError(
            f"parts = {parts!r}: expected None or a jaxspec.RoundParts (verify_mask, accept, commit)"
        )
    for name in ("verify_mask", "accept", "commit"):
        if not callable(getattr(parts, name)):
            raise ValueError(f"parts.{name} = {getattr(parts, name)!r}: expected a function")
    return parts


def _with_rule(parts: RoundParts, rule, scheme: str, spec) -> RoundParts:
    """``parts`` with the acceptance step of ``rule`` (checked against the scheme and the
    tree); a rule other than ``"token"`` or ``"auto"`` and a replaced ``parts.accept``
    conflict (``"auto"`` leaves a replaced acceptance step in place)."""
    if isinstance(rule, str) and rule == rules.AUTO and parts.accept is not RoundParts().accept:
        return parts
    accept = rules.check_rule(rule, scheme, spec)
    if accept is parts.accept or (isinstance(rule, str) and rule == "token"):
        return parts  # the default rule leaves a replaced parts.accept in place
    if parts.accept is not RoundParts().accept:
        raise ValueError(
            f"rule = {rules.rule_name(rule)!r} and parts.accept = {parts.accept!r}: both replace the "
            "acceptance step; pass one of them"
        )
    return dataclasses.replace(parts, accept=accept)


def _check_mesh(mesh, target) -> Mesh | None:
    """``mesh`` validated against the target (None stays None; a drafter checks its own
    part, :meth:`~jaxspec.decode.drafter.Drafter.check`)."""
    if mesh is None:
        return None
    mesh = sharding.check_mesh(mesh)  # jax.make_mesh's Explicit axes made Auto
    sharding.check_model_on_mesh("target", target.config, mesh)
    return mesh


def _check_rows(rows, mesh) -> int | None:
    if rows is None:
        return None
    if not is_int(rows) or rows < 1:
        raise ValueError(f"rows = {rows!r}: expected None or an integer >= 1 (the prompts decoded at a time)")
    if mesh is not None:
        raise ValueError("rows: continuous batching runs on one device; pass mesh=None, or rows=None to split "
                         "every prompt's row over the mesh")
    return int(rows)


def _check_graphdef(name: str, graphdef) -> nnx.GraphDef:
    if not isinstance(graphdef, nnx.GraphDef):
        raise ValueError(f"{name} = {type(graphdef).__name__}: expected an nnx.GraphDef (the first half of nnx.split)")
    return graphdef


def _definition(draft):
    """A model's ``nnx.GraphDef`` (its params are not needed to build a configuration);
    ``None`` for a drafter."""
    return nnx.graphdef(draft) if isinstance(draft, nnx.Module) else None


def _check_graphdefs(graphdefs, draft) -> tuple:
    """``graphdefs`` of :func:`build_config` -> ``(target graphdef, drafter)``: the target's
    ``nnx.GraphDef`` and the draft model's or feature head's (a drafter is its own
    definition). Which models they describe cannot be checked without the traversal that
    passing them in avoids."""
    if not isinstance(graphdefs, tuple) or len(graphdefs) != 2:
        what = f"a tuple of {len(graphdefs)}" if isinstance(graphdefs, tuple) else f"a {type(graphdefs).__name__}"
        raise ValueError(f"graphdefs = {what}: expected (target graphdef, draft graphdef) from nnx.split")
    tdef = _check_graphdef("graphdefs[0]", graphdefs[0])
    if isinstance(draft, nnx.Module):
        return tdef, as_drafter(draft, _check_graphdef("graphdefs[1]", graphdefs[1]))[0]
    if graphdefs[1] is not draft:
        raise ValueError(f"graphdefs[1] = {graphdefs[1]!r}: expected the drafter itself, {draft!r} "
                         "(it is its own definition)")
    return tdef, as_drafter(draft)[0]


def _check_budget(max_new_tokens) -> int:
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens = {max_new_tokens!r}: expected an integer >= 1")
    return int(max_new_tokens)


def _check_prompt_length(prompt_length) -> None:
    if not is_int(prompt_length) or prompt_length < 1:
        raise ValueError(f"prompt_length = {prompt_length!r}: expected an integer >= 1")


def prepare_prompts(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts (``int32[B, T]`` or a list of token lists) validated against the vocabulary
    -> (int32[B, T] right-padded with 0, int32[B] lengths): what :func:`generate` compiles for."""
    if isinstance(prompts, (np.ndarray, jax.Array)):
        arr = np.asarray(prompts)
        if arr.ndim != 2:
            raise ValueError(
                f"prompts: expected int32[B, T] or a list of token lists, got an array of shape {arr.shape}"
            )
        if arr.dtype.kind not in "iu":
            raise ValueError(f"prompts: expected integer token ids, got dtype {arr.dtype}")
        if arr.shape[0] == 0 or arr.shape[1] == 0:
            raise ValueError(f"prompts: expected at least one row of at least one token, got shape {arr.shape}")
        bad = np.argwhere((arr < 0) | (arr >= vocab_size))
        if bad.size:
            i, t = (int(x) for x in bad[0])
            raise ValueError(f"prompts[{i}][{t}] = {int(arr[i, t])}: expected a token id in [0, {vocab_size})")
        return arr.astype(np.int32), np.full((arr.shape[0],), arr.shape[1], np.int32)
    elif isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
        if len(prompts) == 0:
            raise ValueError("prompts: expected at least one prompt, got an empty list")
        rows = []
        for i, row in enumerate(prompts):
            if is_int(row) or not isinstance(row, (Sequence, np.ndarray, jax.Array)):
                raise ValueError(
                    f"prompts[{i}] = {row!r}: expected a list of token ids (prompts is a list of prompts)"
                )
            r = np.asarray(row)
            if r.size == 0:
                raise ValueError(f"prompts[{i}]: empty prompt; expected at least one token")
            if r.ndim != 1 or r.dtype.kind not in "iu":
                raise ValueError(f"prompts[{i}]: expected a 1-D sequence of integer token ids, got {row!r}")
            rows.append(r)
    else:
        raise ValueError(f"prompts: expected int32[B, T] or a list of token lists, got {type(prompts).__name__}")
    for i, r in enumerate(rows):
        bad = np.flatnonzero((r < 0) | (r >= vocab_size))
        if bad.size:
            t = int(bad[0])
            raise ValueError(f"prompts[{i}][{t}] = {int(r[t])}: expected a token id in [0, {vocab_size})")
    lens = np.asarray([r.shape[0] for r in rows], np.int32)
    out = np.zeros((len(rows), int(lens.max())), np.int32)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out, lens


def _check_stop(stop_tokens, vocab_size: int) -> tuple[int, ...]:
    if not is_int(stop_tokens) and hasattr(stop_tokens, "__array__"):  # numpy / jax arrays
        arr = np.asarray(stop_tokens)
        if arr.ndim > 1:
            raise ValueError(f"stop_tokens: expected a token id or a 1-D sequence of them, got shape {arr.shape}")
        stop_tokens = arr.reshape(-1).tolist()  # numpy scalars -> Python numbers (checked below)
    if is_int(stop_tokens):
        stop_tokens = (stop_tokens,)
    if not isinstance(stop_tokens, Sequence) or isinstance(stop_tokens, str):  # arrays: lists above
        raise ValueError(f"stop_tokens = {stop_tokens!r}: expected a sequence of token ids")
    out = []
    for i, t in enumerate(list(stop_tokens)):
        if not is_int(t) or not 0 <= t < vocab_size:
            raise ValueError(f"stop_tokens[{i}] = {t!r}: expected a token id in [0, {vocab_size})")
        out.append(int(t))
    return tuple(sorted(set(out)))


def resolve_stop_tokens(stop_tokens, target: Transformer) -> tuple[int, ...]:
    """The stop tokens of a generation, validated, sorted and de-duplicated: ``None`` (the
    default of :func:`generate` and :func:`generate_autoregressive`) means the target's
    end-of-text ids, ``target.config.eos_token_ids`` (``()`` when its config has no
    ``eos_token_id``); anything else is taken as given, so ``()`` turns stopping off (rows
    then run to ``max_new_tokens``). ``jaxspec generate`` resolves its stop tokens here too."""
    if stop_tokens is None:
        stop_tokens = target.config.eos_token_ids
    return _check_stop(stop_tokens, target.config.vocab_size)


def _warp(prefix: str, temperature, top_k, top_p) -> tuple[Warp, float]:
    """Validated (static warp, temperature)."""
    try:
        sampling.validate_warp_args(temperature, top_k, top_p)
        if isinstance(temperature, jax.core.Tracer) or isinstance(top_p, jax.core.Tracer):
            raise ValueError("temperature/top_p: expected concrete Python numbers, got a traced value")
    except ValueError as e:
        raise ValueError(f"{prefix}{e}") from None
    top_k = None if top_k is None else int(top_k)
    top_p = None if top_p is None or float(top_p) == 1.0 else float(top_p)
    return Warp(top_k, top_p), float(temperature)


def position_limit(model) -> int | None:
    """The most positions of a model (``config.max_position_embeddings``) or a drafter
    (its optional ``max_positions``; ``None``: no limit)."""
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "max_position_embeddings", None), int):
        return config.max_position_embeddings
    return getattr(model, "max_positions", None)


def _check_positions(name: str, model, needed: int, what: str) -> None:
    limit = position_limit(model)
    if limit is not None and needed > limit:
        raise ValueError(
            f"{name}: {what} = {needed} exceeds max_position_embeddings = {limit}; "
            "shorten the prompt, max_new_tokens or the tree"
        )


# --------------------------------------------------------------------------- public API


def generate(
    key,
    target: Transformer,
    draft,
    prompts,
    *,
    max_new_tokens: int,
    tree=DEFAULT_TREE,
    scheme: str | None = None,
    rule="auto",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    draft_temperature: float | None = None,
    draft_top_k: int | None = None,
    draft_top_p: float | None = None,
    stop_tokens: Sequence[int] | None = None,
    on_round: Callable | None = None,
    parts: RoundParts | None = None,
    mesh: Mesh | None = None,
    rows: int | None = None,
    prompt_bucket: int | None = PROMPT_BUCKET,
) -> GenerateResult:
    """Lossless tree speculative sampling: the tokens have exactly the law of sampling from
    the warped target alone (greedy target decoding at ``temperature=0``).

    Args:
      key: ``jax.random.key``; row b uses ``fold_in(key, b)``.
      target: the :class:`~jaxspec.nn.model.Transformer` whose law is sampled.
      draft: a :class:`~jaxspec.nn.model.Transformer` with the target's vocabulary, a
        :class:`~jaxspec.nn.head.FeatureHead` trained on the target (drafts from the
        target's own features; static trees, one device), an
        :class:`~jaxspec.decode.ngram.NgramDraft` (prompt lookup: drafts copied from the
        row's own prompt and output; static trees, scheme ``"deterministic"``), or any
        drafter of the :class:`~jaxspec.Drafter` protocol (:mod:`jaxspec.decode.drafter`,
        ``docs/DRAFTERS.md``), the library's or the caller's own.
      prompts: ``int32[B, T]`` (every row T tokens) or a list of B token lists of any
        lengths >= 1.
      max_new_tokens: budget per row (>= 1).
      tree: an int k (chain of k), a per-level branching tuple such as ``(3, 2, 1)``, a
        parents sequence starting with -1, a :class:`~jaxspec.core.treespec.DynamicTree`, or a
        string for :func:`~jaxspec.core.treespec.parse_tree` (default :data:`DEFAULT_TREE`,
        the tree of ``jaxspec generate``).
      scheme: sibling scheme, ``"iid"``, ``"without_replacement"`` or ``"deterministic"``
        (dynamic trees and n-gram drafts: ``"deterministic"`` only). ``None`` (default):
        ``"deterministic"`` for those, ``"without_replacement"`` otherwise.
      rule: the verification rule: ``"auto"`` (default: ``"block"`` on a static chain,
        ``"token"`` on any other tree), ``"token"``, ``"block"`` (chains) or ``"traversal"``,
        or a function with the signature of :func:`jaxspec.core.acceptance.accept_core`
        (:mod:`jaxspec.core.rules` lists the combinations each rule is proved lossless
        on; the others are refused).
      temperature, top_k, top_p: the target law (temperature, then top-k, then top-p).
      draft_temperature, draft_top_k, draft_top_p: the draft's proposal law. ``None``
        inherits the target's value for the sampling schemes (``iid``,
        ``without_replacement``); for ``deterministic`` (static or dynamic trees, whose
        draft only *ranks* candidates) ``None`` means temperature 1 and no top-k/top-p.
        Either way ``q`` is the law actually sampled, so the output law is unchanged.
      stop_tokens: a row ends at its first stop token (included in the output). ``None``
        (default): the target's end-of-text token(s), ``target.config.eos_token_id``, if its
        config has one; ``()``: no stop token (every row runs to ``max_new_tokens``). See
        :func:`resolve_stop_tokens`.
      on_round: optional host function ``f(tokens int32[B, max_new_tokens], lengths
        int32[B])`` (numpy) called after every round, in order, for streaming output.
        The rounds then run one call each (:func:`compiled_stream`: the same rounds, and
        on CPU the tests find the same tokens) and the host calls ``f`` between them (so
        ``generate`` returns when the last round has run); no callback enters a compiled
        program, so any function reuses the compilation, and the programs can be stored
        in JAX's persistent compilation cache.
      parts: the replaceable steps of a round (:class:`~jaxspec.decode.round.RoundParts`:
        verification mask, acceptance rule, commit); ``None`` = the library's own. A
        replaced part is the caller's claim to check, e.g. with :func:`jaxspec.verify`
        (``parts=``).
      mesh: a :class:`jax.sharding.Mesh` with axes ``"data"`` and/or ``"model"``
        (:func:`jaxspec.make_mesh`): rows split over ``data`` (a batch is padded to a
        multiple of its size; the padding rows are dropped), both models' parameters and
        KV caches over ``model`` (:mod:`jaxspec.nn.sharding`). ``None``: one device. Row
        b's randomness is ``fold_in(key, b)`` on any mesh, so the tokens are those of one
        device, up to the last bits of a ``model`` split's sums.
      rows: decode at most this many prompts at a time (continuous batching): when a row
        ends (a stop token or its budget), it writes its prompt's result and takes the next
        prompt of the queue, which is prefilled into that row's cache slots, inside the one
        compiled loop. The result keeps the prompts' order. With a draft model or a
        feature head it is, prompt by prompt, the result of decoding all of them at once
        (prompt j's randomness is ``fold_in(key, j)`` either way); only the work is done
        with ``rows`` rows. An n-gram draft's rounds depend on the other rows (a round
        runs one target step when no active row has a match), so its tokens depend on the
        batch, its law does not. ``None`` (default): every prompt has its own row. Not
        with ``mesh`` or ``on_round``.
      prompt_bucket: prompts are padded to a multiple of this many tokens (default
        :data:`PROMPT_BUCKET`; less where the models' positions leave less room), so that
        prompts of nearby lengths share one compilation (:func:`bucket_config`); ``None``
        pads only to the longest prompt.

    Returns:
      :class:`GenerateResult` (device arrays; statistics are per row, or per prompt with
      ``rows``: then ``rounds`` and ``target_calls`` count the rounds of each prompt, and
      ``summary()["loop_rounds"]`` is the most rounds of one prompt, not the loop's
      iterations).
    """
    check_transformer("target", target)
    drafter, dstate = as_drafter(draft)
    key = sampling.check_key(key)
    stop = resolve_stop_tokens(stop_tokens, target)
    bucket = check_prompt_bucket(prompt_bucket)
    tokens, lens = prepare_prompts(prompts, target.config.vocab_size)
    # one traversal of each model's object graph gives both halves (each costs milliseconds)
    tdef, tstate = nnx.split(target)
    cfg, t_temp, d_temp = build_config(
        target, drafter, prompt_length=tokens.shape[1], max_new_tokens=max_new_tokens, tree=tree,
        scheme=scheme, rule=rule, temperature=temperature, top_k=top_k, top_p=top_p,
        draft_temperature=draft_temperature, draft_top_k=draft_top_k, draft_top_p=draft_top_p,
        parts=parts, mesh=mesh, rows=rows, graphdefs=(tdef, drafter),
    )
    if _check_on_round(on_round) is not None and cfg.rows is not None:
        raise ValueError("rows: on_round streams the rows of one batch; with continuous batching a row changes "
                         "prompts, so pass on_round=None (or rows=None)")
    cfg, tokens = bucket_config(cfg, tokens, (target, drafter), bucket)
    check_generate_memory(target.config, getattr(drafter, "config", None), rows=cfg.rows or tokens.shape[0],
                          width=tokens.shape[1], capacity=cfg.capacity, tree_rows=cfg.num_nodes + 1,
                          what="rows" if cfg.rows else "prompts")
    check_drafter_output(drafter, dstate, target, tree=cfg.tree, scheme=cfg.scheme, warp=cfg.draft_warp,
                         batch=cfg.rows or tokens.shape[0], width=tokens.shape[1], capacity=cfg.capacity,
                         budget=cfg.max_new_tokens)
    return run_compiled(cfg, tstate, dstate, key, tokens, lens, t_temp, d_temp, stop, on_round=on_round)


def run_compiled(cfg: SpecConfig, target_state, draft_state, key, tokens, lens, temperature,
                 draft_temperature, stop_tokens=(), on_round=None) -> GenerateResult:
    """Run the compiled function of ``cfg`` on validated inputs (no checks; tests and
    benchmarks use it to reuse a configuration, e.g. one with other :class:`RoundParts`).
    With ``cfg.mesh``, the inputs are first placed on it (:func:`_on_mesh`); with
    ``on_round``, the rounds run one call at a time (:func:`_streamed`)."""
    states = (target_state,) if draft_state is None else (target_state, draft_state)
    defs = (cfg.target_def,) if draft_state is None else (cfg.target_def, cfg.draft_def)
    scalars = (jnp.float32(temperature), jnp.float32(draft_temperature), stop_array(stop_tokens))
    if on_round is not None:
        call = functools.partial(_streamed, cfg, on_round, np.shape(tokens)[0])
        return _on_mesh(cfg, defs, states, key, tokens, lens, scalars,
                        lambda st, *rest: call((st[0], st[1] if len(st) > 1 else None), *rest))
    return _on_mesh(cfg, defs, states, key, tokens, lens, scalars, lambda st, *rest: compiled(cfg)(
        st[0], st[1] if len(st) > 1 else None, *rest))


def _on_mesh(cfg, defs, states, key, tokens, lens, scalars, call) -> GenerateResult:
    """``call(states, key, tokens, lens, *scalars)``; with ``cfg.mesh``: rows padded (with
    copies of the last row) to a multiple of the data axis and split over it, parameters
    split over the model axis (:func:`jaxspec.nn.sharding.shard_state`), the rest
    replicated; the padding rows are dropped from the result, whose arrays are whole on
    every process. Row b's randomness is ``fold_in(key, b)`` on any mesh."""
    tokens = np.asarray(tokens, np.int32)
    lens = np.asarray(lens, np.int32)
    mesh = cfg.mesh
    if mesh is None:
        return call(states, key, jnp.asarray(tokens), jnp.asarray(lens), *scalars)
    b = tokens.shape[0]
    pad = sharding.padded_rows(b, mesh) - b
    if pad:
        tokens = np.concatenate([tokens, np.repeat(tokens[-1:], pad, axis=0)])
        lens = np.concatenate([lens, np.repeat(lens[-1:], pad)])
    rep = sharding.replicated(mesh)
    states = (sharding.shard_state(states[0], nnx.merge(defs[0], states[0]).config, mesh),
              *(sharding.shard_params(s, getattr(d, "config", None), mesh) for d, s in zip(defs[1:], states[1:])))
    out = call(
        states, sharding.put(key, rep), sharding.put(tokens, sharding.row_sharding(mesh, 2)),
        sharding.put(lens, sharding.row_sharding(mesh, 1)), *(sharding.put(x, rep) for x in scalars),
    )
    out = sharding.gather(out)
    return jax.tree.map(lambda x: x[:b], out) if pad else out


def stop_array(stop_tokens):
    """int32[n'] stop tokens padded with -1 (never a token) to a power of two >= 1, so that
    "no stop token" and "one stop token" share a compilation."""
    stop = np.asarray(stop_tokens, np.int32).reshape(-1)
    size = 1 if stop.size <= 1 else 1 << (stop.size - 1).bit_length()
    return jnp.asarray(np.concatenate([stop, np.full(size - stop.size, -1, np.int32)]))


def check_prompt_bucket(prompt_bucket) -> int | None:
    """``prompt_bucket`` validated: ``None`` or an integer >= 1 (``ValueError`` naming it)."""
    if prompt_bucket is not None and (not is_int(prompt_bucket) or prompt_bucket < 1):
        raise ValueError(f"prompt_bucket = {prompt_bucket!r}: expected an integer >= 1 or None")
    return None if prompt_bucket is None else int(prompt_bucket)


def bucket_width(width: int, bucket: int | None, room: int) -> int:
    """The padded prompt width a generation compiles for: ``width`` rounded up to a
    multiple of ``bucket``, but at most ``room`` columns more (what the models' positions
    leave), and ``width`` itself for ``bucket=None``::

        bucket_width(5, 32, 1000)    # 32
        bucket_width(33, 32, 1000)   # 64
        bucket_width(33, 32, 10)     # 43: 64 would pass max_position_embeddings
    """
    if bucket is None:
        return width
    return min(-(-width // bucket) * bucket, width + max(room, 0))


def bucket_config(cfg, tokens: np.ndarray, models, prompt_bucket: int | None):
    """``(cfg, tokens)`` for prompts ``tokens int32[B, P]`` right-padded with 0 to
    :func:`bucket_width` columns and ``cfg`` (a :class:`SpecConfig` or :class:`ARConfig`
    built for width ``P``) with its cache capacity grown by the same amount, within every
    model of ``models``' ``max_position_embeddings``. Prompts of lengths in one bucket then
    share one compiled program: without it, every new prompt length compiles anew (and a
    process that meets many of them keeps one program per length). The padding columns
    are past every row's length, as in a ragged batch, so the law of the tokens is the
    same, and the tokens too up to the last bits of the longer attention sums."""
    width = tokens.shape[1]
    limits = [x for x in map(position_limit, models) if x is not None]
    room = (min(limits) if limits else 2**31 - 1) - cfg.capacity
    padded = bucket_width(width, prompt_bucket, room)
    if padded == width:
        return cfg, tokens
    tokens = np.pad(tokens, ((0, 0), (0, padded - width)))
    return dataclasses.replace(cfg, capacity=cfg.capacity + padded - width), tokens


def generate_autoregressive(
    key,
    target: Transformer,
    prompts,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] | None = None,
    on_round: Callable | None = None,
    mesh: Mesh | None = None,
    prompt_bucket: int | None = PROMPT_BUCKET,
) -> GenerateResult:
    """Target-only sampling (the baseline), same model code and output format as
    :func:`generate`: prefill, then one token per step in a ``lax.while_loop``, each drawn
    with ``sample_categorical`` from the warped target law (row b: ``fold_in(key, b)``,
    step t: ``fold_in(row_key, t)``). ``temperature=0`` is greedy decoding. ``stop_tokens``
    as in :func:`generate` (default: the target's ``eos_token_id``; ``()``: none);
    ``on_round`` as in :func:`generate` (called after every token); ``mesh`` and
    ``prompt_bucket`` as in :func:`generate`."""
    check_transformer("target", target)
    key = sampling.check_key(key)
    stop = resolve_stop_tokens(stop_tokens, target)
    bucket = check_prompt_bucket(prompt_bucket)
    tokens, lens = prepare_prompts(prompts, target.config.vocab_size)
    tdef, tstate = nnx.split(target)
    cfg, temp = build_ar_config(
        target, prompt_length=tokens.shape[1], max_new_tokens=max_new_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, mesh=mesh, graphdef=tdef,
    )
    cfg, tokens = bucket_config(cfg, tokens, (target,), bucket)
    check_generate_memory(target.config, None, rows=tokens.shape[0], width=tokens.shape[1], capacity=cfg.capacity,
                          tree_rows=1)
    return run_compiled_autoregressive(cfg, tstate, key, tokens, lens, temp, stop, on_round=_check_on_round(on_round))


def run_compiled_autoregressive(cfg: ARConfig, target_state, key, tokens, lens, temperature,
                                stop_tokens=(), on_round=None) -> GenerateResult:
    """:func:`run_compiled` for a target-only configuration (:func:`build_ar_config`)."""
    call = (lambda st, *rest: compiled(cfg)(st[0], *rest)) if on_round is None else \
        functools.partial(_streamed, cfg, on_round, np.shape(tokens)[0])
    return _on_mesh(cfg, (cfg.target_def,), (target_state,), key, tokens, lens,
                    (jnp.float32(temperature), stop_array(stop_tokens)), call)


# --------------------------------------------------------------------------- configuration


def build_config(
    target: Transformer,
    draft,
    *,
    prompt_length: int,
    max_new_tokens: int,
    tree,
    scheme: str | None = None,
    rule="auto",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    draft_temperature: float | None = None,
    draft_top_k: int | None = None,
    draft_top_p: float | None = None,
    parts: RoundParts | None = None,
    mesh: Mesh | None = None,
    rows: int | None = None,
    graphdefs: tuple | None = None,
) -> tuple[SpecConfig, float, float]:
    """The static configuration :func:`generate` compiles for prompts padded to
    ``prompt_length`` tokens, with its arguments validated (``ValueError`` naming the
    argument). The one place where generation settings become a :class:`SpecConfig`:
    :func:`generate` and the exactness harness (:func:`jaxspec.exactness.verify`) both
    call it (``generate`` then pads it to its prompt bucket with :func:`bucket_config`, as
    ``verify(prompt_bucket=...)`` does), so the harness tests what ``generate`` runs.

    Arguments as in :func:`generate`; ``graphdefs``: ``(target graphdef, draft graphdef)``
    when the caller already split the models (``nnx.split``; an n-gram draft is its own
    definition), else they are computed here. Returns ``(config, temperature, draft_temperature)``:
    the temperatures (the draft's resolved by :func:`jaxspec.core.sampling.draft_warp_args`) are
    traced arguments of the compiled function, not part of the configuration, so that new
    temperatures do not recompile. Equal arguments give equal (hashable) configurations::

        cfg, t, dt = build_config(target, draft, prompt_length=3, max_new_tokens=8, tree=3)
        cfg.capacity      # 15 cache slots: 3 prompt + 8 new + 3 tree nodes + 1
        cfg == build_config(target, draft, prompt_length=3, max_new_tokens=8, tree="chain:3")[0]
    """
    check_transformer("target", target)
    _check_prompt_length(prompt_length)
    v = target.config.vocab_size
    m = _check_budget(max_new_tokens)
    spec = resolve_tree(tree)
    if graphdefs is None:
        tdef, drafter = nnx.graphdef(target), as_drafter(draft, _definition(draft))[0]
    else:
        tdef, drafter = _check_graphdefs(graphdefs, draft)
    mesh = _check_mesh(mesh, target)
    given = tuple((name, value) for name, value in (("draft_temperature", draft_temperature),
                                                    ("draft_top_k", draft_top_k), ("draft_top_p", draft_top_p))
                  if value is not None)
    scheme = drafter.check(target, DraftRequest(spec, scheme, mesh, given))  # the drafter's own refusals
    sampling.check_scheme(scheme)
    if isinstance(spec, DynamicTree):
        if spec.topk > v:
            raise ValueError(f"tree: DynamicTree.topk = {spec.topk} exceeds vocab_size = {v}")
    elif scheme != "iid" and spec.max_siblings > v:
        raise ValueError(
            f"tree: a node has {spec.max_siblings} children, more than vocab_size = {v} distinct "
            f"tokens; scheme={scheme!r} needs distinct siblings (use scheme='iid' or a narrower tree)"
        )
    target_warp, t_temp = _warp("", temperature, top_k, top_p)
    draft_warp, d_temp = _warp(
        "draft_",
        *sampling.draft_warp_args(
            scheme, temperature, top_k, top_p, draft_temperature, draft_top_k, draft_top_p
        ),
    )
    capacity = int(prompt_length) + m + spec.cache_slots + 1
    for name, model in (("target", target), ("draft", drafter)):
        _check_positions(
            name, model, capacity, "prompt length + max_new_tokens + tree size + 1 (cache capacity)"
        )
    rows = _check_rows(rows, mesh)
    parts = _with_rule(_check_parts(parts), rule, scheme, spec)
    if not is_library_code(parts.accept):  # a caller's rule: its output checked once, before any loop
        name = "rule" if parts.accept is rule else "parts.accept"
        check_rule_output(parts.accept, scheme, spec.num_nodes, v, name)
    cfg = SpecConfig(tdef, drafter, spec, scheme, target_warp, draft_warp, m, capacity, parts=parts, mesh=mesh,
                     rows=rows)
    return cfg, t_temp, d_temp


def build_ar_config(
    target: Transformer,
    *,
    prompt_length: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    mesh: Mesh | None = None,
    graphdef=None,
) -> tuple[ARConfig, float]:
    """The static configuration :func:`generate_autoregressive` compiles for prompts padded
    to ``prompt_length`` tokens, with its arguments validated; ``(config, temperature)``
    (see :func:`build_config`; ``graphdef``: the target's, when the caller has it)."""
    check_transformer("target", target)
    _check_prompt_length(prompt_length)
    m = _check_budget(max_new_tokens)
    warp, temp = _warp("", temperature, top_k, top_p)
    capacity = int(prompt_length) + m
    _check_positions("target", target, capacity, "prompt length + max_new_tokens (cache capacity)")
    tdef = nnx.graphdef(target) if graphdef is None else _check_graphdef("graphdef", graphdef)
    return ARConfig(tdef, warp, m, capacity, mesh=_check_mesh(mesh, target)), temp
