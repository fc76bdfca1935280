"""Exact (enumerated, float64 numpy) laws of three verification rules on bigram tables.

An independent reference, derived from the papers' mathematics (block verification: Sun et
al. 2025; traversal verification: Weng et al. 2025) and docs/DESIGN.md §1-2 only: plain numpy
and itertools, no other jaxspec module is imported (``tests/test_rules_enumeration.py``
checks), so the tests that hold the library's rules against it compare two independent
implementations. :mod:`jaxspec.bench.rules` reads its exact expectations. Everything is exact: every draft
outcome of a round is enumerated with its probability, and the acceptance uniforms are
integrated out analytically (each accept / reject test contributes its probability), so a
lossless rule reproduces the target law to float64 rounding and a biased one shows its bias
without sampling noise.

Conventions (DESIGN.md §1): a tree is ``parents[N]`` with ``parents[i] < i`` and ``-1`` for a
child of the root; siblings are tried in index order. A bigram target ``t[c]`` (law of the
next token after token ``c``) and draft ``d[c]``; the root is the round's context token, so
the row that judges node ``i``'s token is the row of its parent's token.

Sibling schemes (the law each sibling was actually drawn from, ``q_k``):

* ``iid``: every sibling is an independent draw from ``q``; ``q_k = q``.
* ``without_replacement``: sibling k is drawn from ``q`` with the earlier siblings' tokens
  removed and renormalized; ``q_k`` is that law. If the support is exhausted the sibling is
  the lowest-index unused token and ``q_k`` is a one-hot on it (as ``jaxspec`` draws it).
* ``deterministic``: the draft's top-k (ties to the lower index), each ``q_k`` a one-hot.

Rules (``rule`` argument):

* ``"token"``: the token-level rule generalised to trees (DESIGN.md §2).
* ``"block"``: block verification (Sun et al. 2025) on a chain, exactly as RULES.md.
  Mutants: ``"block-noclip"`` (raw cumulative product), ``"block-first-fail"`` (tau = the
  position before the first failed test), ``"block-token-residual"`` (emit
  ``normalize([p_tau - q_tau]_+)``).
* ``"traversal"``: traversal verification (Weng et al. 2025), RULES.md's algorithm; see
  :func:`_traversal_round` for the exact reading. Mutant ``"traversal-mutant"`` (parent update
  ``alpha_u <- min(r / (1 - Ms_u(x)), 1)``). Options (keyword arguments of the public
  functions): ``ms=`` ``"drawn"`` (default: Ms is the law the current first remaining child
  was drawn from, per scheme), ``"removed"`` (RULES.md's literal text for every scheme: ``q``
  with the removed siblings' tokens zeroed and renormalized), ``"fixed"`` (``q`` throughout);
  ``leaf_law=`` ``"current"`` (default: an accepted node emits from its current, possibly
  residual-updated ``Mb``) or ``"original"`` (from its original target row).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

SCHEMES = ("iid", "without_replacement", "deterministic")
RULES = (
    "token",
    "block",
    "block-noclip",
    "block-first-fail",
    "block-token-residual",
    "traversal",
    "traversal-mutant",
)

# --------------------------------------------------------------------------- trees, tables


def chain(k: int) -> tuple[int, ...]:
    """A chain of ``k`` nodes: ``(-1, 0, 1, ..., k - 2)``."""
    return tuple(range(-1, k - 1))


def branching(widths) -> tuple[int, ...]:
    """Per-level branching, breadth first, siblings consecutive: ``(2, 1)`` -> ``(-1, -1, 0, 1)``."""
    parents: list[int] = []
    frontier = [-1]
    for w in widths:
        nxt = []
        for p in frontier:
            for _ in range(w):
                nxt.append(len(parents))
                parents.append(p)
        frontier = nxt
    return tuple(parents)


def children(parents) -> list[list[int]]:
    """``kids[row]``: the nodes whose parent is row - 1 (row 0 = the root), in order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, p in enumerate(parents):
        assert -1 <= p < j, f"parents[{j}] = {p}: expected -1 <= parents[i] < i"
        kids[p + 1].append(j)
    return kids


