"""GGUF model files (llama.cpp's format) loaded as jaxspec :class:`~jaxspec.nn.model.Transformer`\\ s.

A GGUF file holds the metadata (``general.architecture``, ``{arch}.block_count``, ...), the
tokenizer and every tensor, each stored as F32, F16, BF16 or a quantized block format (Q8_0,
Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, ...). Tensors are dequantized with ``gguf.quants.dequantize``
to float32, one at a time, and converted to the model's dtype as they are read::

    is_gguf_file("SmolLM2-135M-Instruct.Q4_1.gguf")      # True: the file starts with b"GGUF"
    cfg = gguf_config(path)      # ModelConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30, ...)
    model = load_gguf(path, dtype="bfloat16")
    jaxspec.load_model("smollm2-135m")                    # a packaged GGUF, through load_model

Tensor names (llama.cpp's) and jaxspec's nnx state (``T``: stored ``[out, in]`` as in HF,
transposed to jaxspec's ``[in, out]`` kernels)::

    token_embd.weight                    [V, D]   embed_tokens.embedding
    blk.{i}.attn_norm.weight             [D]      layers[i].input_layernorm.weight
    blk.{i}.attn_{q,k,v,output}.weight   T        layers[i].self_attn.{q,k,v,o}_proj.kernel
    blk.{i}.attn_{q,k,v}.bias            [H*hd]   layers[i].self_attn.{q,k,v}_proj.bias (attention_bias)
    blk.{i}.ffn_norm.weight              [D]      layers[i].post_attention_layernorm.weight
                                                  (sandwich norms: pre_feedforward_layernorm)
    blk.{i}.ffn_{gate,up,down}.weight    T        layers[i].mlp.{gate,up,down}_proj.kernel
    blk.{i}.attn_{q,k}_norm.weight       [hd]     layers[i].self_attn.{q,k}_norm.weight (qwen3, gemma3)
    blk.{i}.post_attention_norm.weight   [D]      layers[i].post_attention_layernorm.weight (gemma2/3)
    blk.{i}.post_ffw_norm.weight         [D]      layers[i].post_feedforward_layernorm.weight (gemma2/3)
    output_norm.weight                   [D]      norm.weight
    output.weight                        T [V, D] lm_head.kernel   (absent: tied embeddings)
    rope_freqs.weight                    [hd/2]   config.rope_scaling (freq_factors: Llama 3.1's rope)

llama.cpp's converter permutes the rows of Q and K (weights and biases) of ``llama`` files
for its rotary layout (:func:`undo_llama_permute` undoes it; :data:`QK_PERMUTED_ARCHITECTURES`
lists the families it applies to); ``qwen2`` files keep Hugging Face's row order.

Supported families are the keys of :data:`GGUF_ARCHITECTURES` (each maps the file's metadata
to :class:`~jaxspec.nn.config.ModelConfig` keyword arguments); adding one is one entry.
Needs the ``gguf`` package (``pip install 'jaxspec[gguf]'``); :func:`is_gguf_file` does not.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.nn.config import ModelConfig
from jaxspec.formats.gguf_reader import open_reader
from jaxspec.nn.model import Transformer
from jaxspec.nn.rope import RopeScaling
from jaxspec.formats.weights import (assemble, cap_context, check_layer_count, check_load_args, check_tensor_names,
                                     expected_tensors)

__all__ = [
    "GGUF_ARCHITECTURES",
    "QK_PERMUTED_ARCHITECTURES",
    "is_gguf_file",
    "is_gguf_source",
    "gguf_config",
    "load_gguf",
    "undo_llama_permute",
]

_MAGIC = b"GGUF"
# jaxspec module name -> llama.cpp tensor name part
_MODULES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an existing file whose first 4 bytes are ``b"GGUF"``."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    p = Path(os.fspath(path)).expanduser()
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def is_gguf_source(name_or_path) -> bool:
    """Whether ``name_or_path`` names a GGUF model: a packaged name (``"smollm2-135m"``,
    :mod:`jaxspec.formats.packaged`), an existing GGUF file (:func:`is_gguf_file`), or a path ending
    in ``.gguf`` (which the GGUF readers then refuse by name if it is missing)."""
    from jaxspec.formats.packaged import is_packaged_name

    if not isinstance(name_or_path, (str, os.PathLike)):
        return False
    return (is_packaged_name(name_or_path) or is_gguf_file(name_or_path)
            or os.fspath(name_or_path).lower().endswith(".gguf"))


# ----------------------------------------------------------------------------- metadata
def _field_value(field) -> Any:
    """A metadata field as a Python value (FLOAT32 rounded to its shortest decimal, so the
    stored 9.999999747e-06 reads back as the 1e-05 that was written)."""
    import gguf

    value = field.contents()
    if field.types and field.types[0] == gguf.GGUFValueType.FLOAT32:
        value = float(str(np.float32(value)))
    return value


def _metadata(reader) -> dict[str, Any]:
    """All metadata fields except the tokenizer's long arrays (tokens, merges, types, scores)."""
    import gguf

    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        out[key] = _field_value(field)
    return out


