"""Speculative generation: greedy equivalence, compile hygiene, stop tokens and budget,
statistics, draft-proposal consistency, tree specs and boundary validation.

The statistical exactness of sampling lives in ``test_generate_exactness.py``.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import next_token_probs, tiny_pair
from flax import nnx

from jaxspec import Sampling, SettingError
from jaxspec.core import sampling
from jaxspec.nn.cache import commit
from jaxspec.core.sampling import Warp
from jaxspec.decode.draft import ModelDraft, propose_dynamic, propose_static
from jaxspec.decode.round import RoundParts
from jaxspec.nn.model import init_model, prefill
from jaxspec.core.treespec import DynamicTree, StaticTree, parse_tree, resolve_tree

# the module itself: once the package re-exports the function ``generate``, the
# attribute ``jaxspec.generate`` is that function
from jaxspec.decode import generate as gen
from jaxspec.decode import inputs

SCHEMES = sampling.SCHEMES
V = 8
# different lengths, including a one-token prompt (nothing to prefill)
PROMPTS = [[3, 1, 4, 1, 5], [2], [6, 5, 3, 5, 0, 7, 2], [1, 1], [0, 4, 2]]
MAX_NEW = 12
NON_BFS = [-1, 0, -1, 1, 0, 2]  # explicit parents, not breadth first (relabeled internally)
TREES = {
    "chain3": 3,
    "branch2x2": (2, 2),
    "parents": NON_BFS,
}
DYNAMIC = DynamicTree(depth=3, topk=2, num_nodes=6)


@pytest.fixture(scope="module")
def pair():
    # two layers, grouped-query attention: more cache plumbing than the exactness models
    return tiny_pair(3, vocab_size=V, hidden_size=16, num_heads=2, num_kv_heads=1, num_layers=2)


@pytest.fixture(scope="module")
def greedy_reference(pair):
    target, _ = pair
    return gen.generate_autoregressive(jax.random.key(0), target, PROMPTS, max_new_tokens=MAX_NEW,
                                       sampling=Sampling(temperature=0.0))


def _check_greedy(pair, ref, tree, scheme):
    target, draft = pair
    out = gen.generate(
        jax.random.key(1), target, draft, PROMPTS, max_new_tokens=MAX_NEW, tree=tree, scheme=scheme,
        sampling=Sampling(temperature=0.0)
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.full(len(PROMPTS), MAX_NEW))
    assert np.all(np.asarray(out.tau) >= 1.0)
    return out


# --------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_equals_target_greedy_every_scheme(pair, greedy_reference, scheme):
    """Temperature 0: token for token the target's greedy decoding (explicit, non-BFS tree)."""
    _check_greedy(pair, greedy_reference, TREES["parents"], scheme)


@pytest.mark.parametrize(
    "tree_name,scheme", [("chain3", "iid"), ("branch2x2", "deterministic")]
)
def test_greedy_equals_target_greedy_static_trees(pair, greedy_reference, tree_name, scheme):
    _check_greedy(pair, greedy_reference, TREES[tree_name], scheme)


def test_greedy_equals_target_greedy_dynamic_tree(pair, greedy_reference):
    out = _check_greedy(pair, greedy_reference, DYNAMIC, "deterministic")
    # the draft agrees with the target often enough for multi-token rounds
    assert np.asarray(out.tau).mean() > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tree_name", list(TREES))
def test_greedy_full_matrix(pair, greedy_reference, tree_name, scheme):
    _check_greedy(pair, greedy_reference, TREES[tree_name], scheme)


# --------------------------------------------------------------------------- compile hygiene


