"""Speculative generation (one jit-compiled ``lax.while_loop`` over rounds) and the
target-only baseline on the same model code.

::

    out = jaxspec.generate(key, target, draft, [[3, 1, 4], [1, 5]], max_new_tokens=32,
                           tree=(3, 2, 1), scheme="without_replacement",
                           sampling=jaxspec.Sampling(temperature=0.8))
    out.tokens    # int32[B, 32], -1 after each row's end
    out.lengths   # int32[B]
    out.tau       # float32[B] tokens per target call
    out.summary() # {"num_tokens": ..., "tokens_per_target_call": ..., ...}: the names of ``jaxspec generate --json``

One round is :func:`jaxspec.decode.round.speculative_round` (propose, verify, accept,
commit, emit). This module is the entry point: it validates the arguments
(:mod:`jaxspec.decode.inputs`), builds the static configuration
(:mod:`jaxspec.decode.config`), and runs the compiled loop (:mod:`jaxspec.decode.loops`,
jitted and kept by :mod:`jaxspec.decode.programs`), whole or a round at a time for
streaming. Every public name of those modules that callers used from here is still here.

Rows end independently: at the first stop token (kept; by default the target's
``config.eos_token_id``, see :func:`resolve_stop_tokens`) or when ``max_new_tokens`` are
emitted; tokens of a round past either end are dropped; a finished row emits nothing
more (its compute continues, masked: shapes are static). Randomness: row b uses
``fold_in(key, b)``, round r ``fold_in(row_key, r)``, split into a draft key (one
``fold_in`` per tree row) and an acceptance key: a batch of B identical prompts is B
independent samples.

Compilation: one ``jax.jit`` per static configuration (:class:`SpecConfig` /
:class:`ARConfig`: model graphdefs, tree, scheme, the warps, budget, cache capacity),
kept in a module-level cache. Models travel as ``nnx.split`` state arguments; keys,
prompts, temperatures and stop tokens are traced arguments: new keys, prompts of the same
shape, other temperatures, other stop tokens (same count) or new weights of the same
architecture do not retrace. The warps (top-k, top-p, min-p) are part of the configuration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxspec.core.sampling import SCHEMES as SAMPLING_SCHEMES
from jaxspec.core.sampling import check_key
from jaxspec.core.settings import Sampling
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.decode.config import ARConfig, SpecConfig, build_ar_config, build_config, cache_capacity
from jaxspec.decode.defaults import DEFAULT_SCHEME, DEFAULT_TREE
from jaxspec.decode.inputs import (
    PROMPT_BUCKET,
    bucket_width,
    check_prompt_bucket,
    pad_prompts,
    prepare_prompts,
    resolve_stop_tokens,
    stop_array,
)
from jaxspec.decode.loops import autoregressive_program, speculative_program, start_program
from jaxspec.decode.memory import check_generate_memory
from jaxspec.decode.output_checks import check_drafter_output
from jaxspec.decode.programs import StreamPrograms, compiled, compiled_stream, store_text
from jaxspec.decode.result import SUMMARY_KEYS, GenerateResult
from jaxspec.decode.round import RoundParts
from jaxspec.nn import sharding
from jaxspec.nn.model import Transformer, check_transformer

__all__ = [
    "DEFAULT_TREE",
    "DEFAULT_SCHEME",
    "GenerateResult",
    "SUMMARY_KEYS",
    "resolve_stop_tokens",
    "SpecConfig",
    "ARConfig",
    "build_config",
    "build_ar_config",
    "generate",
    "generate_autoregressive",
    "prepare",
    "prepare_autoregressive",
    "Prepared",
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
    "pad_prompts",
    "cache_capacity",
    "stop_array",
    "store_text",
    "streamed",
]

SCHEMES = SAMPLING_SCHEMES


def streamed(cfg, on_round, b: int, states, key, tokens, lens, *scalars) -> GenerateResult:
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


def generate(
    key,
    target: Transformer,
    draft,
    prompts,
    *,
    max_new_tokens: int,
    tree=None,
    scheme: str | None = None,
    rule="auto",
    sampling: Sampling | None = None,
    draft_sampling: Sampling | None = None,
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
        ``docs/DRAFTERS.md``), the library's or the caller's own, alone or, with arrays of
        its own, as the pair ``(drafter, params)``.
      prompts: ``int32[B, T]`` (every row T tokens) or a list of B token lists of any
        lengths >= 1.
      max_new_tokens: budget per row (>= 1).
      tree: an int k (chain of k), a per-level branching tuple such as ``(3, 2, 1)``, a
        parents sequence starting with -1, a :class:`~jaxspec.core.treespec.DynamicTree`, or a
        string for :func:`~jaxspec.core.treespec.parse_tree`. ``None`` (default): the
        drafter's own ``tree`` (a feature head's ``preferred_tree``, e.g. ``"chain:1"`` for
        ``smollm2-135m-head``), else :data:`DEFAULT_TREE`.
      scheme: sibling scheme, ``"iid"``, ``"without_replacement"`` or ``"deterministic"``
        (dynamic trees and n-gram drafts: ``"deterministic"`` only). ``None`` (default):
        ``"deterministic"`` for those, ``"without_replacement"`` otherwise.
      rule: the verification rule: ``"auto"`` (default: ``"block"`` on a static chain,
        ``"token"`` on any other tree), ``"token"``, ``"block"`` (chains) or ``"traversal"``,
        or a function with the signature of :func:`jaxspec.core.acceptance.accept_core`
        (:mod:`jaxspec.core.rules` lists the combinations each rule is proved lossless
        on; the others are refused).
      sampling: the target law, a :class:`jaxspec.Sampling` (temperature, then top-k,
        top-p and min-p); ``None``: ``Sampling()``, the model's own law at temperature 1.
      draft_sampling: the draft's proposal law, a :class:`jaxspec.Sampling`. ``None``: the
        target's law for the sampling schemes (``iid``, ``without_replacement``); for
        ``deterministic`` (static or dynamic trees, whose draft only *ranks* candidates)
        ``Sampling()``. Either way ``q`` is the law actually sampled, so the output law is
        unchanged (:func:`jaxspec.core.settings.draft_law`). A dict of some of the fields
        (``{"temperature": 0.5}``) sets those over that default.
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
      parts: the replaceable steps of a round besides its rule
        (:class:`~jaxspec.decode.round.RoundParts`: verification mask, commit, key split,
        draft draws); ``None`` = the library's own. A
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
        prompts of nearby lengths share one compilation (:func:`~jaxspec.decode.config.build_config`
        computes the width with the cache capacity); ``None``
        pads only to the longest prompt.

    Returns:
      :class:`GenerateResult` (device arrays; statistics are per row, or per prompt with
      ``rows``: then ``rounds`` and ``target_calls`` count the rounds of each prompt, and
      ``summary()["loop_rounds"]`` is the most rounds of one prompt, not the loop's
      iterations).
    """
    prepared = prepare(target, draft, prompts, max_new_tokens=max_new_tokens, tree=tree, scheme=scheme, rule=rule,
                       sampling=sampling, draft_sampling=draft_sampling, stop_tokens=stop_tokens, on_round=on_round,
                       parts=parts, mesh=mesh, rows=rows, prompt_bucket=prompt_bucket)
    return prepared.run(key)


