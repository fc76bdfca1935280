"""A user's drafter (tests/_user_drafter.py, written against the jaxspec.Drafter protocol
alone) works wherever the library's drafters do, and is held to the same law:

* greedy equality with target-only decoding, on a chain and a branching tree, ragged rows;
* continuous batching (``rows=``) and streaming (``on_round``) give the batch's tokens;
* the exactness harness (``jaxspec.verify``: joint and per-position χ² against the exact
  law, two-sample against target-only) passes it, and rejects the same drafter broken on
  purpose (it reports a law other than the one it draws from) with p < 1e-6;
* what it cannot serve is refused with its own message; what is not a drafter is refused
  naming what is missing.

The mesh case is in tests/test_mesh.py (the mesh worker runs the same drafter).
"""

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.core.treespec import DynamicTree
from jaxspec.decode import generate as gen
from jaxspec.exactness.harness import default_pair, verify

from _tiny import tiny_pair
from _user_drafter import Bigram, bigram_from, lying

PROMPTS = [[1, 2, 3], [4], [5, 6], [7, 1, 2, 3, 4]]
LAW_SAMPLES = 1 << 15
MUTANT_THRESH = 1e-6


@pytest.fixture(scope="module")
def pair():
    target, _ = tiny_pair(1, vocab_size=8, hidden_size=16, num_heads=2, num_layers=2, head_scale=3.0)
    return target, bigram_from(target, seed=0, noise=1.0)


@pytest.mark.parametrize("tree,scheme", [("chain:3", None), ("branch:2,2,1", "without_replacement"),
                                         ("branch:3,1", "iid")])
def test_greedy_equals_target_only(pair, tree, scheme):
    target, user = pair
    kw = dict(max_new_tokens=12, sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    spec = jaxspec.generate(jax.random.key(0), target, user, PROMPTS, tree=tree, scheme=scheme, **kw)
    ref = jaxspec.generate_autoregressive(jax.random.key(1), target, PROMPTS, **kw)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ref.tokens))
    s = spec.summary()
    assert s["draft_calls"] == 0  # Bigram.forwards: table lookups only
    assert s["tokens_per_target_call"] > 1.0, s  # it drafts something the target accepts


def test_rows_and_streaming_give_the_batch_tokens(pair):
    target, user = pair
    kw = dict(max_new_tokens=10, sampling=jaxspec.Sampling(temperature=1.0), tree="branch:2,1", stop_tokens=(5,))
    batch = jaxspec.generate(jax.random.key(3), target, user, PROMPTS, **kw)
    queued = jaxspec.generate(jax.random.key(3), target, user, PROMPTS, rows=2, **kw)
    seen = []
    streamed = jaxspec.generate(jax.random.key(3), target, user, PROMPTS, on_round=lambda t, n: seen.append(n), **kw)
    np.testing.assert_array_equal(np.asarray(queued.tokens), np.asarray(batch.tokens))
    np.testing.assert_array_equal(np.asarray(streamed.tokens), np.asarray(batch.tokens))
    assert len(seen) == int(np.asarray(batch.rounds).max())


@pytest.fixture(scope="module")
def law_pair():
    target, _ = default_pair(0)  # the harness's default target (V = 4)
    return target, bigram_from(target, seed=1, noise=1.5)


@pytest.mark.parametrize("tree,scheme", [("branch:2,2", "without_replacement"), ("chain:2", "iid")])
def test_exactness_harness_passes_the_user_drafter(law_pair, tree, scheme):
    target, user = law_pair
    r = verify(target, user, tree=tree, scheme=scheme,
               sampling=jaxspec.Sampling(temperature=1.0), num_samples=LAW_SAMPLES, seed=0,
               progress=False)
    print(r.summary())
    assert r.passed, r.summary()
    assert r.config["drafter"] == "Bigram"
    assert r.config["num_samples"] == LAW_SAMPLES
    joint = next(t for t in r.tests if t.name == "joint chi2 vs exact")
    assert joint.dof >= 10  # the test has cells to see a wrong law in


@pytest.mark.parametrize("tree", ["branch:2,2", "chain:2"])
def test_exactness_harness_rejects_a_lying_drafter(law_pair, tree):
    """The drafter draws its tokens from one law and hands the rule another: the output
    law is no longer the target's, and the harness must say so."""
    target, user = law_pair
    r = verify(target, lying(user), tree=tree, scheme="iid",  # unpadded: rejecting needs no padding, and compiles sooner
               sampling=jaxspec.Sampling(temperature=1.0), num_samples=LAW_SAMPLES, seed=0,
               check_acceptance=False, progress=False, prompt_bucket=None)
    joint = next(t for t in r.tests if t.name == "joint chi2 vs exact")
    print(tree, joint)
    assert not r.passed
    assert joint.pvalue < MUTANT_THRESH, joint


def test_refusals_name_the_problem(pair):
    target, user = pair
    k = jax.random.key(0)
    with pytest.raises(ValueError, match="BigramDraft drafts static trees"):
        jaxspec.generate(k, target, user, [[1]], max_new_tokens=2, tree=DynamicTree(depth=2, topk=2, num_nodes=3))
    small, _ = tiny_pair(0, vocab_size=4)
    with pytest.raises(ValueError, match="draft: vocab_size = 8; expected the target's 4"):
        jaxspec.generate(k, small, user, [[1]], max_new_tokens=2)

    class Mutable(Bigram):
        __hash__ = None  # as a dataclass that is not frozen: unhashable

    with pytest.raises(ValueError, match="draft: Mutable is not hashable; a drafter is part of the compiled"):
        jaxspec.generate(k, target, Mutable(8), [[1]], max_new_tokens=2)

    class Half:
        def propose(self, *a):
            pass

    with pytest.raises(ValueError, match="got Half without check, init, commit"):
        jaxspec.generate(k, target, Half(), [[1]], max_new_tokens=2)


def test_configuration_holds_the_drafter_and_its_cost(pair):
    target, user = pair
    drafter, params = user  # the pair generate takes: (drafter, params)
    cfg, _, _ = gen.build_config(target, drafter, prompt_length=3, max_new_tokens=4, tree="branch:2,2")
    assert cfg.draft_def == drafter and cfg.scheme == "without_replacement"
    assert cfg.draft_calls_per_round == 0
    assert params.shape == (8, 8)
    assert gen.store_text(cfg) is None  # a caller's class is known only by its name: never stored
