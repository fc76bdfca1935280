import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxspec.checkpoint import (
    MODELS_DIR,
    config_from_hf,
    config_to_hf,
    embedded_models,
    hf_state_dict,
    load_model,
    read_config,
    save_model,
)
from jaxspec.config import ModelConfig
from jaxspec.model import forward_logits, init_model


def _config(**kw):
    base = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    return ModelConfig(**{**base, **kw})


def _tokens():
    return jax.random.randint(jax.random.key(1), (2, 9), 0, 40, dtype=jnp.int32)


@pytest.mark.parametrize("tie,bias", [(False, False), (True, False), (False, True), (True, True)])
def test_round_trip_identical_logits(tmp_path, tie, bias):
    model = init_model(_config(tie_word_embeddings=tie, attention_bias=bias), jax.random.key(0))
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    np.testing.assert_array_equal(forward_logits(loaded, _tokens()), forward_logits(model, _tokens()))


def test_hf_layout(tmp_path):
    model = init_model(_config(attention_bias=True), jax.random.key(0))
    save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama" and cfg["torch_dtype"] == "float32"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rope_theta", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "attention_bias", "head_dim", "hidden_act"):
        assert key in cfg, key
    tensors = load_file(tmp_path / "model.safetensors")
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(2):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + f"self_attn.{n}_proj.weight" for n in "qkvo"}
        names |= {p + f"self_attn.{n}_proj.bias" for n in "qkv"}
        names |= {p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    assert set(tensors) == names
    # HF Linear weights are [out, in]: the transpose of our kernels.
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (32, 32)
    np.testing.assert_array_equal(q, np.asarray(model.layers[0].self_attn.q_proj.kernel[...]).T)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (16, 32)  # 2 kv heads x 8
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (32, 48)
    assert tensors["lm_head.weight"].shape == (40, 32)
    with safe_open(tmp_path / "model.safetensors", framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}


def test_tied_has_no_lm_head(tmp_path):
    save_model(init_model(_config(tie_word_embeddings=True), jax.random.key(0)), tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")


def test_sharded_layout(tmp_path):
    model = init_model(_config(), jax.random.key(0))
    save_model(model, tmp_path, max_shard_bytes=8_000)
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == set(hf_state_dict(model))
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in hf_state_dict(model).values())
    np.testing.assert_array_equal(forward_logits(load_model(tmp_path), _tokens()), forward_logits(model, _tokens()))
    # re-saving unsharded removes the stale shards
    save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_dtypes(tmp_path):
    model = init_model(_config(), jax.random.key(0))
    save_model(model, tmp_path, dtype="bfloat16")
    assert read_config(tmp_path)["torch_dtype"] == "bfloat16"
    assert load_model(tmp_path).config.dtype == "float32"  # default: float32
    bf = load_model(tmp_path, dtype="bfloat16")
    assert bf.config.dtype == "bfloat16" and bf.embed_tokens.embedding[...].dtype == jnp.bfloat16
    expected = np.asarray(model.embed_tokens.embedding[...]).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(bf.embed_tokens.embedding[...]), expected)
    with pytest.raises(ValueError, match="dtype"):
        load_model(tmp_path, dtype="float16")


def test_config_round_trip():
    cfg = _config(attention_bias=True, tie_word_embeddings=True, rope_theta=5e5)
    assert config_from_hf(config_to_hf(cfg)) == cfg


# ----------------------------------------------------------------------------- errors
def test_unknown_name_lists_known_models():
    with pytest.raises(ValueError, match="default-target") as e:
        load_model("no-such-model")
    assert "no-such-model" in str(e.value) and "default-draft" in str(e.value)


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)


def test_missing_shard(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path, max_shard_bytes=8_000)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        load_model(tmp_path)


def test_unsupported_architecture(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    cfg = read_config(tmp_path)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load_model(tmp_path)


def test_shape_mismatch_names_tensor(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    cfg = read_config(tmp_path)
    cfg["intermediate_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp\.(gate|up|down)_proj\.weight.*shape"):
        load_model(tmp_path)


def test_missing_and_unexpected_tensor(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_model(tmp_path)
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'"):
        load_model(tmp_path)


def test_save_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="Transformer"):
        save_model("not a model", tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        save_model(init_model(_config(), jax.random.key(0)), tmp_path, dtype="float16")


# ----------------------------------------------------------------------------- embedded models
@pytest.mark.parametrize("name", ["default-target", "default-draft"])
def test_embedded_models(name):
    assert name in embedded_models()
    folder = MODELS_DIR / name
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file(), (
        f"embedded model {name} is not shipped in {folder}"
    )
    model = load_model(name)
    assert model.config.vocab_size == 264
    cfg = read_config(name)
    assert cfg["jaxspec_tokenizer"] == "byte" and cfg["bos_token_id"] == 256 and cfg["eos_token_id"] == 257
    logits = forward_logits(model, jnp.asarray([list(b"import os\n")], jnp.int32))
    assert logits.shape == (1, 10, 264) and bool(jnp.all(jnp.isfinite(logits)))


def test_embedded_pair_sizes():
    target, draft = load_model("default-target"), load_model("default-draft")
    assert target.config.num_params() >= 4_000_000
    from jaxspec.train import flops_per_token

    ctx = target.config.max_position_embeddings
    assert flops_per_token(draft.config, ctx) <= flops_per_token(target.config, ctx) / 8
    total = sum(f.stat().st_size for d in ("default-target", "default-draft") for f in (MODELS_DIR / d).iterdir())
    assert total <= 25 * 2**20
