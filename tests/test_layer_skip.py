"""Self-speculation (``jaxspec.LayerSkipDraft``): the target's first K decoder layers, its
final norm and its LM head draft the tree, reading a copy of the target's own KV cache.
Held to the law every drafter is held to:

* greedy equality with target-only decoding on a tiny 3-layer target, ragged prompts, for
  K = 1 and 2 on a chain, a branching tree and a DynamicTree; K = 3 (all the layers: the
  draft *is* the target) accepts every drafted token (tau = depth + 1 on a chain);
* the exactness harness (``jaxspec.verify``: joint and per-position χ² against the exact
  law, two-sample against target-only) passes it on a 2-layer V = 4 target, on a static
  tree and a DynamicTree, with a seed and a sample count fixed in advance;
* the same harness rejects (p < 1e-6) the decoder broken by mutants that corrupt what the
  drafter reads: the target cache's committed slots (``bonus-kv-slot``) and the K/V the
  verification writes for the tree (``causal-mask``);
* what it cannot serve is refused with its own message, in the library and on the command
  line; ``jaxspec generate --draft layers:2`` at temperature 0 gives the baseline's tokens.

p-values are printed (``-s``).
"""

import functools
import json

import jax
import numpy as np
import pytest
from _tiny import tiny_pair

import jaxspec
from jaxspec import LayerSkipDraft
from jaxspec.core.treespec import DynamicTree, resolve_tree

NUM_LAYERS = 3  # the greedy target
PROMPTS = [[1, 2, 3], [4], [5, 6], [7, 1, 2, 3, 4]]  # ragged: 3, 1, 2 and 5 tokens
MAX_NEW = 12  # a multiple of depth + 1 = 4: every round of a fully accepted chain:3 emits 4 tokens
LAW_SAMPLES = 1 << 15  # fixed before any run
LAW_SEED = 0
MUTANT_THRESH = 1e-6


@functools.lru_cache(maxsize=None)
def _greedy_target():
    target, _ = tiny_pair(1, vocab_size=8, hidden_size=16, num_heads=2, num_layers=NUM_LAYERS, head_scale=3.0)
    return target


@functools.lru_cache(maxsize=None)
def _law_target():
    """A 2-layer V = 4 target: LayerSkipDraft(1) drafts with half of it."""
    target, _ = tiny_pair(0, vocab_size=4, hidden_size=16, num_heads=2, num_layers=2, head_scale=4.0)
    return target


@functools.lru_cache(maxsize=None)
def _reference():
    return jaxspec.generate_autoregressive(jax.random.key(1), _greedy_target(), PROMPTS, max_new_tokens=MAX_NEW,
                                           sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())


# ------------------------------------------------------------------ greedy equality

DYNAMIC = DynamicTree(depth=3, topk=2, num_nodes=5)
LONG = pytest.mark.long  # 15 s or more each here (also listed in tests/long_tests.txt)
GREEDY_CASES = [
    pytest.param(1, "chain:3", marks=LONG),
    pytest.param(2, "branch:2,2,1", marks=LONG),
    pytest.param(1, DYNAMIC, marks=LONG),
    (2, DYNAMIC),
    (NUM_LAYERS, "chain:3"),  # the whole target drafts: every drafted token is accepted
]


