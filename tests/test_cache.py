"""KV cache: init, advance and commit's slot movement on literal small caches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.nn.cache import KVCache, advance, commit, init_cache
from jaxspec.nn.config import ModelConfig

CFG = ModelConfig(
    vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2,
)


def _literal_cache(lengths):
    """L=2, B=2, S=8, Hkv=1, D=1; k[l, b, s] = 100*l + 10*b + s, v = -k."""
    l, b, s = np.meshgrid(np.arange(2), np.arange(2), np.arange(8), indexing="ij")
    k = (100 * l + 10 * b + s).astype(np.float32)[..., None, None]
    return KVCache(k=jnp.asarray(k), v=jnp.asarray(-k), lengths=jnp.asarray(lengths, jnp.int32))


def test_init_cache_shapes_and_dtype():
    c = init_cache(CFG, 3, 10)
    assert c.k.shape == c.v.shape == (2, 3, 10, 2, 4)
    assert c.k.dtype == jnp.float32 and c.lengths.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(c.lengths), [0, 0, 0])
    assert init_cache(CFG, 1, 4, dtype=jnp.bfloat16).k.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="capacity"):
        init_cache(CFG, 1, 0)


def test_advance():
    c = advance(_literal_cache([1, 2]), jnp.array([3, 0]))
    np.testing.assert_array_equal(np.asarray(c.lengths), [4, 2])
    np.testing.assert_array_equal(np.asarray(advance(c, 1).lengths), [5, 3])


@pytest.mark.parametrize("jit", [False, True])
def test_commit_literal(jit):
    cache = _literal_cache([1, 2])
    # row 0 keeps new tokens 0, 2, 5 -> slots 1, 2, 3 <- slots 1, 3, 6
    # row 1 keeps new token 1       -> slot 2 <- slot 3
    offsets = jnp.array([[0, 2, 5], [1, -1, -1]], jnp.int32)
    num = jnp.array([3, 1], jnp.int32)
    f = jax.jit(commit) if jit else commit
    out = f(cache, offsets, num)
    k = np.asarray(out.k)[..., 0, 0]
    np.testing.assert_array_equal(k[0, 0], [0, 1, 3, 6, 4, 5, 6, 7])
    np.testing.assert_array_equal(k[0, 1], [10, 11, 13, 13, 14, 15, 16, 17])
    np.testing.assert_array_equal(k[1, 0], [100, 101, 103, 106, 104, 105, 106, 107])
    np.testing.assert_array_equal(np.asarray(out.v), -np.asarray(out.k))
    np.testing.assert_array_equal(np.asarray(out.lengths), [4, 3])


def test_commit_gathers_before_writing():
    # Sources that a sequential in-place loop would overwrite before reading:
    # slot 0 <- 2, slot 1 <- 0, slot 2 <- 1 (a rotation).
    cache = _literal_cache([0, 0])
    out = commit(cache, jnp.array([[2, 0, 1], [0, 1, 2]]), jnp.array([3, 0]))
    k = np.asarray(out.k)[0, :, :, 0, 0]
    np.testing.assert_array_equal(k[0], [2, 0, 1, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(k[1], np.arange(10, 18))  # num = 0: untouched
    np.testing.assert_array_equal(np.asarray(out.lengths), [3, 0])


def test_commit_vmap_matches_batched():
    cache = _literal_cache([1, 2])
    offsets = jnp.array([[0, 2, 5], [1, 3, -1]], jnp.int32)
    num = jnp.array([3, 2], jnp.int32)

    def one_row(k, v, length, off, n):  # k: [L, S, H, D]
        c = KVCache(k=k[:, None], v=v[:, None], lengths=length[None])
        c = commit(c, off[None], n[None])
        return c.k[:, 0], c.v[:, 0], c.lengths[0]

    k, v, lengths = jax.vmap(one_row, in_axes=(1, 1, 0, 0, 0), out_axes=(1, 1, 0))(
        cache.k, cache.v, cache.lengths, offsets, num
    )
    ref = commit(cache, offsets, num)
    np.testing.assert_array_equal(np.asarray(k), np.asarray(ref.k))
    np.testing.assert_array_equal(np.asarray(lengths), np.asarray(ref.lengths))
