"""Traversal verification (jaxspec.core.traversal) against block verification on chains,
against the float64 enumeration of jaxspec/exactness/rule_laws.py on trees, and against a mutant.

Every chi-square below is one test of a family with family-wise level 1e-3, Bonferroni over
all of them (:data:`M_TESTS`, counted from the case lists): a lossless rule fails one with
probability at most 1e-3 per run of the whole file (slow cases included). The mutant's
rejections must come out at p < 1e-6, far below that level.

Samples: ``N_SAMPLES = 2**18`` vmapped rounds per case. Drafts are drawn exactly as the
scheme says (``jaxspec.core.sampling.draw``, as tests/_ngram.py::make_speculative_chain
draws them) from the float32 copies of the reference's bigram tables; ``target_probs`` /
``draft_probs`` are the table rows of the root's and each node's token. The float32 cast
moves the law by ~1e-8, far below what 2**18 samples resolve.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ngram import count_joint, make_speculative_chain

from jaxspec.core import sampling, traversal
from jaxspec.core.rule_types import AcceptResult
from jaxspec.core.block import block_accept
from jaxspec.core.traversal import traversal_accept
from jaxspec.exactness import rule_laws as R
from jaxspec.exactness.stats import bonferroni, chisquare_gof, chisquare_two_sample

N_SAMPLES = 1 << 18
N_CHAIN = 1 << 17  # per rule in the two-sample chain tests
slow = pytest.mark.slow

TABLES = {"rand0-v3": lambda: R.random_tables(0, 3), "zeros-v4": lambda: R.zero_tables(4)}
TREES = {
    "chain2": R.chain(2),
    "(2,1)": R.branching((2, 1)),
    "(2,2)": R.branching((2, 2)),
    "(3,1)": R.branching((3, 1)),
    "(2,1,1)": R.branching((2, 1, 1)),
    "irregular": (-1, -1, -1, 0, 0, 1, 3),  # 3 root children; node 0 has 2, node 1 has 1
}
IID, WOR, DET = "iid", "without_replacement", "deterministic"

# (chain length, scheme) for the two-sample comparison with block verification
CHAIN_CASES = [
    pytest.param(3, IID, id="chain3-iid"),
    pytest.param(3, DET, id="chain3-det"),
    pytest.param(2, IID, id="chain2-iid", marks=slow),
    pytest.param(4, WOR, id="chain4-wor", marks=slow),
]
# (tree, table, context, scheme) against the exact round law; one scheme per tree is fast
_FAST = {("(2,1)", IID), ("(2,2)", WOR), ("(3,1)", DET), ("(2,1,1)", WOR), ("irregular", IID)}
REFERENCE_CASES = [
    pytest.param(tree, "rand0-v3", 0, s, id=f"{tree}-{s}", marks=() if (tree, s) in _FAST else slow)
    for tree in ("(2,1)", "(2,2)", "(3,1)", "(2,1,1)", "irregular")
    for s in (IID, WOR, DET)
] + [
    # zeros in p and q: row 0's q is a point mass (without replacement exhausts it), row 1
    # has nearly disjoint supports, row 2 has p == q
    pytest.param("(2,2)", "zeros-v4", 0, WOR, id="(2,2)-wor-zeros-c0"),
    pytest.param("(2,2)", "zeros-v4", 1, IID, id="(2,2)-iid-zeros-c1", marks=slow),
    pytest.param("(2,2)", "zeros-v4", 2, DET, id="(2,2)-det-zeros-c2", marks=slow),
    pytest.param("(2,1,1)", "zeros-v4", 0, WOR, id="(2,1,1)-wor-zeros-c0", marks=slow),
]
# witnesses of the mutant (the enumeration's: TV 3.3e-2 / 4.5e-2 of the 4-token law)
MUTANT_CASES = [
    pytest.param("chain2", IID, id="chain2-iid"),
    pytest.param("(2,1,1)", WOR, id="(2,1,1)-wor", marks=slow),
]
# several rounds through tests/_ngram.py: the first L emitted tokens vs the target law
MULTI_ROUND_CASES = [
    pytest.param("(2,1,1)", WOR, id="(2,1,1)-wor"),
    pytest.param("irregular", IID, id="irregular-iid", marks=slow),
]
MULTI_ROUND_L = 3

M_TESTS = len(CHAIN_CASES) + len(REFERENCE_CASES) + len(MUTANT_CASES) + len(MULTI_ROUND_CASES)
ALPHA = bonferroni(1e-3, M_TESTS)  # 1e-3 / 27 = 3.7e-5 per test
MUTANT_P = 1e-6
SE_BAND = 4.0


@functools.cache
def tables(name):
    t, d = TABLES[name]()
    t.setflags(write=False)
    d.setflags(write=False)
    return t, d


# --------------------------------------------------------------------------- the mutant


def _mutant_alpha(r, alpha_u, qx):
    """The wrong parent update ``alpha_u <- min(r / (1 - Ms_u(x)), 1)`` (RULES.md)."""
    del alpha_u
    den = 1.0 - qx
    return jnp.where(den > 0, jnp.minimum(r / jnp.where(den > 0, den, 1.0), 1.0), 1.0)


def mutant_accept(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """Traversal verification with the mutant's parent update, everything else the same."""
    return traversal.traversal_with_update(key, parents, tokens, target_probs, draft_probs, scheme, _mutant_alpha)


