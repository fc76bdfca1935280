"""Which (rule, sibling scheme, tree) combinations are lossless: proof by exact enumeration.

Everything here is float64 numpy on bigram tables (jaxspec/exactness/rule_laws.py, an independent
reading of ../shared/RULES.md and docs/DESIGN.md §2; jaxspec is not imported). A lossless
combination reproduces the target law of the first L = 4 emitted tokens (several rounds)
to float64 rounding (max |difference| < 1e-12); a biased one is pinned by a witness whose
total variation is recorded next to it. The mutants' witnesses show that the enumeration
can fail.

Established table (Ms = the law each sibling was actually drawn from; TVs of the L = 4 law
from context 0 on the named witness):

=====================================================  ==========================  ==============
rule / variant                                         scheme, trees               lossless
=====================================================  ==========================  ==============
token                                                  all 3 schemes, chains+trees yes (< 1e-15)
block                                                  all 3 schemes, chains 1..4  yes (< 1e-15)
traversal                                              all 3 schemes, chains,      yes (< 1e-15)
                                                       (2,1) (2,2) (3,1) (2,1,1),
                                                       irregular
traversal, Ms = q minus deleted siblings (RULES.md     iid, (2,2)                  no, TV 4.99e-2
literal text applied to iid)
traversal, Ms = q throughout                           w/o replacement, (2,2)      no, TV 1.92e-2
traversal, Ms = the draft's soft q                     deterministic, chain 2      no, TV 0.709
traversal, accepted node emits its original row        iid, chain 2                no, TV 3.06e-2
(not the residual its deleted children left)
traversal-mutant: alpha_u <- min(r / (1 - Ms_u(x)), 1) iid, chain 2                no, TV 3.29e-2
block-noclip / block-first-fail / block-token-residual iid, chain 2                no, 2.72e-2 /
                                                                                   0.345 / 6.58e-3
=====================================================  ==========================  ==============

With one-hot siblings block and traversal have exactly the token rule's round law (so no
gain); with stochastic drafts they accept strictly more.
"""

from __future__ import annotations

import functools

import _exact
import numpy as np
import pytest

from jaxspec.exactness import rule_laws as R

L = 4
TOL = 1e-12

TABLES = {
    "rand0-v3": lambda: R.random_tables(0, 3),
    "rand2-v3": lambda: R.random_tables(2, 3),
    "rand3-v3": lambda: R.random_tables(3, 3),
    "rand1-v4": lambda: R.random_tables(1, 4),
    "zeros-v4": lambda: R.zero_tables(4),
    "witness1-v3": lambda: R.random_tables(1, 3),  # only the block-token-residual witness
}
CASE_TABLES = [t for t in TABLES if t != "witness1-v3"]
# iid trees at V = 4 enumerate 4^6+ outcomes per context: kept to the V = 3 tables (and the
# sparse zeros table, whose rows have small supports)
SMALL_TABLES = ("rand0-v3", "rand2-v3", "rand3-v3", "zeros-v4")

CHAINS = {f"chain{k}": R.chain(k) for k in (1, 2, 3, 4)}
TREES = {
    "(2,1)": R.branching((2, 1)),
    "(2,2)": R.branching((2, 2)),
    "(3,1)": R.branching((3, 1)),
    "(2,1,1)": R.branching((2, 1, 1)),
    "irregular": (-1, -1, -1, 0, 0, 1, 3),  # 3 root children; node 0 has 2, node 1 has 1, depth 3
}
TREE_CASES = [(tn, tb, s) for tn in TREES for s in R.SCHEMES for tb in CASE_TABLES if s != "iid" or tb in SMALL_TABLES]
CHAIN_CASES = [(cn, tb, s) for cn in CHAINS for s in R.SCHEMES for tb in CASE_TABLES]


@functools.cache
def tables(name):
    t, d = TABLES[name]()
    t.setflags(write=False)
    d.setflags(write=False)
    return t, d


@functools.cache
def law(rule, parents, table, scheme, c0=0, opts=()):
    t, d = tables(table)
    return R.emitted_law(rule, parents, t, d, c0, scheme, L, **dict(opts))


@functools.cache
def rlaw(rule, parents, table, scheme, c0, opts=()):
    t, d = tables(table)
    return R.round_law(rule, parents, t, d, c0, scheme, **dict(opts))


def etok(rule, parents, table, scheme, c0=0, opts=()):
    return float(sum(pr * len(b) for b, pr in rlaw(rule, parents, table, scheme, c0, opts).items()))


