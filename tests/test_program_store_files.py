"""A stored program is data, never code, and its key cannot serve a stale program: the file
is a magic line, one line of JSON and jax.export's bytes (nothing is unpickled); a file
naming a class outside jaxspec is refused before anything is imported; the key changes with
XLA_FLAGS, as with the versions, the device kind and jaxspec's source
(jaxspec/decode/program_store.py)."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.decode import program_store
from jaxspec.decode.program_store import SUFFIX, StoredFunction, decode_tree, encode_tree


@pytest.fixture
def store(tmp_path):
    folder = program_store.use_folder(tmp_path / "programs")
    yield folder
    program_store.use_folder(None)


def double(x):
    return {"y": x * 2, "pair": (x, None)}


class Counted:
    def __init__(self, fun):
        self.fun, self.traces = fun, 0

    def __call__(self, *args):
        self.traces += 1
        return self.fun(*args)


def test_the_file_is_a_magic_line_json_and_exported_bytes(store):
    StoredFunction(double, "double", "v1")(jnp.arange(3.0))
    (path,) = store.glob("*" + SUFFIX)
    magic, header, payload = path.read_bytes().split(b"\n", 2)
    assert magic == b"JAXSPEC-PROGRAM"
    head = json.loads(header)
    assert set(head) == {"format", "key", "out_tree", "out_keys"} and "XLA_FLAGS" not in head["key"]
    assert decode_tree(head["out_tree"]) == jax.tree.structure(double(jnp.arange(3.0)))
    exported = jax.export.deserialize(bytearray(payload))
    out = jax.tree.unflatten(decode_tree(head["out_tree"]), exported.call(jnp.arange(3.0)))
    np.testing.assert_array_equal(out["y"], [0.0, 2.0, 4.0])


def test_trees_round_trip_through_json():
    from jaxspec.decode.result import GenerateResult  # noqa: F401 (a jaxspec class in a tree)
    from jaxspec.nn.cache import KVCache

    cache = KVCache(jnp.zeros((1, 1, 2, 1, 1)), jnp.zeros((1, 1, 2, 1, 1)), jnp.zeros((1,), jnp.int32))
    for tree in [(1, (2, None), {"a": 3, "b": [4, 5]}), 7, None, (), {"cache": cache}]:
        td = jax.tree.structure(tree)
        assert decode_tree(json.loads(json.dumps(encode_tree(td)))) == td


def test_a_class_outside_jaxspec_is_refused_before_it_is_imported(store):
    """A file naming another module's class (here one never imported) is read as damaged:
    traced again, with a warning, and the module stays unimported."""
    f = StoredFunction(double, "double", "v1")
    f(jnp.arange(3.0))
    (path,) = store.glob("*" + SUFFIX)
    magic, header, payload = path.read_bytes().split(b"\n", 2)
    head = json.loads(header)
    head["out_tree"] = ["xdrlib:Packer", None, []]
    path.write_bytes(magic + b"\n" + json.dumps(head).encode() + b"\n" + payload)
    assert "xdrlib" not in sys.modules
    again = Counted(double)
    with pytest.warns(RuntimeWarning, match="could not be read"):
        got = StoredFunction(again, "double", "v1")(jnp.arange(3.0))
    assert again.traces == 1 and "xdrlib" not in sys.modules
    np.testing.assert_array_equal(got["y"], [0.0, 2.0, 4.0])


class Foreign:
    """A pytree node of the caller's: a program returning one is not stored."""


jax.tree_util.register_pytree_node(Foreign, lambda x: ((), None), lambda aux, ch: Foreign())


def test_a_program_returning_a_callers_class_is_not_stored(store):
    with pytest.raises(TypeError, match="not a builtin container or a jaxspec class"):
        encode_tree(jax.tree.structure(Foreign()))
    with pytest.warns(RuntimeWarning, match="could not be serialized"):
        StoredFunction(lambda x: (x, Foreign()), "foreign", "v1")(jnp.arange(3.0))
    assert list(store.glob("*" + SUFFIX)) == []


def test_xla_flags_are_part_of_the_key(store, monkeypatch):
    """Another XLA_FLAGS may compile another program: it is another file, traced anew."""
    first = Counted(double)
    StoredFunction(first, "double", "v1")(jnp.arange(3.0))
    with monkeypatch.context() as m:  # the caller's XLA_FLAGS (tests/conftest.py sets one) come back after it
        m.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_fast_math=false")
        second = Counted(double)
        StoredFunction(second, "double", "v1")(jnp.arange(3.0))
    assert first.traces == 1 and second.traces == 1 and len(list(store.glob("*" + SUFFIX))) == 2
    third = Counted(double)
    StoredFunction(third, "double", "v1")(jnp.arange(3.0))
    assert third.traces == 0  # the first file again