# --------------------------------------------------------------------------- sampling rounds


def round_fn(parents, t, d, scheme, c0, accept_fn):
    """``key -> int32[N + 1]``: one round from context ``c0`` -- draft the tree from the
    rows of ``d`` under ``scheme`` (as make_speculative_chain does), then ``accept_fn``."""
    parents = np.asarray(parents, np.int32)
    n = parents.shape[0]
    kids = R.children(tuple(parents.tolist()))
    T = jnp.asarray(t, jnp.float32)
    D = jnp.asarray(d, jnp.float32)

    def one(key):
        k_draft, k_acc = jax.random.split(key)
        tok = jnp.zeros((n,), jnp.int32)
        for row, ch in enumerate(kids):
            if not ch:
                continue
            ctx = c0 if row == 0 else tok[row - 1]
            x, _ = sampling.draw(jax.random.fold_in(k_draft, row), D[ctx], len(ch), scheme)
            tok = tok.at[np.asarray(ch)].set(x)
        ctxs = jnp.concatenate([jnp.full((1,), c0, jnp.int32), tok])  # [N + 1]
        return accept_fn(k_acc, parents, tok, T[ctxs], D[ctxs], scheme).tokens

    return one


def sample_blocks(parents, t, d, scheme, c0, accept_fn, seed=0, n=N_SAMPLES):
    """int32[n, N + 1]: emitted blocks (-1 padded) of ``n`` independent rounds."""
    f = jax.jit(jax.vmap(round_fn(parents, t, d, scheme, c0, accept_fn)))
    return np.asarray(f(jax.random.split(jax.random.key(seed), n)))


def _code(block, v):
    """The integer of a block (a tuple, or int rows -1 padded): digits ``token + 1``."""
    b = np.asarray(block, np.int64)
    return (b + 1) @ ((v + 1) ** np.arange(b.shape[-1], dtype=np.int64))


def block_gof(blocks, law, v):
    """Chi-square of sampled blocks against an exact round law ``{block: prob}`` (a block
    the law gives probability 0 is a cell of probability 0: a certain rejection)."""
    width = blocks.shape[1]
    exact = {int(_code(tuple(b) + (-1,) * (width - len(b)), v)): p for b, p in law.items()}
    codes, counts = np.unique(_code(blocks, v), return_counts=True)
    cells = sorted(set(exact) | set(codes.tolist()))
    obs = dict(zip(codes.tolist(), counts.tolist()))
    c = np.array([obs.get(k, 0) for k in cells])
    p = np.array([exact.get(k, 0.0) for k in cells])
    return chisquare_gof(c, p / p.sum())


def tokens_per_round(blocks):
    """(mean, standard error) of the emitted tokens per round."""
    m = (blocks >= 0).sum(axis=1)
    return float(m.mean()), float(m.std(ddof=1) / np.sqrt(m.size))


# --------------------------------------------------------------------------- 1. chains = block


