"""End-to-end statistical exactness of ``jaxspec.generate``, with power.

Setup, fixed in advance (not tuned to pass): a tiny random target/draft pair (V = 4, one
layer; the draft's weights are the target's mixed with another model's, so acceptance is
moderate), one prompt, ``max_new_tokens = L = 3``. The default tier's case (chain, iid) draws
N = 2^20 independent samples (a batch of 2^16 identical prompts per ``generate`` call: rows
are independent; 16 calls with keys ``fold_in(seed, chunk)``; counts streamed per call); the
other cases of the draft model (other trees, schemes, warps and rules) draw
MODEL_SAMPLES = 2^19, and those of the other drafters (prompt lookup, the feature heads)
DRAFTER_SAMPLES = 2^18. The default case, the dynamic tree and the queue sample generate's
default program (the prompt padded to a 32-column bucket); the others sample the unpadded
program (``prompt_bucket=None``, see BUCKET), whose tokens tests/test_prompt_bucket.py shows
equal to the padded program's.
Tests per case:

* χ² goodness of fit of the joint law of the 3 tokens (64 cells, sparse cells pooled)
  against the exact law enumerated with the target's own ``forward_logits``;
* the 3 per-position marginals against the exact marginals;
* a two-sample χ² against ``generate_autoregressive`` (N samples, its own seed).

One more default case runs a ragged batch: rows alternate the prompts ``[1, 2]`` and
``[3, 1, 2]`` (different lengths in one batch: per-row cache lengths, positions and
masks), 2^18 samples per prompt; each group's joint law and marginals are tested against
that prompt's own exact law (the two laws are 0.057 apart in total variation; at 2^18
samples the joint test detects a TV of ~0.009 with power 0.9). The same ragged batch runs
once more under continuous batching (``rows=``): each call's 2^16 prompts through 4096 rows,
every later prompt starting in a row that another has just left.

Family-wise level 1e-3, Bonferroni over at most NUM_TESTS p-values in this file (all
cases, slow ones included; the tally is checked below), so each p-value must exceed
1e-3 / NUM_TESTS.

Power: the same tests must reject, with p < 1e-6, decoders broken through ``generate``'s
public ``parts=`` (the library's round with one part replaced by a
:mod:`jaxspec.mutants` mutant's): a
causal triangle over the flattened tree as the verification mask, probability rows indexed
by depth instead of by parent, and the emitted (bonus/residual) token's K/V written one
cache slot early, over the last accepted token's. Each is rejected by a wide margin with
MUTANT_SAMPLES = 2^16 samples (p-values printed with ``-s``), so the mutants use that.

Default cases cover every scheme and every tree kind (chain, branching, dynamic,
warped target laws: temperature with top-k, temperature with top-p); the remaining scheme x tree combinations are ``slow`` (run with
``-m slow``), so that the default suite stays within its CPU time budget.
"""

import functools

import jax
import numpy as np
import pytest
from _tiny import exact_joint, tiny_head, tiny_pair

from jaxspec import Sampling
from jaxspec.core.sampling import SCHEMES
from jaxspec.exactness import mutants
from jaxspec.exactness.stats import bonferroni, chisquare_gof, chisquare_two_sample, min_detectable_tv
from jaxspec.core.treespec import DynamicTree

from jaxspec.decode import generate as gen
from jaxspec.decode import loops

