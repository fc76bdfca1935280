"""Hugging Face model families as :class:`~jaxspec.nn.config.ModelConfig` fields: one function
per ``architectures`` entry maps a ``config.json`` dict to ModelConfig keyword arguments, and
that is all a family is. There is no per-family forward: every family runs as the same
:class:`~jaxspec.nn.model.Transformer`::

    ARCHITECTURES["Gemma2ForCausalLM"](json.load(open("config.json")))
    # {..., "hidden_act": "gelu_pytorch_tanh", "rms_norm_unit_offset": True, "sandwich_norm": True,
    #  "attn_logit_softcapping": 50.0, "sliding_window": 4096, "layer_types": [...], ...}

Families with fused projections list them in :data:`FUSED_TENSORS`; the loader
(:func:`jaxspec.formats.checkpoint.load_model`) splits them into the separate q/k/v and gate/up
tensors the model has. Anything a family's config says that no field expresses is refused by
name (LongRoPE, partial rotary, another activation, bidirectional attention, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ARCHITECTURES", "FUSED_TENSORS"]

# HF keys that carry family fields of ModelConfig: never taken from a config dict as they stand,
# only as each family's function reads them (a Qwen2 config's sliding_window is inert unless
# use_sliding_window, Gemma names its activation hidden_activation, ...).
_FAMILY_KEYS = ("rope_scaling", "rope_parameters", "rope_local_base_freq", "hidden_act", "hidden_activation",
                "rms_norm_unit_offset", "qk_norm", "sandwich_norm", "scale_embeddings", "query_pre_attn_scalar",
                "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "layer_types")


def _flat_rope(rp: Mapping[str, Any] | None, theta: Any, where: str) -> tuple[Any, Any]:
    """``(rope_theta, rope_scaling dict or None)`` from one flat rope dict (``rope_parameters``
    of transformers >= 5, or the older ``rope_scaling``); refuses unsupported types by name."""
    if rp is None:
        return theta, None
    if not isinstance(rp, Mapping):
        raise ValueError(f"{where} = {rp!r}: expected a mapping or null")
    theta = rp.get("rope_theta", theta)
    kind = rp.get("rope_type", rp.get("type", "default"))
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor = {rp['partial_rotary_factor']!r} (rotary embeddings "
                         "over part of a head) is not supported; expected 1.0")
    return theta, (None if kind == "default" else {k: v for k, v in rp.items() if k != "rope_theta"})


def _base(cfg: Mapping[str, Any], defaults: Mapping[str, Any], rope_keys: bool = True) -> dict[str, Any]:
    """Family defaults for keys a config may omit (``save_pretrained`` writes only non-default
    values in some versions), the family keys dropped, and (``rope_keys``) one flat rope
    (``rope_theta``, ``rope_scaling``) read from ``rope_parameters`` or ``rope_scaling``."""
    merged = {**defaults, **cfg}
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor = {merged['partial_rotary_factor']!r} (rotary embeddings over "
                         "part of a head) is not supported; expected 1.0")
    out = {k: v for k, v in merged.items() if k not in _FAMILY_KEYS}
    if rope_keys:
        theta = merged.get("rope_theta", 10000.0)
        rp = merged.get("rope_parameters")
        key = "rope_parameters" if isinstance(rp, Mapping) else "rope_scaling"
        out["rope_theta"], out["rope_scaling"] = _flat_rope(merged.get(key), theta, key)
    return out


def _windowed(out: dict[str, Any], cfg: Mapping[str, Any], window: Any) -> dict[str, Any]:
    """Qwen2 / Qwen3: a window only with ``use_sliding_window``, on the layers ``layer_types``
    marks (transformers derives them from ``max_window_layers``: layers at or above it)."""
    if not cfg.get("use_sliding_window", False) or window is None:
        return out
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(out["num_hidden_layers"])]
    return {**out, "sliding_window": window, "layer_types": list(types)}


def _check_act(cfg: Mapping[str, Any], key: str, want: str) -> str:
    act = cfg.get(key, want)
    if act != want:
        raise ValueError(f"{key} = {act!r} is not supported for this architecture; expected {want!r}")
    return act


def _llama_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    _check_act(cfg, "hidden_act", "silu")
    return _base(cfg, {"max_position_embeddings": 2048, "rope_theta": 10000.0})


def _qwen2_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    # Qwen2 always has biases on q/k/v (not o); its configs carry no attention_bias key.
    _check_act(cfg, "hidden_act", "silu")
    out = _base(cfg, {"max_position_embeddings": 32768, "rope_theta": 10000.0})
    out["attention_bias"] = True
    return _windowed(out, cfg, cfg.get("sliding_window", 4096))


def _qwen3_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    _check_act(cfg, "hidden_act", "silu")
    out = _base(cfg, {"max_position_embeddings": 32768, "rope_theta": 10000.0, "head_dim": 128})
    out["qk_norm"] = True
    return _windowed(out, cfg, cfg.get("sliding_window", 4096))


def _mistral_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    _check_act(cfg, "hidden_act", "silu")
    out = _base(cfg, {"max_position_embeddings": 4096 * 32, "rope_theta": 10000.0})
    if cfg.get("layer_types") is not None:
        raise ValueError("layer_types in a MistralForCausalLM config (alternating attention) is not supported; "
                         "expected every layer alike")
    out["attention_bias"] = False
    out["sliding_window"] = cfg.get("sliding_window", 4096)
    return out


def _phi3_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    # Phi-3 calls LongRoPE "longrope" (and "su", and, in its own configs, "yarn"): refused by name.
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else cfg.get("rope_scaling")
    kind = rp.get("rope_type", rp.get("type")) if isinstance(rp, Mapping) else None
    if kind in ("longrope", "su", "yarn"):
        raise ValueError(f"rope type {kind!r} (Phi-3's LongRoPE, which switches frequencies with the sequence "
                         "length) is not supported; expected plain rotary embeddings")
    _check_act(cfg, "hidden_act", "silu")
    out = _base(cfg, {"max_position_embeddings": 4096, "rope_theta": 10000.0})
    out["attention_bias"] = False
    out["sliding_window"] = cfg.get("sliding_window")
    return out


def _gemma_common(cfg: Mapping[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 share: GeGLU (tanh GELU), ``(1 + w)`` norms around attention and MLP,
    embeddings times ``sqrt(hidden)``, ``query_pre_attn_scalar``, a window on the layers
    ``layer_types`` marks."""
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"hidden_activation = {act!r} is not supported; expected 'gelu_pytorch_tanh'")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention = true (an encoder) is not supported; expected false")
    return {**out, "hidden_act": "gelu_pytorch_tanh", "rms_norm_unit_offset": True, "sandwich_norm": True,
            "scale_embeddings": True, "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar", 256)}


