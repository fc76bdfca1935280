"""What every checkpoint loader shares: its arguments, the tensors a configuration needs, and
the model built from them. The formats differ only in names and in how a tensor is read::

    dtype = check_load_args("load_gguf", dtype, max_context)     # before any file is opened
    graphdef, state, expected = expected_tensors(config, name_of)  # name -> TensorSlot
    check_tensor_names("load_gguf: x.gguf", expected, stored_names)
    values = {expected[n].path: read(n) for n in expected}        # jax arrays in config's dtype
    model = assemble(graphdef, state, values)

``name_of(state_path) -> (stored name, transposed)`` is the format's naming
(:func:`jaxspec.formats.checkpoint.load_model`: Hugging Face names, weights ``[out, in]``;
:func:`jaxspec.formats.gguf.load_gguf`: llama.cpp names, the same layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import jax
from flax import nnx

from jaxspec.nn.config import ModelConfig, dtype_name
from jaxspec.nn.model import Transformer

__all__ = ["LOAD_DTYPES", "TensorSlot", "check_load_args", "cap_context", "expected_tensors", "check_tensor_names",
           "check_layer_count", "assemble"]

LOAD_DTYPES = ("float32", "bfloat16")


class TensorSlot(NamedTuple):
    """Where a stored tensor goes in a :class:`Transformer`'s state."""

    path: tuple  # the nnx state path
    transpose: bool  # stored [out, in], kept [in, out]
    shape: tuple[int, ...]  # the shape it must have as stored


def check_load_args(fn: str, dtype, max_context) -> str:
    """``dtype`` as ``"float32"`` (None) or ``"bfloat16"`` and ``max_context`` None or a
    positive int, else ``ValueError`` naming ``fn`` and the argument; returns the dtype name."""
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context < 1):
        raise ValueError(f"{fn}: max_context = {max_context!r}; expected a positive integer or None")
    name = "float32" if dtype is None else dtype_name(dtype)
    if name not in LOAD_DTYPES:
        raise ValueError(f"{fn}: dtype = {dtype!r}; expected one of {LOAD_DTYPES} or None")
    return name


def check_layer_count(claim: str, n, held: set[int], *, unit: str, name: str, holder: str) -> None:
    """A configuration's layer count ``n`` (``claim``, e.g. ``"llama.block_count"``) against the
    layer indices whose tensors the file holds (``held``), before a model of ``n`` layers is
    built: a 2-layer file claiming 100,000 layers would build them for minutes before the first
    missing tensor is named. ``name`` formats a layer's stored prefix (``"blk.{}"``);
    a non-integer ``n`` is left to :class:`ModelConfig`, which names it."""
    if isinstance(n, bool) or not isinstance(n, int) or not held or held == set(range(n)):
        return
    if held == set(range(len(held))):
        raise ValueError(f"{claim} = {n}, but {holder} the tensors of {len(held)} {unit} "
                         f"({name.format(0)} to {name.format(len(held) - 1)}); expected {len(held)}")
    shown = sorted(held)
    shown = ", ".join(map(str, shown[:8])) + (", ..." if len(shown) > 8 else "")
    raise ValueError(f"{claim} = {n}, but {holder} the tensors of {unit} {shown}; "
                     f"expected those of {name.format(0)} to {name.format(n - 1)}")


def cap_context(config: ModelConfig, max_context: int | None) -> ModelConfig:
    """``config`` with ``max_position_embeddings`` lowered to ``max_context`` when that is
    smaller, so that generation refuses longer sequences."""
    if max_context is not None and max_context < config.max_position_embeddings:
        return dataclasses.replace(config, max_position_embeddings=max_context)
    return config


def expected_tensors(config: ModelConfig, name_of: Callable[[tuple], tuple[str, bool]]):
    """``(graphdef, abstract state, {stored name: TensorSlot})`` of a :class:`Transformer` of
    ``config``: no parameter is allocated."""
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    expected = {}
    for path, var in nnx.to_flat_state(state):
        name, transpose = name_of(path)
        shape = tuple(var.get_value().shape)
        expected[name] = TensorSlot(path, transpose, shape[::-1] if transpose else shape)
    return graphdef, state, expected


def check_tensor_names(where: str, expected: Mapping[str, TensorSlot], stored: Iterable[str]) -> None:
    """Refuse a checkpoint that lacks a tensor ``expected`` names (``where``: the loader and
    the file, for the message)."""
    stored = set(stored)
    missing = [n for n in expected if n not in stored]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{where}: missing tensor {missing[0]!r}{more}")


def assemble(graphdef, state, values: Mapping[tuple, jax.Array]) -> Transformer:
    """The :class:`Transformer` whose parameters are ``values`` (state path -> array)."""
    pure = nnx.to_pure_dict(state)
    for path, value in values.items():
        node = pure
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)
