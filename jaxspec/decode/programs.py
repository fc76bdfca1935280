"""The jitted programs of a configuration, kept per configuration (and, with the program
store in use, across processes): the whole loop (:func:`compiled`), or the loop cut at its
rounds for streaming (:func:`compiled_stream`, run by :func:`jaxspec.decode.generate.streamed`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.decode.config import SpecConfig, ARConfig
from jaxspec.decode.loops import (
    ar_body,
    ar_init,
    ar_result,
    autoregressive_program,
    merged,
    row_keys,
    spec_body,
    spec_init,
    spec_result,
    speculative_program,
)
from jaxspec.decode.program_store import StoredFunction, library_function_name, static_text
from jaxspec.decode.round import Emitted

__all__ = ["store_text", "compiled", "StreamPrograms", "compiled_stream"]


def store_text(cfg: SpecConfig | ARConfig) -> str | None:
    """The text that keys ``cfg``'s programs in the program store
    (:mod:`jaxspec.decode.program_store`), or ``None`` where they are never stored: on a
    mesh, or with a rule or round parts that are not the library's own functions (a caller's
    function is known only by its name, which another process may give another function)."""
    if cfg.mesh is not None:
        return None
    if isinstance(cfg, SpecConfig) and not (
            all(library_function_name(getattr(cfg.parts, f.name)) for f in dataclasses.fields(cfg.parts))
            and library_function_name(cfg.accept) and type(cfg.draft_def).__module__.startswith("jaxspec.")):
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
            return spec_init(cfg, *merged(cfg, *states), tokens, lens)

        def step(leaves, treedef, key, lp, temperature, draft_temperature, stop_tokens):
            states = jax.tree.unflatten(treedef, leaves)
            body = spec_body(cfg, *merged(cfg, *states), row_keys(key, lp.rounds.shape[0]), temperature,
                              draft_temperature, stop_tokens)
            lp = body(lp)
            return lp, _view(lp.st.emitted)

        result = functools.partial(spec_result, cfg)
    else:
        def start(states, tokens, lens):
            return ar_init(cfg, nnx.merge(cfg.target_def, states[0]), tokens, lens)

        def step(leaves, treedef, key, lp, temperature, stop_tokens):
            states = jax.tree.unflatten(treedef, leaves)
            model = nnx.merge(cfg.target_def, states[0])
            lp = ar_body(cfg, model, row_keys(key, lp.root.shape[0]), temperature, stop_tokens)(lp)
            return lp, _view(lp.emitted)

        result = functools.partial(ar_result, cfg)
    text = store_text(cfg)
    return StreamPrograms(StoredFunction(start, "stream_start", text),
                          StoredFunction(step, "stream_step", text, static_argnums=(1,), donate_argnums=(3,)),
                          StoredFunction(result, "stream_result", text))


def _view(em: Emitted):
    """A copy of what the host reads after a round: not part of the loop state, which the
    next round's call takes (donated) before the host has read it."""
    return jax.tree.map(jnp.copy, (em.out, em.n_out, em.active))
