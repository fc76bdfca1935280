"""Block verification (``rule="block"``) is exact, is the named rule, and its broken variants
are rejected.

Setup, fixed before looking (the conventions of tests/test_accept_exactness.py): bigram
tables over V = 4 tokens (``_ngram.bigram_tables(seed=1)``), chains of several rounds of a
4-token chain, the joint law of the first L = 5 emitted tokens over 2^20 chains per scheme:

* joint chi-square against the exact law, the L marginals, and a two-sample chi-square
  against target-only sampling, for every scheme (iid in the default suite, the others
  ``slow``; the one-round test below covers every scheme by default);
* the law of ONE round's emitted block (accepted tokens + extra token), 2^18 rounds,
  against its exact enumeration by the independent float64 reference
  (jaxspec/exactness/rule_laws.py, derived from shared/RULES.md);
* the mean tokens per round within 4 standard errors of block verification's exact
  expectation, and (stochastic drafts) more than 4 standard errors above the token rule's:
  the rule is block verification, not the token rule under another name;
* power: the three broken variants of jaxspec.exactness.mutants are rejected at p < 1e-6 by
  the one-round test, on tables where the enumeration puts each at TV >= 0.03 from the
  true law (draft far from the target: ``random_tables(0, 3, mix=0.8, alpha_target=0.3)``).

Family-wise alpha 1e-3, Bonferroni over NUM_TESTS p-values of this file.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ngram import (
    bigram_tables,
    count_joint,
    exact_joint,
    make_speculative_chain,
    make_target_only_chain,
    marginals,
)

import jaxspec
from jaxspec.core import sampling
from jaxspec.core.sampling import SCHEMES
from jaxspec.exactness import mutants
from jaxspec.exactness import rule_laws as exact
from jaxspec.exactness.stats import bonferroni, chisquare_gof, chisquare_two_sample

ALPHA_FAMILY = 1e-3
NUM_TESTS = 30  # 3 schemes x (joint, 5 marginals, two-sample) + 3 round laws = 24
THRESH = bonferroni(ALPHA_FAMILY, NUM_TESTS)
MUTANT_THRESH = 1e-6
V, L, C0 = 4, 5, 0
N_SAMPLES = 1 << 20
N_ROUNDS = 1 << 18
CHAIN = jaxspec.chain(4)
T_TAB, D_TAB = bigram_tables(seed=1, v=V)
block_accept = functools.partial(jaxspec.speculative_accept, rule="block")


def _draft_chain(key, d, c0, g, scheme):
    """The drafted tokens of one chain (drawn as generate's draft does) and their contexts."""
    toks, ctx = [], c0
    for i in range(g):
        tok, _ = sampling.draw(jax.random.fold_in(key, i), d[ctx], 1, scheme)
        toks.append(tok[0])
        ctx = tok[0]
    return jnp.stack(toks).astype(jnp.int32)


def _one_round_blocks(accept, t, d, g, scheme, num, seed):
    """``num`` single rounds from C0: int32[num, g + 1] emitted blocks (-1 padded)."""
    parents = jaxspec.chain(g)
    T, D = jnp.asarray(t, jnp.float32), jnp.asarray(d, jnp.float32)

    def one(key):
        kd, ka = jax.random.split(key)
        toks = _draft_chain(kd, D, C0, g, scheme)
        ctxs = jnp.concatenate([jnp.full((1,), C0, jnp.int32), toks])
        return accept(ka, parents, toks, T[ctxs], D[ctxs], scheme=scheme).tokens

    out = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(seed), num))
    return np.asarray(out)


def _block_counts(blocks, law):
    """Counts of the observed blocks in the cells of the exact law ``{block: prob}``; a
    block outside its support is a failure by itself."""
    cells = sorted(law)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells), np.int64)
    for row in blocks:
        b = tuple(int(x) for x in row if x >= 0)
        assert b in index, f"block {b} has probability 0 under the exact law"
        counts[index[b]] += 1
    return counts, np.asarray([law[c] for c in cells])


@functools.cache
def _target_only():
    chain = make_target_only_chain(T_TAB, length=L, c0=C0)
    return count_joint(chain, jax.random.key(54321), num_samples=N_SAMPLES, v=V, length=L)[0]


