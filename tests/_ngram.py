"""Multi-round speculative sampling on synthetic bigram tables (no model needed).

A bigram target ``T[c] = law of the next token after token c`` and a draft ``D`` of the
same shape. One chain = repeated rounds of: draft a static tree from ``D`` under a sibling
scheme, score it with ``T``, run an acceptance rule, append the emitted tokens. The joint
law of the first ``L`` emitted tokens must equal ``prod_i T[y_{i-1}, y_i]`` exactly.

Counts are streamed: each chunk of chains is reduced to a histogram over the ``V**L``
cells on device, so memory stays flat in the number of samples.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core import sampling
def bigram_tables(seed: int, v: int, *, alpha_target=0.7, mix=0.35):
    """Random bigram target and a draft that differs from it (acceptance well below 1)."""
    rng = np.random.default_rng(seed)
    t = rng.dirichlet(np.full(v, alpha_target), size=v)
    noise = rng.dirichlet(np.full(v, 1.0), size=v)
    d = (1 - mix) * t + mix * noise
    # sharpen the draft a little too: it must not be a mere mixture of the target
    d = d**1.3
    d /= d.sum(axis=1, keepdims=True)
    return t.astype(np.float32), d.astype(np.float32)


def exact_joint(t: np.ndarray, c0: int, length: int) -> np.ndarray:
    """Exact law of the first ``length`` tokens after context ``c0``: float64[V**L]."""
    t = np.asarray(t, np.float64)
    t = t / t.sum(axis=1, keepdims=True)
    probs = t[c0]
    v = t.shape[0]
    for _ in range(length - 1):
        last = np.arange(probs.shape[0]) % v  # cell index -> its last token
        probs = (probs[:, None] * t[last]).reshape(-1)
    return probs


def _children_lists(parents):
    parents = np.asarray(parents, np.int32)
    kids = [[] for _ in range(parents.shape[0] + 1)]
    for j, p in enumerate(parents.tolist()):
        kids[p + 1].append(j)
    return kids


def make_speculative_chain(parents, t, d, *, scheme, length, c0, accept_fn, q=None):
    """Returns ``chain(key) -> int32[length]``: one speculative chain of several rounds.

    ``accept_fn(key, parents, tokens, target_probs, draft_probs, scheme=...)`` returns an
    object with ``.tokens`` (int32[N+1], -1 padded) and ``.num_tokens``. The drafts are
    drawn from the rows of ``d``; ``q`` (default ``d``) is the table whose rows the rule is
    handed as ``draft_probs`` -- another table only to break exactness on purpose.
    """
    parents = np.asarray(parents, np.int32)
    n = parents.shape[0]
    kids = _children_lists(parents)
    T = jnp.asarray(t, jnp.float32)
    D = jnp.asarray(d, jnp.float32)
    Q = D if q is None else jnp.asarray(q, jnp.float32)
    buf_len = length * (n + 1) + n + 1

    def one_round(carry, r):
        key, buf, pos, last = carry
        kr = jax.random.fold_in(key, r)
        k_draft, k_acc = jax.random.split(kr)
        node_tok = jnp.zeros((n,), jnp.int32)
        for row, ch in enumerate(kids):
            if not ch:
                continue
            ctx = last if row == 0 else node_tok[row - 1]
            tok, _ = sampling.draw(jax.random.fold_in(k_draft, row), D[ctx], len(ch), scheme)
            node_tok = node_tok.at[np.asarray(ch)].set(tok)
        ctxs = jnp.concatenate([last[None], node_tok])  # [N + 1]
        res = accept_fn(k_acc, parents, node_tok, T[ctxs], Q[ctxs], scheme=scheme)
        buf = jax.lax.dynamic_update_slice(buf, res.tokens, (pos,))
        new_last = res.tokens[res.num_tokens - 1]
        return (key, buf, pos + res.num_tokens, new_last), None

    def chain(key):
        buf = jnp.full((buf_len,), -1, jnp.int32)
        carry = (key, buf, jnp.int32(0), jnp.int32(c0))
        (_, buf, _, _), _ = jax.lax.scan(one_round, carry, jnp.arange(length))
        return buf[:length]

    return chain


def make_target_only_chain(t, *, length, c0):
    """Plain ancestral sampling from the bigram target (the baseline)."""
    logt = jnp.log(jnp.asarray(t, jnp.float32))

    def chain(key):
        def step(last, k):
            y = jax.random.categorical(k, logt[last]).astype(jnp.int32)
            return y, y

        _, ys = jax.lax.scan(step, jnp.int32(c0), jax.random.split(key, length))
        return ys

    return chain


def count_joint(chain_fn, key, *, num_samples: int, v: int, length: int, chunk: int = 1 << 16):
    """Histogram over ``v**length`` cells of ``num_samples`` independent chains."""
    cells = v**length
    weights = jnp.asarray(v ** np.arange(length - 1, -1, -1), jnp.int32)

    @jax.jit
    def chunk_counts(k):
        ys = jax.vmap(chain_fn)(jax.random.split(k, chunk))  # [chunk, L]
        bad = jnp.sum(jnp.any((ys < 0) | (ys >= v), axis=1))  # bincount would clip these
        return jnp.bincount(ys @ weights, length=cells), bad

    counts = np.zeros(cells, np.int64)
    num_chunks = -(-num_samples // chunk)
    for i in range(num_chunks):
        c, bad = chunk_counts(jax.random.fold_in(key, i))
        if int(bad):
            raise AssertionError(f"chunk {i}: {int(bad)} chains emitted a token outside [0, {v})")
        counts += np.asarray(c)
    return counts, int(counts.sum())


def marginals(counts: np.ndarray, v: int, length: int) -> list[np.ndarray]:
    c = counts.reshape((v,) * length)
    return [c.sum(axis=tuple(a for a in range(length) if a != i)) for i in range(length)]
