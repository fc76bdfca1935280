"""Where a model's parameters, KV cache and rows live on a device mesh.

A mesh is a :class:`jax.sharding.Mesh` with a ``"data"`` axis, a ``"model"`` axis or both
(:func:`make_mesh` builds one; ``jaxspec generate --mesh data=2,model=4`` parses its flag
with :func:`parse_mesh`)::

    mesh = jaxspec.make_mesh(data=2, model=4)          # 8 devices
    out = jaxspec.generate(key, target, draft, prompts, max_new_tokens=64, mesh=mesh)

Rows (prompts, caches, outputs) are split over ``data``. Parameters are split over
``model`` Megatron style, so that each layer needs one all-reduce after attention and one
after the MLP:

==========================  ==============================  =============================
parameter                   shape                           split over ``model``
==========================  ==============================  =============================
q_proj (kernel, bias)       ``[D, H*hd]``                   by query heads (columns)
k_proj, v_proj              ``[D, Hkv*hd]``                 by KV heads, or replicated
o_proj                      ``[H*hd, D]``                   by query heads (rows)
gate_proj, up_proj          ``[D, I]``                      by the intermediate dim
down_proj                   ``[I, D]``                      by the intermediate dim (rows)
embed_tokens, lm_head       ``[V, D]``, ``[D, V]``          by vocabulary (if it divides)
norms                       ``[D]``                         replicated
==========================  ==============================  =============================

The KV cache ``[L, B, S, Hkv, hd]`` is split over ``data`` by rows and over ``model`` by KV
heads, as k_proj/v_proj are.

Choices, and why:

* **KV heads.** With ``Hkv % model == 0`` each device holds its query heads' KV heads.
  With fewer KV heads than devices (grouped or multi-query attention, ``model % Hkv ==
  0``) the K/V projections and the cache are replicated over ``model``, as Megatron and
  vLLM do: a query head then finds its KV head on its own device. Any other pair of
  counts is refused, as is a query-head count or an intermediate size that ``model``
  does not divide.
* **Vocabulary.** The LM head is the widest matrix of a small model, and splitting its
  columns changes no sum (each logit is one full dot product), so logits are computed
  split and gathered once per forward for sampling, which needs each row's whole law
  (top-k, top-p, the residual of rejection). The embedding is split the same way (it is
  the LM head when tied); a lookup then costs one all-reduce of ``[B, T, D]``. A
  vocabulary that ``model`` does not divide is replicated instead: padding the
  vocabulary would change the model's law unless masked everywhere.

Numerics: a ``data`` split changes no arithmetic of a row. A ``model`` split sums
o_proj/down_proj partial products across devices, in another order than one device does,
so logits can differ in the last bits: greedy tokens differ only at near-ties, sampled
tokens only where a uniform draw falls within that difference of a boundary. The law is
the same (the rule is exact for any logits the target computes).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.checks import is_int
from jaxspec.nn.cache import KVCache
from jaxspec.nn.config import ModelConfig

__all__ = [
    "DATA",
    "MODEL",
    "AXES",
    "make_mesh",
    "parse_mesh",
    "host_device_limit",
    "check_mesh",
    "constrain_state",
    "shard_params",
    "full_mesh",
    "mesh_shape",
    "axis_size",
    "check_model_on_mesh",
    "param_specs",
    "shard_state",
    "cache_specs",
    "constrain_cache",
    "constrain_rows",
    "row_sharding",
    "replicated",
    "padded_rows",
    "put",
    "gather",
]

DATA = "data"
MODEL = "model"
AXES = (DATA, MODEL)

_CPU_HINT = (
    "on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX is imported "
    "to see N host devices"
)


def parse_mesh(spec: str) -> dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}`` (either axis may be left out;
    an axis left out has size 1). ``ValueError`` names the bad part."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh = {spec!r}: expected 'data=N', 'model=M' or 'data=N,model=M'")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        m = re.fullmatch(r"\s*([a-z]+)\s*=\s*(\d+)\s*", part)
        if m is None:
            raise ValueError(f"mesh = {spec!r}: part {part!r} is not AXIS=SIZE (axes: {', '.join(AXES)})")
        name, size = m.group(1), int(m.group(2))
        if name not in AXES:
            raise ValueError(f"mesh = {spec!r}: unknown axis {name!r}; expected {' or '.join(AXES)}")
        if name in sizes:
            raise ValueError(f"mesh = {spec!r}: axis {name!r} given twice")
        if size < 1:
            raise ValueError(f"mesh = {spec!r}: {name} = {size}; expected a size >= 1")
        sizes[name] = size
    return sizes


def host_device_limit() -> int:
    """The most host (CPU) devices the command line makes for ``--mesh``: ``max(8, CPU
    cores)``. Host devices are threads of one process on the same cores, for testing a
    mesh, not for speed; each costs memory when a program is compiled for it, and a
    thousand made XLA abort or the kernel kill the process. More can still be asked for
    with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts."""
    return max(8, os.cpu_count() or 1)


def make_mesh(data: int = 1, model: int = 1, devices: Sequence | None = None) -> Mesh:
    """A ``(data, model)`` mesh over the first ``data * model`` of ``devices`` (default
    ``jax.devices()``, all hosts), devices of one ``model`` group adjacent (the axis with
    the most traffic on the closest devices)."""
    for name, v in (("data", data), ("model", model)):
        if not is_int(v) or v < 1:
            raise ValueError(f"make_mesh: {name} = {v!r}; expected an integer >= 1")
    devices = list(jax.devices() if devices is None else devices)
    need = int(data) * int(model)
    if need > len(devices):
        hint = f"; {_CPU_HINT}" if devices and devices[0].platform == "cpu" else ""
        raise ValueError(
            f"make_mesh: data * model = {data} * {model} = {need} devices; {len(devices)} visible{hint}"
        )
    grid = np.asarray(devices[:need], dtype=object).reshape(int(data), int(model))
    return Mesh(grid, AXES)


def check_mesh(mesh) -> Mesh:
    """``mesh`` as jaxspec places arrays on it, if it is a :class:`jax.sharding.Mesh`
    whose axes are among ``("data", "model")``; else ``ValueError`` naming the expected
    axes.

    The mesh returned has the same devices and axis names, every axis of type ``Auto``:
    ``jax.make_mesh`` makes ``Explicit`` axes by default (jax >= 0.7), under which array
    types carry their sharding and ``jnp`` indexing of a split operand by split indices
    asks for an ``out_sharding``; jaxspec places its arrays by ``NamedSharding`` and
    sharding constraints, the ``Auto`` way (:func:`make_mesh` makes ``Auto`` axes)."""
    if not isinstance(mesh, Mesh):
        raise ValueError(
            f"mesh = {mesh!r}: expected a jax.sharding.Mesh (e.g. jaxspec.make_mesh(data=2, model=4))"
        )
    bad = [a for a in mesh.axis_names if a not in AXES]
    if bad or not mesh.axis_names:
        raise ValueError(
            f"mesh: axis names {tuple(mesh.axis_names)}; expected 'data', 'model' or both "
            "(rows are split over 'data', parameters over 'model')"
        )
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def full_mesh(mesh: Mesh) -> Mesh:
    """The same devices as a mesh with both axes, ``("data", "model")`` in that order (an
    axis ``mesh`` lacks has size 1)."""
    check_mesh(mesh)
    grid = np.asarray(mesh.devices, dtype=object)
    for name in AXES:
        if name not in mesh.axis_names:
            grid = grid[..., None]
    names = list(mesh.axis_names) + [a for a in AXES if a not in mesh.axis_names]
    return Mesh(np.transpose(grid, [names.index(a) for a in AXES]), AXES)


def mesh_shape(mesh: Mesh | None) -> dict[str, int]:
    """``{"data": d, "model": m}`` (1 for an axis the mesh lacks; both 1 without a mesh)."""
    return {name: axis_size(mesh, name) for name in AXES}


def axis_size(mesh: Mesh | None, name: str) -> int:
    """Size of axis ``name`` of ``mesh`` (1 when the mesh has no such axis or is None)."""
    if mesh is None or name not in mesh.axis_names:
        return 1
    return int(mesh.shape[name])


def _axis(mesh: Mesh, name: str) -> str | None:
    """``name`` for a PartitionSpec if the mesh splits over it, else ``None``."""
    return name if axis_size(mesh, name) > 1 else None


def _kv_split(config: ModelConfig, m: int) -> bool:
    """True: KV heads are split over the model axis; False: replicated."""
    return config.num_key_value_heads % m == 0


def check_model_on_mesh(name: str, config: ModelConfig, mesh: Mesh) -> None:
    """``ValueError`` naming ``name`` ("target", "draft") when the model axis does not
    divide the model's query heads or intermediate size, or its KV heads neither divide
    nor are divided by it."""
    m = axis_size(mesh, MODEL)
    if m == 1:
        return
    h, kv, i = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if h % m:
        raise ValueError(
            f"{name}: num_attention_heads = {h} is not divisible by the mesh's model axis ({m}); "
            f"use a model axis that divides {h}"
        )
    if kv % m and m % kv:
        raise ValueError(
            f"{name}: num_key_value_heads = {kv} and the mesh's model axis ({m}): KV heads are split "
            "when the axis divides them and replicated when they divide the axis; neither holds"
        )
    if i % m:
        raise ValueError(
            f"{name}: intermediate_size = {i} is not divisible by the mesh's model axis ({m})"
        )


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _param_spec(names: tuple[str, ...], ndim: int, config: ModelConfig, mesh: Mesh) -> P:
    mdl = _axis(mesh, MODEL)
    if mdl is None:
        return P()
    m = axis_size(mesh, MODEL)
    leaf = names[-1]
    owner = names[-2] if len(names) > 1 else ""
    vocab = mdl if config.vocab_size % m == 0 else None
    if owner in ("q_proj", "gate_proj", "up_proj") or (owner in ("k_proj", "v_proj") and _kv_split(config, m)):
        return P(None, mdl) if leaf == "kernel" else P(mdl)  # column parallel (bias: [out])
    if owner in ("o_proj", "down_proj"):
        return P(mdl, None) if leaf == "kernel" else P()  # row parallel (a bias is added once)
    if owner == "embed_tokens":
        return P(vocab, None)  # [V, D]
    if owner == "lm_head":
        return P(None, vocab) if leaf == "kernel" else P(vocab)  # [D, V]
    return P(*([None] * ndim))  # norms, replicated K/V projections


def param_specs(state, config: ModelConfig, mesh: Mesh):
    """The :class:`~jax.sharding.PartitionSpec` of every array of ``state``
    (``nnx.state(model)``), as a pytree of the same structure (table in the module
    docstring)."""

    def spec(path, x):
        names = tuple(n for n in (_key_name(k) for k in path) if n != "value")
        return _param_spec(names, np.ndim(x), config, mesh)

    return jax.tree_util.tree_map_with_path(spec, state)


def shard_state(state, config: ModelConfig, mesh: Mesh):
    """``state`` placed on ``mesh`` by :func:`param_specs` (multi-host: every process
    passes the same full values; each keeps its own devices' pieces)."""
    specs = param_specs(state, config, mesh)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    return jax.tree.map(put, state, shardings)


def cache_specs(config: ModelConfig, mesh: Mesh, *, rows: bool = True) -> KVCache:
    """A :class:`~jaxspec.nn.cache.KVCache` of PartitionSpecs: k/v ``[L, B, S, Hkv, hd]``
    split by rows over ``data`` (unless ``rows=False``: inside a ``shard_map`` that has made
    the data axis manual) and by KV heads over ``model`` when they are split there."""
    return _cache_specs(config.num_key_value_heads, mesh, rows)


def _cache_specs(kv_heads: int, mesh: Mesh, rows: bool) -> KVCache:
    m = axis_size(mesh, MODEL)
    heads = _axis(mesh, MODEL) if m > 1 and kv_heads % m == 0 else None
    data = _axis(mesh, DATA) if rows else None
    kv = P(None, data, None, heads, None)
    return KVCache(k=kv, v=kv, lengths=P(data))


def constrain_cache(cache: KVCache, config: ModelConfig, mesh: Mesh | None, *, rows: bool = True) -> KVCache:
    """``cache`` under :func:`jax.lax.with_sharding_constraint` by :func:`cache_specs`
    (identity when ``mesh`` is None): fixes the layout of the caches the compiled loop
    creates, which XLA would otherwise choose by propagation."""
    if mesh is None:
        return cache
    return _constrain_kv(cache, config.num_key_value_heads, mesh, rows)


def _constrain_kv(cache: KVCache, kv_heads: int, mesh: Mesh, rows: bool) -> KVCache:
    specs = _cache_specs(kv_heads, mesh, rows)
    # inside a shard_map (rows=False) the context mesh has a manual data axis: a bare spec
    # refers to it, a NamedSharding on the all-automatic mesh would not match it
    return jax.tree.map(
        lambda x, s: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s) if rows else s), cache, specs,
        is_leaf=lambda s: isinstance(s, P),
    )


