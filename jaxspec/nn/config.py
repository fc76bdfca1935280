"""Model configuration: a frozen dataclass whose field names mirror Hugging Face ``LlamaConfig``,
plus the fields in which other families differ from Llama (rope scaling, norm kind, q/k norms,
activation, soft caps, sliding windows per layer; see :class:`ModelConfig`). A family is a
choice of these fields (:mod:`jaxspec.formats.families`), never a separate forward.

Example::

    cfg = ModelConfig(vocab_size=8, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    cfg.head_dim            # 8 (hidden_size // num_attention_heads)
    ModelConfig.from_dict(json.load(open("config.json")))   # HF keys; unknown keys ignored
    ModelConfig(..., sliding_window=4096, layer_types=["sliding_attention", "full_attention"] * 13)
    cfg.layer_window(0), cfg.layer_rope(0)                   # 4096, (rope_theta, rope_scaling)
    cfg.eos_token_ids       # () here; (257,) for the embedded models (config.json's eos_token_id)

Validation happens once, in ``__post_init__`` (plain Python, before any tracing); every
error names the field, the bad value and what was expected. ``head_dim=None`` and
``num_key_value_heads=None`` are resolved on construction (to ``hidden_size //
num_attention_heads`` and ``num_attention_heads``), so equal models compare equal.

``eos_token_id`` (the end-of-text token; it does not change the network) is ``None``, one id,
or, as some Hugging Face configs give it (Llama 3: ``[128001, 128008, 128009]``), a list of
ids, kept as a tuple in the given order (``[]`` -> ``None``); :attr:`ModelConfig.eos_token_ids`
is always a tuple. :func:`jaxspec.generate` stops at these ids by default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_int
from jaxspec.nn.rope import RopeScaling

__all__ = ["ModelConfig", "ACTIVATIONS", "LAYER_TYPES", "dtype_name"]

_DTYPES = ("float32", "bfloat16")
#: ``hidden_act`` values: SwiGLU's SiLU, and GeGLU's tanh-approximated GELU (Gemma)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
#: ``layer_types`` entries (HF names)
LAYER_TYPES = ("full_attention", "sliding_attention")

# HF keys whose non-default values this model does not implement: refuse rather than
# silently produce a different network.
_UNSUPPORTED_HF = {
    "mlp_bias": (False,),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer: Llama, and every family that differs from it only in what
    these fields say (Qwen2/3, Mistral, Gemma 2/3, Phi-3).

    ``dtype`` is the parameter (and KV cache) dtype: ``"float32"`` or ``"bfloat16"``.
    Norms, softmax, the residual stream and logits are always float32.

    The fields after ``eos_token_id`` describe how a family departs from Llama; their defaults
    are Llama's:

    * ``rope_scaling``: a :class:`~jaxspec.nn.rope.RopeScaling` (or its HF dict) for the
      full-attention layers (all layers when ``rope_local_base_freq`` is None);
    * ``rope_local_base_freq``: plain RoPE with this base on sliding-window layers (Gemma 3);
    * ``hidden_act``: ``"silu"`` (SwiGLU) or ``"gelu_pytorch_tanh"`` (GeGLU);
    * ``rms_norm_unit_offset``: RMSNorm scales by ``1 + weight`` (Gemma) instead of ``weight``;
    * ``qk_norm``: an RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3);
    * ``sandwich_norm``: norms after attention and after the MLP too (Gemma 2/3:
      ``post_attention_layernorm`` then normalises the attention output and
      ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` wrap the MLP);
    * ``scale_embeddings``: embeddings times ``sqrt(hidden_size)`` (Gemma);
    * ``query_pre_attn_scalar``: scores scaled by its ``-1/2`` power instead of ``head_dim``'s;
    * ``attn_logit_softcapping`` / ``final_logit_softcapping``: ``c * tanh(x / c)`` on the
      attention scores / the logits (Gemma 2);
    * ``sliding_window`` and ``layer_types``: layer i attends to the last ``sliding_window``
      positions when ``layer_types[i] == "sliding_attention"`` (``layer_types`` None: every layer
      when ``sliding_window`` is set); see :meth:`layer_window`.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None  # None -> num_attention_heads (no GQA)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    dtype: str = "float32"
    eos_token_id: int | tuple[int, ...] | None = None  # end-of-text id(s); a list -> a tuple
    rope_scaling: RopeScaling | None = None
    rope_local_base_freq: float | None = None
    hidden_act: str = "silu"
    rms_norm_unit_offset: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ):
            _check_pos_int(name, getattr(self, name))
            set_(name, int(getattr(self, name)))

        if self.num_key_value_heads is None:
            set_("num_key_value_heads", self.num_attention_heads)
        _check_pos_int("num_key_value_heads", self.num_key_value_heads)
        set_("num_key_value_heads", int(self.num_key_value_heads))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelConfig.num_key_value_heads = {self.num_key_value_heads}: expected a "
                f"divisor of num_attention_heads = {self.num_attention_heads}"
            )

        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"ModelConfig.hidden_size = {self.hidden_size}: expected a multiple of "
                    f"num_attention_heads = {self.num_attention_heads} (or pass head_dim)"
                )
            set_("head_dim", self.hidden_size // self.num_attention_heads)
        _check_pos_int("head_dim", self.head_dim)
        set_("head_dim", int(self.head_dim))
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim = {self.head_dim}: expected an even number (rotary "
                "embeddings rotate pairs of dimensions)"
            )

        for name, top in (("rope_theta", math.inf), ("rms_norm_eps", 1.0)):
            v = getattr(self, name)
            if (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
                    or not (0 < v < top) or not math.isfinite(v)):
                want = "a finite positive number" if top == math.inf else f"a number in (0, {top:g})"
                raise ValueError(f"ModelConfig.{name} = {v!r}: expected {want}")
            set_(name, float(v))

        for name in ("tie_word_embeddings", "attention_bias"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"ModelConfig.{name} = {v!r}: expected a bool")
            set_(name, bool(v))

        dtype = dtype_name(self.dtype)
        if dtype not in _DTYPES:
            raise ValueError(f"ModelConfig.dtype = {self.dtype!r}: expected one of {_DTYPES}")
        set_("dtype", dtype)
        set_("eos_token_id", _check_eos(self.eos_token_id, self.vocab_size))
        self._check_family_fields(set_)

    def _check_family_fields(self, set_) -> None:
        """Validate (and normalise) the fields in which families differ from Llama."""
        try:
            set_("rope_scaling", RopeScaling.from_hf(self.rope_scaling, where="ModelConfig.rope_scaling",
                                                     max_position_embeddings=self.max_position_embeddings))
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("ModelConfig") else f"ModelConfig.{e}") from None
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.hidden_act = {self.hidden_act!r}: expected one of {ACTIVATIONS}")
        for name in ("rms_norm_unit_offset", "qk_norm", "sandwich_norm", "scale_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"ModelConfig.{name} = {v!r}: expected a bool")
            set_(name, bool(v))
        for name in ("rope_local_base_freq", "query_pre_attn_scalar", "attn_logit_softcapping",
                     "final_logit_softcapping"):
            v = getattr(self, name)
            if v is None:
                continue
            if (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
                    or not math.isfinite(v) or v <= 0):
                raise ValueError(f"ModelConfig.{name} = {v!r}: expected None or a finite positive number")
            set_(name, float(v))
        if self.sliding_window is not None:
            _check_pos_int("sliding_window", self.sliding_window)
            set_("sliding_window", int(self.sliding_window))
        if self.layer_types is not None:
            lt = self.layer_types
            if isinstance(lt, str) or not isinstance(lt, (list, tuple)) or len(lt) != self.num_hidden_layers:
                raise ValueError(f"ModelConfig.layer_types = {lt!r}: expected None or a list of "
                                 f"num_hidden_layers = {self.num_hidden_layers} entries")
            for i, t in enumerate(lt):
                if t not in LAYER_TYPES:
                    raise ValueError(f"ModelConfig.layer_types[{i}] = {t!r}: expected one of {LAYER_TYPES}")
            if "sliding_attention" in lt and self.sliding_window is None:
                raise ValueError("ModelConfig.layer_types has sliding_attention layers but sliding_window is None: "
                                 "expected the window length")
            set_("layer_types", tuple(lt))

    # ------------------------------------------------------------------ derived
    @property
    def param_dtype(self):
        """The parameter dtype as a jnp dtype (``jnp.float32`` or ``jnp.bfloat16``)."""
        return jnp.dtype(self.dtype)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-text ids as a tuple: ``()`` when ``eos_token_id`` is None."""
        e = self.eos_token_id
        return () if e is None else (e,) if isinstance(e, int) else e

    def layer_is_sliding(self, i: int) -> bool:
        """Whether layer ``i`` attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[i] == "sliding_attention"

    def layer_window(self, i: int) -> int | None:
        """Layer ``i``'s window: a query at position p sees keys at positions in
        ``(p - W, p]``; None for full attention."""
        return self.sliding_window if self.layer_is_sliding(i) else None

    def layer_rope(self, i: int) -> tuple[float, RopeScaling | None]:
        """``(theta, scaling)`` of layer ``i``'s rotary embedding: ``rope_local_base_freq`` and
        plain RoPE on a sliding layer when it is set (Gemma 3), else ``rope_theta`` and
        ``rope_scaling``."""
        if self.rope_local_base_freq is not None and self.layer_is_sliding(i):
            return self.rope_local_base_freq, None
        return self.rope_theta, self.rope_scaling

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def num_params(self) -> int:
        """Number of scalar parameters of :class:`jaxspec.nn.model.Transformer`."""
        d, h, kv, hd = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.attention_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        mlp = 3 * d * self.intermediate_size
        layer = attn + mlp + (4 if self.sandwich_norm else 2) * d  # RMSNorm weights
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return embed + self.num_hidden_layers * layer + d + head

    # ------------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (JSON-serialisable; HF key names; a tuple
        ``eos_token_id`` becomes a list, as in HF configs)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        if d["rope_scaling"] is not None:
            d["rope_scaling"] = d["rope_scaling"].to_hf()
        if d["layer_types"] is not None:
            d["layer_types"] = list(d["layer_types"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict with HF ``LlamaConfig`` keys; unknown keys are ignored.

        ``torch_dtype`` is ignored (``dtype`` defaults to float32; pass ``dtype`` to choose).
        Keys describing features this model lacks (``mlp_bias``, an unsupported ``rope_scaling``
        type or ``hidden_act``) raise ``ValueError`` instead of being dropped. A dict saved
        before the family fields existed loads with their (Llama) defaults.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"ModelConfig.from_dict: expected a mapping, got {type(d).__name__}")
        for key, allowed in _UNSUPPORTED_HF.items():
            if key in d and d[key] not in allowed:
                raise ValueError(
                    f"ModelConfig.from_dict: {key} = {d[key]!r} is not supported; "
                    f"expected one of {allowed}"
                )
        names = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"ModelConfig.from_dict: missing required keys {missing}")
        return cls(**{k: v for k, v in d.items() if k in names})


def dtype_name(dtype):
    """A dtype given as a string, a numpy/JAX dtype or scalar type, as its name
    (``jnp.bfloat16`` -> ``"bfloat16"``); anything that is not a dtype comes back unchanged,
    for the caller's check to name it."""
    if isinstance(dtype, str):
        return dtype
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return dtype


def _check_eos(v, vocab_size: int) -> int | tuple[int, ...] | None:
    """None, an id or a sequence of ids (HF writes lists) in [0, vocab_size); -> None, an int or
    a tuple of ints (``[]`` -> None)."""
    want = f"expected None, a token id in [0, {vocab_size}) or a list of them"
    if v is None:
        return None
    if is_int(v):
        if not 0 <= v < vocab_size:
            raise ValueError(f"ModelConfig.eos_token_id = {v!r}: {want}")
        return int(v)
    if isinstance(v, (list, tuple)):
        for i, t in enumerate(v):
            if not is_int(t) or not 0 <= t < vocab_size:
                raise ValueError(f"ModelConfig.eos_token_id[{i}] = {t!r}: {want}")
        return tuple(int(t) for t in v) or None
    raise ValueError(f"ModelConfig.eos_token_id = {v!r}: {want}")


def _check_pos_int(name: str, v) -> None:
    if not is_int(v) or v < 1:
        raise ValueError(f"ModelConfig.{name} = {v!r}: expected a positive integer")
