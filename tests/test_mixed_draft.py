"""Prompt lookup and a feature head in one tree (``jaxspec.MixedDraft``, ``--draft lookup+HEAD``):

* literal proposals: on ``branch:2,1,1`` lookup's chain lands on nodes 0, 2, 4 and the head's
  greedy chain on nodes 1, 3, 5, for a hand-made history (a match, and a row without one);
  the head's commit reads the accepted path of the two-chain tree as the head alone reads
  the same path on its chain;
* greedy decoding (T = 0) on the embedded default target and head equals target-only
  decoding, on prompts where lookup matches and where it does not;
* the exactness harness (``jaxspec.verify``: joint and per-position χ² against the exact law
  of a 4-token target, two-sample against target-only, T = 1) passes it, passes a variant
  whose two first tokens are always the same (the duplicate sibling the deterministic rule
  must reject with probability 1), and rejects broken rules (``jaxspec.mutants``) on its
  rounds with p < 1e-6;
* what it cannot serve (another tree, another scheme, a draft law, a second part that is not
  a head) is refused, naming the setting;
* ``parse_draft("lookup+HEAD")`` and the command line.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from _tiny import tiny_head, tiny_pair

import jaxspec
from jaxspec import MixedDraft, NgramDraft
from jaxspec.core.sampling import Warp
from jaxspec.core.treespec import parse_tree, resolve_tree
from jaxspec.decode import generate as gen
from jaxspec.decode.draft import ModelDraft
from jaxspec.decode.drafter import Context, DraftLaw, Outcome, Prompt, Proposal
from jaxspec.decode.head_draft import HeadDraft, propose_head
from jaxspec.decode.mixed_draft import interleave, is_two_chains, two_chain_parents
from jaxspec.decode.ngram import NgramState, propose_ngram
from jaxspec.exactness.harness import default_pair, verify
from jaxspec.nn.model import prefill

GREEDY = jaxspec.Sampling(temperature=0)
LONG = pytest.mark.long  # 15 s or more each (also listed in tests/long_tests.txt)
# cases that repeat what a long case already covers with another setting (a deeper tree, a
# warped law, the traversal rule on duplicates, another mutant): 45-60 s each here, run with
# -m slow, kept out of CI's long stage for its time budget
SLOW = pytest.mark.slow
MUTANT_THRESH = 1e-6
LAW_SAMPLES = 1 << 15  # default tier; the long cases take LONG_SAMPLES
LONG_SAMPLES = 1 << 17
MUTANT_SAMPLES = 1 << 14
LOOKUP_PROMPT = (1, 2, 3, 1, 2)  # "1 2" recurs: every first round copies "3 1 2"
NO_MATCH_PROMPT = (3,)  # one token: no match in the first round


# ------------------------------------------------------------------ the tree


def test_two_chains_in_breadth_first_order():
    assert two_chain_parents(3) == parse_tree("branch:2,1,1").parents == (-1, -1, 0, 1, 2, 3)
    assert two_chain_parents(1) == parse_tree("branch:2").parents == (-1, -1)
    for spec in ("branch:2", "branch:2,1", "branch:2,1,1,1", "parents:-1,-1,0,1"):
        assert is_two_chains(parse_tree(spec)), spec
    for spec in ("chain:3", "branch:2,2", "branch:3,1,1", "branch:1,2", "parents:-1,-1,0,0"):
        assert not is_two_chains(parse_tree(spec)), spec
    assert not is_two_chains(parse_tree("dynamic:depth=2,topk=2,nodes=3"))
    # lookup's chain on the even nodes, the head's on the odd ones
    got = interleave(jnp.asarray([[5, 6, 7]], jnp.int32), jnp.asarray([[8, 9, 10]], jnp.int32))
    assert np.asarray(got).tolist() == [[5, 8, 6, 9, 7, 10]]


# ------------------------------------------------------------------ literal proposals


@functools.lru_cache(maxsize=None)
def _models():
    target, _ = tiny_pair(3, vocab_size=16, hidden_size=16, num_heads=2, num_layers=2)
    return target, tiny_head(target, 3)


PROMPTS = [[3, 4, 5, 6, 3, 4], [9, 10]]  # row 0: "3 4" recurs, lookup copies "5 6 3"; row 1: no match
CAPACITY = 32


def _start(mixed, params, target, tree):
    """The drafter's state after PROMPTS, and the round's context (nothing emitted yet)."""
    lens = np.asarray([len(p) for p in PROMPTS], np.int32)
    toks = jnp.asarray([p + [0] * (max(lens) - len(p)) for p in PROMPTS], jnp.int32)
    b = len(PROMPTS)

    @nnx.jit  # one program instead of op-by-op dispatch: the test's time is compilation
    def start(target, params):
        feats, cache = prefill(target, toks, jnp.asarray(lens - 1), CAPACITY, features=True)
        state = mixed.init(params, target, Prompt(toks, jnp.asarray(lens), feats, CAPACITY, tree))
        ctx = Context(prev=toks[jnp.arange(b), lens - 2], root=toks[jnp.arange(b), lens - 1],
                      lengths=jnp.asarray(lens - 1), out=jnp.full((b, 8), -1, jnp.int32),
                      n_out=jnp.zeros((b,), jnp.int32), active=jnp.ones((b,), jnp.bool_), target_cache=cache)
        return state, ctx

    return start(target, params)


def _propose(mixed, params, target, state, ctx, keys, tree):
    law = DraftLaw(tree, "deterministic", Warp(None, None), jnp.float32(1.0))
    return nnx.jit(lambda t, p, s, c, k: mixed.propose(p, t, s, c, k, law))(target, params, state, ctx, keys)


def _first_proposal():
    """The embedded head and lookup on ``branch:2,1,1``: the first round's proposal for PROMPTS."""
    target, head = _models()
    mixed, params = MixedDraft.of(head)
    tree = resolve_tree("branch:2,1,1")
    state, ctx = _start(mixed, params, target, tree)
    keys = jax.random.split(jax.random.key(0), len(PROMPTS))
    return target, head, mixed, params, tree, state, ctx, keys, _propose(mixed, params, target, state, ctx, keys, tree)


