"""jaxspec.tuning.autotree: the table and the choice with injected figures, timings of real
jitted pieces on tiny random models, the on-disk cache, and argument validation."""

import json
import types

import jax
import numpy as np
import pytest

from jaxspec import Sampling
from jaxspec.tuning import autotree, round_timing
from jaxspec.tuning.autotree import (
    AutoTreeResult,
    RoundCost,
    auto_tree,
    default_cache_dir,
    measure_round_cost,
    measure_target_step,
    tabulate,
)
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import init_model
from jaxspec.tuning.optimize import optimize_tree
from jaxspec.core.treespec import StaticTree, parse_tree

# --------------------------------------------------------------------------- the choice


def _linear_cost(base_s, per_node_s, per_level_s=0.0):
    def cost(tree: StaticTree) -> RoundCost:
        verify = base_s + per_node_s * tree.num_nodes
        return RoundCost(verify_s=verify, round_s=verify + per_level_s * tree.depth)

    return cost


def test_docstring_example():
    res = tabulate([0.8], (1, 2, 4), 8, _linear_cost(1e-3, 1e-4), 1e-3)
    assert [r.budget for r in res.rows] == [1, 2, 4]
    np.testing.assert_allclose([r.predicted_tau for r in res.rows], [1.8, 2.44, 3.3616])
    np.testing.assert_allclose([r.round_s for r in res.rows], [1.1e-3, 1.2e-3, 1.4e-3])
    assert res.budget == 4 and res.parents == (-1, 0, 1, 2)
    assert res.predicted_speedup == pytest.approx(3.3616 / 1.4)
    assert res.tokens_per_s == pytest.approx(3.3616 / 1.4e-3)
    assert "*    4" in res.table()


@pytest.mark.parametrize("acceptance", [[0.6, 0.2, 0.1], [0.8, 0.05], [0.3, 0.3, 0.3]])
@pytest.mark.parametrize("per_node", [1e-5, 2e-4, 1e-3, 5e-3])
def test_choice_is_the_argmax_of_predicted_tokens_per_second(acceptance, per_node):
    """Independent recomputation: tau from optimize_tree, round time from the injected
    cost; the chosen row is the argmax of tau / round_s, and cheap nodes favour big trees
    while expensive ones favour small trees."""
    budgets = (1, 2, 3, 5, 8, 13, 21)
    cost = _linear_cost(1e-3, per_node, per_level_s=2e-4)
    res = tabulate(acceptance, budgets, 6, cost, 2e-3)
    want = []
    for n in budgets:
        opt = optimize_tree(acceptance, n, 6)
        rc = cost(StaticTree.from_parents(opt.parents))
        want.append(opt.expected_tokens / rc.round_s)
    got = [r.tokens_per_s for r in res.rows]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert res.budget == budgets[int(np.argmax(want))]
    np.testing.assert_allclose([r.speedup for r in res.rows], np.asarray(want) * 2e-3)
    if per_node == 1e-5:
        assert res.budget >= 8
    if per_node == 5e-3:
        assert res.budget <= 2


def test_ties_go_to_the_smaller_budget():
    # acceptance only at rank 0 and depth <= 1: every budget has tau 1.8 and equal cost
    res = tabulate([0.8], (4, 1, 2), 1, lambda tree: RoundCost(1.0, 1.0), 1.0)
    assert res.budget == 1 and [r.budget for r in res.rows] == [1, 2, 4]