def is_chain(parents) -> bool:
    return tuple(parents) == chain(len(parents))


def random_tables(seed: int, v: int, *, alpha_target=0.7, mix=0.35):
    """Random float64 bigram target ``t`` and draft ``d`` (full support), in the style of
    ``tests/_ngram.py::bigram_tables``: the draft is the target mixed with noise, sharpened."""
    rng = np.random.default_rng(seed)
    t = rng.dirichlet(np.full(v, alpha_target), size=v)
    noise = rng.dirichlet(np.full(v, 1.0), size=v)
    d = ((1 - mix) * t + mix * noise) ** 1.3
    d /= d.sum(axis=1, keepdims=True)
    return t, d


def zero_tables(v: int = 4, seed: int = 7):
    """Degenerate float64 tables with zeros in both ``p`` and ``q``.

    Row 0: ``q`` is a point mass on token 2 (exhausts ``without_replacement``);
    row 1: disjoint-ish supports (``p`` lives where ``q`` is small or zero); row 2:
    ``p == q``; row 3 (if any): a one-hot target. Other rows random with a zero each.
    """
    rng = np.random.default_rng(seed)
    t = rng.dirichlet(np.full(v, 0.8), size=v)
    d = rng.dirichlet(np.full(v, 0.8), size=v)
    for c in range(v):
        t[c, (c + 1) % v] = 0.0
        d[c, (c + 2) % v] = 0.0
    d[0] = 0.0
    d[0, 2 % v] = 1.0
    t[1] = 0.0
    t[1, 0], t[1, 2 % v] = 0.6, 0.4
    d[1] = 0.0
    d[1, 1], d[1, 2 % v] = 0.7, 0.3
    if v > 2:
        t[2] = d[2]
    if v > 3:
        t[3] = 0.0
        t[3, 0] = 1.0
    t /= t.sum(axis=1, keepdims=True)
    d /= d.sum(axis=1, keepdims=True)
    return t, d


def target_law(t, c0: int, length: int) -> np.ndarray:
    """Exact law of the next ``length`` tokens after ``c0``: float64[V] * length."""
    t = np.asarray(t, np.float64)
    v = t.shape[0]
    law = t[c0].copy()
    for _ in range(length - 1):
        law = law[..., :, None] * t  # the new axis is the next token, judged by the last
    assert law.shape == (v,) * length
    return law


def tv(a, b) -> float:
    """Total variation distance of two laws (arrays of the same shape, or dicts)."""
    if isinstance(a, dict):
        keys = set(a) | set(b)
        return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# --------------------------------------------------------------------------- draft outcomes


def _normalize(z):
    s = z.sum()
    return z / s if s > 0 else z  # a zero vector only on paths of probability 0


def _onehot(v, x):
    e = np.zeros(v)
    e[x] = 1.0
    return e


def sibling_draws(q, m: int, scheme: str):
    """All ordered tuples of ``m`` siblings drawn from row ``q`` under ``scheme``.

    Yields ``(tokens, laws, prob)``: ``laws[k]`` is the law sibling k was drawn from.
    """
    q = np.asarray(q, np.float64)
    v = q.shape[0]
    if scheme == "deterministic":
        assert m <= v
        order = sorted(range(v), key=lambda i: (-q[i], i))[:m]
        yield tuple(order), tuple(_onehot(v, x) for x in order), 1.0
    elif scheme == "iid":
        for xs in itertools.product(range(v), repeat=m):
            pr = float(np.prod([q[x] for x in xs]))
            if pr > 0:
                yield xs, (q,) * m, pr
    elif scheme == "without_replacement":
        assert m <= v

        def rec(xs, laws, pr):
            if len(xs) == m:
                yield tuple(xs), tuple(laws), pr
                return
            rem = q.copy()
            rem[list(xs)] = 0.0
            s = rem.sum()
            if s > 0:
                law = rem / s
                for x in range(v):
                    if law[x] > 0:
                        yield from rec(xs + [x], laws + [law], pr * law[x])
            else:  # support exhausted: the lowest-index unused token, a point mass
                x = min(set(range(v)) - set(xs))
                yield from rec(xs + [x], laws + [_onehot(v, x)], pr)

        yield from rec([], [], 1.0)
    else:
        raise ValueError(f"scheme = {scheme!r}")


