"""A drafter written the way a user writes one: against the protocol of
:mod:`jaxspec.decode.drafter` alone, in one file, with no change to the library.

``Bigram`` drafts from a table of next-token logits, ``float32[V, V]`` (its params, passed
beside it as the pair ``(Bigram(V), table)``: :func:`bigram_from`): the children of a node
with token t are drawn from ``warp(table[t])`` under the round's sibling scheme. It keeps
no state between rounds (its proposal reads only the root and its own nodes), has no model
to forward, and serves static trees on one device or on a mesh.

``lying(pair)`` is the same drafter broken on purpose: it draws from one law and reports
another (the table at a higher temperature), which breaks the acceptance rule's division
by ``q``. The χ² law test must reject it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxspec.core.treespec import DynamicTree
from jaxspec.decode.draft import draw_children
from jaxspec.decode.drafter import Proposal
from jaxspec.nn.cache import init_cache
from jaxspec.nn.masks import causal_cache_mask


@dataclasses.dataclass(frozen=True)
class Bigram:
    """The static half (hashable: part of the compiled configuration)."""

    vocab_size: int
    lie: bool = False

    def check(self, target, request):
        if target.config.vocab_size != self.vocab_size:
            raise ValueError(f"draft: vocab_size = {self.vocab_size}; expected the target's "
                             f"{target.config.vocab_size}")
        if isinstance(request.tree, DynamicTree):
            raise ValueError(f"tree = {request.tree}: BigramDraft drafts static trees")
        return "without_replacement" if request.scheme is None else request.scheme

    def forwards(self, tree):
        return 0  # table lookups, no forward pass

    def init(self, params, target, prompt):
        return ()  # nothing to keep between rounds

    def propose(self, params, target, state, ctx, keys, law):
        tree = law.tree
        b, n = ctx.root.shape[0], tree.num_nodes
        tokens = jnp.zeros((b, n), jnp.int32)
        probs = jnp.zeros((b, n + 1, self.vocab_size), jnp.float32)
        bounds = [(0, 1)] + [(s + 1, e + 1) for s, e in tree.levels]  # rows of [root] + nodes per level
        for lvl, (a, z) in enumerate(bounds[:-1]):
            row_tokens = ctx.root[:, None] if lvl == 0 else tokens[:, a - 1:z - 1]  # [B, z - a]
            logits = params[row_tokens]  # [B, z - a, V]
            drawn = law.warp(logits, law.temperature)
            tokens = draw_children(tree, lvl, a, drawn, keys, law.scheme, tokens)
            told = law.warp(logits, law.temperature * 2.0 + 0.5) if self.lie else drawn
            probs = probs.at[:, a:z].set(told)
        return Proposal(tokens, state, probs=probs)

    def commit(self, params, state, outcome, commit_cache):
        return state


def bigram_from(target, seed: int = 0, noise: float = 1.0) -> tuple[Bigram, jnp.ndarray]:
    """``(drafter, params)``: a table near the target's own bigram law (its logits after
    each single token), blurred by Gaussian noise: a drafter that agrees with the target
    often but not always."""
    v = target.config.vocab_size
    tokens = jnp.arange(v, dtype=jnp.int32)[:, None]  # [V, 1]: every token as a one-token prompt
    cache = init_cache(target.config, v, 1)
    logits, _ = target(tokens, jnp.zeros((v, 1), jnp.int32), cache, causal_cache_mask(cache.lengths, 1, 1))
    table = np.asarray(logits[:, 0], np.float32)
    table = table + noise * np.random.default_rng(seed).standard_normal(table.shape).astype(np.float32)
    return Bigram(v), jnp.asarray(table)


def lying(pair: tuple[Bigram, jnp.ndarray]) -> tuple[Bigram, jnp.ndarray]:
    drafter, table = pair
    return dataclasses.replace(drafter, lie=True), table


__all__ = ["Bigram", "bigram_from", "lying"]
