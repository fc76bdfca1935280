"""The program store (jaxspec/decode/program_store.py): traced programs kept on disk with
jax.export, so that a new process skips tracing and lowering. A stored program gives what
the plain ``jax.jit`` call gives, field by field; a process that finds its program does not
trace the function at all; keys tell configurations, shapes and static arguments apart;
unsound keys (lambdas, local functions, addresses, meshes, a caller's round parts) never
reach the folder; a damaged file is traced again. The command line's two-process checks
are in tests/test_compile_cache.py."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import DRAFTERS, assert_same_results, tiny_drafter, tiny_pair

from jaxspec import Sampling
from jaxspec.decode import generate as gen
from jaxspec.decode import program_store, programs
from jaxspec.decode.program_store import SUFFIX, StoredFunction, static_text
from jaxspec.core.token_rule import accept_core
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.decode.round import RoundParts

V = 8
PROMPTS = [[3, 1, 4, 1, 5], [2], [6, 5, 3, 5, 0, 7, 2]]


@pytest.fixture
def store(tmp_path):
    """The store in use in a fresh folder for one test; off again afterwards, with the
    module-level caches of compiled configurations emptied (a later test traces anew)."""
    folder = program_store.use_folder(tmp_path / "programs")
    gen.compiled.cache_clear()
    gen.compiled_stream.cache_clear()
    yield folder
    program_store.use_folder(None)
    gen.compiled.cache_clear()
    gen.compiled_stream.cache_clear()


def _files(folder):
    return sorted(p.name for p in folder.glob("*" + SUFFIX))


def module_level(x):
    return x


def module_level_rule(key, parents, tokens, target_probs, draft_probs, scheme):
    """A caller's acceptance step (the library's, under another name)."""
    return accept_core(key, parents, tokens, target_probs, draft_probs, scheme)


class Counted:
    """A function that counts how often it is traced (called with tracers)."""

    def __init__(self, fun):
        self.fun, self.traces = fun, 0
        functools.update_wrapper(self, fun)

    def __call__(self, *args):
        self.traces += 1
        return self.fun(*args)


def toy(key, x, n, state):
    """A key in and out, a static ``n``, a dict, and a donated ``state``."""
    k1, k2 = jax.random.split(key)
    return {"key": k1, "y": x * n + jax.random.uniform(k2, x.shape), "state": state + 1}


# ----------------------------------------------------------------------------- literals


def test_static_text_names_module_functions_without_their_address():
    assert static_text((module_level, 3)) == "(<function module_level>, 3)"
    assert static_text(("chain", 4, None)) == "('chain', 4, None)"


@pytest.mark.parametrize("unsound", [lambda x: x, "local", object(), "bound"])
def test_static_text_refuses_what_another_process_would_name_otherwise(unsound):
    def local(x):
        return x

    value = {"local": local, "bound": Counted(module_level).__call__}.get(unsound, unsound) \
        if isinstance(unsound, str) else unsound
    assert static_text((1, value)) is None


def test_store_text_refuses_meshes_and_a_callers_round_parts_or_rule():
    target, draft = tiny_pair(6, vocab_size=V, hidden_size=16, num_heads=2, num_kv_heads=1)
    kw = dict(prompt_length=5, max_new_tokens=4, tree="chain:2")
    draft = as_drafter(draft)[0]
    cfg, _, _ = gen.build_config(target, draft, **kw)
    assert gen.store_text(cfg) is not None  # the library's own parts: a sound key
    mine, _, _ = gen.build_config(target, draft, parts=RoundParts(verify_mask=module_level), **kw)
    assert gen.store_text(mine) is None
    assert gen.store_text(gen.build_config(target, draft, rule=accept_core, **kw)[0]) is not None  # the library's
    assert gen.store_text(gen.build_config(target, draft, rule=module_level_rule, **kw)[0]) is None  # a caller's
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    meshed, _, _ = gen.build_config(target, draft, mesh=mesh, **kw)
    assert gen.store_text(meshed) is None


# ----------------------------------------------------------------------------- a toy function


def _toy_args(n=3.0, size=4):
    return jax.random.key(1), jnp.arange(size, dtype=jnp.float32), n, jnp.zeros((2,), jnp.int32)


def _assert_toy_equal(a, b):
    np.testing.assert_array_equal(jax.random.key_data(a["key"]), jax.random.key_data(b["key"]))
    np.testing.assert_array_equal(a["y"], b["y"])
    np.testing.assert_array_equal(a["state"], b["state"])


def test_off_it_is_plain_jit(tmp_path):
    assert program_store.folder() is None  # off unless a folder is named
    f = StoredFunction(toy, "toy", "v1", static_argnums=(2,))
    _assert_toy_equal(f(*_toy_args()), jax.jit(toy, static_argnums=2)(*_toy_args()))
    assert f.lower(*_toy_args()).as_text() == jax.jit(toy, static_argnums=2).lower(*_toy_args()).as_text()


def test_a_stored_program_is_loaded_without_tracing_and_gives_the_same_results(store):
    want = jax.jit(toy, static_argnums=2)(*_toy_args())
    first = Counted(toy)
    got = StoredFunction(first, "toy", "v1", static_argnums=(2,), donate_argnums=(3,))(*_toy_args())
    _assert_toy_equal(got, want)
    assert first.traces == 1 and len(_files(store)) == 1
    assert jax.dtypes.issubdtype(got["key"].dtype, jax.dtypes.prng_key)  # a key comes back a key

    # a new function object, as in a new process: the program comes from the folder
    second = Counted(toy)
    f = StoredFunction(second, "toy", "v1", static_argnums=(2,), donate_argnums=(3,))
    _assert_toy_equal(f(*_toy_args()), want)
    _assert_toy_equal(f(*_toy_args()), want)
    assert second.traces == 0 and len(_files(store)) == 1

    # another static argument, another shape, another configuration text: three new programs
    f(*_toy_args(n=2.0))
    f(*_toy_args(size=5))
    StoredFunction(second, "toy", "v2", static_argnums=(2,))(*_toy_args())
    assert second.traces == 3 and len(_files(store)) == 4


@pytest.mark.parametrize("stored", [False, True])
def test_compiled_count_counts_one_program_per_signature(tmp_path, stored):
    program_store.use_folder(tmp_path / "programs" if stored else None)
    try:
        # a new function object: jax.jit's cache is shared by every jit of one function
        f = StoredFunction(Counted(toy), "toy", "v1", static_argnums=(2,))
        assert f.compiled_count() == 0
        f(*_toy_args())
        f(*_toy_args())
        assert f.compiled_count() == 1  # the same signature again: nothing new
        f(*_toy_args(size=5))
        f(*_toy_args(n=2.0))
        assert f.compiled_count() == 3
    finally:
        program_store.use_folder(None)


def test_donated_arguments_are_donated(store):
    f = StoredFunction(toy, "toy", "v1", static_argnums=(2,), donate_argnums=(3,))
    key, x, n, state = _toy_args()
    f(key, x, n, state)
    assert state.is_deleted() and not x.is_deleted()


def apply(fn, x):
    return fn(x)


def test_an_unsound_key_never_reaches_the_folder(store):
    f = StoredFunction(toy, "toy", None, static_argnums=(2,))  # no sound configuration text
    _assert_toy_equal(f(*_toy_args()), jax.jit(toy, static_argnums=2)(*_toy_args()))
    g = StoredFunction(apply, "apply", "v1", static_argnums=(0,))  # a lambda as a static argument
    np.testing.assert_array_equal(g(lambda x: x + 1, jnp.arange(3)), jnp.arange(1, 4))
    assert _files(store) == []


def test_a_damaged_file_is_traced_again(store):
    StoredFunction(toy, "toy", "v1", static_argnums=(2,))(*_toy_args())
    (path,) = store.glob("*" + SUFFIX)
    path.write_bytes(b"not a program")
    again = Counted(toy)
    with pytest.warns(RuntimeWarning, match="could not be read"):
        got = StoredFunction(again, "toy", "v1", static_argnums=(2,))(*_toy_args())
    _assert_toy_equal(got, jax.jit(toy, static_argnums=2)(*_toy_args()))
    assert again.traces == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rewritten whole: the next reader finds a good file
        third = Counted(toy)
        StoredFunction(third, "toy", "v1", static_argnums=(2,))(*_toy_args())
    assert third.traces == 0


# ----------------------------------------------------------------------------- the generation loops


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(6, vocab_size=V, hidden_size=8)  # one layer: these tests time compilations, not models


def _counted(monkeypatch, name):
    """Count the traces of ``name``, patched where the jitted programs look it up
    (jaxspec.decode.programs), so that a program loaded from the store shows 0."""
    counted = Counted(getattr(programs, name))
    monkeypatch.setattr(programs, name, counted)
    return counted


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_generate_through_the_store_is_the_plain_loop(pair, drafter, store, monkeypatch):
    """T = 1 (the temperature is an argument of the program, not part of its key)."""
    target, draft = pair
    draft = tiny_drafter(drafter, target, draft)
    kw = dict(max_new_tokens=10, tree="chain:3", sampling=Sampling(temperature=1.0), stop_tokens=(0,))
    program_store.use_folder(None)
    plain = gen.generate(jax.random.key(11), target, draft, PROMPTS, **kw)
    program_store.use_folder(store)
    gen.compiled.cache_clear()
    stored = gen.generate(jax.random.key(11), target, draft, PROMPTS, **kw)
    assert_same_results(plain, stored)
    assert len(_files(store)) == 1
    gen.compiled.cache_clear()  # as a new process: nothing in memory, the program on disk
    counted = _counted(monkeypatch, "speculative_program")
    loaded = gen.generate(jax.random.key(11), target, draft, PROMPTS, **kw)
    assert_same_results(plain, loaded)
    assert counted.traces == 0


def test_target_only_and_streaming_through_the_store(pair, store, monkeypatch):
    target, draft = pair
    kw = dict(max_new_tokens=10, sampling=Sampling(temperature=1.0), stop_tokens=(0,))
    program_store.use_folder(None)
    plain_ar = gen.generate_autoregressive(jax.random.key(3), target, PROMPTS, **kw)
    plain = gen.generate(jax.random.key(3), target, draft, PROMPTS, tree="chain:2", **kw)
    program_store.use_folder(store)
    for rep in range(2):  # stored, then loaded as in a new process
        gen.compiled.cache_clear()
        gen.compiled_stream.cache_clear()
        if rep:
            traced = [_counted(monkeypatch, n) for n in ("autoregressive_program", "spec_body", "spec_init")]
        assert_same_results(plain_ar, gen.generate_autoregressive(jax.random.key(3), target, PROMPTS, **kw))
        rounds = []
        streamed = gen.generate(jax.random.key(3), target, draft, PROMPTS, tree="chain:2",
                                on_round=lambda t, n: rounds.append(n.copy()), **kw)
        assert_same_results(plain, streamed)
        np.testing.assert_array_equal(rounds[-1], np.asarray(plain.lengths))
    assert [c.traces for c in traced] == [0, 0, 0]
    assert len(_files(store)) == 4  # the target-only loop; the stream's start, step and result


def test_verify_through_the_store_counts_the_same(pair, store, monkeypatch):
    """The harness's block programs (jaxspec.exactness.sample_counts) are stored too: a
    run that loads them traces no generation loop and counts the same samples."""
    from jaxspec.exactness import verify  # noqa: PLC0415

    target, draft = pair
    kw = dict(tree="chain:2", horizon=2, num_samples=3000, seed=5, progress=False)
    program_store.use_folder(None)
    plain = verify(target, draft, **kw)
    program_store.use_folder(store)
    stored = verify(target, draft, **kw)
    assert len(_files(store)) == 3  # speculative, target-only and first-round blocks
    # new program functions, as in a new process: their block programs come from the folder
    traced = [_counted(monkeypatch, n) for n in ("speculative_program", "autoregressive_program")]
    loaded = verify(target, draft, **kw)
    assert [c.traces for c in traced] == [0, 0] and len(_files(store)) == 3
    for report in (stored, loaded):
        for field in ("spec_counts", "ar_counts", "spec_marginals", "ar_marginals", "acceptance_observed"):
            np.testing.assert_array_equal(getattr(report, field), getattr(plain, field), err_msg=field)
        assert report.verdict == plain.verdict and report.tokens_per_round == plain.tokens_per_round