def _require(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise ValueError(f"missing metadata key {key!r}")
    return meta[key]


def _rope(arch: str, meta: Mapping[str, Any], head_dim: int, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling``: llama.cpp's linear scaling (``rope.scaling.type`` or
    the older ``rope.scale_linear``), or the per-frequency divisors of a ``rope_freqs.weight``
    tensor (what its converter writes for Llama 3.1's scaling). Other scaling types and rotation
    of part of each head are refused by name."""
    dims = meta.get(f"{arch}.rope.dimension_count")
    if dims is not None and dims != head_dim:
        raise ValueError(
            f"{arch}.rope.dimension_count = {dims!r}: rotary embeddings over part of a head are not "
            f"supported; expected the head dimension {head_dim}"
        )
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear"))
    if kind not in (None, "none", "linear", "yarn"):
        raise ValueError(
            f"{arch}.rope.scaling.type = {kind!r} is not supported; expected 'none', 'linear' or 'yarn'"
        )
    scaling = None
    if (kind == "linear" or kind is None) and factor not in (None, 1.0):
        scaling = RopeScaling(rope_type="linear", factor=factor)
    if kind == "yarn":
        scaling = _yarn(arch, meta, factor)
    if "rope_freqs.weight" in tensors:
        if scaling is not None:
            raise ValueError(f"{arch}: both linear rope scaling and a rope_freqs.weight tensor; expected one")
        t = tensors["rope_freqs.weight"]
        if t.tensor_type.name != "F32" or t.data.size != head_dim // 2:
            raise ValueError(f"tensor 'rope_freqs.weight' of type {t.tensor_type.name} and {t.data.size} values; "
                             f"expected F32 with head_dim / 2 = {head_dim // 2} values")
        scaling = RopeScaling(rope_type="freq_factors", factors=tuple(np.asarray(t.data, np.float32).tolist()))
    return {"rope_theta": meta.get(f"{arch}.rope.freq_base", 10000.0), "rope_scaling": scaling}


def _yarn(arch: str, meta: Mapping[str, Any], factor) -> RopeScaling:
    """The converter's YaRN keys as the Hugging Face YaRN they came from (``factor``,
    ``original_context_length``, the optional betas); llama.cpp-only knobs that change it
    (a log multiplier, an attention factor other than 1) are refused by name."""
    for key, neutral in (("yarn_log_multiplier", 0.0), ("attn_factor", 1.0), ("yarn_attn_factor", 1.0),
                         ("yarn_ext_factor", None)):
        v = meta.get(f"{arch}.rope.scaling.{key}")
        if v is not None and v != neutral:
            raise ValueError(f"{arch}.rope.scaling.{key} = {v!r} is not supported with yarn; expected it absent")
    return RopeScaling(rope_type="yarn", factor=factor,
                       original_max_position_embeddings=_require(meta, f"{arch}.rope.scaling.original_context_length"),
                       beta_fast=meta.get(f"{arch}.rope.scaling.yarn_beta_fast"),
                       beta_slow=meta.get(f"{arch}.rope.scaling.yarn_beta_slow"))


def _llama_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any], arch: str = "llama") -> dict[str, Any]:
    heads = _require(meta, f"{arch}.attention.head_count")
    hidden = _require(meta, f"{arch}.embedding_length")
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads if heads else None)
    value_dim = meta.get(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ValueError(f"{arch}.attention.value_length = {value_dim!r}: expected the key length {head_dim}")
    window = meta.get(f"{arch}.attention.sliding_window")
    return dict(
        hidden_size=hidden,
        intermediate_size=_require(meta, f"{arch}.feed_forward_length"),
        num_hidden_layers=_require(meta, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        **_rope(arch, meta, head_dim, tensors),
        rms_norm_eps=_require(meta, f"{arch}.attention.layer_norm_rms_epsilon"),
        max_position_embeddings=_require(meta, f"{arch}.context_length"),
        attention_bias=False,
        sliding_window=window,  # on every layer (Mistral v0.1 converted as llama)
    )


def _qwen2_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    return {**_llama_kwargs(meta, tensors, arch="qwen2"), "attention_bias": True}


def _qwen3_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    return {**_llama_kwargs(meta, tensors, arch="qwen3"), "qk_norm": True}


def _swa_layers(arch: str, meta: Mapping[str, Any], n: int, pattern: int) -> list[str]:
    """Which layers slide: ``{arch}.attention.sliding_window_pattern`` (a period, or one bool per
    layer), else llama.cpp's built-in period for the family (every ``pattern``-th layer global)."""
    p = meta.get(f"{arch}.attention.sliding_window_pattern", pattern)
    if isinstance(p, (list, tuple)):
        if len(p) != n:
            raise ValueError(f"{arch}.attention.sliding_window_pattern has {len(p)} entries; expected {n}")
        return ["sliding_attention" if x else "full_attention" for x in p]
    return ["sliding_attention" if i % p < p - 1 else "full_attention" for i in range(n)]


def _gemma_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any], arch: str, pattern: int,
                  big_layers: int) -> dict[str, Any]:
    """Gemma 2 / 3. llama.cpp's converter stores the norms' ``1 + w`` (so they scale by the
    stored weight) and no query scale: llama.cpp uses ``head_dim``, and ``hidden / heads`` for
    the 27B models (``big_layers`` blocks), which is their ``query_pre_attn_scalar``."""
    out = _llama_kwargs(meta, tensors, arch=arch)
    n = out["num_hidden_layers"]
    big = n == big_layers
    out.update(
        hidden_act="gelu_pytorch_tanh", sandwich_norm=True, scale_embeddings=True,
        query_pre_attn_scalar=out["hidden_size"] / out["num_attention_heads"] if big else out["head_dim"],
        attn_logit_softcapping=meta.get(f"{arch}.attn_logit_softcapping"),
        final_logit_softcapping=meta.get(f"{arch}.final_logit_softcapping"),
    )
    if out["sliding_window"] is not None:
        out["layer_types"] = _swa_layers(arch, meta, n, pattern)
    return out


