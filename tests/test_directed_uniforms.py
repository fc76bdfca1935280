"""Directed tests: the uniforms forced to the ends of their range, for every shipped rule.

Sampling cannot see a rule that fails only at an end of a uniform's range: a coin of exactly
0 accepting a draft token of target probability 0 when the test reads ``u <= p / q``
(SGLang #35771, about 2^-23 per test in float32), or an inverse CDF that returns a cell of
probability 0 when ``u * total`` rounds up to the total. Here every uniform a rule draws
(``jax.random.uniform``, intercepted by :func:`jaxspec.exactness.external.forced_uniforms`:
the acceptance uniforms, then the residual or bonus draw) is forced to exactly 0 or to the
largest float32 below 1, in all four combinations, on rows built to tempt each failure:
draft tokens of target probability 0, rows whose last cells are 0, ``p == q`` rows. Asserted:

* every emitted token (accepted or the extra residual / bonus one) has target probability
  > 0 in the row it was judged or drawn from;
* at u = 0 a token of target probability 0 is rejected and one of positive probability
  accepted; at u = 1 - 2^-24 a node is accepted only with acceptance probability 1 (which
  shows the interception reached the rule);
* a token of q = 0 (docs/DESIGN.md §2: accept with ``min(1, p / q)``; DESIGN's reading of
  ``p / 0``: 1 when ``p > 0``, else 0, ``jaxspec.core.numerics.accept_ratio``) is accepted
  with certainty when ``p > 0`` and never when ``p = 0``; with concrete inputs under a
  sampling scheme ``speculative_accept`` refuses it, naming the token (q is then not the
  law the tokens were drawn from).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.core import rules, sampling
from jaxspec.exactness.external import EXTREMES, directed_uniforms, forced_uniforms
from jaxspec.exactness.harness import default_pair

U0, U1 = EXTREMES["0"], EXTREMES["1 - 2^-24"]
V = 8

CHAIN = (-1, 0, 1)
TREE = (-1, -1, 0, 0, 1)  # root: two children; node 0: two children; node 1: one child

#: every shipped (rule, scheme, tree) combination: token under each scheme on a chain and a
#: tree, block on the chain, traversal on both
CASES = ([("token", s, t) for s in sampling.SCHEMES for t in ("chain", "tree")]
         + [("block", s, "chain") for s in sampling.SCHEMES]
         + [("traversal", s, t) for s in sampling.SCHEMES for t in ("chain", "tree")])


def _rows(parents, seed):
    """Target and draft rows [N + 1, V] built to tempt the failures: every target row is 0 at
    tokens 0 and V - 1 (the cells u = 0 and u -> 1 reach first); the draft puts mass on token 0;
    row 1 has p == q; the drafted tokens (the first child of each row is token 0: p = 0)."""
    rng = np.random.default_rng(seed)
    n = len(parents)
    p = rng.dirichlet(np.ones(V), size=n + 1)
    p[:, [0, V - 1]] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    q = rng.dirichlet(np.ones(V), size=n + 1)
    q[:, 0] += 0.5
    q /= q.sum(axis=1, keepdims=True)
    q[1] = p[1]  # p == q: the residual sums to 0
    tokens = np.zeros(n, np.int64)
    seen = {}
    for i, par in enumerate(parents):
        k = seen.get(par, 0)
        seen[par] = k + 1
        # the first child: token 0 (p = 0, q > 0); the others: a token with p > 0
        tokens[i] = 0 if k == 0 else 1 + (i % (V - 2))
    return p.astype(np.float32), q.astype(np.float32), tokens.astype(np.int32)


def _drawable(parents, tokens, q, scheme):
    """q as a law the tokens could have been drawn from under ``scheme`` (without replacement:
    distinct siblings; deterministic: reads no q)."""
    if scheme == "without_replacement":  # distinct tokens per row
        seen = {}
        for i, par in enumerate(parents):
            row = seen.setdefault(par, set())
            while int(tokens[i]) in row:
                tokens[i] = (tokens[i] + 1) % V
            row.add(int(tokens[i]))
    return tokens, q


_PROGRAMS = {}


def _program(rule, scheme, parents, shapes):
    """The rule compiled with its uniforms replaced by two arguments: the acceptance uniforms
    by ``u_accept``, the residual / bonus draw's by ``u_emit`` (calls in trace order:
    acceptance first). Traced once under the interception, then run with any values."""
    key = (rule, scheme, parents, shapes)
    if key not in _PROGRAMS:
        from jax._src import random as jax_random

        fn = rules.rule_function(rule)
        calls = []

        def f(k, P, Q, T, ua, ue):
            values = iter([ua, ue])

            def forced(key, shape=(), dtype=float, minval=0.0, maxval=1.0, **kw):
                calls.append(1)
                return jnp.broadcast_to(next(values, ue), shape).astype(dtype)

            original = jax_random.uniform
            jax_random.uniform = jax.random.uniform = forced
            try:
                return fn(k, np.asarray(parents), T, P, Q, scheme)
            finally:
                jax_random.uniform = jax.random.uniform = original

        jax.clear_caches()
        args = (jax.random.key(0), *(jnp.zeros(s, d) for s, d in shapes), jnp.float32(0), jnp.float32(0))
        _PROGRAMS[key] = jax.jit(f).lower(*args).compile()
        jax.clear_caches()
        assert len(calls) >= 2, f"expected the acceptance and the emission uniforms to be intercepted, got {calls}"
    return _PROGRAMS[key]


def _run(rule, scheme, parents, p, q, tokens, u_accept, u_emit):
    """The rule with the acceptance uniforms forced to ``u_accept`` and the residual / bonus
    draw's to ``u_emit``."""
    shapes = ((p.shape, jnp.float32), (q.shape, jnp.float32), (tokens.shape, jnp.int32))
    res = _program(rule, scheme, tuple(parents), shapes)(
        jax.random.key(0), jnp.asarray(p), jnp.asarray(q), jnp.asarray(tokens), jnp.float32(u_accept),
        jnp.float32(u_emit))
    return jax.tree.map(np.asarray, res)


