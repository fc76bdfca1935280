"""One W8A8 matrix product on this CPU, four ways (issue 48: "choose qwix, aqtp or a direct
dot_general by measurement"): float32, jaxspec's direct int8 ``dot_general``
(:func:`jaxspec.nn.int8.int8_matmul`, a single row padded to two), the same without the
padding, and, when they import, ``qwix`` (PTQ of an ``nnx.Linear``: int8 weights frozen, rows
quantized at run time) and ``aqtp`` (``aqt.jax.v2`` ``fully_quantized`` int8 ``dot_general``:
both operands quantized on every call, its only form without Linen)::

    pip install --no-deps --target /tmp/qlibs qwix aqtp     # optional, outside the venv
    PYTHONPATH=/tmp/qlibs python benchmarks/int8_matmul.py [--repeats 5] [--out benchmarks/results]

Shapes: SmolLM2-135M's LM head (576 x 49,152) and MLP up projection (576 x 1,536), at 1, 2, 3,
4, 8 and 16 rows. Every product is jitted; the ways take turns (:func:`time_calls_turns`), and
the JSON holds each way's time per turn as a ratio to float32's in the same turn (this VM's
speed drifts; medians of the per-turn ratios). Writes ``int8_matmul.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.common import machine_info, time_calls_turns
from jaxspec.nn.int8 import int8_matmul, quantize_rows, quantize_weights

SHAPES = {"lm_head": (576, 49152), "mlp_up": (576, 1536)}
ROWS = (1, 2, 3, 4, 8, 16)


def _no_pad(x, wq, ws):
    xq, xs = quantize_rows(x)
    acc = jax.lax.dot_general(xq, wq, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * xs * ws


def _qwix(w):
    try:
        import qwix
        from flax import nnx
    except ImportError:
        return None
    lin = nnx.Linear(w.shape[0], w.shape[1], use_bias=False, rngs=nnx.Rngs(0))
    lin.kernel[...] = w
    rules = [qwix.QuantizationRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]
    qm = qwix.quantize_model(lin, qwix.PtqProvider(rules), jnp.ones((2, w.shape[0])))
    graphdef, state = nnx.split(qm)
    f = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    return lambda x: f(state, x)


def _aqt():
    try:
        from aqt.jax.v2 import config as aqt_config
    except ImportError:
        return None
    dg = aqt_config.fully_quantized(fwd_bits=8, bwd_bits=8)
    return jax.jit(lambda x, w: dg(x, w, (((1,), (0,)), ((), ()))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    f32 = jax.jit(lambda x, w: x @ w)
    direct = jax.jit(int8_matmul)
    no_pad = jax.jit(_no_pad)
    aqt = _aqt()
    rows_out = []
    for shape_name, (d, o) in SHAPES.items():
        kx, kw = jax.random.split(jax.random.key(0))
        w = jax.random.normal(kw, (d, o), jnp.float32) * 0.05
        wq, ws = quantize_weights(w)
        qwix_fn = _qwix(w)
        for r in ROWS:
            x = jax.random.normal(kx, (r, d), jnp.float32)
            calls = {"float32": (f32, (x, w)), "direct": (direct, (x, wq, ws)), "direct_no_pad": (no_pad, (x, wq, ws))}
            if qwix_fn is not None:
                calls["qwix"] = (qwix_fn, (x,))
            if aqt is not None:
                calls["aqtp"] = (aqt, (x, w))
            turns = time_calls_turns(calls, repeats=args.repeats, min_time=0.1)
            ratios = {k: float(np.median(np.array(v) / np.array(turns["float32"]))) for k, v in turns.items()}
            row = {"shape": shape_name, "rows": r, "time_over_float32": ratios,
                   "float32_ms": float(np.median(turns["float32"]) * 1e3)}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "repeats": args.repeats, "rows": rows_out,
              "note": "time per call / float32's time per call in the same turn (median over turns); < 1 is faster"}
    (args.out / "int8_matmul.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
