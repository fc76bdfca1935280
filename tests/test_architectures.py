"""The architectures people load today, against Hugging Face ``transformers`` (optional: needs
the ``hf`` extra; skipped without it).

One tiny random model per family (scaled rope: llama3, yarn, linear, dynamic; Qwen2 and Qwen3
with sliding layers; Mistral's window; Gemma 2; Gemma 3; Phi-3), saved with ``save_pretrained``
and loaded by :func:`jaxspec.load_model`. Sequences run longer than every window and than the
scaled ropes' original context. Each family: float32 logits within 1e-4 of transformers', 30
greedy tokens equal to ``generate(do_sample=False)`` target-only and tree-speculative (the
model drafting for itself, and a second tiny model of the same vocabulary drafting for it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxspec.decode.generate import generate, generate_autoregressive  # noqa: E402
from jaxspec.formats.checkpoint import load_model  # noqa: E402
from jaxspec.nn.model import forward_logits  # noqa: E402

from _hf_families import GREEDY, KINDS, PROMPT, hf_greedy, hf_logits, hf_model, row_tokens  # noqa: E402

N_NEW = 30
ATOL = 1e-4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> (transformers model, jaxspec model loaded from its save_pretrained folder, the folder)."""
    out = {}
    for i, kind in enumerate(KINDS):
        model = hf_model(kind, seed=10 + i)
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder, safe_serialization=True)
        out[kind] = (model, load_model(folder), folder)
    return out


def test_families_configure_one_model(saved):
    """What each family adds is configuration of the one Transformer."""
    cfg = {k: m.config for k, (_, m, _) in saved.items()}
    assert cfg["llama3"].rope_scaling.rope_type == "llama3" and cfg["yarn"].rope_scaling.rope_type == "yarn"
    assert [cfg["qwen2"].layer_window(i) for i in range(2)] == [None, 6]
    assert cfg["qwen3"].qk_norm and [cfg["qwen3"].layer_window(i) for i in range(2)] == [None, 7]
    assert [cfg["mistral"].layer_window(i) for i in range(2)] == [5, 5]
    g2, g3 = cfg["gemma2"], cfg["gemma3"]
    assert g2.sandwich_norm and g2.rms_norm_unit_offset and g2.scale_embeddings and g2.hidden_act == "gelu_pytorch_tanh"
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping, g2.query_pre_attn_scalar) == (5.0, 8.0, 12.0)
    assert [g2.layer_window(i) for i in range(2)] == [6, None]
    assert g3.qk_norm and [g3.layer_window(i) for i in range(3)] == [6, None, 6]
    assert g3.layer_rope(0) == (100.0, None) and g3.layer_rope(1)[0] == 1000.0
    assert cfg["phi3"].sliding_window == 6
    assert len({type(m) for _, m, _ in saved.values()}) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(saved, kind):
    model, ours, _ = saved[kind]
    ids = [PROMPT[0] * 5, list(range(40))]  # 40 tokens: past every window and the 16-token original context
    ref = hf_logits(model, ids)
    got = np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32)))
    assert np.abs(ref).max() > 1.0  # non-trivial logits
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


# linear and dynamic rope differ from llama3 / yarn only in the frequencies their logits test checks
GEN_KINDS = [k for k in KINDS if k not in ("linear", "dynamic")]
# target family -> the family of the second tiny model (same vocabulary) drafting for it; the
# windowed families, each drafted for by another (a few, to keep the step short)
OTHER_DRAFT = {"mistral": "llama3", "qwen3": "gemma2", "gemma2": "phi3", "gemma3": "qwen2"}


@pytest.mark.parametrize("kind", GEN_KINDS)
def test_greedy_generation_matches_transformers(saved, kind):
    """30 greedy tokens, target-only and tree-speculative (self draft; for OTHER_DRAFT's families a
    second model drafting too)."""
    model, ours, _ = saved[kind]
    ref = hf_greedy(model, PROMPT, N_NEW)
    assert len(ref) == N_NEW
    got = generate_autoregressive(jax.random.key(0), ours, PROMPT, max_new_tokens=N_NEW, stop_tokens=(),
                                  **GREEDY)
    assert row_tokens(got) == ref
    drafts = [ours]
    if kind in OTHER_DRAFT:  # a second model drafting: rejected branches, partial commits under windows
        drafts.append(saved[OTHER_DRAFT[kind]][1])
    for draft in drafts:
        out = generate(jax.random.key(1), ours, draft, PROMPT, tree="branch:2,2,1", scheme="deterministic",
                       max_new_tokens=N_NEW, stop_tokens=(), **GREEDY)
        assert row_tokens(out)[:N_NEW] == ref
        if draft is ours:  # the draft's windowed tree steps see what the target sees: every
            # round accepts the whole greedy chain (3 nodes) plus the target's own token
            assert out.summary()["tokens_per_target_call"] >= 3.5


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_bfloat16_load(saved, kind):
    """bfloat16 parameters (Gemma's embedding scale rounded to bfloat16, as transformers does):
    finite logits close to float32's."""
    model, _, folder = saved[kind]
    ours = load_model(folder, dtype="bfloat16")
    ids = [PROMPT[0] * 5]
    got = np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32)))
    ref = hf_logits(model, ids)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
