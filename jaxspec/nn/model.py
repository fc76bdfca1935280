"""A decoder-only transformer in Flax NNX, with an explicit KV cache: Llama, and the families
that differ from it only in :class:`~jaxspec.nn.config.ModelConfig` fields (Qwen2/3, Mistral,
Gemma 2/3, Phi-3). One code path serves them all; the configuration says which norms exist and
how they scale, the activation, the soft caps, and each layer's rope and sliding window.

One forward signature serves prefill, one-token decode and tree verification::

    logits, cache = model(tokens, positions, cache, attention_mask)
    # tokens int32[B, T], positions int32[B, T], attention_mask bool[B, T, S]
    # -> logits float32[B, T, V]; new K/V written at slots cache.lengths[b] + t

The forward writes but never commits: ``cache.lengths`` is unchanged; the caller keeps
tokens with :func:`jaxspec.nn.cache.advance` (contiguous) or :func:`jaxspec.nn.cache.commit`
(an accepted tree path). Positions and masks are inputs, never derived here::

    # tree verification of N draft nodes (the root = last committed token)
    tm = jaxspec.tree_mask(parents)                             # bool[N, N]
    pos = jaxspec.tree_positions(parents, cache.lengths)        # int32[B, N]
    mask = tree_cache_mask(cache.lengths, tm, cache.capacity)   # bool[B, N, S]
    logits, cache = model(node_tokens, pos, cache, mask)        # node j at slot lengths + j

Every forward runs under ``jax.named_scope("forward")`` (:data:`FORWARD_SCOPE`), so a profile
tells model work from the work around it.

Numerics: parameters and the KV cache in ``config.dtype`` (float32 or bfloat16); the
residual stream, RMSNorm, rotary embedding, attention scores/softmax and logits in
float32. A quantized model (:func:`jaxspec.nn.quant.quantize_model`) has int8
:class:`~jaxspec.nn.int8.QuantLinear` layers in place of every ``nnx.Linear`` and as its LM
head (tied or not); the code below is the same. Masked scores use the most negative
float32, so a fully masked row yields a uniform average over the cache instead of NaN.

Parameter names map 1:1 onto Hugging Face tensors of every family (Phi-3's fused projections
are split on load) (Linear kernels are
stored ``[in, out]``, i.e. the transpose of HF ``weight``)::

    model.embed_tokens.weight                   embed_tokens.embedding        [V, D]
    model.layers.{i}.self_attn.q_proj.weight    layers[i].self_attn.q_proj.kernel (T)
    model.layers.{i}.self_attn.q_proj.bias      layers[i].self_attn.q_proj.bias  (q/k/v, if attention_bias)
    ... k_proj, v_proj, o_proj                  ... same pattern
    model.layers.{i}.mlp.{gate,up,down}_proj.weight   layers[i].mlp.{gate,up,down}_proj.kernel (T)
    model.layers.{i}.input_layernorm.weight     layers[i].input_layernorm.weight
    model.layers.{i}.post_attention_layernorm.weight  layers[i].post_attention_layernorm.weight
    model.layers.{i}.self_attn.{q,k}_norm.weight      layers[i].self_attn.{q,k}_norm.weight (qk_norm)
    model.layers.{i}.{pre,post}_feedforward_layernorm.weight  layers[i]... (sandwich_norm)
    model.norm.weight                           norm.weight
    lm_head.weight                              lm_head.kernel (T)   (absent when tied)

Under ``jax.jit``: either ``nnx.jit`` (modules may be passed directly)::

    step = nnx.jit(decode_step)
    logits, cache = step(model, cache, token)
    prefill_jit = nnx.jit(prefill, static_argnames="capacity")

or the functional form, splitting once and merging inside the traced function::

    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, donate_argnums=2)
    def verify(state, tokens, cache, positions, mask):
        model = nnx.merge(graphdef, state)
        return model(tokens, positions, cache, mask)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.checks import is_concrete
from jaxspec.nn.cache import KVCache, advance, init_cache
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.masks import cache_key_positions, causal_cache_mask, window_mask
from jaxspec.nn.int8 import QuantLinear
from jaxspec.nn.rope import RopeScaling
from jaxspec.nn.rope import inv_freq as rope_inv_freq

__all__ = [
    "check_transformer",
    "RMSNorm",
    "Attention",
    "MLP",
    "DecoderLayer",
    "Transformer",
    "init_model",
    "forward_logits",
    "forward_features",
    "forward_taps",
    "check_tap_layers",
    "tap",
    "prefill",
    "decode_step",
    "apply_rope",
    "write_and_attend",
    "FORWARD_SCOPE",
]

#: the :func:`jax.named_scope` of every model forward (the decoder stack and the LM head),
#: so that a profile of a round separates model work from the rest
#: (:mod:`jaxspec.bench.scopes`)
FORWARD_SCOPE = "forward"

_F32 = jnp.float32
_MASKED = float(jnp.finfo(jnp.float32).min)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """HF Llama rotary embedding ("rotate_half" convention), computed in float32.

    x: ``[B, T, H, D]``; positions: ``int32[B, T]``; ``inv_freq[i] = theta^(-2i/D)``, or the
    frequencies of ``scaling`` (:func:`jaxspec.nn.rope.inv_freq`), whose attention factor
    (YaRN) multiplies cos and sin.
    """
    d = x.shape[-1]
    if scaling is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=_F32) / d))  # [D/2]
        factor = 1.0
    else:
        inv_freq = jnp.asarray(rope_inv_freq(d, theta, scaling))  # [D/2], a compile-time constant
        factor = scaling.attention_factor_value()
    freqs = positions.astype(_F32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    x32 = x.astype(_F32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2 :]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


class RMSNorm(nnx.Module):
    """``x / rms(x) * weight`` in float32 (returns float32); ``* (1 + weight)`` with
    ``unit_offset`` (Gemma's norms, whose stored weights are offsets from one)."""

    def __init__(self, dim: int, eps: float, dtype, unit_offset: bool = False):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))  # [D]
        self.eps = eps
        self.unit_offset = unit_offset

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(_F32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...].astype(_F32)
        return x * (1.0 + w) if self.unit_offset else x * w


