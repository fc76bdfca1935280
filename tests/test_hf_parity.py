"""Parity with Hugging Face ``transformers`` (optional: needs the ``hf`` extra — torch CPU
build, transformers, tokenizers; skipped without them).

Tiny random models are built with ``transformers`` on CPU, saved with ``save_pretrained``
(safetensors) and loaded by :func:`jaxspec.load_model`; logits must agree within 1e-4 in
float32 and greedy generation must be token-for-token identical. The other way round, a
jaxspec model written by ``jaxspec export`` loads in ``transformers`` with the same logits.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxspec.formats.checkpoint import load_model, save_model  # noqa: E402
from jaxspec.cli import main  # noqa: E402
from jaxspec.nn.config import ModelConfig  # noqa: E402
from jaxspec.decode.generate import generate, generate_autoregressive  # noqa: E402
from jaxspec.nn.model import forward_logits, init_model  # noqa: E402

from _hf_families import GREEDY, hf_greedy, hf_logits, row_tokens  # noqa: E402

V = 64
SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
PROMPT = [[3, 17, 42, 5, 9, 60, 1, 33]]
ATOL = 1e-4


def _hf_model(kind: str, seed: int = 0):
    """A tiny random transformers model; weights rescaled so logits are far from uniform
    (greedy argmax is then decided by clear margins, not by rounding)."""
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**SIZES, rope_theta=10000.0)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "mistral":
        cfg = transformers.MistralConfig(**SIZES, sliding_window=None)
        model = transformers.MistralForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**SIZES, tie_word_embeddings=(kind == "llama-tied"), rope_theta=500.0)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


KINDS = ["llama", "llama-tied", "qwen2", "mistral"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> (transformers model, folder written by save_pretrained)."""
    out = {}
    for kind in KINDS:
        model = _hf_model(kind, seed=KINDS.index(kind))
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder, safe_serialization=True)
        out[kind] = (model, folder)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(saved, kind):
    model, folder = saved[kind]
    assert (folder / "model.safetensors").is_file()
    ours = load_model(folder)
    assert ours.config.tie_word_embeddings == (kind == "llama-tied")
    assert ours.config.attention_bias == (kind == "qwen2")
    assert ours.config.num_key_value_heads == 2
    ids = [PROMPT[0] + [7, 8, 2, 63], list(range(12))]
    ref = hf_logits(model, ids)
    got = np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32)))
    assert np.abs(ref).max() > 1.0  # non-trivial logits
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_matches_transformers(saved, kind):
    model, folder = saved[kind]
    ref = hf_greedy(model, PROMPT, 20)
    ours = generate_autoregressive(jax.random.key(0), load_model(folder), PROMPT, max_new_tokens=20, stop_tokens=(),
                                   **GREEDY)  # as transformers with eos_token_id=None
    assert row_tokens(ours) == ref
    assert len(ref) == 20


def test_speculative_greedy_matches_transformers(saved):
    """Tree speculative decoding at temperature 0 with a (different) draft gives the
    target's greedy text, as transformers computes it."""
    model, folder = saved["llama"]
    ref = hf_greedy(model, PROMPT, 20)
    target, draft = load_model(folder), load_model(saved["llama-tied"][1])
    out = generate(jax.random.key(0), target, draft, PROMPT, tree="branch:2,1", scheme="deterministic",
                   max_new_tokens=20, stop_tokens=(), **GREEDY)
    assert row_tokens(out)[:20] == ref


def test_sharded_hf_checkpoint(saved, tmp_path):
    model, _ = saved["qwen2"]
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    got = np.asarray(forward_logits(load_model(tmp_path), jnp.asarray(PROMPT, jnp.int32)))
    np.testing.assert_allclose(got, hf_logits(model, PROMPT), atol=ATOL, rtol=0)


def test_bfloat16_load(saved):
    model, folder = saved["llama"]
    ours = load_model(folder, dtype="bfloat16")
    assert ours.embed_tokens.embedding[...].dtype == jnp.bfloat16
    got = np.asarray(forward_logits(ours, jnp.asarray(PROMPT, jnp.int32)))
    ref = hf_logits(model, PROMPT)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


@pytest.mark.parametrize("tie,bias", [(False, False), (True, True)])
def test_export_loads_in_transformers(tmp_path, tie, bias):
    cfg = ModelConfig(**SIZES, tie_word_embeddings=tie, attention_bias=bias, rope_theta=1000.0)
    ours = init_model(cfg, jax.random.key(3))
    save_model(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = [PROMPT[0], list(range(8))]
    np.testing.assert_allclose(hf_logits(hf, ids), np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32))),
                               atol=ATOL, rtol=0)


def test_cli_export_default_target(tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", "default-target", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "model.safetensors" in info["files"] and "config.json" in info["files"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = [[256] + list(b"def fibonacci(n):")]
    ref = hf_logits(hf, ids)
    got = np.asarray(forward_logits(load_model("default-target"), jnp.asarray(ids, jnp.int32)))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    # and the greedy continuation is the same
    n = 12
    hf.generation_config.eos_token_id = None
    ours = generate_autoregressive(jax.random.key(0), load_model(out), ids, max_new_tokens=n, stop_tokens=(),
                                   **GREEDY)
    assert row_tokens(ours) == hf_greedy(hf, ids, n)
