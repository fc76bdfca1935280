"""rule="auto", the default of generate and verify: block verification on a static chain, the
token rule on every other tree (docs/RULES.md)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from _tiny import tiny_pair

import jaxspec
from jaxspec.core import rules
from jaxspec.core.treespec import DynamicTree, parse_tree
from jaxspec.decode import generate as gen

PROMPTS = [[3, 1, 4, 1, 5], [2, 7]]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(3, vocab_size=8, hidden_size=16, num_heads=2, num_kv_heads=1, num_layers=2)


def test_resolve_rule():
    assert rules.resolve_rule("auto", parse_tree("chain:4")) == "block"
    assert rules.resolve_rule("auto", [-1, 0, 1]) == "block"
    assert rules.resolve_rule("auto", parse_tree("branch:2,2")) == "token"
    assert rules.resolve_rule("auto", DynamicTree(2, 2, 3)) == "token"
    assert rules.resolve_rule("traversal", parse_tree("chain:4")) == "traversal"
    assert rules.check_rule("auto", "iid", [-1, 0]) is rules.rule_function("block")
    assert rules.check_rule("auto", "deterministic", DynamicTree(2, 2, 3)) is rules.rule_function("token")
    assert rules.CHOICES == ("auto", "token", "block", "traversal")


@pytest.mark.parametrize("tree, resolved", [("chain:3", "block"), ("branch:2,1", "token")])
def test_generate_default_is_the_automatic_rule(pair, tree, resolved):
    """Same key: the default's tokens are those of the rule it resolves to (at temperature 1,
    where block and token differ on chains)."""
    target, draft = pair
    kw = dict(max_new_tokens=24, tree=tree, scheme="iid", sampling=jaxspec.Sampling(temperature=1.0))
    a = gen.generate(jax.random.key(3), target, draft, PROMPTS, **kw)
    b = gen.generate(jax.random.key(3), target, draft, PROMPTS, rule=resolved, **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    if resolved == "block":  # not a trivial agreement: the token rule takes other paths
        c = gen.generate(jax.random.key(3), target, draft, PROMPTS, rule="token", **kw)
        assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_verify_default_on_a_chain_is_block_and_checks_its_acceptance():
    r = jaxspec.verify(tree="chain:3", scheme="iid", num_samples=1 << 12, progress=False)
    assert r.config["rule"] == "block"
    assert r.acceptance_expected is not None  # block's own exact expectation, enumerated
    assert r.passed
