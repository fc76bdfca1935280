"""Prompt lookup and a feature head in one tree (:class:`MixedDraft`, ``--draft lookup+HEAD``).

The tree is two chains from the root, ``branch:2`` followed by ``1``s (``branch:2,1,1`` at
depth 3). Breadth first, node ``i`` is on chain ``i % 2`` at depth ``i // 2 + 1``::

    root ─┬─ 0 ── 2 ── 4      lookup: the continuation of the best match (NgramDraft on chain:D)
          └─ 1 ── 3 ── 5      head: its greedy chain (HeadDraft on chain:D, argmax tokens)

Each round the target tries lookup's copy first and the head's guess second, so a prompt
whose answer copies it keeps lookup's long accepted runs, and a round with nothing to copy
still gets the head's draft (a row without a match has lookup's chain at token 0, a fixed
choice like any other).

Exactness: both chains are fixed choices, functions of the history alone (lookup copies it;
the head's argmax reads the target's features of it and draws nothing), so the proposal
has no law (``probs=None``) and the round verifies it under the ``deterministic`` sibling
scheme, whose rules never read ``q``: sibling ``x`` is accepted with the target's ``p(x)``,
the next one from ``p`` with ``x`` removed and renormalized. When both chains start with
the same token the second is a duplicate, which that rule accepts with probability 0 (its
token was already removed): the text keeps the target's law, and the head's chain is only
wasted for the round. At temperature 0 the output is greedy target decoding.

The state is both drafters' (:class:`MixedState`); ``init``, ``propose`` and ``commit``
delegate to :class:`~jaxspec.decode.ngram.NgramDraft` and
:class:`~jaxspec.decode.head_draft.HeadDraft`, each on ``chain:D``. The head's commit reads
the target's features of ``[root] + accepted path`` by the accepted node indices of the
two-chain tree (:class:`~jaxspec.decode.drafter.Outcome`), which are right whichever chain
was accepted; its pending width ``D + 1`` is the same on both trees.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxspec.core.treespec import StaticTree, resolve_tree
from jaxspec.decode.drafter import Context, DraftLaw, DraftRequest, Outcome, Prompt, Proposal, refuse_draft_sampling
from jaxspec.decode.head_draft import HeadDraft, HeadState
from jaxspec.decode.ngram import NgramDraft, NgramState
from jaxspec.errors import SettingError
from jaxspec.nn.head import FeatureHead

__all__ = ["MixedDraft", "MixedState", "two_chain_parents", "is_two_chains", "interleave", "PREFERRED_TREE"]

#: the tree a :class:`MixedDraft` drafts by default (``generate(tree=None)``)
PREFERRED_TREE = "branch:2,1,1"


def two_chain_parents(depth: int) -> tuple[int, ...]:
    """The breadth-first parents of two chains of ``depth`` nodes from the root
    (``branch:2`` then ``1``s): ``(-1, -1, 0, 1, ..., 2 depth - 3)``, node ``i``'s parent
    ``i - 2``."""
    return (-1, -1) + tuple(range(2 * depth - 2))


def is_two_chains(tree) -> bool:
    """``tree`` is a :class:`~jaxspec.core.treespec.StaticTree` of two chains from the root."""
    return isinstance(tree, StaticTree) and tree.parents == two_chain_parents(tree.depth)


def interleave(lookup_tokens, head_tokens):
    """``int32[B, 2 D]``: the two chains' tokens (``int32[B, D]`` each, root's child first)
    at their breadth-first nodes, lookup's at even indices, the head's at odd ones."""
    b, d = lookup_tokens.shape
    return jnp.stack([lookup_tokens, head_tokens], axis=-1).reshape(b, 2 * d)


class MixedState(NamedTuple):
    """A :class:`MixedDraft`'s loop state (a pytree): each drafter's own."""

    lookup: NgramState
    head: HeadState


@dataclasses.dataclass(frozen=True)
class MixedDraft:
    """Prompt lookup and a feature head on one tree of two chains (module docstring):
    node 0's chain is lookup's best-match copy, node 1's the head's greedy chain. Serves the
    ``deterministic`` scheme only (both chains are fixed choices), on ``branch:2`` followed
    by ``1``s. Hashable: part of the compiled configuration; the head's arrays are the
    params, so it is passed as the pair ``(MixedDraft(...), head_params)``, which
    :meth:`of` makes from a :class:`~jaxspec.FeatureHead` (``jaxspec.parse_draft("lookup+HEAD")``
    from a head's name or folder).

    Attributes:
      head:      the head's static half (:class:`~jaxspec.decode.head_draft.HeadDraft`).
      lookup:    the prompt lookup draft (default ``NgramDraft()``).
      head_name: the head's name or folder, for :attr:`spec` (not part of the configuration).
    """

    head: HeadDraft
    lookup: NgramDraft = NgramDraft()
    head_name: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not isinstance(self.lookup, NgramDraft):
            raise SettingError({"lookup": type(self.lookup).__name__}, "expected a jaxspec.NgramDraft (prompt lookup)")
        if not isinstance(self.head, HeadDraft):
            raise SettingError({"head": type(self.head).__name__}, "expected a HeadDraft, the static half of a "
                               "jaxspec.FeatureHead (MixedDraft.of(head) splits one)")

    @classmethod
    def of(cls, head: FeatureHead, lookup: NgramDraft = NgramDraft(),
           name: str | None = None) -> tuple[MixedDraft, Any]:
        """``(MixedDraft, params)`` for a :class:`~jaxspec.FeatureHead` (its ``nnx.state`` the
        params): what :func:`jaxspec.generate` takes as ``draft``."""
        if not isinstance(head, FeatureHead):
            raise SettingError({"head": type(head).__name__}, "expected a jaxspec.FeatureHead (a head trained on the "
                               "target, jaxspec.load_draft('default-head') for instance)")
        drafter, params = HeadDraft.of(head)
        return cls(drafter, lookup, name), params

    @property
    def spec(self) -> str:
        """The spec string :func:`jaxspec.parse_draft` reads back to this drafter (and its
        head): ``"lookup+HEAD"``, or ``"ngram:...+HEAD"`` for another lookup."""
        if self.head_name is None:
            raise ValueError("MixedDraft.spec: head_name = None; expected the head's name or folder (MixedDraft.of("
                             "head, name=...), or jaxspec.parse_draft('lookup+HEAD'))")
        lookup = "lookup" if self.lookup == NgramDraft() else self.lookup.spec
        return f"{lookup}+{self.head_name}"

    # optional attributes of the protocol: the head's

    @property
    def tree(self) -> str:
        return PREFERRED_TREE

    @property
    def config(self):
        return self.head.config

    @property
    def feature_layers(self):
        return self.head.feature_layers

    def forwards(self, tree) -> int:
        return self.head.forwards(tree)  # the head's D forwards on its chain; lookup runs none

    # the drafter protocol (jaxspec.decode.drafter)

    def check(self, target, request: DraftRequest) -> str:
        if not is_two_chains(request.tree):
            raise SettingError({"tree": request.tree}, "a MixedDraft drafts two chains from the root (lookup's, then "
                               "the head's); expected 'branch:2' followed by 1s, such as 'branch:2,1,1'")
        if request.scheme not in (None, "deterministic"):
            raise SettingError({"scheme": request.scheme}, "a MixedDraft proposes fixed tokens (lookup's copy, the "
                               "head's argmax); expected scheme 'deterministic' (its default)")
        refuse_draft_sampling(request, "a MixedDraft")
        chains = request._replace(tree=resolve_tree(request.tree.depth), scheme="deterministic")
        self.lookup.check(target, chains)
        self.head.check(target, chains)  # the head's width, vocabulary and taps; one device
        return "deterministic"

    def init(self, params, target, prompt: Prompt) -> MixedState:
        chain = prompt._replace(tree=resolve_tree(prompt.tree.depth))
        return MixedState(self.lookup.init(None, target, chain), self.head.init(params, target, chain))

    def propose(self, params, target, state: MixedState, ctx: Context, keys, law: DraftLaw) -> Proposal:
        # both drafters draft chain:D under the deterministic scheme: lookup copies, the head
        # takes its top-1 token, and neither draws with keys (sharing them costs nothing)
        chain = law._replace(tree=resolve_tree(law.tree.depth), scheme="deterministic")
        look = self.lookup.propose(None, target, state.lookup, ctx, keys, chain)  # tokens [B, D]
        head = self.head.propose(params, target, state.head, ctx, keys, chain)  # tokens [B, D]; probs dropped
        # has_draft None: the head drafts every row, even where lookup finds nothing to copy
        return Proposal(interleave(look.tokens, head.tokens), MixedState(look.state, head.state))

    def commit(self, params, state: MixedState, outcome: Outcome, commit_cache) -> MixedState:
        return MixedState(self.lookup.commit(None, state.lookup, outcome, commit_cache),
                          self.head.commit(params, state.head, outcome, commit_cache))
