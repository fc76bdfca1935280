"""Prompt-length buckets (``prompt_bucket=`` of generate / generate_autoregressive): prompts
padded to a multiple of the bucket share one compiled program, the padding never refuses a
generation that fits the models' positions, and the tokens are those of the unpadded
program."""

import jax
import numpy as np
import pytest
from _tiny import DRAFTERS, assert_same_results, tiny_drafter, tiny_pair

from jaxspec import Sampling
from jaxspec.decode import generate as gen

V = 8
PROMPTS = [[3, 1, 4, 1, 5], [2], [6, 5, 3, 5, 0, 7, 2]]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(5, vocab_size=V, hidden_size=16, num_heads=2, num_kv_heads=1, num_layers=2)


def test_bucket_width_literals():
    assert gen.bucket_width(5, 32, 1000) == 32
    assert gen.bucket_width(32, 32, 1000) == 32
    assert gen.bucket_width(33, 32, 1000) == 64
    assert gen.bucket_width(1, 1, 1000) == 1
    assert gen.bucket_width(33, 32, 10) == 43  # only the room the positions leave
    assert gen.bucket_width(33, 32, 0) == 33
    assert gen.bucket_width(33, None, 1000) == 33


def test_build_config_pads_the_prompts_and_the_capacity(pair):
    """build_config computes the cache capacity and the prompt bucket in one pass: the
    padded width (prompt_width) and the capacity grow together, within the positions."""
    from jaxspec.decode.as_drafter import as_drafter

    target, draft = pair
    drafter = as_drafter(draft)[0]
    tokens, lens = gen.prepare_prompts(PROMPTS, V)  # [3, 7]
    cfg, _, _ = gen.build_config(target, drafter, prompt_length=7, max_new_tokens=12, tree="chain:3")
    assert cfg.capacity == 7 + 12 + 3 + 1 == gen.cache_capacity(7, 12, cfg.tree) and cfg.prompt_width == 7
    bcfg, _, _ = gen.build_config(target, drafter, prompt_length=7, max_new_tokens=12, tree="chain:3", prompt_bucket=32)
    btokens = gen.pad_prompts(tokens, bcfg.prompt_width)
    assert btokens.shape == (3, 32) and btokens.dtype == np.int32
    np.testing.assert_array_equal(btokens[:, :7], tokens)
    assert not btokens[:, 7:].any()  # zeros, past every row's length
    assert bcfg.capacity == 32 + 12 + 3 + 1
    assert bcfg == cfg.__class__(**{**cfg.__dict__, "capacity": bcfg.capacity})  # nothing else changes
    # max_position_embeddings = 64: 40 new tokens leave room for 7 + 13 prompt columns, not 32
    near, _, _ = gen.build_config(target, drafter, prompt_length=7, max_new_tokens=40, tree="chain:3",
                                  prompt_bucket=32)
    assert near.prompt_width == 20 and near.capacity == 64
    ar, _ = gen.build_ar_config(target, prompt_length=7, max_new_tokens=12, prompt_bucket=32)
    assert ar.prompt_width == 32 and ar.capacity == 32 + 12
    assert gen.pad_prompts(tokens, 7) is tokens


@pytest.fixture
def new_programs(monkeypatch):
    """``count()``: programs compiled since the test began, through every function
    :func:`jaxspec.decode.generate.compiled` handed out (its jit cache: one entry per input
    shape), and ``configs``: how many distinct configurations asked for one."""
    real, before = gen.compiled, {}

    def watching(cfg):
        fn = real(cfg)
        before.setdefault(id(fn), (fn, fn.compiled_count()))  # the size before this call compiles
        return fn

    monkeypatch.setattr(gen, "compiled", watching)

    class Count:
        def __call__(self):
            return sum(fn.compiled_count() - n for fn, n in before.values())

        @property
        def configs(self):
            return len(before)

        def reset(self):
            before.clear()

    return Count()


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_prompts_of_one_bucket_share_one_program(pair, new_programs, mode):
    target, draft = pair

    def run(prompt, bucket):
        if mode == "speculative":
            return gen.generate(jax.random.key(0), target, draft, [prompt], max_new_tokens=9, tree="chain:2",
                                sampling=Sampling(temperature=1.0), prompt_bucket=bucket)
        return gen.generate_autoregressive(jax.random.key(0), target, [prompt], max_new_tokens=9, prompt_bucket=bucket)

    lengths = (1, 4, 9, 16)
    for n in lengths:
        run([1] * n, 16)
    assert new_programs.configs == 1 and new_programs() == 1  # one configuration, one input shape
    new_programs.reset()
    for n in (2, 5):
        run([1] * n, None)
    assert new_programs.configs == 2 and new_programs() == 2  # one program per length