def test_round_trip_dict():
    res = tabulate([0.6, 0.2], (2, 4), 3, _linear_cost(1e-3, 1e-4), 1e-3)
    back = AutoTreeResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(budgets=()), r"budgets: expected a non-empty sequence"),
        (dict(budgets="4"), r"budgets: expected a non-empty sequence"),
        (dict(budgets=(2, 0)), r"budgets\[1\] = 0: expected an integer node count >= 1"),
        (dict(budgets=(2, 2.5)), r"budgets\[1\] = 2.5"),
        (dict(budgets=(2, 2)), r"budgets: expected distinct node counts"),
        (dict(max_depth=0), r"max_depth: expected an integer >= 1, got 0"),
        (dict(target_step_s=0.0), r"target_step_s: expected seconds > 0"),
        (dict(round_cost=lambda t: RoundCost(1.0, 0.0)), r"round_cost: budget 2: round_s = 0.0"),
        (dict(acceptance=[0.9, 0.9]), r"acceptance: sums to 1.8"),
    ],
)
def test_tabulate_validation(kwargs, match):
    args = dict(acceptance=[0.5], budgets=(2, 4), max_depth=3,
                round_cost=lambda t: RoundCost(1.0, 1.0), target_step_s=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tabulate(**args)


def test_parse_tree_auto_says_it_needs_models():
    with pytest.raises(ValueError, match=r"tree spec 'auto': .*needs the models.*auto_tree"):
        parse_tree("auto")


# --------------------------------------------------------------------------- real timings

CFG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
DCFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
STREAM = np.random.default_rng(0).integers(0, 64, size=4096).astype(np.int32)


@pytest.fixture(scope="module")
def pair():
    return init_model(CFG, jax.random.key(0)), init_model(DCFG, jax.random.key(1))


class _JitSpy:
    """Stands in for the ``jax`` module inside jaxspec.autotree: everything is jax's own,
    but each ``jax.jit`` function remembers its last arguments by name, so the test can
    lower exactly what was timed and read XLA's cost analysis of it."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        return getattr(jax, name)

    def jit(self, fn, **kw):
        jitted = jax.jit(fn, **kw)

        def call(*args):
            self.calls[fn.__name__] = (jitted, args)
            return jitted(*args)

        return call

    def flops(self, name):
        jitted, args = self.calls[name]
        cost = jitted.lower(*args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older jax: [dict]
        return float(cost["flops"])


def test_costs_are_positive_and_grow_with_the_tree(pair, monkeypatch):
    """Timings positive and finite; the growth is asserted on what was timed, the XLA
    flop count of the compiled round and verify of the 32-node tree vs the 1-node one
    (deterministic, ~16x here), not on the times themselves (see below)."""
    target, draft = pair
    costs, flops = [], []
    for tree in ([-1], [-1] * 32):
        spy = _JitSpy()
        monkeypatch.setattr(round_timing, "jax", spy)
        costs.append(measure_round_cost(target, draft, tree, scheme="deterministic",
                                        context_len=64, loops=4, repeats=5))
        monkeypatch.undo()
        flops.append({name: spy.flops(name) for name in ("run_round", "run_verify")})
    for c in costs:
        assert np.isfinite(c.round_s) and c.round_s > 0
        assert np.isfinite(c.verify_s) and c.verify_s > 0
    small, big = flops
    for name in ("run_round", "run_verify"):  # 33 vs 2 tokens through the target
        assert big[name] > 4 * small[name] > 0, (name, small, big)
    # No ordering between measured times is asserted (e.g. the 32-node round slower than
    # the 1-node one): on a shared 2-core runner a 0.3 ms difference flips (CI, stop 15).
    # Speed is the benchmarks' business; the arithmetic of the timer is tested below.
    step = measure_target_step(target, context_len=64, loops=4, repeats=3)
    assert np.isfinite(step) and step > 0


def test_median_seconds_warms_up_then_takes_median_per_loop(monkeypatch):
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0, 30.0, 40.0, 50.0, 55.0])  # 3, 1, 2, 10, 5 s
    monkeypatch.setattr(round_timing, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    calls = []

    def fn(i):
        calls.append(i)
        return np.float32(i)

    assert round_timing.median_seconds(fn, loops=4, repeats=5) == pytest.approx(3.0 / 4)
    assert calls == [0, 1, 2, 3, 4, 5]  # one untimed warm-up (compilation), then 5 timed
    assert next(ticks, None) is None  # every timed call read the clock twice


def _auto(pair, tmp_path, **kw):
    target, draft = pair
    args = dict(scheme="deterministic", sampling=Sampling(temperature=1.0), budgets=(1, 3), max_depth=2,
                held_out_tokens=STREAM, num_windows=4, window_len=32, loops=2, repeats=1,
                context_len=64, cache_dir=tmp_path, progress=False)
    args.update(kw)
    return auto_tree(target, draft, **args)


def test_cache_miss_hit_retune(pair, tmp_path, monkeypatch):
    first = _auto(pair, tmp_path)
    assert not first.from_cache and first.cache_path is not None
    files = list(tmp_path.glob("autotree-*.json"))
    assert [str(f) for f in files] == [first.cache_path]
    assert first.budget in (1, 3) and len(first.rows) == 2
    assert first.parents == next(r.parents for r in first.rows if r.budget == first.budget)
    assert first.info["device_kind"] == jax.devices()[0].device_kind
    assert len(first.acceptance) == 3  # max_rank capped by the largest budget

    def no_measuring(*a, **k):
        raise AssertionError("a cache hit must not measure")

    monkeypatch.setattr(autotree, "measure_round_cost", no_measuring)
    monkeypatch.setattr(autotree, "measure_target_step", no_measuring)
    hit = _auto(pair, tmp_path)
    assert hit.from_cache and hit == first  # equality ignores from_cache / info
    with pytest.raises(AssertionError, match="must not measure"):
        _auto(pair, tmp_path, retune=True)
    with pytest.raises(AssertionError, match="must not measure"):  # other settings: a miss
        _auto(pair, tmp_path, sampling=Sampling(temperature=0.5))
    with pytest.raises(AssertionError, match="must not measure"):  # other held-out text
        _auto(pair, tmp_path, held_out_tokens=STREAM[::-1].copy())
    with pytest.raises(AssertionError, match="must not measure"):  # another rule: other round costs
        _auto(pair, tmp_path, rule="token")
    monkeypatch.undo()

    again = _auto(pair, tmp_path, retune=True)
    assert not again.from_cache and again.cache_path == first.cache_path
    none = _auto(pair, tmp_path / "off", use_cache=False, budgets=(1,))
    assert none.cache_path is None and not (tmp_path / "off").exists()


def test_cache_dir_from_environment(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    res = _auto(pair, None, budgets=(2,))
    assert res.cache_path.startswith(str(tmp_path / "env"))
    monkeypatch.delenv("JAXSPEC_CACHE_DIR")
    assert str(default_cache_dir()).endswith(".cache/jaxspec")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scheme="greedy"), r"scheme = 'greedy'; expected one of"),
        (dict(budgets=[]), r"budgets: expected a non-empty sequence"),
        (dict(budgets=[0, 2]), r"budgets\[0\] = 0"),
        (dict(budgets=[65]), r"budgets: 65 nodes could need more than vocab_size = 64"),
        (dict(scheme="iid"), r"key: scheme='iid' draws siblings at random"),
        (dict(max_depth=0), r"max_depth: expected an integer >= 1, got 0"),
        (dict(sampling=0.5), r"^sampling = 0.5: expected a jaxspec.Sampling, e.g. jaxspec.Sampling\(temperature=0.5\)"),
        (dict(draft_sampling=dict(top_k=2)), r"^draft_sampling = \{'top_k': 2\}: expected a jaxspec.Sampling"),
        (dict(context_len=4), r"context_len: expected 6 <= context_len <= 128"),
        (dict(context_len=500), r"context_len: expected 6 <= context_len <= 128"),
        (dict(window_len=200), r"window_len: 200 exceeds max_position_embeddings = 128"),
        (dict(held_out_tokens=STREAM.reshape(64, 64)), r"held_out_tokens: expected a 1-D integer"),
        (dict(held_out_tokens=STREAM + 64), r"held_out_tokens: expected token ids in \[0, 64\)"),
        (dict(held_out_tokens=STREAM[:8]), r"held_out_tokens: 8 tokens; expected at least"),
        (dict(held_out_tokens=None), r"held_out_tokens: required for a vocabulary of 64 tokens"),
        (dict(batch_size=0), r"batch_size: expected an integer >= 1, got 0"),
        (dict(rule="block"), r"^rule = 'block': a tree is chosen among branching trees and chains "
                             r"by timing named rules; expected rule 'auto' \(block verification on the chains among "
                             r"them\), 'token' or 'traversal' \(or a chain such as 'chain:4' with rule 'block'"),
        (dict(rule="greedy"), r"^rule = 'greedy': .*expected rule 'auto'"),
    ],
)
def test_auto_tree_validation(pair, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _auto(pair, tmp_path, **kwargs)


def test_auto_tree_model_validation(pair, tmp_path):
    target, draft = pair
    with pytest.raises(ValueError, match="target: expected a jaxspec.Transformer"):
        auto_tree("default-target", draft, scheme="deterministic")
    other = init_model(ModelConfig(vocab_size=65, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2), jax.random.key(2))
    with pytest.raises(ValueError, match="draft: vocab_size = 65; expected the target's vocab_size = 64"):
        auto_tree(target, other, scheme="deterministic")
    with pytest.raises(ValueError, match=r"context_len: 4 cache slots cannot hold a round of 3"):
        measure_round_cost(target, draft, [-1, 0, 1], scheme="deterministic", context_len=4)


# --------------------------------------------------------------------------- the rule that is timed


def test_timed_round_uses_the_rule_generate_uses(pair, monkeypatch):
    """The round measure_round_cost times runs the acceptance step generate compiles for
    the same tree, scheme and rule (build_config's acceptance step): with rule="auto", block
    verification on a chain and the token rule on a branching tree, not the token rule's
    parts everywhere (the defect: a chain was timed with the token rule, then generated with
    block verification)."""
    from jaxspec.core.token_rule import accept_core
    from jaxspec.core.block import block_accept
    from jaxspec.core.traversal import traversal_accept
    from jaxspec.decode.as_drafter import as_drafter
    from jaxspec.decode.generate import build_config

    target, draft = pair
    seen = []
    real = round_timing.speculative_round

    def spy(cfg, inputs):
        seen.append(cfg.accept)
        return real(cfg, inputs)

    monkeypatch.setattr(round_timing, "speculative_round", spy)
    cases = [([-1, 0, 1], "auto", block_accept), ([-1, -1, 0], "auto", accept_core),
             ([-1, 0, 1], "token", accept_core), ([-1, -1, 0], "traversal", traversal_accept)]
    for tree, rule, want in cases:
        seen.clear()
        measure_round_cost(target, draft, tree, scheme="deterministic", rule=rule, context_len=16,
                           loops=1, repeats=1)
        lib = build_config(target, as_drafter(draft)[0], prompt_length=2, max_new_tokens=4, tree=tree,
                           scheme="deterministic",
                           rule=rule)[0].accept
        assert seen and set(seen) == {want} and lib is want, (tree, rule, seen, lib)
    with pytest.raises(ValueError, match=r"rule = 'block': not supported on a branching static tree"):
        measure_round_cost(target, draft, [-1, -1], scheme="deterministic", rule="block", context_len=16)


def test_auto_tree_times_each_candidate_with_its_resolved_rule(pair, monkeypatch):
    """auto_tree passes its rule to every timed round, and each row of the table records the
    rule it was timed with, resolved for its tree (block on the chains, token elsewhere)."""
    from jaxspec.core.rules import resolve_rule

    rules_seen = []

    def fake_cost(target, draft, tree, **kw):
        rules_seen.append(kw["rule"])
        return RoundCost(1e-3, 1e-3 * (1 + tree.num_nodes))

    monkeypatch.setattr(autotree, "measure_round_cost", fake_cost)
    res = _auto(pair, None, use_cache=False, budgets=(1, 2, 4), max_depth=2)
    assert rules_seen == ["auto"] * 3
    assert [r.rule for r in res.rows] == [resolve_rule("auto", r.parents) for r in res.rows]
    assert res.rows[0].rule == "block" and res.rows[-1].rule == "token"  # (-1,) a chain; 4 nodes, depth 2: a tree
    assert " block " in res.table().splitlines()[1]
