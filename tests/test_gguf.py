"""GGUF files (:mod:`jaxspec.formats.gguf`): tiny files written the way llama.cpp's converter writes
them (``tests/_gguf_writer.py``) load as the HF folder they were written from, for every tensor
type and family; llama.cpp's Q/K row permutation is undone exactly; ``transformers``' own GGUF
loader gives the same logits; malformed or unsupported files are refused by name; the packaged
SmolLM2-135M-Instruct file loads (its logits and greedy text against ``transformers`` are
``tests/test_smollm2.py``'s).
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
gguf = pytest.importorskip("gguf")

from flax import nnx  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import jaxspec.formats.gguf as jgguf  # noqa: E402
from _gguf_writer import TYPES, llama_permute, write_gguf  # noqa: E402
from jaxspec.formats.checkpoint import config_to_hf, load_draft, load_model, resolve_model_path  # noqa: E402
from jaxspec.nn.config import ModelConfig  # noqa: E402
from jaxspec.formats.gguf import gguf_config, is_gguf_file, load_gguf, undo_llama_permute  # noqa: E402
from jaxspec.nn.model import Transformer, forward_logits  # noqa: E402

# hidden and intermediate sizes are multiples of 256: the K-quants' row length
SIZES = dict(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, eos_token_id=2)
SMALL = dict(SIZES, hidden_size=64, intermediate_size=96)  # for the error tests (F32 only)
FAMILIES = {  # name -> (general.architecture, ModelConfig keywords)
    "llama": ("llama", dict(rope_theta=500.0)),
    "llama-tied": ("llama", dict(rope_theta=500.0, tie_word_embeddings=True)),
    "qwen2": ("qwen2", dict(attention_bias=True)),
}
IDS = [[3, 17, 42, 5, 9, 260, 1, 33], list(range(290, 298))]
ATOL = 1e-4
_fwd = nnx.jit(forward_logits)


def _logits(model) -> np.ndarray:
    return np.asarray(_fwd(model, jnp.asarray(IDS, jnp.int32)))


def _hf_tensors(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named random weights of ``cfg``, scaled so that logits are far from uniform."""
    rng = np.random.default_rng(seed)
    d, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, d)
    for n in range(cfg.num_hidden_layers):
        layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
                 "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
                 "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
                 "mlp.gate_proj.weight": (i, d), "mlp.up_proj.weight": (i, d), "mlp.down_proj.weight": (d, i)}
        if cfg.attention_bias:
            layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
        shapes.update({f"model.layers.{n}.{k}": s for k, s in layer.items()})
    return {k: (1 + 0.1 * rng.standard_normal(s) if k.endswith("norm.weight") else 0.08 * rng.standard_normal(s))
            .astype(np.float32) for k, s in shapes.items()}


