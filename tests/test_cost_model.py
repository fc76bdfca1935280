"""The arithmetic of benchmarks/cost_model.py (a round's cost and the ideal speedup from
given timings), on literal examples: no model is loaded. The measured figures are in
benchmarks/results/cost_model.json."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cost_model.py"
_spec = importlib.util.spec_from_file_location("cost_model_script", SCRIPT)
cm = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cm  # dataclasses look their module up there
_spec.loader.exec_module(cm)

VERIFY = {1: 50.0, 2: 70.0, 4: 90.0, 8: 100.0}  # target forward of t tokens, ms
DRAFT = {1: 5.0, 2: 6.0, 4: 8.0}  # drafter forward of w tokens, ms


def test_interp_is_exact_at_points_linear_between_and_extrapolates():
    assert cm.interp(VERIFY, 4) == 90.0
    assert cm.interp(VERIFY, 5) == pytest.approx(92.5)
    assert cm.interp(VERIFY, 16) == pytest.approx(120.0)  # the slope of 4 -> 8 continued
    assert cm.interp({1: 3.0}, 7) == 3.0


def test_draft_forward_widths_per_kind():
    chain4, b321 = cm.tree_of("chain:4"), cm.tree_of("branch:3,2,1")
    assert cm.draft_forward_widths("model", chain4) == [2, 1, 1, 1]
    assert cm.draft_forward_widths("head", chain4) == [5, 1, 1, 1]
    assert cm.draft_forward_widths("model", b321) == [2, 3, 6]  # levels 3, 6, 6: the deepest not forwarded
    assert cm.draft_forward_widths("none", b321) == []


def test_round_cost_and_ideal_speedup_of_a_chain():
    c = cm.round_cost(VERIFY, DRAFT, "model", cm.tree_of("chain:4"))
    # draft 6 + 5 + 5 + 5 = 21 ms; verification of 5 tokens 92.5 ms; one step 50 ms
    assert c["draft_ms"] == pytest.approx(21.0)
    assert c["verify_ms"] == pytest.approx(92.5)
    assert c["round_units"] == pytest.approx(113.5 / 50.0)
    assert cm.ideal_speedup(3.0, c["round_units"]) == pytest.approx(3.0 * 50.0 / 113.5)


def test_round_cost_of_a_head_and_of_prompt_lookup():
    tree = cm.tree_of("branch:2,2")  # 6 nodes, levels 2 and 4
    head = cm.round_cost(VERIFY, DRAFT, "head", tree)
    assert head["draft_forwards"] == [3, 2]
    assert head["draft_ms"] == pytest.approx(7.0 + 6.0)  # width 3 between 2 and 4
    assert head["verify_ms"] == pytest.approx(97.5)  # 7 tokens: between 4 (90) and 8 (100)
    ngram = cm.round_cost(VERIFY, None, "none", tree, propose_ms=0.5)
    assert ngram["draft_ms"] == 0.5 and ngram["round_ms"] == pytest.approx(0.5 + 97.5)


def test_acceptance_calibration_reaches_the_tau_of_chain4():
    for tau in cm.TAUS:
        a = cm.alpha_for(tau)
        acc = cm.rank_acceptance(a)
        assert cm.model_tau(cm.tree_of("chain:4"), acc) == pytest.approx(tau, abs=1e-9)
        assert acc[0] == a and sum(acc) <= 1.0


def test_choice_prefers_a_short_chain_when_verification_is_costly():
    steep = {1: 50.0, 2: 100.0, 4: 200.0, 8: 400.0, 16: 800.0}  # verification linear in t: nothing pays
    ch = cm.choose(steep, {1: 5.0, 2: 6.0, 4: 8.0}, "model", 2.0)
    assert ch["best"]["ideal_speedup"] < 1.0
    assert ch["best_chain"]["tree"] == "chain:1"
    flat = {1: 50.0, 64: 51.0}  # verification free: the deepest, widest candidates win
    ch = cm.choose(flat, None, "none", 3.5, propose=lambda tree: 0.0)
    assert ch["best"]["ideal_speedup"] > ch["chain4"]["ideal_speedup"] > 3.0
