"""Tiny random target/draft model pairs shared by the generation tests.

Random Flax models are near-uniform at initialization; the pairs here sharpen the LM heads
so that the next-token laws are context dependent, and build the draft from the target's
weights mixed with an independent model's, so that acceptance is neither ~0 nor ~1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.core import sampling
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import forward_logits, init_model


def tiny_config(vocab_size=4, hidden_size=8, num_heads=1, num_kv_heads=None, num_layers=1,
                max_positions=64) -> ModelConfig:
    """Default: V = 4, one layer, one 8-wide head (the cheapest model for 10^6-sample runs)."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads if num_kv_heads is None else num_kv_heads,
        rope_theta=10.0,
        max_position_embeddings=max_positions,
    )


def _scale_head(model, scale: float):
    model.lm_head.kernel[...] = model.lm_head.kernel[...] * scale
    return model


def tiny_pair(seed: int = 0, *, mix: float = 0.5, head_scale: float = 3.0, **config_kw):
    """(target, draft): the draft's parameters are ``(1 - mix) * target + mix * other``."""
    cfg = tiny_config(**config_kw)
    target = _scale_head(init_model(cfg, jax.random.key(seed)), head_scale)
    other = _scale_head(init_model(cfg, jax.random.key(seed + 1000)), head_scale)
    gdef, t_state = nnx.split(target)
    _, o_state = nnx.split(other)
    d_state = jax.tree.map(lambda a, b: (1.0 - mix) * a + mix * b, t_state, o_state)
    draft = nnx.merge(gdef, d_state)
    return target, draft


@functools.lru_cache(maxsize=None)
def _fwd():
    return nnx.jit(forward_logits)


def next_token_probs(model, seqs, *, shape=(16, 16), **warp) -> np.ndarray:
    """float32[len(seqs), V]: warped law after each sequence, from ``forward_logits``
    (right-padded into one fixed ``shape`` so that every call shares a compilation)."""
    rows, width = shape
    assert len(seqs) <= rows and max(map(len, seqs)) <= width, "enlarge shape"
    tokens = np.zeros(shape, np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    logits = _fwd()(model, jnp.asarray(tokens))  # [rows, width, V]
    last = logits[np.arange(len(seqs)), np.asarray([len(s) - 1 for s in seqs])]
    return np.asarray(sampling.warp_probs(last, **warp))


def exact_joint(model, prompt, length: int, **warp) -> np.ndarray:
    """Exact law (float64[V**length]) of the first ``length`` generated tokens after
    ``prompt`` under the warped target law, enumerated with ``forward_logits``: one
    forward over every ``prompt + y[:length-1]``. Cell index ``sum_i y_i V**(length-1-i)``."""
    v = model.config.vocab_size
    prompt = [int(t) for t in prompt]
    cells = np.arange(v**length)
    digits = np.stack(np.unravel_index(cells, (v,) * length), axis=1)  # [V^L, L]
    conts = digits[:: v, :-1]  # [V^(L-1), L-1]: continuation c = cell // V
    seqs = np.concatenate([np.tile(prompt, (conts.shape[0], 1)), conts], axis=1).astype(np.int32)
    logits = _fwd()(model, jnp.asarray(seqs))[:, len(prompt) - 1 :]  # [C, L, V]
    probs = np.asarray(sampling.warp_probs(logits, **warp), np.float64)
    probs /= probs.sum(axis=-1, keepdims=True)
    c = cells // v
    joint = np.ones(cells.shape, np.float64)
    for i in range(length):
        joint *= probs[c, i, digits[:, i]]
    return joint


def tiny_head(target, seed: int = 0):
    """A random :class:`~jaxspec.nn.head.FeatureHead` for ``target`` (its width, one layer):
    its draft law reads the target's features and LM head, so it is context dependent too."""
    from jaxspec.nn.head import head_config, init_head

    return init_head(head_config(target.config), jax.random.key(seed + 2000))


#: the drafters the generation tests run a case with (:func:`tiny_drafter`)
DRAFTERS = ("model", "head", "ngram")


def tiny_drafter(kind: str, target, draft):
    """The draft of kind ``kind`` in :data:`DRAFTERS` for ``target``: ``draft`` itself (a
    draft model), a tiny feature head of the target, or an n-gram draft."""
    from jaxspec.decode.ngram import NgramDraft

    return {"model": lambda: draft, "head": lambda: tiny_head(target), "ngram": lambda: NgramDraft(max_ngram=2)}[kind]()


def assert_same_results(a, b):
    """Two GenerateResults equal field by field (the field's name in the message)."""
    for name in type(a)._fields:
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