ALPHA_FAMILY = 1e-3
NUM_TESTS = 125
THRESH = bonferroni(ALPHA_FAMILY, NUM_TESTS)  # 8e-6
MUTANT_THRESH = 1e-6
V, L = 4, 3
PROMPT = [1, 2]
N_SAMPLES = 1 << 20
# the draft model's other cases (every tree kind, scheme, warp and rule beyond the default case):
# 2^19 each (the joint test detects a TV of 0.0065 with power 0.9 at the Bonferroni level, against
# 0.0046 at 2^20), which keeps CI's long stage within its budget; the two-sample reference stays at
# N_SAMPLES target-only samples
MODEL_SAMPLES = 1 << 19
CHUNK = 1 << 16
# the cases on chains and branching trees but the default one sample the unpadded program
# (prompt_bucket=None: a cache of prompt + L + tree slots, not a prompt padded to 32 columns), in
# half the time (a quarter for target-only sampling); tests/test_prompt_bucket.py shows that the
# padded program emits the unpadded one's tokens for the same key (every drafter on a chain, the
# draft model on a branching tree, target-only; T = 0 and 1), so the law shown for one is the
# other's. The default case, the dynamic tree and the queue sample generate's default (padded)
# program itself; the mutants (power only) sample the unpadded one.
BUCKET = None
MUTANT_SAMPLES = 1 << 16
# the drafter cases beyond the draft model (prompt lookup, the three feature heads) test that the
# drafter's path through generate keeps the law the model cases establish at N_SAMPLES: 2^18 each
# (the joint test detects a TV of 0.0092 with power 0.9 at the Bonferroni level, against 0.0046
# at 2^20), which keeps CI's long stage within its budget
DRAFTER_SAMPLES = 1 << 18
RAGGED = ([1, 2], [3, 1, 2])  # row r of the ragged batch: RAGGED[r % 2]
RAGGED_SAMPLES = 1 << 18  # per prompt
QUEUE_ROWS = CHUNK // 16  # continuous batching: rows that decode a chunk's CHUNK prompts
CELL = V ** np.arange(L - 1, -1, -1)  # token triple -> cell index
TREES = {
    "chain": 2,
    "branch": (2, 2),
    "dynamic": DynamicTree(depth=2, topk=2, num_nodes=4),
}
# the warps' fields, as exact_joint takes them; generate gets them as sampling=Sampling(**WARPS[k]), and
# the draft drafts with the same law (draft_sampling=None, generate's default): its tokens and q come from it
WARPS = {"none": {}, "t0.7_topk3": dict(temperature=0.7, top_k=3), "t1.2_topp0.95": dict(temperature=1.2, top_p=0.95)}


@functools.lru_cache(maxsize=None)
def _pair():
    return tiny_pair(0, vocab_size=V, mix=0.5, head_scale=3.0)


@functools.lru_cache(maxsize=None)
def _exact(warp_key, prompt=tuple(PROMPT)):
    return exact_joint(_pair()[0], list(prompt), L, **WARPS[warp_key])


def _prompts(prompt=tuple(PROMPT)):
    return np.tile(np.asarray([prompt], np.int32), (CHUNK, 1))