def draft_outcomes(parents, d, c0: int, scheme: str):
    """Every draft outcome of a round: ``(tokens[N], laws[N], prob)``.

    ``laws[i]`` is the law node ``i`` was drawn from (its parent's row under the scheme).
    The probabilities sum to 1.
    """
    kids = children(parents)
    n = len(parents)
    d = np.asarray(d, np.float64)
    rows = [r for r in range(n + 1) if kids[r]]

    def rec(idx, tok, laws, pr):
        if idx == len(rows):
            yield tuple(tok), tuple(laws), pr
            return
        r = rows[idx]
        ctx = c0 if r == 0 else tok[r - 1]
        for xs, ls, p in sibling_draws(d[ctx], len(kids[r]), scheme):
            tok2, laws2 = list(tok), list(laws)
            for node, x, law in zip(kids[r], xs, ls):
                tok2[node], laws2[node] = x, law
            yield from rec(idx + 1, tok2, laws2, pr * p)

    yield from rec(0, [None] * n, [None] * n, 1.0)


# --------------------------------------------------------------------------- one round, one outcome


def _add(out, block, pr):
    if pr != 0.0:
        out[block] = out.get(block, 0.0) + pr


def _emit(out, path, weight, law):
    for y in range(law.shape[0]):
        _add(out, path + (y,), weight * law[y])


def _ratio_min1(a, b):
    if b > 0:
        return min(1.0, a / b)
    return 1.0 if a > 0 else 0.0


def token_round(parents, tok, laws, t, c0, out, weight):
    """DESIGN.md §2 on a tree: try children in order, accept x with min(1, p(x) / q_k(x)),
    on reject p <- normalize([p - q_k]_+); an accepted leaf emits its bonus from its row;
    when no child is left emit from the current p."""
    kids = children(parents)

    def visit(row, ctx, path, w):
        p = t[ctx]
        for c in kids[row]:
            if w == 0.0:
                return
            x, qk = tok[c], laws[c]
            a = _ratio_min1(p[x], qk[x])
            visit(c + 1, x, path + (x,), w * a)
            w *= 1.0 - a
            p = _normalize(np.maximum(p - qk, 0.0))
        _emit(out, path, w, p)

    visit(0, c0, (), weight)


def _block_round(
    parents, tok, laws, t, d, c0, out, weight, *, clip=True, stop="last", residual="block"
):
    """RULES.md block verification on a chain X_1..X_g.

    p_i = t[ctx_i], q_i = the law X_{i+1} was drawn from (one-hot for deterministic),
    w_0 = 1, w_i = min(1, w_{i-1} p_{i-1}(X_i) / q_{i-1}(X_i)), r_i = sum_x [w_i p_i - q_i]_+,
    h_i = r_i / (r_i + 1 - w_i) (1 if the denominator is 0), h_g = w_g; tau = the last i with
    eta_i <= h_i (0 if none): P(tau = i) = h_i prod_{j > i} (1 - h_j). Emit X_1..X_tau, then
    a bonus from p_g (tau = g) or a token from normalize([w_tau p_tau - q_tau]_+).
    """
    assert is_chain(parents), "block verification is defined on chains"
    g = len(parents)
    ctx = (c0,) + tuple(tok)
    p = [t[c] for c in ctx]  # p_0 .. p_g
    q = list(laws)  # q_0 .. q_{g-1}: q[i] is the law X_{i+1} was drawn from
    w = [1.0]
    for i in range(1, g + 1):
        x = tok[i - 1]
        ratio = w[-1] * p[i - 1][x] / q[i - 1][x]
        w.append(min(1.0, ratio) if clip else ratio)
    h = [None]
    res = [np.maximum(p[0] - q[0], 0.0)]
    for i in range(1, g):
        z = np.maximum(w[i] * p[i] - q[i], 0.0)
        res.append(np.maximum(p[i] - q[i], 0.0) if residual == "token" else z)
        r = z.sum()
        den = r + (1.0 - w[i])
        h.append(r / den if den > 0 else 1.0)
    h.append(w[g])
    h = [None] + [min(1.0, max(0.0, x)) for x in h[1:]]  # probabilities (matters unclipped)
    tau_prob = []
    for i in range(g + 1):
        if stop == "last":  # passes at i (none needed for i = 0), fails at every j > i
            pr = (h[i] if i else 1.0) * float(np.prod([1.0 - h[j] for j in range(i + 1, g + 1)]))
        elif stop == "first":  # mutant: tau = (first failing position) - 1
            pr = float(np.prod([h[j] for j in range(1, i + 1)])) * ((1.0 - h[i + 1]) if i < g else 1.0)
        else:
            raise ValueError(stop)
        tau_prob.append(pr)
    for i in range(g + 1):
        law = p[g] if i == g else _normalize(res[i])
        _emit(out, tuple(tok[:i]), weight * tau_prob[i], law)


