import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxspec.formats.checkpoint import (
    MODELS_DIR,
    config_from_hf,
    config_to_hf,
    embedded_models,
    hf_state_dict,
    load_model,
    read_config,
    save_model,
)
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import forward_logits, init_model


def _config(**kw):
    base = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    return ModelConfig(**{**base, **kw})


def _tokens():
    return jax.random.randint(jax.random.key(1), (2, 9), 0, 40, dtype=jnp.int32)


def _edit_checkpoint(folder, edit, *, dtype="float32"):
    """Save a fresh model to ``folder``, then rewrite its safetensors file with
    ``edit(tensors)`` applied (a dict name -> numpy array, edited in place)."""
    save_model(init_model(_config(), jax.random.key(0)), folder, dtype=dtype)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")


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


@pytest.mark.parametrize("eos, kept", [(None, None), (7, 7), ([3, 39], (3, 39)), ((5,), (5,)), ([], None)])
def test_eos_token_id_round_trip(tmp_path, eos, kept):
    """eos_token_id: None, an id, or a list of ids (as HF configs write it; kept as a tuple in
    its order) survives save_model / load_model; config.json holds it as HF does (null when
    None, so that transformers does not put its own default id in its place)."""
    cfg = _config(eos_token_id=eos)
    assert cfg.eos_token_id == kept
    assert cfg.eos_token_ids == (() if kept is None else (kept,) if isinstance(kept, int) else kept)
    save_model(init_model(cfg, jax.random.key(0)), tmp_path)
    on_disk = read_config(tmp_path)["eos_token_id"]
    assert on_disk == (list(kept) if isinstance(kept, tuple) else kept)
    assert load_model(tmp_path).config == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_eos_token_id_from_hf_and_refused_values():
    """A Hugging Face config's eos_token_id (an id or a list) is read; an id outside the
    vocabulary, a bool or a string is refused, naming the field."""
    assert config_from_hf({**config_to_hf(_config()), "eos_token_id": [1, 2, 1]}).eos_token_id == (1, 2, 1)
    assert config_from_hf({k: v for k, v in config_to_hf(_config()).items() if k != "eos_token_id"}).eos_token_id is None
    for bad, field in ((40, r"eos_token_id = 40"), (-1, r"eos_token_id = -1"), (True, r"eos_token_id = True"),
                       ("2", r"eos_token_id = '2'"), ([1, 40], r"eos_token_id\[1\] = 40"), (1.0, r"eos_token_id = 1.0")):
        with pytest.raises(ValueError, match=rf"ModelConfig\.{field}: expected None, a token id in \[0, 40\)"):
            _config(eos_token_id=bad)
    with pytest.raises(ValueError, match=r"load_model: config.json: ModelConfig.eos_token_id = 64"):
        config_from_hf({**config_to_hf(_config()), "eos_token_id": 64})


def test_trained_models_record_the_byte_eos(tmp_path):
    """The training presets (byte tokenizer) carry EOS_ID, and a model saved by training
    (extra_config=TOKENIZER_CONFIG) records it even from a config without one."""
    from jaxspec.formats.tokenizer import EOS_ID
    from jaxspec.training.train import PRESETS, TOKENIZER_CONFIG

    assert {name: c.eos_token_id for name, c in PRESETS.items()} == dict.fromkeys(PRESETS, EOS_ID)
    cfg = ModelConfig(vocab_size=264, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    save_model(init_model(cfg, jax.random.key(0)), tmp_path, extra_config=TOKENIZER_CONFIG)
    assert load_model(tmp_path).config.eos_token_ids == (EOS_ID,)


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
    _edit_checkpoint(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_model(tmp_path)
    _edit_checkpoint(tmp_path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'"):
        load_model(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "empty", "random bytes", "header only"])
def test_damaged_weights_file_is_a_value_error(tmp_path, damage):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    f = tmp_path / "model.safetensors"
    good = f.read_bytes()
    f.write_bytes({"truncated": good[: len(good) // 2], "empty": b"",
                   "random bytes": np.random.default_rng(0).bytes(4096), "header only": good[:8]}[damage])
    with pytest.raises(ValueError, match=r"load_model: .*model\.safetensors is not a valid safetensors file: ") as e:
        load_model(tmp_path)
    assert str(f) in str(e.value)


def test_damaged_shard_is_a_value_error(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path, max_shard_bytes=8_000)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-4])
    with pytest.raises(ValueError, match=f"{victim.name} is not a valid safetensors file"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "index, detail",
    [
        ({"weight_map": ["a", "b"]}, "weight_map is a list"),
        ({"weight_map": "model-00001-of-00002.safetensors"}, "weight_map is a str"),
        ({"weight_map": {"model.norm.weight": 3}}, "weight_map['model.norm.weight'] = 3"),
        ({"weight_map": {"model.norm.weight": None}}, "weight_map['model.norm.weight'] = None"),
        ({"weight_map": {"model.norm.weight": ["x"]}}, "weight_map['model.norm.weight'] = ['x']"),
        (["weight_map"], "TypeError"),
    ],
)
def test_malformed_index_is_a_value_error(tmp_path, index, detail):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path, max_shard_bytes=8_000)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="is not a valid safetensors index") as e:
        load_model(tmp_path)
    assert detail in str(e.value)