def test_lookup_chain_on_even_nodes_and_the_heads_greedy_chain_on_odd_nodes():
    target, head, mixed, params, tree, state, ctx, keys, prop = _first_proposal()
    assert prop.probs is None and prop.parents is None and prop.has_draft is None  # fixed choices, every row
    tokens = np.asarray(prop.tokens)
    assert tokens.shape == (2, 6)
    assert tokens[0, 0::2].tolist() == [5, 6, 3]  # the copy after the earlier "3 4"
    assert tokens[1, 0::2].tolist() == [0, 0, 0]  # no match: token 0, a fixed choice
    # the head's chain is its own greedy chain: each token the argmax of the law it drafts
    # after the chain so far (the head alone, on chain:3, under the deterministic scheme)
    chain, q, _ = propose_head(head, target, state.head, keys, resolve_tree(3), "deterministic", Warp(None, None), 1.0)
    np.testing.assert_array_equal(tokens[:, 1::2], np.asarray(chain))
    np.testing.assert_array_equal(tokens[:, 1::2], np.argmax(np.asarray(q)[:, :3], axis=-1))
    # the lookup chain is NgramDraft's on chain:3
    look, has = propose_ngram(NgramDraft(), state.lookup, ctx.out, ctx.n_out, resolve_tree(3))
    np.testing.assert_array_equal(tokens[:, 0::2], np.asarray(look))
    assert np.asarray(has).tolist() == [True, False]
    assert mixed.forwards(tree) == 3  # the head's three forwards; lookup runs none