class _CountTraces:
    def __init__(self):
        self.events = []

    def __call__(self, name, *_, **kw):
        if name == "/jax/core/compile/jaxpr_trace_duration":
            self.events.append(kw.get("fun_name", name))

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def test_no_retrace_for_new_keys_and_prompts(pair):
    target, draft = pair
    kw = dict(max_new_tokens=5, tree=(2, 1), scheme="without_replacement", sampling=Sampling(temperature=1.0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, V, size=(4, 3)).astype(np.int32) for _ in range(3)]
    keys = [jax.random.key(i) for i in range(3)]
    jax.block_until_ready(gen.generate(keys[0], target, draft, prompts[0], **kw))  # warm up
    ar_kw = dict(max_new_tokens=5, sampling=Sampling(temperature=1.0))
    jax.block_until_ready(gen.generate_autoregressive(keys[0], target, prompts[0], **ar_kw))

    # the traced body runs once per trace: count with a pass-through hook
    calls = []

    def counting_mask(m):
        calls.append(1)
        return m

    tdef, tstate = nnx.split(target)
    drafter, dstate = ModelDraft.of(draft)
    cfg = gen.SpecConfig(
        tdef, drafter, resolve_tree((2, 1)), "without_replacement", Warp(), Warp(), 5, gen.PROMPT_BUCKET + 5 + 4 + 1,
        parts=RoundParts(verify_mask=counting_mask),
    )  # the prompts padded to generate's bucket
    with _CountTraces() as counter:
        for i, (k, p) in enumerate(zip(keys, prompts)):
            jax.block_until_ready(gen.generate(k, target, draft, p, **kw))
            other_temperature = {**kw, "sampling": Sampling(temperature=0.5 * i)}
            jax.block_until_ready(gen.generate(k, target, draft, p, **other_temperature))
            jax.block_until_ready(gen.generate_autoregressive(k, target, p, **ar_kw, stop_tokens=[i]))
            t, l = gen.prepare_prompts(p, V)
            gen.run_compiled(cfg, tstate, dstate, k, gen.pad_prompts(t, cfg.prompt_width), l, 1.0, 1.0)
    assert len(calls) == 1, f"the round body was traced {len(calls)} times"
    # public entry points: nothing traced after the warm-up (the hooked config: once)
    assert len(counter.events) == 1, counter.events

    # same shapes and temperature 0: array prompts == list prompts == target greedy
    greedy = Sampling(temperature=0.0)
    a = gen.generate(keys[0], target, draft, prompts[1], **{**kw, "sampling": greedy})
    b = gen.generate(keys[1], target, draft, prompts[1].tolist(), **{**kw, "sampling": greedy})
    c = gen.generate_autoregressive(keys[2], target, jnp.asarray(prompts[1]), **{**ar_kw, "sampling": greedy})
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


# --------------------------------------------------------------------------- stop / budget / stats