def _emitted_rows(parents, res):
    """(row, token) of every emitted token: an accepted node's token judged by its parent's
    row, the extra token drawn from the row after the last accepted node."""
    k = int(res.num_accepted)
    path = [int(x) for x in res.accepted_nodes[:k]]
    out = [(parents[i] + 1, int(res.tokens[j])) for j, i in enumerate(path)]
    out.append((int(res.last_node) + 1, int(res.tokens[k])))
    return out


@pytest.mark.parametrize("rule, scheme, tree", CASES, ids=lambda x: str(x))
def test_forced_uniforms_never_emit_a_token_of_target_probability_zero(rule, scheme, tree):
    parents = CHAIN if tree == "chain" else TREE
    for seed in range(3):
        p, q, tokens = _rows(parents, seed)
        tokens, q = _drawable(parents, tokens, q, scheme)
        for ua in (U0, U1):
            for ue in (U0, U1):
                res = _run(rule, scheme, parents, p, q, tokens, ua, ue)
                emitted = _emitted_rows(parents, res)
                for row, tok in emitted:
                    assert p[row, tok] > 0, (f"{rule}/{scheme}/{tree} seed {seed} u_accept={ua} u_emit={ue}: "
                                             f"token {tok} emitted from row {row} where p = 0; {emitted}")
                # the first child of the root is token 0 (p = 0): never accepted, whatever the coin
                assert res.num_accepted == 0 or int(res.accepted_nodes[0]) != 0 or tokens[0] != 0