def test_index_naming_a_tensor_its_shard_lacks(tmp_path):
    save_model(init_model(_config(), jax.random.key(0)), tmp_path, max_shard_bytes=8_000)
    path = tmp_path / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    index["weight_map"]["model.norm.weight"] = next(s for s in shards if s != index["weight_map"]["model.norm.weight"])
    path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"missing tensor 'model\.norm\.weight'"):
        load_model(tmp_path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_non_finite_weights_name_the_tensor(tmp_path, bad, dtype):
    def plant(tensors):
        w = tensors["model.layers.1.mlp.up_proj.weight"].copy()
        w[3, 5] = bad
        tensors["model.layers.1.mlp.up_proj.weight"] = w

    _edit_checkpoint(tmp_path, plant, dtype=dtype)
    with pytest.raises(ValueError, match=r"tensor 'model\.layers\.1\.mlp\.up_proj\.weight' has 1 non-finite") as e:
        load_model(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(e.value) and "NaN or inf" in str(e.value)


def test_integer_tensor_is_refused(tmp_path):
    _edit_checkpoint(tmp_path, lambda t: t.update({"model.norm.weight": np.ones(32, np.int32)}))
    with pytest.raises(ValueError, match=r"tensor 'model\.norm\.weight' has dtype I32; expected a float"):
        load_model(tmp_path)


def test_damaged_weights_cli_is_one_line(tmp_path, capsys):
    from jaxspec.cli import main

    save_model(init_model(_config(), jax.random.key(0)), tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 3)
    assert main(["export", str(tmp_path / "m"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxspec export: error: load_model: ") and "not a valid safetensors file" in err
    assert err.count("\n") == 1 and "Traceback" not in err


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
    assert model.config.eos_token_id == 257 and model.config.eos_token_ids == (257,)  # generate stops there
    logits = forward_logits(model, jnp.asarray([list(b"import os\n")], jnp.int32))
    assert logits.shape == (1, 10, 264) and bool(jnp.all(jnp.isfinite(logits)))


def test_embedded_pair_sizes():
    target, draft = load_model("default-target"), load_model("default-draft")
    assert target.config.num_params() >= 4_000_000
    from jaxspec.training.train import flops_per_token

    ctx = target.config.max_position_embeddings
    assert flops_per_token(draft.config, ctx) <= flops_per_token(target.config, ctx) / 8
    total = sum(f.stat().st_size for d in ("default-target", "default-draft") for f in (MODELS_DIR / d).iterdir())
    assert total <= 25 * 2**20


# ----------------------------------------------------------------------------- real-model families (issue 6)
def _hf_cfg(arch, **kw):
    cfg = config_to_hf(_config())
    cfg.update(architectures=[arch], **kw)
    return cfg


def test_qwen2_config_has_qkv_bias():
    cfg = _hf_cfg("Qwen2ForCausalLM", model_type="qwen2", use_sliding_window=False, sliding_window=None)
    cfg.pop("attention_bias")
    assert config_from_hf(cfg).attention_bias is True


def test_rope_parameters_dict():
    """transformers >= 5 writes rope_parameters instead of rope_theta."""
    cfg = _hf_cfg("LlamaForCausalLM", rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    cfg.pop("rope_theta")
    assert config_from_hf(cfg).rope_theta == 500.0
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0}
    with pytest.raises(ValueError, match="llama3"):
        config_from_hf(cfg)


def test_mistral_sliding_window(tmp_path):
    """Mistral v0.1's window is implemented: it loads at any context, the window on every layer;
    within the window it is the full-attention model, beyond it differs."""
    model = init_model(_config(max_position_embeddings=64), jax.random.key(0))
    save_model(model, tmp_path, extra_config={"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                              "sliding_window": 4})
    loaded = load_model(tmp_path)
    assert loaded.config.max_position_embeddings == 64
    assert [loaded.config.layer_window(i) for i in range(2)] == [4, 4]
    short, long = _tokens()[:, :4], _tokens()  # 4 and 9 tokens
    np.testing.assert_array_equal(forward_logits(loaded, short), forward_logits(model, short))
    assert not np.allclose(forward_logits(loaded, long)[:, 4:], forward_logits(model, long)[:, 4:])
    assert load_model(tmp_path, max_context=16).config.max_position_embeddings == 16
    # no window (Mistral v0.2+): full attention
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["sliding_window"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(tmp_path).config.sliding_window is None


def test_qwen2_sliding_window_layers():
    """Qwen2: a window only with use_sliding_window, on the layers at or above max_window_layers."""
    cfg = _hf_cfg("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=4, max_position_embeddings=64,
                  max_window_layers=1)
    got = config_from_hf(cfg)
    assert [got.layer_window(i) for i in range(2)] == [None, 4]
    cfg["use_sliding_window"] = False
    assert config_from_hf(cfg).sliding_window is None
    with pytest.raises(ValueError, match="max_context"):
        config_from_hf(cfg, max_context=0)


def test_family_refusals():
    """What no family field expresses is refused by name."""
    cases = [
        (_hf_cfg("LlamaForCausalLM", rope_scaling={"rope_type": "longrope", "factor": 2.0}), "'longrope' is not supported"),
        (_hf_cfg("Phi3ForCausalLM", rope_scaling={"type": "su", "short_factor": [1.0], "long_factor": [1.0]}),
         "'su'.*LongRoPE"),
        (_hf_cfg("Phi3ForCausalLM", partial_rotary_factor=0.5), "partial_rotary_factor"),
        (_hf_cfg("LlamaForCausalLM", hidden_act="gelu"), "hidden_act = 'gelu'"),
        (_hf_cfg("Gemma3ForCausalLM", hidden_act="gelu_pytorch_tanh", use_bidirectional_attention=True),
         "use_bidirectional_attention"),
        (_hf_cfg("Gemma3ForConditionalGeneration"), "Gemma3ForConditionalGeneration.* is not supported"),
    ]
    for cfg, match in cases:
        with pytest.raises(ValueError, match=match):
            config_from_hf(cfg)


def test_config_round_trip_and_old_configs():
    """Family fields round-trip through to_dict / from_dict; a dict saved before they existed
    loads with Llama's defaults; config_to_hf refuses what a Llama cannot express."""
    cfg = _config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                  sliding_window=8, layer_types=["sliding_attention", "full_attention"], qk_norm=True,
                  hidden_act="gelu_pytorch_tanh", rms_norm_unit_offset=True, sandwich_norm=True,
                  scale_embeddings=True, query_pre_attn_scalar=12, attn_logit_softcapping=5.0,
                  final_logit_softcapping=8.0, rope_local_base_freq=100.0)
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = {k: v for k, v in _config().to_dict().items() if k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                 "num_hidden_layers", "num_attention_heads")}
    assert ModelConfig.from_dict(old) == ModelConfig(**old)
    with pytest.raises(ValueError, match="sliding_window = 8: a LlamaForCausalLM has sliding_window = None"):
        config_to_hf(dataclasses.replace(_config(), sliding_window=8))
    with pytest.raises(ValueError, match="ModelConfig.layer_types\\[0\\] = 'local'"):
        _config(sliding_window=4, layer_types=["local", "full_attention"])
    with pytest.raises(ValueError, match="ModelConfig.hidden_act = 'relu'"):
        _config(hidden_act="relu")


def _write_tokenizer(folder, words):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(words)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    return tok


_WORDS = ["<unk>", "<eos>", "def", "f", "(", ")", ":", "x", "return", "+", "1"] + [f"w{i}" for i in range(20)]


@pytest.mark.real
def test_hf_tokenizer(tmp_path):
    from jaxspec.formats.checkpoint import load_tokenizer
    from jaxspec.formats.hf_tokenizer import HFTokenizer
    from jaxspec.formats.tokenizer import ByteTokenizer

    _write_tokenizer(tmp_path, _WORDS)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == len(_WORDS) and tok.eos_id == 1
    ids = tok.encode("def f ( x ) : return x + 1")
    assert ids == [2, 3, 4, 7, 5, 6, 8, 7, 9, 10]
    assert tok.encode("x", add_eos=True) == [7, 1]
    assert tok.decode(np.array(ids + [-1])) == "def f ( x ) : return x + 1"
    assert isinstance(load_tokenizer("default-target"), ByteTokenizer)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_file(tmp_path / "nope")


def test_hf_tokenizer_not_installed(tmp_path, monkeypatch):
    import sys

    from jaxspec.formats.hf_tokenizer import HFTokenizer

    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"pip install .jaxspec\[tokenizers\]."):  # the small extra, no torch
        HFTokenizer.from_file(tmp_path)


def _pair(tmp_path, draft_vocab=40):
    target, draft = tmp_path / "target", tmp_path / "draft"
    save_model(init_model(_config(max_position_embeddings=64), jax.random.key(0)), target)
    save_model(init_model(_config(vocab_size=draft_vocab, num_hidden_layers=1, max_position_embeddings=64),
                          jax.random.key(1)), draft)
    return target, draft


@pytest.mark.real
def test_generate_cli_with_tokenizer_json(tmp_path, capsys):
    from jaxspec.cli import main

    target, draft = _pair(tmp_path)
    for folder in (target, draft):
        _write_tokenizer(folder, _WORDS)
    argv = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f ( x ) :",
            "--max-new-tokens", "6", "--temperature", "0", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_tokens"] == 6 and all(0 <= t < 40 for t in out["tokens"])
    assert main(argv + ["--baseline"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == out["tokens"]  # greedy: same text
    # a draft whose tokenizer.json differs is refused
    _write_tokenizer(draft, _WORDS[:-1] + ["other"])
    assert main(argv) == 2
    assert "vocabulary differs" in capsys.readouterr().err
    # so is a draft with the byte tokenizer
    (draft / "tokenizer.json").unlink()
    assert main(argv) == 2
    assert "byte-level" in capsys.readouterr().err


@pytest.mark.real
def test_generate_cli_refuses_vocab_mismatch(tmp_path, capsys):
    from jaxspec.cli import main

    target, draft = _pair(tmp_path, draft_vocab=48)
    for folder in (target, draft):  # one tokenizer: the models differ in their vocab_size alone
        _write_tokenizer(folder, _WORDS)
    argv = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f", "--max-new-tokens", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # the library's refusal (the drafter's check), named by the flag and its value
    assert f"--draft {draft}: vocab_size = 48; expected the target's vocab_size = 40" in err and "Traceback" not in err


def test_a_layer_count_beyond_the_weights_is_refused_before_building(tmp_path):
    """``num_hidden_layers = 100000`` in a 2-layer folder: refused from the tensor names, before
    a model of that many layers is built (that took minutes), naming the file and the key."""
    save_model(init_model(_config(), jax.random.key(0)), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 100000}))
    with pytest.raises(ValueError, match=r"config\.json: num_hidden_layers = 100000, but the weights hold the "
                                         r"tensors of 2 layers \(model\.layers\.0 to model\.layers\.1\); expected 2"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))  # layer 1's tensors left over
    with pytest.raises(ValueError, match=r"num_hidden_layers = 1, but the weights hold the tensors of 2 layers"):
        load_model(tmp_path)