def test_the_heads_commit_reads_the_accepted_path_of_either_chain():
    """Committing the two-chain tree's outcome leaves the head in the state the head alone
    reaches committing the same path on its chain: rows accept the head's chain (nodes 1, 3),
    lookup's (nodes 0, 2, 4) and nothing."""
    target, head, mixed, params, tree, state, ctx, keys, prop = _first_proposal()
    b, n = 2, tree.num_nodes
    feats = jax.random.normal(jax.random.key(1), (b, n + 1, 16), jnp.float32)  # the target's, of [root] + nodes
    mixed_nodes = np.asarray([[1, 3, -1, -1, -1, -1], [0, 2, 4, -1, -1, -1]], np.int32)
    num = np.asarray([3, 4], np.int32)
    toks = np.full((b, n + 1), -1, np.int32)
    pt = np.asarray(prop.tokens)
    for r in range(b):
        path = [int(pt[r, j]) for j in mixed_nodes[r] if j >= 0]
        toks[r, : len(path) + 1] = path + [7]
    outcome = Outcome(jnp.asarray(toks), jnp.asarray(num), jnp.asarray(mixed_nodes), jnp.ones((b,), jnp.bool_), feats)
    got = mixed.commit(params, prop.state, outcome, None).head
    # the same paths on the head's own chain:3: chain node k is the mixed tree's node 2k or 2k + 1
    chain_nodes = np.where(mixed_nodes >= 0, mixed_nodes // 2, -1)[:, :3]
    rows = np.concatenate([np.zeros((b, 1), np.int32), np.where(mixed_nodes >= 0, mixed_nodes + 1, 0)], axis=1)
    chain_feats = jnp.take_along_axis(feats, jnp.asarray(rows[:, :4, None]), axis=1)
    alone = HeadDraft.of(head)[0]
    want = alone.commit(params, prop.state.head, Outcome(jnp.asarray(toks[:, :4]), jnp.asarray(num),
                                                         jnp.asarray(chain_nodes), jnp.ones((b,), jnp.bool_),
                                                         chain_feats), None)
    for field in ("feats", "toks", "count"):
        np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), err_msg=field)
    np.testing.assert_array_equal(np.asarray(got.cache.lengths), np.asarray(want.cache.lengths))
    ended = mixed.commit(params, prop.state, outcome._replace(num=jnp.zeros((b,), jnp.int32),
                                                             active=jnp.zeros((b,), jnp.bool_)), None)
    for a, c in zip(jax.tree.leaves(ended), jax.tree.leaves(prop.state)):  # a row that had ended keeps its state
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


# ------------------------------------------------------------------ greedy equality


@functools.lru_cache(maxsize=None)
def _default():
    return jaxspec.load_model("default-target"), jaxspec.load_draft("default-head"), jaxspec.ByteTokenizer()


@pytest.mark.parametrize("lookup", [NgramDraft(), pytest.param(NgramDraft(max_ngram=40, min_ngram=40), marks=SLOW)],
                         ids=["lookup", "never-matches"])
def test_greedy_equals_target_only_on_the_default_models(lookup):
    """A ragged batch: a prompt that repeats itself (lookup copies from the first round on),
    a plain one and a one-byte one (nothing to copy at first); and the same with a lookup
    that never matches, where only the head's chain is accepted."""
    target, head, tok = _default()
    prompts = [tok.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):"), tok.encode("import os"),
               tok.encode("#")]
    state = NgramState(jnp.asarray([prompts[0] + [0] * 40, prompts[2] + [0] * (39 + len(prompts[0]))], jnp.int32),
                       jnp.asarray([len(prompts[0]), 1], jnp.int32))
    _, has = propose_ngram(lookup, state, jnp.full((2, 1), -1, jnp.int32), jnp.zeros((2,), jnp.int32), resolve_tree(3))
    assert np.asarray(has).tolist() == ([True, False] if lookup == NgramDraft() else [False, False])
    kw = dict(max_new_tokens=32, sampling=GREEDY, stop_tokens=())
    draft = MixedDraft.of(head, lookup)
    spec = jaxspec.generate(jax.random.key(0), target, draft, prompts, tree="branch:2,1,1", **kw)
    base = jaxspec.generate_autoregressive(jax.random.key(0), target, prompts, **kw)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
    s = spec.summary()
    print(lookup, s)
    assert s["tokens_per_target_call"] > 1.5, s  # drafts are accepted
    assert s["draft_calls"] == 3 * s["rounds"]


def test_generate_uses_the_drafters_tree_by_default():
    target, head = _models()
    drafter, params = MixedDraft.of(head)
    assert drafter.tree == "branch:2,1,1"
    cfg = gen.build_config(target, drafter, prompt_length=3, max_new_tokens=4)[0]
    assert cfg.tree == resolve_tree("branch:2,1,1") and cfg.scheme == "deterministic"
    assert cfg.draft_calls_per_round == 3


# ------------------------------------------------------------------ exactness (T = 1)


@functools.lru_cache(maxsize=None)
def _law_pair():
    target, _ = default_pair(0)  # the harness's default target (V = 4)
    return target, tiny_head(target, 0)