def _norm(config: ModelConfig, dim: int) -> RMSNorm:
    return RMSNorm(dim, config.rms_norm_eps, config.param_dtype, config.rms_norm_unit_offset)


def _linear(d_in: int, d_out: int, config: ModelConfig, rngs: nnx.Rngs, bias: bool = False):
    pd = config.param_dtype
    return nnx.Linear(d_in, d_out, use_bias=bias, dtype=pd, param_dtype=pd, rngs=rngs)


class Attention(nnx.Module):
    """Grouped-query attention. Split in two so the caller owns the K/V plumbing:
    :meth:`project` makes q, k, v (k after RoPE); :meth:`attend` attends over given K/V.

    ``layer``: the index in the decoder stack, which picks the layer's rotary embedding
    (:meth:`ModelConfig.layer_rope`); None (a draft head's layer) -> the global one."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, layer: int | None = None):
        d, h, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = _linear(d, h * hd, config, rngs, bias=config.attention_bias)
        self.k_proj = _linear(d, kv * hd, config, rngs, bias=config.attention_bias)
        self.v_proj = _linear(d, kv * hd, config, rngs, bias=config.attention_bias)
        self.o_proj = _linear(h * hd, d, config, rngs)
        if config.qk_norm:  # per-head norms over head_dim (Qwen3, Gemma 3)
            self.q_norm = _norm(config, hd)
            self.k_norm = _norm(config, hd)
        self.qk_norm = config.qk_norm
        self.num_heads, self.num_kv_heads, self.head_dim = h, kv, hd
        self.rope_theta, self.rope_scaling = (config.rope_theta, config.rope_scaling) if layer is None \
            else config.layer_rope(layer)
        self.scale = (config.query_pre_attn_scalar if config.query_pre_attn_scalar is not None else hd) ** -0.5
        self.softcap = config.attn_logit_softcapping

    def project(self, x: jax.Array, positions: jax.Array):
        """x ``[B, T, D]`` (normed) -> q ``[B, T, H, hd]``, k, v ``[B, T, Hkv, hd]``."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:  # normed in float32, back to the projections' dtype (as transformers)
            q, k = self.q_norm(q).astype(q.dtype), self.k_norm(k).astype(k.dtype)
        rope = (positions, self.rope_theta, self.rope_scaling)
        return apply_rope(q, *rope), apply_rope(k, *rope), v

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """q ``[B, T, H, hd]``, k/v ``[B, S, Hkv, hd]``, mask ``bool[B, T, S]`` -> ``[B, T, D]`` f32."""
        b, t, h, hd = q.shape
        g = h // self.num_kv_heads
        q = q.reshape(b, t, self.num_kv_heads, g, hd)  # [B, T, Hkv, G, hd]
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=_F32)
        scores = scores * self.scale  # [B, Hkv, G, T, S]
        if self.softcap is not None:  # Gemma 2: c * tanh(s / c), before the mask
            scores = jnp.tanh(scores / self.softcap) * self.softcap
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=_F32)
        out = out.reshape(b, t, h * hd)
        return self.o_proj(out).astype(_F32)