def _gemma2_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    defaults = {"max_position_embeddings": 8192, "rope_theta": 10000.0, "head_dim": 256, "tie_word_embeddings": True}
    out = _gemma_common(cfg, _base(cfg, defaults))
    n = out["num_hidden_layers"]
    out["attn_logit_softcapping"] = cfg.get("attn_logit_softcapping", 50.0)
    out["final_logit_softcapping"] = cfg.get("final_logit_softcapping", 30.0)
    out["sliding_window"] = cfg.get("sliding_window", 4096)
    out["layer_types"] = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return out


def _gemma3_kwargs(cfg: Mapping[str, Any], max_context: int | None = None) -> dict[str, Any]:
    defaults = {"max_position_embeddings": 131072, "head_dim": 256, "tie_word_embeddings": True}
    out = _gemma_common(cfg, _base(cfg, defaults, rope_keys=False))
    n = out["num_hidden_layers"]
    rp = cfg.get("rope_parameters")
    if isinstance(rp, Mapping) and ("full_attention" in rp or "sliding_attention" in rp):  # transformers >= 5
        glob, local = rp.get("full_attention"), rp.get("sliding_attention")
    else:  # older configs: rope_theta / rope_scaling global, rope_local_base_freq local
        glob = {"rope_theta": cfg.get("rope_theta", 1_000_000.0), **(cfg.get("rope_scaling") or {})}
        local = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10_000.0)}
    out["rope_theta"], out["rope_scaling"] = _flat_rope(glob or {}, 1_000_000.0, "rope_parameters.full_attention")
    local_theta, local_scaling = _flat_rope(local or {}, 10_000.0, "rope_parameters.sliding_attention")
    if local_scaling is not None:
        raise ValueError(f"rope_parameters.sliding_attention = {dict(local)!r}: scaled rope on sliding layers is not "
                         "supported; expected rope_type 'default'")
    out["rope_local_base_freq"] = local_theta
    out["attn_logit_softcapping"] = cfg.get("attn_logit_softcapping")
    out["final_logit_softcapping"] = cfg.get("final_logit_softcapping")
    out["qk_norm"] = True
    out["sliding_window"] = cfg.get("sliding_window", 4096)
    pattern = cfg.get("sliding_window_pattern", 6)
    out["layer_types"] = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return out


#: architecture name -> function(HF config dict, max_context) -> ModelConfig keyword arguments
#: (HF names). The function raises ValueError for configurations jaxspec cannot run exactly.
ARCHITECTURES: dict[str, Callable[..., dict[str, Any]]] = {
    "LlamaForCausalLM": _llama_kwargs,
    "Qwen2ForCausalLM": _qwen2_kwargs,
    "Qwen3ForCausalLM": _qwen3_kwargs,
    "MistralForCausalLM": _mistral_kwargs,
    "Phi3ForCausalLM": _phi3_kwargs,
    "Gemma2ForCausalLM": _gemma2_kwargs,
    "Gemma3ForCausalLM": _gemma3_kwargs,
}

#: architecture -> {fused HF tensor suffix: [(jaxspec's HF suffix, ModelConfig row-count attribute), ...]}:
#: tensors a family stores concatenated along their output rows, split on load.
FUSED_TENSORS: dict[str, dict[str, list[tuple[str, str]]]] = {
    "Phi3ForCausalLM": {
        "self_attn.qkv_proj.weight": [("self_attn.q_proj.weight", "q"), ("self_attn.k_proj.weight", "kv"),
                                      ("self_attn.v_proj.weight", "kv")],
        "mlp.gate_up_proj.weight": [("mlp.gate_proj.weight", "i"), ("mlp.up_proj.weight", "i")],
    },
}