def target(table, c0=0):
    return R.target_law(tables(table)[0], c0, L)


def max_err(rule, parents, table, scheme, c0=0, opts=()):
    return float(np.abs(law(rule, parents, table, scheme, c0, opts) - target(table, c0)).max())


def tv_err(rule, parents, table, scheme, c0=0, opts=()):
    return R.tv(law(rule, parents, table, scheme, c0, opts), target(table, c0))


# --------------------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("table", CASE_TABLES)
def test_tables_and_outcomes_are_laws(table):
    t, d = tables(table)
    np.testing.assert_allclose(t.sum(1), 1.0, atol=1e-15)
    np.testing.assert_allclose(d.sum(1), 1.0, atol=1e-15)
    assert abs(target(table).sum() - 1.0) < 1e-14
    for parents in (R.chain(3), TREES["(2,2)"], TREES["irregular"]):
        for scheme in R.SCHEMES:
            if scheme == "iid" and table not in SMALL_TABLES and len(parents) > 4:
                continue
            total = sum(pr for _, _, pr in R.draft_outcomes(parents, d, 0, scheme))
            assert abs(total - 1.0) < 1e-14
            for rule in ("token", "traversal") + (("block",) if R.is_chain(parents) else ()):
                block_law = rlaw(rule, parents, table, scheme, 0)
                assert abs(sum(block_law.values()) - 1.0) < 1e-13
                assert min(block_law.values()) >= 0.0
                assert all(1 <= len(b) <= len(parents) + 1 for b in block_law)


def test_sibling_draws_follow_the_schemes():
    q = np.array([0.5, 0.3, 0.2, 0.0])
    det = list(R.sibling_draws(q, 2, "deterministic"))
    assert [(xs, pr) for xs, _, pr in det] == [((0, 1), 1.0)]
    ties = list(R.sibling_draws(np.array([0.1, 0.3, 0.3, 0.3]), 2, "deterministic"))
    assert ties[0][0] == (1, 2)  # ties go to the lower index
    wr = {xs: (laws, pr) for xs, laws, pr in R.sibling_draws(q, 2, "without_replacement")}
    np.testing.assert_allclose(wr[(1, 0)][1], 0.3 * 0.5 / 0.7)
    np.testing.assert_allclose(wr[(1, 0)][0][1], [5 / 7, 0, 2 / 7, 0])
    assert all(x != y for x, y in wr)
    # exhausted support: the lowest-index unused token, a point mass
    ex = list(R.sibling_draws(np.array([0.0, 0.0, 1.0]), 2, "without_replacement"))
    assert [(xs, pr) for xs, _, pr in ex] == [((2, 0), 1.0)]
    np.testing.assert_array_equal(ex[0][1][1], [1.0, 0.0, 0.0])
    iid = {xs: pr for xs, _, pr in R.sibling_draws(q, 2, "iid")}
    assert abs(iid[(0, 0)] - 0.25) < 1e-15 and abs(sum(iid.values()) - 1.0) < 1e-15


@pytest.mark.parametrize("name", list(CHAINS) + list(TREES))
@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_token_expected_tokens_agree_with_exact_py(name, scheme):
    """Two independent float64 readings of DESIGN.md §2 agree (tests/_exact.py)."""
    parents = {**CHAINS, **TREES}[name]
    table = "rand0-v3"
    t, d = tables(table)
    for c0 in range(t.shape[0]):
        want = _exact.expected_accepted(list(parents), t, d, c0, scheme) + 1.0
        assert abs(etok("token", parents, table, scheme, c0) - want) < 1e-12


# --------------------------------------------------------------------------- lossless combinations


@pytest.mark.parametrize("name,table,scheme", CHAIN_CASES + TREE_CASES)
def test_token_rule_lossless(name, table, scheme):
    parents = {**CHAINS, **TREES}[name]
    c0s = (0, 1) if table == "zeros-v4" else (0,)
    for c0 in c0s:
        assert max_err("token", parents, table, scheme, c0) < TOL


@pytest.mark.parametrize("name,table,scheme", CHAIN_CASES)
def test_block_lossless(name, table, scheme):
    c0s = (0, 1) if table == "zeros-v4" else (0,)
    for c0 in c0s:
        assert max_err("block", CHAINS[name], table, scheme, c0) < TOL


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("table", CASE_TABLES)
def test_block_deterministic_round_law_is_the_token_rules(name, table):
    """RULES.md: with one-hot drafts block verification's law is exactly the token rule's."""
    v = tables(table)[0].shape[0]
    for c0 in range(v):
        a = rlaw("block", CHAINS[name], table, "deterministic", c0)
        b = rlaw("token", CHAINS[name], table, "deterministic", c0)
        assert R.tv(a, b) < TOL


