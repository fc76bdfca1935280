"""min-p: the warp (literal examples, transformers' MinPLogitsWarper as the reference), the
Sampling value that carries it, and the law of speculative generation under it (χ² against
the exact law, with the power to see min-p itself)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.core.sampling import Warp, warp_probs
from jaxspec.core.settings import Sampling, draft_law
from jaxspec.decode import generate as gen
from jaxspec.exactness import stats
from tests._tiny import exact_joint, tiny_pair

# ---------------------------------------------------------------------------- the warp


def test_min_p_literal_examples():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    # 0.4 * 0.5 = 0.2: keeps 0.5 and 0.3
    np.testing.assert_allclose(warp_probs(logits, min_p=0.4), [5 / 8, 3 / 8, 0, 0], rtol=1e-6)
    # a token exactly at the bound stays (>=): 0.3 = 0.6 * 0.5
    np.testing.assert_allclose(warp_probs(logits, min_p=0.6), [5 / 8, 3 / 8, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(warp_probs(logits, min_p=0.0), [0.5, 0.3, 0.15, 0.05], rtol=1e-6)
    np.testing.assert_allclose(warp_probs(logits, min_p=1.0), [1, 0, 0, 0])  # the most likely only


def test_min_p_reads_the_law_after_temperature_and_top_k():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    # temperature 2: p ∝ sqrt(p) = [.707, .548, .387, .224]; 0.5 * .707 = .354: keeps three
    got = warp_probs(logits, temperature=2.0, min_p=0.5)
    w = np.sqrt([0.5, 0.3, 0.15])
    np.testing.assert_allclose(got, [*(w / w.sum()), 0], rtol=1e-5)
    # top-k first, then min-p on what is left (the ratio to the most likely is unchanged)
    np.testing.assert_allclose(warp_probs(logits, top_k=2, min_p=0.7), [1, 0, 0, 0])


def test_min_p_keeps_exact_ties_of_the_most_likely():
    logits = jnp.log(jnp.array([0.4, 0.4, 0.2]))
    np.testing.assert_allclose(warp_probs(logits, min_p=1.0), [0.5, 0.5, 0])


@pytest.mark.real
def test_min_p_matches_transformers():
    """The same kept set and law as transformers' MinPLogitsWarper after its temperature,
    top-k and top-p warpers (the order generate(do_sample=True) applies them)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    for trial in range(20):
        logits = rng.normal(size=(4, 50)).astype(np.float32) * 3
        t, k, p, m = 0.8, [None, 10][trial % 2], [None, 0.9][trial // 2 % 2], float(rng.uniform(0.02, 0.5))
        x = torch.tensor(logits)
        for warper in (tf.TemperatureLogitsWarper(t), *([tf.TopKLogitsWarper(k)] if k else []),
                       *([tf.TopPLogitsWarper(p)] if p else []), tf.MinPLogitsWarper(m)):
            x = warper(None, x)
        ref = torch.softmax(x, dim=-1).numpy()
        got = np.asarray(warp_probs(jnp.asarray(logits), temperature=t, top_k=k, top_p=p, min_p=m))
        np.testing.assert_array_equal(got > 0, ref > 0, err_msg=f"trial {trial}: kept sets differ")
        np.testing.assert_allclose(got, ref, atol=1e-6)


# ---------------------------------------------------------------------------- Sampling


def test_sampling_validates_each_field_by_name():
    for kw, message in ((dict(temperature=-1.0), "temperature = -1.0: expected a finite number >= 0"),
                        (dict(top_k=0), "top_k = 0: expected an integer >= 1"),
                        (dict(top_p=0.0), r"top_p = 0.0: expected a number in \(0, 1\]"),
                        (dict(min_p=1.5), r"min_p = 1.5: expected a number in \[0, 1\]"),
                        (dict(min_p="0.1"), "min_p = '0.1': expected a number")):
        with pytest.raises(jaxspec.SettingError, match=message) as e:
            Sampling(**kw)
        assert e.value.settings == kw and isinstance(e.value, ValueError)


def test_sampling_is_a_hashable_value_whose_neutral_warps_compile_one_program():
    assert Sampling(temperature=1, top_k=np.int64(3)) == Sampling(temperature=1.0, top_k=3)
    assert hash(Sampling(min_p=0.1)) == hash(Sampling(min_p=0.1))
    assert Sampling(top_p=1.0, min_p=0.0).warp == Sampling().warp == Warp()
    assert Sampling(min_p=0.1).warp == Warp(min_p=0.1)
    with pytest.raises(AttributeError):
        Sampling().temperature = 0.5  # frozen


def test_a_bare_number_for_sampling_is_refused_with_the_fix():
    target, draft = tiny_pair(0, vocab_size=4)
    with pytest.raises(jaxspec.SettingError, match=r"sampling = 0.7: expected a jaxspec.Sampling, e.g. "
                                                   r"jaxspec.Sampling\(temperature=0.7\)"):
        jaxspec.generate(jax.random.key(0), target, draft, [[1, 2]], max_new_tokens=2, sampling=0.7)


def test_draft_law_inherits_the_target_law_only_under_the_sampling_schemes():
    law = Sampling(temperature=0.7, top_k=3, min_p=0.1)
    assert draft_law("iid", law, None) is law
    assert draft_law("without_replacement", law, None) is law
    assert draft_law("deterministic", law, None) == Sampling()
    mine = Sampling(temperature=1.5)
    assert draft_law("iid", law, mine) is mine and draft_law("deterministic", law, mine) is mine


# ---------------------------------------------------------------------------- the law of generate

V, L, PROMPT = 6, 3, [1, 2]
N = 1 << 16
CHUNK = 1 << 14
ALPHA = 1e-3  # set before looking


def _joint_counts(target, draft, sampling, seed, **kw):
    cell = V ** np.arange(L - 1, -1, -1)
    counts = np.zeros(V**L, np.int64)
    prompts = np.tile(np.asarray([PROMPT], np.int32), (CHUNK, 1))
    for i in range(N // CHUNK):
        out = gen.generate(jax.random.fold_in(jax.random.key(seed), i), target, draft, prompts, max_new_tokens=L,
                           sampling=sampling, stop_tokens=(), **kw)
        toks = np.asarray(out.tokens)
        counts += np.bincount(toks @ cell, minlength=V**L)
    return counts


@pytest.mark.parametrize("tree,scheme", [("branch:2,2", "without_replacement"), ("chain:3", "iid")])
def test_speculative_law_under_min_p_is_the_exact_law(tree, scheme):
    """2^16 speculative samples of 3 tokens at min-p 0.15 (the draft drafts with the same
    law, generate's default) fit the exact min-p law; the law without min-p is rejected at
    the same count, so the test has the power to see the warp."""
    target, draft = tiny_pair(0, vocab_size=V, mix=0.5, head_scale=3.0)
    law = Sampling(temperature=1.0, min_p=0.15)
    exact = exact_joint(target, PROMPT, L, min_p=0.15)
    without = exact_joint(target, PROMPT, L)
    assert (exact == 0).sum() > (without == 0).sum()  # min-p cuts cells at this prompt
    counts = _joint_counts(target, draft, law, seed=7, tree=tree, scheme=scheme)
    fit = stats.chisquare_gof(counts, exact)
    assert fit.pvalue > ALPHA, fit
    assert stats.chisquare_gof(counts, without).pvalue < 1e-12


def test_a_draft_law_other_than_the_target_law_keeps_the_target_law():
    """min-p on the draft only: the draft proposes from its own warped law, the output law
    is still the target's (top-k 4 here), as verify's harness tests it."""
    r = jaxspec.verify(sampling=Sampling(temperature=1.0, top_k=4), draft_sampling=Sampling(min_p=0.3),
                       tree="branch:2,2", scheme="without_replacement", num_samples=1 << 16, seed=3,
                       progress=False, prompt_bucket=None)
    assert r.passed, r.summary()
    assert r.config["draft_min_p"] == 0.3 and r.config["min_p"] is None