def _write(tmp_path, family: str, qtype: str = "F32", sizes=SIZES, **kw):
    """(config, GGUF path, folder with the weights the file holds) for ``family``."""
    arch, extra = FAMILIES[family]
    cfg = ModelConfig(**sizes, **extra)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{family}-{qtype}.gguf"
    held = write_gguf(path, _hf_tensors(cfg, seed=len(family)), config_to_hf(cfg), arch=arch, qtype=qtype, **kw)
    folder = tmp_path / f"{family}-{qtype}"
    folder.mkdir()
    save_file(held, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    return cfg, path, folder


def test_is_gguf_file(tmp_path):
    _, path, folder = _write(tmp_path, "llama", sizes=SMALL)
    (tmp_path / "short").write_bytes(b"GGU")
    (tmp_path / "text.gguf").write_text("not a model")
    assert is_gguf_file(path) and is_gguf_file(str(path))
    for p in (folder, folder / "config.json", tmp_path / "short", tmp_path / "text.gguf", tmp_path / "absent.gguf"):
        assert not is_gguf_file(p), p
    assert not is_gguf_file(None)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_loads_as_its_folder(tmp_path, family, qtype):
    """The file and the folder of the weights it holds (dequantized) are one model: same
    config, same logits within 1e-4 (float32)."""
    cfg, path, folder = _write(tmp_path, family, qtype)
    from_folder = load_model(folder)
    assert from_folder.config == cfg
    assert gguf_config(path) == cfg, f"{family} {qtype}: gguf_config differs from the folder's"
    got, want = _logits(load_model(path)), _logits(from_folder)
    assert np.abs(want).max() > 1.0  # non-trivial logits
    err = np.abs(got - want).max()
    assert err <= ATOL, f"{family} {qtype}: GGUF logits differ from the folder's by {err:.3g}"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.1.ffn_down.weight"] == types["token_embd.weight"] == qtype  # 2-D: the type under test
    assert types["blk.1.ffn_norm.weight"] == "F32"  # 1-D: F32, as llama.cpp keeps them


def test_undo_llama_permute_literal():
    """llama.cpp interleaves the two rotary halves of each head; the loader puts them back."""
    rows = np.arange(8)  # two heads of hd = 4: halves [0, 1 | 2, 3] and [4, 5 | 6, 7]
    assert llama_permute(rows, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert undo_llama_permute(np.array([0, 2, 1, 3, 4, 6, 5, 7]), 2).tolist() == list(range(8))
    assert undo_llama_permute(np.array([10, 12, 11, 13]), 1).tolist() == [10, 11, 12, 13]
    w = np.random.default_rng(0).standard_normal((3 * 6, 5))  # 3 heads of hd 6, a weight
    np.testing.assert_array_equal(undo_llama_permute(llama_permute(w, 3), 3), w)
    np.testing.assert_array_equal(llama_permute(undo_llama_permute(w, 3), 3), w)
    b = np.arange(12.0)  # a bias: 2 heads of hd 6
    np.testing.assert_array_equal(undo_llama_permute(llama_permute(b, 2), 2), b)
    assert not np.array_equal(llama_permute(b, 2), b)


def test_permutation_is_undone_for_llama_only(tmp_path, monkeypatch):
    """Dropping the un-permute for llama, or applying it to qwen2, changes the logits."""
    _, llama, llama_folder = _write(tmp_path, "llama")
    _, qwen, qwen_folder = _write(tmp_path, "qwen2")
    want_llama, want_qwen = _logits(load_model(llama_folder)), _logits(load_model(qwen_folder))
    np.testing.assert_allclose(_logits(load_gguf(llama)), want_llama, atol=ATOL, rtol=0)
    np.testing.assert_allclose(_logits(load_gguf(qwen)), want_qwen, atol=ATOL, rtol=0)
    monkeypatch.setattr(jgguf, "QK_PERMUTED_ARCHITECTURES", frozenset())
    assert np.abs(_logits(load_gguf(llama)) - want_llama).max() > 0.1
    monkeypatch.setattr(jgguf, "QK_PERMUTED_ARCHITECTURES", frozenset({"llama", "qwen2"}))
    assert np.abs(_logits(load_gguf(qwen)) - want_qwen).max() > 0.1


def test_bfloat16_and_load_draft(tmp_path):
    _, path, folder = _write(tmp_path, "qwen2", "Q8_0", sizes=SMALL)
    model = load_gguf(path, dtype="bfloat16")
    assert model.config.dtype == "bfloat16" and model.layers[0].self_attn.q_proj.bias[...].dtype == jnp.bfloat16
    got, want = _logits(model), _logits(load_model(folder))
    assert np.isfinite(got).all() and np.abs(got - want).max() < 0.1 * np.abs(want).max()
    draft = load_draft(str(path))
    assert isinstance(draft, Transformer) and draft.config == gguf_config(path)
    assert resolve_model_path(path) == path


def test_config_metadata(tmp_path):
    """eot next to eos; max_context caps the context; float32 metadata reads back as written."""
    cfg, path, _ = _write(tmp_path, "llama", sizes=SMALL, eot_token_id=7)
    got = gguf_config(path, max_context=64, dtype="bfloat16")
    assert got.eos_token_id == (2, 7) and got.max_position_embeddings == 64 and got.dtype == "bfloat16"
    assert got.rms_norm_eps == 1e-5 and got.rope_theta == 500.0
    assert gguf_config(gguf.GGUFReader(path)) == gguf_config(path)
    _, same, _ = _write(tmp_path / "b", "llama", sizes=SMALL, eot_token_id=2)
    assert gguf_config(same).eos_token_id == 2


# ----------------------------------------------------------------------------- refusals
def _raises(match, fn, *args, **kw):
    with pytest.raises(ValueError, match=match) as e:
        fn(*args, **kw)
    return str(e.value)


def test_refuses_unsupported_architecture(tmp_path):
    cfg = ModelConfig(**SMALL)
    path = tmp_path / "f.gguf"
    write_gguf(path, _hf_tensors(cfg), config_to_hf(cfg), arch="falcon")
    msg = _raises("general.architecture = 'falcon' is not supported", load_model, path)
    assert str(path) in msg and "['gemma2', 'gemma3', 'llama', 'qwen2', 'qwen3']" in msg


def test_refuses_tensor_type_gguf_cannot_dequantize(tmp_path):
    # Q8_1: 32 values per 40-byte block; gguf-py has no dequantizer for it
    cfg = ModelConfig(**SMALL)
    raw = {"blk.1.ffn_up.weight": (np.zeros((96, 64 // 32 * 40), np.uint8), gguf.GGMLQuantizationType.Q8_1)}
    path = tmp_path / "q81.gguf"
    write_gguf(path, _hf_tensors(cfg), config_to_hf(cfg), raw=raw)
    msg = _raises("tensor 'blk.1.ffn_up.weight' has type Q8_1, which gguf .* cannot dequantize", load_gguf, path)
    assert str(path) in msg


def test_refuses_missing_tensor_and_wrong_shape(tmp_path):
    cfg = ModelConfig(**SMALL)
    tensors = _hf_tensors(cfg)
    up = tensors.pop("model.layers.1.mlp.up_proj.weight")
    write_gguf(tmp_path / "missing.gguf", tensors, config_to_hf(cfg))
    _raises(f"{tmp_path / 'missing.gguf'}: missing tensor 'blk.1.ffn_up.weight'", load_gguf, tmp_path / "missing.gguf")
    tensors["model.layers.1.mlp.up_proj.weight"] = np.concatenate([up, up[:, :32]], axis=1)  # [96, 96]
    write_gguf(tmp_path / "shape.gguf", tensors, config_to_hf(cfg))
    _raises(r"shape.gguf: tensor 'blk.1.ffn_up.weight' has shape \(96, 96\); expected \(96, 64\)",
            load_gguf, tmp_path / "shape.gguf")


def test_refuses_unexpected_and_non_finite_tensors(tmp_path):
    cfg = ModelConfig(**SMALL)
    tensors = _hf_tensors(cfg)
    F32 = gguf.GGMLQuantizationType.F32
    write_gguf(tmp_path / "rope.gguf", tensors, config_to_hf(cfg), raw={"rope_freqs.weight": (np.ones(4, np.float32), F32)})
    _raises("tensor 'rope_freqs.weight' of type F32 and 4 values; expected F32 with head_dim / 2 = 8",
            load_gguf, tmp_path / "rope.gguf")
    write_gguf(tmp_path / "extra.gguf", tensors, config_to_hf(cfg),
               raw={"blk.0.attn_q.bias": (np.zeros(64, np.float32), F32)})
    _raises("unexpected tensor 'blk.0.attn_q.bias' .*attention_bias = False", load_gguf, tmp_path / "extra.gguf")
    bad = np.array(tensors["model.norm.weight"])
    bad[3] = np.nan
    write_gguf(tmp_path / "nan.gguf", tensors, config_to_hf(cfg), raw={"output_norm.weight": (bad, F32)})
    _raises("tensor 'output_norm.weight' has 1 non-finite value", load_gguf, tmp_path / "nan.gguf")


def test_rope_scaling_and_window_metadata(tmp_path):
    """Linear rope scaling and a sliding window load (YaRN: tests/test_architectures_gguf.py);
    other scaling types, and YaRN knobs Hugging Face's YaRN lacks, are refused by name."""
    cfg = ModelConfig(**SMALL, attention_bias=True)
    tensors = _hf_tensors(cfg)
    write_gguf(tmp_path / "long.gguf", tensors, config_to_hf(cfg), metadata={"llama.rope.scaling.type": "longrope"})
    _raises("llama.rope.scaling.type = 'longrope' is not supported", gguf_config, tmp_path / "long.gguf")
    write_gguf(tmp_path / "yarn.gguf", tensors, config_to_hf(cfg), metadata={"llama.rope.scaling.type": "yarn"})
    _raises("missing metadata key 'llama.rope.scaling.original_context_length'", gguf_config, tmp_path / "yarn.gguf")
    write_gguf(tmp_path / "yarn2.gguf", tensors, config_to_hf(cfg), metadata={
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
        "llama.rope.scaling.original_context_length": 32, "llama.rope.scaling.yarn_log_multiplier": 0.1})
    _raises("yarn_log_multiplier = 0.1.* not supported", gguf_config, tmp_path / "yarn2.gguf")
    write_gguf(tmp_path / "lin.gguf", tensors, config_to_hf(cfg),
               metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    assert gguf_config(tmp_path / "lin.gguf").rope_scaling.to_hf() == {"rope_type": "linear", "factor": 4.0}
    write_gguf(tmp_path / "swa.gguf", tensors, config_to_hf(cfg), arch="qwen2",
               metadata={"qwen2.attention.sliding_window": 64})
    got = load_model(tmp_path / "swa.gguf", max_context=64).config
    assert got.max_position_embeddings == 64 and got.layer_window(0) == 64


def test_refuses_non_gguf_paths(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("hello")
    _raises("is not a GGUF file", load_gguf, text)
    _raises("is not a GGUF file", gguf_config, text)
    with pytest.raises(FileNotFoundError, match="is a file but not a GGUF file"):
        load_model(text)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gguf(tmp_path / "absent.gguf")
    _raises("dtype = 'float16'", load_gguf, text, dtype="float16")


# ----------------------------------------------------------------------------- transformers
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers_gguf_loader(tmp_path, family):
    """transformers' GGUF loader (dequantizing with gguf and un-permuting Q/K itself) on the
    same file gives jaxspec's logits within 1e-4 (float32)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' GGUF loading goes through it
    _, path, _ = _write(tmp_path, family, "Q8_0", sizes=SMALL)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor(IDS, dtype=torch.long)).logits.float().numpy()
    got = _logits(load_model(path))
    assert np.abs(want).max() > 1.0
    err = np.abs(got - want).max()
    assert err <= ATOL, f"{family}: jaxspec and transformers' GGUF loader differ by {err:.3g}"


# ----------------------------------------------------------------------------- memory
def test_loads_tensor_by_tensor(tmp_path):
    """Host memory while loading: the float32 temporaries of one tensor at a time, never a
    float32 copy of the whole model (numpy allocations, traced; the model's arrays are JAX's)."""
    import tracemalloc

    cfg, path, _ = _write(tmp_path, "llama", "Q8_0", sizes=dict(SIZES, num_hidden_layers=4))
    tracemalloc.start()
    try:
        model = load_gguf(path)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = 4 * cfg.num_params()  # bytes of the model in float32
    largest = 4 * cfg.hidden_size * max(cfg.intermediate_size, cfg.vocab_size)
    assert peak < total / 2 and peak < 8 * largest, f"peak {peak} B while loading {total} B of float32 weights"
    assert current < total / 4, f"{current} B of numpy arrays left after loading"  # (and caches of JAX's tracing)
    assert isinstance(model, Transformer)


# ----------------------------------------------------------------------------- the real file
def _smollm2_path():
    from jaxspec.formats.packaged import packaged_file

    try:
        return packaged_file("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_packaged_smollm2_config():
    path = _smollm2_path()
    assert resolve_model_path("smollm2-135m") == path
    cfg = gguf_config(path)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.tie_word_embeddings, cfg.rope_theta, cfg.eos_token_id) == (49152, True, 100000.0, 2)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps, cfg.max_position_embeddings) == (64, 1536, 1e-5, 8192)


def test_packaged_smollm2_loads():
    """The whole file (Q4_1 and Q8_0 tensors) through load_model; finite, non-flat logits."""
    _smollm2_path()
    model = load_model("smollm2-135m")
    assert model.config == gguf_config(_smollm2_path())
    logits = np.asarray(forward_logits(model, jnp.asarray([[1, 9690, 198, 2683, 314, 253]], jnp.int32)))
    assert logits.shape == (1, 6, 49152) and np.isfinite(logits).all() and logits.std() > 1.0
