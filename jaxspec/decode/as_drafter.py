"""What a user passes as ``draft``, turned into the protocol's ``(drafter, params)``
(:mod:`jaxspec.decode.drafter`): the one place that knows the library's model types. The
public entry points (:func:`jaxspec.generate`, :func:`jaxspec.verify`) call it once, and
hand the drafter on."""

from __future__ import annotations

from typing import Any

from jaxspec.decode.draft import ModelDraft
from jaxspec.decode.drafter import Drafter, check_drafter
from jaxspec.decode.head_draft import HeadDraft
from jaxspec.nn.head import FeatureHead
from jaxspec.nn.model import Transformer

__all__ = ["as_drafter"]


def as_drafter(draft) -> tuple[Drafter, Any]:
    """``(drafter, params)`` for ``draft``:

    * a :class:`~jaxspec.nn.model.Transformer`: :class:`~jaxspec.decode.draft.ModelDraft`,
      its ``nnx.state`` the params;
    * a :class:`~jaxspec.nn.head.FeatureHead`: :class:`~jaxspec.decode.head_draft.HeadDraft`;
    * a drafter (the protocol's methods): itself, params ``None``;
    * a pair ``(drafter, params)``: a drafter with arrays of its own, and those arrays (new
      params of the same shapes reuse the compilation).

    Anything else: ``ValueError`` naming ``draft`` and what it lacks."""
    for model_type, drafter_type in ((Transformer, ModelDraft), (FeatureHead, HeadDraft)):
        if isinstance(draft, model_type):
            return drafter_type.of(draft)
    if type(draft) is tuple and len(draft) == 2:
        return check_drafter("draft[0]", draft[0]), draft[1]
    return check_drafter("draft", draft), None