@pytest.mark.parametrize("scheme", ["iid"] + [pytest.param(s, marks=pytest.mark.slow) for s in SCHEMES[1:]])
def test_joint_law_matches_target(scheme):
    chain = make_speculative_chain(CHAIN, T_TAB, D_TAB, scheme=scheme, length=L, c0=C0, accept_fn=block_accept)
    counts, n = count_joint(chain, jax.random.key(800 + SCHEMES.index(scheme)), num_samples=N_SAMPLES, v=V,
                            length=L)
    assert n == N_SAMPLES
    exact_law = exact_joint(T_TAB, C0, L)
    results = {"joint": chisquare_gof(counts, exact_law)}
    for i, (m, e) in enumerate(zip(marginals(counts, V, L), marginals(exact_law, V, L))):
        results[f"marginal{i}"] = chisquare_gof(m, e)
    results["two_sample"] = chisquare_two_sample(counts, _target_only())
    for name, r in results.items():
        print(f"block/{scheme} {name}: {r}")
        assert r.pvalue > THRESH, f"block/{scheme} {name}: {r}\n{r.table()}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_law_and_mean_match_enumeration(scheme):
    g = 3
    t64, d64 = (np.asarray(x, np.float64) / np.asarray(x, np.float64).sum(axis=1, keepdims=True)
                for x in (T_TAB, D_TAB))  # float32 tables: rows renormalized in float64
    law = exact.round_law("block", exact.chain(g), t64, d64, C0, scheme)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    blocks = _one_round_blocks(block_accept, T_TAB, D_TAB, g, scheme, N_ROUNDS, seed=900 + SCHEMES.index(scheme))
    counts, probs = _block_counts(blocks, law)
    r = chisquare_gof(counts, probs)
    print(f"block/{scheme} one-round law: {r}")
    assert r.pvalue > THRESH, r.table()

    emitted = (blocks >= 0).sum(axis=1)
    mean, se = emitted.mean(), emitted.std(ddof=1) / np.sqrt(len(emitted))
    e_block = exact.expected_tokens("block", exact.chain(g), t64, d64, C0, scheme)
    e_token = exact.expected_tokens("token", exact.chain(g), t64, d64, C0, scheme)
    print(f"block/{scheme}: mean tokens {mean:.5f} +- {se:.5f}; exact block {e_block:.5f}, token {e_token:.5f}")
    assert abs(mean - e_block) < 4 * se
    if scheme == "deterministic":  # one-hot drafts: block verification is the token rule
        assert abs(e_block - e_token) < 1e-12
    else:
        assert e_block - e_token > 4 * se, "block verification should accept more than the token rule here"


MUTANT_T, MUTANT_D = exact.random_tables(0, 3, mix=0.8, alpha_target=0.3)
BLOCK_MUTANTS = {  # library mutant -> its name in the reference
    "block-unclipped": "block-noclip",
    "block-first-failure": "block-first-fail",
    "block-token-residual": "block-token-residual",
}


@pytest.mark.parametrize("mutant", list(BLOCK_MUTANTS))
def test_broken_block_rules_are_rejected(mutant):
    g = 3
    law = exact.round_law("block", exact.chain(g), MUTANT_T, MUTANT_D, C0, "iid")
    broken = exact.round_law(BLOCK_MUTANTS[mutant], exact.chain(g), MUTANT_T, MUTANT_D, C0, "iid")
    assert exact.tv(law, broken) > 0.03  # the witness the setup promised
    accept_fn = mutants.mutant_rule(mutant)

    def accept(key, parents, tokens, tp, dp, scheme):
        return accept_fn(key, parents, tokens, tp, dp, scheme)

    control = _one_round_blocks(block_accept, MUTANT_T, MUTANT_D, g, "iid", N_ROUNDS, seed=950)
    rc = chisquare_gof(*_block_counts(control, law))
    assert rc.pvalue > THRESH, rc.table()  # the same test passes the unbroken rule

    blocks = _one_round_blocks(accept, MUTANT_T, MUTANT_D, g, "iid", N_ROUNDS, seed=950)
    seen = {tuple(int(x) for x in row if x >= 0) for row in blocks}
    impossible = sorted(c for c in seen if law.get(c, 0.0) == 0.0)
    if impossible:  # a block the true rule never emits: the law is refuted outright (p = 0)
        print(f"mutant {mutant}: emits {len(impossible)} blocks of probability 0, e.g. {impossible[0]}")
        return
    r = chisquare_gof(*_block_counts(blocks, law))
    print(f"mutant {mutant}: {r}")
    assert r.pvalue < MUTANT_THRESH, r.table()


def test_block_refuses_branching_trees_and_traced_parents():
    p = jnp.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="rule = 'block': not supported on a branching static tree"):
        jaxspec.speculative_accept(jax.random.key(0), [-1, -1], jnp.array([1, 2]), p, p, scheme="iid", rule="block")
    with pytest.raises(ValueError, match="needs concrete parents"):
        jax.jit(lambda par: jaxspec.speculative_accept(
            jax.random.key(0), par, jnp.array([1, 2]), p, p, scheme="iid", rule="block"))(jnp.array([-1, 0]))
    with pytest.raises(ValueError, match="expected one of auto, token, block, traversal"):
        jaxspec.speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]), p, p, scheme="iid", rule="nope")


def test_block_equals_token_rule_when_draft_is_target():
    """p == q: every weight is 1, every stopping probability 1: the whole chain is accepted
    and the bonus drawn from the last row, as the token rule does."""
    p = jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(5), 4), jnp.float32)
    toks = jnp.array([1, 2, 3], jnp.int32)
    for key in jax.random.split(jax.random.key(3), 8):
        a = jaxspec.speculative_accept(key, [-1, 0, 1], toks, p, p, scheme="iid", rule="block")
        b = jaxspec.speculative_accept(key, [-1, 0, 1], toks, p, p, scheme="iid")
        assert int(a.num_tokens) == int(b.num_tokens) == 4
        assert a.tokens[:3].tolist() == [1, 2, 3]
