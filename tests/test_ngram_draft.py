"""Prompt lookup drafts (``jaxspec.NgramDraft``): literal drafts from small histories,
argument checks, greedy equality with target-only decoding on ragged batches, and tau on
a prompt that contains its own continuation. The end-to-end law at T > 0 and the mutants
on n-gram rounds are in tests/test_generate_exactness.py."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_pair

import jaxspec
from jaxspec import NgramDraft
from jaxspec.core.treespec import resolve_tree
from jaxspec.decode.ngram import NgramState, history, propose_ngram, sibling_ranks


def _propose(prompt, tree, draft=NgramDraft(), emitted=()):
    """Draft for one row whose prompt is ``prompt`` and output so far ``emitted``."""
    state = NgramState(jnp.asarray([prompt], jnp.int32), jnp.asarray([len(prompt)], jnp.int32))
    out = np.full((1, 8), -1, np.int32)
    out[0, : len(emitted)] = emitted
    toks, has = propose_ngram(draft, state, jnp.asarray(out), jnp.asarray([len(emitted)], jnp.int32),
                              resolve_tree(tree))
    return np.asarray(toks)[0].tolist(), bool(has[0])


# ------------------------------------------------------------------ literal drafts


def test_chain_copies_the_continuation_of_the_longest_match():
    # suffix "5 6" occurs at positions 0-1; the continuation 7 8 then runs into the suffix
    # itself and continues periodically: 5 6
    assert _propose([5, 6, 7, 8, 5, 6], 4) == ([7, 8, 5, 6], True)


def test_a_run_proposes_more_of_itself():
    assert _propose([1, 2, 2, 2], 3) == ([2, 2, 2], True)


def test_longer_match_ranks_before_a_more_recent_shorter_one():
    # "3 4" matches at 0-1 (-> 9), "4" alone more recently at 4 (-> 7): length wins
    assert _propose([3, 4, 9, 0, 4, 7, 3, 4], 1) == ([9], True)
    # min_ngram=2 ignores the single-token match; max_ngram=1 sees only lengths of 1,
    # and then the most recent wins
    assert _propose([3, 4, 9, 0, 4, 7, 3, 4], 1, NgramDraft(max_ngram=1)) == ([7], True)
    assert _propose([5, 4, 9, 0, 4, 7, 3, 4], 1, NgramDraft(min_ngram=2)) == ([0], False)


def test_emitted_tokens_are_part_of_the_history():
    # prompt 1 2 3, emitted 1 2: the suffix "1 2" matches the prompt's start
    assert _propose([1, 2, 3], 2, emitted=[1, 2]) == ([3, 1], True)


def test_root_siblings_are_distinct_matches_in_rank_order():
    # "1 2" is followed by 3 (oldest) and by 4 (most recent); "9 1 2" (length 3) precedes 4
    prompt = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    # tree (2, 2): nodes 0, 1 at depth 1; 2, 3 under node 0; 4, 5 under node 1
    toks, has = _propose(prompt, (2, 2))
    assert has
    assert toks[:2] == [4, 3]  # rank order: the longest match first
    assert toks[2] == 9 and toks[4] == 9  # each branch continues its own match
    assert toks[3] == 0 and toks[5] == 0  # no second continuation agrees with either path


def test_a_deeper_branch_offers_the_next_continuation_of_the_same_path():
    # after "1 2": 3 then 5 (positions 0-3) and 3 then 6 (positions 4-7); both matches have
    # length 2, so the more recent ranks first. Tree: node 0 under the root, nodes 1, 2 under it
    prompt = [1, 2, 3, 5, 1, 2, 3, 6, 0, 1, 2]
    toks, _ = _propose(prompt, "parents:-1,0,0")
    assert toks == [3, 6, 5]


def test_no_match_marks_the_row():
    assert _propose([1, 2, 3], 3) == ([0, 0, 0], False)
    assert _propose([7], 2) == ([0, 0], False)  # a one-token history has nothing earlier


def test_history_is_prompt_then_output():
    state = NgramState(jnp.asarray([[4, 5, 0], [6, 0, 0]], jnp.int32), jnp.asarray([2, 1], jnp.int32))
    out = jnp.asarray([[1, 2, -1], [3, -1, -1]], jnp.int32)
    hist, length = history(state, out, jnp.asarray([2, 1], jnp.int32))
    assert np.asarray(length).tolist() == [4, 2]
    assert np.asarray(hist)[0, :4].tolist() == [4, 5, 1, 2]
    assert np.asarray(hist)[1, :2].tolist() == [6, 3]


def test_sibling_ranks():
    assert sibling_ranks(resolve_tree((3, 2))).tolist() == [0, 1, 2, 0, 1, 0, 1, 0, 1]


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(max_ngram=0), r"NgramDraft.max_ngram = 0: expected an integer >= 1"),
        (dict(min_ngram=4, max_ngram=3), r"min_ngram = 4: expected at most max_ngram = 3"),
        (dict(candidates=2.5), r"candidates = 2.5"),
    ],
)
def test_bad_draft_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        NgramDraft(**kw)


def test_parse():
    from jaxspec.decode.draft_spec import parse_ngram  # noqa: PLC0415

    assert jaxspec.parse_draft("ngram") == NgramDraft()
    assert jaxspec.parse_draft("ngram:4") == NgramDraft(max_ngram=4)
    assert jaxspec.parse_draft("ngram:max=4,min=2,candidates=8") == NgramDraft(4, 2, 8)
    assert jaxspec.parse_draft(NgramDraft(5, 2, 16).spec) == NgramDraft(5, 2, 16)
    for bad, match in [("ngram:foo=1", "unknown field 'foo'"), ("ngram:max=x", "'x' is not an integer"),
                       ("ngram:min=5", "min_ngram = 5: expected at most"), ("lookup", "expected 'ngram'")]:
        with pytest.raises(ValueError, match=match):
            parse_ngram(bad)


@functools.lru_cache(maxsize=None)
def _pair():
    return tiny_pair(3, vocab_size=8, mix=0.5, head_scale=4.0)


def test_generate_refuses_what_an_ngram_draft_cannot_do():
    target, _ = _pair()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="scheme = 'iid': an n-gram draft proposes fixed tokens"):
        jaxspec.generate(key, target, NgramDraft(), [[1, 2]], max_new_tokens=4, scheme="iid")
    with pytest.raises(ValueError, match="a DynamicTree ranks a draft model's candidates"):
        jaxspec.generate(key, target, NgramDraft(), [[1, 2]], max_new_tokens=4, tree="dynamic:depth=2,topk=2,nodes=3")
    with pytest.raises(jaxspec.SettingError, match=r"^draft_sampling = Sampling\(temperature=0.5, .*\): an n-gram draft "
                                                   r"has no proposal law; expected None$"):
        jaxspec.generate(key, target, NgramDraft(), [[1, 2]], max_new_tokens=4,
                         draft_sampling=jaxspec.Sampling(temperature=0.5))
    with pytest.raises(ValueError, match="draft: expected a jaxspec.Transformer, a jaxspec.FeatureHead, a drafter .* "
                                         r"or a pair "
                                         r"\(drafter, params\), got str"):
        jaxspec.generate(key, target, "ngram", [[1, 2]], max_new_tokens=4)


# ------------------------------------------------------------------ generation


RAGGED = [[1, 2, 3, 1, 2], [4], [5, 6, 5, 6, 5, 6, 5], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]]
GREEDY = jaxspec.Sampling(temperature=0)


@pytest.mark.parametrize("tree", ["chain:4", "branch:3,1,1", "branch:2,2"])
@pytest.mark.parametrize("rule", ["auto", "token"])
def test_greedy_equals_target_only_on_a_ragged_batch(tree, rule):
    target, _ = _pair()
    key = jax.random.key(1)
    spec = jaxspec.generate(key, target, NgramDraft(), RAGGED, max_new_tokens=24, tree=tree, rule=rule,
                            sampling=GREEDY)
    base = jaxspec.generate_autoregressive(key, target, RAGGED, max_new_tokens=24, sampling=GREEDY)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
    assert np.asarray(spec.draft_calls).sum() == 0  # no draft model
    # a greedy tiny model falls into loops, which the lookup then drafts: more than 1 per call
    assert np.asarray(spec.lengths).sum() > 1.2 * np.asarray(spec.target_calls).sum()


def test_stop_tokens_end_rows_as_target_only_does():
    target, _ = _pair()
    key = jax.random.key(2)
    base = jaxspec.generate_autoregressive(key, target, RAGGED, max_new_tokens=24, sampling=GREEDY)
    stop = int(np.asarray(base.tokens)[0, 5])  # a token row 0 emits: it must end there
    spec = jaxspec.generate(key, target, NgramDraft(), RAGGED, max_new_tokens=24, sampling=GREEDY, stop_tokens=[stop])
    base = jaxspec.generate_autoregressive(key, target, RAGGED, max_new_tokens=24, sampling=GREEDY, stop_tokens=[stop])
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(base.lengths))
    assert int(spec.lengths[0]) <= 6


def test_rounds_without_any_match_emit_one_token_each():
    # min_ngram larger than anything the history can repeat: no round ever drafts, every
    # round is the one-token target step, and the tokens are still target-only's
    target, _ = _pair()
    key = jax.random.key(3)
    spec = jaxspec.generate(key, target, NgramDraft(max_ngram=40, min_ngram=40), [[1, 2, 3]], max_new_tokens=12,
                            sampling=jaxspec.Sampling(temperature=1.0))
    base = jaxspec.generate_autoregressive(key, target, [[1, 2, 3]], max_new_tokens=12,
                                           sampling=jaxspec.Sampling(temperature=1.0))
    assert int(spec.lengths[0]) == 12 == int(spec.target_calls[0])
    assert np.asarray(spec.accepted_per_depth).sum() == 0
    assert np.all(np.asarray(spec.tokens) >= 0) and np.all(np.asarray(base.tokens) >= 0)


def test_a_prompt_holding_its_continuation_gets_tau_well_above_one():
    """The default target, greedy: a prompt X + Y + X, where Y is the target's own greedy
    continuation of X, holds the text that follows; the lookup drafts it from there."""
    target = jaxspec.load_model("default-target")
    tok = jaxspec.ByteTokenizer()
    x = tok.encode("def parse(line):")
    key = jax.random.key(0)
    y = np.asarray(jaxspec.generate_autoregressive(key, target, [x], max_new_tokens=64, sampling=GREEDY).tokens)[0]
    ids = x + y.tolist() + x
    spec = jaxspec.generate(key, target, NgramDraft(), [ids], max_new_tokens=48, sampling=GREEDY)
    base = jaxspec.generate_autoregressive(key, target, [ids], max_new_tokens=48, sampling=GREEDY)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
    tau = float(spec.tau[0])
    print(f"tau {tau:.2f}: {tok.decode(np.asarray(spec.tokens)[0])!r}")
    assert tau > 2.5


# ------------------------------------------------------------------ command line


def _cli(capsys, *argv):
    from jaxspec.cli import main

    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_draft_ngram_equals_the_baseline_at_temperature_0(capsys):
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    flags = ["--prompt", prompt, "--temperature", "0", "--max-new-tokens", "16", "--json", "--no-compile-cache"]
    code, out, _ = _cli(capsys, "--draft", "ngram:max=4", *flags)
    assert code == 0
    spec = json.loads(out)
    code, out, _ = _cli(capsys, "--baseline", *flags)
    base = json.loads(out)
    assert spec["tokens"] == base["tokens"]
    assert spec["draft"] == "ngram:max=4,min=1,candidates=64" and spec["draft_calls"] == 0
    assert spec["scheme"] == "deterministic" and spec["rule"] == "block"


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--draft", "ngram", "--tree", "auto"], "--tree auto and --draft ngram: a tree is chosen by timing a draft model"),
        (["--draft", "ngram", "--scheme", "iid"], "--scheme iid: an n-gram draft proposes fixed tokens"),
        (["--draft", "ngram:min=9"], "--draft: draft spec = 'ngram:min=9': NgramDraft.min_ngram = 9"),
        (["--draft", "ngram", "--tree", "dynamic:depth=2,topk=2,nodes=3"],
         "--tree dynamic:depth=2,topk=2,nodes=3: a DynamicTree ranks a draft model's candidates"),
    ],
)
def test_cli_draft_ngram_refusals(capsys, argv, match):
    code, _, err = _cli(capsys, "--prompt", "x = 1", "--max-new-tokens", "4", *argv)
    assert code == 2 and match in err, err


def test_lookup_benchmark_tiny(tmp_path):
    from jaxspec.bench import benchmark_module, run_benchmark

    report, files = run_benchmark("lookup", "tiny", tmp_path)
    assert os.path.exists(files["json"]) and os.path.exists(files["png"])
    modes = {r["mode"] for r in report["rows"]}
    assert modes == {"target-only", "ngram chain:4", "draft chain:4"}
    assert {r["workload"] for r in report["rows"]} == {"grounded", "self", "code"}
    assert all(r["tau"] >= 1.0 and r["tokens_per_s"] > 0 for r in report["rows"])
    assert "| grounded |" in benchmark_module("lookup").table(report)