def test_stop_tokens_and_budget_per_row(pair, greedy_reference):
    """Greedy with a stop token == the greedy reference cut after its first stop token."""
    target, draft = pair
    ref = np.asarray(greedy_reference.tokens)
    stop = int(ref[0, 4])  # row 0 must stop at (or before) position 4
    out = gen.generate(
        jax.random.key(2), target, draft, PROMPTS, max_new_tokens=MAX_NEW, tree=(2, 2),
        scheme="deterministic", sampling=Sampling(temperature=0.0), stop_tokens=(stop,),
    )
    ar = gen.generate_autoregressive(
        jax.random.key(2), target, PROMPTS, max_new_tokens=MAX_NEW,
        sampling=Sampling(temperature=0.0), stop_tokens=[stop]
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    for b in range(len(PROMPTS)):
        hits = np.flatnonzero(ref[b] == stop)
        want = hits[0] + 1 if hits.size else MAX_NEW
        assert lengths[b] == want, (b, lengths[b], want)
        np.testing.assert_array_equal(tokens[b, :want], ref[b, :want])
        assert np.all(tokens[b, want:] == -1)
    assert lengths[0] <= 5 and lengths.min() < lengths.max()  # rows end independently
    np.testing.assert_array_equal(tokens, np.asarray(ar.tokens))
    np.testing.assert_array_equal(lengths, np.asarray(ar.lengths))


@pytest.mark.parametrize("scheme,tree", [("iid", 3), ("deterministic", DYNAMIC)])
def test_sampling_stats_and_padding(pair, scheme, tree):
    """Sampling with a stop token; same shapes as the greedy tests (no new compilation)."""
    target, draft = pair
    m, stop = MAX_NEW, 5
    prompts = [PROMPTS[2]] * 3 + PROMPTS[:2]  # shape (5, 7) as PROMPTS
    b = len(prompts)
    out = gen.generate(
        jax.random.key(7), target, draft, prompts, max_new_tokens=m, tree=tree, scheme=scheme,
        sampling=Sampling(temperature=1.0), stop_tokens=[stop],
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    tcalls, dcalls = np.asarray(out.target_calls), np.asarray(out.draft_calls)
    acc, rounds = np.asarray(out.accepted_per_depth), np.asarray(out.rounds)
    spec = resolve_tree(tree)
    n, depth = spec.num_nodes, spec.depth
    assert tokens.shape == (b, m) and tokens.dtype == np.int32
    for r in range(b):
        ln = lengths[r]
        assert 1 <= ln <= m
        assert np.all(tokens[r, ln:] == -1) and np.all(tokens[r, :ln] >= 0)
        assert not np.any(tokens[r, : ln - 1] == stop)  # nothing emitted after a stop token
        if ln < m:
            assert tokens[r, ln - 1] == stop
    assert lengths.sum() == (tokens >= 0).sum()
    np.testing.assert_array_equal(tcalls, rounds)
    per_round = depth + 1 if isinstance(spec, DynamicTree) else depth  # static: deepest level never forwarded
    np.testing.assert_array_equal(dcalls, rounds * per_round)
    np.testing.assert_allclose(np.asarray(out.tau), lengths / tcalls, rtol=1e-6)
    emitted = acc.sum(axis=1) + tcalls  # accepted + 1 per round
    assert np.all(lengths <= emitted) and np.all(emitted - lengths <= n)  # only the last round is cut
    assert acc.shape == (b, depth)
    assert np.all(np.diff(acc, axis=1) <= 0)  # depth d+1 accepted only after depth d
    s = out.summary()
    assert tuple(s) == gen.SUMMARY_KEYS
    assert s["num_tokens"] == lengths.sum() and abs(s["tokens_per_target_call"] - lengths.sum() / tcalls.sum()) < 1e-9
    assert (s["target_calls"], s["draft_calls"]) == (tcalls.sum(), dcalls.sum())
    assert s["rounds"] == rounds.sum() and s["loop_rounds"] == rounds.max() < s["rounds"]  # sum vs batch max
    np.testing.assert_allclose(s["accept_rate_per_depth"], acc.sum(axis=0) / rounds.sum())
    assert len(s["accept_rate_per_depth"]) == depth
    # identical prompts in a batch are independent samples
    assert len({tuple(t) for t in tokens[:3].tolist()}) > 1


def _with_eos(model, eos):
    """``model``'s weights under a config whose ``eos_token_id`` is ``eos``."""
    out = init_model(dataclasses.replace(model.config, eos_token_id=eos), jax.random.key(0))
    nnx.update(out, nnx.state(model))
    return out


def test_stop_tokens_default_to_the_targets_eos(pair, greedy_reference):
    """``stop_tokens`` unset: a row ends at the target config's ``eos_token_id`` (as with
    ``stop_tokens=[eos]``); ``stop_tokens=()`` turns stopping off. A list of EOS ids (as some
    HF configs give) stops at any of them. The draft's config plays no part."""
    target, draft = pair
    ref = np.asarray(greedy_reference.tokens)
    eos = int(ref[0, 4])
    target_eos = _with_eos(target, eos)
    assert target_eos.config.eos_token_ids == (eos,) and draft.config.eos_token_id is None
    assert gen.resolve_stop_tokens(None, target_eos) == (eos,) and gen.resolve_stop_tokens(None, target) == ()
    assert gen.resolve_stop_tokens((), target_eos) == ()
    kw = dict(max_new_tokens=MAX_NEW, sampling=Sampling(temperature=0.0))
    spec = gen.generate(jax.random.key(2), target_eos, draft, PROMPTS, tree=(2, 2), scheme="deterministic", **kw)
    ar = gen.generate_autoregressive(jax.random.key(2), target_eos, PROMPTS, **kw)
    want = gen.generate_autoregressive(jax.random.key(2), target, PROMPTS, stop_tokens=[eos], **kw)
    assert int(np.asarray(want.lengths)[0]) <= 5  # row 0 does stop early
    for out in (spec, ar):
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(want.tokens))
        np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(want.lengths))
    for out in (gen.generate(jax.random.key(2), target_eos, draft, PROMPTS, tree=(2, 2), scheme="deterministic",
                             stop_tokens=(), **kw),
                gen.generate_autoregressive(jax.random.key(2), target_eos, PROMPTS, stop_tokens=(), **kw)):
        np.testing.assert_array_equal(np.asarray(out.tokens), ref)  # runs past EOS to the budget
        np.testing.assert_array_equal(np.asarray(out.lengths), MAX_NEW)
    other = int(ref[1, 2]) if int(ref[1, 2]) != eos else int(ref[1, 3])
    listed = _with_eos(target, [other, eos])
    assert listed.config.eos_token_id == (other, eos)
    out = gen.generate_autoregressive(jax.random.key(2), listed, PROMPTS, **kw)
    want = gen.generate_autoregressive(jax.random.key(2), target, PROMPTS, stop_tokens=[eos, other], **kw)
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(want.lengths))