@pytest.mark.parametrize("name,table,scheme", CHAIN_CASES)
def test_traversal_on_a_chain_is_block_verification(name, table, scheme):
    """Same round law (hence same expected tokens) from every context."""
    v = tables(table)[0].shape[0]
    for c0 in range(v):
        a = rlaw("traversal", CHAINS[name], table, scheme, c0)
        b = rlaw("block", CHAINS[name], table, scheme, c0)
        assert R.tv(a, b) < TOL
        assert abs(etok("traversal", CHAINS[name], table, scheme, c0) - etok("block", CHAINS[name], table, scheme, c0)) < TOL
    assert max_err("traversal", CHAINS[name], table, scheme) < TOL


@pytest.mark.parametrize("name,table,scheme", TREE_CASES)
def test_traversal_trees_lossless(name, table, scheme):
    """Lossless under all three schemes when Ms_u is the law u's first remaining child was
    drawn from: iid -> q (unchanged by rejections), without replacement -> q minus the
    deleted siblings' tokens, renormalized (a point mass once the support is exhausted),
    deterministic -> a point mass on that child's token."""
    c0s = (0, 1) if table == "zeros-v4" else (0,)
    for c0 in c0s:
        assert max_err("traversal", TREES[name], table, scheme, c0) < TOL


# --------------------------------------------------------------------------- what is NOT lossless

NOT_LOSSLESS = [
    # (id, rule, parents, table, scheme, opts, recorded TV of the L = 4 law)
    # RULES.md's literal "Ms_u with x removed" applied to iid siblings: they were drawn from q
    ("traversal-iid-Ms-removed", "traversal", TREES["(2,2)"], "rand0-v3", "iid", (("ms", "removed"),), 4.99e-2),
    # without replacement judged against the unmodified q
    ("traversal-wor-Ms-fixed-q", "traversal", TREES["(2,2)"], "rand0-v3", "without_replacement", (("ms", "fixed"),), 1.92e-2),
    # deterministic siblings judged against the draft's soft q (they were not drawn from it)
    ("traversal-det-Ms-soft-q", "traversal", R.chain(2), "rand0-v3", "deterministic", (("ms", "fixed"),), 7.09e-1),
    ("traversal-det-Ms-soft-q-removed", "traversal", TREES["(2,1)"], "rand0-v3", "deterministic", (("ms", "removed"),), 7.22e-1),
    # an accepted node that lost children must emit from its residual Mb, not its own row
    ("traversal-leaf-original-row", "traversal", R.chain(2), "rand0-v3", "iid", (("leaf_law", "original"),), 3.06e-2),
    ("traversal-leaf-original-row-tree", "traversal", TREES["(2,1,1)"], "rand0-v3", "without_replacement", (("leaf_law", "original"),), 4.16e-2),
    ("traversal-leaf-original-row-det", "traversal", TREES["(2,2)"], "rand0-v3", "deterministic", (("leaf_law", "original"),), 9.04e-2),
]

MUTANTS = [
    ("traversal-mutant-chain", "traversal-mutant", R.chain(2), "rand0-v3", "iid", (), 3.29e-2),
    ("traversal-mutant-tree", "traversal-mutant", TREES["(2,1,1)"], "rand0-v3", "without_replacement", (), 4.47e-2),
    ("traversal-mutant-det", "traversal-mutant", TREES["(2,2)"], "rand0-v3", "deterministic", (), 7.38e-1),
    ("block-noclip", "block-noclip", R.chain(2), "rand0-v3", "iid", (), 2.72e-2),
    ("block-first-fail", "block-first-fail", R.chain(2), "rand0-v3", "iid", (), 3.45e-1),
    ("block-first-fail-det", "block-first-fail", R.chain(2), "rand0-v3", "deterministic", (), 2.65e-1),
    # rand0-v3 hides this one (TV ~1e-16 there: [w p - q]_+ and [p - q]_+ normalize alike)
    ("block-token-residual", "block-token-residual", R.chain(2), "witness1-v3", "iid", (), 6.58e-3),
]


@pytest.mark.parametrize("case", NOT_LOSSLESS, ids=[c[0] for c in NOT_LOSSLESS])
def test_not_lossless_witness(case):
    _, rule, parents, table, scheme, opts, recorded = case
    d = tv_err(rule, parents, table, scheme, 0, opts)
    assert d > 1e-6
    assert abs(d - recorded) < 0.05 * recorded, d


