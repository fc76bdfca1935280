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


def _linears(module: nnx.Module, prefix: tuple = ()):
    """``(parent, name, path, nnx.Linear)`` for every ``nnx.Linear`` under ``module``
    (attributes and lists, depth first)."""
    items = list(enumerate(module)) if isinstance(module, nnx.List) else list(vars(module).items())
    for name, child in items:
        if isinstance(child, nnx.Linear):
            yield module, name, prefix + (name,), child
        elif isinstance(child, (nnx.Module, nnx.List)):
            yield from _linears(child, prefix + (name,))


class _Recorder(nnx.Module):
    """Stands in for a linear layer during calibration: records ``max |x|`` per input channel."""

    def __init__(self, inner, stats: dict, path: tuple):
        self.inner, self.stats, self.path = inner, stats, path

    def __call__(self, x, columns=None):
        amax = np.asarray(jnp.max(jnp.abs(x.astype(_F32)).reshape(-1, x.shape[-1]), axis=0))
        prev = self.stats.get(self.path)
        self.stats[self.path] = amax if prev is None else np.maximum(prev, amax)
        return self.inner(x) if columns is None else self.inner(x, columns)


def calibration_tokens(vocab_size: int, *, rows: int = 2, length: int = 128, seed: int = 0) -> jax.Array:
    """The default calibration input: ``int32[rows, length]`` ids drawn uniformly from the
    vocabulary with a fixed key (no tokenizer or text needed; activation outlier channels are
    properties of the model, visible on any input)."""
    return jax.random.randint(jax.random.key(seed), (rows, length), 0, vocab_size, jnp.int32)


def activation_maxima(model, tokens: jax.Array) -> dict[tuple, np.ndarray]:
    """``{path of each nnx.Linear (and ("lm_head",)): max |input| per channel}`` over a causal
    forward of ``tokens int32[B, T]`` through the float ``model`` (eager, once)."""
    from jaxspec.nn.model import forward_features  # noqa: PLC0415 (model imports this module)

    graphdef, state = nnx.split(model)
    probe = nnx.merge(graphdef, state)
    stats: dict[tuple, np.ndarray] = {}
    for parent, name, path, lin in list(_linears(probe)):
        rec = _Recorder(lin, stats, path)
        if isinstance(parent, nnx.List):
            parent[name] = rec
        else:
            setattr(parent, name, rec)
    h = forward_features(probe, tokens)  # [B, T, D]: the LM head's input
    stats[("lm_head",)] = np.asarray(jnp.max(jnp.abs(h).reshape(-1, h.shape[-1]), axis=0))
    return stats


def quantize_model(model, *, calibration: jax.Array | None | str = "default", alpha: float = 0.5):
    """A W8A8 copy of the :class:`~jaxspec.nn.model.Transformer` ``model`` (which is left as
    it is): every ``nnx.Linear`` becomes a :class:`QuantLinear`, and a tied model gains an
    int8 LM head quantized from its embedding (the embedding itself stays float).

    ``calibration``: token ids ``int32[B, T]`` whose activation maxima set SmoothQuant's
    per-channel migration (strength ``alpha``); ``"default"``: :func:`calibration_tokens`;
    None: no smoothing (plain per-row activation scales). No speed check:
    :func:`apply_quantize` is the one that falls back where int8 is slow."""
    if is_quantized(model):
        return model
    if isinstance(calibration, str):
        calibration = calibration_tokens(model.config.vocab_size)
    stats = {} if calibration is None else activation_maxima(model, jnp.asarray(calibration, jnp.int32))
    graphdef, state = nnx.split(model)
    out = nnx.merge(graphdef, state)  # a new module tree over the same (immutable) arrays
    for parent, name, path, lin in list(_linears(out)):
        bias = None if lin.bias is None else lin.bias[...]
        new = QuantLinear.from_float(lin.kernel[...], bias, stats.get(path), alpha)
        if isinstance(parent, nnx.List):
            parent[name] = new
        else:
            setattr(parent, name, new)
    if out.lm_head is None:  # tied: the LM head is the embedding's transpose
        head = QuantLinear.from_float(out.embed_tokens.embedding[...].T, None, stats.get(("lm_head",)), alpha)
        out.lm_head = nnx.data(head)  # None was a static attribute
    # a head trained on the float model drafts for its int8 copy: both answer to the float
    # weights' digest (jaxspec.nn.head.target_digest), so no "another target" warning
    from jaxspec.nn.head import target_digest  # noqa: PLC0415 (head imports the model; quant is imported by it)

    out.float_digest = target_digest(model)
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
def int8_speedup(rows: int = 4, d_in: int = 512, d_out: int = 8192, calls: int = 10) -> float:
    """float32 time / int8 time of one ``[rows, d_in] @ [d_in, d_out]`` product on the default
    device (medians of ``calls`` calls each, three turns by dtype), measured once per process
    (about a second, mostly compilation). The product is large enough to be bound by the
    weights' bytes, as decoding is: a CPU with fast int8 kernels (VNNI, AMX) shows about 2x,
    one without falls well below 1 (XLA's generic int8 loops)."""
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