class Prepared(NamedTuple):
    """A generation validated and configured, ready to run (:func:`prepare`,
    :func:`prepare_autoregressive`): its static ``config`` (a :class:`SpecConfig` or an
    :class:`ARConfig`) and its inputs. ``run(key)`` decodes; a new key neither checks nor
    builds anything again, so a caller that times or repeats one generation (``jaxspec
    generate --compare``) prepares it once."""

    config: SpecConfig | ARConfig
    states: tuple  # (target state,) or (target state, drafter params)
    tokens: np.ndarray  # int32[B, prompt_width]
    lens: np.ndarray  # int32[B]
    temperatures: tuple  # (temperature,) or (temperature, draft temperature)
    stop_tokens: tuple
    on_round: Callable | None

    def run(self, key) -> GenerateResult:
        """The generation with ``key`` (``jax.random.key``; row b uses ``fold_in(key, b)``)."""
        key = check_key(key)
        if isinstance(self.config, SpecConfig):
            return run_compiled(self.config, *self.states, key, self.tokens, self.lens, *self.temperatures,
                                self.stop_tokens, on_round=self.on_round)
        return run_compiled_autoregressive(self.config, *self.states, key, self.tokens, self.lens,
                                           *self.temperatures, self.stop_tokens, on_round=self.on_round)


def prepare(target: Transformer, draft, prompts, *, max_new_tokens: int, tree=None, scheme: str | None = None,
            rule="auto", sampling: Sampling | None = None, draft_sampling: Sampling | None = None,
            stop_tokens: Sequence[int] | None = None, on_round: Callable | None = None,
            parts: RoundParts | None = None, mesh: Mesh | None = None, rows: int | None = None,
            prompt_bucket: int | None = PROMPT_BUCKET) -> Prepared:
    """Everything :func:`generate` does before it decodes, once: the arguments (as
    :func:`generate`'s) checked, ``draft`` turned into a drafter
    (:func:`~jaxspec.decode.as_drafter.as_drafter`), the configuration built
    (:func:`~jaxspec.decode.config.build_config`), the prompts padded to its width, the
    memory and a caller's drafter checked. ``generate(key, ...)`` is
    ``prepare(...).run(key)``; ``prepare(...).config.scheme`` is the scheme the drafter
    serves."""
    check_transformer("target", target)
    drafter, dstate = as_drafter(draft)  # once, here: the configuration takes the drafter
    stop = resolve_stop_tokens(stop_tokens, target)
    tokens, lens = prepare_prompts(prompts, target.config.vocab_size)
    # one traversal of the target's object graph gives both halves (each costs milliseconds)
    tdef, tstate = nnx.split(target)
    cfg, t_temp, d_temp = build_config(
        target, drafter, prompt_length=tokens.shape[1], max_new_tokens=max_new_tokens, tree=tree,
        scheme=scheme, rule=rule, sampling=sampling, draft_sampling=draft_sampling, parts=parts, mesh=mesh,
        rows=rows, on_round=on_round, prompt_bucket=prompt_bucket, target_def=tdef,
    )
    tokens = pad_prompts(tokens, cfg.prompt_width)
    check_generate_memory(target.config, getattr(drafter, "config", None), rows=cfg.rows or tokens.shape[0],
                          width=tokens.shape[1], capacity=cfg.capacity, tree_rows=cfg.num_nodes + 1,
                          what="rows" if cfg.rows else "prompts", prompts=tokens.shape[0],
                          prompt_length=int(np.max(lens)))
    check_drafter_output(drafter, dstate, target, tree=cfg.tree, scheme=cfg.scheme, warp=cfg.draft_warp,
                         batch=cfg.rows or tokens.shape[0], width=tokens.shape[1], capacity=cfg.capacity,
                         budget=cfg.max_new_tokens)
    return Prepared(cfg, (tstate, dstate), tokens, lens, (t_temp, d_temp), stop, on_round)


