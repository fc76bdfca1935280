"""What a round and a target step cost on this device: real jitted pieces of
:func:`jaxspec.generate`, timed as ``fori_loop`` s of ``loops`` steps (median of ``repeats``,
after a warm-up call that compiles). :func:`jaxspec.auto_tree` builds its table from these."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.checks import is_int
from jaxspec.core import rules
from jaxspec.core.sampling import check_scheme
from jaxspec.core.settings import Sampling, check_draft_sampling, check_sampling, draft_law
from jaxspec.core.treespec import StaticTree
from jaxspec.decode.draft import ModelDraft
from jaxspec.decode.round import (
    RoundConfig,
    RoundInputs,
    RoundState,
    autoregressive_step,
    speculative_round,
    start_emitted,
)
from jaxspec.nn.cache import init_cache
from jaxspec.nn.masks import tree_cache_mask
from jaxspec.nn.model import Transformer, check_transformer

__all__ = ["RoundCost", "check_positive", "median_seconds", "measure_target_step", "measure_round_cost"]


@dataclasses.dataclass(frozen=True)
class RoundCost:
    """Measured seconds of one speculative round (batch rows together) of one tree.

    verify_s: the target's tree-verification forward of ``N + 1`` tokens alone.
    round_s:  a whole round: draft proposal, verification, warps, acceptance, commits.
    """

    verify_s: float
    round_s: float



def check_positive(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int, or ``ValueError`` naming ``name`` unless an integer >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def median_seconds(fn: Callable[[int], jax.Array], loops: int, repeats: int) -> float:
    """Median over ``repeats`` of the wall time of ``fn(i)`` (a jitted loop of ``loops``
    steps) divided by ``loops``, after one warm-up call that compiles."""
    jax.block_until_ready(fn(0))
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(i + 1))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / loops


def _full_cache(model: Transformer, batch: int, capacity: int, length: int):
    cache = init_cache(model.config, batch, capacity)
    return cache.replace(lengths=jnp.full((batch,), length, jnp.int32))


def measure_target_step(
    target: Transformer, *, sampling: Sampling | None = None,
    batch_size: int = 1, context_len: int = 256, loops: int = 8, repeats: int = 5,
) -> float:
    """Seconds of one target-only decode step at ``batch_size`` rows: the forward of one
    token against a KV cache of ``context_len`` slots, the warp and the draw, as in
    :func:`jaxspec.generate_autoregressive` (jitted ``fori_loop`` of ``loops`` steps,
    median of ``repeats``)."""
    check_transformer("target", target)
    law = check_sampling("sampling", sampling, Sampling())
    b = check_positive("batch_size", batch_size)
    cap = check_positive("context_len", context_len, 2)
    loops, repeats = check_positive("loops", loops), check_positive("repeats", repeats)
    warp = law.warp
    gdef, state = nnx.split(target)
    length = cap - 1  # the cache as full as it gets; attention runs over all slots anyway

    no_stop = jnp.full((1,), -1, jnp.int32)

    @jax.jit
    def run(state, key, temp):
        model = nnx.merge(gdef, state)
        cache0 = _full_cache(model, b, cap, length)
        row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b, dtype=jnp.int32))

        def body(i, carry):
            tok, emitted, total = carry  # int32[B]
            keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(row_keys)
            tok, cache, emitted = autoregressive_step(model, warp, cache0, tok, emitted, keys, temp, no_stop)
            return tok, emitted, total + tok.sum()  # cache dropped: every step sees the same fill

        init = (jnp.zeros((b,), jnp.int32), start_emitted(b, loops + 1), jnp.int32(0))
        return jax.lax.fori_loop(0, loops, body, init)[2]

    return median_seconds(lambda i: run(state, jax.random.key(i), jnp.float32(law.temperature)),
                           loops, repeats)


def measure_round_cost(
    target: Transformer, draft: Transformer, tree, *, scheme: str, rule=rules.AUTO,
    sampling: Sampling | None = None, draft_sampling: Sampling | None = None,
    batch_size: int = 1, context_len: int = 256, loops: int = 8, repeats: int = 5,
) -> RoundCost:
    """Seconds of one speculative round with a static ``tree`` on this device.

    ``round_s``: a jitted ``fori_loop`` of ``loops`` rounds built from the pieces
    :func:`jaxspec.generate` runs (``propose_static``: one draft forward per depth level
    and the sibling draws; the target's forward over ``[root] + N`` nodes under the tree
    mask against a cache of ``context_len`` slots; warps; the acceptance step of ``rule``
    as :func:`jaxspec.generate` resolves it for ``tree`` (``"auto"``: block verification on
    a chain, the token rule otherwise; :func:`jaxspec.core.rules.check_rule`), vmapped over
    rows; both cache commits), divided by ``loops``, median of ``repeats``. The caches
    keep the same length every round, so every round costs the same. ``verify_s``: the
    target forward alone, timed the same way.
    """
    check_transformer("target", target)
    check_transformer("draft", draft)
    check_scheme(scheme)
    tree = StaticTree.from_parents(tree) if not isinstance(tree, StaticTree) else tree
    n = tree.num_nodes
    b = check_positive("batch_size", batch_size)
    cap = check_positive("context_len", context_len, 2)
    if cap < n + 3:
        raise ValueError(
            f"context_len: {cap} cache slots cannot hold a round of {n} nodes; expected >= {n + 3}"
        )
    loops, repeats = check_positive("loops", loops), check_positive("repeats", repeats)
    law = check_sampling("sampling", sampling, Sampling())
    dlaw = draft_law(scheme, law, check_draft_sampling(draft_sampling))
    tdef, tstate = nnx.split(target)
    drafter, dstate = ModelDraft.of(draft)
    # the acceptance step generate's build_config resolves for this rule and tree
    round_cfg = RoundConfig(tree, scheme, law.warp, dlaw.warp, drafter, rules.check_rule(rule, scheme, tree))
    t_warp = round_cfg.target_warp
    length = cap - n - 2  # root + N nodes written at slots length .. length + N
    full_mask = tree.full_mask  # [N + 1, N + 1]
    depth_full = full_mask.sum(axis=1) - 1  # [N + 1], root 0
    no_stop = jnp.full((1,), -1, jnp.int32)

    @jax.jit
    def run_round(tstate, dstate, key, temp, dtemp):
        tm, dm = nnx.merge(tdef, tstate), nnx.merge(drafter.definition, dstate)
        tcache0, dcache0 = _full_cache(tm, b, cap, length), _full_cache(dm, b, cap, length)
        zeros = jnp.zeros((b,), jnp.int32)
        # room for every token of every round: no row ends, so every round does all its work
        st0 = RoundState(zeros, zeros, tcache0, dcache0, start_emitted(b, loops * (n + 1) + 1))
        row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b, dtype=jnp.int32))

        def body(i, carry):
            st, total = carry
            keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(row_keys)
            st, res = speculative_round(round_cfg, RoundInputs(tm, dstate, st, keys, temp, dtemp, no_stop))
            # back to the same fill: every timed round attends over the same cache
            st = st._replace(tcache=st.tcache.replace(lengths=tcache0.lengths),
                             dstate=st.dstate.replace(lengths=dcache0.lengths))
            return st, total + res.num_tokens.sum()

        return jax.lax.fori_loop(0, loops, body, (st0, jnp.int32(0)))[1]

    @jax.jit
    def run_verify(tstate, temp):
        tm = nnx.merge(tdef, tstate)
        cache0 = _full_cache(tm, b, cap, length)
        seq0 = jnp.zeros((b, n + 1), jnp.int32)
        mask = tree_cache_mask(cache0.lengths, full_mask, cap)  # [B, N + 1, S]
        pos = cache0.lengths[:, None] + jnp.asarray(depth_full, jnp.int32)[None, :]

        def body(i, carry):
            seq, total = carry
            logits, _ = tm(seq, pos, cache0, mask)  # [B, N + 1, V]
            probs = t_warp(logits, temp)
            return seq + (i % 2), total + probs[:, -1, 0].sum()

        return jax.lax.fori_loop(0, loops, body, (seq0, jnp.float32(0)))[1]

    t, d = jnp.float32(law.temperature), jnp.float32(dlaw.temperature)
    round_s = median_seconds(lambda i: run_round(tstate, dstate, jax.random.key(i), t, d), loops, repeats)
    verify_s = median_seconds(lambda i: run_verify(tstate, t), loops, repeats)
    return RoundCost(verify_s=verify_s, round_s=round_s)