class MLP(nnx.Module):
    """Gated MLP, no bias: ``down(act(gate(x)) * up(x))``; ``act`` SiLU (SwiGLU) or the tanh
    GELU (GeGLU), per ``config.hidden_act``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, i = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(d, i, config, rngs)
        self.up_proj = _linear(d, i, config, rngs)
        self.down_proj = _linear(i, d, config, rngs)
        self.hidden_act = config.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = self.gate_proj(x)
        act = jax.nn.silu(gate) if self.hidden_act == "silu" else jax.nn.gelu(gate, approximate=True)
        return self.down_proj(act * self.up_proj(x)).astype(_F32)


class DecoderLayer(nnx.Module):
    """Pre-norm block. ``project`` then ``finish``; the K/V between them is the caller's.

    ``layer`` (the index in the stack) picks the rotary embedding and the sliding window
    (``sliding_window``: None for full attention; :func:`write_and_attend` narrows the mask
    with it); None (a draft head's layer): global rope, full attention. With
    ``config.sandwich_norm`` (Gemma 2/3) ``post_attention_layernorm`` normalises the attention
    output and ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` wrap the MLP, as
    in Hugging Face; without, ``post_attention_layernorm`` is the MLP's input norm (Llama)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, layer: int | None = None):
        self.input_layernorm = _norm(config, config.hidden_size)
        self.self_attn = Attention(config, rngs=rngs, layer=layer)
        self.post_attention_layernorm = _norm(config, config.hidden_size)
        self.mlp = MLP(config, rngs=rngs)
        if config.sandwich_norm:
            self.pre_feedforward_layernorm = _norm(config, config.hidden_size)
            self.post_feedforward_layernorm = _norm(config, config.hidden_size)
        self.sandwich_norm = config.sandwich_norm
        self.sliding_window = None if layer is None else config.layer_window(layer)

    def project(self, x: jax.Array, positions: jax.Array):
        """Residual ``x [B, T, D]`` -> (q, k, v) of the new tokens."""
        return self.self_attn.project(self.input_layernorm(x), positions)

    def finish(self, x, q, k, v, mask) -> jax.Array:
        """Attention over k/v ``[B, S, Hkv, hd]`` under mask, residual, MLP, residual."""
        a = self.self_attn.attend(q, k, v, mask)
        if not self.sandwich_norm:
            x = x + a
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Transformer(nnx.Module):
    """Llama-family decoder. See the module docstring for the forward contract."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, ModelConfig):
            raise ValueError(f"Transformer: config = {type(config).__name__}; expected a ModelConfig")
        pd = config.param_dtype
        self.config = config
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, dtype=pd, param_dtype=pd, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs, layer=i) for i in range(config.num_hidden_layers)])
        self.norm = _norm(config, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, config, rngs)

    def embed(self, tokens: jax.Array) -> jax.Array:
        """``int32[B, T]`` -> float32 ``[B, T, D]``. Out-of-range ids (e.g. -1 padding) are clipped.
        With ``scale_embeddings`` (Gemma) times ``sqrt(hidden_size)``, rounded to and multiplied
        in the parameter dtype as transformers does."""
        table = self.embed_tokens.embedding[...]  # [V, D]
        x = jnp.take(table, tokens, axis=0, mode="clip")
        if self.config.scale_embeddings:
            x = x * jnp.asarray(self.config.hidden_size**0.5, table.dtype)
        return x.astype(_F32)

    def unembed(self, h: jax.Array) -> jax.Array:
        """Features ``[B, T, D]`` (after the final norm, see :meth:`features`) -> float32
        logits ``[B, T, V]`` through the LM head (the embedding when tied). A feature-level
        draft head (:class:`jaxspec.nn.head.FeatureHead`) reads its logits here too."""
        with jax.named_scope(FORWARD_SCOPE):
            if isinstance(self.lm_head, QuantLinear):  # W8A8 (jaxspec.nn.int8), tied or not
                logits = self.lm_head(h)
            else:
                w = self.embed_tokens.embedding[...].T if self.lm_head is None else self.lm_head.kernel[...]  # [D, V]
                logits = jnp.einsum("btd,dv->btv", h.astype(self.config.param_dtype), w, preferred_element_type=_F32)
            cap = self.config.final_logit_softcapping
            return logits if cap is None else jnp.tanh(logits / cap) * cap  # Gemma 2

    def unembed_rows(self, h: jax.Array, ids: jax.Array) -> jax.Array:
        """:meth:`unembed` at the vocabulary entries ``ids int32[K]`` only: ``[B, T, D]`` ->
        float32 ``[B, T, K]``, equal to ``unembed(h)[..., ids]`` at a K / V share of its cost
        (a reduced-vocabulary draft head, :class:`jaxspec.nn.head.FeatureHead`)."""
        with jax.named_scope(FORWARD_SCOPE):
            if isinstance(self.lm_head, QuantLinear):
                logits = self.lm_head(h, columns=ids)
            else:
                if self.lm_head is None:
                    w = jnp.take(self.embed_tokens.embedding[...], ids, axis=0).T  # [D, K]
                else:
                    w = jnp.take(self.lm_head.kernel[...], ids, axis=1)  # [D, K]
                logits = jnp.einsum("btd,dk->btk", h.astype(self.config.param_dtype), w, preferred_element_type=_F32)
            cap = self.config.final_logit_softcapping
            return logits if cap is None else jnp.tanh(logits / cap) * cap

    def logits(self, x: jax.Array) -> jax.Array:
        """Residual ``[B, T, D]`` -> final norm -> float32 logits ``[B, T, V]``."""
        return self.unembed(self.norm(x))

    def __call__(
        self,
        tokens: jax.Array,  # int32[B, T]
        positions: jax.Array,  # int32[B, T]
        cache: KVCache,
        attention_mask: jax.Array,  # bool[B, T, S]
    ) -> tuple[jax.Array, KVCache]:  # float32[B, T, V], cache with K/V written
        """Write the T new K/V at slots ``cache.lengths[b] + t`` (writes past S are
        dropped), attend over all S slots under ``attention_mask``; lengths unchanged."""
        h, cache = self.features(tokens, positions, cache, attention_mask)
        return self.unembed(h), cache

    def features(
        self,
        tokens: jax.Array,  # int32[B, T]
        positions: jax.Array,  # int32[B, T]
        cache: KVCache,
        attention_mask: jax.Array,  # bool[B, T, S]
        taps: tuple[int, ...] = (),
    ) -> tuple[jax.Array, KVCache]:  # float32[B, T, D] ([B, T, (k + 1) D] with k taps), cache
        """The forward of :meth:`__call__` up to the LM head: the last layer's residual after
        the final norm (float32 ``[B, T, D]``), the features a feature-level draft head reads.
        ``unembed(features(...)[0])`` is ``__call__``'s logits, bit for bit.

        ``taps`` (layer indices, static): the unit-RMS residuals after those layers
        (:func:`tap`, as :func:`forward_taps` computes them) come first, the features last:
        ``[B, T, (k + 1) D]``, whose last D columns are the features (a multi-layer head's
        input)."""
        tokens = jnp.asarray(tokens)
        positions = jnp.asarray(positions)
        attention_mask = jnp.asarray(attention_mask)
        _check_forward_shapes(self.config, tokens, positions, cache, attention_mask)
        with jax.named_scope(FORWARD_SCOPE):
            if not taps:
                x, cache = write_and_attend(self.layers, self.embed(tokens), positions, cache, attention_mask)
                return self.norm(x), cache
            x, cache, tapped = write_and_attend(self.layers, self.embed(tokens), positions, cache, attention_mask,
                                                taps=taps)
            return jnp.concatenate([*tapped, self.norm(x)], axis=-1), cache


def write_and_attend(layers, x, positions, cache: KVCache, attention_mask, taps: tuple[int, ...] = ()):
    """The decoder stack with the cache plumbing: residual ``x [B, T, D]`` through
    ``layers`` (``cache`` has one K/V plane per layer), each writing its new K/V at slots
    ``cache.lengths[b] + t`` (writes past S are dropped) and attending over all S slots under
    ``attention_mask bool[B, T, S]``. Returns the last residual and the written cache, and
    with ``taps`` (layer indices) a third item, the list of :func:`tap` residuals after those layers."""
    b, t = x.shape[:2]
    rows = jnp.arange(b, dtype=jnp.int32)[:, None]  # [B, 1]
    slots = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
    k_all, v_all = cache.k, cache.v  # [L, B, S, Hkv, hd]
    masks = _LayerMasks(attention_mask, positions, lambda: cache_key_positions(cache.lengths, positions, cache.capacity))
    tapped = []
    for i, layer in enumerate(layers):
        q, k, v = layer.project(x, positions)
        k_all = k_all.at[i, rows, slots].set(k.astype(k_all.dtype), mode="drop")
        v_all = v_all.at[i, rows, slots].set(v.astype(v_all.dtype), mode="drop")
        x = layer.finish(x, q, k_all[i], v_all[i], masks.of(layer))
        if i in taps:
            tapped.append(tap(x))
    return (x, cache.replace(k=k_all, v=v_all)) + ((tapped,) if taps else ())


class _LayerMasks:
    """Each layer's mask: the given one, narrowed to its sliding window (built once per window
    length, and only for a window shorter than the S keys: a longer one changes nothing, since
    every position is below S)."""

    def __init__(self, mask, positions, key_positions):
        self.mask, self.positions, self.key_positions = mask, positions, key_positions
        self.keys = None
        self.windowed = {}

    def of(self, layer) -> jax.Array:
        w = getattr(layer, "sliding_window", None)
        if w is None or w >= self.mask.shape[-1]:
            return self.mask
        if w not in self.windowed:
            if self.keys is None:
                self.keys = self.key_positions()  # [B, S]
            self.windowed[w] = window_mask(self.mask, self.positions, self.keys, w)
        return self.windowed[w]


def _check_forward_shapes(config, tokens, positions, cache, mask) -> None:
    if tokens.ndim != 2:
        raise ValueError(f"Transformer: tokens.shape = {tokens.shape}; expected [B, T]")
    if positions.shape != tokens.shape:
        raise ValueError(f"Transformer: positions.shape = {positions.shape}; expected tokens.shape {tokens.shape}")
    b, t = tokens.shape
    if cache.k.shape[:2] != (config.num_hidden_layers, b) or cache.k.shape[3:] != (
        config.num_key_value_heads,
        config.head_dim,
    ):
        raise ValueError(
            f"Transformer: cache.k.shape = {cache.k.shape}; expected "
            f"[{config.num_hidden_layers}, {b}, S, {config.num_key_value_heads}, {config.head_dim}]"
        )
    if mask.shape != (b, t, cache.capacity):
        raise ValueError(
            f"Transformer: attention_mask.shape = {mask.shape}; expected [B, T, S] = {(b, t, cache.capacity)}"
        )
    if mask.dtype != jnp.bool_:
        raise ValueError(f"Transformer: attention_mask.dtype = {mask.dtype}; expected bool")


def init_model(config: ModelConfig, key: jax.Array) -> Transformer:
    """Randomly initialised :class:`Transformer` (``key`` from ``jax.random.key``)."""
    return Transformer(config, rngs=nnx.Rngs(params=key))


def _check_token_ids(fn: str, name: str, tokens, ndim: int, shape: str) -> jax.Array:
    """``tokens`` as a jnp array: ``ndim`` dimensions and an integer dtype (known under
    ``jit`` too), else ``ValueError`` naming ``fn`` and ``name``."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != ndim:
        raise ValueError(f"{fn}: {name}.shape = {tokens.shape}; expected {shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{fn}: {name}.dtype = {tokens.dtype}; expected integer token ids")
    return tokens


def forward_logits(model: Transformer, tokens: jax.Array) -> jax.Array:
    """Reference causal forward without a cache: ``int32[B, T]`` -> float32 ``[B, T, V]``.

    Positions ``arange(T)``, causal mask over the T tokens; same layer math as
    ``Transformer.__call__`` but none of the cache plumbing.
    """
    tokens = _check_token_ids("forward_logits", "tokens", tokens, 2, "[B, T]")
    return model.unembed(forward_features(model, tokens))


def forward_features(model: Transformer, tokens: jax.Array) -> jax.Array:
    """:func:`forward_logits` up to the LM head: ``int32[B, T]`` -> float32 features
    ``[B, T, D]`` (after the final norm; ``model.unembed`` of them is ``forward_logits``)."""
    tokens = _check_token_ids("forward_features", "tokens", tokens, 2, "[B, T]")
    return _causal_stack(model, tokens, ())[0]


def forward_taps(model: Transformer, tokens: jax.Array, layers: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """:func:`forward_features` and, beside them, the residuals after each of ``layers``
    (0-based layer indices), each scaled to unit RMS (:func:`tap`): ``int32[B, T]`` ->
    (features float32 ``[B, T, D]``, taps float32 ``[B, T, len(layers), D]``). The low and
    middle layers a multi-layer feature head fuses with the last (EAGLE-3, arXiv 2503.01840)."""
    tokens = _check_token_ids("forward_taps", "tokens", tokens, 2, "[B, T]")
    check_tap_layers("forward_taps", layers, model.config.num_hidden_layers)
    return _causal_stack(model, tokens, tuple(layers))


def check_tap_layers(name: str, layers, num_layers: int) -> None:
    """``ValueError`` naming ``name`` unless ``layers`` are distinct, increasing layer indices
    in ``0 .. num_layers - 1``."""
    ok = (isinstance(layers, (tuple, list)) and len(layers) > 0
          and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
          and list(layers) == sorted(set(layers)) and 0 <= layers[0] and layers[-1] <= num_layers - 1)
    if not ok:
        raise ValueError(f"{name}: feature_layers = {layers!r}; expected increasing layer indices from 0 to "
                         f"{num_layers - 1} (the target has {num_layers} layers)")


def tap(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """A residual ``[..., D]`` scaled to unit RMS (no weight), float32: middle layers'
    residuals grow to large norms, and a tap must stay in float16's range on disk."""
    x = x.astype(_F32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _causal_stack(model: Transformer, tokens: jax.Array, layers: tuple[int, ...]):
    """The causal forward without a cache (positions ``arange(T)``): final features and the
    taps after ``layers`` (``[B, T, 0, D]`` when none)."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))  # [B, T]
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), jnp.bool_)), (b, t, t))  # [B, T, T]
    masks = _LayerMasks(mask, positions, lambda: positions)  # key j is token j
    x = model.embed(tokens)
    taps = []
    for i, layer in enumerate(model.layers):
        q, k, v = layer.project(x, positions)
        x = layer.finish(x, q, k, v, masks.of(layer))
        if i in layers:
            taps.append(tap(x))
    feats = model.norm(x)
    taps = jnp.stack(taps, axis=2) if taps else jnp.zeros((b, t, 0, feats.shape[-1]), _F32)
    return feats, taps


def prefill(
    model: Transformer, tokens: jax.Array, lengths: jax.Array, capacity: int, cache_dtype=None,
    *, features: bool = False, taps: tuple[int, ...] = (),
) -> tuple[jax.Array, KVCache]:
    """Prompts right-padded to T (``int32[B, T]``), ``lengths int32[B]`` real tokens per row.

    Returns logits ``float32[B, T, V]`` (row b's next-token law is ``logits[b, lengths[b]-1]``),
    or with ``features=True`` the features ``float32[B, T, D]`` (:meth:`Transformer.features`;
    ``[B, T, (k + 1) D]`` with ``taps``),
    and a fresh cache of ``capacity`` slots with ``cache.lengths = lengths``. Slots past a
    row's length hold padding K/V that later masks exclude.
    """
    tokens = _check_token_ids("prefill", "tokens", tokens, 2, "[B, T]")
    b, t = tokens.shape
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < t:
        raise ValueError(f"prefill: capacity = {capacity!r}; expected an int >= T = {t}")
    if np.shape(lengths) != (b,):
        raise ValueError(f"prefill: lengths.shape = {np.shape(lengths)}; expected [B] = ({b},)")
    if is_concrete(lengths):
        lens = np.asarray(lengths)
        bad = np.flatnonzero((lens < 0) | (lens > t))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"prefill: lengths[{i}] = {lens[i]}; expected a prompt length in [0, T = {t}]")
    lengths = jnp.asarray(lengths, jnp.int32)
    cache = init_cache(model.config, b, capacity, cache_dtype)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = causal_cache_mask(cache.lengths, t, capacity)  # [B, T, S]
    if features:
        out, cache = model.features(tokens, positions, cache, mask, taps)
    else:
        out, cache = model(tokens, positions, cache, mask)
    return out, cache.replace(lengths=lengths)


def decode_step(model: Transformer, cache: KVCache, token: jax.Array) -> tuple[jax.Array, KVCache]:
    """One token per row (``int32[B]``) at position ``cache.lengths``; then ``lengths += 1``.

    Returns float32 logits ``[B, V]`` (the law of the next token) and the advanced cache.
    """
    token = _check_token_ids("decode_step", "token", token, 1, "[B]")
    if token.shape != cache.lengths.shape:
        raise ValueError(f"decode_step: token.shape = {token.shape}; expected [B] = {cache.lengths.shape}")
    if is_concrete(cache.lengths):
        full = np.flatnonzero(np.asarray(cache.lengths) >= cache.capacity)
        if full.size:
            i = int(full[0])
            raise ValueError(
                f"decode_step: cache.lengths[{i}] = {int(cache.lengths[i])}: the cache is full "
                f"(capacity {cache.capacity}); expected lengths < capacity (prefill with a larger capacity)"
            )
    positions = cache.lengths[:, None]  # [B, 1]
    mask = causal_cache_mask(cache.lengths, 1, cache.capacity)  # [B, 1, S]
    logits, cache = model(token[:, None], positions, cache, mask)
    return logits[:, 0], advance(cache, 1)


def check_transformer(name: str, model) -> Transformer:
    """``model`` if it is a :class:`Transformer`; else ``ValueError`` naming ``name``."""
    if not isinstance(model, Transformer):
        raise ValueError(f"{name}: expected a jaxspec.Transformer, got {type(model).__name__}")
    return model
