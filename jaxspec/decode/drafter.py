"""The drafter protocol: what proposes the tree that the target verifies.

A *drafter* is a hashable object (it is part of the compiled configuration) with four
methods (the :class:`Drafter` protocol, the one definition that :func:`check_drafter` checks), and its arrays (weights; ``None`` for a drafter without any) travel beside it as
``params``, a pytree passed to each method, as optax passes ``params`` to a
``GradientTransformation``::

    check(target, request: DraftRequest) -> str
        Outside jit, once per configuration. Raise ``ValueError`` for what the drafter
        cannot serve (a tree kind, a scheme, a mesh, draft sampling settings, a target
        whose vocabulary it does not share), naming the argument; return the sibling
        scheme it serves (``request.scheme``, or its default when that is None). Fixed
        choices (proposals without laws) serve only ``"deterministic"``.
    init(params, target, prompt: Prompt) -> state
        The drafter's loop state after the prompt (a pytree: per-row arrays with rows on
        axis 0; a :class:`~jaxspec.nn.cache.KVCache`'s rows on axis 1).
    propose(params, target, state, ctx: Context, keys, law: DraftLaw) -> Proposal
        The round's tree for every row: ``tokens int32[B, N]``, optionally ``parents
        int32[B, N]`` (a dynamic tree; breadth first, -1 = the root; None: the static
        ``law.tree``), the laws the tokens were drawn from (``probs float32[B, N + 1, V]``:
        row 0 the law of the root's children, row ``i + 1`` that of node i's; None: fixed
        choices), and which rows have a draft worth verifying (``has_draft bool[B]``; None:
        all of them; when no active row has one, the round runs one target step instead).
        Draws must use ``keys`` (``[B]``, one per row) and the sibling scheme
        ``law.scheme`` from the warped laws ``law.warp(logits, law.temperature)``; those
        warped rows are what ``probs`` returns, since the acceptance rule divides by them.
    commit(params, state, outcome: Outcome, commit_cache) -> state
        The state of the next round, once the target has accepted ``outcome.num`` tokens
        (``[root] + accepted path``; 0 for a row that had already ended, which must keep its
        state). ``commit_cache(cache, outcome.accepted_nodes, outcome.num)`` is the round's
        own cache commit (:class:`~jaxspec.decode.round.RoundParts`): a drafter whose
        cache follows the target's slot layout applies it to keep the same slots.

Optional attributes: ``forwards(tree) -> int`` (draft forward passes per round, for
statistics and cost models; absent: 0, as for a drafter without a model), ``config`` (a
:class:`~jaxspec.nn.config.ModelConfig`: its ``max_position_embeddings`` bounds the cache
capacity, and ``params`` are split over a mesh's model axis as a model's are; otherwise no
position limit, and params replicated) and ``tree`` (a
:func:`~jaxspec.core.treespec.parse_tree` spec: the tree the drafter drafts best, which
:func:`jaxspec.generate` uses when its ``tree`` is None; absent or None: the library's
default, ``"chain:4"``) and ``feature_layers`` (target layer indices: the drafter reads the
target's taps at those layers beside its features, :func:`feature_taps`; a multi-layer
feature head's).

A drafter with arrays of its own is passed as the pair ``(drafter, params)``; one without
is passed alone (its params are ``None``).

Exactness needs nothing else from a drafter: any proposal, drawn from the laws it returns
(or fixed), is verified by a lossless rule, so the output law is the target's. A drafter
that draws from a law other than the one it returns, or reads the round's acceptance key,
is what breaks it (``docs/DESIGN.md``).

The library's drafters are :class:`~jaxspec.decode.draft.ModelDraft` (a draft model),
:class:`~jaxspec.decode.head_draft.HeadDraft` (a feature head),
:class:`~jaxspec.decode.ngram.NgramDraft` (prompt lookup) and
:class:`~jaxspec.decode.layer_skip.LayerSkipDraft` (the target's first layers).
:func:`jaxspec.decode.as_drafter.as_drafter` turns what a user passes as ``draft`` into
``(drafter, params)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax

from jaxspec.errors import SettingError
from jaxspec.core import sampling
from jaxspec.core.sampling import Warp

__all__ = ["Drafter", "DraftRequest", "Prompt", "Context", "DraftLaw", "Proposal", "Outcome", "check_drafter",
           "refuse_draft_sampling", "DRAFTER_METHODS", "feature_taps"]



def feature_taps(drafter) -> tuple[int, ...]:
    """The target layers whose taps ``drafter`` reads beside the features (its optional
    ``feature_layers``; ``()`` for none): the round asks the target's forwards for them."""
    layers = getattr(drafter, "feature_layers", None)
    return () if layers is None else tuple(layers)


class DraftRequest(NamedTuple):
    """What a generation asks of a drafter, as :meth:`Drafter.check` reads it."""

    tree: Any  # StaticTree | DynamicTree
    scheme: str | None  # None: the drafter's default
    mesh: Any  # jax.sharding.Mesh | None
    draft_sampling: Any  # jaxspec.Sampling | None: the draft law the caller asked for (None: the default)