def _traversal_round(
    parents, tok, laws, t, d, c0, out, weight, *, update="traversal", ms="drawn", leaf_law="current"
):
    """RULES.md traversal verification, the reading implemented here.

    State, for every row u (0 = root, i + 1 = node i):
      * ``Mb[u]``: target-side law, initially ``t[token of u]``;
      * ``removed[u]``: how many of u's children are deleted. Children are only ever deleted
        first-remaining-first, so u's remaining children are ``kids[u][removed[u]:]``;
      * ``alpha[u]``: stored for the root (1) and for every row that has had a child
        rejected; otherwise derived from the parent on the path.
    ``Ms[u]`` (the draft-side law) is a function of the state: the law u's first remaining
    child was drawn from (``ms="drawn"``): iid -> ``q``; without replacement -> ``q`` with
    the removed children's tokens zeroed and renormalized (one-hot once exhausted);
    deterministic -> a one-hot on that child's token.

    Step: walk from the root by first remaining children to ℓ; on the way
    ``alpha[c] = alpha[c]`` if stored else ``min(1, alpha[u] Mb[u](x_c) / Ms[u](x_c))``.
    If ℓ is the root, emit from ``Mb[root]``. With probability ``alpha[ℓ]`` accept the path
    and emit one token from ``Mb[ℓ]`` -- its current law: the target row for a node that
    never lost a child (the bonus), the residual left by its deleted children otherwise.
    Else with u = parent(ℓ), x = token(ℓ), M = Ms[u] (before the update):
    ``r = sum [alpha_u Mb_u - M]_+``, ``Mb[u] <- normalize([alpha_u Mb_u - M]_+)``,
    ``alpha[u] <- r / (r + 1 - alpha_u)`` (1 if the denominator is 0; the root stays 1),
    ``removed[u] += 1`` (which moves ``Ms[u]`` to the next sibling's law). Repeat.
    """
    kids = children(parents)
    n = len(parents)
    row_tok = (c0,) + tuple(tok)
    mb = [t[c].copy() for c in row_tok]
    removed = [0] * (n + 1)
    alpha = {0: 1.0}

    def ms_of(u):
        k = removed[u]
        c = kids[u][k]
        if ms == "drawn":
            return laws[c]
        q = d[row_tok[u]]
        if ms == "fixed":
            return q
        assert ms == "removed"
        rem = q.copy()
        rem[[tok[j] for j in kids[u][:k]]] = 0.0
        return _normalize(rem)

    w = weight
    for _ in range(n + 2):
        path, rows, alphas = (), [0], [1.0]
        while removed[rows[-1]] < len(kids[rows[-1]]):
            u = rows[-1]
            c = kids[u][removed[u]]
            x = tok[c]
            a = alpha[c + 1] if (c + 1) in alpha else _ratio_min1(alphas[-1] * mb[u][x], ms_of(u)[x])
            rows.append(c + 1)
            alphas.append(a)
            path += (x,)
        leaf = rows[-1]
        if leaf == 0:
            _emit(out, (), w, mb[0])
            return
        a = alphas[-1]
        law = mb[leaf] if leaf_law == "current" else t[row_tok[leaf]]
        _emit(out, path, w * a, law)
        w *= 1.0 - a
        if w == 0.0:
            return
        u, au = rows[-2], alphas[-2]
        m = ms_of(u)
        x = row_tok[leaf]
        z = np.maximum(au * mb[u] - m, 0.0)
        r = z.sum()
        mb[u] = _normalize(z)
        if u == 0:
            alpha[0] = 1.0
        elif update == "traversal":
            den = r + (1.0 - au)  # not (r + 1) - au: that loses r's relative accuracy
            alpha[u] = min(1.0, r / den) if den > 0 else 1.0
        elif update == "mutant":
            den = 1.0 - m[x]
            alpha[u] = min(r / den, 1.0) if den > 0 else 1.0
        else:
            raise ValueError(update)
        removed[u] += 1
    raise AssertionError("traversal did not stop within N + 1 steps")


