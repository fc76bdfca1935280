"""Float drift between the verification forward and one-token forwards.

Speculative decoding is exact *given the verifier's logits*: the round scores the root and
its drafted nodes in one forward under the tree mask (``k + 1`` rows at positions ``L +
depth``), where target-only decoding runs one forward per token. Both compute the same
function, but in another order of float operations (matmuls over ``k + 1`` rows instead of
one, attention over another key layout), so their logits differ in the last bits, and the
decoder samples the verifier's law, not the one-token forward's. :func:`forward_drift`
measures the gap over given token sequences: each is scored token by token (a prefill of the
prompt, then one-token forwards with the KV cache, as
:func:`jaxspec.generate_autoregressive` runs) and in chunks of ``k + 1`` tokens under a
chain's tree mask (the verification forward of :func:`jaxspec.generate` when every drafted
token is accepted); it reports the largest ``|Δ logit|``, the total variation between the two
laws at temperature 1 per position, and the positions whose argmax differs.
:func:`jaxspec.verify`'s sampled path (real models) reports it for the configuration it
tests, over its first samples (``config["drift"]``). docs/EVIDENCE.md has the measurements
on SmolLM2-135M in float32 and bfloat16 (``benchmarks/float_drift.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.core import tree as treelib
from jaxspec.nn.masks import causal_cache_mask, tree_cache_mask
from jaxspec.nn.model import Transformer, prefill

__all__ = ["teacher_forced_logits", "forward_drift"]

_PROGRAMS: dict = {}


def _programs(model: Transformer, k: int, capacity: int):
    """``(state, one, chunk)``: the model's state and its jitted one-token and chunk forwards
    over a KV cache of ``capacity`` slots (made once per model, ``k`` and capacity)."""
    key = (id(model), k, capacity)
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    gdef, state = nnx.split(model)
    chain = (np.asarray(treelib.full_tree_mask(np.arange(-1, k - 1, dtype=np.int32))) if k > 0
             else np.ones((1, 1), bool))  # [k + 1, k + 1] ancestor-or-self over [root] + a chain of k

    @jax.jit
    def one(state, cache, tok):  # tok int32[1] at slot L -> (logits float32[V] after it, cache)
        m = nnx.merge(gdef, state)
        feats, cache = m.features(tok[None], cache.lengths[:, None], cache,
                                  causal_cache_mask(cache.lengths, 1, capacity))
        return m.unembed(feats)[0, 0], cache.replace(lengths=cache.lengths + 1)

    @jax.jit
    def chunk(state, cache, toks):  # toks int32[k + 1]: a root and a chain of k, positions L + depth
        m = nnx.merge(gdef, state)
        pos = cache.lengths[:, None] + jnp.arange(k + 1, dtype=jnp.int32)[None]
        feats, cache = m.features(toks[None], pos, cache, tree_cache_mask(cache.lengths, chain, capacity))
        return m.unembed(feats)[0], cache.replace(lengths=cache.lengths + k + 1)

    _PROGRAMS.clear()  # keep one model's programs (they hold its parameters' shapes, not the values)
    _PROGRAMS[key] = (state, one, chunk)
    return _PROGRAMS[key]


def teacher_forced_logits(model: Transformer, ids: Sequence[int], prompt_len: int, k: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """``(one_token, chunked)``, each ``float32[n, V]``: the logits of the laws after
    ``ids[prompt_len - 1 + j]`` for ``j < n`` (``n`` the tokens after the prompt's last one,
    rounded down to a multiple of ``k + 1``), by one-token forwards and by chunks of ``k + 1``
    under the tree mask of a chain."""
    ids = [int(t) for t in ids]
    start = prompt_len - 1  # the prompt's last token is the first root
    n = ((len(ids) - start) // (k + 1)) * (k + 1)
    capacity = -(-(len(ids) + k + 2) // 128) * 128  # a few sizes: the forwards compile once per size
    state, one, chunk = _programs(model, k, capacity)
    if start > 0:
        _, cache0 = prefill(model, jnp.asarray([ids[:start]], jnp.int32), jnp.asarray([start]), capacity)
    else:
        from jaxspec.nn.cache import init_cache  # noqa: PLC0415

        cache0 = init_cache(model.config, 1, capacity)
    a, cache = [], cache0
    for j in range(n):
        logits, cache = one(state, cache, jnp.asarray([ids[start + j]], jnp.int32))
        a.append(np.asarray(logits))
    b, cache = [], cache0
    for j in range(0, n, k + 1):
        logits, cache = chunk(state, cache, jnp.asarray(ids[start + j:start + j + k + 1], jnp.int32))
        b.append(np.asarray(logits))
    v = model.config.vocab_size
    return (np.stack(a) if a else np.zeros((0, v), np.float32)), (np.concatenate(b) if b else np.zeros((0, v)))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def forward_drift(model: Transformer, prompt: Sequence[int], samples: np.ndarray, k: int, *,
                  max_samples: int = 4) -> dict:
    """The drift over the first ``max_samples`` rows of ``samples`` int[S, L] (tokens emitted
    after ``prompt``), chunks of ``k + 1`` (``k`` cut to ``L - 1`` when the samples are
    shorter): ``max_abs_dlogit``, ``tv_mean`` and ``tv_max`` (per position, at T = 1),
    ``argmax_flips``, ``positions``, ``chunk``, ``dtype``."""
    samples = np.asarray(samples)
    horizon = samples.shape[1]
    k = max(0, min(int(k), horizon - 1))
    dl, tvs, flips = [], [], 0
    for row in samples[:max_samples]:
        a, b = teacher_forced_logits(model, list(prompt) + row.tolist(), len(prompt), k)
        if not len(a):
            continue
        dl.append(float(np.abs(a.astype(np.float64) - b).max()))
        tvs.append(0.5 * np.abs(_softmax(a) - _softmax(b)).sum(axis=-1))
        flips += int((a.argmax(-1) != b.argmax(-1)).sum())
    tv = np.concatenate(tvs) if tvs else np.zeros(0)
    return dict(samples=int(min(max_samples, len(samples))), positions=int(tv.size), chunk=k + 1,
                dtype=str(np.dtype(model.config.param_dtype)), max_abs_dlogit=max(dl) if dl else 0.0,
                tv_mean=float(tv.mean()) if tv.size else 0.0, tv_max=float(tv.max()) if tv.size else 0.0,
                argmax_flips=flips)
