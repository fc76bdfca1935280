"""A folder of traced programs, so that a new process skips tracing and lowering.

JAX's persistent compilation cache stores *compiled* executables, keyed by the lowered
module: every process still traces the Python function and lowers it to StableHLO before
it can look the executable up, which for the generation loop costs seconds. This store
keeps the lowered program itself (:mod:`jax.export`, serialized) under a key computed
without tracing: the static configuration's text, the arguments' tree, shapes and dtypes,
the versions of JAX, jaxlib and flax, a digest of jaxspec's own source, the device kind,
JAX's settings that change a trace, and ``$XLA_FLAGS``. A process that finds its
key deserializes the program and runs it through ``jax.jit(exported.call)``, whose small
lowering is the same in every process, so its executable is a hit of JAX's cache too.

A file is data, never code: a magic line, one line of JSON (the full key and the output's
tree, naming only builtin containers and jaxspec's own classes) and jax.export's bytes;
nothing is unpickled. The store is off until :func:`use_folder` names a folder (the command
line does with ``--program-store``, beside its compilation cache:
:func:`jaxspec.cli.compile_cache.enable_compilation_cache`); a
:class:`StoredFunction` is then ``jax.jit(fun)`` with the trace taken from the folder when
it is there. It is used only where the key is sound: one device (no mesh), and a static
configuration whose text names no object by its address (a lambda, a local function, a
bound method: their text is not the same in two processes, or names two functions alike).
Anything else runs as plain ``jax.jit``. A file that cannot be read is replaced, with a
warning; a folder that cannot be written leaves the run as it was.

The program run is the same StableHLO that ``jax.jit(fun)`` would compile, so the results
are those of the plain ``jax.jit`` call (tests/test_program_store.py checks it field by field).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax

__all__ = ["SUFFIX", "StoredFunction", "decode_tree", "encode_tree", "folder", "library_function_name",
           "source_digest", "static_text", "use_folder"]

SUFFIX = ".jaxspec-program"  # one file per (function, configuration, argument signature)
_FORMAT = 2  # bump when the file's layout changes: older files are then read as missing
_MAGIC = b"JAXSPEC-PROGRAM\n"  # then one line of JSON (the key, the output's tree), then jax.export's bytes
_state: dict[str, Path | None] = {"folder": None}


def use_folder(path: str | os.PathLike | None) -> Path | None:
    """Store traced programs in ``path`` from now on (``None``: off, the default). The
    folder is created; returns it, or ``None`` when off or when it cannot be created."""
    if path is None:
        _state["folder"] = None
        return None
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError:
        p = None
    _state["folder"] = p
    return p


def folder() -> Path | None:
    """The folder in use, or ``None`` when the store is off."""
    return _state["folder"]


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of every ``.py`` file of the installed jaxspec package (names and bytes):
    a stored program traced by other library code is never loaded."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_FUNCTION = re.compile(r"<function ([\w.]+) at 0x[0-9a-fA-F]+>")


def static_text(obj) -> str | None:
    """``repr(obj)`` with module-level functions named without their address (``<function
    f at 0x7f..>`` -> ``<function f>``), or ``None`` where the text still depends on the
    process or does not tell two functions apart: a lambda, a local function, or any other
    address left in it. The key of a stored program is built from it."""
    text = _FUNCTION.sub(r"<function \1>", repr(obj))
    if "<lambda>" in text or "<locals>" in text or re.search(r"0x[0-9a-fA-F]{6,}", text):
        return None
    return text


def library_function_name(f) -> str | None:
    """``"module.qualname"`` of one of jaxspec's own module-level functions, else ``None``:
    a caller's function is known only by its name, which another process may give
    another function, so a key naming it is unsound."""
    module, name = getattr(f, "__module__", None) or "", getattr(f, "__qualname__", None) or "<"
    if not callable(f) or not module.startswith("jaxspec.") or "<" in name:
        return None
    return f"{module}.{name}"


def _environment() -> str:
    """What else a trace depends on: library versions, jaxspec's source, the backend and its
    device kind, the settings that change what tracing produces and ``$XLA_FLAGS``."""
    import flax  # noqa: PLC0415
    import jaxlib  # noqa: PLC0415

    dev = jax.devices()[0]
    cfg = jax.config
    settings = [(name, getattr(cfg, name, None)) for name in (
        "jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable", "jax_default_matmul_precision",
        "jax_numpy_dtype_promotion")]
    return repr((_FORMAT, jax.__version__, jaxlib.__version__, flax.__version__, source_digest(),
                 dev.platform, dev.device_kind, jax.device_count(), settings, os.environ.get("XLA_FLAGS", "")))


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _aval(x) -> tuple:
    """(shape, dtype, weak type) of one argument leaf; a PRNG key by its implementation."""
    if _is_key(x):
        return ("key", tuple(x.shape), str(jax.random.key_impl(x)))
    a = jax.typeof(x) if hasattr(jax, "typeof") else jax.core.get_aval(x)
    return (tuple(a.shape), str(a.dtype), bool(getattr(a, "weak_type", False)))


class _Entry(NamedTuple):
    """A loaded program: the jitted call of the flat function, and how to rebuild the
    output (its tree, and which of its leaves are PRNG keys, with their implementation)."""

    call: Callable
    out_tree: Any
    out_keys: tuple  # (leaf index, key implementation name), ...


class StoredFunction:
    """``jax.jit(fun, static_argnums=..., donate_argnums=...)``, whose traced program comes
    from the store's folder when one is in use and holds it (see the module docstring).

    ``static``: the text of everything ``fun`` closes over that is not an argument (for
    the generation loop: its configuration), from :func:`static_text`; ``None`` means
    no sound key, so the store is never used. ``name`` tells programs of one
    configuration apart (``"speculative_program"``, ``"stream_step"``, ...) and names the
    traced function in JAX's logs. Attributes other than the call
    (``lower``, ``trace``, ``eval_shape``, ...) are those of the plain ``jax.jit``.
    """

    def __init__(self, fun: Callable, name: str, static: str | None, *, static_argnums: Sequence[int] = (),
                 donate_argnums: Sequence[int] = ()):
        self._fun = fun
        self._name = name
        self._static = static
        self._static_argnums = tuple(static_argnums)
        self._donate_argnums = tuple(donate_argnums)
        self._jit = jax.jit(fun, static_argnums=self._static_argnums, donate_argnums=self._donate_argnums)
        self._entries: dict = {}  # (folder, static args' text, in tree, avals) -> _Entry

    def __getattr__(self, attr):
        if attr.startswith("_"):  # never for this object's own fields (copy and pickle probe them)
            raise AttributeError(attr)
        return getattr(self._jit, attr)

    def compiled_count(self) -> int:
        """How many programs this function has compiled in this process: one per input
        signature of the plain ``jax.jit``, plus one per program loaded from (or put in)
        the store. Tests count recompilation with it."""
        return self._jit._cache_size() + sum(e.call._cache_size() for e in self._entries.values())

    def __call__(self, *args):
        where = folder()
        if where is None or self._static is None:
            return self._jit(*args)
        statics = {i: args[i] for i in self._static_argnums}
        dynamic = tuple(a for i, a in enumerate(args) if i not in statics)
        leaves, in_tree = jax.tree.flatten(dynamic)
        sig = (tuple(_aval(x) for x in leaves), in_tree)
        memo = (where, tuple(statics.items()), sig)  # static arguments are hashable, as jax.jit wants
        entry = self._entries.get(memo)
        if entry is None:
            static_args = static_text(tuple(statics.items()))
            if static_args is None:
                return self._jit(*args)
            entry = self._entry(where, static_args, statics, sig, leaves, in_tree, self._donated_leaves(args))
            if entry is None:
                return self._jit(*args)
            self._entries[memo] = entry
        flat = [jax.random.key_data(x) if _is_key(x) else x for x in leaves]
        out = list(entry.call(*flat))
        for i, impl in entry.out_keys:
            out[i] = jax.random.wrap_key_data(out[i], impl=impl)
        return jax.tree.unflatten(entry.out_tree, out)

    # ------------------------------------------------------------------ loading and storing

    def _donated_leaves(self, args) -> tuple[int, ...]:
        """Indices, among the flat leaves of the dynamic arguments, of the leaves of the
        donated arguments."""
        out, start = [], 0
        for i, a in enumerate(args):
            if i in self._static_argnums:
                continue
            n = len(jax.tree.leaves(a))
            if i in self._donate_argnums:
                out.extend(range(start, start + n))
            start += n
        return tuple(out)

    def _entry(self, where: Path, static_args: str, statics: dict, sig, leaves, in_tree, donate) -> _Entry | None:
        text = repr((self._name, self._static, static_args, sig[0], str(in_tree), _environment()))
        path = where / (hashlib.sha256(text.encode()).hexdigest()[:40] + SUFFIX)
        loaded = self._load(path, text)
        if loaded is not None:
            exported, out_tree, out_keys = loaded
        else:
            made = self._export(statics, sig, leaves, in_tree)
            if made is None:
                return None
            exported, out_tree, out_keys = made
            self._save(path, text, exported, out_tree, out_keys)
        return _Entry(jax.jit(exported.call, donate_argnums=donate), out_tree, out_keys)

    def _export(self, statics: dict, sig, leaves, in_tree):
        key_impls = {i: a[2] for i, a in enumerate(sig[0]) if a[0] == "key"}
        n_args = len(in_tree.children()) + len(statics)
        found: dict = {}

        def flat_fun(*flat):
            xs = [jax.random.wrap_key_data(x, impl=key_impls[i]) if i in key_impls else x
                  for i, x in enumerate(flat)]
            dynamic = iter(jax.tree.unflatten(in_tree, xs))
            args = [statics[i] if i in statics else next(dynamic) for i in range(n_args)]
            out_leaves, found["tree"] = jax.tree.flatten(self._fun(*args))
            found["keys"] = tuple((i, str(jax.random.key_impl(x))) for i, x in enumerate(out_leaves) if _is_key(x))
            return tuple(jax.random.key_data(x) if _is_key(x) else x for x in out_leaves)

        flat_fun.__name__ = flat_fun.__qualname__ = self._name  # what JAX's logs and profiles call it

        specs = [jax.eval_shape(jax.random.key_data, x) if _is_key(x)
                 else jax.ShapeDtypeStruct(a[0], a[1], weak_type=a[2]) for x, a in zip(leaves, sig[0])]
        exported = jax.export.export(jax.jit(flat_fun))(*specs)
        return exported, found["tree"], found["keys"]

    @staticmethod
    def _load(path: Path, text: str):
        if not path.exists():
            return None
        try:
            with open(path, "rb") as f:
                if f.readline() != _MAGIC:
                    raise ValueError("not a jaxspec program file of this version")
                header = json.loads(f.readline())
                if header.get("format") != _FORMAT or header.get("key") != text:
                    return None  # another layout, or (improbably) another key with this hash
                exported = jax.export.deserialize(bytearray(f.read()))
            return exported, decode_tree(header["out_tree"]), tuple(tuple(k) for k in header["out_keys"])
        except Exception as e:  # noqa: BLE001 (a damaged file of the cache is traced again)
            warnings.warn(f"jaxspec program store: {path} could not be read ({type(e).__name__}: {e}); "
                          "tracing the program again", RuntimeWarning, stacklevel=4)
            return None

    @staticmethod
    def _save(path: Path, text: str, exported, out_tree, out_keys) -> None:
        try:
            header = json.dumps({"format": _FORMAT, "key": text, "out_tree": encode_tree(out_tree),
                                 "out_keys": [list(k) for k in out_keys]})
            payload = bytes(exported.serialize())
        except Exception as e:  # noqa: BLE001 (e.g. no flatbuffers package: the run goes on, unstored)
            warnings.warn(f"jaxspec program store: the traced program could not be serialized "
                          f"({type(e).__name__}: {e}); it is not stored", RuntimeWarning, stacklevel=4)
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + header.encode() + b"\n" + payload)
            os.replace(tmp, path)  # whole or absent: a reader never sees half a file
        except OSError:
            pass  # a read-only or full folder: the run goes on without storing


# --------------------------------------------------------------------------- output trees as JSON
# A stored file is data, never code: the output's tree structure is written as JSON naming
# its node types, and read back only for the builtin containers and jaxspec's own classes
# (nothing is unpickled, no other module is imported).

_BUILTINS = {"tuple": tuple, "list": list, "dict": dict, "NoneType": type(None)}


def _json_aux(x):
    if isinstance(x, tuple):
        return {"tuple": [_json_aux(v) for v in x]}
    if isinstance(x, list):  # a dict's keys
        return [_json_aux(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    raise TypeError(f"a tree node's data {x!r} is not plain data")


def _plain_aux(x):
    if isinstance(x, dict):
        return tuple(_plain_aux(v) for v in x["tuple"])
    if isinstance(x, list):
        return [_plain_aux(v) for v in x]
    return x


def encode_tree(treedef) -> Any:
    """A PyTreeDef as JSON: ``"*"`` for a leaf, else ``[type name, node data, children]``.
    Only builtin containers and jaxspec's classes, with plain node data (``TypeError``
    otherwise: the program is then not stored)."""
    if jax.tree_util.treedef_is_leaf(treedef) and treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return "*"
    kind, aux = treedef.node_data()
    if kind.__module__ == "builtins" and kind.__name__ in _BUILTINS:
        name = kind.__name__
    elif kind.__module__.startswith("jaxspec.") and "<" not in kind.__qualname__:
        name = f"{kind.__module__}:{kind.__qualname__}"
    else:
        raise TypeError(f"{kind.__module__}.{kind.__qualname__} is not a builtin container or a jaxspec class")
    return [name, _json_aux(aux), [encode_tree(c) for c in treedef.children()]]


def decode_tree(data) -> Any:
    """The PyTreeDef :func:`encode_tree` wrote."""
    if data == "*":
        return jax.tree.structure(0)
    name, aux, children = data
    if ":" in name:
        module, qualname = name.split(":")
        if not module.startswith("jaxspec."):
            raise ValueError(f"node type {name!r}: expected a jaxspec class")
        kind = importlib.import_module(module)
        for part in qualname.split("."):
            kind = getattr(kind, part)
    else:
        kind = _BUILTINS[name]
    return jax.tree_util.PyTreeDef.from_node_data_and_children(
        jax.tree_util.default_registry, (kind, _plain_aux(aux)), [decode_tree(c) for c in children])
