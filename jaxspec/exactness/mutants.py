"""Deliberately broken speculative decoders, for ``jaxspec verify --mutant NAME``.

A harness that cannot fail proves nothing (docs/DESIGN.md §4). Each mutant is the real decoder
of :func:`jaxspec.generate` with exactly one piece replaced by a classic bug of §2, so a
user can watch :func:`jaxspec.exactness.verify` reject it. Nothing here is on the main
decode path: :func:`decoder` returns a rule and a *separate*
:class:`~jaxspec.decode.round.RoundParts`, leaving the library's own untouched.

=====================  ================================================= =================
name                   the bug                                           needs
=====================  ================================================= =================
no-residual-update     after a rejected sibling, ``p`` is not replaced   >= 2 siblings
                       by ``normalize(max(p - q_k, 0))``; the extra
                       token is drawn from the unmodified row
depth-row              node i is judged by the row of its *depth*, not   a non-chain tree
                       of its parent (``row d`` = "law at depth d")
causal-mask            target verification under a causal triangle over  >= 2 siblings
                       the flattened tree: siblings leak into each other
reused-uniform         the residual / bonus token reuses the uniform of  any tree
                       the last acceptance test instead of a fresh one
warp-mismatch          the rule is handed ``q`` under another warp than  scheme iid or
                       the one its tokens were drawn from: ``q``         without_replacement
                       squared and renormalized (temperature halved)     (deterministic
                                                                         ignores q)
bonus-kv-slot          the commit keeps one token fewer than the round   any tree
                       emitted, so the next round writes the emitted
                       token's K/V one cache slot early (over the last
                       accepted token's, or the old root's)
draft-noise-reuse      the residual is drawn with the randomness that    scheme iid or
                       drew the rejected siblings (vLLM #54282): the     without_replacement,
                       last rejected child's own uniform (iid, inverse   a drafter that
                       CDF) or the row's Gumbel noise (without           draws (a model,
                       replacement, Gumbel-max of log residual + g)      a head)
draft-precision        draft tokens drawn from the draft's log-probs     as draft-noise-reuse
                       rounded to bfloat16, q handed to the rule in
                       float32 (DeepSpec #31): q is off by ~1e-3 of
                       itself, so the law moves little (see the power
                       curve in docs/EVIDENCE.md)
row-leak               in a batch, each odd row's acceptance key is its  T > 0, a batch of
                       even neighbour's (1Cat-vLLM #656): every row's    >= 2 rows
                       own law is exact, rows 2j and 2j + 1 are not
                       independent (the harness's row-pair tests)
=====================  ================================================= =================

How they plug in: :func:`decoder` gives the arguments of :func:`jaxspec.generate` or
:func:`jaxspec.verify` that make a mutant, ``rule=`` and ``parts=``. Eight are acceptance
steps of their own, passed as ``rule=`` (:func:`mutant_rule`; ``depth-row`` and
``warp-mismatch`` hand the library's rule the wrong rows; ``no-residual-update``,
``reused-uniform`` and the block and traversal mutants are rules of their own); the others
replace one :class:`~jaxspec.decode.round.RoundParts` step (:func:`round_parts`):
``causal-mask`` replaces ``verify_mask``; ``bonus-kv-slot`` replaces ``commit``;
``draft-precision`` replaces ``draw`` (the drafter's draw of one row's children);
``row-leak`` replaces ``keys`` (the split of each row's round key); ``draft-noise-reuse``
replaces ``keys`` (the rule is handed the row's draft key beside its acceptance key) and is
a rule (which rebuilds the draft's noise from it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core import tree as treelib
from jaxspec.core.block import block_emit, block_stop_probabilities, block_weights
from jaxspec.core.numerics import accept_ratio, inverse_cdf
from jaxspec.core import sampling
from jaxspec.core.residual import node_accept_probs, row_law, row_residual, walk_all_rows
from jaxspec.core.rule_types import AcceptResult, accept_result, tree_structure
from jaxspec.core.token_rule import accept_core, choose_path
from jaxspec.core.traversal import traversal_with_update
from jaxspec.decode.round import RoundParts, commit_path, split_round_keys

__all__ = ["MUTANTS", "MUTANT_RULE", "DRAW_MUTANTS", "describe", "decoder", "round_parts", "mutant_rule",
           "check_mutant"]

MUTANTS = (
    "no-residual-update", "depth-row", "causal-mask", "reused-uniform", "warp-mismatch", "bonus-kv-slot",
    "block-unclipped", "block-first-failure", "block-token-residual", "traversal-parent-update",
    "draft-noise-reuse", "draft-precision", "row-leak",
)

#: the mutants that break the draft's random draws (nothing to break under ``deterministic``)
DRAW_MUTANTS = ("draft-noise-reuse", "draft-precision")

#: the rule each mutant breaks (a block mutant needs a chain; its acceptance is compared
#: with block verification's exact expectation)
MUTANT_RULE = {name: name.split("-")[0] if name.startswith(("block-", "traversal-")) else "token" for name in MUTANTS}

_DESCRIPTIONS = {
    "no-residual-update": "no residual update between siblings (p is never reduced by a rejected q_k)",
    "depth-row": "a node's probability row indexed by its depth instead of its parent",
    "causal-mask": "target verification under a causal mask over the flattened tree (sibling leakage)",
    "reused-uniform": "the residual/bonus draw reuses the last acceptance test's uniform",
    "warp-mismatch": "the rule is handed q at half the temperature its tokens were drawn at (q^2 renormalized)",
    "bonus-kv-slot": "the emitted token's K/V written one cache slot early (the commit keeps one token too few)",
    "block-unclipped": "block verification with the raw cumulative product of p/q as weights (no clip at each step)",
    "block-first-failure": "block verification stopping before the first failed test instead of at the last passing one",
    "block-token-residual": "block verification emitting the token-level residual [p - q]_+ instead of [w p - q]_+",
    "traversal-parent-update": "traversal verification with the parent update alpha <- min(r / (1 - Ms(x)), 1)",
    "draft-noise-reuse": "the residual drawn with the noise that drew the rejected siblings (their uniform or Gumbel "
                         "noise) instead of fresh randomness",
    "draft-precision": "draft tokens drawn from the draft's log-probabilities rounded to bfloat16, q handed to the rule "
                       "in float32",
    "row-leak": "in a batch, each odd row's acceptance key is its even neighbour's (rows not independent)",
}


def describe(name: str) -> str:
    """One line on what mutant ``name`` breaks."""
    return _DESCRIPTIONS[check_mutant(name)]


def check_mutant(name: str) -> str:
    if name not in MUTANTS:
        raise ValueError(f"mutant = {name!r}: expected one of {', '.join(MUTANTS)}")
    return name


def _accept_no_residual_update(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """Every sibling judged against the *unmodified* target row; the extra token drawn
    from that row too (the bug: ``p`` never becomes ``normalize(max(p - q_k, 0))``)."""
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    row = jnp.asarray(st.parent_row)  # [N]
    px = P[row, tokens]
    if scheme == "iid":
        qx = Q[row, tokens]
    elif scheme == "without_replacement":  # q_k(x) = q(x) / (1 - mass of earlier siblings)
        earlier = jnp.asarray(st.earlier_sibling)
        q_own = Q[row, tokens]
        removed = jnp.sum(jnp.where(earlier, q_own[None, :], 0.0), axis=1)
        left = 1.0 - removed
        qx = jnp.where(left > 0, q_own / jnp.where(left > 0, left, 1.0), 1.0)
    else:  # deterministic: point masses
        qx = jnp.ones((n,), jnp.float32)
    accept_prob = accept_ratio(px, qx)
    key_accept, key_emit = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)
    num_accepted, last, accepted_nodes = choose_path(st, accept_prob, u)
    extra = inverse_cdf(jax.random.uniform(key_emit, (), jnp.float32), P[last + 1])
    return accept_result(tokens, num_accepted, last, accepted_nodes, extra)


def _accept_reused_uniform(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """The library's rule, except that the extra token is drawn by inverse CDF with the
    uniform of the last acceptance test made (the last, rejected, child of the emitting
    row; or the accepted leaf's own test for a bonus token)."""
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    accept_prob = node_accept_probs(st, tokens, P, Q, scheme)
    key_accept, _ = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)
    num_accepted, last, accepted_nodes = choose_path(st, accept_prob, u)
    emit_row = last + 1
    kids = jnp.asarray(st.children)[emit_row]  # [K], -1 padded, sibling order
    last_kid = jnp.max(kids)  # the last child tried (all were rejected)
    u_last = jnp.where(last_kid >= 0, u[jnp.maximum(last_kid, 0)], u[jnp.maximum(last, 0)])
    law = row_residual(st, emit_row, tokens, P, Q, scheme)
    return accept_result(tokens, num_accepted, last, accepted_nodes, inverse_cdf(u_last, law))