@pytest.mark.parametrize("rule", ["token", "block", "traversal"])
def test_the_coins_reach_the_rule(rule):
    """A chain of one node whose acceptance probability is 1/2: accepted at u = 0, rejected at
    u = 1 - 2^-24; the extra token is the first cell of positive mass at u = 0 and the last at
    u = 1 - 2^-24 (the inverse CDF at both ends of its range)."""
    p = np.zeros((2, V), np.float32)
    p[0, [2, 3, 5]] = [0.2, 0.3, 0.5]
    p[1, [1, 4, 6]] = [0.25, 0.25, 0.5]
    q = np.zeros((2, V), np.float32)
    q[0, [2, 3, 5]] = [0.1, 0.6, 0.3]  # token 3: p / q = 1/2
    q[1] = p[1]
    tok = np.array([3], np.int32)
    acc = _run(rule, "iid", (-1,), p, q, tok, U0, U0)
    assert int(acc.num_accepted) == 1 and int(acc.tokens[1]) == 1  # bonus: first positive cell of row 1
    acc = _run(rule, "iid", (-1,), p, q, tok, U0, U1)
    assert int(acc.num_accepted) == 1 and int(acc.tokens[1]) == 6  # bonus: last positive cell of row 1
    rej = _run(rule, "iid", (-1,), p, q, tok, U1, U0)
    # residual [p - q]_+ of row 0 = [0.1 at 2, 0 at 3, 0.2 at 5]: first positive cell 2, last 5
    assert int(rej.num_accepted) == 0 and int(rej.tokens[0]) == 2
    rej = _run(rule, "iid", (-1,), p, q, tok, U1, U1)
    assert int(rej.num_accepted) == 0 and int(rej.tokens[0]) == 5


@pytest.mark.parametrize("rule", ["token", "block", "traversal"])
@pytest.mark.parametrize("p_x", [0.0, 0.4])
def test_a_token_of_q_zero(rule, p_x):
    """q(x) = 0 under jit (no input check): accepted with certainty when p(x) > 0 (even at
    u = 1 - 2^-24), never when p(x) = 0 (even at u = 0)."""
    p = np.zeros((2, V), np.float32)
    p[0, [2, 3]] = [1.0 - p_x, p_x]
    p[1, [1, 4]] = [0.5, 0.5]
    q = np.zeros((2, V), np.float32)
    q[0, [2, 5]] = [0.5, 0.5]  # q(3) = 0
    tok = np.array([3], np.int32)
    for u in (U0, U1):
        res = _run(rule, "iid", (-1,), p, q, tok, u, u)
        assert int(res.num_accepted) == (1 if p_x > 0 else 0), (rule, p_x, u)
        for row, t in _emitted_rows((-1,), res):
            assert p[row, t] > 0


def test_a_token_of_q_zero_is_refused_with_concrete_inputs():
    p = np.full((2, V), 1.0 / V, np.float32)
    q = np.zeros((2, V), np.float32)
    q[:, 2] = 1.0
    for scheme in ("iid", "without_replacement"):
        with pytest.raises(ValueError, match=r"tokens\[0\] = 3: draft_probs\[0\]\[3\] = 0"):
            jaxspec.speculative_accept(jax.random.key(0), [-1], np.array([3]), p, q, scheme=scheme)
    jaxspec.speculative_accept(jax.random.key(0), [-1], np.array([3]), p, q, scheme="deterministic")  # reads no q


@pytest.mark.parametrize("v", [5, 64, 65, 200])
def test_sample_categorical_at_both_ends(v):
    """The residual / bonus draw alone (one and two levels of the inverse CDF): zeros at the
    start and the end of the row, and a last positive cell of tiny mass."""
    probs = np.zeros(v, np.float32)
    probs[2:v - 2] = 1.0
    probs[v - 3] = 1e-30  # the last positive cell holds almost nothing
    for u, want in ((U0, 2), (U1, v - 3)):
        with forced_uniforms(u):
            got = int(jax.jit(sampling.sample_categorical)(jax.random.key(0), jnp.asarray(probs)))
        assert probs[got] > 0 and (got == want or u == U1), (v, u, got)


# --------------------------------------------------------------------------- check_sampler