def _count(run_chunk, seed: int, num_samples: int = N_SAMPLES, groups: int = 1) -> np.ndarray:
    """Histogram over the V**L cells of ``num_samples`` rows; ``run_chunk(key) ->
    int32[CHUNK, L]``. ``groups > 1``: row r of a chunk belongs to group ``r % groups``;
    returns int64[groups, V**L] (``num_samples`` rows in all)."""
    counts = np.zeros((groups, V**L), np.int64)
    for i in range(num_samples // CHUNK):
        toks = np.asarray(run_chunk(jax.random.fold_in(jax.random.key(seed), i)))
        assert toks.shape == (CHUNK, L) and toks.min() >= 0, "every row must emit L tokens"
        for g in range(groups):
            counts[g] += np.bincount(toks[g::groups] @ CELL, minlength=V**L)
    return counts[0] if groups == 1 else counts


@functools.lru_cache(maxsize=None)
def _autoregressive_counts(warp_key, prompt=tuple(PROMPT)):
    target, _ = _pair()
    prompts = _prompts(prompt)

    def run(key):
        return gen.generate_autoregressive(key, target, prompts, max_new_tokens=L,
                                           sampling=Sampling(**WARPS[warp_key]), prompt_bucket=BUCKET).tokens

    return _count(run, seed=4242 + len(warp_key) + len(prompt))


def _speculative_counts(tree, scheme, warp_key, seed, mutant=None, num_samples=N_SAMPLES, rule="token",
                        draft=None, prompt=tuple(PROMPT), bucket=BUCKET):
    target, model_draft = _pair()
    draft = model_draft if draft is None else draft
    prompts = _prompts(prompt)
    warp = dict(sampling=Sampling(**WARPS[warp_key]))
    if mutant is None:

        def run(key):
            return gen.generate(key, target, draft, prompts, max_new_tokens=L, tree=tree, scheme=scheme, rule=rule,
                                prompt_bucket=bucket, **warp).tokens

    else:  # a broken decoder: generate with the mutant's rule or one of the round's parts
        broken = mutants.decoder(mutant)
        if mutants.mutant_rule(mutant) is None:
            broken["rule"] = "auto"  # the mutant replaces a part: generate's default rule

        def run(key):
            return gen.generate(key, target, draft, prompts, max_new_tokens=L, tree=tree, scheme=scheme,
                                prompt_bucket=bucket, **broken, **warp).tokens

    return _count(run, seed, num_samples)


def _marginals(joint):
    c = np.asarray(joint).reshape((V,) * L)
    return [c.sum(axis=tuple(a for a in range(L) if a != i)) for i in range(L)]


def _check(counts, exact, label, reference=None):
    """Joint and per-position marginals against ``exact``; two-sample against the counts
    ``reference`` (autoregressive) if given. Every p-value must exceed THRESH."""
    results = {"joint": chisquare_gof(counts, exact)}
    for i, (m, e) in enumerate(zip(_marginals(counts), _marginals(exact))):
        results[f"marginal{i}"] = chisquare_gof(m, e)
    if reference is not None:
        results["two_sample"] = chisquare_two_sample(counts, reference)
    for name, r in results.items():
        print(f"{label} {name}: {r}")
    for name, r in results.items():
        assert r.pvalue > THRESH, f"{label} {name}: {r}\n{r.table()}"


CASES = [
    # (tree, scheme, warp): default cases cover every scheme and every tree kind
    ("chain", "iid", "none"),
    ("branch", "without_replacement", "none"),
    ("dynamic", "deterministic", "none"),
    ("branch", "iid", "t0.7_topk3"),
]
SLOW_CASES = [
    ("branch", "without_replacement", "t1.2_topp0.95"),  # nucleus sampling on both sides
    ("branch", "deterministic", "none"),
    ("chain", "without_replacement", "none"),
    ("chain", "deterministic", "none"),
    ("branch", "iid", "none"),
    ("chain", "without_replacement", "t0.7_topk3"),
]
RAGGED_CASE = ("branch", "without_replacement", "none")
# p-values compared with THRESH: 5 per case (joint, 3 marginals, two-sample), 4 per ragged
# group (joint, 3 marginals), one per autoregressive control
BLOCK_CASES = [("chain", "iid", "none"), ("chain", "deterministic", "t0.7_topk3")]
TRAVERSAL_CASES = [("branch", "without_replacement", "none")]
# prompt lookup drafts (jaxspec.NgramDraft): a prompt whose suffix "1 2" recurs, so every
# first round drafts "3 1 ..." and later rounds match on whatever was emitted
NGRAM_PROMPT = (1, 2, 3, 1, 2)
NGRAM_CASES = [("chain", "none"), ("branch", "t0.7_topk3")]
# feature-head drafts (jaxspec.FeatureHead, a random head on the tiny target): the default
# rule on a chain (block), the token rule on a branching tree under a warped law
HEAD_CASES = [("chain", "iid", "none"), ("branch", "without_replacement", "t0.7_topk3")]
# a reduced-vocabulary head (EAGLE-3's draft vocabulary): it drafts ids REDUCED_VOCAB only, its
# q zero at the others, where the rule must still emit the target's mass
REDUCED_VOCAB = (0, 2, 3)
# a multi-layer head (EAGLE-3's fused taps): the round passes the target's tap after layer 0
# with its features, and the head fuses them (a fuse moved off its identity start)
MULTI_HEAD_CASES = [("branch", "without_replacement", "t0.7_topk3")]
assert (5 * (len(CASES) + len(SLOW_CASES) + len(BLOCK_CASES) + len(TRAVERSAL_CASES) + len(NGRAM_CASES)
             + 2 * len(HEAD_CASES) + len(MULTI_HEAD_CASES))
        + 4 * len(RAGGED) * 2 + len(WARPS) + len(NGRAM_CASES) <= NUM_TESTS)  # ragged: plain and queued


@pytest.mark.parametrize(
    "tree,scheme,warp_key",
    CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CASES],
)
def test_generate_matches_exact_target_law(tree, scheme, warp_key):
    seed = 100 * list(TREES).index(tree) + 10 * SCHEMES.index(scheme) + list(WARPS).index(warp_key)
    first = (tree, scheme, warp_key) == CASES[0]
    n = N_SAMPLES if first else MODEL_SAMPLES
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, num_samples=n,  # dynamic: the default program
                                 bucket=gen.PROMPT_BUCKET if first or tree == "dynamic" else BUCKET)
    assert counts.sum() == n
    _check(counts, _exact(warp_key), f"{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


@pytest.mark.parametrize("tree,scheme,warp_key", BLOCK_CASES[:1] + [pytest.param(*BLOCK_CASES[1], marks=pytest.mark.slow)])
def test_generate_block_rule_matches_exact_target_law(tree, scheme, warp_key):
    """generate(rule="block"): the same end-to-end law on the tiny models."""
    seed = 5000 + 10 * SCHEMES.index(scheme) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, rule="block", num_samples=MODEL_SAMPLES)
    _check(counts, _exact(warp_key), f"block/{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


@pytest.mark.parametrize("tree,scheme,warp_key", TRAVERSAL_CASES)
def test_generate_traversal_rule_matches_exact_target_law(tree, scheme, warp_key):
    """generate(rule="traversal") on a branching tree: the same end-to-end law."""
    seed = 6000 + 10 * SCHEMES.index(scheme) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, rule="traversal", num_samples=MODEL_SAMPLES)
    _check(counts, _exact(warp_key), f"traversal/{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


@pytest.mark.parametrize("tree,warp_key", NGRAM_CASES)
def test_generate_ngram_draft_matches_exact_target_law(tree, warp_key):
    """generate(draft=NgramDraft()): fixed drafts copied from the history (scheme
    deterministic, rule auto) keep the target's law; the two-sample reference is
    target-only sampling from the same prompt."""
    from jaxspec import NgramDraft

    seed = 7000 + 10 * list(TREES).index(tree) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], None, warp_key, seed, rule="auto", draft=NgramDraft(),
                                 prompt=NGRAM_PROMPT, num_samples=DRAFTER_SAMPLES)
    exact = _exact(warp_key, NGRAM_PROMPT)
    reference = _autoregressive_counts(warp_key, NGRAM_PROMPT)
    ar = chisquare_gof(reference, exact)  # the reference itself against the exact law
    print(f"ngram reference {ar}")
    assert ar.pvalue > THRESH, str(ar)
    _check(counts, exact, f"ngram/{tree}/{warp_key}", reference)