def test_autoregressive_stats(pair):
    target, _ = pair
    out = gen.generate_autoregressive(jax.random.key(0), target, PROMPTS, max_new_tokens=MAX_NEW, stop_tokens=[0])
    lengths = np.asarray(out.lengths)
    np.testing.assert_array_equal(np.asarray(out.target_calls), lengths)
    np.testing.assert_array_equal(np.asarray(out.draft_calls), 0)
    np.testing.assert_allclose(np.asarray(out.tau), 1.0)
    tokens = np.asarray(out.tokens)
    for r, ln in enumerate(lengths):
        assert np.all(tokens[r, ln:] == -1) and (ln == MAX_NEW or tokens[r, ln - 1] == 0)


# --------------------------------------------------------------------------- draft consistency


def _probs(model, seq):
    return next_token_probs(model, [seq])[0]


def test_static_draft_rows_and_cache_match_reference(pair):
    """Draft rows == forward_logits along each root-to-node path; and after committing a
    path that ends at the deepest level (never forwarded by the draft), the next round's
    root row is still the law after prefix + path + root (the stale K/V is recomputed)."""
    _, draft = pair
    spec = resolve_tree(NON_BFS)
    prompt = PROMPTS[0]
    tokens = jnp.asarray([prompt], jnp.int32)
    lens = jnp.asarray([len(prompt)], jnp.int32)
    gdef, state = nnx.split(draft)
    cap = 16
    parents = spec.parents_array
    leaf = int(np.argmax(spec.depths))  # commit the root and the deepest path
    path_nodes = [leaf]
    while parents[path_nodes[0]] >= 0:
        path_nodes.insert(0, int(parents[path_nodes[0]]))
    offsets = jnp.asarray([[0] + [j + 1 for j in path_nodes]], jnp.int32)
    nxt = 0

    @jax.jit
    def run(state, key):
        model = nnx.merge(gdef, state)
        _, cache = prefill(model, tokens, lens - 1, cap)
        propose = functools.partial(propose_static, model, tree=spec, scheme="iid", warp=Warp(), temperature=1.0)
        node_tokens, rows, cache = propose(cache, tokens[:, -2], tokens[:, -1], key[None])
        cache = commit(cache, offsets, jnp.asarray([len(path_nodes) + 1]))
        leaf_token = node_tokens[:, leaf]
        _, rows2, _ = propose(cache, leaf_token, jnp.asarray([nxt]), key[None])
        return node_tokens[0], rows[0], rows2[0, 0]

    node_tokens, rows, after_commit = map(np.asarray, run(state, jax.random.key(3)))
    paths = [[]]
    for j, p in enumerate(parents):
        paths.append(paths[p + 1] + [int(node_tokens[j])])
    has_children = np.flatnonzero(np.bincount(parents + 1, minlength=spec.num_nodes + 1) > 0)
    ref = next_token_probs(draft, [prompt + paths[r] for r in has_children])
    np.testing.assert_allclose(rows[has_children], ref, atol=2e-5)  # leaf rows are unused
    np.testing.assert_allclose(after_commit, _probs(draft, prompt + paths[leaf + 1] + [nxt]), atol=2e-5)