@pytest.mark.parametrize("case", MUTANTS, ids=[c[0] for c in MUTANTS])
def test_mutant_witness(case):
    _, rule, parents, table, scheme, opts, recorded = case
    d = tv_err(rule, parents, table, scheme, 0, opts)
    assert d > 1e-3
    assert abs(d - recorded) < 0.05 * recorded, d


def test_variants_that_coincide_with_the_right_law():
    """Ms options that are the drawn law in disguise stay lossless (checks the options work)."""
    assert max_err("traversal", TREES["(2,2)"], "rand0-v3", "iid", 0, (("ms", "fixed"),)) < TOL
    assert max_err("traversal", TREES["(2,2)"], "rand0-v3", "without_replacement", 0, (("ms", "removed"),)) < TOL


# --------------------------------------------------------------------------- expected tokens

# random_tables(1, 4), context 0 (exact values, reported with the table)
BLOCK_VS_TOKEN = {2: (2.574706, 2.563428), 3: (3.252350, 3.205077), 4: (3.837756, 3.735829)}
TRAVERSAL_VS_TOKEN_WOR = {
    "(2,1)": (2.839537, 2.820199),
    "(2,2)": (2.876185, 2.871415),
    "(3,1)": (2.872033, 2.852695),
    "(2,1,1)": (3.644706, 3.568617),
    "irregular": (3.570190, 3.524881),
}


@pytest.mark.parametrize("k", (2, 3, 4))
@pytest.mark.parametrize("table", [t for t in CASE_TABLES if t != "zeros-v4"])
def test_block_accepts_more_than_token(k, table):
    v = tables(table)[0].shape[0]
    for c0 in range(v):
        block = etok("block", R.chain(k), table, "iid", c0)
        token = etok("token", R.chain(k), table, "iid", c0)
        assert block > token + 1e-6  # strictly more on these stochastic drafts
        det_b = etok("block", R.chain(k), table, "deterministic", c0)
        det_t = etok("token", R.chain(k), table, "deterministic", c0)
        assert abs(det_b - det_t) < TOL


@pytest.mark.parametrize("k", (1, 2, 3, 4))
def test_block_never_below_token_with_zeros(k):
    for c0 in range(4):
        for scheme in ("iid", "without_replacement"):
            assert etok("block", R.chain(k), "zeros-v4", scheme, c0) >= etok("token", R.chain(k), "zeros-v4", scheme, c0) - TOL


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("table", ["rand0-v3", "rand2-v3", "rand1-v4", "zeros-v4"])
def test_traversal_accepts_at_least_token(name, table):
    v = tables(table)[0].shape[0]
    for c0 in range(v):
        tr = etok("traversal", TREES[name], table, "without_replacement", c0)
        tk = etok("token", TREES[name], table, "without_replacement", c0)
        assert tr >= tk - TOL
        if table != "zeros-v4":
            assert tr > tk + 1e-6


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("table", ["rand0-v3", "rand1-v4", "zeros-v4"])
def test_traversal_deterministic_round_law_is_the_token_rules(name, table):
    """Found by enumeration: with one-hot siblings the traversal's round law IS the token
    rule's (TV < 2e-16 from every context), as block = token on deterministic chains, so it
    gains nothing there."""
    v = tables(table)[0].shape[0]
    for c0 in range(v):
        a = rlaw("traversal", TREES[name], table, "deterministic", c0)
        b = rlaw("token", TREES[name], table, "deterministic", c0)
        assert R.tv(a, b) < TOL


def test_expected_tokens_figures():
    for k, (block, token) in BLOCK_VS_TOKEN.items():
        assert abs(etok("block", R.chain(k), "rand1-v4", "iid") - block) < 1e-6
        assert abs(etok("token", R.chain(k), "rand1-v4", "iid") - token) < 1e-6
    for name, (trav, token) in TRAVERSAL_VS_TOKEN_WOR.items():
        assert abs(etok("traversal", TREES[name], "rand1-v4", "without_replacement") - trav) < 1e-6
        assert abs(etok("token", TREES[name], "rand1-v4", "without_replacement") - token) < 1e-6
    # the public helper agrees with the round law
    t, d = tables("rand1-v4")
    assert abs(R.expected_tokens("block", R.chain(4), t, d, 0, "iid") - BLOCK_VS_TOKEN[4][0]) < 1e-6


def test_reference_imports_no_jaxspec_module():
    """The enumeration is an independent reference: it must not read the library's rules."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(R.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "functools", "itertools", "numpy"}, imported