def _gemma2_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    return _gemma_kwargs(meta, tensors, "gemma2", pattern=2, big_layers=46)


def _gemma3_kwargs(meta: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    out = _gemma_kwargs(meta, tensors, "gemma3", pattern=6, big_layers=62)
    # sliding layers: plain rope with their own base (llama.cpp: 10000 unless the file says)
    return {**out, "qk_norm": True, "rope_local_base_freq": meta.get("gemma3.rope.freq_base_swa", 10000.0)}


#: ``general.architecture`` -> function(metadata dict, tensors by name) -> ModelConfig keyword
#: arguments (the sizes, rope, norm, window and bias fields; vocabulary, tying and end-of-text
#: ids are read by :func:`gguf_config` for every family). Raises ValueError for what jaxspec
#: cannot run exactly.
GGUF_ARCHITECTURES: dict[str, Callable[..., dict[str, Any]]] = {
    "llama": _llama_kwargs,
    "qwen2": _qwen2_kwargs,
    "qwen3": _qwen3_kwargs,
    "gemma2": _gemma2_kwargs,
    "gemma3": _gemma3_kwargs,
}

#: the families whose Q/K rows llama.cpp's converter permutes (``LlamaModel.permute``)
QK_PERMUTED_ARCHITECTURES = frozenset({"llama"})


def _reader(path_or_reader, fn: str):
    """(GGUFReader, its path) from a path or an open reader."""
    try:
        import gguf
    except ImportError:
        raise ImportError(f"{fn}: reading GGUF files needs the gguf package: pip install 'jaxspec[gguf]'") from None
    if isinstance(path_or_reader, gguf.GGUFReader):
        return path_or_reader, Path(str(path_or_reader.data.filename))
    if not isinstance(path_or_reader, (str, os.PathLike)):
        raise ValueError(f"{fn}: path = {path_or_reader!r}; expected a path to a GGUF file or a GGUFReader")
    path = Path(os.fspath(path_or_reader)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{fn}: GGUF file {str(path)!r} does not exist")
    if not is_gguf_file(path):
        raise ValueError(f"{fn}: {path} is not a GGUF file (its first bytes are not b'GGUF')")
    return open_reader(path, fn), path



def gguf_config(path_or_reader, *, dtype: str | None = None, max_context: int | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file (a path or an open ``gguf.GGUFReader``).

    ``vocab_size``: ``{arch}.vocab_size``, else the token list's length, else
    ``token_embd.weight``'s rows; ``tie_word_embeddings``: no ``output.weight`` tensor;
    ``eos_token_id``: ``tokenizer.ggml.eos_token_id``, with ``tokenizer.ggml.eot_token_id``
    as a second id when it differs. ``dtype`` and ``max_context`` as in ``load_model``.
    """
    return _config(path_or_reader, dtype, max_context, "gguf_config")


def _config(path_or_reader, dtype, max_context, fn: str) -> ModelConfig:
    dtype = check_load_args(fn, dtype, max_context)
    reader, path = _reader(path_or_reader, fn)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{fn}: {path}: general.architecture = {arch!r} is not supported; expected one of "
            f"{sorted(GGUF_ARCHITECTURES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    try:
        kwargs = GGUF_ARCHITECTURES[arch](meta, tensors)
        check_layer_count(f"{arch}.block_count", kwargs["num_hidden_layers"], _block_indices(tensors), unit="blocks",
                          name="blk.{}", holder="the file holds")
        vocab, vocab_key = meta.get(f"{arch}.vocab_size"), f"{arch}.vocab_size"
        if vocab is None and "tokenizer.ggml.tokens" in reader.fields:
            vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
            vocab_key = "the length of tokenizer.ggml.tokens"
        if vocab is None and "token_embd.weight" in tensors:
            vocab = int(tensors["token_embd.weight"].shape[-1])  # GGUF dims: [D, V]
            vocab_key = "the rows of token_embd.weight"
        if vocab is None:
            raise ValueError(f"no {arch}.vocab_size, token list or token_embd.weight to read the vocabulary size from")
        eos = _end_ids(meta, vocab, f"{fn}: {path}")
        try:
            config = ModelConfig(
                **kwargs,
                vocab_size=vocab,
                tie_word_embeddings="output.weight" not in tensors,
                eos_token_id=eos[0] if len(eos) == 1 else tuple(eos) or None,
                dtype=dtype,
            )
        except ValueError as e:  # ModelConfig names its field: name the file's key instead
            raise ValueError(_in_keys(str(e), arch, meta, vocab_key)) from None
    except ValueError as e:
        raise ValueError(f"{fn}: {path}: {e}") from None
    return cap_context(config, max_context)


def _block_indices(tensors: Mapping[str, Any]) -> set[int]:
    """The block numbers ``i`` of the file's ``blk.{i}.*`` tensors."""
    return {int(name.split(".")[1]) for name in tensors if name.startswith("blk.") and name.split(".")[1].isdigit()}


def _end_ids(meta: Mapping[str, Any], vocab: int, where: str) -> list:
    """``tokenizer.ggml.eos_token_id`` and ``eot_token_id``, distinct, in order; an id outside
    the vocabulary is dropped with a one-line warning (llama.cpp ignores it, transformers loads
    such configs)."""
    out = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        if key not in meta:
            continue
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            warnings.warn(f"{where}: {key} = {v!r} is not an id in [0, {vocab}); ignored", stacklevel=4)
            continue
        out.append(v)
    return list(dict.fromkeys(out))


def _in_keys(message: str, arch: str, meta: Mapping[str, Any], vocab_key: str) -> str:
    """A ``ModelConfig.<field> ...`` refusal with the field written as the GGUF key it was read
    from (``ModelConfig.num_attention_heads = 0`` -> ``llama.attention.head_count = 0``)."""
    keys = {
        "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
        "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
        "num_key_value_heads": ("attention.head_count_kv" if f"{arch}.attention.head_count_kv" in meta
                                else "attention.head_count"),
        "rope_theta": "rope.freq_base", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
        "max_position_embeddings": "context_length", "sliding_window": "attention.sliding_window",
        "attn_logit_softcapping": "attn_logit_softcapping", "final_logit_softcapping": "final_logit_softcapping",
    }
    named = {f: f"{arch}.{k}" for f, k in keys.items()}
    named["head_dim"] = (f"{arch}.attention.key_length" if f"{arch}.attention.key_length" in meta
                         else f"{arch}.embedding_length / {arch}.attention.head_count")
    named["vocab_size"] = vocab_key
    prefix = "ModelConfig."
    if not message.startswith(prefix):
        return message
    field = message[len(prefix):].split(" ", 1)[0].split("[", 1)[0]
    if field not in named:
        return message
    return f"{named[field]}{message[len(prefix) + len(field):]} (ModelConfig.{field})"


# ----------------------------------------------------------------------------- tensors
def undo_llama_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``LlamaModel.permute`` of Q or K rows (``n_heads``: query heads
    for Q, key/value heads for K). ``w``: ``[n_heads * hd, ...]`` (a weight or a bias).

    Within each head llama.cpp interleaves the two rotary halves: GGUF row ``2 * j + s`` is
    HF row ``s * hd / 2 + j``. For one head with hd = 4, GGUF rows ``[a0, b0, a1, b1]`` ->
    HF rows ``[a0, a1, b0, b1]``.
    """
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_namer(config: ModelConfig):
    """nnx state path -> (GGUF tensor name, whether jaxspec's array is the transpose), for
    ``config`` (with sandwich norms ``post_attention_layernorm`` is llama.cpp's
    ``post_attention_norm`` and ``pre_feedforward_layernorm`` its ``ffn_norm``)."""
    modules = dict(_MODULES)
    if config.sandwich_norm:
        modules["post_attention_layernorm"] = "post_attention_norm"

    def name_of(path: tuple) -> tuple[str, bool]:
        *mods, leaf = (str(p) for p in path)
        if mods == ["embed_tokens"]:
            return "token_embd.weight", False
        if mods == ["norm"]:
            return "output_norm.weight", False
        if mods == ["lm_head"]:
            return "output.weight", True
        _, i, *rest = mods  # ["layers", i, "self_attn", "q_proj"] or ["layers", i, "input_layernorm"]
        return f"blk.{i}.{modules[rest[-1]]}.{'bias' if leaf == 'bias' else 'weight'}", leaf == "kernel"

    return name_of


def load_gguf(path: str | os.PathLike, *, dtype: str | None = None, max_context: int | None = None) -> Transformer:
    """A :class:`Transformer` from a GGUF file (families: :data:`GGUF_ARCHITECTURES`).

    Every tensor is dequantized to float32, its Q/K rows put back in HF order
    (:data:`QK_PERMUTED_ARCHITECTURES`), checked (shape against the metadata, finite values)
    and converted to ``dtype`` (``"float32"``, the default, or ``"bfloat16"``) before the next
    is read, so at most one float32 tensor exists besides the model. Errors name the file and
    the tensor at fault.
    """
    import gguf.quants

    fn = "load_gguf"
    check_load_args(fn, dtype, max_context)  # the arguments before the file
    reader, file = _reader(path, fn)
    config = _config(reader, dtype, max_context, fn)
    arch = reader.fields["general.architecture"].contents()
    tensors = {t.name: t for t in reader.tensors}

    graphdef, state, expected = expected_tensors(config, _gguf_namer(config))  # GGUF name -> TensorSlot
    check_tensor_names(f"{fn}: {file}", expected, tensors)
    # rope_freqs.weight is read into config.rope_scaling (freq_factors) by _config
    unexpected = [n for n in tensors if n not in expected and n != "rope_freqs.weight"]
    if unexpected:
        raise ValueError(
            f"{fn}: {file}: unexpected tensor {unexpected[0]!r} for the configuration in its metadata "
            f"({arch}, attention_bias = {config.attention_bias}, tie_word_embeddings = {config.tie_word_embeddings})"
        )

    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    pd = config.param_dtype
    values: dict[tuple, jax.Array] = {}
    for name, (p, transpose, shape) in expected.items():
        t = tensors[name]
        got = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF dims are innermost first
        if got != shape:
            raise ValueError(
                f"{fn}: {file}: tensor {name!r} has shape {got}; expected {shape} from the file's metadata"
            )
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)  # float32, [out, in]
        except NotImplementedError:
            raise ValueError(
                f"{fn}: {file}: tensor {name!r} has type {t.tensor_type.name}, which gguf {_gguf_version()} "
                "cannot dequantize"
            ) from None
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if not np.isfinite(arr).all():
            bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
            raise ValueError(
                f"{fn}: {file}: tensor {name!r} has {bad} non-finite value(s) (NaN or inf); expected finite weights"
            )
        part = name.split(".")[-2]
        if arch in QK_PERMUTED_ARCHITECTURES and part in heads:
            arr = undo_llama_permute(arr, heads[part])
        values[p] = jnp.asarray(arr.T if transpose else arr, dtype=pd)
        del arr

    return assemble(graphdef, state, values)


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"
