"""Stress tests of speculative_accept where tests/test_accept.py looks least: vocabulary
sizes around the one-level / two-level inverse-CDF boundary and awkward block sizes, rows
that are degenerate at those sizes, and the static vs traced (jit-argument) parents forms.

Vocabularies (jaxspec/sampling.py): V <= 64 draws the extra token with one prefix sum,
larger V in two levels over blocks of ``block_size(V)`` cells:

    V      1  2  63  64 | 65   97         200  1000  4099
    block  -  -  -   -  | 13   10 (+7)    20   40    65 (+4)      (+t: a tail block of t)

and the path walk emits from rows it already gathered up to V = 1024
(``_CARRY_ROWS_MAX_V``), from a fresh fetch above (V = 4099).

Trees (static parents, and the same tree as a jit argument): UNEVEN (leaves at depths 1-3,
a row of three children beside a leaf row), with WIDE (five root children) at V = 63,
DEPTH_FIRST (numbered depth first) at V = 97 and CHAIN at V = 200; without replacement
at V < 4 a tree with at most V children a row.

Degenerate rows, each at every V where it makes sense: a one-hot target (temperature 0),
one-hot target and draft, p == q bit for bit, zeros of q where p > 0 and vice versa,
disjoint supports, all mass of both rows in the tail block (the last, partial block of
the two-level search; the last full block or the last three cells where V has none), a
target with 40-50% of its mass there, drafted tokens the target gives probability 0, a
draft of support 2 or 1 (without replacement: siblings that exhaust q's support, then
the zero-probability tokens in index order, as ``draw_without_replacement`` does; iid:
repeated siblings), and forced duplicate siblings (iid, deterministic). Drafts are
always ones the scheme can produce (``deterministic``: any fixed candidates, duplicates
allowed). Rows are float32 laws normalized in float64.

Properties, per case, over 2048 keys (seeds fixed):

* accept_probabilities is finite and equals the rule read literally in float64
  (atol 2e-5) for every node tried, and every row ended at, with probability > 1e-6;
* the result is well formed: num_tokens == num_accepted + 1; accepted_nodes is a
  root-to-node path (each node's parent is the previous one), -1 padded; last_node its
  last node; tokens = the path's drafted tokens, the extra token, -1 padding;
  accepted_per_depth marks the path; the extra token lies in [0, V);
* the extra token has positive probability under the exact law of row last_node + 1
  returned by accept_probabilities (its residual, or the bonus law at a leaf);
* a node is accepted only if its acceptance probability is > 0, and a tried node whose
  acceptance probability is 1 is never rejected (u < 1 always);
* static and traced parents give identical outputs for the same keys, both vmapped the
  same way (batching rows differently may let XLA sum a row in another order, and a
  uniform within float32 rounding of a cell boundary then lands in the neighbouring
  cell: about 1 round in 4000 at V = 4099, not a defect);
* frequencies (seeds and thresholds fixed in advance): the joint law of
  (last_node + 1, extra token) matches stop(row) x residual(row) from
  accept_probabilities, 2^16 rounds per scheme and form (chi-square p > 1e-6), and
  with drafts drawn by jaxspec.sampling.draw the first emitted token follows the target
  root row (lossless; 2^16 rounds, chi-square p > 1e-6).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import reference_probabilities

from jaxspec.core import numerics, sampling
from jaxspec.core.rules import speculative_accept
from jaxspec.core.token_rule import accept_probabilities
from jaxspec.core.sampling import SCHEMES
from jaxspec.exactness.stats import chisquare_gof

VOCABS = (1, 2, 63, 64, 65, 97, 200, 1000, 4099)
#: root -> {0, 1}; 0 -> {2, 3, 4}; 2 -> {5}: leaves at depths 1, 2 and 3, a row of three
#: children beside a leaf row at depth 1 (the path walk pads it to K_1 = 3), a chain
#: segment; the path walk for iid / without replacement, the all-rows form otherwise
UNEVEN = [-1, -1, 0, 0, 0, 2]
#: at most 2 children a row (without replacement needs distinct siblings: V = 2)
BINARY = [-1, -1, 0, 0, 2, 1]
CHAIN = [-1, 0, 1, 2]
WIDE = [-1, -1, -1, -1, -1]
#: numbered depth first: root -> {0, 3}; 0 -> {1, 5, 7}; 1 -> {2}; 3 -> {4}; 4 -> {6} (a
#: depth's rows are not a contiguous range, siblings not adjacent: gathers, not slices)
DEPTH_FIRST = [-1, 0, 1, -1, 3, 0, 4, 0]
#: the tree shape per V (UNEVEN elsewhere): one compile per V, so the shapes take turns
TREE_AT = {63: WIDE, 97: DEPTH_FIRST, 200: CHAIN}
NUM_KEYS = 2048
P_MIN = 1e-6  # chi-square threshold, fixed in advance


# --------------------------------------------------------------------------- inputs


def _tree_for(v, scheme):
    """TREE_AT's shape (default UNEVEN), or for without replacement at V < 4 a tree whose
    rows have <= V children."""
    if scheme == "without_replacement" and v < 4:
        return CHAIN if v == 1 else BINARY
    return TREE_AT.get(v, UNEVEN)


def _kids(parents, row):
    return [j for j, p in enumerate(parents) if p + 1 == row]


def _law(a):
    """float64 nonnegative rows -> float32 rows normalized in float64."""
    a = np.asarray(a, np.float64)
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def _tail_cells(v):
    """The cells of the last block the two-level search scans: the tail block when V has
    one (97: 90..96, 4099: 4095..4098), else the last full block; at V <= 64 (one level)
    the last three cells."""
    if v <= numerics.ONE_LEVEL_MAX_V:
        return np.arange(max(v - 3, 0), v)
    bs = numerics.block_size(v)
    nfull, tail = divmod(v, bs)
    return np.arange(nfull * bs, v) if tail else np.arange(v - bs, v)


def _draft(rng, parents, q, scheme, duplicate=False):
    """Drafted tokens int32[N] the scheme can produce from the draft rows ``q``: iid draws,
    sequential draws without replacement (then the zero-probability tokens in index order
    once q's support is exhausted), or the top-n of q (ties to the lowest index; cycled
    when a row has more children than V). ``duplicate``: sibling 1 repeats sibling 0."""
    n, v = len(parents), q.shape[1]
    toks = np.zeros(n, np.int32)
    for row in range(n + 1):
        kids = _kids(parents, row)
        if not kids:
            continue
        m, qr = len(kids), q[row].astype(np.float64) / q[row].astype(np.float64).sum()
        if scheme == "iid":
            t = rng.choice(v, size=m, p=qr)
        elif scheme == "deterministic":
            t = np.resize(np.lexsort((np.arange(v), -q[row])), m)
        else:
            pos = np.flatnonzero(q[row] > 0)
            g = np.log(qr[pos]) + rng.gumbel(size=pos.size)
            t = np.concatenate([pos[np.argsort(-g)], np.flatnonzero(q[row] <= 0)])[:m]
        if duplicate and m >= 2:
            t[1] = t[0]
        toks[kids] = t
    return toks


def _cases(v, parents, scheme, seed):
    """name -> (P float32[N + 1, V], Q float32[N + 1, V], tokens int32[N])."""
    rng = np.random.default_rng(seed)
    n1 = len(parents) + 1
    rows = lambda: rng.dirichlet(np.full(v, 0.3), size=n1)  # noqa: E731
    onehot = lambda: np.eye(v)[rng.integers(0, v, n1)]  # noqa: E731
    tail = _tail_cells(v)
    in_tail, q_tail = np.zeros((n1, v)), np.zeros((n1, v))
    in_tail[:, tail] = rng.random((n1, tail.size)) + 0.1
    q_tail[:, tail] = rng.random((n1, tail.size)) + 0.1
    narrow = np.zeros((n1, v))
    narrow[:, 0] = 0.7
    narrow[:, min(1, v - 1)] += 0.3
    q_shared = _law(rows())
    laws = {
        "dirichlet": (_law(rows()), _law(rows())),
        "p_equals_q": (q_shared, q_shared.copy()),
        "onehot_p": (_law(onehot()), _law(rows())),
        "onehot_p_and_q": (_law(onehot()), _law(onehot())),
        "tail_block_both": (_law(in_tail), _law(q_tail)),
        "narrow_q": (_law(rows()), _law(narrow)),
        # acceptance near 1/2 and the rejected mass in the last block (frequency checks)
        "near_draft_tail": (_law(0.6 * q_shared + 0.4 * _law(in_tail)), q_shared.copy()),
        "narrow_draft_tail": (_law(0.5 * _law(narrow) + 0.5 * _law(in_tail)), _law(narrow)),
        "onehot_q": (_law(rows()), _law(onehot())),
    }
    if v >= 2:
        a, b = rng.random((n1, v)) < 0.6, rng.random((n1, v)) < 0.6
        a[:, 0] = b[:, 0] = True  # overlap
        a[:, 1], b[:, 1] = True, False  # q = 0 where p > 0
        if v >= 3:
            a[:, 2], b[:, 2] = False, True  # p = 0 where q > 0
        laws["cross_zeros"] = (_law(rows() * a), _law(rows() * b))
        side = rng.random((n1, v)) < 0.5
        side[:, 0], side[:, 1] = True, False
        laws["disjoint"] = (_law(rows() * side), _law(rows() * ~side))
    out = {}
    for name, (p, q) in laws.items():
        out[name] = (p, q, _draft(rng, parents, q, scheme))
    if scheme != "without_replacement":
        p, q = _law(rows()), _law(rows())
        out["duplicate_siblings"] = (p, q, _draft(rng, parents, q, scheme, duplicate=True))
    # the target gives every drafted token probability 0 (where that leaves it a law)
    q = _law(rows())
    toks = _draft(rng, parents, q, scheme)
    p = rows()
    for row in range(n1):
        kids = _kids(parents, row)
        if kids and not np.isin(np.arange(v), toks[kids]).all():
            p[row, toks[kids]] = 0.0
    out["drafts_p_zero"] = (_law(p), q, toks)
    return out


# --------------------------------------------------------------------------- checks


def _reached_rejected(parents, nodes, num_accepted):
    """bool[K, N] accepted, bool[K, N] tried and rejected, per round: node j was tried iff
    its row was reached (root, or its parent accepted) and no earlier sibling passed."""
    n = len(parents)
    par = np.asarray(parents)
    k = nodes.shape[0]
    accepted = np.zeros((k, n), bool)
    for d in range(n):
        on = d < num_accepted
        accepted[np.flatnonzero(on), nodes[on, d]] = True
    rank = np.array([_kids(parents, p + 1).index(j) for j, p in enumerate(parents)])
    row_reached = np.concatenate([np.ones((k, 1), bool), accepted], axis=1)  # [K, N + 1]
    acc_rank = np.full((k, n + 1), n + 1)
    for j in range(n):
        acc_rank[accepted[:, j], par[j] + 1] = rank[j]
    tried = row_reached[:, par + 1] & (rank[None, :] <= acc_rank[:, par + 1])
    return accepted, tried & ~accepted


def _check_round(tag, parents, v, toks, acc, resid, r):
    """Every per-round invariant of the module docstring, vectorized over the keys."""
    n = len(parents)
    out, na, nt = np.asarray(r.tokens), np.asarray(r.num_accepted), np.asarray(r.num_tokens)
    nodes, last, per_depth = np.asarray(r.accepted_nodes), np.asarray(r.last_node), np.asarray(r.accepted_per_depth)
    k = out.shape[0]
    lanes = np.arange(k)
    assert np.isfinite(acc).all() and np.isfinite(resid).all(), tag
    assert ((na >= 0) & (na <= n)).all() and (nt == na + 1).all(), tag
    depth = np.arange(n)[None, :]
    on = depth < na[:, None]
    assert ((nodes >= 0) == on).all(), f"{tag}: accepted_nodes not -1 padded after the path"
    assert (per_depth == on).all(), tag
    prev = np.concatenate([np.full((k, 1), -1), nodes[:, :-1]], axis=1)
    par = np.asarray(parents)
    assert (np.where(on, par[np.maximum(nodes, 0)] == prev, True)).all(), f"{tag}: not a root-to-node path"
    assert (last == np.where(na > 0, nodes[lanes, np.maximum(na - 1, 0)], -1)).all(), tag
    assert (np.where(on, out[:, :n] == np.asarray(toks)[np.maximum(nodes, 0)], True)).all(), tag
    after = np.arange(n + 1)[None, :] > na[:, None]
    assert (np.where(after, out == -1, True)).all(), f"{tag}: tokens not -1 padded"
    extra = out[lanes, na]
    assert ((extra >= 0) & (extra < v)).all(), f"{tag}: extra token out of [0, {v})"
    law = resid[last + 1, extra]
    bad = np.flatnonzero(~(law > 0))
    assert bad.size == 0, (f"{tag}: extra token {extra[bad[0]]} has probability {law[bad[0]]} under row "
                           f"{last[bad[0]] + 1}'s exact law ({bad.size} of {k} rounds)")
    accepted, rejected = _reached_rejected(parents, nodes, na)
    assert not (accepted & (acc[None, :] <= 0)).any(), f"{tag}: a node of acceptance probability 0 was accepted"
    assert not (rejected & (acc[None, :] >= 1)).any(), f"{tag}: a node of acceptance probability 1 was rejected"


def _check_against_reference(tag, parents, toks, p, q, acc, resid, scheme):
    """accept_probabilities vs the rule read literally in float64
    (``reference_probabilities``, tests/_reference.py),
    wherever it matters: the acceptance probability of every node tried with probability
    > 1e-6 and the emitted law of every row a round ends at with probability > 1e-6 (the
    two differ by convention on probability-0 events, e.g. after rejecting a sibling of
    acceptance probability 1, and by float32 rounding on events of probability ~1e-8)."""
    want_acc, want_resid = reference_probabilities(parents, toks, p, q, scheme=scheme)
    n = len(parents)
    arrive, stop, tried = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n)
    arrive[0] = 1.0
    for row in range(n + 1):
        left = arrive[row]
        for j in _kids(parents, row):
            tried[j] = left
            arrive[j + 1] = left * acc[j]
            left *= 1.0 - acc[j]
        stop[row] = left
    live = tried > 1e-6
    np.testing.assert_allclose(acc[live], want_acc[live], atol=2e-5, err_msg=f"{tag}: acceptance probabilities")
    rows = stop > 1e-6
    np.testing.assert_allclose(resid[rows], want_resid[rows], atol=2e-5, err_msg=f"{tag}: emitted laws")


def _traced_here(scheme, v):
    """Whether the traced form runs at this V. Always for iid / without replacement (static
    trees take the path walk there, traced ones the all-rows / dense-scan form, and the
    walk's emitted row depends on V: carried up to 1024, fetched again above); the
    deterministic scheme takes the all-rows form both ways, with the same emission code,
    so its traced form runs at the edges only (compile time)."""
    return scheme != "deterministic" or v in (1, 2, 64, 65, 4099)


@functools.lru_cache(maxsize=None)
def _program(v):
    """(trees, jit(keys, traced_keys, parents_args, inputs)) for vocabulary ``v``: per
    scheme, the rule with static parents (over ``keys``) and with traced ones (a jit
    argument, over ``traced_keys``), vmapped alike, and accept_probabilities (static).
    One compile per V, shared by the tests."""
    trees = {s: _tree_for(v, s) for s in SCHEMES}

    def run(keys, traced_keys, par_args, inputs):
        out = {}
        for s in SCHEMES:
            toks, p, q = inputs[s]
            static = jax.vmap(lambda k, s=s: speculative_accept(k, trees[s], toks, p, q, scheme=s))(keys)
            traced = None
            if _traced_here(s, v):
                traced = jax.vmap(lambda k, s=s: speculative_accept(k, par_args[s], toks, p, q, scheme=s))(traced_keys)
            out[s] = (static, traced, accept_probabilities(trees[s], toks, p, q, scheme=s))
        return out

    return trees, jax.jit(run)


@functools.lru_cache(maxsize=None)
def bench_inputs(v):
    """Per scheme the list of (name, tokens, P, Q) cases, padded to one length."""
    trees = _program(v)[0]
    cases = {s: [(name, t, p, q) for name, (p, q, t) in _cases(v, trees[s], s, seed=v).items()] for s in SCHEMES}
    longest = max(len(c) for c in cases.values())
    return {s: c + c[: longest - len(c)] for s, c in cases.items()}, longest


@pytest.mark.parametrize("v", [pytest.param(v, marks=pytest.mark.slow) if v in (65, 1000) else v for v in VOCABS])
def test_round_invariants_on_degenerate_rows(v):
    """Pins, for every case of the module docstring at this V, for each scheme, with static
    and traced parents: finite acceptance probabilities and residual laws, equal to the
    float64 literal rule wherever they can matter (probability > 1e-6); well-formed
    results (a root-to-node path, -1 padding, counts); the extra token inside [0, V) and
    inside the support of the exact law of the row it is emitted from; no
    probability-0 node accepted and no probability-1 node rejected; identical static and
    traced outputs for the same 2048 keys (deterministic: traced at the edges only,
    see :func:`_traced_here`)."""
    trees, run = _program(v)
    par_args = {s: jnp.asarray(trees[s], jnp.int32) for s in SCHEMES}
    keys = jax.random.split(jax.random.key(v), NUM_KEYS)
    cases, count = bench_inputs(v)
    for i in range(count):
        inputs = {s: cases[s][i][1:] for s in SCHEMES}
        out = run(keys, keys, par_args, inputs)
        for s in SCHEMES:
            name, toks, _, _ = cases[s][i]
            tag = f"V={v} {s} {name}"
            static, traced, (acc, resid) = out[s]
            acc, resid = np.asarray(acc), np.asarray(resid)
            _check_against_reference(tag, trees[s], toks, cases[s][i][2], cases[s][i][3], acc, resid, s)
            for form, r in (("static", static), ("traced", traced)):
                if r is not None:
                    _check_round(f"{tag} [{form}]", trees[s], v, toks, acc, resid, r)
            if traced is None:
                continue
            for field in static._fields:
                np.testing.assert_array_equal(np.asarray(getattr(traced, field)), np.asarray(getattr(static, field)),
                                              err_msg=f"{tag}: static vs traced parents, {field}")


def _stop_law(parents, acc):
    """float64[N + 1]: the probability that the round ends at row r (row r reached, all of
    its children tried and rejected; a leaf row: reached), from per-node acceptance
    probabilities: the law of ``last_node + 1``."""
    n = len(parents)
    arrive, stop = np.zeros(n + 1), np.zeros(n + 1)
    arrive[0] = 1.0
    for row in range(n + 1):  # parents[j] < j: a row is final before its children's rows
        left = arrive[row]
        for j in _kids(parents, row):
            arrive[j + 1] = left * acc[j]
            left *= 1.0 - acc[j]
        stop[row] = left
    return stop


#: the case each scheme's frequency check uses: a target 0.6 draft + 0.4 mass in the last
#: block (iid, deterministic: every path length occurs, the residuals sit in the last
#: block); without replacement the same with a draft of support {0, 1}, which the three
#: siblings of node 0 exhaust (a point-mass third sibling, token 2)
FREQ_CASE = {"iid": "near_draft_tail", "without_replacement": "narrow_draft_tail",
             "deterministic": "near_draft_tail"}
FREQ_BATCHES = 32  # x NUM_KEYS = 2^16 rounds per scheme


@pytest.mark.parametrize("v", VOCABS)
def test_emitted_token_frequencies_match_exact_law(v):
    """Pins the law of a whole round at every V, per scheme, 2^16 rounds for static parents
    and 2^16 more (other keys) for traced ones: the joint frequency of (last_node + 1,
    extra token) matches stop(row) x residual(row), with stop() the probability that the
    round ends at that row (from the acceptance probabilities) and residual() the exact
    emitted law, both from accept_probabilities (chi-square, sparse cells pooled,
    p > 1e-6; a round in a zero-probability cell fails outright). Exercises the path
    choice, the residual handed to the sampler and the one- or two-level inverse CDF (tail
    block included) together."""
    trees, run = _program(v)
    par_args = {s: jnp.asarray(trees[s], jnp.int32) for s in SCHEMES}
    cases, _ = bench_inputs(v)
    pick = {s: next(c for c in cases[s] if c[0] == FREQ_CASE[s]) for s in SCHEMES}
    inputs = {s: pick[s][1:] for s in SCHEMES}
    counts = {(s, form): 0 for s in SCHEMES for form in (0, 1)}
    for b in range(FREQ_BATCHES):
        keys = jax.random.split(jax.random.key(10_000 + 1000 * v + b), 2 * NUM_KEYS)
        out = run(keys[:NUM_KEYS], keys[NUM_KEYS:], par_args, inputs)
        for s in SCHEMES:
            for form in (0, 1):
                r = out[s][form]
                if r is None:
                    continue
                extra = np.asarray(r.tokens)[np.arange(NUM_KEYS), np.asarray(r.num_accepted)]
                cell = (np.asarray(r.last_node) + 1) * v + extra
                counts[s, form] = counts[s, form] + np.bincount(cell, minlength=(len(trees[s]) + 1) * v)
    for s in SCHEMES:
        acc, resid = (np.asarray(a, np.float64) for a in out[s][2])
        law = _stop_law(trees[s], acc)[:, None] * resid
        assert abs(law.sum() - 1) < 1e-5
        for form in (0, 1):
            if out[s][form] is None:
                continue
            res = chisquare_gof(counts[s, form], (law / law.sum()).ravel())
            assert res.pvalue > P_MIN, f"V={v} {s} {FREQ_CASE[s]} {('static', 'traced')[form]}: {res}\n{res.table()}"


#: (scheme, V, draft row at the root of WIDE): first-token losslessness with drafts drawn
#: by the library's own draws. iid at 4099 (two-level, tail block of 4, rows re-fetched);
#: without replacement at 97 with a draft of support {0, 1} and five siblings (three
#: point-mass siblings: tokens 2, 3, 4); deterministic at the one-level edge V = 64
LOSSLESS_CASES = [("iid", 4099, "spread"), ("without_replacement", 97, "narrow"), ("deterministic", 64, "spread")]


@pytest.mark.parametrize("scheme, v, draft", LOSSLESS_CASES)
def test_first_token_is_lossless_with_drafted_siblings(scheme, v, draft):
    """Pins losslessness end to end at awkward V: the root's five siblings drawn by
    jaxspec.sampling.draw from the draft row, then one round; the first emitted token
    (an accepted sibling or the residual draw) must follow the target root row, here half
    of its mass in the last block of the two-level search (chi-square, 2^16 rounds,
    p > 1e-6, cells pooled; a token of target probability 0 fails outright)."""
    rng = np.random.default_rng(v)
    n = len(WIDE)
    tail = _tail_cells(v)
    p = 0.5 * rng.dirichlet(np.full(v, 0.3), size=n + 1)
    p[:, tail] += 0.5 * rng.dirichlet(np.ones(tail.size), size=n + 1)
    if draft == "narrow":
        q = np.zeros((n + 1, v))
        q[:, 0], q[:, 1] = 0.6, 0.4
    else:
        q = rng.dirichlet(np.full(v, 0.3), size=n + 1)
    p, q = _law(p), _law(q)

    def first_token(key):
        k_draft, k_accept = jax.random.split(key)
        toks, _ = sampling.draw(k_draft, q[0], n, scheme)
        return speculative_accept(k_accept, WIDE, toks, p, q, scheme=scheme).tokens[0]

    run = jax.jit(jax.vmap(first_token))
    counts = sum(np.bincount(np.asarray(run(jax.random.split(jax.random.key(20_000 + b), 1 << 13))), minlength=v)
                 for b in range(8))
    res = chisquare_gof(counts, p[0].astype(np.float64) / p[0].astype(np.float64).sum())
    assert res.pvalue > P_MIN, f"{scheme} V={v}: {res}\n{res.table()}"
