"""Prompt lookup (n-gram) drafts: draft tokens copied from the row's own history, with no
draft model, inside the compiled loop.

The history of row b is its prompt followed by the tokens emitted so far (``T`` tokens,
the last one the round's root). The draft looks for earlier occurrences of the history's
suffix: a position ``j <= T - 2`` *matches* with length ``n`` when
``hist[j - n + 1 .. j] == hist[T - n .. T - 1]`` (the longest such ``n <= max_ngram``),
and matches with ``n >= min_ngram`` are ranked by length, then recency (larger ``j``).
A match proposes the tokens after it, ``hist[j + 1], hist[j + 2], ...``; where these run
into the suffix itself they continue periodically (``c_i = hist[j + 1 + (i mod p)]`` with
``p = T - 1 - j``), as a copy that overlaps its source does, so a run ``a a a`` proposes
more ``a``.

Trees: the root's children are the best matches with distinct next tokens, in rank order
(sibling 0 the best). A deeper node's children are, in rank order, the distinct next
tokens of the matches that agree with the node's whole path: a chain follows the best
match, and a branch point below the root offers the next-best continuation that shares
the path so far. A node with no such match gets token 0 (a fixed choice like any other;
it is only ever accepted with the target's own probability of token 0).

Exactness: the drafts are a fixed function of the history (no randomness, no draft law),
so the round uses the ``deterministic`` sibling scheme, whose rules never read ``q``: the
output law is the target's, and at ``temperature = 0`` the tokens are greedy target
decoding. When no row of the batch has a match, :func:`jaxspec.decode.round.speculative_round`
skips the tree and runs one target step instead (a round then costs a one-token target
forward, not a tree verification).

Static shapes: the history is ``int32[B, P + M]`` (padded prompt + output budget), every
position is scored in one vectorised pass, and only the ``candidates`` best-ranked
positions (default 64) enter the tree assignment, an ``[M, M]`` comparison per tree level.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxspec.checks import is_int
from jaxspec.core.treespec import DynamicTree, StaticTree
from jaxspec.decode.drafter import Context, DraftLaw, DraftRequest, Outcome, Prompt, Proposal, refuse_draft_sampling
from jaxspec.errors import SettingError

__all__ = ["NgramDraft", "NgramState", "history", "match_candidates", "propose_ngram", "sibling_ranks"]


@dataclasses.dataclass(frozen=True)
class NgramDraft:
    """A prompt lookup draft source: pass it where :func:`jaxspec.generate` takes a draft
    model (``jaxspec generate --draft ngram``). Hashable: part of the compiled
    configuration.

    Attributes:
      max_ngram:  the longest suffix matched (a longer match ranks first).
      min_ngram:  the shortest suffix that counts as a match (below it: no match).
      candidates: match positions considered per row and round (the best-ranked ones).
    """

    max_ngram: int = 3
    min_ngram: int = 1
    candidates: int = 64

    def __post_init__(self):
        for name in ("max_ngram", "min_ngram", "candidates"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"NgramDraft.{name} = {value!r}: expected an integer >= 1")
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                f"NgramDraft.min_ngram = {self.min_ngram}: expected at most max_ngram = {self.max_ngram}"
            )

    @property
    def spec(self) -> str:
        """The spec string :func:`jaxspec.parse_draft` reads back to this draft."""
        return f"ngram:max={self.max_ngram},min={self.min_ngram},candidates={self.candidates}"

    # the drafter protocol (jaxspec.decode.drafter): no model, no params, no cache

    def check(self, target, request: DraftRequest) -> str:
        if isinstance(request.tree, DynamicTree):
            raise SettingError({"tree": request.tree}, "a DynamicTree ranks a draft model's candidates; an n-gram "
                               "draft takes a static tree (a chain such as 'chain:4', or 'branch:3,1,1')")
        if request.scheme not in (None, "deterministic"):
            raise SettingError({"scheme": request.scheme}, "an n-gram draft proposes fixed tokens; expected "
                               "scheme 'deterministic' (its default)")
        refuse_draft_sampling(request, "an n-gram draft")
        return "deterministic"

    def forwards(self, tree) -> int:
        return 0

    def init(self, params, target, prompt: Prompt) -> NgramState:
        return NgramState(prompt.tokens, prompt.lengths)

    def propose(self, params, target, state: NgramState, ctx: Context, keys, law: DraftLaw) -> Proposal:
        tokens, has_match = propose_ngram(self, state, ctx.out, ctx.n_out, law.tree)
        return Proposal(tokens, state, has_draft=has_match)

    def commit(self, params, state: NgramState, outcome: Outcome, commit_cache) -> NgramState:
        return state  # the history is the emitted tokens: nothing to keep


class NgramState(NamedTuple):
    """What the n-gram draft reads besides the emitted tokens (its "cache"; a pytree)."""

    prompt: jax.Array  # int32[B, P] right-padded prompts
    lens: jax.Array  # int32[B] prompt lengths


def history(state: NgramState, out, n_out):
    """``(hist int32[B, P + M], length int32[B])``: prompt then emitted tokens
    (``out int32[B, M]``, ``n_out int32[B]``); entries at or past ``length`` are junk."""
    b, p = state.prompt.shape
    m = out.shape[1]
    t = jnp.arange(p + m, dtype=jnp.int32)[None, :]  # [1, H]
    prompt = jnp.pad(state.prompt, ((0, 0), (0, m)))
    emitted = jnp.take_along_axis(out, jnp.clip(t - state.lens[:, None], 0, m - 1), axis=1)
    hist = jnp.where(t < state.lens[:, None], prompt, emitted)
    return hist, state.lens + n_out


def match_candidates(draft: NgramDraft, hist, length, depth: int, num: int | None = None):
    """The ``M = min(num or candidates, H)`` best-ranked match positions of every row.

    Returns ``tokens int32[B, M, depth]`` (the continuation each proposes) and ``ok
    bool[B, M]`` (a real match; rank order along M)."""
    b, h = hist.shape
    j = jnp.arange(h, dtype=jnp.int32)[None, :]  # [1, H] candidate end positions
    run = jnp.ones((b, h), jnp.bool_)
    n_match = jnp.zeros((b, h), jnp.int32)
    for k in range(draft.max_ngram):  # extend the match one token further back
        s = length - 1 - k  # [B] suffix position compared at this step
        here = jnp.take_along_axis(hist, jnp.clip(j - k, 0, h - 1), axis=1)
        there = jnp.take_along_axis(hist, jnp.clip(s, 0, h - 1)[:, None], axis=1)
        run = run & (j - k >= 0) & (s[:, None] >= 0) & (here == there)
        n_match = n_match + run
    valid = (j <= length[:, None] - 2) & (n_match >= draft.min_ngram)
    score = jnp.where(valid, n_match * h + j, -1)  # length first, then recency
    m = min(num or draft.candidates, h)
    top, pos = lax.top_k(score, m)  # [B, M], best first
    ok = top >= 0
    period = jnp.maximum(length[:, None] - 1 - pos, 1)  # [B, M] >= 1 where ok
    e = jnp.arange(depth, dtype=jnp.int32)[None, None, :]
    idx = jnp.clip(pos[..., None] + 1 + e % period[..., None], 0, h - 1)  # [B, M, D]
    tokens = jnp.take_along_axis(hist, idx.reshape(b, m * depth), axis=1).reshape(b, m, depth)
    return tokens, ok


def sibling_ranks(tree: StaticTree) -> np.ndarray:
    """``int[N]``: each node's rank among its parent's children (0 = first)."""
    par = tree.parents_array
    ranks = np.zeros(par.shape[0], np.int64)
    seen: dict[int, int] = {}
    for i, p in enumerate(par.tolist()):
        ranks[i] = seen.get(p, 0)
        seen[p] = ranks[i] + 1
    return ranks


def propose_ngram(draft: NgramDraft, state: NgramState, out, n_out, tree: StaticTree):
    """Draft ``tree`` for every row from its history (module docstring).

    Returns ``node_tokens int32[B, N]`` and ``has_match bool[B]`` (the row has at least
    one match: its root's first child is a real continuation)."""
    hist, length = history(state, out, n_out)
    if tree.max_siblings == 1:  # a chain follows the best match alone: no tree assignment
        cand, ok = match_candidates(draft, hist, length, tree.depth, num=1)
        return jnp.where(ok, cand[:, 0, :], 0), ok[:, 0]
    cand, ok = match_candidates(draft, hist, length, tree.depth)  # [B, M, D], [B, M]
    b, m, _ = cand.shape
    n = tree.num_nodes
    par = tree.parents_array
    ranks = sibling_ranks(tree)
    earlier = jnp.asarray(np.tril(np.ones((m, m), bool), -1))  # [m, m']: m' ranks before m
    node_tokens = jnp.zeros((b, n), jnp.int32)
    agree = jnp.zeros((b, n, m), jnp.bool_)  # candidate m agrees with node i's path
    for d, (a, z) in enumerate(tree.levels):  # nodes a..z-1 at depth d + 1
        p = par[a:z]
        agree_par = jnp.where(jnp.asarray(p < 0)[None, :, None], ok[:, None, :], agree[:, np.maximum(p, 0)])
        tok = cand[:, :, d]  # [B, M] each candidate's token at this depth
        same = tok[:, :, None] == tok[:, None, :]  # [B, M, M']
        dup = jnp.any(agree_par[:, :, None, :] & (same & earlier)[:, None], axis=-1)  # [B, n_l, M]
        first = agree_par & ~dup  # first (best-ranked) agreeing candidate of its token
        pick = first & (jnp.cumsum(first, axis=-1) - 1 == jnp.asarray(ranks[a:z])[None, :, None])
        has = jnp.any(pick, axis=-1)  # [B, n_l]
        chosen = jnp.take_along_axis(tok, jnp.argmax(pick, axis=-1), axis=1)  # [B, n_l]
        chosen = jnp.where(has, chosen, 0)
        node_tokens = node_tokens.at[:, a:z].set(chosen)
        agree = agree.at[:, a:z].set(agree_par & (tok[:, None, :] == chosen[..., None]) & has[..., None])
    return node_tokens, jnp.any(ok, axis=1)