def constrain_state(tree, mesh: Mesh | None, *, rows: bool = True):
    """A drafter's loop state under its layout on ``mesh`` (identity when ``mesh`` is
    None): every :class:`~jaxspec.nn.cache.KVCache` in it as :func:`constrain_cache` lays a
    model's out (its KV heads read from its shape), every other array split by rows
    (:func:`constrain_rows`)."""
    if mesh is None:
        return tree

    def one(x):
        if isinstance(x, KVCache):
            return _constrain_kv(x, x.k.shape[3], mesh, rows)
        return constrain_rows(x, mesh, rows=rows)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, KVCache))


def shard_params(params, config: ModelConfig | None, mesh: Mesh):
    """A drafter's params placed on ``mesh``: by :func:`param_specs` when the drafter
    states its model ``config``, else replicated (``None`` stays ``None``)."""
    if params is None:
        return None
    if config is not None:
        return shard_state(params, config, mesh)
    return jax.tree.map(lambda x: put(x, replicated(mesh)), params)


def constrain_rows(tree, mesh: Mesh | None, *, rows: bool = True):
    """Every array of ``tree`` (rows first: ``[B, ...]``) constrained to be split by rows
    over ``data``: the per-row state of the loop (tokens emitted, roots, statistics) then
    lives with its rows instead of being computed whole on every device. The identity
    without a mesh, without a data axis, or with ``rows=False``."""
    if mesh is None or not rows or _axis(mesh, DATA) is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, row_sharding(mesh, x.ndim)), tree)


def row_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Arrays with rows first (``[B, ...]``) split by rows over ``data``."""
    return NamedSharding(mesh, P(_axis(mesh, DATA), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def padded_rows(b: int, mesh: Mesh | None) -> int:
    """``b`` rounded up to a multiple of the data axis size: the rows a batch of ``b`` is
    padded to so that every device of the axis holds as many."""
    d = axis_size(mesh, DATA)
    return int(math.ceil(b / d) * d)


def put(x, sharding: NamedSharding) -> jax.Array:
    """A global array of ``x`` (the same full value on every process) under ``sharding``;
    multi-host safe (each process fills its own devices' pieces)."""
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    arr = np.asarray(x)
    return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def gather(tree):
    """Every array of ``tree`` whole on this process: the identity on one process; across
    processes an all-gather of the pieces other processes hold."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
