"""What ``jaxspec.generate`` compiles, read from the optimised HLO (no program is run).

Issue 51 point 8 asked whether the drafter protocol (d05255e) made the batch-8, T = 1
program of a draft model slower. The programs before and after it are the same
instructions (benchmarks/round_hlo.py, benchmarks/README.md "round_hlo"); this pins the one
structural difference the protocol could have brought: the ``lax.cond`` that skips the tree
when no row has a draft (``Proposal.has_draft``) exists only for a drafter that reports
``has_draft`` (prompt lookup), never around a draft model's tree.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest
from _tiny import tiny_pair

from jaxspec import NgramDraft, Sampling
from jaxspec.decode import generate as gen

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"))
from round_hlo import hlo_stats  # noqa: E402

V = 32


def _compiled_ops(target, draft, batch: int = 8) -> dict:
    """Opcode counts of the optimised program of ``generate(key, target, draft, ...)`` at
    batch ``batch``, T = 1, ``chain:4`` (the compiled function intercepted and lowered)."""
    prompts = np.random.default_rng(0).integers(0, V, size=(batch, 5)).tolist()
    prep = gen.prepare(target, draft, prompts, max_new_tokens=8, tree="chain:4", sampling=Sampling(temperature=1.0))
    tstate, dstate = prep.states
    args = (tstate, dstate, jax.random.key(0), prep.tokens, prep.lens, np.float32(1.0), np.float32(1.0),
            gen.stop_array(prep.stop_tokens))
    return hlo_stats(gen.compiled(prep.config).lower(*args).compile().as_text())["ops"]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(5, vocab_size=V, hidden_size=16, num_heads=2, num_kv_heads=1, num_layers=1)


def test_a_draft_models_tree_is_not_behind_a_cond(pair):
    target, draft = pair
    assert _compiled_ops(target, draft)["conditional"] == 0
    # the check can see one: prompt lookup's round is a lax.cond (verify the tree, or one target step)
    assert _compiled_ops(target, NgramDraft(max_ngram=2))["conditional"] >= 1
