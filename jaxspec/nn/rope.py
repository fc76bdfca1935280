"""Rotary embedding variants: the inverse frequencies of plain RoPE and of its scaled forms, as
Hugging Face ``transformers`` computes them (``modeling_rope_utils``)::

    s = RopeScaling.from_hf({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    inv_freq(128, 500000.0, s)        # float32 [64]: the llama3-smoothed frequencies
    s.attention_factor()              # 1.0; YaRN's multiplies cos and sin (0.1 ln(factor) + 1)

Supported ``rope_type`` values (:data:`ROPE_TYPES`):

* ``linear``: every frequency divided by ``factor``;
* ``llama3``: Llama 3.1's three-band smoothing (``factor``, ``low_freq_factor``,
  ``high_freq_factor``, ``original_max_position_embeddings``);
* ``yarn``: YaRN's ramp between interpolated and extrapolated frequencies (``factor``,
  ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``truncate``) and its
  attention factor (given, or from ``mscale`` / ``mscale_all_dim``, else ``0.1 ln(factor) + 1``);
* ``dynamic`` (NTK): transformers rescales the base only once a sequence runs past
  ``max_position_embeddings``; jaxspec never runs a model past that length (generation refuses
  longer sequences), so there it is plain RoPE, exactly;
* ``freq_factors``: per-frequency divisors (llama.cpp's ``rope_freqs.weight`` tensor, which its
  converter writes for Llama 3.1's scaling).

Every other type (``longrope``, ``su``, ``proportional``, ...) is refused by name. A
:class:`RopeScaling` is frozen and hashable, so a :class:`~jaxspec.nn.config.ModelConfig` holding
one stays a static, comparable value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ROPE_TYPES", "RopeScaling", "inv_freq", "default_inv_freq"]

ROPE_TYPES = ("linear", "llama3", "yarn", "dynamic", "freq_factors")

# HF key -> RopeScaling field, per type (the keys each type reads; others are ignored)
_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
             "mscale", "mscale_all_dim", "truncate"),
    "freq_factors": ("factors",),
}
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": (), "freq_factors": ("factors",)}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A scaled rotary embedding (``rope_type`` one of :data:`ROPE_TYPES`); fields a type does
    not read stay None. Built from an HF ``rope_scaling`` / ``rope_parameters`` dict with
    :meth:`from_hf`, written back with :meth:`to_hf`."""

    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    factors: tuple[float, ...] | None = None  # freq_factors only: one divisor per frequency

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"RopeScaling.rope_type = {self.rope_type!r}: expected one of {ROPE_TYPES}")
        for name in _REQUIRED[self.rope_type]:
            if getattr(self, name) is None:
                raise ValueError(f"rope_scaling of type {self.rope_type!r}: missing {name!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                     "attention_factor", "mscale", "mscale_all_dim"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise ValueError(f"rope_scaling.{name} = {v!r}: expected a finite number")
            object.__setattr__(self, name, float(v))
        if self.factor is not None and self.factor <= 0:
            raise ValueError(f"rope_scaling.factor = {self.factor!r}: expected a positive number")
        if self.rope_type == "llama3" and self.low_freq_factor >= self.high_freq_factor:
            raise ValueError(f"rope_scaling.low_freq_factor = {self.low_freq_factor}: expected less than "
                             f"high_freq_factor = {self.high_freq_factor}")
        omp = self.original_max_position_embeddings
        if omp is not None:
            if isinstance(omp, bool) or not isinstance(omp, (int, np.integer)) or omp < 1:
                raise ValueError(f"rope_scaling.original_max_position_embeddings = {omp!r}: expected a positive integer")
            object.__setattr__(self, "original_max_position_embeddings", int(omp))
        if self.truncate is not None:
            object.__setattr__(self, "truncate", bool(self.truncate))
        if self.factors is not None:
            f = tuple(float(x) for x in np.asarray(self.factors, np.float64).reshape(-1))
            if not f or not all(math.isfinite(x) and x > 0 for x in f):
                raise ValueError("rope_scaling.factors: expected positive finite numbers, one per frequency")
            object.__setattr__(self, "factors", f)

    @classmethod
    def from_hf(cls, d: Mapping[str, Any] | None, *, max_position_embeddings: int | None = None,
                where: str = "rope_scaling") -> RopeScaling | None:
        """A :class:`RopeScaling` from an HF dict (``rope_type`` or the older ``type`` key);
        None for ``None`` or ``rope_type: default``. ``max_position_embeddings`` fills YaRN's
        ``original_max_position_embeddings`` when the dict lacks it (as older configs do).
        Raises ``ValueError`` naming ``where`` and the type for anything else."""
        if d is None or isinstance(d, RopeScaling):
            return d
        if not isinstance(d, Mapping):
            raise ValueError(f"{where} = {d!r}: expected a mapping or null")
        kind = d.get("rope_type", d.get("type", "default"))
        if kind == "default":
            return None
        if kind not in ROPE_TYPES:
            raise ValueError(
                f"{where} = {dict(d)!r}: rope_type {kind!r} is not supported; expected 'default' or one of "
                f"{ROPE_TYPES[:4]} (longrope, su and the other types are refused)"
            )
        kw = {k: d[k] for k in _KEYS[kind] if d.get(k) is not None}
        if kind == "yarn" and "original_max_position_embeddings" not in kw:
            if max_position_embeddings is None:
                raise ValueError(f"{where}: yarn needs original_max_position_embeddings")
            kw["original_max_position_embeddings"] = max_position_embeddings
        if kind == "yarn" and "factor" not in kw:  # transformers: max_position_embeddings / original
            if max_position_embeddings is None:
                raise ValueError(f"{where}: yarn needs factor")
            kw["factor"] = max_position_embeddings / kw["original_max_position_embeddings"]
        try:
            return cls(rope_type=kind, **kw)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def to_hf(self) -> dict[str, Any]:
        """The HF dict (``rope_type`` plus the fields that are set)."""
        out: dict[str, Any] = {"rope_type": self.rope_type}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "rope_type" and v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def attention_factor_value(self) -> float:
        """The factor cos and sin are multiplied by: YaRN's, else 1.0."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return float(_yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim))
        return _yarn_mscale(self.factor, 1.0)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def default_inv_freq(dim: int, theta: float) -> np.ndarray:
    """Plain RoPE's ``theta ** (-2i / dim)``, float32 ``[dim / 2]`` (computed in float32 as
    transformers does)."""
    exps = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)


def inv_freq(dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """The inverse frequencies (float32 ``[dim / 2]``) of a head of ``dim`` dimensions."""
    base = default_inv_freq(dim, theta)
    if scaling is None or scaling.rope_type == "dynamic":
        return base
    kind = scaling.rope_type
    if kind == "linear":
        return (base / np.float32(scaling.factor)).astype(np.float32)
    if kind == "freq_factors":
        f = np.asarray(scaling.factors, np.float32)
        if f.shape != base.shape:
            raise ValueError(f"rope_scaling.factors has {f.size} values; expected {base.size} (head_dim / 2)")
        return (base / f).astype(np.float32)
    if kind == "llama3":
        return _llama3(base, scaling)
    return _yarn(dim, theta, scaling)


def _llama3(base: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a linear blend between."""
    old = float(s.original_max_position_embeddings)
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = (2 * math.pi / base).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, base / np.float32(s.factor), base).astype(np.float32)
    smooth = ((old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(s.factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """YaRN: extrapolated frequencies above the ``beta_fast`` rotation count, interpolated ones
    (``/ factor``) below ``beta_slow``, a linear ramp in between."""
    beta_fast = s.beta_fast or 32.0
    beta_slow = s.beta_slow or 1.0
    omp = s.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(omp / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.truncate is None or s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = np.float32(theta) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(s.factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extra_weight = (1 - ramp).astype(np.float32)
    return (interpolation * (1 - extra_weight) + extrapolation * extra_weight).astype(np.float32)