@dataclasses.dataclass(frozen=True)
class SameFirstToken(MixedDraft):
    """Both chains start with lookup's first token: the head's chain is a duplicate sibling
    on every round (still a fixed choice), which the deterministic rule must reject."""

    def propose(self, params, target, state, ctx, keys, law):
        prop = super().propose(params, target, state, ctx, keys, law)
        return Proposal(prop.tokens.at[:, 1].set(prop.tokens[:, 0]), prop.state)


def _verify(drafter=MixedDraft, tree="branch:2,1,1", rule="auto", prompt=LOOKUP_PROMPT, num_samples=LAW_SAMPLES,
            mutant=None, **sampling):
    target, head = _law_pair()
    mixed, params = MixedDraft.of(head)
    draft = (drafter(mixed.head, mixed.lookup), params)
    return verify(target, draft, tree=tree, scheme="deterministic", rule=rule, prompt=list(prompt),
                  sampling=jaxspec.Sampling(**{"temperature": 1.0, **sampling}), num_samples=num_samples, seed=0,
                  mutant=mutant, check_acceptance=False, progress=False, prompt_bucket=None)


def _joint(report):
    return next(t for t in report.tests if t.name == "joint chi2 vs exact")


PASS_CASES = {
    "lookup-token": dict(),
    "duplicate-first-token": dict(drafter=SameFirstToken),
    "no-match-prompt": dict(prompt=NO_MATCH_PROMPT, num_samples=LONG_SAMPLES),
    "traversal": dict(rule="traversal", num_samples=LONG_SAMPLES),
    "duplicate-traversal": dict(drafter=SameFirstToken, rule="traversal", num_samples=LONG_SAMPLES),
    "depth2-warped": dict(tree="branch:2,1", temperature=0.7, top_k=3, num_samples=LONG_SAMPLES),
    "depth4": dict(tree="branch:2,1,1,1", num_samples=LONG_SAMPLES),
}


DEFAULT_TIER = ("lookup-token", "no-residual-update")  # one pass and one rejection run by default
SLOW_CASES = ("no-match-prompt", "duplicate-traversal", "depth2-warped", "depth4", "bonus-kv-slot")


def _cases(cases):
    return [pytest.param(c, marks=() if c in DEFAULT_TIER else SLOW if c in SLOW_CASES else LONG) for c in cases]


@pytest.mark.parametrize("case", _cases(PASS_CASES))
def test_exactness_harness_passes(case):
    r = _verify(**PASS_CASES[case])
    print(case, r.summary())
    assert r.passed, r.summary()
    assert r.config["num_samples"] == PASS_CASES[case].get("num_samples", LAW_SAMPLES)
    assert _joint(r).dof >= 10  # the test has cells to see a wrong law in
    assert r.tokens_per_round > 1.2  # drafts are accepted: the rounds are speculative ones


MUTANT_CASES = {
    # after a rejected first sibling, the second judged by the unreduced row (the duplicate
    # of an earlier sibling accepted again)
    "no-residual-update": dict(mutant="no-residual-update"),
    "duplicate-no-residual-update": dict(drafter=SameFirstToken, mutant="no-residual-update"),
    "depth-row": dict(mutant="depth-row"),  # the head's chain judged by lookup's rows
    "bonus-kv-slot": dict(mutant="bonus-kv-slot"),  # the emitted token's K/V one slot early
}


@pytest.mark.parametrize("case", _cases(MUTANT_CASES))
def test_exactness_harness_rejects_broken_rounds(case):
    r = _verify(num_samples=MUTANT_SAMPLES, **MUTANT_CASES[case])
    joint = _joint(r)
    print(case, joint)
    assert not r.passed
    assert joint.pvalue < MUTANT_THRESH, joint


# ------------------------------------------------------------------ refusals


def test_refusals_name_the_setting():
    target, head = _models()
    draft = MixedDraft.of(head)
    key = jax.random.key(0)

    def gen(**kw):
        jaxspec.generate(key, target, draft, [[1, 2]], max_new_tokens=4, **kw)

    for tree in ("chain:3", "branch:2,2", "branch:3,1,1", "dynamic:depth=2,topk=2,nodes=3"):
        with pytest.raises(jaxspec.SettingError, match=r"^tree = .*: a MixedDraft drafts two chains from the root "
                                                       r".*expected 'branch:2' followed by 1s"):
            gen(tree=tree, **({"scheme": "deterministic"} if tree.startswith("dynamic") else {}))
    for scheme in ("iid", "without_replacement"):
        with pytest.raises(jaxspec.SettingError, match=rf"^scheme = '{scheme}': a MixedDraft proposes fixed tokens "
                                                       r".*expected scheme 'deterministic'"):
            gen(scheme=scheme)
    with pytest.raises(jaxspec.SettingError, match=r"^draft_sampling = Sampling\(temperature=0.5, .*\): a MixedDraft "
                                                   r"has no proposal law; expected None$"):
        gen(draft_sampling=jaxspec.Sampling(temperature=0.5))
    other, _ = tiny_pair(0, vocab_size=8, hidden_size=16, num_heads=2, num_layers=2)
    with pytest.raises(ValueError, match="draft: vocab_size = 16; expected the target's vocab_size = 8"):
        jaxspec.generate(key, other, draft, [[1, 2]], max_new_tokens=4)


