"""speculative_accept: literal cases, edge cases without NaN, validation, agreement with
the sequential reference walk (tests/_reference.py), jit/vmap and traced parents."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import reference_accept, reference_probabilities

import jaxspec
from jaxspec.core.rules import speculative_accept
from jaxspec.core.token_rule import accept_probabilities
from jaxspec.core.sampling import SCHEMES

TREE = [-1, -1, 0, 0, 1, 2]


def _rand_rows(rng, n_rows, v, conc=0.5):
    return rng.dirichlet(np.full(v, conc), size=n_rows).astype(np.float32)


def test_equal_laws_accept_everything_on_a_chain():
    p = np.full((4, 5), 0.2, np.float32)
    keys = jax.random.split(jax.random.key(0), 1000)
    r = jax.vmap(lambda k: speculative_accept(k, [-1, 0, 1], jnp.array([1, 2, 3]), p, p, scheme="iid"))(keys)
    assert (r.num_tokens == 4).all() and (r.num_accepted == 3).all()
    np.testing.assert_array_equal(r.tokens[:, :3], np.tile([1, 2, 3], (1000, 1)))
    np.testing.assert_array_equal(r.accepted_nodes[0], [0, 1, 2])
    np.testing.assert_array_equal(r.accepted_per_depth[0], [1, 1, 1])
    assert (r.last_node == 2).all()


def test_zero_target_probability_rejects_and_resamples_from_target():
    # p puts no mass on the drafted token 0: always rejected, residual = p (q's mass is on 0)
    p = np.array([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], np.float32)
    q = np.array([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]], np.float32)
    keys = jax.random.split(jax.random.key(1), 4000)
    r = jax.jit(jax.vmap(lambda k: speculative_accept(k, [-1], jnp.array([0]), p, q, scheme="iid")))(keys)
    assert (r.num_accepted == 0).all()
    first = np.asarray(r.tokens[:, 0])
    assert set(np.unique(first)) == {1, 2}
    assert abs((first == 1).mean() - 0.5) < 0.05
    assert (np.asarray(r.tokens[:, 1]) == -1).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_nan_on_degenerate_inputs(scheme):
    v = 4
    onehot = np.eye(v, dtype=np.float32)
    cases = {
        # p == q: residual sums to 0 in exact arithmetic
        "p_equals_q": (np.full((3, v), 0.25, np.float32), np.full((3, v), 0.25, np.float32)),
        # temperature 0 target (one-hot p), draft with zeros
        "onehot_p": (onehot[[2, 1, 0]], np.array([[0.5, 0.5, 0, 0]] * 3, np.float32)),
        # draft never proposes what the target wants, target never emits drafted tokens
        "disjoint": (np.array([[0, 0, 0.5, 0.5]] * 3, np.float32), np.array([[0.5, 0.5, 0, 0]] * 3, np.float32)),
    }
    keys = jax.random.split(jax.random.key(2), 256)
    # one compile for every case: the rows and tokens are arguments (validated below, at
    # trace time, where they are concrete)
    rule = jax.jit(jax.vmap(
        lambda k, t, p, q: speculative_accept(k, [-1, -1], t, p, q, scheme=scheme), in_axes=(0, None, None, None)))
    for name, (p, q) in cases.items():
        for toks in ([0, 1], [2, 2], [3, 0]):
            acc, res = accept_probabilities([-1, -1], jnp.array(toks), p, q, scheme=scheme)
            assert np.isfinite(np.asarray(acc)).all() and np.isfinite(np.asarray(res)).all(), name
            concrete = lambda k: speculative_accept(k, [-1, -1], np.array(toks), p, q, scheme=scheme)  # noqa: E731
            if scheme != "deterministic" and not all(q[0, t] > 0 for t in toks):
                # concrete tokens the draft law could not have drawn are refused (issue 41); traced
                # ones (the jitted rule below) cannot be checked, and must still give no NaN
                with pytest.raises(ValueError, match=r"draft_probs\[0\]\[\d\] = 0, so the draft law .* could not"):
                    jax.eval_shape(concrete, keys[0])
            else:
                jax.eval_shape(concrete, keys[0])  # accepted as valid input
            r = rule(keys, jnp.array(toks), p, q)
            out = np.asarray(r.tokens)
            emitted = out[np.arange(256), np.asarray(r.num_tokens) - 1]
            # the emitted extra token is never a zero-probability token of the target row
            # it was drawn from (row last_node + 1: its residual, or the bonus law)
            assert (emitted >= 0).all(), name
            rows = np.asarray(r.last_node) + 1
            assert (p[rows, emitted] > 0).all(), (name, toks)


def test_onehot_target_reproduces_greedy():
    # temperature 0: p one-hot at token 2 everywhere; any scheme/draft must emit 2s
    v = 4
    p = np.tile(np.eye(v, dtype=np.float32)[2], (7, 1))
    rng = np.random.default_rng(0)
    q = _rand_rows(rng, 7, v)
    for scheme in SCHEMES:
        keys = jax.random.split(jax.random.key(3), 500)
        toks = jnp.array([1, 2, 2, 0, 3, 2])
        r = jax.jit(jax.vmap(lambda k: speculative_accept(k, TREE, toks, p, q, scheme=scheme)))(keys)
        out, n = np.asarray(r.tokens), np.asarray(r.num_tokens)
        for i in range(500):
            assert (out[i, : n[i]] == 2).all() and (out[i, n[i]:] == -1).all()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("parents", [[-1, 0, 1, 2], TREE, [-1, -1, -1, 0, 0, 0, 3, 3, 6]])
def test_agrees_with_sequential_reference(scheme, parents):
    """Same key -> same emitted tokens as the straightforward walk, on random rows."""
    rng = np.random.default_rng(len(parents))
    n, v = len(parents), 5

    @jax.jit
    def both(keys, toks, p, q):
        a = jax.vmap(lambda k: speculative_accept(k, parents, toks, p, q, scheme=scheme))(keys)
        b = jax.vmap(lambda k: reference_accept(k, parents, toks, p, q, scheme=scheme))(keys)
        return a, b

    mism = 0
    for trial in range(6):
        p, q = _rand_rows(rng, n + 1, v), _rand_rows(rng, n + 1, v)
        if scheme == "iid":
            toks = rng.integers(0, v, n)
        else:  # distinct siblings (as drawn without replacement / top-k)
            toks = np.zeros(n, np.int64)
            for par in set(parents):
                kids = [j for j, pp in enumerate(parents) if pp == par]
                toks[kids] = rng.permutation(v)[: len(kids)]
        a, (b_tok, b_n, _) = both(jax.random.split(jax.random.key(trial), 300), jnp.asarray(toks, jnp.int32), p, q)
        mism += int((np.asarray(a.tokens) != np.asarray(b_tok)).any(axis=1).sum())
        np.testing.assert_array_equal(a.num_accepted, b_n)
    assert mism == 0


def test_path_choice_literal():
    """Which tests passed -> the accepted path, on the tree 0 -> {2, 3}, 1 -> {4}, 2 -> {5}
    (TREE) and on the chain of 4: the first passing sibling is followed, a later passing
    sibling and a passing node off the path do not count."""
    from jaxspec.core import token_rule
    def choose(parents, passed):
        acc = jnp.asarray(passed, jnp.float32)
        num, last, nodes = token_rule.choose_path(token_rule.tree_structure(parents), acc, jnp.full(acc.shape, 0.5))
        return int(num), int(last), np.asarray(nodes).tolist()

    #                 node: 0  1  2  3  4  5
    assert choose(TREE, [1, 1, 0, 1, 1, 1]) == (2, 3, [0, 3, -1, -1, -1, -1])  # 0, then 3 (2 failed)
    assert choose(TREE, [1, 1, 1, 1, 0, 1]) == (3, 5, [0, 2, 5, -1, -1, -1])  # 0 before 1; 2 before 3
    assert choose(TREE, [0, 1, 1, 1, 1, 0]) == (2, 4, [1, 4, -1, -1, -1, -1])  # 0 failed: its subtree is off
    assert choose(TREE, [0, 0, 1, 1, 1, 1]) == (0, -1, [-1] * 6)
    assert choose([-1, 0, 1, 2], [1, 1, 0, 1]) == (2, 1, [0, 1, -1, -1])  # node 3 passed, after a failure
    assert choose([-1, 0, 1, 2], [1, 1, 1, 1]) == (4, 3, [0, 1, 2, 3])
    assert choose([-1, 0, 1, 2], [0, 1, 1, 1]) == (0, -1, [-1] * 4)


@pytest.mark.parametrize("parents", [[-1, 0, 1, 2, 3, 4, 5, 6], TREE, [-1, -1, -1, 0, 0, 0, 1, 3, 3, 3, 3, 7],
                                     [-1] * 6, [-1, 0, 0, 1, 1, 2, 2, 3, 3], [-1, 0, 1, -1, 3, 0, 4]])
def test_path_choice_forms_agree(parents):
    """The path choice by first failed test (static chain), depth by depth (other static
    trees) and by [N, N] masks (traced trees) are one function: 20,000 random test
    outcomes, including the all-pass and all-fail corners, give the same path all ways
    (the last tree is numbered depth-first: a depth's rows are not a contiguous range)."""
    from jaxspec.core import token_rule
    n = len(parents)
    rng = np.random.default_rng(3)
    acc = rng.random((20000, n)) < rng.choice([0.1, 0.5, 0.9], size=(20000, 1))
    acc[:2] = [[True] * n, [False] * n]
    acc = jnp.asarray(acc)
    static = token_rule.tree_structure(parents)
    form = token_rule._choose_chain if static.children.shape[1] == 1 else token_rule._choose_by_depth
    assert (form is token_rule._choose_chain) == (parents == list(range(-1, n - 1)))
    got = jax.jit(jax.vmap(lambda a: token_rule.choose_path(static, a.astype(jnp.float32), jnp.full((n,), 0.5))))(acc)
    ref = jax.jit(lambda par: jax.vmap(lambda a: token_rule._choose_by_masks(token_rule.tree_structure(par), a))(acc))(
        jnp.asarray(parents, jnp.int32))
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    # the cases exercise every path length from 0 to the depth of the tree
    assert set(np.asarray(got[0]).tolist()) == set(range(int(np.asarray(static.depth).max()) + 1))


def test_traced_parents_match_static():
    rng = np.random.default_rng(5)
    p, q = _rand_rows(rng, 7, 6), _rand_rows(rng, 7, 6)
    toks = jnp.array([0, 1, 2, 3, 4, 5])
    keys = jax.random.split(jax.random.key(9), 200)
    for scheme in SCHEMES:
        static = jax.jit(jax.vmap(lambda k: speculative_accept(k, TREE, toks, p, q, scheme=scheme)))(keys)
        traced = jax.jit(
            lambda par: jax.vmap(lambda k: speculative_accept(k, par, toks, p, q, scheme=scheme))(keys)
        )(jnp.array(TREE, jnp.int32))
        np.testing.assert_array_equal(static.tokens, traced.tokens)
        np.testing.assert_array_equal(static.accepted_nodes, traced.accepted_nodes)


@pytest.mark.parametrize("fetch", ["carried", "refetched"])
@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_path_walk_matches_all_rows_form(scheme, fetch, monkeypatch):
    """Static branching trees take the path walk (only the rows on the accepted path are
    judged over the vocabulary); traced parents take the all-rows form. Two independent
    evaluations of the same rule: same key -> same tokens, on an unbalanced tree with a
    two-level draw (V = 200), repeated sibling tokens (iid), and a draft row whose support
    the siblings exhaust (without replacement: point-mass proposals). Both ways the walk
    gets the emitted row's p and q: carried from the step that stopped (small V) and
    fetched again (large V; forced here by lowering the threshold)."""
    from jaxspec.core import token_rule
    if fetch == "refetched":
        monkeypatch.setattr(token_rule, "_CARRY_ROWS_MAX_V", 0)

    par = [-1, -1, -1, 0, 0, 0, 1, 3, 3, 3, 3, 7]  # ranks up to 4, leaves at depths 1-4
    st = token_rule.tree_structure(par)
    assert token_rule._use_path_walk(st, scheme)
    traced_choice = []
    jax.make_jaxpr(lambda a: traced_choice.append(
        token_rule._use_path_walk(token_rule.tree_structure(a), scheme)))(jnp.asarray(par, jnp.int32))
    assert traced_choice == [False]
    rng = np.random.default_rng(11)
    n, v = len(par), 200
    q = _rand_rows(rng, n + 1, v, conc=0.3)
    q[4] = 0.0  # row of node 3: q has support {5, 6}; its 4 children try 5, 6, 6, 5 (iid: repeats)
    q[4, 5], q[4, 6] = 0.7, 0.3
    # target rows near the draft rows and tokens drawn from the draft rows: every depth
    # is reached and every rank gets tried
    p = (0.6 * q + 0.4 * _rand_rows(rng, n + 1, v, conc=0.3)).astype(np.float32)
    toks = np.array([rng.choice(v, p=q[j + 1] / q[j + 1].sum()) for j in par])
    if scheme == "iid":
        toks[[7, 8, 9, 10]] = [5, 6, 6, 5]  # drawable: a token q gives no mass is refused
        toks[4] = toks[3]  # a repeated sibling token
    else:  # drafts the scheme can produce: distinct siblings; once {5, 6} is exhausted,
        # the zero-probability tokens in index order (as draw_without_replacement does)
        toks[[7, 8, 9, 10]] = [5, 6, 0, 1]
        p[4] *= 0.5  # and give those point-mass siblings target mass, so they get accepted
        p[4, [0, 1]] += 0.25
        for kids in ([0, 1, 2], [3, 4, 5]):
            row = q[par[kids[0]] + 1]
            while len(set(toks[kids].tolist())) < len(kids):
                toks[kids[-1]] = rng.choice(v, p=row / row.sum())
    keys = jax.random.split(jax.random.key(12), 4000)
    toks = jnp.asarray(toks, jnp.int32)

    def run(parents):
        return jax.vmap(lambda k: speculative_accept(k, parents, toks, p, q, scheme=scheme))(keys)

    static = jax.jit(lambda: run(par))()
    traced = jax.jit(run)(jnp.asarray(par, jnp.int32))
    np.testing.assert_array_equal(static.accepted_nodes, traced.accepted_nodes)
    np.testing.assert_array_equal(static.last_node, traced.last_node)
    np.testing.assert_array_equal(static.tokens, traced.tokens)
    # the cross-check reached every depth and the exhausted row's later siblings
    depths = np.asarray(static.num_accepted)
    assert set(range(5)) <= set(depths.tolist()), np.bincount(depths)
    if scheme == "without_replacement":  # (under iid a token rejected once keeps no residual mass)
        assert np.isin(np.asarray(static.accepted_nodes), [9, 10]).any()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_traced_trees_trace_to_a_program_linear_in_n(scheme):
    """Traced parents: the children table has N columns (any row may have N children), so
    the rule must trace at most O(N) operations, not O(N^2) (without replacement once
    traced quadratically many and took two minutes to compile at N = 64)."""
    v = 16

    def size(n):
        p = jnp.full((n + 1, v), 1.0 / v)
        f = jax.jit(lambda par, k: speculative_accept(k, par, jnp.zeros((n,), jnp.int32), p, p,
                                                      scheme=scheme).tokens)
        return len(f.lower(jnp.asarray(jaxspec.chain(n), jnp.int32), jax.random.key(0)).as_text())

    s16, s32, s64 = size(16), size(32), size(64)
    # linear: the growth from 32 to 64 is about twice that from 16 to 32; quadratic: 4x
    assert s64 - s32 < 3 * max(s32 - s16, 1000), (s16, s32, s64)


def test_probability_zero_rejection_keeps_the_law_static_and_traced():
    """Without replacement, root p = [.5, .5, 0, 0], q = one-hot(0), siblings 0, 1, 2.
    Sibling 0: accept .5, residual [0, 1, 0, 0]. The support of q is then exhausted, so
    sibling 1 is a point mass: accept p'(1) = 1; its rejection (probability 0) leaves a
    residual summing to 0, so the law is kept -- token 1 is *not* zeroed. Sibling 2: accept
    p'(2) = 0; the row's final law stays [0, 1, 0, 0]. Literal values, for a static tree,
    a traced one (the dense form) and the float64 reference."""
    p = np.full((4, 4), 0.25, np.float32)
    p[0] = [0.5, 0.5, 0.0, 0.0]
    q = np.zeros((4, 4), np.float32)
    q[:, 0] = 1.0
    par, toks = [-1, -1, -1], jnp.array([0, 1, 2])
    scheme = "without_replacement"
    static = accept_probabilities(par, toks, p, q, scheme=scheme)
    traced = jax.jit(lambda a: accept_probabilities(a, toks, p, q, scheme=scheme))(jnp.asarray(par, jnp.int32))
    ref = reference_probabilities(par, np.asarray(toks), p, q, scheme=scheme)
    for accept, residual in (static, traced, ref):
        np.testing.assert_allclose(accept, [0.5, 1.0, 0.0], atol=1e-7)
        np.testing.assert_allclose(residual[0], [0.0, 1.0, 0.0, 0.0], atol=1e-7)


def test_accepted_path_is_a_root_to_node_path():
    rng = np.random.default_rng(6)
    par = np.array(jaxspec.branching((2, 2, 2)))
    n, v = len(par), 4
    p, q = _rand_rows(rng, n + 1, v, 3.0), _rand_rows(rng, n + 1, v, 3.0)
    toks = rng.integers(0, v, n)
    keys = jax.random.split(jax.random.key(4), 2000)
    r = jax.jit(jax.vmap(lambda k: speculative_accept(k, par, toks, p, q, scheme="iid")))(keys)
    nodes, na = np.asarray(r.accepted_nodes), np.asarray(r.num_accepted)
    assert na.max() == 3  # deep paths do occur
    for i in range(2000):
        path = nodes[i, : na[i]]
        assert (nodes[i, na[i]:] == -1).all()
        prev = -1
        for node in path:
            assert par[node] == prev
            prev = node
        np.testing.assert_array_equal(np.asarray(r.tokens[i, : na[i]]), toks[path])
        assert r.accepted_per_depth[i].sum() == na[i]


def test_validation_errors_name_the_argument():
    p = np.full((3, 4), 0.25, np.float32)
    key = jax.random.key(0)
    ok = dict(parents=[-1, 0], tokens=jnp.array([0, 1]), target_probs=p, draft_probs=p)

    def call(**kw):
        args = {**ok, **kw}
        scheme = args.pop("scheme", "iid")
        return speculative_accept(key, args["parents"], args["tokens"], args["target_probs"], args["draft_probs"], scheme=scheme)

    with pytest.raises(ValueError, match="scheme = 'greedy'"):
        call(scheme="greedy")
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        call(parents=[-1, 1])
    with pytest.raises(ValueError, match=r"tokens: expected shape \(2,\)"):
        call(tokens=jnp.array([0, 1, 2]))
    with pytest.raises(ValueError, match="tokens: expected an integer dtype"):
        call(tokens=jnp.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"tokens\[1\] = 7"):
        call(tokens=jnp.array([0, 7]))
    with pytest.raises(ValueError, match=r"target_probs: expected shape \(3, V\)"):
        call(target_probs=p[:2])
    with pytest.raises(ValueError, match="draft_probs: vocabulary size 5"):
        call(draft_probs=np.full((3, 5), 0.2, np.float32))
    with pytest.raises(ValueError, match=r"target_probs\[1\] sums to 2"):
        call(target_probs=p.at[1].set(0.5) if hasattr(p, "at") else np.vstack([p[:1], np.full((1, 4), 0.5, np.float32), p[2:]]))
    with pytest.raises(ValueError, match=r"draft_probs\[0\]: expected finite"):
        call(draft_probs=np.vstack([np.full((1, 4), np.nan, np.float32), p[1:]]))
    with pytest.raises(ValueError, match="target_probs: expected a floating dtype"):
        call(target_probs=np.ones((3, 4), np.int32))
    # leaf draft rows are unused and not checked
    call(draft_probs=np.vstack([p[:2], np.zeros((1, 4), np.float32)]))


def test_jit_does_not_retrace_for_new_keys_and_tokens():
    traces = []

    @jax.jit
    def f(key, toks, p, q):
        traces.append(1)
        return speculative_accept(key, TREE, toks, p, q, scheme="without_replacement")

    rng = np.random.default_rng(0)
    for i in range(3):
        f(jax.random.key(i), jnp.array(rng.permutation(6)), _rand_rows(rng, 7, 6), _rand_rows(rng, 7, 6))
    assert len(traces) == 1


def _sibling_tokens(rng, parents, v, distinct):
    toks = np.zeros(len(parents), np.int64)
    for par in set(parents):
        kids = [j for j, pp in enumerate(parents) if pp == par]
        toks[kids] = rng.permutation(v)[: len(kids)] if distinct else rng.integers(0, v, len(kids))
    return toks


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("v", [6, 300])
def test_closed_form_matches_literal_rule(scheme, v):
    """accept_probabilities (closed-form residuals, no residual vectors) == the rule read
    literally in float64 (tests/_reference.py), for static and traced trees, including
    draft rows whose support the siblings exhaust (without replacement: the later
    siblings become point masses) and repeated tokens (iid, deterministic). The last
    tree is numbered depth-first (siblings 0 and 3 of the root, 1 and 5 of node 0 are not
    adjacent): the static deterministic form then gathers each node's earlier siblings
    instead of shifting."""
    rng = np.random.default_rng(v)
    trees = [[-1, 0, 1, 2], TREE, [-1, -1, -1, 0, 0, 0, 3, 3, 6], list(jaxspec.branching((3, 2))),
             [-1, 0, 1, -1, 3, 0, 4, 0]]
    traced = jax.jit(lambda pa, t, pp, qq: accept_probabilities(pa, t, pp, qq, scheme=scheme))
    for parents in trees:
        n = len(parents)
        static_fn = jax.jit(lambda t, pp, qq, par=parents: accept_probabilities(par, t, pp, qq, scheme=scheme))
        for trial in range(4):
            p = _rand_rows(rng, n + 1, v, [0.3, 1.0, 3.0, 0.1][trial])
            q = _rand_rows(rng, n + 1, v, [0.3, 1.0, 3.0, 0.1][trial])
            toks = _sibling_tokens(rng, parents, v, distinct=scheme == "without_replacement" or trial % 2 == 0)
            if trial == 3:  # sparse draft rows: support = the first two siblings' tokens
                for r in range(n + 1):
                    kids = [j for j, pp in enumerate(parents) if pp + 1 == r]
                    if kids:
                        keep = np.zeros(v, bool)
                        keep[toks[kids[:2]]] = True
                        q[r] = np.where(keep, q[r], 0.0) / np.where(keep, q[r], 0.0).sum()
            want_a, want_r = reference_probabilities(parents, toks, p, q, scheme=scheme)
            t = jnp.asarray(toks, jnp.int32)
            static = static_fn(t, p, q)
            for a, res in (static, traced(jnp.asarray(parents, jnp.int32), t, p, q)):
                np.testing.assert_allclose(np.asarray(a), want_a, atol=2e-5, err_msg=f"{parents} trial {trial}")
                np.testing.assert_allclose(np.asarray(res), want_r, atol=2e-5, err_msg=f"{parents} trial {trial}")


def test_boundary_accepts_lists_and_names_bad_keys_and_schemes():
    """Plain lists are valid tokens / rows; a key that is not a PRNG key and an unknown
    scheme (also for accept_probabilities) raise ValueError naming the argument."""
    p = [[0.25] * 4] * 3
    r = speculative_accept(jax.random.key(0), [-1, 0], [1, 2], p, p, scheme="iid")
    assert int(r.num_tokens) == 3  # p == q: everything accepted
    legacy = speculative_accept(jax.random.PRNGKey(0), [-1, 0], [1, 2], p, p, scheme="iid")
    assert int(legacy.num_tokens) == 3
    for bad in (0, "key", jnp.zeros((3,), jnp.uint32), jax.random.split(jax.random.key(0), 2)):
        with pytest.raises(ValueError, match="^key: expected a scalar jax.random.key"):
            speculative_accept(bad, [-1, 0], [1, 2], p, p, scheme="iid")
    with pytest.raises(ValueError, match="^scheme = 'x'"):
        accept_probabilities([-1, 0], jnp.array([1, 2]), jnp.asarray(p), jnp.asarray(p), scheme="x")
    with pytest.raises(ValueError, match="^tokens: expected an integer dtype"):
        speculative_accept(jax.random.key(0), [-1, 0], [1.0, 2.0], p, p, scheme="iid")


def test_without_replacement_small_untried_mass_keeps_relative_accuracy():
    """A peaked draft: the first sibling's token holds all but 1e-5 of q, whose float32 row
    sums to 1 - 1.2e-7. The law the second sibling was drawn from is q on the other tokens
    over their mass z = 1e-5; computing z as 1 - q(x0) (or sum(q) - q(x0)) would be off by
    ~1% there, the rule's untried-mass sums (nonnegative terms only) keep float32 accuracy.
    Checked against the rule evaluated in float64 with numpy."""
    v = 1000
    rng = np.random.default_rng(0)
    q = np.zeros(v, np.float32)
    q[1:] = rng.random(v - 1).astype(np.float32)
    q[1:] *= np.float32(1e-5) / q[1:].sum()
    q[0] = np.float32(1) - q[1:].sum()
    assert abs(float(q.sum(dtype=np.float32)) - 1) > 5e-8  # the row's sum is off from 1
    p = rng.random(v).astype(np.float32)
    p /= p.sum()
    xs = [0, 5, 7]

    def rule64(p, q, xs):  # the rule at one row, float64, residual and q_k kept as vectors
        r, q_left, out = p / p.sum(), q.astype(np.float64), []
        for x in xs:
            qk = q_left / q_left.sum()
            out.append(min(1.0, r[x] / qk[x]))
            res = np.maximum(r - qk, 0.0)
            r = res / res.sum()
            q_left = np.where(np.arange(v) == x, 0.0, q_left)
        return np.array(out), r

    want, want_res = rule64(p.astype(np.float64), q, xs)
    assert 1e-4 < want[1] < 0.99  # the second sibling's test is not clipped: z matters
    acc, res = accept_probabilities([-1, -1, -1], jnp.array(xs), np.tile(p, (4, 1)), np.tile(q, (4, 1)),
                                    scheme="without_replacement")
    np.testing.assert_allclose(np.asarray(acc), want, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(np.asarray(res)[0], want_res, rtol=1e-4, atol=1e-9)


def test_accept_probabilities_validates_like_the_rule():
    p = jnp.full((3, 4), 0.25)
    cases = [
        (dict(tokens=jnp.array([0])), r"tokens: expected shape \(2,\) to match parents, got \(1,\)"),
        (dict(tokens=jnp.array([0.9, 1.9])), r"tokens: expected an integer dtype, got float32"),
        (dict(target_probs=p.at[0, 0].set(jnp.nan)), r"target_probs\[0\]: expected finite, nonnegative"),
        (dict(draft_probs=jnp.full((3, 5), 0.2)), "draft_probs: vocabulary size 5 differs from target_probs' 4"),
    ]
    for change, match in cases:
        args = dict(tokens=jnp.array([0, 1]), target_probs=p, draft_probs=p) | change
        with pytest.raises(ValueError, match=match):
            accept_probabilities([-1, 0], args["tokens"], args["target_probs"], args["draft_probs"], scheme="iid")
        with pytest.raises(ValueError, match=match):
            speculative_accept(jax.random.key(0), [-1, 0], args["tokens"], args["target_probs"],
                               args["draft_probs"], scheme="iid")


@pytest.mark.parametrize("parents, match", [
    (jnp.array([-1.0, 0.0]), r"parents: expected integer parent indices, got dtype float32"),
    (jnp.array([[-1, 0]]), r"parents: expected a 1-D array of parent indices, got shape \(1, 2\)"),
    (jnp.zeros((0,), jnp.int32), "parents: expected at least one node, got an empty array"),
])
def test_traced_parents_are_checked_for_shape_and_dtype(parents, match):
    """Under jit the values of parents are data, but its shape and dtype are known."""
    n = max(parents.shape[-1], 1)
    p = jnp.full((n + 1, 4), 0.25)
    toks = jnp.zeros((parents.shape[-1],), jnp.int32)
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda pa: speculative_accept(jax.random.key(0), pa, toks, p, p, scheme="iid"))(parents)


def test_low_precision_rows_are_checked_at_their_own_precision():
    """bfloat16 rows of a law sum to 1 only within bfloat16's epsilon (2**-7)."""
    p = jnp.tile(jnp.array([0.1, 0.2, 0.3, 0.4], jnp.bfloat16), (3, 1))
    assert abs(float(jnp.sum(p[0].astype(jnp.float32))) - 1) > 1e-3
    r = speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]), p, p, scheme="iid")
    # p == q: min(1, p(x)/q(x)) = 1, so both drafts are accepted, then one bonus token
    assert int(r.num_accepted) == 2 and int(r.num_tokens) == 3
    toks = np.asarray(r.tokens)
    np.testing.assert_array_equal(toks[:2], [1, 2])
    assert 0 <= toks[2] < 4  # bonus from row 2, whose support is all four tokens
    with pytest.raises(ValueError, match=r"target_probs\[0\] sums to 1\.1.*tolerance 0\.0078125"):
        speculative_accept(jax.random.key(0), [-1, 0], jnp.array([1, 2]),
                           p.at[0, 0].set(0.2), p, scheme="iid")
