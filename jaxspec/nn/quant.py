"""Integer execution (W8A8): int8 weights, int8 activations, int32 accumulation.

Every linear layer and the LM head becomes a :class:`QuantLinear`: an int8 kernel ``[in, out]``
with one float32 scale per output channel (symmetric, ``scale[j] = max_i |W[i, j]| / 127``).
At run time, inside the jitted forward, each activation row is quantized with its own scale
(``max_k |x[r, k]| / 127``), the product is an int8 × int8 -> int32 ``dot_general``, and the
int32 sums are scaled back to float32::

    W  [D, O] float  ->  Wq int8[D, O], sw f32[O]          (once, quantize_weights)
    x  [R, D] float  ->  xq int8[R, D], sx f32[R, 1]       (every call, quantize_rows)
    y  [R, O]        =   (xq @ Wq : int32) * sx * sw       (int8_matmul)

The embedding table, norms, rotary embedding and attention stay in float; a tied model gets
its own int8 LM head beside the float embedding. Because the sums are exact integers and each
row has its own scale, a row's output does not depend on which other rows share the product:
tree verification and one-token decoding compute the same numbers in every linear layer
(attention and norms aside; tests/test_quant.py measures the rest).

XLA:CPU takes a slow path for a single-row int8 product (33 ms against 1.4 ms for two rows on
SmolLM2's LM head, issue 48): a single row is padded to two (:data:`MIN_ROWS`).

Whether int8 is fast depends on the CPU (VNNI / AMX): :func:`int8_is_fast` times one small
product in each dtype on first use and remembers the answer for the process;
:func:`apply_quantize` (what ``load_model(..., quantize="int8")`` calls) falls back to
float32 with one warning where int8 is not faster. Importing this module does nothing.
"""

from __future__ import annotations

import functools
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = [
    "QUANTIZE_MODES",
    "MIN_ROWS",
    "QuantLinear",
    "quantize_weights",
    "dequantize_weights",
    "quantize_rows",
    "int8_matmul",
    "quantize_model",
    "is_quantized",
    "check_quantize",
    "int8_is_fast",
    "apply_quantize",
]

#: what ``load_model(..., quantize=)`` accepts (None: float, as stored)
QUANTIZE_MODES = ("int8",)
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
    float ``bias [out]``. ``__call__(x [..., in]) -> float32 [..., out]``; ``columns`` (int32[K])
    restricts the output to those output channels (a reduced-vocabulary LM head)."""

    def __init__(self, kernel: jax.Array, scale: jax.Array, bias: jax.Array | None = None):
        self.kernel = nnx.Param(kernel)  # int8[in, out]
        self.scale = nnx.Param(scale)  # f32[out]
        self.bias = None if bias is None else nnx.Param(bias)  # [out]

    @classmethod
    def from_float(cls, w: jax.Array, bias: jax.Array | None = None) -> QuantLinear:
        """Quantize float weights ``w [in, out]`` (:func:`quantize_weights`); the bias stays float."""
        return cls(*quantize_weights(w), bias)

    def __call__(self, x: jax.Array, columns: jax.Array | None = None) -> jax.Array:
        wq, ws = self.kernel[...], self.scale[...]
        if columns is not None:
            wq, ws = jnp.take(wq, columns, axis=1), jnp.take(ws, columns)
        y = int8_matmul(x, wq, ws)
        if self.bias is not None:
            b = self.bias[...].astype(_F32)
            y = y + (b if columns is None else jnp.take(b, columns))
        return y


def _replace_linears(module: nnx.Module) -> None:
    """Every ``nnx.Linear`` under ``module`` (attributes, lists) replaced by its
    :class:`QuantLinear`, in place."""
    items = list(enumerate(module)) if isinstance(module, nnx.List) else list(vars(module).items())
    for name, child in items:
        if isinstance(child, nnx.Linear):
            bias = None if child.bias is None else child.bias[...]
            new = QuantLinear.from_float(child.kernel[...], bias)
            if isinstance(module, nnx.List):
                module[name] = new
            else:
                setattr(module, name, new)
        elif isinstance(child, (nnx.Module, nnx.List)):
            _replace_linears(child)


def quantize_model(model):
    """A W8A8 copy of the :class:`~jaxspec.nn.model.Transformer` ``model`` (which is left as
    it is): every ``nnx.Linear`` becomes a :class:`QuantLinear`, and a tied model gains an
    int8 LM head quantized from its embedding (the embedding itself stays float). No speed
    check: :func:`apply_quantize` is the one that falls back where int8 is slow."""
    if is_quantized(model):
        return model
    graphdef, state = nnx.split(model)
    out = nnx.merge(graphdef, state)  # a new module tree over the same (immutable) arrays
    if out.lm_head is None:  # tied: the LM head is the embedding's transpose
        out.lm_head = nnx.data(QuantLinear.from_float(out.embed_tokens.embedding[...].T))  # None was static
    _replace_linears(out)
    return out


def is_quantized(model) -> bool:
    """Whether ``model``'s LM head is a :class:`QuantLinear` (:func:`quantize_model` made it)."""
    return isinstance(getattr(model, "lm_head", None), QuantLinear)


def check_quantize(fn: str, quantize) -> str | None:
    """``quantize`` as given when it is None or one of :data:`QUANTIZE_MODES`, else
    ``ValueError`` naming ``fn`` and the argument."""
    if quantize is not None and quantize not in QUANTIZE_MODES:
        raise ValueError(f"{fn}: quantize = {quantize!r}; expected one of {QUANTIZE_MODES} or None")
    return quantize


def _median_call_s(fn, *args, calls: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@functools.cache
def int8_speedup(rows: int = 8, d_in: int = 512, d_out: int = 4096, calls: int = 15) -> float:
    """float32 time / int8 time of one ``[rows, d_in] @ [d_in, d_out]`` product on the default
    device (medians of ``calls`` calls each, turns interleaved by dtype), measured once per
    process (a few hundred ms, mostly compilation)."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (rows, d_in), _F32)
    w = jax.random.normal(kw, (d_in, d_out), _F32)
    wq, ws = quantize_weights(w)
    f32 = jax.jit(lambda x, w: x @ w)
    i8 = jax.jit(int8_matmul)
    t_f, t_q = [], []
    for _ in range(3):
        t_f.append(_median_call_s(f32, x, w, calls=calls))
        t_q.append(_median_call_s(i8, x, wq, ws, calls=calls))
    return float(np.median(t_f) / np.median(t_q))


def int8_is_fast(threshold: float = 1.1) -> bool:
    """Whether int8 products beat float32 here by at least ``threshold`` (:func:`int8_speedup`)."""
    return int8_speedup() >= threshold


@functools.cache
def _warn_fallback(speedup: float) -> None:  # once per process
    warnings.warn(
        f"quantize='int8': an int8 matrix product is not faster than float32 on this machine "
        f"({speedup:.2f}x of float32's speed, measured once); using float32 weights instead",
        RuntimeWarning, stacklevel=3)


def apply_quantize(model, quantize: str | None):
    """``model`` as ``quantize`` asks (checked with :func:`check_quantize`): None -> as is;
    ``"int8"`` -> :func:`quantize_model` where :func:`int8_is_fast`, else ``model`` unchanged
    (float32) and one ``RuntimeWarning`` for the process."""
    if check_quantize("load_model", quantize) is None:
        return model
    if not int8_is_fast():
        _warn_fallback(int8_speedup())
        return model
    return quantize_model(model)