@functools.lru_cache(maxsize=None)
def _head():
    return tiny_head(_pair()[0], 0)


# the branching case is `slow` here: the reduced-vocabulary and multi-layer heads below run the
# same tree, scheme and warp through the same HeadDraft round (83 s a case on the 2-core CPU)
@pytest.mark.parametrize("tree,scheme,warp_key", HEAD_CASES[:1] + [pytest.param(*HEAD_CASES[1], marks=pytest.mark.slow)])
def test_generate_feature_head_matches_exact_target_law(tree, scheme, warp_key):
    """generate(draft=FeatureHead): drafts from the target's own features (rule auto: block
    on the chain, token on the tree) keep the target's law."""
    seed = 7500 + 10 * list(TREES).index(tree) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, rule="auto", draft=_head(),
                                 num_samples=DRAFTER_SAMPLES)
    _check(counts, _exact(warp_key), f"head/{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


@pytest.mark.parametrize("tree,scheme,warp_key", MULTI_HEAD_CASES)
def test_generate_multi_layer_head_matches_exact_target_law(tree, scheme, warp_key):
    """generate(draft=a FeatureHead with feature_layers): drafts from the target's fused taps
    keep the target's law."""
    from jaxspec.nn.head import head_config, init_head

    head = init_head(head_config(_pair()[0].config), jax.random.key(2100), feature_layers=(0,))
    w = head.fuse.kernel[...]
    head.fuse.kernel.set_value(w + 0.3 * jax.random.normal(jax.random.key(2101), w.shape))
    seed = 7800 + 10 * list(TREES).index(tree) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, rule="auto", draft=head,
                                 num_samples=DRAFTER_SAMPLES)
    _check(counts, _exact(warp_key), f"multi-layer head/{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


@pytest.mark.parametrize("tree,scheme,warp_key", HEAD_CASES)
def test_generate_reduced_vocabulary_head_matches_exact_target_law(tree, scheme, warp_key):
    """generate(draft=a FeatureHead drafting REDUCED_VOCAB only): q is zero at the other ids,
    which the target still emits, through its residual, at their exact probability."""
    from jaxspec.nn.head import head_config, init_head

    head = init_head(head_config(_pair()[0].config), jax.random.key(2000), draft_vocab=REDUCED_VOCAB)
    seed = 7700 + 10 * list(TREES).index(tree) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed, rule="auto", draft=head,
                                 num_samples=DRAFTER_SAMPLES)
    _check(counts, _exact(warp_key), f"reduced head/{tree}/{scheme}/{warp_key}", _autoregressive_counts(warp_key))