# --------------------------------------------------------------------------- the parts


def _causal(mask):
    """``verify_mask``: a causal triangle of the same shape as the ``[root] + nodes`` tree
    mask (siblings see each other)."""
    m = jnp.asarray(mask)
    k = m.shape[-1]
    return jnp.broadcast_to(jnp.tril(jnp.ones((k, k), jnp.bool_)), m.shape)


def _accept_depth_rows(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: the library's rule with row ``i + 1`` (after node i) replaced by row
    ``depth[i]`` ("row d = the law at depth d": right for a chain only)."""
    src = jnp.concatenate([jnp.zeros((1,), jnp.int32), treelib.tree_depths(parents)])  # row r <- row src[r]
    return accept_core(key, parents, tokens, target_probs[src], draft_probs[src], scheme)


def _accept_sharpened_q(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: the library's rule handed the draft rows squared and renormalized --
    ``q`` at half the temperature the draft's tokens were drawn at (a warp applied twice,
    or on one side only)."""
    q2 = draft_probs * draft_probs
    return accept_core(key, parents, tokens, target_probs, q2 / jnp.sum(q2, axis=-1, keepdims=True), scheme)


def _commit_one_short(cache, accepted_nodes, num):
    """``commit``: keep one token fewer than the round emitted (never fewer than 0); the
    next round then writes its root, the emitted token, one slot early."""
    return commit_path(cache, accepted_nodes, jnp.maximum(num - 1, 0))


def _block_variant(key, tokens, target_probs, draft_probs, scheme, *, clip=True, last_pass=True, weighted=True):
    """Block verification with one of its three defining choices undone."""
    tokens = jnp.asarray(tokens, jnp.int32)
    g = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    key_accept, key_emit = jax.random.split(key)
    eta = jax.random.uniform(key_accept, (g,), jnp.float32)
    if clip:
        w = block_weights(tokens, P, Q, scheme)
    else:  # w_i = prod_{j <= i} p/q, never clipped (then clipped once, where used as a probability)
        px = P[jnp.arange(g), tokens]
        qx = jnp.ones((g,)) if scheme == "deterministic" else Q[jnp.arange(g), tokens]
        w = jnp.concatenate([jnp.ones((1,)), jnp.cumprod(px / jnp.where(qx > 0, qx, 1.0))])
    h = block_stop_probabilities(tokens, P, Q, scheme, jnp.minimum(w, 1.0))  # a probability: at most 1
    idx = jnp.arange(1, g + 1, dtype=jnp.int32)
    passed = eta < h
    if last_pass:
        tau = jnp.max(jnp.where(passed, idx, 0))
    else:  # the number of tests passed before the first failure
        tau = jnp.min(jnp.where(passed, g, idx - 1))
    tau = tau.astype(jnp.int32)
    weight = jnp.minimum(w[tau], 1.0) if weighted else jnp.ones(())
    return block_emit(key_emit, tokens, P, Q, scheme, tau, weight)


def _accept_block_unclipped(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: block verification with unclipped cumulative-product weights."""
    return _block_variant(key, tokens, target_probs, draft_probs, scheme, clip=False)


def _accept_block_first_failure(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: block verification that stops at the first failed test."""
    return _block_variant(key, tokens, target_probs, draft_probs, scheme, last_pass=False)


def _accept_block_token_residual(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: block verification that emits the token-level residual."""
    return _block_variant(key, tokens, target_probs, draft_probs, scheme, weighted=False)


def _mutant_parent_alpha(r, alpha_u, qx):
    """The parent update ``alpha_u <- min(r / (1 - Ms_u(x)), 1)`` (not lossless)."""
    den = 1.0 - qx
    return jnp.where(den > 0, jnp.minimum(r / jnp.where(den > 0, den, 1.0), 1.0), 1.0)


def _accept_traversal_parent_update(key, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: traversal verification with the wrong parent update."""
    return traversal_with_update(key, parents, tokens, target_probs, draft_probs, scheme, _mutant_parent_alpha)


def _keys_with_draft_key(keys):
    """``keys``: the library's split, except that the rule gets ``[acceptance key, draft
    key]`` per row (``[B, 2]``), so that it can rebuild the draft's noise."""
    k_draft, k_acc = split_round_keys(keys)
    return k_draft, jnp.stack([k_acc, k_draft], axis=1)


def _accept_draft_noise_reuse(keys, parents, tokens, target_probs, draft_probs, scheme) -> AcceptResult:
    """``accept``: the token rule with fresh acceptance uniforms, but the extra token of a
    row whose children were all rejected is drawn with the noise that drew those children
    (the drafter draws row r's children with ``fold_in(draft key, r)``:
    :func:`jaxspec.decode.draft.draw_children`): under ``iid`` the inverse CDF of the
    residual at the last rejected child's own uniform; under ``without_replacement``
    Gumbel-max of ``log residual + g`` with the row's Gumbel vector ``g``. A bonus token
    (an accepted leaf: no draft draw at its row) is drawn fresh. ``deterministic``
    drafts have no noise to reuse: there it is the library's rule."""
    key, k_draft = keys[0], keys[1]
    st = tree_structure(parents)
    tokens = jnp.asarray(tokens, jnp.int32)
    n = tokens.shape[0]
    P = jnp.asarray(target_probs, jnp.float32)
    Q = jnp.asarray(draft_probs, jnp.float32)
    v = P.shape[-1]
    key_accept, key_emit = jax.random.split(key)
    u = jax.random.uniform(key_accept, (n,), jnp.float32)
    accept_prob, law = walk_all_rows(st, tokens, P, Q, scheme)
    num_accepted, last, accepted_nodes = choose_path(st, accept_prob, u)
    emit_row = last + 1
    emit = row_law(law, emit_row, P, Q)  # [V] unnormalized
    fresh = sampling.sample_categorical(key_emit, emit).astype(jnp.int32)
    kids = np.asarray(st.children)
    counts = (kids >= 0).sum(axis=1)  # children per row (static)
    drawn = [r for r in range(kids.shape[0]) if counts[r] > 0]
    if scheme == "deterministic" or not drawn:
        return accept_result(tokens, num_accepted, last, accepted_nodes, fresh)
    reused = []
    for r in drawn:  # the draft's own noise at row r, rebuilt from its key
        kr = jax.random.fold_in(k_draft, r)
        if scheme == "iid":  # draw_iid: uniform(key, (c,)); the last child tried is the last one
            ur = jax.random.uniform(kr, (int(counts[r]),), jnp.float32)[-1]
            reused.append(inverse_cdf(ur, emit))
        else:  # draw_without_replacement: gumbel(key, (V,))
            g = jax.random.gumbel(kr, (v,), jnp.float32)
            pos = emit > 0
            score = jnp.where(pos, jnp.log(jnp.where(pos, emit, 1.0)) + g, -jnp.inf)
            reused.append(jnp.argmax(score).astype(jnp.int32))
    reused = jnp.stack(reused)  # [R]
    rows = jnp.asarray(drawn, jnp.int32)
    hit = rows == emit_row
    extra = jnp.where(jnp.any(hit), reused[jnp.argmax(hit)], fresh).astype(jnp.int32)
    return accept_result(tokens, num_accepted, last, accepted_nodes, extra)


def _draw_bfloat16(key, probs, n, scheme):
    """``draw``: the children drawn from the row's log-probabilities rounded to bfloat16
    (the draft's logits up to a constant, as a low-precision sampler holds them) and
    renormalized; the drafter still returns, and the rule still divides by, the float32
    row."""
    p = jnp.asarray(probs, jnp.float32)
    pos = p > 0
    logp = jnp.where(pos, jnp.log(jnp.where(pos, p, 1.0)), -jnp.inf)
    low = logp.astype(jnp.bfloat16).astype(jnp.float32)
    drawn = jnp.where(pos, jnp.exp(low - jnp.max(low)), 0.0)
    return sampling.draw(key, drawn / jnp.sum(drawn), n, scheme)


def _keys_leak(keys):
    """``keys``: the library's split, except that each odd row ``2j + 1`` gets its even
    neighbour ``2j``'s acceptance key (a batch index computed as ``b // 2 * 2``). Each row
    alone still uses independent keys for its draft and its acceptance."""
    k_draft, k_acc = split_round_keys(keys)
    b = k_acc.shape[0]
    return k_draft, k_acc[(jnp.arange(b) // 2) * 2]


#: the mutants that are acceptance steps of their own: passed as ``rule=`` (the one way to
#: set a round's acceptance step)
_RULES = {
    "no-residual-update": _accept_no_residual_update,
    "reused-uniform": _accept_reused_uniform,
    "depth-row": _accept_depth_rows,
    "warp-mismatch": _accept_sharpened_q,
    "block-unclipped": _accept_block_unclipped,
    "block-first-failure": _accept_block_first_failure,
    "block-token-residual": _accept_block_token_residual,
    "traversal-parent-update": _accept_traversal_parent_update,
    "draft-noise-reuse": _accept_draft_noise_reuse,
}

#: the mutants that replace another step of the round: its :class:`RoundParts`
_PARTS = {
    "causal-mask": RoundParts(verify_mask=_causal),
    "bonus-kv-slot": RoundParts(commit=_commit_one_short),
    "draft-noise-reuse": RoundParts(keys=_keys_with_draft_key),  # and its rule, which reads the draft key
    "draft-precision": RoundParts(draw=_draw_bfloat16),
    "row-leak": RoundParts(keys=_keys_leak),
}


def round_parts(name: str) -> RoundParts:
    """The :class:`~jaxspec.decode.round.RoundParts` of mutant ``name``: the library's parts,
    with the mutant's replaced where it replaces one (a mutant that only replaces the
    acceptance step has the library's parts: see :func:`mutant_rule`)."""
    return _PARTS.get(check_mutant(name), RoundParts())


def mutant_rule(name: str):
    """The acceptance step of mutant ``name``, a function to pass as ``rule=``; ``None``
    for a mutant that keeps the library's rules (it replaces a part)."""
    return _RULES.get(check_mutant(name))


def decoder(name: str) -> dict:
    """The arguments of :func:`jaxspec.generate` (and :func:`jaxspec.verify`) that make the
    decoder of mutant ``name``: ``rule`` (its acceptance step, or the built-in rule it
    breaks, :data:`MUTANT_RULE`) and ``parts`` (:func:`round_parts`)::

        jaxspec.generate(key, target, draft, prompts, max_new_tokens=8, tree="branch:2,2",
                         **mutants.decoder("depth-row"))
    """
    own = mutant_rule(name)
    return {"rule": MUTANT_RULE[name] if own is None else own, "parts": round_parts(name)}
