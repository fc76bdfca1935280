"""Checks of what a caller's code returns, made once before the loop is traced.

A user's acceptance rule or drafter that returns the wrong structure, shape or dtype would
otherwise fail deep inside the compiled loop (``DynamicJaxprTracer has no attribute
num_tokens``, a ``while_loop`` carry type mismatch). Here each is run under
:func:`jax.eval_shape` on abstract inputs of the documented shapes (no computation), and
the first field that differs is named with what was expected. The library's own rules and
drafters are not checked (the tests check them); a caller's are, once per configuration.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.rule_types import AcceptResult
from jaxspec.decode.drafter import Context, DraftLaw, Outcome, Prompt, Proposal
from jaxspec.nn.cache import KVCache

__all__ = ["is_library_code", "check_rule_output", "check_drafter_output", "check_drafter_scheme"]


def is_library_code(obj) -> bool:
    """Whether ``obj`` (a function or an object) is jaxspec's own."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return module == "jaxspec" or module.startswith("jaxspec.")


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _what(x) -> str:
    if x is None:
        return "None"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{jnp.dtype(x.dtype).name}{list(x.shape)}"
    return type(x).__name__


def _expect(owner: str, field: str, got, shape, dtype, where: str) -> None:
    """``ValueError`` unless ``got`` is an array of ``shape`` and ``dtype``."""
    if not (hasattr(got, "shape") and hasattr(got, "dtype")) or tuple(got.shape) != tuple(shape) \
            or jnp.dtype(got.dtype) != jnp.dtype(dtype):
        raise ValueError(f"{owner}: {field} = {_what(got)}; expected {jnp.dtype(dtype).name}"
                         f"{list(shape)} ({where})")


def check_drafter_scheme(drafter, scheme) -> str:
    """``scheme``, what ``drafter.check`` returned, if it is a sibling scheme; else
    ``ValueError`` naming the drafter's class and its ``check`` (``check`` must return the
    scheme it will draw with: the request's, or its own choice when the request has none)."""
    from jaxspec.core.sampling import SCHEMES

    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ValueError(f"draft: {type(drafter).__name__}.check returned {scheme!r}; expected the sibling scheme "
                         f"it will draw with, one of {', '.join(map(repr, SCHEMES))} (see jaxspec.Drafter.check)")
    return scheme


@functools.lru_cache(maxsize=64)
def check_rule_output(accept, scheme: str, num_nodes: int, vocab_size: int, name: str = "rule") -> None:
    """Run the acceptance step ``accept`` (the :class:`~jaxspec.core.rule_types.Rule`
    signature) on abstract inputs of one row and check its :class:`AcceptResult`: a
    ``ValueError`` naming ``name`` (the argument that brought it), the field and what was
    expected, or one saying where tracing it failed."""
    n, v = num_nodes, vocab_size
    key = jax.eval_shape(lambda: jax.random.key(0))
    args = (key, _sds((n,), jnp.int32), _sds((n,), jnp.int32), _sds((n + 1, v), jnp.float32),
            _sds((n + 1, v), jnp.float32))
    label = f"{name} = {getattr(accept, '__qualname__', repr(accept))}"
    try:
        out = jax.eval_shape(lambda *a: accept(*a, scheme), *args)
    except Exception as e:  # noqa: BLE001  (any failure of the caller's code, named)
        raise ValueError(f"{label}: tracing it on one row's inputs (key, parents int32[{n}], tokens int32[{n}], "
                         f"target_probs and draft_probs float32[{n + 1}, {v}], scheme {scheme!r}) failed: "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(out, AcceptResult):
        raise ValueError(f"{label}: returned {type(out).__name__}; expected a jaxspec.AcceptResult")
    for field, shape in (("tokens", (n + 1,)), ("num_tokens", ()), ("num_accepted", ()), ("accepted_nodes", (n,)),
                         ("accepted_per_depth", (n,)), ("last_node", ())):
        _expect(label, f"AcceptResult.{field}", getattr(out, field), shape, jnp.int32, "one row's result")


def _structure(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), jnp.dtype(x.dtype)) for x in leaves)


def check_drafter_output(drafter, params, target, *, tree, scheme: str, warp, batch: int, width: int,
                         capacity: int, budget: int) -> None:
    """Run a caller's drafter's ``init``, ``propose`` and ``commit`` once on abstract inputs
    of a generation's shapes (``batch`` rows, prompts ``width`` wide, ``capacity`` cache
    slots, ``budget`` new tokens) and check what they return: the proposal's fields, and a
    state that keeps one structure, shapes and dtypes from round to round (the loop carries
    it). ``ValueError`` naming the method and the field; the library's drafters pass
    unchecked."""
    if is_library_code(drafter):
        return
    key = (drafter, tree, scheme, warp, batch, width, capacity, budget, _structure(params),
           target.config)
    if key in _CHECKED:
        return
    _check_drafter(drafter, params, target, tree, scheme, warp, batch, width, capacity, budget)
    if len(_CHECKED) >= 64:
        _CHECKED.clear()
    _CHECKED.add(key)


