"""Tiny random ``transformers`` models of each family jaxspec loads, for the parity tests
(``tests/test_architectures.py``, ``tests/test_architectures_gguf.py``). Needs torch and
transformers (the callers skip themselves without them).

Sequences of 40 tokens run past every window here (5 to 7) and past the scaled ropes'
original context (16).
"""

import numpy as np
import torch
import transformers

from jaxspec.core.settings import Sampling

V = 64
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16)
PROMPT = [[3, 17, 42, 5, 9, 60, 1, 33]]
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def hf_config(kind: str):
    """(transformers class, config) of a tiny model of family ``kind``."""
    t = transformers
    if kind == "llama3":
        return t.LlamaForCausalLM, t.LlamaConfig(**BASE, rope_theta=10000.0, rope_scaling=LLAMA3)
    if kind == "yarn":
        return t.LlamaForCausalLM, t.LlamaConfig(**BASE, rope_theta=10000.0, rope_scaling={
            "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16})
    if kind == "linear":
        return t.LlamaForCausalLM, t.LlamaConfig(**BASE, rope_scaling={"rope_type": "linear", "factor": 2.0})
    if kind == "dynamic":
        return t.LlamaForCausalLM, t.LlamaConfig(**BASE, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    if kind == "qwen2":
        return t.Qwen2ForCausalLM, t.Qwen2Config(**BASE, use_sliding_window=True, sliding_window=6,
                                                 max_window_layers=1)
    if kind == "qwen3":
        return t.Qwen3ForCausalLM, t.Qwen3Config(**BASE, use_sliding_window=True, sliding_window=7,
                                                 max_window_layers=1)
    if kind == "mistral":
        return t.MistralForCausalLM, t.MistralConfig(**BASE, sliding_window=5)
    if kind == "gemma2":
        return t.Gemma2ForCausalLM, t.Gemma2Config(**BASE, sliding_window=6, query_pre_attn_scalar=12,
                                                   attn_logit_softcapping=5.0, final_logit_softcapping=8.0)
    if kind == "gemma3":
        sizes = dict(BASE, num_hidden_layers=3)
        return t.Gemma3ForCausalLM, t.Gemma3TextConfig(
            **sizes, sliding_window=6, query_pre_attn_scalar=16, sliding_window_pattern=2,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    if kind == "phi3":
        return t.Phi3ForCausalLM, t.Phi3Config(**BASE, sliding_window=6, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=None)
    # as llama.cpp reads them: Qwen without a window, Gemma's query scale head_dim (its rule for
    # all but the 27B models), Gemma 3's local base 10000 and period 6
    if kind == "qwen2-gguf":
        return t.Qwen2ForCausalLM, t.Qwen2Config(**BASE, use_sliding_window=False)
    if kind == "qwen3-gguf":
        return t.Qwen3ForCausalLM, t.Qwen3Config(**BASE, use_sliding_window=False)
    if kind == "gemma2-gguf":
        return t.Gemma2ForCausalLM, t.Gemma2Config(**BASE, sliding_window=6, query_pre_attn_scalar=16,
                                                   attn_logit_softcapping=5.0, final_logit_softcapping=8.0)
    if kind == "gemma3-gguf":
        return t.Gemma3ForCausalLM, t.Gemma3TextConfig(
            **dict(BASE, num_hidden_layers=6), sliding_window=6, query_pre_attn_scalar=16,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    raise AssertionError(kind)


KINDS = ["llama3", "yarn", "linear", "dynamic", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]


def hf_model(kind: str, seed: int):
    """A tiny random model; weights rescaled so logits are far from uniform (greedy argmax then
    decided by clear margins, not by rounding)."""
    torch.manual_seed(seed)
    cls, cfg = hf_config(kind)
    cfg.eos_token_id = None
    model = cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                offset = 0.0 if kind.startswith("gemma") else 1.0  # Gemma scales by 1 + w
                p.copy_(offset + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def hf_logits(model, ids) -> np.ndarray:
    """transformers' float32 logits of ``ids`` int[B, T]."""
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


def hf_greedy(model, ids, n: int) -> list[int]:
    """transformers' ``n`` greedy tokens after ``ids`` [[...]] (no stop token)."""
    with torch.no_grad():
        out = model.generate(torch.tensor(ids, dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids[0]):].tolist()


#: greedy decoding, as jaxspec.generate takes it
GREEDY = {"sampling": Sampling(temperature=0)}


def row_tokens(result) -> list[int]:
    """Row 0's emitted tokens of a jaxspec GenerateResult."""
    n = int(np.asarray(result.lengths)[0])
    return [int(t) for t in np.asarray(result.tokens)[0, :n]]