def test_generate_ragged_batch_matches_each_prompts_law():
    """Prompts of different lengths in one batch (rows alternate RAGGED[0], RAGGED[1]):
    each group has its own prompt's exact law."""
    tree, scheme, warp_key = RAGGED_CASE
    target, draft = _pair()
    prompts = [RAGGED[r % len(RAGGED)] for r in range(CHUNK)]  # padded by generate itself

    def run(key):
        return gen.generate(
            key, target, draft, prompts, max_new_tokens=L, tree=TREES[tree], scheme=scheme,
            sampling=Sampling(**WARPS[warp_key]), prompt_bucket=BUCKET,
        ).tokens

    counts = _count(run, seed=7000, num_samples=len(RAGGED) * RAGGED_SAMPLES, groups=len(RAGGED))
    assert np.all(counts.sum(axis=1) == RAGGED_SAMPLES)
    exact = [_exact(warp_key, tuple(p)) for p in RAGGED]
    # informative: the joint test would tell the two prompts' laws apart (a row that
    # decodes with the other row's length, or its padding, is visible)
    tv = 0.5 * np.abs(exact[0] - exact[1]).sum()
    detectable = min_detectable_tv(RAGGED_SAMPLES, V**L, alpha=THRESH)
    print(f"ragged: TV between the prompts' laws {tv:.4f}; detectable TV (power 0.9) {detectable:.4f}")
    assert tv > 3 * detectable
    for p, c, e in zip(RAGGED, counts, exact):
        _check(c, e, f"ragged {p} {tree}/{scheme}/{warp_key}")


