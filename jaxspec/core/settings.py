"""What is sampled: :class:`Sampling`, one frozen value for a law's warps.

A law is the model's logits warped by temperature, then top-k, then top-p, then min-p
(:func:`jaxspec.core.sampling.warp_probs`). ``generate``, ``generate_autoregressive``,
``verify``, ``measure_acceptance`` and ``auto_tree`` take the target's law as ``sampling=``
and, optionally, the draft's proposal law as ``draft_sampling=``::

    jaxspec.generate(key, target, draft, prompts, max_new_tokens=64,
                     sampling=jaxspec.Sampling(temperature=0.7, top_p=0.9, min_p=0.05))

A ``Sampling`` is checked when it is made (a :class:`~jaxspec.checks.SettingError` naming
the field), is hashable, and compares equal by value. Inside a compiled program it is two
halves: the static :class:`~jaxspec.core.sampling.Warp` (top-k, top-p, min-p: part of the
program) and the temperature (a traced scalar, so that new temperatures do not recompile).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from jaxspec.errors import SettingError
from jaxspec.core.sampling import Warp, validate_warp_args

__all__ = ["Sampling", "check_sampling", "check_draft_sampling", "draft_law"]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The warps of one law (applied in this order; each ``None`` leaves the law alone).

    >>> Sampling(temperature=0.7, top_p=0.9) == Sampling(0.7, top_p=0.9)  # a value: hashable, equal by value
    True
    >>> print(Sampling(temperature=0.7, top_p=0.9))
    Sampling(temperature=0.7, top_p=0.9)
    >>> Sampling(top_p=1.5)
    Traceback (most recent call last):
    jaxspec.errors.SettingError: top_p = 1.5: expected a number in (0, 1] (or None: no top-p)

    Attributes:
      temperature: >= 0; 0 is greedy (the argmax, ties to the lowest token id).
      top_k: an integer >= 1: the ``top_k`` most likely tokens (ties to the lowest ids).
      top_p: in (0, 1]: the smallest set of most likely tokens holding this mass.
      min_p: in [0, 1]: the tokens at least ``min_p`` times as likely as the most likely one.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p"):
            if isinstance(getattr(self, name), jax.core.Tracer):
                raise SettingError({name: getattr(self, name)}, "expected a concrete Python number; a Sampling "
                                   "is static configuration, made outside jit")
        validate_warp_args(self.temperature, self.top_k, self.top_p, self.min_p)
        # plain Python numbers: equal settings are equal (and hash equal) whatever their type
        object.__setattr__(self, "temperature", float(self.temperature))
        for name, cast in (("top_k", int), ("top_p", float), ("min_p", float)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, cast(getattr(self, name)))

    @property
    def warp(self) -> Warp:
        """The static half, with the warps that change nothing dropped (``top_p = 1``,
        ``min_p = 0``), so that equal laws compile one program."""
        return Warp(self.top_k, None if self.top_p == 1.0 else self.top_p,
                    None if self.min_p is None or self.min_p == 0.0 else self.min_p)

    def to_dict(self) -> dict[str, Any]:
        """The four fields, for JSON reports."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        given = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) != f.default or f.name == "temperature"]
        return f"Sampling({', '.join(given)})"


def check_sampling(name: str, value, default: Sampling | None = None) -> Sampling | None:
    """``value`` if it is a :class:`Sampling`, ``default`` for ``None``; a
    :class:`~jaxspec.checks.SettingError` naming ``name`` otherwise (a bare number is the
    common slip: ``sampling=0.7`` for ``Sampling(temperature=0.7)``). A ``Sampling``'s values
    are checked again here, where they are read."""
    if value is None:
        return default
    if isinstance(value, Sampling):
        try:  # again where it is read: object.__setattr__ can put a NaN into a frozen value after its check
            validate_warp_args(value.temperature, value.top_k, value.top_p, value.min_p)
        except SettingError as e:
            raise SettingError({f"{name}.{k}": v for k, v in e.settings.items()},
                               f"{e.expected} (the Sampling was changed after it was made)") from None
        return value
    hint = (f"jaxspec.Sampling(temperature={value!r})" if isinstance(value, (int, float)) and
            not isinstance(value, bool) and math.isfinite(value) else "jaxspec.Sampling(temperature=..., top_p=...)")
    raise SettingError({name: value}, f"expected a jaxspec.Sampling, e.g. {hint}")


def check_draft_sampling(value) -> Sampling | dict | None:
    """``draft_sampling`` validated: ``None``, a :class:`Sampling`, or a dict of some of its
    fields (``{"temperature": 0.5}``: those fields over the default draft law, see
    :func:`draft_law`; ``jaxspec verify``'s ``--draft-*`` flags are such a dict). A
    :class:`~jaxspec.checks.SettingError` names ``draft_sampling`` or the field."""
    if not isinstance(value, dict):
        return check_sampling("draft_sampling", value)
    fields = [f.name for f in dataclasses.fields(Sampling)]
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise SettingError({"draft_sampling": value}, f"expected a jaxspec.Sampling, or a dict of some of its fields "
                           f"({', '.join(fields)}); {unknown[0]!r} is none of them")
    Sampling(**value)  # each value checked where it is given (the others are the defaults')
    return dict(value) or None  # {}: the default, as None


def draft_law(scheme: str, sampling: Sampling, draft_sampling: Sampling | dict | None) -> Sampling:
    """The draft's proposal law: ``draft_sampling`` when given; else the target's law under
    the sampling schemes (``iid``, ``without_replacement``: the draft drafts what the target
    will sample), and temperature 1 without warps under ``deterministic`` (the draft only
    ranks candidates); a dict of some fields (:func:`check_draft_sampling`) replaces those
    fields of that default. The one rule shared by generation, the exactness harness,
    acceptance measurement, tree tuning and the command line. Any choice is lossless: ``q``
    is the law the draft actually sampled."""
    if isinstance(draft_sampling, Sampling):
        return draft_sampling
    default = Sampling() if scheme == "deterministic" else sampling
    return default if not draft_sampling else dataclasses.replace(default, **draft_sampling)