class Prompt(NamedTuple):
    """What :meth:`Drafter.init` reads: the prompts and the target's prefill."""

    tokens: jax.Array  # int32[B, P] right-padded prompts; the last real token is the first root
    lengths: jax.Array  # int32[B] prompt lengths (the target cache holds lengths - 1 tokens)
    features: jax.Array  # float32[B, P, D] the target's final features of the prompts ([B, P, (k + 1) D]
    # for a drafter with k feature_layers: the taps first, the features last, Transformer.features)
    capacity: int  # cache slots of the generation (static)
    tree: Any  # the generation's StaticTree | DynamicTree (static)


class Context(NamedTuple):
    """What :meth:`Drafter.propose` reads besides its own state (row b has ``L =
    lengths[b]`` committed tokens; the root, the last emitted token, is not yet cached)."""

    prev: jax.Array  # int32[B] the last committed token (slot L - 1)
    root: jax.Array  # int32[B] the last emitted token
    lengths: jax.Array  # int32[B] L
    out: jax.Array  # int32[B, M] the tokens emitted so far, -1 after n_out
    n_out: jax.Array  # int32[B]
    active: jax.Array  # bool[B] rows still generating
    target_cache: Any  # the target's KVCache (lengths L), read only: its K/V of slots < L are final


class DraftLaw(NamedTuple):
    """How to draw: the tree, the sibling scheme, the draft's warp (static), its
    temperature (traced float32 scalar) and the draw of one row's children
    (:class:`~jaxspec.decode.round.RoundParts`' ``draw``, :func:`jaxspec.core.sampling.draw`
    by default)."""

    tree: Any  # StaticTree | DynamicTree
    scheme: str
    warp: Warp
    temperature: jax.Array
    draw: Callable = sampling.draw  # (key, probs float32[V], n, scheme) -> (tokens int32[n], laws)


class Proposal(NamedTuple):
    """A round's proposal (see the module docstring)."""

    tokens: jax.Array  # int32[B, N]
    state: Any
    probs: jax.Array | None = None  # float32[B, N + 1, V]; None: fixed choices
    parents: jax.Array | None = None  # int32[B, N]; None: the static tree's
    has_draft: jax.Array | None = None  # bool[B]; None: every row


class Outcome(NamedTuple):
    """What the target accepted in a round, as :meth:`Drafter.commit` reads it."""

    tokens: jax.Array  # int32[B, N + 1] accepted tokens then the extra one, -1 padded
    num: jax.Array  # int32[B] tokens kept: accepted + 1 (0 for a row that had ended)
    accepted_nodes: jax.Array  # int32[B, N] node indices along the accepted path, -1 padded
    active: jax.Array  # bool[B] rows active at the round's start
    features: jax.Array  # float32[B, N + 1, D] the target's features of [root] + nodes (row 0 only
    #                      when the round ran one target step instead of a verification);
    #                      [B, N + 1, (k + 1) D] for a drafter with feature_layers, as in Prompt


@runtime_checkable
class Drafter(Protocol):
    """The drafter protocol (module docstring: :mod:`jaxspec.decode.drafter`)."""

    def check(self, target, request: DraftRequest) -> str: ...

    def init(self, params, target, prompt: Prompt) -> Any: ...

    def propose(self, params, target, state, ctx: Context, keys, law: DraftLaw) -> Proposal: ...

    def commit(self, params, state, outcome: Outcome, commit_cache: Callable) -> Any: ...


#: the protocol's methods, read from :class:`Drafter` itself (what :func:`check_drafter` checks)
DRAFTER_METHODS = tuple(n for n, v in vars(Drafter).items() if callable(v) and not n.startswith("_"))


def check_drafter(name: str, drafter) -> Drafter:
    """``drafter`` if it has the protocol's methods and hashes, else ``ValueError`` naming
    ``name`` and what is missing."""
    missing = [m for m in DRAFTER_METHODS if not callable(getattr(drafter, m, None))]
    if missing:
        raise ValueError(
            f"{name}: expected a jaxspec.Transformer, a jaxspec.FeatureHead, a drafter (methods "
            f"{', '.join(DRAFTER_METHODS)}; see jaxspec.Drafter) or a pair (drafter, params), got "
            f"{type(drafter).__name__} without "
            f"{', '.join(missing)}"
        )
    try:
        hash(drafter)
    except TypeError:
        raise ValueError(
            f"{name}: {type(drafter).__name__} is not hashable; a drafter is part of the compiled "
            "configuration (a frozen dataclass, say), its arrays go in params (see jaxspec.Drafter)"
        ) from None
    return drafter


def refuse_draft_sampling(request: DraftRequest, why: str) -> None:
    """A :class:`~jaxspec.checks.SettingError` naming ``draft_sampling`` when the caller
    gave one, for a drafter whose proposals have no law to warp (``why`` says which
    drafter)."""
    if request.draft_sampling is not None:
        raise SettingError({"draft_sampling": request.draft_sampling}, f"{why} has no proposal law; expected None")
