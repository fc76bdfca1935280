"""The int8 arithmetic of W8A8 execution and its layer, :class:`QuantLinear`: int8 weights,
int8 activations, int32 accumulation. The model (:mod:`jaxspec.nn.model`) runs these
layers; :mod:`jaxspec.nn.quant` turns a float model into one that has them.

A :class:`QuantLinear` is an int8 kernel ``[in, out]`` with one float32 scale per output
channel (symmetric, ``scale[j] = max_i |W[i, j]| / 127``). At run time, inside the jitted
forward, each activation row is quantized with its own scale (``max_k |x[r, k]| / 127``), the
product is an int8 × int8 -> int32 ``dot_general``, and the int32 sums are scaled back to
float32::

    W  [D, O] float  ->  Wq int8[D, O], sw f32[O]          (once, quantize_weights)
    x  [R, D] float  ->  xq int8[R, D], sx f32[R, 1]       (every call, quantize_rows)
    y  [R, O]        =   (xq @ Wq : int32) * sx * sw       (int8_matmul)

Because the sums are exact integers and each row has its own scale, a row's output does not
depend on which other rows share the product: tree verification and one-token decoding
compute the same numbers in every linear layer.

XLA:CPU takes a slow path for a single-row int8 product (33 ms against 1.4 ms for two rows on
SmolLM2's LM head, issue 48): a single row is padded to two (:data:`MIN_ROWS`). Importing this
module does nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["MIN_ROWS", "QuantLinear", "quantize_weights", "dequantize_weights", "quantize_rows", "int8_matmul"]

#: products of fewer rows are padded to this many (XLA:CPU's single-row int8 slow path)
MIN_ROWS = 2
_QMAX = 127.0
_F32 = jnp.float32


def quantize_weights(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``w [D, O]`` (float) -> ``(int8[D, O], float32 scale[O])``, symmetric per output
    column: ``|w - q * scale| <= scale / 2`` elementwise; an all-zero column has scale 1."""
    w = jnp.asarray(w, _F32)
    amax = jnp.max(jnp.abs(w), axis=0)  # [O]
    scale = jnp.where(amax > 0, amax / _QMAX, 1.0)
    q = jnp.clip(jnp.round(w / scale), -_QMAX, _QMAX).astype(jnp.int8)
    return q, scale


def dequantize_weights(q: jax.Array, scale: jax.Array) -> jax.Array:
    """The float32 weights ``q * scale`` (``[D, O]``) that :func:`quantize_weights` stands for."""
    return q.astype(_F32) * scale


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x [..., D]`` -> ``(int8[..., D], float32 scale[..., 1])``, one symmetric scale per
    row (``max |x| / 127``; an all-zero row has scale 1): ``|x - q * scale| <= scale / 2``."""
    x = x.astype(_F32)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)  # [..., 1]
    scale = jnp.where(amax > 0, amax / _QMAX, 1.0)
    q = jnp.clip(jnp.round(x / scale), -_QMAX, _QMAX).astype(jnp.int8)
    return q, scale


def int8_matmul(x: jax.Array, wq: jax.Array, w_scale: jax.Array) -> jax.Array:
    """``x [..., D]`` (float) times the int8 weights ``wq [D, O]`` with scales ``w_scale [O]``
    -> float32 ``[..., O]``: rows quantized per row, int8 × int8 -> int32 ``dot_general``,
    rescaled. Fewer than :data:`MIN_ROWS` rows are padded with zero rows (shapes are static, so
    the choice is made at trace time)."""
    lead, d = x.shape[:-1], x.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    x2 = x.reshape(rows, d)  # [R, D]
    if rows < MIN_ROWS:
        x2 = jnp.pad(x2, ((0, MIN_ROWS - rows), (0, 0)))
    xq, x_scale = quantize_rows(x2)  # int8[R', D], f32[R', 1]
    acc = jax.lax.dot_general(xq, wq, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)  # [R', O]
    y = acc.astype(_F32) * x_scale * w_scale  # [R', O]
    return y[:rows].reshape(*lead, wq.shape[-1])


class QuantLinear(nnx.Module):
    """A linear layer in W8A8: ``kernel int8[in, out]``, ``scale float32[out]``, an optional
    float ``bias [out]`` and an optional smoothing ``smooth float32[in]`` (SmoothQuant: the
    input is multiplied by it before quantization, the kernel was quantized from
    ``w / smooth[:, None]``, so the product is unchanged while activation outlier channels
    shrink). ``__call__(x [..., in]) -> float32 [..., out]``; ``columns`` (int32[K]) restricts
    the output to those output channels (a reduced-vocabulary LM head)."""

    def __init__(self, kernel: jax.Array, scale: jax.Array, bias: jax.Array | None = None,
                 smooth: jax.Array | None = None):
        self.kernel = nnx.Param(kernel)  # int8[in, out]
        self.scale = nnx.Param(scale)  # f32[out]
        self.bias = None if bias is None else nnx.Param(bias)  # [out]
        self.smooth = None if smooth is None else nnx.Param(smooth)  # f32[in]

    @classmethod
    def from_float(cls, w: jax.Array, bias: jax.Array | None = None, act_max: jax.Array | None = None,
                   alpha: float = 0.5) -> QuantLinear:
        """Quantize float weights ``w [in, out]`` (:func:`quantize_weights`); the bias stays float.
        ``act_max float[in]`` (the largest ``|x|`` seen per input channel on calibration text)
        turns on SmoothQuant's migration: ``s = act_max**alpha / max_j |w[:, j]|**(1 - alpha)``,
        ``smooth = 1 / s``, kernel quantized from ``w * s[:, None]``."""
        if act_max is None:
            return cls(*quantize_weights(w), bias)
        w = jnp.asarray(w, _F32)
        w_max = jnp.max(jnp.abs(w), axis=1)  # [in]
        s = jnp.maximum(act_max, 1e-5) ** alpha / jnp.maximum(w_max, 1e-5) ** (1 - alpha)
        s = jnp.where((act_max > 0) & (w_max > 0), s, 1.0)
        return cls(*quantize_weights(w * s[:, None]), bias, (1.0 / s).astype(_F32))

    def __call__(self, x: jax.Array, columns: jax.Array | None = None) -> jax.Array:
        wq, ws = self.kernel[...], self.scale[...]
        if columns is not None:
            wq, ws = jnp.take(wq, columns, axis=1), jnp.take(ws, columns)
        if self.smooth is not None:
            x = x.astype(_F32) * self.smooth[...]
        y = int8_matmul(x, wq, ws)
        if self.bias is not None:
            b = self.bias[...].astype(_F32)
            y = y + (b if columns is None else jnp.take(b, columns))
        return y