def _dynamic_reference(model, prompt, tree: DynamicTree):
    """EAGLE-2 selection in plain Python from forward_logits (float64 scores)."""
    k = tree.topk

    def top(q):
        return sorted(range(q.shape[0]), key=lambda i: (-q[i], i))[:k]

    pool = []  # (token, score, parent pool index, path tokens)
    q = _probs(model, prompt).astype(np.float64)
    for t in top(q):
        pool.append((t, np.log(q[t]), -1, [t]))
    frontier = list(range(k))
    for _ in range(1, tree.depth):
        children = []
        for f in frontier:
            tok, score, _, path = pool[f]
            q = _probs(model, prompt + path).astype(np.float64)
            for t in top(q):
                children.append((t, score + np.log(q[t]), f, path + [t]))
        start = len(pool)
        pool.extend(children)
        order = sorted(range(len(children)), key=lambda i: (-children[i][1], i))[:k]
        frontier = [start + i for i in order]
    chosen = sorted(sorted(range(len(pool)), key=lambda i: (-pool[i][1], i))[: tree.num_nodes])
    index = {p: i for i, p in enumerate(chosen)}
    tokens = [pool[p][0] for p in chosen]
    parents = [index[pool[p][2]] if pool[p][2] >= 0 else -1 for p in chosen]
    return tokens, parents


def test_dynamic_tree_matches_python_reference(pair):
    _, draft = pair
    tree = DynamicTree(depth=3, topk=3, num_nodes=8)
    gdef, state = nnx.split(draft)
    prompts = [PROMPTS[0], PROMPTS[2]]
    tokens = jnp.asarray([p[:5] for p in prompts], jnp.int32)
    lens = jnp.asarray([5, 5], jnp.int32)

    @jax.jit
    def run(state):
        model = nnx.merge(gdef, state)
        _, cache = prefill(model, tokens, lens - 1, 32)
        return propose_dynamic(model, cache, tokens[:, -1], tree, Warp(), 1.0)[:2]

    node_tokens, parents = map(np.asarray, run(state))
    for b, p in enumerate(prompts):
        ref_tokens, ref_parents = _dynamic_reference(draft, p[:5], tree)
        np.testing.assert_array_equal(node_tokens[b], ref_tokens)
        np.testing.assert_array_equal(parents[b], ref_parents)
        assert np.all(parents[b] < np.arange(tree.num_nodes))


# --------------------------------------------------------------------------- tree specs


def test_static_tree_breadth_first_relabel():
    t = StaticTree.from_parents([-1, 0, -1, 1])  # docstring example
    assert t.parents == (-1, -1, 0, 2)
    np.testing.assert_array_equal(t.depths, [1, 1, 2, 3])
    assert t.levels == ((0, 2), (2, 3), (3, 4))
    t = resolve_tree(NON_BFS)
    assert t.parents == (-1, -1, 0, 0, 1, 2)  # siblings keep their order
    np.testing.assert_array_equal(
        t.full_mask.astype(int),
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
    )
    with pytest.raises(ValueError, match="breadth-first"):
        StaticTree((-1, 0, -1))


@pytest.mark.parametrize(
    "arg,parents",
    [
        (3, (-1, 0, 1)),
        ((2, 1), (-1, -1, 0, 1)),
        ([-1, 0, 0], (-1, 0, 0)),
        (np.array([-1, -1]), (-1, -1)),
        ("chain:2", (-1, 0)),
        ("4", (-1, 0, 1, 2)),
        ("branch:3,1", (-1, -1, -1, 0, 1, 2)),
        ("parents:-1,0,0,1", (-1, 0, 0, 1)),
    ],
)
def test_resolve_and_parse_tree(arg, parents):
    assert resolve_tree(arg).parents == parents


def test_parse_dynamic_tree():
    assert parse_tree("dynamic:depth=4,topk=4,nodes=16") == DynamicTree(4, 4, 16)
    assert resolve_tree(DYNAMIC) is DYNAMIC
    assert str(DynamicTree(4, 4, 16)) == "dynamic:depth=4,topk=4,nodes=16"