def _assert_bucketed_is_unpadded(target, draft, tree, temperature, seed):
    """generate with PROMPTS padded to a 32-column bucket and unpadded: the same results."""
    kw = dict(max_new_tokens=12, tree=tree, sampling=Sampling(temperature=temperature), stop_tokens=(0,))
    outs = [gen.generate(jax.random.key(seed), target, draft, PROMPTS, prompt_bucket=b, **kw) for b in (None, 32)]
    assert_same_results(*outs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_bucketed_tokens_are_the_unpadded_tokens(pair, temperature, drafter):
    target, draft = pair
    _assert_bucketed_is_unpadded(target, tiny_drafter(drafter, target, draft), "chain:3", temperature, seed=7)


def test_bucketed_branching_tree_tokens_are_the_unpadded_tokens(pair):
    """T = 1 on a branching tree: with the chains above, the configurations whose law
    tests/test_generate_exactness.py shows on the unpadded program."""
    target, draft = pair
    _assert_bucketed_is_unpadded(target, draft, "branch:2,2", 1.0, seed=9)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bucketed_target_only_tokens_are_the_unpadded_tokens(pair, temperature):
    target, _ = pair
    outs = [gen.generate_autoregressive(jax.random.key(8), target, PROMPTS, max_new_tokens=12,
                                        sampling=Sampling(temperature=temperature), prompt_bucket=b)
            for b in (None, 32)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
    np.testing.assert_array_equal(np.asarray(outs[0].lengths), np.asarray(outs[1].lengths))


def test_a_bucket_never_refuses_what_fits(pair):
    target, draft = pair
    # 7 + 50 + 3 + 1 = 61 <= 64 positions: fits unpadded; a 32-column bucket would not
    out = gen.generate(jax.random.key(0), target, draft, PROMPTS, max_new_tokens=50, tree="chain:3",
                       stop_tokens=())
    assert np.asarray(out.lengths).tolist() == [50, 50, 50]
    out = gen.generate_autoregressive(jax.random.key(0), target, PROMPTS, max_new_tokens=57, stop_tokens=())
    assert np.asarray(out.lengths).tolist() == [57, 57, 57]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "32", True])
def test_bad_bucket_is_refused(pair, bad):
    target, draft = pair
    with pytest.raises(ValueError, match=r"prompt_bucket = .*: expected an integer >= 1 or None"):
        gen.generate(jax.random.key(0), target, draft, [[1]], max_new_tokens=2, prompt_bucket=bad)
    with pytest.raises(ValueError, match=r"prompt_bucket = .*: expected an integer >= 1 or None"):
        gen.generate_autoregressive(jax.random.key(0), target, [[1]], max_new_tokens=2, prompt_bucket=bad)


def test_verify_tests_the_padded_program():
    """verify(prompt_bucket=32) samples the program generate runs by default (the 3-token
    prompt padded to 32 columns) and finds the target's law."""
    from jaxspec.exactness import verify

    report = verify(num_samples=2**15, progress=False, prompt_bucket=gen.PROMPT_BUCKET)
    assert report.config["prompt_bucket"] == gen.PROMPT_BUCKET
    assert report.verdict == "passed", report
    with pytest.raises(ValueError, match=r"prompt_bucket = 0: expected an integer >= 1 or None"):
        verify(num_samples=16, progress=False, prompt_bucket=0)