@pytest.mark.parametrize("layers,tree", GREEDY_CASES, ids=lambda x: str(x))
def test_greedy_equals_target_only(layers, tree):
    target = _greedy_target()
    draft = LayerSkipDraft(layers)
    spec = jaxspec.generate(jax.random.key(0), target, draft, PROMPTS, tree=tree, max_new_tokens=MAX_NEW,
                            sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    ref = _reference()
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ref.tokens))
    rounds = np.asarray(spec.rounds)
    resolved = resolve_tree(tree)
    # LayerSkipDraft.forwards: one forward of K layers per tree level (+1 for a dynamic tree)
    per_round = resolved.depth + (1 if isinstance(resolved, DynamicTree) else 0)
    np.testing.assert_array_equal(np.asarray(spec.draft_calls), per_round * rounds)
    s = spec.summary()
    tau = np.asarray(spec.tau)
    print(f"layers={layers} tree={tree}: tau per row {tau.round(2).tolist()}, tokens per target call "
          f"{s['tokens_per_target_call']:.3f}")
    if layers == NUM_LAYERS:
        assert resolved.depth == 3 and MAX_NEW % (resolved.depth + 1) == 0
        np.testing.assert_array_equal(tau, resolved.depth + 1)  # every draft accepted, every round
        np.testing.assert_array_equal(np.asarray(spec.target_calls), MAX_NEW // (resolved.depth + 1))
    else:
        assert s["tokens_per_target_call"] > 1.0, s  # the cut target drafts something the target accepts


# ------------------------------------------------------------------ the law


LAW_CASES = [("branch:2,2", "without_replacement"), (DynamicTree(depth=2, topk=2, num_nodes=4), "deterministic")]


@pytest.mark.long
@pytest.mark.parametrize("tree,scheme", LAW_CASES, ids=lambda x: str(x))
def test_exactness_harness_passes_layer_skip(tree, scheme):
    r = jaxspec.verify(_law_target(), LayerSkipDraft(1), tree=tree, scheme=scheme,
                       sampling=jaxspec.Sampling(temperature=1.0),
                       num_samples=LAW_SAMPLES, seed=LAW_SEED, check_acceptance=False, progress=False)
    print(r.summary())
    print("p-values: " + "; ".join(f"{t.name} {t.pvalue:.4g}" for t in r.tests))
    assert r.passed and r.verdict == "passed", r.summary()
    assert r.config["drafter"] == "LayerSkipDraft" and r.config["num_samples"] == LAW_SAMPLES
    joint = next(t for t in r.tests if t.name == "joint chi2 vs exact")
    assert joint.dof >= 10  # the test has cells to see a wrong law in
    assert r.tokens_per_round > 1.05  # the draft is accepted at times: the rule's paths are exercised


# mutants that break a branching tree and corrupt what LayerSkipDraft reads: the emitted
# token's K/V committed one slot early in the target's cache (the draft's prefix), and the
# tree verified (and its K/V written) under a causal mask, siblings leaking into each other
MUTANT_CASES = [("branch:2,2", "bonus-kv-slot"), ("branch:2,2", "causal-mask")]


@pytest.mark.long
@pytest.mark.parametrize("tree,mutant", MUTANT_CASES)
def test_exactness_harness_rejects_broken_layer_skip_decoders(tree, mutant):
    r = jaxspec.verify(_law_target(), LayerSkipDraft(1), tree=tree, scheme="without_replacement",
                       sampling=jaxspec.Sampling(temperature=1.0),
                       num_samples=LAW_SAMPLES, seed=LAW_SEED, mutant=mutant, check_acceptance=False, progress=False,
                       prompt_bucket=None)  # the power to reject needs no padding: the unpadded program compiles sooner
    joint = next(t for t in r.tests if t.name == "joint chi2 vs exact")
    print(f"mutant {mutant} on {tree}: joint p = {joint.pvalue:.4g} ({joint})")
    assert not r.passed
    assert joint.pvalue < MUTANT_THRESH, r.summary()


# ------------------------------------------------------------------ refusals


def test_bad_layers_are_refused():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=rf"LayerSkipDraft.layers = {bad!r}: expected an integer >= 1"):
            LayerSkipDraft(bad)
    with pytest.raises(ValueError, match=r"draft: layers = 4 \(LayerSkipDraft\): the target has 3 layers; "
                                         r"expected 1 .. 3"):
        jaxspec.generate(jax.random.key(0), _greedy_target(), LayerSkipDraft(NUM_LAYERS + 1), [[1]], max_new_tokens=2)
    with pytest.raises(jaxspec.SettingError, match=r"^scheme = 'iid' and tree = DynamicTree\(.*\): a dynamic tree "
                                                   r"ranks fixed candidates; expected scheme 'deterministic'"):
        jaxspec.generate(jax.random.key(0), _greedy_target(), LayerSkipDraft(1), [[1]], max_new_tokens=2,
                         tree=DYNAMIC, scheme="iid")


def test_parse():
    from jaxspec.decode.draft_spec import parse_layers  # noqa: PLC0415

    assert jaxspec.parse_draft("layers:2") == LayerSkipDraft(2)
    assert jaxspec.parse_draft(" Layers: 3 ") == LayerSkipDraft(3)
    assert jaxspec.parse_draft(LayerSkipDraft(5).spec) == LayerSkipDraft(5)
    for bad, match in [("layers:x", r"draft spec = 'layers:x': expected 'layers:K' with an integer K >= 1"),
                       ("layers:0", r"draft spec = 'layers:0': LayerSkipDraft.layers = 0: expected an integer >= 1"),
                       ("layers:", r"draft spec = 'layers:': expected 'layers:K' with an integer K >= 1"),
                       ("layer:2", r"draft spec = 'layer:2': expected 'layers:K' \(the target's first K layers")]:
        with pytest.raises(ValueError, match=match):
            parse_layers(bad)


# ------------------------------------------------------------------ command line


def _cli(capsys, *argv):
    from jaxspec.cli import main

    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--draft", "layers:2", "--tree", "auto"],
         "--tree auto and --draft layers:2: a tree is chosen by timing a draft model's trees; expected a tree such "
         "as 'chain:4' with this drafter"),
        (["--draft", "layers:x"], "--draft: draft spec = 'layers:x': expected 'layers:K' with an integer K >= 1"),
        (["--draft", "layers:0"], "--draft: draft spec = 'layers:0': LayerSkipDraft.layers = 0: expected an integer >= 1"),
        (["--draft", "layers:7"], "layers = 7 (LayerSkipDraft): the target has 6 layers; expected 1 .. 6"),
    ],
    ids=["tree-auto", "not-an-integer", "zero", "more-than-the-target"],
)
def test_cli_draft_layers_refusals(capsys, argv, match):
    code, _, err = _cli(capsys, "--prompt", "x = 1", "--max-new-tokens", "4", "--no-compile-cache", *argv)
    assert code == 2 and match in err, err
    assert "Traceback" not in err


@pytest.mark.long
def test_cli_draft_layers_equals_the_baseline_at_temperature_0(capsys):
    flags = ["--prompt", "def add(a, b):", "--max-new-tokens", "16", "--temperature", "0", "--json",
             "--no-compile-cache"]
    code, out, _ = _cli(capsys, "--draft", "layers:2", *flags)
    assert code == 0
    spec = json.loads(out)
    code, out, _ = _cli(capsys, "--baseline", *flags)
    assert code == 0
    base = json.loads(out)
    print(f"layers:2 on the default target: tokens per target call {spec['tokens_per_target_call']:.2f}")
    assert spec["tokens"] == base["tokens"] and len(spec["tokens"]) == 16
    assert spec["draft"] == "layers:2" and spec["mode"] == "speculative" and spec["tree"] == "chain:4"
    assert spec["draft_calls"] == 4 * spec["rounds"]  # chain:4: four 2-layer forwards a round