@pytest.mark.parametrize(
    "spec,match",
    [
        ("chain:x", "'chain:x'.*integers"),
        ("branch:2,0", "'branch:2,0'.*widths"),
        ("parents:0,1", "'parents:0,1'.*parents"),
        ("dynamic:depth=2,topk=2", "missing"),
        ("dynamic:depth=2,topk=2,nodes=99", "at most"),
        ("dynamic:depth=4,topk=4,nodes=2", r"num_nodes = 2 < depth = 4: .* expected num_nodes >= depth \(e.g. depth=2\)"),
        ("dynamic:width=2", "unknown field"),
        ("star:3", "unknown kind"),
        ("", "expected"),
        # malformed lists are errors, not silently repaired
        ("branch:3,,2", r"'branch:3,,2': entry 1 is empty"),
        ("chain:4,", r"'chain:4,': entry 1 is empty"),
        ("parents:-1,,0", r"'parents:-1,,0': entry 1 is empty"),
        ("dynamic:depth=2,depth=3,topk=2,nodes=4", r"field 'depth' given twice"),
        ("dynamic:depth=2,,topk=2,nodes=4", r"entry 1 is empty"),
    ],
)
def test_parse_tree_errors_name_the_spec(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_tree(spec)


@pytest.mark.parametrize("bad", [0, -2, (), (2, 0), [0, 1], [-1, 1], True, 2.5, [[-1]]])
def test_resolve_tree_errors(bad):
    with pytest.raises(ValueError, match="tree"):
        resolve_tree(bad)


# --------------------------------------------------------------------------- validation


def test_boundary_validation(pair):
    target, draft = pair
    k = jax.random.key(0)
    ok = dict(max_new_tokens=4, tree=2)

    def err(match, *args, **kw):
        a = (k, target, draft, [[1, 2]]) if not args else args
        with pytest.raises(ValueError, match=match):
            gen.generate(*a, **{**ok, **kw})

    err(r"prompts\[1\]: empty prompt", k, target, draft, [[1], []])
    err("prompts: expected at least one prompt", k, target, draft, [])
    err(r"prompts\[0\]\[1\] = -1", k, target, draft, [[1, -1]])
    err(rf"prompts\[1\]\[0\] = {V}: expected a token id in \[0, {V}\)", k, target, draft, [[1], [V]])
    err("prompts: expected int32", k, target, draft, np.zeros((2,), np.int32))
    err("prompts.*dtype", k, target, draft, np.zeros((1, 2), np.float32))
    err(r"prompts\[0\] = 3", k, target, draft, [3, 4])
    err("max_new_tokens = 0", max_new_tokens=0)
    err("max_new_tokens = 2.0", max_new_tokens=2.0)
    err("scheme = 'greedy'", scheme="greedy")
    # a law's fields are checked when its Sampling is made, a SettingError naming the field
    for bad, match in (
        (dict(temperature=-1.0), r"^temperature = -1.0: expected a finite number >= 0 \(0 means greedy\)$"),
        (dict(top_k=0), r"^top_k = 0: expected an integer >= 1 \(or None: no top-k\)$"),
        (dict(top_p=1.5), r"^top_p = 1.5: expected a number in \(0, 1\] \(or None: no top-p\)$"),
        (dict(temperature=float("nan")), r"^temperature = nan: expected a finite number >= 0"),
        (dict(top_p=0.0), r"^top_p = 0.0: expected a number in \(0, 1\]"),
    ):
        with pytest.raises(SettingError, match=match):
            gen.generate(k, target, draft, [[1, 2]], **ok, sampling=Sampling(**bad))
    err(r"^sampling = 0.5: expected a jaxspec.Sampling, e.g. jaxspec.Sampling\(temperature=0.5\)$", sampling=0.5)
    err(r"^draft_sampling = \{'top': 0.9\}: expected a jaxspec.Sampling, or a dict of some of its fields "
        r"\(temperature, top_k, top_p, min_p\); 'top' is none of them", draft_sampling={"top": 0.9})
    err(r"^top_p = 1.5: expected a number in \(0, 1\]", draft_sampling={"top_p": 1.5})  # a dict's value, checked
    err(r"stop_tokens\[0\] = 8", stop_tokens=[V])
    err(r"^scheme = 'iid' and tree = DynamicTree\(depth=2, topk=2, num_nodes=3\): a dynamic tree ranks fixed "
        r"candidates; expected scheme 'deterministic' \(its default\)$", tree=DynamicTree(2, 2, 3), scheme="iid")
    err(r"^tree = DynamicTree\(depth=2, topk=9, num_nodes=9\) and scheme = 'deterministic': a dynamic tree's topk "
        r"\(9\) exceeds the vocabulary \(8 tokens\); expected topk <= 8", tree=DynamicTree(2, 9, 9),
        scheme="deterministic")
    err(rf"a node has {V + 1} children, more than the {V} distinct tokens of the vocabulary", tree=(V + 1,),
        scheme="without_replacement")
    err("max_position_embeddings", max_new_tokens=60)
    err("key", None, target, draft, [[1]])
    other, _ = tiny_pair(0, vocab_size=4)
    err("draft: vocab_size = 4; expected the target's vocab_size = 8", k, target, other, [[1]])
    err("draft: expected a jaxspec.Transformer", k, target, "draft", [[1]])
    err("on_round = 5: expected None or a function", on_round=5)
    with pytest.raises(ValueError, match="on_round = 'x'"):
        gen.generate_autoregressive(k, target, [[1]], max_new_tokens=1, on_round="x")
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate_autoregressive(k, target, [[1]], max_new_tokens=-1)
    with pytest.raises(ValueError, match=r"prompts\[0\]: empty"):
        gen.generate_autoregressive(k, target, [[]], max_new_tokens=1)


def test_stop_tokens_accept_arrays():
    """stop_tokens as an int, a sequence, a 0-d / 1-d numpy or jax array: the same sorted,
    de-duplicated tuple; bad arrays are refused with the argument named."""
    check = inputs.check_stop
    assert check(3, 8) == check([3], 8) == check(np.array(3), 8) == check(jnp.array([3]), 8) == (3,)
    assert check(np.array([5, 1, 5], np.int32), 8) == (1, 5)
    assert check(np.array([], np.int32), 8) == ()
    for bad, msg in ((np.zeros((1, 2), np.int32), "shape"), (np.array([1.5]), r"stop_tokens\[0\] = 1.5"),
                     (np.array([True]), r"stop_tokens\[0\] = True"), (np.array(8), r"stop_tokens\[0\] = 8"),
                     ("3", "expected a sequence")):
        with pytest.raises(ValueError, match=msg):
            check(bad, 8)


def test_tree_defaults_to_the_cli_tree(pair):
    """``generate`` without ``tree=`` drafts the CLI's default tree (chain:4): same key, same
    tokens, and rounds of up to 5 tokens."""
    target, draft = pair
    from jaxspec.cli.generate import DEFAULT_TREE as CLI_TREE  # noqa: PLC0415

    assert gen.DEFAULT_TREE is CLI_TREE == "chain:4"  # declared once (jaxspec.decode.defaults)
    kw = dict(max_new_tokens=MAX_NEW, sampling=Sampling(temperature=1.0))
    a = gen.generate(jax.random.key(5), target, draft, PROMPTS, **kw)
    b = gen.generate(jax.random.key(5), target, draft, PROMPTS, tree="chain:4", **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert len(a.accepted_per_depth[0]) == 4


def test_cli_and_python_defaults_agree():
    """``jaxspec generate`` and ``jaxspec.generate`` sample the same way by default."""
    import inspect  # noqa: PLC0415

    from jaxspec.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["generate", "--prompt", "x"])
    params = inspect.signature(gen.generate).parameters
    assert params["sampling"].default is params["draft_sampling"].default is None  # None: Sampling()
    law = Sampling()
    assert (args.temperature, args.top_k, args.top_p) == (law.temperature, law.top_k, law.top_p) == (1.0, None, None)
    # --tree's parser default is None (it follows the drafter); for the default target and drafter
    # it resolves to jaxspec.generate's default, as `jaxspec generate` resolves it.
    from jaxspec.cli import gen_setup  # noqa: PLC0415
    from jaxspec.cli.generate import DEFAULT_TREE as CLI_TREE  # noqa: PLC0415

    assert args.tree is None and params["tree"].default is None  # None: the drafter's own tree, else the default
    gen_setup.default_draft_and_tree(args, CLI_TREE)
    assert args.tree == gen.DEFAULT_TREE == "chain:4"
    assert args.rule == params["rule"].default == "auto"


def test_a_partial_draft_law_is_set_over_the_default():
    """draft_sampling as a dict of some fields: those fields over draft_law's default (the
    target's law under the sampling schemes, no warp under deterministic), the one rule
    jaxspec verify's --draft-* flags go through."""
    from jaxspec.core.settings import check_draft_sampling, draft_law

    law = Sampling(temperature=0.7, top_k=3)
    assert draft_law("iid", law, {"temperature": 0.5}) == Sampling(temperature=0.5, top_k=3)
    assert draft_law("deterministic", law, {"top_p": 0.9}) == Sampling(top_p=0.9)
    assert draft_law("without_replacement", law, None) == law and check_draft_sampling({}) is None
