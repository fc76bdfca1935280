"""Exact (enumerated, float64 numpy) expectations of one speculative round on bigram tables.

Independent of the library: the rule is re-read from docs/DESIGN.md §2 and evaluated by
enumerating every draft draw with its probability.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np


def _q_k(q, earlier, x, scheme):
    if scheme == "iid":
        return q
    if scheme == "deterministic":
        return np.eye(q.shape[0])[x]
    rem = q.copy()
    rem[list(earlier)] = 0.0
    s = rem.sum()
    return rem / s if s > 0 else np.eye(q.shape[0])[x]


def _draws(q, m, scheme):
    """All ordered candidate tuples for m siblings with their probabilities."""
    v = q.shape[0]
    if scheme == "deterministic":
        order = sorted(range(v), key=lambda i: (-q[i], i))
        yield tuple(order[:m]), 1.0
        return
    if scheme == "iid":
        for xs in itertools.product(range(v), repeat=m):
            pr = float(np.prod([q[x] for x in xs]))
            if pr > 0:
                yield xs, pr
        return
    assert np.count_nonzero(q) >= m, "enumeration assumes the support is not exhausted"
    for xs in itertools.permutations(range(v), m):
        pr, rem = 1.0, q.copy()
        for x in xs:
            pr *= rem[x] / rem.sum()
            rem[x] = 0.0
        if pr > 0:
            yield xs, pr


def _accept_probs(p, q, xs, scheme):
    """Acceptance probability of each sibling given it is tried, and the final residual."""
    a = []
    for k, x in enumerate(xs):
        qk = _q_k(q, xs[:k], x, scheme)
        a.append(min(1.0, p[x] / qk[x]) if qk[x] > 0 else float(p[x] > 0))
        res = np.maximum(p - qk, 0.0)
        p = res / res.sum() if res.sum() > 0 else p
    return a, p


def expected_accepted(parents, t, d, c0, scheme) -> float:
    """E[number of accepted nodes] for one round from context c0."""
    parents = np.asarray(parents)
    kids = [[] for _ in range(len(parents) + 1)]
    for j, p in enumerate(parents.tolist()):
        kids[p + 1].append(j)
    t = np.asarray(t, np.float64)
    d = np.asarray(d, np.float64)

    @functools.lru_cache(maxsize=None)
    def e_row(row, ctx):
        ch = kids[row]
        if not ch:
            return 0.0
        p, q = t[ctx], d[ctx]
        total = 0.0
        for xs, pr in _draws(q, len(ch), scheme):
            a, _ = _accept_probs(p, q, xs, scheme)
            reach = 1.0
            for k, node in enumerate(ch):
                total += pr * reach * a[k] * (1.0 + e_row(node + 1, xs[k]))
                reach *= 1.0 - a[k]
        return total

    return e_row(0, int(c0))
