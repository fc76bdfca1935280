"""Write small GGUF files the way llama.cpp's ``convert_hf_to_gguf.py`` does, for the tests.

Written independently of :mod:`jaxspec.formats.gguf` (it never imports it): from an HF-layout
checkpoint (HF tensor names, ``[out, in]`` float32 arrays, an HF config dict) to a GGUF file of
architecture ``llama``, ``qwen2``, ``qwen3``, ``gemma2`` or ``gemma3`` with llama.cpp's metadata
keys, its tensor names, its Q/K row permutation for ``llama`` (``LlamaModel.permute``), 1-D
tensors (norms, biases) kept F32, and every 2-D tensor stored as ``qtype``. As the converter
does, a Llama 3.1 rope becomes a ``rope_freqs.weight`` tensor of per-frequency divisors, Gemma's
norm weights are stored plus one (its ``(1 + w)``), Gemma's softcaps and windows and Gemma 3's
linear rope scaling become metadata, and Gemma's tied output is not written::

    held = write_gguf(tmp_path / "m.gguf", tensors, config, arch="llama", qtype="Q4_0")
    # held: the HF-layout tensors the file holds (dequantized, HF row order); a folder with
    # these weights is the model the file is

gguf-py quantizes F32, F16, BF16, Q8_0, Q4_0, Q4_1 (and Q5_0, Q5_1) but not the K-quants: for
Q4_K, Q5_K and Q6_K the file holds random valid blocks (scales small and finite), whose
dequantized values (``gguf.quants.dequantize``) are what ``held`` returns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

# HF name pattern -> llama.cpp name (``{i}`` the layer)
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GEMMA = ("gemma2", "gemma3")
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1") + K_QUANTS


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    _, _, i, rest = hf_name.split(".", 3)  # model.layers.{i}.<rest>
    if arch in _GEMMA and rest == "post_attention_layernorm.weight":  # Gemma: the attention output's norm
        return f"blk.{i}.post_attention_norm.weight"
    return f"blk.{i}.{_LAYER_NAMES[rest]}"


def _rope(config: Mapping) -> tuple[float, dict | None]:
    """(theta, scaling dict) of the global layers, from ``rope_theta`` / ``rope_scaling`` or
    transformers 5's ``rope_parameters`` (flat, or per layer type as Gemma 3 has it)."""
    rp = config.get("rope_parameters")
    if isinstance(rp, Mapping) and "full_attention" in rp:
        rp = rp["full_attention"]
    if isinstance(rp, Mapping):
        kind = rp.get("rope_type", "default")
        return rp.get("rope_theta", 10000.0), None if kind == "default" else dict(rp)
    return config.get("rope_theta", 10000.0), config.get("rope_scaling")


