"""Continuous batching (``generate(..., rows=R)``): R rows decode N > R prompts, an ended row
taking the next prompt of the queue inside the compiled loop.

Prompt j's randomness is ``fold_in(key, j)`` with its rounds counted from its own start, so
for a draft model or a feature head the result must be, field by field, that of decoding
all N prompts at once: the tests compare them exactly, at temperature 0 and 1, on ragged
prompts with a stop token (rows end in different rounds, so refills happen at different
times and into different rows). An n-gram draft's round choice (verify, or one target step
when no active row has a match) depends on the other rows, so its tokens are compared
with target-only at temperature 0 and its law is left to the statistical test
(tests/test_generate_exactness.py, the queue case, covers a draft model's law at T > 0).
"""

import os

import jax
import numpy as np
import pytest
from _tiny import tiny_head, tiny_pair

import jaxspec
from jaxspec.decode import generate as gen
from jaxspec.decode.as_drafter import as_drafter

V = 16
PROMPTS = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [3], [2, 2], [9, 1, 4], [6, 6, 6, 1, 2]]
STOP = (0,)


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_pair(3, vocab_size=V, hidden_size=16, num_heads=2, num_layers=2)
    return target, draft, tiny_head(target, 3)


def _fields(a, b):
    return {f: bool(np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))) for f in a._fields}


# each drafter at one temperature (the queue refills rows alike at both; the sampled law through
# the queue is test_generate_exactness's)
@pytest.mark.parametrize("temperature,drafter,tree", [(0.0, "draft", "branch:2,1"), (1.0, "head", "chain:3")])
def test_queue_equals_decoding_every_prompt_at_once(models, drafter, tree, temperature):
    target, draft, head = models
    d = draft if drafter == "draft" else head
    kw = dict(max_new_tokens=9, tree=tree, sampling=jaxspec.Sampling(temperature=temperature), stop_tokens=STOP)
    full = jaxspec.generate(jax.random.key(1), target, d, PROMPTS, **kw)
    lengths = np.asarray(full.lengths)
    assert len(set(lengths.tolist())) > 2 and lengths.min() < 9  # rows end at different times (stops)
    for rows in (1, 3):
        q = jaxspec.generate(jax.random.key(1), target, d, PROMPTS, rows=rows, **kw)
        assert _fields(full, q) == dict.fromkeys(full._fields, True), (rows, _fields(full, q))
    if temperature == 0.0:
        ar = jaxspec.generate_autoregressive(jax.random.key(1), target, PROMPTS, max_new_tokens=9,
                                             sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=STOP)
        np.testing.assert_array_equal(np.asarray(full.tokens), np.asarray(ar.tokens))


def test_queue_with_an_ngram_draft_is_greedy_target_only(models):
    target, _, _ = models
    kw = dict(max_new_tokens=9, tree="chain:2", sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=STOP)
    q = jaxspec.generate(jax.random.key(1), target, jaxspec.NgramDraft(), PROMPTS, rows=3, **kw)
    ar = jaxspec.generate_autoregressive(jax.random.key(1), target, PROMPTS, max_new_tokens=9,
                                         sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=STOP)
    np.testing.assert_array_equal(np.asarray(q.tokens), np.asarray(ar.tokens))
    np.testing.assert_array_equal(np.asarray(q.lengths), np.asarray(ar.lengths))
    assert (np.asarray(q.target_calls) <= np.asarray(q.lengths)).all()


def test_rows_at_least_the_prompts_is_the_plain_loop(models):
    """``rows >= N`` runs the plain loop: the same result as ``rows=None``."""
    target, draft, _ = models
    kw = dict(max_new_tokens=5, tree="chain:2", sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=STOP)
    plain = jaxspec.generate(jax.random.key(2), target, draft, PROMPTS[:3], **kw)
    for rows in (3, 8):
        same = _fields(plain, jaxspec.generate(jax.random.key(2), target, draft, PROMPTS[:3], rows=rows, **kw))
        assert all(same.values()), (rows, same)


def test_a_queue_row_is_refilled_with_its_own_prompt(models):
    """The rows that refill decode their own prompts: every prompt's statistics are its
    own (rounds >= 1, tokens in order), and a queue of one prompt repeated gives one law's
    rows with distinct draws (the keys are per prompt)."""
    target, draft, _ = models
    q = jaxspec.generate(jax.random.key(3), target, draft, [[1, 2]] * 12, rows=4, max_new_tokens=6, tree="chain:2",
                         sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=())
    toks = np.asarray(q.tokens)
    assert (np.asarray(q.lengths) == 6).all() and (toks >= 0).all()
    assert (np.asarray(q.rounds) >= 2).all() and (np.asarray(q.tau) <= 3).all()  # chain:2: <= 3 tokens a round
    assert len({tuple(r) for r in toks}) > 6  # independent draws, not one row copied


@pytest.mark.parametrize("kwargs, message", [
    ({"rows": 0}, "rows = 0: expected None or an integer >= 1"),
    ({"rows": 2.5}, "rows = 2.5: expected None or an integer >= 1"),
    ({"rows": 2, "on_round": lambda t, n: None}, "on_round streams the rows of one batch, and with continuous "
                                                 "batching a row changes prompts; expected on_round None (or rows None)"),
])
def test_bad_rows_are_refused(models, kwargs, message):
    target, draft, _ = models
    with pytest.raises(ValueError) as e:
        jaxspec.generate(jax.random.key(0), target, draft, PROMPTS, max_new_tokens=4, **kwargs)
    assert message in str(e.value), str(e.value)


def test_rows_refuse_a_mesh(models):
    target, draft, _ = models
    mesh = jaxspec.make_mesh(data=1)
    with pytest.raises(jaxspec.SettingError, match=r"^rows = 2 and mesh = .*: continuous batching runs on one device; "
                                                   r"expected mesh None"):
        gen.build_config(target, as_drafter(draft)[0], prompt_length=4, max_new_tokens=4, tree=2, mesh=mesh, rows=2)


def test_queue_benchmark_tiny(tmp_path):
    """``jaxspec bench --only queue --size tiny``: its rows, the prompts in order, and the
    headline speedups."""
    from jaxspec.bench import benchmark_module, run_benchmark

    report, files = run_benchmark("queue", "tiny", tmp_path)
    assert os.path.exists(files["json"]) and os.path.exists(files["png"])
    assert [r["mode"] for r in report["rows"]] == ["target-only", "draft batches", "draft queue", "head batches",
                                                   "head queue"]
    cfg = report["config"]
    for r in report["rows"]:  # every mode decodes every prompt to its budget (no stop tokens)
        assert r["num_tokens"] == cfg["num_prompts"] * cfg["max_new_tokens"] and r["tokens_per_s"] > 0
        assert r["tau"] >= 1.0 and (r["drafter"] is None) == (r["mode"] == "target-only")
    assert report["prompt_lens"] == [8 + (7 * i) % 40 for i in range(cfg["num_prompts"])]
    assert set(report["headline"]["queue_speedup"]) == {"1"}
    assert "| 1 | draft queue |" in benchmark_module("queue").table(report)