# --------------------------------------------------------------------------- public API


def _check(rule, parents, scheme):
    if rule not in RULES:
        raise ValueError(f"rule = {rule!r}; expected one of {RULES}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme = {scheme!r}; expected one of {SCHEMES}")
    if rule.startswith("block"):
        assert is_chain(parents), f"{rule} is defined on chains only"


def round_law(rule, parents, t, d, c0, scheme, **opts) -> dict:
    """Exact law ``{block: prob}`` of one round's emitted block (accepted path + one token)."""
    parents = tuple(int(p) for p in parents)
    _check(rule, parents, scheme)
    t = np.asarray(t, np.float64)
    d = np.asarray(d, np.float64)
    out: dict = {}
    for tok, laws, pr in draft_outcomes(parents, d, int(c0), scheme):
        if rule == "token":
            token_round(parents, tok, laws, t, c0, out, pr)
        elif rule == "block":
            _block_round(parents, tok, laws, t, d, c0, out, pr)
        elif rule == "block-noclip":
            _block_round(parents, tok, laws, t, d, c0, out, pr, clip=False)
        elif rule == "block-first-fail":
            _block_round(parents, tok, laws, t, d, c0, out, pr, stop="first")
        elif rule == "block-token-residual":
            _block_round(parents, tok, laws, t, d, c0, out, pr, residual="token")
        elif rule == "traversal":
            _traversal_round(parents, tok, laws, t, d, c0, out, pr, **opts)
        elif rule == "traversal-mutant":
            _traversal_round(parents, tok, laws, t, d, c0, out, pr, update="mutant", **opts)
    return out


def expected_tokens(rule, parents, t, d, c0, scheme, **opts) -> float:
    """Exact E[tokens emitted in one round from context c0] = E[accepted] + 1."""
    law = round_law(rule, parents, t, d, c0, scheme, **opts)
    return float(sum(pr * len(b) for b, pr in law.items()))


def emitted_law(rule, parents, t, d, c0, scheme, L, **opts) -> np.ndarray:
    """Exact law (float64[V] * L) of the first L emitted tokens over repeated rounds from c0.

    Each round's last emitted token is the next round's root; the last round's block is
    truncated. Compare with :func:`target_law`.
    """
    t = np.asarray(t, np.float64)
    v = t.shape[0]
    laws: dict = {}

    def law_of(c):
        if c not in laws:
            laws[c] = round_law(rule, parents, t, d, c, scheme, **opts)
        return laws[c]

    @functools.cache
    def f(c, n):
        out = np.zeros((v,) * n)
        for b, pr in law_of(c).items():
            if len(b) >= n:
                out[b[:n]] += pr
            else:
                out[b] += pr * f(b[-1], n - len(b))
        return out

    return f(int(c0), int(L))