def test_generate_queue_matches_each_prompts_law():
    """Continuous batching: each call decodes its CHUNK ragged prompts (rows alternate
    RAGGED[0], RAGGED[1]) with only QUEUE_ROWS rows, so all but the first QUEUE_ROWS prompts
    start in a row that another prompt has just left (prefilled into its cache slots inside
    the loop, after that prompt ended in its first, second or third round). Each group has
    its own prompt's exact law."""
    tree, scheme, warp_key = RAGGED_CASE
    target, draft = _pair()
    prompts = [RAGGED[r % len(RAGGED)] for r in range(CHUNK)]
    rounds = []

    def run(key):
        out = gen.generate(key, target, draft, prompts, max_new_tokens=L, tree=TREES[tree], scheme=scheme,
                           rows=QUEUE_ROWS, sampling=Sampling(**WARPS[warp_key]))  # the default (padded) program
        rounds.append(np.bincount(np.asarray(out.rounds), minlength=L + 1))
        return out.tokens

    counts = _count(run, seed=7100, num_samples=len(RAGGED) * RAGGED_SAMPLES, groups=len(RAGGED))
    assert np.all(counts.sum(axis=1) == RAGGED_SAMPLES)
    spread = np.sum(rounds, axis=0)
    print(f"queue: prompts that took 1, 2, 3 rounds: {spread[1:].tolist()}")
    assert spread[0] == 0 and (spread[1:] > 0).all()  # rows ended (and were refilled) after every round count
    for p, c in zip(RAGGED, counts):
        _check(c, _exact(warp_key, tuple(p)), f"queue {p} {tree}/{scheme}/{warp_key}")


@pytest.mark.parametrize("warp_key", list(WARPS))
def test_autoregressive_matches_exact_target_law(warp_key):
    """Control: the baseline itself has the exact law."""
    counts = _autoregressive_counts(warp_key)
    exact = _exact(warp_key)
    r = chisquare_gof(counts, exact)
    print(f"autoregressive/{warp_key}: {r}")
    assert r.pvalue > THRESH, f"{r}\n{r.table()}"
    if warp_key != "none":  # top-k: tokens outside the top 3 never appear
        assert np.all(counts[exact == 0] == 0)


def test_exact_law_is_informative():
    """The enumerated law is context dependent (a bug that ignores context is visible)
    and the pair has moderate acceptance (neither ~0 nor ~1)."""
    exact = _exact("none").reshape(V, V, V)
    cond = exact / exact.sum(axis=2, keepdims=True)  # law of y3 given (y1, y2)
    assert np.abs(cond - cond.mean(axis=(0, 1))).max() > 0.2
    target, draft = _pair()
    out = gen.generate(  # the chain/iid case's configuration and shapes (the default bucket): no new compilation
        jax.random.key(0), target, draft, _prompts(), max_new_tokens=L, tree=TREES["chain"], scheme="iid"
    )
    rate = np.asarray(out.accepted_per_depth)[:, 0].sum() / np.asarray(out.rounds).sum()
    print(f"depth-1 acceptance rate {rate:.3f}")
    assert 0.3 < rate < 0.9


# ---------------------------------------------------------------------------------- power


# the broken decoders of jaxspec.mutants (RoundParts with one part replaced), under
# this file's names: a causal triangle over the flattened [root] + nodes as the verification
# mask; node i judged by the row of depth[i] instead of its parent's; the round's commit
# one token short, so the next round writes the emitted token's K/V one slot early
MUTANTS = {"flatten-causal": "causal-mask", "depth-as-row": "depth-row", "bonus-kv-slot": "bonus-kv-slot"}


# mutants the n-gram rounds expose: the emitted token's K/V one slot early, a rejected
# fixed token not removed from the residual, rows by depth instead of by parent
NGRAM_MUTANTS = [("chain", "bonus-kv-slot"), ("chain", "no-residual-update"), ("branch", "depth-row")]