def llama3_rope_factors(theta: float, head_dim: int, s: Mapping) -> np.ndarray:
    """The converter's ``rope_freqs.weight`` for a Llama 3.1 rope: per frequency, the divisor
    that turns the plain frequency into the scaled one."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old = s.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: within each head, interleave the two rotary halves
    (row ``s * hd/2 + j`` -> row ``2 * j + s``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _inverse_rows(stored: np.ndarray, n_head: int) -> np.ndarray:
    """The HF rows whose permutation is ``stored``, from the permutation of row indices alone."""
    idx = llama_permute(np.arange(stored.shape[0]), n_head)  # stored[r] = hf[idx[r]]
    hf = np.empty_like(stored)
    hf[idx] = stored
    return hf


def random_k_blocks(rows: int, cols: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[rows, cols / 256 * type_size]``: random K-quant blocks with small finite scales
    (dequantized weights of magnitude ~0.1, roughly centred)."""
    block, size = gguf.GGML_QUANT_SIZES[Q[qtype]]
    assert cols % block == 0, f"{qtype} needs rows of a multiple of {block} values; got {cols}"
    n = rows * (cols // block)
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    if qtype == "Q6_K":  # ql[128] qh[64] scales[16] (int8) d (f16)
        b[:, -2:] = rng.uniform(2e-5, 6e-5, n).astype(np.float16)[:, None].view(np.uint8)
    else:  # d (f16), dmin (f16), scales[12], [qh[32]], qs[128]; w = d * sc * q - dmin * m
        d = rng.uniform(5e-5, 1.5e-4, n)
        centre = 7.5 if qtype == "Q4_K" else 15.5
        b[:, 0:2] = d.astype(np.float16)[:, None].view(np.uint8)
        b[:, 2:4] = (centre * d).astype(np.float16)[:, None].view(np.uint8)
    return b.reshape(rows, -1)


def write_gguf(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    config: Mapping,
    *,
    arch: str = "llama",
    qtype: str = "F32",
    seed: int = 0,
    metadata: Mapping | None = None,
    eot_token_id: int | None = None,
    raw: Mapping[str, tuple[np.ndarray, Q]] | None = None,
) -> dict[str, np.ndarray]:
    """Write HF ``tensors`` / ``config`` as a GGUF file at ``path`` (``arch``: ``llama`` permutes
    Q/K rows, anything else does not); returns the HF-layout float32 tensors the file holds.

    ``metadata``: extra or replacing key -> value (a string, int, float or bool). ``raw``: GGUF
    tensor name -> (bytes, type) written as given in place of (or besides) the converted ones.
    """
    rng = np.random.default_rng(seed)
    qt = Q[qtype]
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name("jaxspec test model")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    theta, scaling = _rope(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    if arch != "gemma2":  # the Gemma 2 converter writes no base (llama.cpp's default: 10000)
        w.add_rope_freq_base(theta)
    tensors = dict(tensors)
    if scaling is not None and scaling.get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = llama3_rope_factors(theta, head_dim, scaling)
    elif scaling is not None and scaling.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    elif scaling is not None and scaling.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    elif scaling is not None:
        raise ValueError(f"write_gguf: rope scaling {scaling!r} is not written by this test writer")
    if arch in _GEMMA:
        if config.get("attn_logit_softcapping") is not None:
            w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        if config.get("final_logit_softcapping") is not None:
            w.add_final_logit_softcapping(config["final_logit_softcapping"])
        if config.get("sliding_window") is not None:
            w.add_sliding_window(config["sliding_window"])
        tensors.pop("lm_head.weight", None)  # tied
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_file_type(int(qt))
    if config.get("head_dim") is not None:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    if arch == "llama":  # LlamaModel.set_gguf_parameters adds these two
        w.add_vocab_size(config["vocab_size"])
        w.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // n_head)
    _add_tokenizer(w, config["vocab_size"], config.get("eos_token_id"), eot_token_id)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in (metadata or {}).items():
        w.kv_data[0].pop(key, None)  # replace, without the duplicate-key warning
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)

    held = {}
    raw = dict(raw or {})
    for hf_name, arr in tensors.items():
        name = "rope_freqs.weight" if hf_name == "rope_freqs.weight" else gguf_name(hf_name, arch)
        arr = np.asarray(arr, np.float32)
        if arch in _GEMMA and hf_name.endswith("norm.weight"):
            arr = arr + np.float32(1.0)  # the converter's norm shift
        heads = n_head if ".attn_q." in name else n_kv if ".attn_k." in name else None
        if arch == "llama" and heads is not None:
            arr = llama_permute(arr, heads)
        if name in raw:
            continue
        if arr.ndim == 1 or qt == Q.F32:
            data, stored = arr, arr
        elif qtype in K_QUANTS:
            data = random_k_blocks(*arr.shape, qtype, rng)
            stored = gguf.quants.dequantize(data, qt)
        else:
            data = gguf.quants.quantize(arr, qt)
            stored = gguf.quants.dequantize(data, qt)
        if data.dtype == np.uint8:
            w.add_tensor(name, data, raw_dtype=qt)
        else:
            w.add_tensor(name, data)
        stored = np.asarray(stored, np.float32).reshape(arr.shape)
        if arch in _GEMMA and hf_name.endswith("norm.weight"):
            stored = stored - np.float32(1.0)
        held[hf_name] = _inverse_rows(stored, heads) if arch == "llama" and heads is not None else stored
    held.pop("rope_freqs.weight", None)  # not an HF tensor
    for name, (data, t) in raw.items():
        w.add_tensor(name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def _add_tokenizer(w: gguf.GGUFWriter, vocab: int, eos, eot) -> None:
    """A small valid ``gpt2`` (byte-level BPE) tokenizer of ``vocab`` tokens: the 256 byte
    symbols, then merges of pairs of them."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):  # GPT-2's bytes_to_unicode
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    symbols = [chr(c) for c in cs]
    tokens, merges = list(symbols), []
    a = 0
    while len(tokens) < vocab:
        left, right = symbols[a % 256], symbols[(7 * a + 3) % 256]
        a += 1
        if left + right in tokens:
            continue
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    tokens = tokens[:vocab]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges[: max(0, vocab - 256)])
    w.add_bos_token_id(0)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is not None:
        w.add_eos_token_id(int(eos))
    if eot is not None:
        w.add_eot_token_id(int(eot))
