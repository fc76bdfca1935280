"""What a user passes as ``draft``, turned into the protocol's ``(drafter, params)``
(:mod:`jaxspec.decode.drafter`): the one place that knows the library's model types."""

from __future__ import annotations

from typing import Any

from jaxspec.decode.draft import ModelDraft
from jaxspec.decode.drafter import DRAFTER_METHODS, Drafter, check_drafter
from jaxspec.decode.head_draft import HeadDraft
from jaxspec.nn.head import FeatureHead
from jaxspec.nn.model import Transformer

__all__ = ["as_drafter"]


def as_drafter(draft, definition=None) -> tuple[Drafter, Any]:
    """``(drafter, params)`` for ``draft``:

    * a :class:`~jaxspec.nn.model.Transformer`: :class:`~jaxspec.decode.draft.ModelDraft`,
      its ``nnx.state`` the params;
    * a :class:`~jaxspec.nn.head.FeatureHead`: :class:`~jaxspec.decode.head_draft.HeadDraft`;
    * a drafter (the protocol's methods): itself, params ``None``;
    * an object with a ``to_drafter()`` method returning ``(drafter, params)``: a drafter that
      holds its own arrays.

    ``definition``: the model's ``nnx.GraphDef`` when the caller has already split it (the
    params are then not computed: ``None``). Anything else: ``ValueError`` naming ``draft``."""
    for model_type, drafter_type in ((Transformer, ModelDraft), (FeatureHead, HeadDraft)):
        if isinstance(draft, model_type):
            return drafter_type.of(draft, definition)
    if all(callable(getattr(draft, m, None)) for m in DRAFTER_METHODS):
        return check_drafter("draft", draft), None
    to_drafter = getattr(draft, "to_drafter", None)
    if callable(to_drafter):
        out = to_drafter()
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError(f"draft.to_drafter() = {type(out).__name__}: expected a pair (drafter, params)")
        return check_drafter("draft.to_drafter()[0]", out[0]), out[1]
    return check_drafter("draft", draft), None