@pytest.mark.parametrize("tree,mutant", NGRAM_MUTANTS)
def test_harness_rejects_broken_ngram_decoders(tree, mutant):
    """The same tests have power on n-gram rounds: the broken parts are rejected there too."""
    from jaxspec import NgramDraft

    target, _ = _pair()
    broken = mutants.decoder(MUTANTS.get(mutant, mutant))
    if mutants.mutant_rule(MUTANTS.get(mutant, mutant)) is None:
        broken["rule"] = "auto"  # the mutant replaces a part: generate's default rule
    prompts = _prompts(NGRAM_PROMPT)

    def run(key):
        return gen.generate(key, target, NgramDraft(), prompts, max_new_tokens=L, tree=TREES[tree], prompt_bucket=BUCKET,
                            **broken).tokens

    counts = _count(run, 9100, MUTANT_SAMPLES)
    joint = chisquare_gof(counts, _exact("none", NGRAM_PROMPT))
    print(f"ngram mutant {mutant} on {tree}: joint {joint}")
    assert joint.pvalue < MUTANT_THRESH, f"{joint}\n{joint.table()}"


# mutants on feature-head rounds: rows by depth instead of by parent, the emitted token's
# K/V one slot early in the target's cache
HEAD_MUTANTS = [("branch", "depth-row"), ("chain", "bonus-kv-slot")]


@pytest.mark.parametrize("tree,mutant", HEAD_MUTANTS)
def test_harness_rejects_broken_head_decoders(tree, mutant):
    """The same tests have power on feature-head rounds."""
    counts = _speculative_counts(TREES[tree], "without_replacement", "none", seed=9200, mutant=mutant,
                                 num_samples=MUTANT_SAMPLES, draft=_head())
    joint = chisquare_gof(counts, _exact("none"))
    print(f"head mutant {mutant} on {tree}: joint {joint}")
    assert joint.pvalue < MUTANT_THRESH, f"{joint}\n{joint.table()}"


# mutants of continuous batching's refill (generate's row replacement, patched for one
# test): the refilled row keeps the previous prompt's target-cache length, or its root
QUEUE_MUTANTS = ["keeps-target-length", "keeps-root"]


@pytest.mark.parametrize("mutant", QUEUE_MUTANTS)
def test_harness_rejects_broken_refills(mutant, monkeypatch):
    """The queue test has power: a refill that keeps one piece of the previous prompt's
    state is rejected on both prompts' laws together (the smaller p of the two groups)."""
    real = loops.set_row

    def broken(state, one, row):
        new = real(state, one, row)
        if mutant == "keeps-target-length":
            return new._replace(tcache=new.tcache.replace(lengths=state.tcache.lengths))
        return new._replace(root=state.root)

    monkeypatch.setattr(loops, "set_row", broken)
    tree, scheme, warp_key = RAGGED_CASE
    target, draft = _pair()
    prompts = [RAGGED[r % len(RAGGED)] for r in range(CHUNK)]

    rows = QUEUE_ROWS // 2 - QUEUE_MUTANTS.index(mutant)  # a configuration (and compilation) of each mutant's own

    def run(key):
        return gen.generate(key, target, draft, prompts, max_new_tokens=L, tree=TREES[tree], scheme=scheme,
                            rows=rows, sampling=Sampling(**WARPS[warp_key]), prompt_bucket=BUCKET).tokens

    counts = _count(run, seed=9300, num_samples=2 * MUTANT_SAMPLES, groups=len(RAGGED))
    joints = [chisquare_gof(c, _exact(warp_key, tuple(p))) for p, c in zip(RAGGED, counts)]
    print(f"queue mutant {mutant}: joint " + "; ".join(str(j) for j in joints))
    assert min(j.pvalue for j in joints) < MUTANT_THRESH, "\n".join(j.table() for j in joints)


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_harness_rejects_broken_decoders(mutant):
    counts = _speculative_counts(
        TREES["branch"], "without_replacement", "none", seed=9000, mutant=MUTANTS[mutant], num_samples=MUTANT_SAMPLES
    )
    joint = chisquare_gof(counts, _exact("none"))
    two = chisquare_two_sample(counts, _autoregressive_counts("none"))
    print(f"mutant {mutant}: joint {joint}; two-sample {two}")
    assert joint.pvalue < MUTANT_THRESH, f"{joint}\n{joint.table()}"
    assert two.pvalue < MUTANT_THRESH, str(two)
