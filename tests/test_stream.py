"""Streaming (``on_round=`` of generate / generate_autoregressive): the rounds run one call
each (``compiled_stream``), with the host calling ``on_round`` between them. The tokens
and statistics are those of the one-program loop, ``on_round`` sees each round once and in
order, and a new function object compiles nothing (no callback is part of a program, so
the programs can also be stored in JAX's persistent compilation cache)."""

import jax
import numpy as np
import pytest
from _tiny import DRAFTERS, assert_same_results, tiny_drafter, tiny_pair
from flax import nnx

from jaxspec import Sampling
from jaxspec.decode import generate as gen

V = 8
PROMPTS = [[3, 1, 4, 1, 5], [2], [6, 5, 3, 5, 0, 7, 2]]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(6, vocab_size=V, hidden_size=16, num_heads=2, num_kv_heads=1, num_layers=2)


class Recorder:
    """An ``on_round``: keeps a copy of every call's arguments."""

    def __init__(self):
        self.calls = []

    def __call__(self, tokens, lengths):
        assert isinstance(tokens, np.ndarray) and isinstance(lengths, np.ndarray)
        self.calls.append((tokens.copy(), lengths.copy()))


def _check_stream(plain, streamed, rec: Recorder):
    assert_same_results(plain, streamed)
    tokens, lengths = np.asarray(plain.tokens), np.asarray(plain.lengths)
    assert len(rec.calls) == plain.summary()["loop_rounds"]  # one call a round, the last when every row ended
    previous = np.zeros_like(lengths)
    for toks, n in rec.calls:
        assert toks.shape == tokens.shape and n.shape == lengths.shape
        assert (n >= previous).all() and (n > previous).any()  # each call: a new round, in order
        for row in range(len(n)):
            np.testing.assert_array_equal(toks[row, : n[row]], tokens[row, : n[row]])  # a prefix of the result
        previous = n
    np.testing.assert_array_equal(rec.calls[-1][1], lengths)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_streamed_generation_is_the_loop(pair, drafter, temperature):
    target, draft = pair
    draft = tiny_drafter(drafter, target, draft)
    kw = dict(max_new_tokens=12, tree="chain:3", sampling=Sampling(temperature=temperature), stop_tokens=(0,))
    plain = gen.generate(jax.random.key(11), target, draft, PROMPTS, **kw)
    rec = Recorder()
    streamed = gen.generate(jax.random.key(11), target, draft, PROMPTS, on_round=rec, **kw)
    _check_stream(plain, streamed, rec)
    assert len(set(np.asarray(plain.lengths).tolist())) > 1  # ragged ends: rows that end before others


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streamed_target_only_is_the_loop(pair, temperature):
    target, _ = pair
    kw = dict(max_new_tokens=12, sampling=Sampling(temperature=temperature), stop_tokens=(0,))
    plain = gen.generate_autoregressive(jax.random.key(12), target, PROMPTS, **kw)
    rec = Recorder()
    streamed = gen.generate_autoregressive(jax.random.key(12), target, PROMPTS, on_round=rec, **kw)
    _check_stream(plain, streamed, rec)


def test_a_branching_tree_streams_its_rounds(pair):
    target, draft = pair
    kw = dict(max_new_tokens=12, tree="branch:2,2", sampling=Sampling(temperature=1.0), stop_tokens=())
    plain = gen.generate(jax.random.key(13), target, draft, PROMPTS, **kw)
    rec = Recorder()
    _check_stream(plain, gen.generate(jax.random.key(13), target, draft, PROMPTS, on_round=rec, **kw), rec)
    assert (np.asarray(plain.lengths) == 12).all()  # rows end on the budget, in a round cut short


def test_new_function_objects_compile_nothing(pair, monkeypatch):
    """Every call passes a new lambda: the programs of the first call serve the others."""
    target, draft = pair
    real, handed = gen.compiled_stream, {}

    def watching(cfg):
        progs = real(cfg)
        handed[id(progs)] = progs
        return progs

    monkeypatch.setattr(gen, "compiled_stream", watching)

    def sizes():
        return sum(f.compiled_count() for p in handed.values() for f in (p.start, p.step, p.result))

    kw = dict(max_new_tokens=7, tree="chain:2", stop_tokens=())
    gen.generate(jax.random.key(0), target, draft, [[1, 2]], on_round=lambda t, n: None, **kw)
    gen.generate_autoregressive(jax.random.key(0), target, [[1, 2]], on_round=lambda t, n: None, max_new_tokens=7)
    first = sizes()
    assert len(handed) == 2 and first >= 3
    for seed in (1, 2):
        gen.generate(jax.random.key(seed), target, draft, [[1, 2]], on_round=lambda t, n: None, **kw)
        gen.generate_autoregressive(jax.random.key(seed), target, [[1, 2]], on_round=lambda t, n: None,
                                    max_new_tokens=7)
    assert len(handed) == 2 and sizes() == first


def test_the_round_program_has_no_host_callback(pair):
    """What keeps streaming out of the persistent compilation cache is a host callback in
    the program; the round program has none."""
    target, draft = pair
    from jaxspec.decode.as_drafter import as_drafter

    cfg, t, dt = gen.build_config(target, as_drafter(draft)[0], prompt_length=2, max_new_tokens=4, tree="chain:2")
    progs = gen.compiled_stream(cfg)
    tokens, lens = gen.prepare_prompts([[1, 2]], V)
    states = (nnx.state(target), nnx.state(draft))
    lp = progs.start(states, tokens, lens)
    leaves, treedef = jax.tree.flatten(states)
    hlo = progs.step.lower(leaves, treedef, jax.random.key(0), lp, np.float32(t), np.float32(dt),
                           gen.stop_array(())).as_text()
    assert "callback" not in hlo.lower()