def _chain_inputs(g, v, scheme, seed=3):
    """Fixed rows for a chain of ``g``: random target and draft rows, tokens drawn from
    the draft rows (the draft's top token under ``deterministic``)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(v, 0.7), g + 1).astype(np.float32)
    Q = (0.6 * P + 0.4 * rng.dirichlet(np.ones(v), g + 1)) ** 1.5  # sharper: some rejections
    Q = (Q / Q.sum(axis=1, keepdims=True)).astype(np.float32)
    if scheme == DET:
        tok = np.argmax(Q[:g], axis=1)
    else:
        tok = np.array([rng.choice(v, p=Q[i] / Q[i].sum()) for i in range(g)])
    return list(range(-1, g - 1)), jnp.asarray(tok, jnp.int32), jnp.asarray(P), jnp.asarray(Q)


def _run(fn, par, tok, P, Q, scheme, keys):
    return jax.jit(jax.vmap(lambda k: fn(k, par, tok, P, Q, scheme)))(keys)


@pytest.mark.parametrize("g,scheme", CHAIN_CASES)
def test_chain_law_is_block_verification(g, scheme):
    """Same law of (accepted, extra token) as block_accept on fixed rows: a two-sample
    chi-square over independent keys."""
    v = 4
    par, tok, P, Q = _chain_inputs(g, v, scheme)
    counts = []
    for fn, seed in ((traversal_accept, 1), (block_accept, 2)):
        res = _run(fn, par, tok, P, Q, scheme, jax.random.split(jax.random.key(seed), N_CHAIN))
        num = np.asarray(res.num_accepted)
        extra = np.asarray(res.tokens)[np.arange(N_CHAIN), num]
        counts.append(np.bincount(num * v + extra, minlength=(g + 1) * v))
    r = chisquare_two_sample(*counts)
    print(f"chain{g} {scheme}: {r}")
    assert r.pvalue > ALPHA, str(r) + "\n" + r.table()


@pytest.mark.parametrize("g,scheme", [(4, IID), pytest.param(3, DET, marks=slow), pytest.param(2, IID, marks=slow)])
def test_chain_is_block_verification_key_by_key(g, scheme):
    """On a chain the two rules are one computation: traversal's first test is the deepest
    node's uniform against w_g = h_g, and each rejection stores h_i at the parent, tested
    with that node's uniform -- block's ``tau = the last i with eta_i < h_i``, the same
    uniforms in the same places, and the extra token from the same row with the same key.
    They differ only in float rounding (``r + (1 - w)`` against ``r + 1 - w``, a normalized
    against an unnormalized residual), which can move a draw only within an ulp of a cell
    boundary; on these fixed keys the outputs are identical."""
    par, tok, P, Q = _chain_inputs(g, 5, scheme, seed=g)
    keys = jax.random.split(jax.random.key(7), 1 << 12)
    a = _run(traversal_accept, par, tok, P, Q, scheme, keys)
    b = _run(block_accept, par, tok, P, Q, scheme, keys)
    assert len(set(np.asarray(a.num_accepted).tolist())) > 1  # several outcomes occur
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# --------------------------------------------------------------------------- 2, 3. the reference


@pytest.mark.parametrize("tree,table,c0,scheme", REFERENCE_CASES)
def test_round_law_matches_the_reference(tree, table, c0, scheme):
    """The joint law of the emitted block (accepted tokens + extra) equals the exact round
    law of jaxspec/exactness/rule_laws.py, and the tokens per round its exact expectation within 4
    standard errors; where the token rule's expectation is far enough off (> 10 SE), the
    sample also tells the two apart (> 4 SE): this is traversal, not the token rule."""
    t, d = tables(table)
    parents = TREES[tree]
    v = t.shape[0]
    law = R.round_law("traversal", parents, t, d, c0, scheme)
    blocks = sample_blocks(parents, t, d, scheme, c0, traversal_accept)
    r = block_gof(blocks, law, v)
    mean, se = tokens_per_round(blocks)
    e_trav = R.expected_tokens("traversal", parents, t, d, c0, scheme)
    e_tok = R.expected_tokens("token", parents, t, d, c0, scheme)
    print(f"{tree} {table} c0={c0} {scheme}: {r}; tokens/round {mean:.5f} +- {se:.5f} "
          f"exact {e_trav:.5f} ({(mean - e_trav) / se:+.2f} SE), token rule {e_tok:.5f} "
          f"({(mean - e_tok) / se:+.2f} SE)")
    assert r.pvalue > ALPHA, str(r) + "\n" + r.table()
    assert abs(mean - e_trav) < SE_BAND * se
    if abs(e_trav - e_tok) > 10 * se:
        assert abs(mean - e_tok) > SE_BAND * se


def test_the_fast_cases_separate_traversal_from_the_token_rule():
    """The expected-token check of the reference test can tell the rules apart: among
    its fast cases the exact gap exceeds 10 standard errors of 2**18 rounds somewhere."""
    gaps = {}
    for p in REFERENCE_CASES:
        tree, table, c0, scheme = p.values
        if p.marks:
            continue
        t, d = tables(table)
        law = R.round_law("traversal", TREES[tree], t, d, c0, scheme)
        e = sum(pr * len(b) for b, pr in law.items())
        sd = np.sqrt(sum(pr * len(b) ** 2 for b, pr in law.items()) - e * e)
        gaps[p.id] = (e - R.expected_tokens("token", TREES[tree], t, d, c0, scheme)) / (sd / np.sqrt(N_SAMPLES))
    assert max(gaps.values()) > 10, gaps
    if ("(3,1)", DET) in _FAST:  # one-hot siblings: traversal's law is the token rule's
        assert abs(gaps["(3,1)-deterministic"]) < 1e-6


# --------------------------------------------------------------------------- 4. the mutant


@pytest.mark.parametrize("tree,scheme", MUTANT_CASES)
def test_mutant_is_rejected(tree, scheme):
    """The mutant's blocks are rejected against the traversal law (p < 1e-6) and fit the
    reference's own mutant (``"traversal-mutant"``): the chi-square sees the one changed
    line, and the mutant here is the reference's mutant."""
    t, d = tables("rand0-v3")
    parents = TREES[tree]
    blocks = sample_blocks(parents, t, d, scheme, 0, mutant_accept, seed=5)
    right = R.round_law("traversal", parents, t, d, 0, scheme)
    wrong = R.round_law("traversal-mutant", parents, t, d, 0, scheme)
    r_right, r_wrong = block_gof(blocks, right, 3), block_gof(blocks, wrong, 3)
    print(f"mutant {tree} {scheme}: TV(round laws) {R.tv(right, wrong):.3g}; vs traversal {r_right}; "
          f"vs the reference mutant {r_wrong}")
    assert r_right.pvalue < MUTANT_P, str(r_right)
    assert r_wrong.pvalue > ALPHA, str(r_wrong) + "\n" + r_wrong.table()


