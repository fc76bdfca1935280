"""Integer execution (W8A8) of a model: :func:`quantize_model` makes a copy of a
:class:`~jaxspec.nn.model.Transformer` whose every linear layer and LM head is a
:class:`~jaxspec.nn.int8.QuantLinear` (int8 weights, int8 activations, int32 accumulation:
:mod:`jaxspec.nn.int8` has the arithmetic), with SmoothQuant's per-channel migration set
from the activation maxima of a calibration forward (:func:`activation_maxima`).

The embedding table, norms, rotary embedding and attention stay in float; a tied model gets
its own int8 LM head beside the float embedding. Tree verification and one-token decoding
compute the same numbers in every linear layer (attention and norms aside;
tests/test_quant.py measures the rest).

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

from jaxspec.nn.head import target_digest
from jaxspec.nn.int8 import QuantLinear, int8_matmul, quantize_weights
from jaxspec.nn.model import forward_features

__all__ = [
    "QUANTIZE_MODES",
    "quantize_model",
    "is_quantized",
    "check_quantize",
    "int8_is_fast",
    "apply_quantize",
]

#: what ``load_model(..., quantize=)`` accepts (None: float, as stored)
QUANTIZE_MODES = ("int8",)
_F32 = jnp.float32


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