def run_compiled(cfg: SpecConfig, target_state, draft_state, key, tokens, lens, temperature,
                 draft_temperature, stop_tokens=(), on_round=None) -> GenerateResult:
    """Run the compiled function of ``cfg`` on validated inputs (no checks; tests and
    benchmarks use it to reuse a configuration, e.g. one with other :class:`RoundParts`).
    With ``cfg.mesh``, the inputs are first placed on it (:func:`_on_mesh`); with
    ``on_round``, the rounds run one call at a time (:func:`streamed`)."""
    states = (target_state,) if draft_state is None else (target_state, draft_state)
    defs = (cfg.target_def,) if draft_state is None else (cfg.target_def, cfg.draft_def)
    scalars = (jnp.float32(temperature), jnp.float32(draft_temperature), stop_array(stop_tokens))
    if on_round is not None:
        call = functools.partial(streamed, cfg, on_round, np.shape(tokens)[0])
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


def generate_autoregressive(
    key,
    target: Transformer,
    prompts,
    *,
    max_new_tokens: int,
    sampling: Sampling | None = None,
    stop_tokens: Sequence[int] | None = None,
    on_round: Callable | None = None,
    mesh: Mesh | None = None,
    prompt_bucket: int | None = PROMPT_BUCKET,
) -> GenerateResult:
    """Target-only sampling (the baseline), same model code and output format as
    :func:`generate`: prefill, then one token per step in a ``lax.while_loop``, each drawn
    with ``sample_categorical`` from the warped target law (row b: ``fold_in(key, b)``,
    step t: ``fold_in(row_key, t)``). ``sampling``: the target law, a :class:`jaxspec.Sampling`
    (``None``: ``Sampling()``; ``Sampling(temperature=0)`` is greedy decoding). ``stop_tokens``
    as in :func:`generate` (default: the target's ``eos_token_id``; ``()``: none);
    ``on_round`` as in :func:`generate` (called after every token); ``mesh`` and
    ``prompt_bucket`` as in :func:`generate`."""
    return prepare_autoregressive(target, prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                  stop_tokens=stop_tokens, on_round=on_round, mesh=mesh,
                                  prompt_bucket=prompt_bucket).run(key)


def prepare_autoregressive(target: Transformer, prompts, *, max_new_tokens: int, sampling: Sampling | None = None,
                           stop_tokens: Sequence[int] | None = None, on_round: Callable | None = None,
                           mesh: Mesh | None = None, prompt_bucket: int | None = PROMPT_BUCKET) -> Prepared:
    """:func:`prepare` for :func:`generate_autoregressive` (arguments as its)."""
    check_transformer("target", target)
    stop = resolve_stop_tokens(stop_tokens, target)
    if on_round is not None and not callable(on_round):
        raise ValueError(f"on_round = {on_round!r}: expected None or a function f(tokens, lengths) called once per "
                         "round")
    tokens, lens = prepare_prompts(prompts, target.config.vocab_size)
    tdef, tstate = nnx.split(target)
    cfg, temp = build_ar_config(
        target, prompt_length=tokens.shape[1], max_new_tokens=max_new_tokens, sampling=sampling, mesh=mesh,
        prompt_bucket=prompt_bucket, graphdef=tdef,
    )
    tokens = pad_prompts(tokens, cfg.prompt_width)
    check_generate_memory(target.config, None, rows=tokens.shape[0], width=tokens.shape[1], capacity=cfg.capacity,
                          tree_rows=1, prompt_length=int(np.max(lens)))
    return Prepared(cfg, (tstate,), tokens, lens, (temp,), stop, on_round)


def run_compiled_autoregressive(cfg: ARConfig, target_state, key, tokens, lens, temperature,
                                stop_tokens=(), on_round=None) -> GenerateResult:
    """:func:`run_compiled` for a target-only configuration (:func:`build_ar_config`)."""
    call = (lambda st, *rest: compiled(cfg)(st[0], *rest)) if on_round is None else \
        functools.partial(streamed, cfg, on_round, np.shape(tokens)[0])
    return _on_mesh(cfg, (cfg.target_def,), (target_state,), key, tokens, lens,
                    (jnp.float32(temperature), stop_array(stop_tokens)), call)
