"""Models on disk, in Hugging Face Llama layout: ``config.json`` + safetensors weights.

A folder written by :func:`save_model` is what ``transformers`` writes for a
``LlamaForCausalLM``::

    out/config.json          HF LlamaConfig keys + "architectures": ["LlamaForCausalLM"]
    out/model.safetensors    HF tensor names, Linear weights [out, in]

or, with ``max_shard_bytes``, ``model-00001-of-0000K.safetensors`` ... plus
``model.safetensors.index.json`` (``{"metadata": {"total_size": ...}, "weight_map": {...}}``).

Tensor names (``T`` = transposed from jaxspec's ``[in, out]`` kernels)::

    model.embed_tokens.weight                          [V, D]
    model.layers.{i}.input_layernorm.weight            [D]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   T
    model.layers.{i}.self_attn.{q,k,v}_proj.bias       (attention_bias only)
    model.layers.{i}.post_attention_layernorm.weight   [D]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    T
    model.norm.weight                                  [D]
    lm_head.weight                                     T, [V, D]   (absent when tied)

:func:`load_model` takes an embedded model name (:func:`embedded_models`, shipped under
``jaxspec/models/``) or such a folder, and GGUF files (:mod:`jaxspec.formats.gguf`) by path or by
packaged name (:mod:`jaxspec.formats.packaged`)::

    target = load_model("default-target")            # embedded, no download
    draft = load_model("default-draft")
    model = load_model("/path/to/hf_folder", dtype="bfloat16")
    model = load_model("smollm2-135m")               # the GGUF file of an installed package

Supported architectures are the keys of :data:`ARCHITECTURES` (each maps the HF config dict
to :class:`~jaxspec.nn.config.ModelConfig` keyword arguments); adding a family is one entry:

* ``LlamaForCausalLM`` (``attention_bias`` as configured), tied or untied embeddings, rope
  scaling ``linear``, ``llama3``, ``yarn``, ``dynamic`` (:mod:`jaxspec.nn.rope`);
* ``Qwen2ForCausalLM`` (biases on q/k/v) and ``Qwen3ForCausalLM`` (per-head q/k norms), with
  ``use_sliding_window`` on the layers ``layer_types`` / ``max_window_layers`` mark;
* ``MistralForCausalLM`` (``sliding_window`` on every layer);
* ``Phi3ForCausalLM`` (fused ``qkv_proj`` and ``gate_up_proj``, split on load; LongRoPE refused);
* ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` (text): ``(1 + w)`` norms before and after
  attention and MLP, GeGLU, scaled embeddings, soft caps (Gemma 2), q/k norms and a local rope
  base on sliding layers (Gemma 3), sliding and global layers per ``layer_types``.

Every family is the same :class:`~jaxspec.nn.model.Transformer`: the functions only fill
:class:`~jaxspec.nn.config.ModelConfig` fields. ``max_context`` caps
``max_position_embeddings`` (sliding windows are implemented, so it is no longer needed for them).

Nothing here touches the network: folders are read from local disk only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxspec.formats.families import ARCHITECTURES, FUSED_TENSORS
from jaxspec.formats.gguf import is_gguf_file, is_gguf_source, load_gguf
from jaxspec.formats.gguf_tokenizer import GGUFTokenizer, load_gguf_tokenizer  # imports no GGUF package itself
from jaxspec.formats.hf_tokenizer import TOKENIZER_FILE, HFTokenizer
from jaxspec.formats.packaged import is_packaged_name, packaged_file, packaged_models
from jaxspec.formats.tokenizer import ByteTokenizer
from jaxspec.formats.weights import (LOAD_DTYPES, assemble, cap_context, check_layer_count, check_load_args,
                                     check_tensor_names, expected_tensors)
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.head import HEAD_KEY, FeatureHead, is_head_folder, load_head
from jaxspec.nn.model import Transformer
from jaxspec.nn.quant import apply_quantize, check_quantize, is_quantized

__all__ = [
    "ARCHITECTURES",
    "MODELS_DIR",
    "embedded_models",
    "load_draft",
    "resolve_model_path",
    "read_config",
    "config_to_hf",
    "config_from_hf",
    "hf_state_dict",
    "save_model",
    "load_model",
    "load_tokenizer",
]

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors dtypes load_model reads (converted to the model's dtype)
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
# Tensors some HF checkpoints carry that this model recomputes: skipped on load.
_IGNORED_TENSORS = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


# ----------------------------------------------------------------------------- names
def embedded_models() -> list[str]:
    """Names of the models shipped inside the package (sorted): the default target, its
    draft model and its feature draft head (``default-head``: :func:`load_draft` or
    :func:`~jaxspec.nn.head.load_head`), and a feature head for SmolLM2-135M-Instruct
    (``smollm2-135m-head``, drafting 8,192 ids; docs/TRAINING.md)."""
    return ["default-draft", "default-head", "default-target", "smollm2-135m-head"]


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """Embedded name -> its folder under ``jaxspec/models/``; packaged name
    (:func:`~jaxspec.formats.packaged.packaged_models`) -> its GGUF file; otherwise the path itself
    (a folder, or a GGUF file: :func:`~jaxspec.formats.gguf.is_gguf_file`).

    Raises ``ValueError`` for a bare name that is neither embedded nor an existing path, and
    ``FileNotFoundError`` for a path (anything with a separator) that does not exist.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ValueError(
            f"load_model: name_or_path = {name_or_path!r}; expected an embedded model name "
            f"({', '.join(embedded_models())}) or a folder path"
        )
    s = os.fspath(name_or_path)
    if s in embedded_models():
        return MODELS_DIR / s
    if is_packaged_name(s):
        return packaged_file(s)
    p = Path(s).expanduser()
    if p.exists():
        if is_gguf_file(p):
            return p
        if not p.is_dir():
            raise FileNotFoundError(
                f"load_model: {s!r} is a file but not a GGUF file; expected a GGUF file or a folder with "
                f"{CONFIG_FILE} and {WEIGHTS_FILE}"
            )
        return p
    if os.sep in s or (os.altsep and os.altsep in s) or s.startswith("."):
        raise FileNotFoundError(f"load_model: model folder {s!r} does not exist")
    raise ValueError(
        f"load_model: unknown model {s!r}; expected one of the embedded models "
        f"{embedded_models()}, a packaged model {packaged_models()}, a path to a GGUF file or to a "
        f"local folder with {CONFIG_FILE} and {WEIGHTS_FILE}"
    )


