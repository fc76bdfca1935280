"""An independent, sequential reference walk of the acceptance rule, plus deliberately
broken variants ("mutants") that the exactness harness must reject.

The library computes the rule branch-free (residual tables, then mask reductions); this
file walks the tree one sibling at a time in a ``lax.while_loop``, exactly as docs/DESIGN.md §2
reads. Agreement of the two, and the mutants' rejection, is the evidence. The mutants live
here, never in the library.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core import numerics

class RefResult(NamedTuple):
    tokens: jax.Array  # int32[N + 1], -1 padded
    num_accepted: jax.Array
    num_tokens: jax.Array


#: broken variants of the walk itself (``reference_accept(..., bug=...)``)
WALK_MUTANTS = ("no-residual-update", "unrenormalized-q", "depth-row", "reused-uniform")
#: all mutants; "warp-mismatch" breaks what the walk is handed: q from another table than the
#: one the drafts were drawn from (``make_speculative_chain(..., q=...)`` in tests/_ngram.py)
MUTANTS = WALK_MUTANTS + ("warp-mismatch",)


def inverse_cdf(p, u):
    """Token from unnormalized p by inverse CDF with uniform u in [0, 1) (the library's
    primitive, so that reference and library agree token for token for the same key)."""
    return numerics.inverse_cdf(u, p)


def reference_accept(key, parents, tokens, target_probs, draft_probs, *, scheme, bug=None):
    """Sequential walk -> RefResult(tokens int32[N + 1] -1 padded, num_accepted, num_tokens)."""
    assert bug is None or bug in WALK_MUTANTS, bug
    parents = np.asarray(parents, np.int32)
    n = parents.shape[0]
    v = target_probs.shape[-1]
    children = np.full((n + 1, n + 1), -1, np.int32)
    fill = np.zeros(n + 1, np.int32)
    depth = np.zeros(n, np.int32)
    for j, p in enumerate(parents):
        children[p + 1, fill[p + 1]] = j
        fill[p + 1] += 1
        depth[j] = 1 if p < 0 else depth[p] + 1
    children = jnp.asarray(children)
    depth = jnp.asarray(depth)
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    tokens = jnp.asarray(tokens, jnp.int32)
    key_u, key_final = jax.random.split(key)
    uniforms = jax.random.uniform(key_u, (n,))  # one per node
    u_final = jax.random.uniform(key_final, ())

    def prob_row(node):  # the probability row that judges node's children
        if bug == "depth-row":
            return depth[node]  # "row d = law at depth d": right for chains only
        return node + 1

    # state: row, p, q_rem, k, n_acc, done, out, last_u
    def cond(s):
        return ~s[5]

    def body(s):
        row, p, q_rem, k, n_acc, done, out, last_u = s
        child = children[row, k]
        no_child = child < 0
        x = tokens[jnp.maximum(child, 0)]
        onehot = jax.nn.one_hot(x, v, dtype=jnp.float32)
        if scheme == "iid":
            qk = Q[row]
        elif scheme == "without_replacement":
            tot = q_rem.sum()
            qk = jnp.where(tot > 0, q_rem / jnp.where(tot > 0, tot, 1.0), onehot)
        else:
            qk = onehot
        px, qx = p[x], qk[x]
        a = jnp.where(qx > 0, jnp.minimum(1.0, px / jnp.where(qx > 0, qx, 1.0)), (px > 0) * 1.0)
        u = uniforms[jnp.maximum(child, 0)]
        accept = (~no_child) & (u < a)
        # emit when no child is left
        u_emit = last_u if bug == "reused-uniform" else u_final
        final_tok = inverse_cdf(p, u_emit)
        out_no_child = out.at[n_acc].set(final_tok)
        # accept: move into child
        nxt = jnp.maximum(child, 0) + 1  # the walk follows the tree structure ...
        nxt_prob = prob_row(jnp.maximum(child, 0))  # ... the mutant reads the wrong row
        out_acc = out.at[n_acc].set(x)
        # reject: residual update, next sibling
        # the "unrenormalized-q" mutant: the ratio above uses the renormalized q_k, the
        # residual the un-renormalized remainder of q (earlier siblings' tokens zeroed)
        q_res = q_rem if bug == "unrenormalized-q" else qk
        res = jnp.maximum(p - q_res, 0.0)
        s_res = res.sum()
        p_rej = jnp.where(s_res > 0, res / jnp.where(s_res > 0, s_res, 1.0), p)
        if bug == "no-residual-update":
            p_rej = p
        q_rej = q_rem * (1.0 - onehot)
        new_row = jnp.where(accept, nxt, row)
        new_p = jnp.where(no_child, p, jnp.where(accept, P[nxt_prob], p_rej))
        new_q = jnp.where(no_child, q_rem, jnp.where(accept, Q[nxt_prob], q_rej))
        new_k = jnp.where(accept, 0, k + 1)
        new_n = n_acc + accept.astype(jnp.int32)
        new_out = jnp.where(no_child, out_no_child, jnp.where(accept, out_acc, out))
        new_last_u = jnp.where(no_child, last_u, u)
        return (new_row, new_p, new_q, new_k, new_n, no_child, new_out, new_last_u)

    init = (
        jnp.int32(0),
        P[0],
        Q[0],
        jnp.int32(0),
        jnp.int32(0),
        jnp.bool_(False),
        jnp.full((n + 1,), -1, jnp.int32),
        u_final,  # with no test made, the reused-uniform mutant falls back to u_final
    )
    s = jax.lax.while_loop(cond, body, init)
    return RefResult(s[6], s[4], s[4] + 1)


def reference_probabilities(parents, tokens, target_probs, draft_probs, *, scheme):
    """The rule's per-node acceptance probabilities and per-row emitted laws, literally
    (float64 numpy, one sibling at a time, full residual vectors): -> (accept [N],
    residual [N + 1, V]). A rejection whose residual sums to 0 keeps the previous law;
    a row whose *final* residual sums to 0 emits from its target row (the library's
    convention for that probability-0 event)."""
    parents = np.asarray(parents)
    tokens = np.asarray(tokens)
    P = np.asarray(target_probs, np.float64)
    Q = np.asarray(draft_probs, np.float64)
    n, v = parents.shape[0], P.shape[1]
    accept = np.zeros(n)
    residual = P.copy()
    for r in range(n + 1):
        kids = [j for j in range(n) if parents[j] + 1 == r]
        p, q_rem = P[r].copy(), Q[r].copy()
        for k, j in enumerate(kids):
            x = tokens[j]
            onehot = np.zeros(v)  # not np.eye(v)[x]: V^2 floats a node at large V
            onehot[x] = 1.0
            if scheme == "iid":
                qk = Q[r]
            elif scheme == "without_replacement":
                tot = q_rem.sum()
                qk = (q_rem if k == 0 else q_rem / tot) if tot > 0 else onehot
            else:
                qk = onehot
            accept[j] = min(1.0, p[x] / qk[x]) if qk[x] > 0 else float(p[x] > 0)
            res = np.maximum(p - qk, 0.0)
            if res.sum() > 0:
                p = res / res.sum()
            elif k + 1 == len(kids):
                p = P[r] / P[r].sum()
            q_rem = q_rem * (1.0 - onehot)
        residual[r] = p / p.sum()
    return accept, residual
