"""End-to-end statistical exactness of ``jaxspec.generate``, with power.

Setup, fixed in advance (not tuned to pass): a tiny random target/draft pair (V = 4, one
layer; the draft's weights are the target's mixed with another model's, so acceptance is
moderate), one prompt, ``max_new_tokens = L = 3``. Each case draws N = 2^20 independent
samples (a batch of 2^16 identical prompts per ``generate`` call: rows are independent;
16 calls with keys ``fold_in(seed, chunk)``; counts streamed per call). Tests per case:

* χ² goodness of fit of the joint law of the 3 tokens (64 cells, sparse cells pooled)
  against the exact law enumerated with the target's own ``forward_logits``;
* the 3 per-position marginals against the exact marginals;
* a two-sample χ² against ``generate_autoregressive`` (N samples, its own seed).

Family-wise level 1e-3, Bonferroni over at most NUM_TESTS p-values in this file (all
cases, slow ones included), so each p-value must exceed 1e-3 / NUM_TESTS.

Power: the same harness (same N, same tests) must reject, with p < 1e-6, two decoders
broken through ``generate``'s internal hooks: a causal triangle over the flattened tree as
the verification mask, and probability rows indexed by depth instead of by parent.

Default cases cover every scheme and every tree kind (chain, branching, dynamic,
warped target law); the remaining scheme x tree combinations are ``slow`` (run with
``-m slow``), so that the default suite stays within its CPU time budget.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import exact_joint, tiny_pair
from flax import nnx

from jaxspec import tree as jtree
from jaxspec.draft import Warp
from jaxspec.stats import bonferroni, chisquare_gof, chisquare_two_sample
from jaxspec.treespec import DynamicTree, resolve_tree

# the module itself: once the package re-exports the function ``generate``, the
# attribute ``jaxspec.generate`` is that function
gen = importlib.import_module("jaxspec.generate")

ALPHA_FAMILY = 1e-3
NUM_TESTS = 60
THRESH = bonferroni(ALPHA_FAMILY, NUM_TESTS)  # ~1.7e-5
MUTANT_THRESH = 1e-6
V, L = 4, 3
PROMPT = [1, 2]
N_SAMPLES = 1 << 20
CHUNK = 1 << 16
CELL = V ** np.arange(L - 1, -1, -1)  # token triple -> cell index
TREES = {
    "chain": 2,
    "branch": (2, 2),
    "dynamic": DynamicTree(depth=2, topk=2, num_nodes=4),
}
WARPS = {"none": {}, "t0.7_topk3": dict(temperature=0.7, top_k=3)}


@functools.lru_cache(maxsize=None)
def _pair():
    return tiny_pair(0, vocab_size=V, mix=0.5, head_scale=3.0)


@functools.lru_cache(maxsize=None)
def _exact(warp_key):
    return exact_joint(_pair()[0], PROMPT, L, **WARPS[warp_key])


def _prompts():
    return np.tile(np.asarray([PROMPT], np.int32), (CHUNK, 1))


def _count(run_chunk, seed: int) -> np.ndarray:
    """Histogram over the V**L cells of N_SAMPLES rows; ``run_chunk(key) -> int32[CHUNK, L]``."""
    counts = np.zeros(V**L, np.int64)
    for i in range(N_SAMPLES // CHUNK):
        toks = np.asarray(run_chunk(jax.random.fold_in(jax.random.key(seed), i)))
        assert toks.shape == (CHUNK, L) and toks.min() >= 0, "every row must emit L tokens"
        counts += np.bincount(toks @ CELL, minlength=V**L)
    return counts


@functools.lru_cache(maxsize=None)
def _autoregressive_counts(warp_key):
    target, _ = _pair()
    prompts = _prompts()

    def run(key):
        return gen.generate_autoregressive(key, target, prompts, max_new_tokens=L, **WARPS[warp_key]).tokens

    return _count(run, seed=4242 + len(warp_key))


def _speculative_counts(tree, scheme, warp_key, seed, hooks=None):
    target, draft = _pair()
    prompts = _prompts()
    warp = WARPS[warp_key]
    if hooks is None:

        def run(key):
            return gen.generate(key, target, draft, prompts, max_new_tokens=L, tree=tree, scheme=scheme, **warp).tokens

    else:  # a broken decoder: the library's round with an injected hook
        assert not warp
        tdef, tstate = nnx.split(target)
        ddef, dstate = nnx.split(draft)
        spec = resolve_tree(tree)
        cfg = gen.SpecConfig(
            tdef, ddef, spec, scheme, Warp(), Warp(), L, len(PROMPT) + L + spec.num_nodes + 1, hooks
        )
        lens = np.full((CHUNK,), len(PROMPT), np.int32)

        def run(key):
            return gen.run_compiled(cfg, tstate, dstate, key, prompts, lens, 1.0, 1.0).tokens

    return _count(run, seed)


def _marginals(joint):
    c = np.asarray(joint).reshape((V,) * L)
    return [c.sum(axis=tuple(a for a in range(L) if a != i)) for i in range(L)]


def _check(counts, warp_key, label):
    exact = _exact(warp_key)
    results = {"joint": chisquare_gof(counts, exact)}
    for i, (m, e) in enumerate(zip(_marginals(counts), _marginals(exact))):
        results[f"marginal{i}"] = chisquare_gof(m, e)
    results["two_sample"] = chisquare_two_sample(counts, _autoregressive_counts(warp_key))
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
    ("branch", "deterministic", "none"),
    ("chain", "without_replacement", "none"),
    ("chain", "deterministic", "none"),
    ("branch", "iid", "none"),
    ("chain", "without_replacement", "t0.7_topk3"),
]


@pytest.mark.parametrize(
    "tree,scheme,warp_key",
    CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CASES],
)
def test_generate_matches_exact_target_law(tree, scheme, warp_key):
    seed = 100 * list(TREES).index(tree) + 10 * gen.SCHEMES.index(scheme) + list(WARPS).index(warp_key)
    counts = _speculative_counts(TREES[tree], scheme, warp_key, seed)
    assert counts.sum() == N_SAMPLES
    _check(counts, warp_key, f"{tree}/{scheme}/{warp_key}")


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
    out = gen.generate(  # the chain/iid case's configuration and shapes: no new compilation
        jax.random.key(0), target, draft, _prompts(), max_new_tokens=L, tree=TREES["chain"], scheme="iid"
    )
    rate = np.asarray(out.accepted_per_depth)[:, 0].sum() / np.asarray(out.rounds).sum()
    print(f"depth-1 acceptance rate {rate:.3f}")
    assert 0.3 < rate < 0.9


# ---------------------------------------------------------------------------------- power


def _flatten_causal(mask):
    """The classic bug: a causal triangle over the flattened [root] + nodes."""
    return jnp.broadcast_to(jnp.tril(jnp.ones(mask.shape[-2:], jnp.bool_)), mask.shape)


def _depth_rows(target_probs, draft_probs, parents):
    """The classic bug: node i judged by the row of depth[i] ("row d = law at depth d"),
    not by its parent's row: row ``j + 1`` is replaced by row ``depth[j]``."""
    depth = jtree.tree_depths(parents)  # [N]
    src = jnp.concatenate([jnp.zeros((1,), jnp.int32), depth])  # new row r <- old row src[r]
    return target_probs[src], draft_probs[src]


MUTANTS = {
    "flatten-causal": gen._Hooks(verify_mask=_flatten_causal),
    "depth-as-row": gen._Hooks(accept_rows=_depth_rows),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_harness_rejects_broken_decoders(mutant):
    counts = _speculative_counts(TREES["branch"], "without_replacement", "none", seed=9000, hooks=MUTANTS[mutant])
    joint = chisquare_gof(counts, _exact("none"))
    two = chisquare_two_sample(counts, _autoregressive_counts("none"))
    print(f"mutant {mutant}: joint {joint}; two-sample {two}")
    assert joint.pvalue < MUTANT_THRESH, f"{joint}\n{joint.table()}"
    assert two.pvalue < MUTANT_THRESH, str(two)
