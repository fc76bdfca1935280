"""Decoders written elsewhere (jaxspec/exactness/external.py): any sampler callable is tested
against a jaxspec model's law with the PIT and the hashed two-sample test. jaxspec's own
speculative decoder, wrapped as such a sampler, passes; the same decoder sampling at another
temperature, or with a mutant's broken round, is rejected; a sampler's bad output is named."""

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.exactness import mutants
from jaxspec.exactness.external import check_sampler
from jaxspec.exactness.harness import default_pair

PROMPT = [1, 2, 3]
N, L = 4096, 4
LAW = jaxspec.Sampling(temperature=1.0)


@pytest.fixture(scope="module")
def pair():
    return default_pair(0)


def _jaxspec_sampler(pair, sampling=LAW, **kw):
    target, draft = pair

    def speculative(prompt_ids, n, seed):
        out = jaxspec.generate(jax.random.key(seed), target, draft, np.tile([prompt_ids], (n, 1)), max_new_tokens=L,
                               sampling=sampling, stop_tokens=(), prompt_bucket=None, **kw)
        return np.asarray(out.tokens)

    return speculative


def test_a_lossless_sampler_passes(pair):
    r = check_sampler(_jaxspec_sampler(pair, tree="branch:2,2", scheme="iid"), pair[0], PROMPT, num_samples=N,
                      horizon=L, sampling=LAW, seed=0)
    assert r.passed, r.summary()
    assert r.config["num_samples"] == N and r.to_dict()["verdict"] == "passed"


@pytest.mark.parametrize("broken", ["temperature 1.2", "depth-row"])
def test_a_lossy_sampler_is_rejected(pair, broken):
    """p < 1e-6 at 4096 samples of 4 tokens (set before looking)."""
    if broken == "depth-row":
        sampler = _jaxspec_sampler(pair, tree="branch:2,2", scheme="iid", **mutants.decoder("depth-row"))
    else:
        sampler = _jaxspec_sampler(pair, sampling=jaxspec.Sampling(temperature=1.2))
    r = check_sampler(sampler, pair[0], PROMPT, num_samples=N, horizon=L, sampling=LAW, seed=0)
    assert not r.passed
    assert min(r.pit.min_pvalue, r.hashed.min_pvalue) < 1e-6, r.summary()


@pytest.mark.parametrize("output, message", [
    (np.zeros((3, 4), np.int32), r"sampler = 'bad': expected int\[8, >= 4\]"),
    (np.zeros((8, 2), np.int32), r"expected int\[8, >= 4\]"),
    (np.full((8, 4), 99), r"expected token ids in \[0, 4\)"),
    (np.full((8, 4), -1), r"expected token ids in \[0, 4\)"),
    (np.zeros((8, 4)), r"expected int\[8, >= 4\].*float64"),
])
def test_a_samplers_bad_output_is_named(pair, output, message):
    def bad(prompt_ids, n, seed):
        return output

    with pytest.raises(jaxspec.SettingError, match=message):
        check_sampler(bad, pair[0], PROMPT, num_samples=8, horizon=4)


def test_bad_arguments_are_named(pair):
    ok = _jaxspec_sampler(pair)
    for kw, message in ((dict(num_samples=1), "num_samples = 1"), (dict(horizon=0), "horizon = 0"),
                        (dict(prompt=[9]), r"prompt = \[9\]"), (dict(sampling=1.0), "sampling = 1.0")):
        args = dict(num_samples=8, horizon=2, prompt=PROMPT) | kw
        prompt = args.pop("prompt")
        with pytest.raises(jaxspec.SettingError, match=message):
            check_sampler(ok, pair[0], prompt, **args)
    with pytest.raises(jaxspec.SettingError, match="sampler = 3"):
        check_sampler(3, pair[0], PROMPT, num_samples=8, horizon=2)