def _toy_chain_sampler(target, law, *, buggy: bool, gamma: int = 2):
    """A chain speculative sampler written in plain JAX, as an outside engine would: the draft
    is uniform over the vocabulary, the target's law teacher-forced by ``forward_logits``;
    accept when ``u < p / q`` (``buggy``: ``u <= p / q``, SGLang #35771)."""
    from jaxspec.nn.model import forward_logits

    v = target.config.vocab_size

    def probs(seq):
        return sampling.warp_probs(forward_logits(target, seq[None])[0, -1], temperature=law.temperature,
                                   top_k=law.top_k)

    def one(key, prompt, horizon):
        seq = jnp.asarray(prompt, jnp.int32)
        out = []
        while len(out) < horizon:
            key, kd, ka, kr = jax.random.split(key, 4)
            drafts = jnp.floor(jax.random.uniform(kd, (gamma,)) * v).astype(jnp.int32)  # q = 1 / V
            coins = jax.random.uniform(ka, (gamma,))
            for i in range(gamma):
                p = probs(seq)
                ratio = p[drafts[i]] * v
                ok = bool(coins[i] <= ratio) if buggy else bool(coins[i] < ratio)
                if ok:
                    seq = jnp.append(seq, drafts[i])
                    out.append(int(drafts[i]))
                    continue
                res = jnp.maximum(p - 1.0 / v, 0.0)
                tok = int(sampling.inverse_cdf(jax.random.uniform(kr, ()), res))
                seq = jnp.append(seq, tok)
                out.append(tok)
                break
        return out[:horizon]

    def sampler(prompt_ids, n, seed):
        return np.array([one(jax.random.fold_in(jax.random.key(seed), i), prompt_ids, 2) for i in range(n)])

    return sampler


@pytest.mark.long
def test_check_sampler_directed_check_rejects_the_zero_coin_bug():
    """check_sampler's directed check on an outside JAX sampler: the ``u <= p / q`` version
    emits a token of target probability 0 at u = 0 (top-k 2 leaves p = 0 at the drafted token
    0 unless token 0 is in the top 2); the ``u < p / q`` version passes both extremes."""
    target, _ = default_pair(0)
    law = jaxspec.Sampling(temperature=1.0, top_k=1)  # one token of positive probability
    bad = directed_uniforms(_toy_chain_sampler(target, law, buggy=True), target, [1, 2, 3], horizon=2,
                            sampling=law, num_samples=2)
    good = directed_uniforms(_toy_chain_sampler(target, law, buggy=False), target, [1, 2, 3], horizon=2,
                             sampling=law, num_samples=2)
    print(bad.summary())
    print(good.summary())
    assert bad.intercepted and good.intercepted
    assert bad.impossible["0"] > 0 and not bad.passed
    assert good.passed and sum(good.impossible.values()) == 0


def test_check_sampler_says_when_nothing_was_intercepted():
    target, _ = default_pair(0)

    def numpy_sampler(prompt_ids, n, seed):
        return np.random.default_rng(seed).integers(0, target.config.vocab_size, (n, 2))

    r = directed_uniforms(numpy_sampler, target, [1, 2, 3], horizon=2, num_samples=2)
    assert not r.intercepted and r.passed and "not intercepted" in r.summary()


@pytest.mark.parametrize("raw, got", [
    ([[1, 2, 3, 0]] * 7 + [[1, 2]], "list of 8 rows of lengths 2 to 4"),
    ([[1, 2, 3, 0]] * 7 + [1], "list"),
])
def test_check_sampler_names_a_ragged_output(raw, got):
    """Issue 50, defect 7: ragged rows are the sampler's output of the wrong shape, with what
    was expected, not numpy's ValueError."""
    target, _ = default_pair(0)
    with pytest.raises(jaxspec.SettingError, match=r"sampler = 'ragged': returned output of the wrong shape: "
                                                   r"expected int\[8, >= 4\].*got a " + got):
        from jaxspec.exactness.external import check_sampler

        def ragged(prompt_ids, n, seed):
            return raw

        check_sampler(ragged, target, [1, 2, 3], num_samples=8, horizon=4)