def test_a_second_part_that_is_not_a_head_is_refused():
    target, head = _models()
    model_draft = ModelDraft.of(target)[0]
    with pytest.raises(jaxspec.SettingError, match=r"^head = 'ModelDraft': expected a HeadDraft"):
        MixedDraft(model_draft)
    with pytest.raises(jaxspec.SettingError, match=r"^head = 'Transformer': expected a jaxspec.FeatureHead"):
        MixedDraft.of(target)
    with pytest.raises(jaxspec.SettingError, match=r"^lookup = 'LayerSkipDraft': expected a jaxspec.NgramDraft"):
        MixedDraft(HeadDraft.of(head)[0], jaxspec.LayerSkipDraft(1))
    with pytest.raises(ValueError, match=r"^draft spec = 'lookup\+default-draft': 'default-draft' is a Transformer; "
                                         r"expected a feature head after '\+'"):
        jaxspec.parse_draft("lookup+default-draft")
    with pytest.raises(ValueError, match=r"^draft spec = 'lookup\+': no head after '\+'"):
        jaxspec.parse_draft("lookup+")
    with pytest.raises(ValueError, match=r"^draft spec = 'lookup\+no-such-head': loading the head 'no-such-head' "
                                         r"failed"):
        jaxspec.parse_draft("lookup+no-such-head")


# ------------------------------------------------------------------ spec strings and the command line


def test_parse_draft_reads_the_spec_back():
    drafter, params = jaxspec.parse_draft("lookup+default-head")
    assert isinstance(drafter, MixedDraft) and drafter.lookup == NgramDraft()
    assert drafter.spec == "lookup+default-head"
    assert jaxspec.parse_draft(drafter.spec)[0] == drafter
    head = jaxspec.load_draft("default-head")
    assert drafter == MixedDraft.of(head)[0]  # the name is not part of the configuration
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(params)[0]),
                                  np.asarray(jax.tree.leaves(MixedDraft.of(head)[1])[0]))
    four, _ = jaxspec.parse_draft("ngram:4+default-head")
    assert four.lookup == NgramDraft(max_ngram=4)
    assert four.spec == "ngram:max=4,min=1,candidates=64+default-head"
    assert jaxspec.parse_draft(four.spec)[0] == four
    with pytest.raises(ValueError, match="MixedDraft.spec: head_name = None"):
        MixedDraft.of(head)[0].spec


def _cli(capsys, *argv):
    from jaxspec.cli import main

    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@LONG
def test_cli_lookup_plus_head_equals_the_baseline_at_temperature_0(capsys):
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    flags = ["--prompt", prompt, "--temperature", "0", "--max-new-tokens", "16", "--json", "--no-compile-cache"]
    code, out, err = _cli(capsys, "--draft", "lookup+default-head", "--tree", "branch:2,1,1", *flags)
    assert code == 0, err
    spec = json.loads(out)
    code, out, _ = _cli(capsys, "--baseline", *flags)
    base = json.loads(out)
    assert spec["tokens"] == base["tokens"]
    assert spec["draft"] == "lookup+default-head" and spec["scheme"] == "deterministic"


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--tree", "chain:3"], "--tree chain:3: a MixedDraft drafts two chains from the root"),
        (["--tree", "branch:2,1", "--scheme", "iid"], "--scheme iid: a MixedDraft proposes fixed tokens"),
    ],
)
def test_cli_refusals(capsys, argv, match):
    code, _, err = _cli(capsys, "--prompt", "x = 1", "--max-new-tokens", "4", "--draft", "lookup+default-head", *argv)
    assert code == 2 and match in err, err