_CHECKED: set = set()  # configurations checked in this process


def _call(name: str, method: str, fn, *args) -> Any:
    try:
        return jax.eval_shape(fn, *args)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001  (any failure of the caller's code, named)
        raise ValueError(f"draft: {name}.{method} failed when traced on inputs of the documented shapes "
                         f"(jaxspec.Drafter): {type(e).__name__}: {e}") from e


def _check_drafter(drafter, params, target, tree, scheme, warp, b, width, capacity, budget) -> None:
    name = type(drafter).__name__
    cfg = target.config
    n, v, d = tree.num_nodes, cfg.vocab_size, cfg.hidden_size
    i32 = jnp.int32
    state = _call(name, "init", lambda p, t, ln, f: drafter.init(p, target, Prompt(t, ln, f, capacity, tree)),
                  params, _sds((b, width), i32), _sds((b,), i32), _sds((b, width, d), jnp.float32))
    kv = _sds((cfg.num_hidden_layers, b, capacity, cfg.num_key_value_heads, cfg.head_dim), cfg.param_dtype)
    tcache = KVCache(k=kv, v=kv, lengths=_sds((b,), i32))
    ctx = Context(_sds((b,), i32), _sds((b,), i32), _sds((b,), i32), _sds((b, budget), i32), _sds((b,), i32),
                  _sds((b,), jnp.bool_), tcache)
    keys = jax.eval_shape(lambda: jax.vmap(jax.random.key)(jnp.arange(b)))
    law = DraftLaw(tree, scheme, warp, _sds((), jnp.float32))
    prop = _call(name, "propose", lambda p, s, c, k, t: drafter.propose(p, target, s, c, k, law._replace(temperature=t)),
                 params, state, ctx, keys, law.temperature)
    where = f"B = {b} rows, N = {n} nodes, V = {v}"
    if not isinstance(prop, Proposal):
        raise ValueError(f"draft: {name}.propose returned {type(prop).__name__}; expected a jaxspec.Proposal")
    _expect(f"draft: {name}.propose", "Proposal.tokens", prop.tokens, (b, n), i32, where)
    if prop.probs is not None:
        _expect(f"draft: {name}.propose", "Proposal.probs", prop.probs, (b, n + 1, v), jnp.float32, where)
    elif scheme != "deterministic":
        raise ValueError(f"draft: {name}.propose returned probs = None (fixed choices) under scheme {scheme!r}; "
                         "fixed choices serve only scheme 'deterministic': refuse the others in check()")
    if prop.parents is not None:
        _expect(f"draft: {name}.propose", "Proposal.parents", prop.parents, (b, n), i32, where)
    if prop.has_draft is not None:
        _expect(f"draft: {name}.propose", "Proposal.has_draft", prop.has_draft, (b,), jnp.bool_, where)
    _same_state(name, "propose", "Proposal.state", state, prop.state)
    outcome = Outcome(_sds((b, n + 1), i32), _sds((b,), i32), _sds((b, n), i32), _sds((b,), jnp.bool_),
                      _sds((b, n + 1, d), jnp.float32))
    new = _call(name, "commit", lambda p, s, o: drafter.commit(p, s, o, _keep), params, prop.state, outcome)
    _same_state(name, "commit", "its state", state, new)


def _keep(cache, accepted_nodes, num):
    """An abstract stand-in of the round's cache commit (same structure in, same out)."""
    return cache


def _same_state(name: str, method: str, what: str, state, new) -> None:
    """The state a method returns must match ``init``'s: the loop carries it."""
    (t0, s0), (t1, s1) = _structure(state), _structure(new)
    if t0 != t1:
        raise ValueError(f"draft: {name}.{method} returned {what} with structure {t1}; expected init's {t0} "
                         "(the loop carries the state from round to round)")
    for i, (a, z) in enumerate(zip(s0, s1)):
        if a != z:
            raise ValueError(f"draft: {name}.{method} returned {what} whose leaf {i} is "
                             f"{np.dtype(z[1]).name}{list(z[0])}; expected init's {np.dtype(a[1]).name}{list(a[0])} "
                             "(the loop carries the state from round to round)")