def read_config(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The raw ``config.json`` dict of an embedded model or a folder."""
    folder = resolve_model_path(name_or_path)
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"load_model: missing {path}")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"load_model: {path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"load_model: {path} holds a {type(cfg).__name__}; expected a JSON object")
    return cfg


# ----------------------------------------------------------------------------- configs
def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """HF ``LlamaConfig`` dict for ``config`` (``torch_dtype`` from ``config.dtype``;
    ``eos_token_id`` as in ``config``: an id, a list of ids, or null for none, so that
    ``transformers`` does not substitute its own default id; ``rope_scaling`` as its HF dict).

    Raises ``ValueError`` for a configuration Llama cannot express (another family's norms,
    activation, soft caps or sliding window): such a model is not written as a Llama."""
    d = config.to_dict()
    dtype = d.pop("dtype")
    for f in ("rope_local_base_freq", "hidden_act", "rms_norm_unit_offset", "qk_norm", "sandwich_norm",
              "scale_embeddings", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
              "sliding_window", "layer_types"):
        default = ModelConfig.__dataclass_fields__[f].default
        if d[f] != default:
            raise ValueError(f"config_to_hf: {f} = {d[f]!r}: a LlamaForCausalLM has {f} = {default!r}; "
                             "this model cannot be written as a Llama")
        d.pop(f)
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "freq_factors":
        raise ValueError("config_to_hf: rope_scaling of type 'freq_factors' (a GGUF rope_freqs tensor) has no "
                         "LlamaConfig form")
    d.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act="silu",
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        pretraining_tp=1,
        rope_scaling=d["rope_scaling"],
        use_cache=True,
        torch_dtype=dtype,
    )
    return d


def config_from_hf(
    cfg: Mapping[str, Any],
    *,
    dtype: str | None = None,
    source: str = CONFIG_FILE,
    max_context: int | None = None,
) -> ModelConfig:
    """:class:`ModelConfig` from an HF config dict; ``dtype`` None -> ``"float32"``.

    ``max_context`` (tokens: prompt + new tokens + tree), when given, caps
    ``max_position_embeddings`` so longer sequences are refused at generation time.
    """
    dtype = check_load_args("load_model", dtype, max_context)
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ValueError(
            f"load_model: {source}: architectures = {archs!r} is not supported; "
            f"expected one of {sorted(ARCHITECTURES)}"
        )
    try:
        kwargs = ARCHITECTURES[archs[0]](cfg, max_context)
        kwargs["dtype"] = dtype
        config = ModelConfig.from_dict(kwargs)
    except ValueError as e:
        raise ValueError(f"load_model: {source}: {e}") from None
    return cap_context(config, max_context)


# ----------------------------------------------------------------------------- tensors
def _hf_name(path: tuple) -> tuple[str, bool]:
    """nnx state path -> (HF tensor name, whether the array is transposed)."""
    *mods, leaf = (str(p) for p in path)
    if mods == ["lm_head"]:
        return "lm_head.weight", True
    if leaf == "kernel":
        return "model." + ".".join(mods) + ".weight", True
    if leaf == "embedding":
        return "model." + ".".join(mods) + ".weight", False
    return "model." + ".".join(mods) + "." + leaf, False


def hf_state_dict(model: Transformer, dtype: str | None = None) -> dict[str, np.ndarray]:
    """HF-named numpy tensors of ``model`` (Linear weights transposed to ``[out, in]``)."""
    _, state = nnx.split(model)
    np_dtype = None if dtype is None else jnp.dtype(dtype)
    out = {}
    for path, var in nnx.to_flat_state(state):
        name, transpose = _hf_name(path)
        arr = np.asarray(var[...])
        if transpose:
            arr = arr.T
        if np_dtype is not None:
            arr = arr.astype(np_dtype)
        out[name] = np.ascontiguousarray(arr)
    return out


def save_model(
    model: Transformer,
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    max_shard_bytes: int | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` to folder ``path`` in HF Llama layout; returns the folder.

    ``dtype`` (``"float32"`` / ``"bfloat16"``; None -> the model's) sets the stored dtype and
    ``torch_dtype``. ``max_shard_bytes`` splits the weights into ``model-XXXXX-of-YYYYY``
    shards with an index. ``extra_config`` keys are added to ``config.json`` (e.g. token ids).
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"save_model: model is a {type(model).__name__}; expected a jaxspec Transformer")
    if is_quantized(model):
        raise ValueError("save_model: model is quantized (int8); save the float model it was loaded from")
    dtype = model.config.dtype if dtype is None else (dtype if isinstance(dtype, str) else jnp.dtype(dtype).name)
    if dtype not in LOAD_DTYPES:
        raise ValueError(f"save_model: dtype = {dtype!r}; expected one of {LOAD_DTYPES} or None")
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1):
        raise ValueError(f"save_model: max_shard_bytes = {max_shard_bytes!r}; expected a positive integer or None")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(model, dtype)
    cfg = config_to_hf(model.config)
    cfg["torch_dtype"] = dtype
    cfg.update(extra_config or {})
    (folder / CONFIG_FILE).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for stale in list(folder.glob("model-*-of-*.safetensors")) + [folder / INDEX_FILE, folder / WEIGHTS_FILE]:
        stale.unlink(missing_ok=True)
    meta = {"format": "pt"}  # what transformers expects in the safetensors header
    if max_shard_bytes is None:
        _save_tensors(tensors, folder / WEIGHTS_FILE, meta)
        return folder
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name]
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        _save_tensors(shard, folder / fname, meta)
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return folder


def _save_tensors(tensors: dict[str, np.ndarray], path: Path, meta: dict[str, str]) -> None:
    save_file(tensors, path, metadata=meta)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # safetensors creates files 0600; make them like any other file


def _open_weights(path: Path):
    """``safe_open(path)``; a damaged file (truncated, empty, not safetensors) -> ValueError."""
    try:
        return safe_open(path, framework="numpy")
    except SafetensorError as e:
        raise ValueError(f"load_model: {path} is not a valid safetensors file: {e}") from None


def _weight_files(folder: Path) -> dict[str, str]:
    """HF tensor name -> file name, from the index or the single weights file."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"load_model: {index} is not a valid safetensors index ({e!r})") from None
        if not isinstance(weight_map, dict):
            raise ValueError(
                f"load_model: {index} is not a valid safetensors index (weight_map is a "
                f"{type(weight_map).__name__}; expected an object mapping tensor names to file names)"
            )
        for name, fname in weight_map.items():
            if not isinstance(fname, str) or not fname:
                raise ValueError(
                    f"load_model: {index} is not a valid safetensors index (weight_map[{name!r}] = "
                    f"{fname!r}; expected a file name)"
                )
        for fname in sorted(set(weight_map.values())):
            if not (folder / fname).is_file():
                raise FileNotFoundError(f"load_model: missing shard {folder / fname} (listed in {index})")
        return dict(weight_map)
    single = folder / WEIGHTS_FILE
    if not single.is_file():
        raise FileNotFoundError(f"load_model: missing {single} (and no {INDEX_FILE})")
    with _open_weights(single) as f:
        return {name: WEIGHTS_FILE for name in f.keys()}


def load_model(
    name_or_path: str | os.PathLike, *, dtype: str | None = None, max_context: int | None = None,
    quantize: str | None = None,
) -> Transformer:
    """A :class:`Transformer` from an embedded name, an HF-layout folder, or a GGUF file
    (a path, or a packaged name such as ``"smollm2-135m"``: :func:`~jaxspec.formats.gguf.load_gguf`).

    ``dtype``: ``"float32"`` (default when None) or ``"bfloat16"``; stored tensors of any
    float dtype are converted. ``max_context``: the longest sequence (prompt + new tokens +
    tree) you will run; when given, it caps ``max_position_embeddings`` (generation then refuses
    longer sequences). Sliding attention windows are implemented and need no ``max_context``.
    Architectures: :data:`ARCHITECTURES`. Errors name the file or tensor at fault.
    ``quantize="int8"``: int8 weights and activations in every linear layer and the LM head
    (:mod:`jaxspec.nn.quant`; a GGUF file quantizes from its dequantized weights), or, where
    an int8 product is not faster than float32 on this machine, the float model and one warning.
    """
    check_quantize("load_model", quantize)
    folder = resolve_model_path(name_or_path)
    if is_gguf_file(folder):
        return apply_quantize(load_gguf(folder, dtype=dtype, max_context=max_context), quantize)
    if is_head_folder(folder):
        raise ValueError(
            f"load_model: {os.fspath(name_or_path)!r} is a feature draft head (its {CONFIG_FILE} has "
            f"{HEAD_KEY!r}), not a model; load it with load_head or load_draft"
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"load_model: model folder {folder} does not exist")
    config = config_from_hf(
        read_config(folder), dtype=dtype, source=str(folder / CONFIG_FILE), max_context=max_context
    )
    files = _weight_files(folder)
    held = {int(name.split(".")[2]) for name in files if name.startswith("model.layers.") and name.split(".")[2].isdigit()}
    check_layer_count(f"load_model: {folder / CONFIG_FILE}: num_hidden_layers", config.num_hidden_layers, held,
                      unit="layers", name="model.layers.{}", holder="the weights hold")
    arch = (read_config(folder).get("architectures") or ["LlamaForCausalLM"])[0]

    graphdef, state, expected = expected_tensors(config, _hf_name)  # HF name -> TensorSlot
    sources = _sources(arch, config, expected, files)  # HF name -> (stored name, rows or None)
    check_tensor_names(f"load_model: {folder}", expected, [n for n, (src, _) in sources.items() if src in files])
    used = {src for src, _ in sources.values()}
    unexpected = [
        n for n in files
        if n not in used and not _IGNORED_TENSORS.match(n) and not (n == "lm_head.weight" and config.tie_word_embeddings)
    ]
    if unexpected:
        raise ValueError(
            f"load_model: {folder / files[unexpected[0]]}: unexpected tensor {unexpected[0]!r} for the "
            f"configuration in {CONFIG_FILE} (attention_bias = {config.attention_bias}, "
            f"tie_word_embeddings = {config.tie_word_embeddings})"
        )

    pd = config.param_dtype
    values: dict[tuple, jax.Array] = {}
    by_file: dict[str, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[sources[name][0]], []).append(name)
    for fname, names in by_file.items():
        file = folder / fname
        with _open_weights(file) as f:
            stored = set(f.keys())
            for name in names:
                path, transpose, shape = expected[name]
                arr = _read_tensor(f, file, stored, sources[name], shape)
                values[path] = jnp.asarray(arr.T if transpose else arr, dtype=pd)

    return apply_quantize(assemble(graphdef, state, values), quantize)


def _sources(arch: str, config: ModelConfig, expected, files) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """Where each expected tensor is stored: its own name, or (a family with fused tensors,
    :data:`~jaxspec.formats.families.FUSED_TENSORS`) a row range of the fused tensor when the file holds that one."""
    out = {name: (name, None) for name in expected}
    rows = {"q": config.num_attention_heads * config.head_dim, "kv": config.num_key_value_heads * config.head_dim,
            "i": config.intermediate_size}
    for fused, parts in FUSED_TENSORS.get(arch, {}).items():
        for i in range(config.num_hidden_layers):
            stored = f"model.layers.{i}.{fused}"
            if stored not in files:
                continue
            start = 0
            for part, kind in parts:
                out[f"model.layers.{i}.{part}"] = (stored, (start, start + rows[kind]))
                start += rows[kind]
    return out


def _read_tensor(f, file: Path, stored: set[str], source, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor ``source = (stored name, rows or None)`` of open file ``f``, checked: listed,
    of the expected shape (a fused tensor: the sum of its parts' rows), a float dtype, finite."""
    name, rows = source
    if name not in stored:  # a shard index that lists a tensor its shard lacks
        raise ValueError(f"load_model: {file}: missing tensor {name!r} (listed in {INDEX_FILE})")
    sl = f.get_slice(name)
    got = tuple(sl.get_shape())
    if rows is None:
        ok, want = got == shape, str(shape)
    else:  # a fused tensor holds this part's rows among others
        ok, want = len(got) == 2 and got[0] >= rows[1] and got[1:] == shape[1:], f"at least {rows[1]} rows of {shape[1]}"
    if not ok:
        raise ValueError(f"load_model: {file}: tensor {name!r} has shape {got}; expected {want} from {CONFIG_FILE}")
    if sl.get_dtype() not in _FLOAT_DTYPES:
        raise ValueError(
            f"load_model: {file}: tensor {name!r} has dtype {sl.get_dtype()}; expected a float "
            f"({', '.join(_FLOAT_DTYPES)})"
        )
    try:
        arr = f.get_tensor(name) if rows is None else sl[rows[0]:rows[1]]
    except SafetensorError as e:
        raise ValueError(f"load_model: {file} is not a valid safetensors file: {e}") from None
    if not np.isfinite(arr).all():  # one vectorized pass per tensor
        bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
        raise ValueError(
            f"load_model: {file}: tensor {name!r} has {bad} non-finite value(s) (NaN or inf); expected finite weights"
        )
    return arr


def load_draft(name_or_path: str | os.PathLike, *, dtype: str | None = None,
               max_context: int | None = None, quantize: str | None = None) -> Transformer | FeatureHead:
    """A draft for :func:`jaxspec.generate` from an embedded name, a folder or a GGUF file: a feature
    head (a folder written by ``jaxspec train-head``, :func:`~jaxspec.nn.head.save_head`)
    loads with :func:`~jaxspec.nn.head.load_head`, any other model with :func:`load_model`
    (``dtype``, ``max_context`` and ``quantize`` apply to models only: a head stays float, and
    drafts through its target's LM head, quantized with the target)."""
    check_quantize("load_draft", quantize)
    folder = resolve_model_path(name_or_path)
    if is_head_folder(folder):
        return load_head(folder)
    return load_model(name_or_path, dtype=dtype, max_context=max_context, quantize=quantize)


def load_tokenizer(name_or_path: str | os.PathLike) -> ByteTokenizer | HFTokenizer | GGUFTokenizer:
    """The tokenizer of the model :func:`load_model` loads from the same name or path:
    :class:`~jaxspec.formats.hf_tokenizer.HFTokenizer` when its folder has ``tokenizer.json``;
    the :class:`~jaxspec.formats.tokenizer.ByteTokenizer` for the embedded models and folders whose
    ``config.json`` says ``"jaxspec_tokenizer": "byte"`` (what jaxspec's training writes); the
    :class:`~jaxspec.formats.gguf_tokenizer.GGUFTokenizer` of a GGUF file (a ``.gguf`` path, or a
    packaged name such as ``"smollm2-135m"``). ``FileNotFoundError`` otherwise::

        load_tokenizer("/models/SmolLM2-360M")     # HFTokenizer (folder with tokenizer.json)
        load_tokenizer("default-target")           # ByteTokenizer (embedded models)
        load_tokenizer("smollm2-135m")             # GGUFTokenizer (a packaged model, or any .gguf file)
    """
    if is_gguf_source(name_or_path):
        return load_gguf_tokenizer(packaged_file(name_or_path) if is_packaged_name(name_or_path) else name_or_path)
    folder = resolve_model_path(name_or_path)
    if (folder / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_file(folder)
    try:
        byte = read_config(folder).get("jaxspec_tokenizer") == "byte"
    except (FileNotFoundError, ValueError):  # no config.json, or not a JSON object
        byte = False
    if byte or os.fspath(name_or_path) in ("default-target", "default-draft"):
        return ByteTokenizer()
    raise FileNotFoundError(
        f"load_tokenizer: {folder} has no {TOKENIZER_FILE} (and its config.json does not name the "
        "jaxspec byte tokenizer); copy the model's tokenizer.json into the folder"
    )
