"""Self-speculation: the target's own first layers draft the tree (LayerSkip, arXiv
2404.16710; Draft & Verify, arXiv 2309.08168). No training and no second model, so it works
for any target, every imported checkpoint included.

The draft model is the target cut after ``layers`` decoder layers, followed by the target's
final norm and LM head::

    draft logits = lm_head(norm(layer_{K-1}( ... layer_0(embed(tokens)))))

Its K/V for the committed prefix are exactly the target's K/V of those layers (the same
layers on the same inputs), so it keeps no cache of its own: each round it drafts into a
copy of the first ``layers`` planes of the target's cache (slots ``< L`` final, the tree
written at ``L ..`` as a draft model writes it, :mod:`jaxspec.decode.draft`), and the copy
is dropped after the proposal. The target's verification then writes its own K/V for the
tree, and its commit keeps the accepted path for the next round.

Written against the drafter protocol alone (:mod:`jaxspec.decode.drafter`): lossless like
every drafter, since the tokens are drawn from the warped laws it returns.
"""

from __future__ import annotations

import dataclasses

from jaxspec.checks import is_int
from jaxspec.decode.draft import model_forwards, model_scheme, propose_with_model
from jaxspec.decode.drafter import Context, DraftLaw, DraftRequest, Outcome, Prompt, Proposal
from jaxspec.nn.cache import KVCache
from jaxspec.nn.model import write_and_attend

__all__ = ["LayerSkipDraft", "EarlyExit"]


class EarlyExit:
    """The target cut after its first ``layers`` layers, callable as a draft model is
    (``(tokens int32[B, T], positions, cache with `layers` planes, mask) -> (logits
    float32[B, T, V], cache)``). Built inside the compiled program from the target."""

    def __init__(self, target, layers: int):
        self.target = target
        self.layers = [target.layers[i] for i in range(layers)]
        self.config = target.config

    def __call__(self, tokens, positions, cache: KVCache, mask):
        x, cache = write_and_attend(self.layers, self.target.embed(tokens), positions, cache, mask)
        return self.target.logits(x), cache


@dataclasses.dataclass(frozen=True)
class LayerSkipDraft:
    """Draft with the target's first ``layers`` decoder layers, its final norm and its LM
    head (``jaxspec generate --draft layers:K``). Static and dynamic trees, any scheme, and
    meshes (it runs on the target's own, already placed, parameters)."""

    layers: int

    def __post_init__(self):
        if not is_int(self.layers) or self.layers < 1:
            raise ValueError(f"LayerSkipDraft.layers = {self.layers!r}: expected an integer >= 1")

    @property
    def spec(self) -> str:
        """The spec string :func:`jaxspec.parse_draft` reads back to this drafter."""
        return f"layers:{self.layers}"

    # the drafter protocol (jaxspec.decode.drafter)

    def check(self, target, request: DraftRequest) -> str:
        n = target.config.num_hidden_layers
        if self.layers > n:
            raise ValueError(f"draft: layers = {self.layers} (LayerSkipDraft): the target has {n} layers; "
                             f"expected 1 .. {n}")
        return model_scheme(request)

    def forwards(self, tree) -> int:
        """Draft forwards of ``layers`` layers each, as many as a draft model's."""
        return model_forwards(tree)

    def init(self, params, target, prompt: Prompt) -> tuple:
        return ()  # the target's cache is the draft's: nothing of its own to keep

    def propose(self, params, target, state, ctx: Context, keys, law: DraftLaw) -> Proposal:
        model = EarlyExit(target, self.layers)
        tc = ctx.target_cache
        cache = KVCache(k=tc.k[: self.layers], v=tc.v[: self.layers], lengths=tc.lengths)  # a copy, dropped below
        return propose_with_model(model, cache, ctx, keys, law)._replace(state=state)

    def commit(self, params, state, outcome: Outcome, commit_cache) -> tuple:
        return state
