"""The GGUF families of issue 38 (llama with a Llama 3.1 rope and with YaRN, qwen2, qwen3, gemma2,
gemma3):
a tiny random ``transformers`` model written to GGUF the way llama.cpp's converter writes it
(``tests/_gguf_writer.py``, with ``gguf.GGUFWriter``) loads with transformers' logits, within
1e-4 in float32, on sequences longer than the windows and than the rope's original context.
Needs torch, transformers and gguf (skipped without them).
"""

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from _gguf_writer import write_gguf  # noqa: E402
from _hf_families import PROMPT, hf_model  # noqa: E402
from jaxspec.formats.gguf import gguf_config, load_gguf  # noqa: E402
from jaxspec.nn.model import forward_logits  # noqa: E402

ATOL = 1e-4
FAMILIES = {"llama3": "llama", "yarn": "llama", "qwen2-gguf": "qwen2", "qwen3-gguf": "qwen3", "gemma2-gguf": "gemma2",
            "gemma3-gguf": "gemma3"}  # HF model kind -> general.architecture


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """kind -> (transformers model, GGUF path)."""
    out = {}
    for i, (kind, arch) in enumerate(FAMILIES.items()):
        model = hf_model(kind, seed=30 + i)
        tensors = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        cfg = model.config.to_dict()
        if cfg.get("tie_word_embeddings"):
            tensors.pop("lm_head.weight", None)
        path = tmp_path_factory.mktemp(kind) / f"{kind}.gguf"
        write_gguf(path, tensors, cfg, arch=arch)
        out[kind] = (model, path)
    return out


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_gguf_logits_match_transformers(written, kind):
    model, path = written[kind]
    ours = load_gguf(path)
    ids = [PROMPT[0] * 5, list(range(40))]
    with torch.no_grad():
        ref = model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()
    got = np.asarray(forward_logits(ours, jnp.asarray(ids, jnp.int32)))
    assert np.abs(ref).max() > 1.0
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_gguf_family_configs(written):
    cfg = {k: gguf_config(p) for k, (_, p) in written.items()}
    assert cfg["llama3"].rope_scaling.rope_type == "freq_factors"
    assert cfg["yarn"].rope_scaling.to_hf() == {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}
    assert cfg["qwen2-gguf"].attention_bias and cfg["qwen3-gguf"].qk_norm
    g2, g3 = cfg["gemma2-gguf"], cfg["gemma3-gguf"]
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping, g2.query_pre_attn_scalar) == (5.0, 8.0, 16.0)
    assert [g2.layer_window(i) for i in range(2)] == [6, None]
    assert not g2.rms_norm_unit_offset and g2.sandwich_norm and g2.tie_word_embeddings  # the file holds 1 + w
    assert [g3.layer_window(i) for i in range(6)] == [6] * 5 + [None]
    assert g3.layer_rope(0) == (10000.0, None) and g3.layer_rope(5)[1].to_hf() == {"rope_type": "linear", "factor": 2.0}