# --------------------------------------------------------------------------- several rounds


@pytest.mark.parametrize("tree,scheme", MULTI_ROUND_CASES)
def test_emitted_tokens_follow_the_target(tree, scheme):
    """Rounds chained through tests/_ngram.py (each extra token the next root): the joint
    law of the first L emitted tokens is the target's."""
    t, d = tables("rand0-v3")
    chain = make_speculative_chain(np.asarray(TREES[tree]), t.astype(np.float32), d.astype(np.float32),
                                   scheme=scheme, length=MULTI_ROUND_L, c0=0, accept_fn=traversal_accept)
    counts, _ = count_joint(chain, jax.random.key(11), num_samples=N_SAMPLES // 2, v=3, length=MULTI_ROUND_L)
    r = chisquare_gof(counts, R.target_law(t, 0, MULTI_ROUND_L).reshape(-1))
    print(f"{MULTI_ROUND_L} tokens, {tree} {scheme}: {r}")
    assert r.pvalue > ALPHA, str(r) + "\n" + r.table()


# --------------------------------------------------------------------------- 5. mechanics


def test_p_equals_q_accepts_the_whole_first_path():
    """p == q: every test passes, so the first path 0 -> 2 is accepted and the bonus comes
    from node 2's row (a point mass on token 3 here)."""
    parents = [-1, -1, 0, 1]
    P = jnp.full((5, 4), 0.25).at[3].set(jnp.array([0.0, 0.0, 0.0, 1.0]))
    keys = jax.random.split(jax.random.key(0), 16)
    for scheme in (IID, WOR):
        r = _run(traversal_accept, parents, jnp.array([1, 2, 0, 0]), P, P, scheme, keys)
        np.testing.assert_array_equal(r.tokens, np.tile([1, 0, 3, -1, -1], (16, 1)))
        np.testing.assert_array_equal(r.num_accepted, 2)
        np.testing.assert_array_equal(r.num_tokens, 3)
        np.testing.assert_array_equal(r.last_node, 2)
        np.testing.assert_array_equal(r.accepted_nodes, np.tile([0, 2, -1, -1], (16, 1)))
        np.testing.assert_array_equal(r.accepted_per_depth, np.tile([1, 1, 0, 0], (16, 1)))


def test_disjoint_supports_emit_the_root_residual():
    """A draft token the target excludes is rejected surely; the root's residual
    ``[p - q]_+`` is then a point mass on token 0. No NaN with one-hot rows."""
    P = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    Q = jnp.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    keys = jax.random.split(jax.random.key(0), 16)
    for scheme in (WOR, DET):  # iid takes the same path as without replacement on one child
        r = _run(traversal_accept, [-1], jnp.array([1]), P, Q, scheme, keys)
        np.testing.assert_array_equal(r.tokens, np.tile([0, -1], (16, 1)))
        np.testing.assert_array_equal(r.num_accepted, 0)
        np.testing.assert_array_equal(r.last_node, -1)


def test_jit_vmap_and_static_shapes():
    """Batched under ``jit(vmap)`` over keys, tokens and rows; each lane equals the
    unbatched jitted call; ``eval_shape`` gives the static AcceptResult shapes; the
    outputs are a consistent path of the tree."""
    parents = list(TREES["(2,1)"])
    n, v, b = len(parents), 5, 8
    rng = np.random.default_rng(0)
    P = jnp.asarray(rng.dirichlet(np.ones(v), (b, n + 1)), jnp.float32)
    Q = jnp.asarray(rng.dirichlet(np.ones(v), (b, n + 1)), jnp.float32)
    tok = jnp.asarray([rng.permutation(v)[:n] for _ in range(b)], jnp.int32)  # distinct siblings
    keys = jax.random.split(jax.random.key(0), b)
    for scheme in (IID, WOR, DET):
        single = lambda k, t, p, q, scheme=scheme: traversal_accept(k, parents, t, p, q, scheme)
        batched = jax.jit(jax.vmap(single))(keys, tok, P, Q)
        if scheme == WOR:
            one = jax.jit(single)
            for i in range(b):
                for x, y in zip(batched, one(keys[i], tok[i], P[i], Q[i])):
                    np.testing.assert_array_equal(np.asarray(x)[i], np.asarray(y))
        shapes = jax.eval_shape(single, keys[0], tok[0], P[0], Q[0])
        assert isinstance(shapes, AcceptResult)
        want = {"tokens": (n + 1,), "num_tokens": (), "num_accepted": (), "accepted_nodes": (n,),
                "accepted_per_depth": (n,), "last_node": ()}
        for name, shape in want.items():
            s = getattr(shapes, name)
            assert s.shape == shape and s.dtype == jnp.int32, (name, s)
        num = np.asarray(batched.num_accepted)
        toks = np.asarray(batched.tokens)
        nodes = np.asarray(batched.accepted_nodes)
        assert len(set(num.tolist())) > 1  # several path lengths among the lanes
        for i in range(b):
            assert np.all(toks[i, : num[i] + 1] >= 0) and np.all(toks[i, num[i] + 1 :] == -1)
            path = nodes[i, : num[i]]
            assert np.all(nodes[i, num[i] :] == -1)
            np.testing.assert_array_equal(toks[i, : num[i]], np.asarray(tok)[i, path])
            assert int(batched.last_node[i]) == (path[-1] if num[i] else -1)
            assert all(parents[c] == a for a, c in itertools.pairwise(path))
            assert num[i] == 0 or parents[path[0]] == -1
