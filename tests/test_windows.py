"""Sliding-window attention in the cache masks (no optional dependencies): the mask drawn in
:mod:`jaxspec.nn.masks`; prefill, one-token decode and tree verification of a model with
windowed and global layers equal the cache-free causal forward along every path, on sequences
far longer than the window; a window at least as long as the cache costs nothing (the same
program as no window).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.tree import tree_mask
from jaxspec.nn.cache import advance
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.masks import cache_key_positions, causal_cache_mask, tree_cache_mask, window_mask
from flax import nnx

from jaxspec.nn.model import decode_step, forward_logits, init_model, prefill

# Gemma-2-like: every family field at once, windowed and global layers alternating
CFG = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, sliding_window=3,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"], hidden_act="gelu_pytorch_tanh",
                  rms_norm_unit_offset=True, sandwich_norm=True, scale_embeddings=True, qk_norm=True,
                  query_pre_attn_scalar=6, attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                  rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
ATOL = 2e-5
_forward = nnx.jit(forward_logits)
_prefill = nnx.jit(prefill, static_argnames="capacity")
_decode = nnx.jit(decode_step)


@nnx.jit
def _call(model, tokens, positions, cache, mask):
    return model(tokens, positions, cache, mask)


def test_window_mask_literal():
    """The docstring's example: lengths 5, W = 3, two new tokens at positions 5, 6."""
    lengths, pos = jnp.array([5]), jnp.array([[5, 6]])
    m = window_mask(causal_cache_mask(lengths, 2, 8), pos, cache_key_positions(lengths, pos, 8), 3)
    np.testing.assert_array_equal(np.asarray(m[0], int), [[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0]])


def test_key_positions_of_a_tree():
    """Tree nodes' slots hold their depth-based positions, committed slots their index."""
    got = cache_key_positions(jnp.array([3]), jnp.array([[3, 4, 4, 5]]), 9)
    np.testing.assert_array_equal(np.asarray(got[0]), [0, 1, 2, 3, 4, 4, 5, 7, 8])


def test_decode_and_tree_verification_equal_causal_forward():
    model = init_model(CFG, jax.random.key(0))
    seq = jax.random.randint(jax.random.key(1), (1, 14), 0, CFG.vocab_size, dtype=jnp.int32)
    ref = np.asarray(_forward(model, seq))  # [1, 14, V]

    # prefill 8 tokens (past the window), then decode 3 one at a time
    logits, cache = _prefill(model, seq[:, :8], jnp.array([8]), capacity=24)
    np.testing.assert_allclose(np.asarray(logits), ref[:, :8], atol=ATOL, rtol=0)
    for t in range(8, 11):
        step, cache = _decode(model, cache, seq[:, t])
        np.testing.assert_allclose(np.asarray(step), ref[:, t], atol=ATOL, rtol=0)

    # a tree over [root, a, b, c, d] after 11 committed tokens (parents -1, 0, 1, 0, -1):
    # root -> a -> b is the true continuation (tokens 11, 12, 13); c and d are off the path
    root = [int(seq[0, 11])]
    toks = jnp.array([root + [int(seq[0, 12]), int(seq[0, 13]), 7, 9]], jnp.int32)  # [1, 5]
    tm = tree_mask(np.array([-1, 0, 1, 0, -1]))  # root a b c d as one tree rooted at slot 0
    depth = np.asarray(tm).sum(axis=1) - 1
    pos = cache.lengths[:, None] + jnp.asarray(depth)[None]
    mask = tree_cache_mask(cache.lengths, tm, cache.capacity)
    out, _ = _call(model, toks, pos, cache, mask)  # [1, 5, V]
    np.testing.assert_allclose(np.asarray(out[:, :3]), ref[:, 11:14], atol=ATOL, rtol=0)
    # off-path nodes see their own causal sequence: c after the root, d in the root's place
    for node, keep, tok in ((3, 12, 7), (4, 11, 9)):
        alt = jnp.concatenate([seq[:, :keep], jnp.array([[tok]], jnp.int32)], axis=1)
        np.testing.assert_allclose(np.asarray(out[:, node]), np.asarray(_forward(model, alt))[:, keep],
                                   atol=ATOL, rtol=0)


def test_window_longer_than_cache_costs_nothing():
    """A window of at least the S cache slots builds no mask: the program is the full-attention one."""
    base = dataclasses.replace(CFG, rope_local_base_freq=None)  # one rope: only the window differs
    full = init_model(dataclasses.replace(base, sliding_window=None, layer_types=None), jax.random.key(0))
    long = init_model(dataclasses.replace(base, sliding_window=16), jax.random.key(0))
    toks = jnp.zeros((1, 4), jnp.int32)

    def program(m):  # the primitives the program runs, in order
        jaxpr = jax.make_jaxpr(lambda t: prefill(m, t, jnp.array([4]), capacity=16)[0])(toks)
        return [e.primitive.name for e in jaxpr.eqns]

    assert program(full) == program(long)
    assert program(full) != program(init_model(dataclasses.replace(base, sliding_window=15), jax.random.key(0)))
