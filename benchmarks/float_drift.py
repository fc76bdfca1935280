"""What "lossless" means in floating point: the law drift between the tree-verification
forward and target-only's one-token forwards over the same text, on SmolLM2-135M-Instruct,
in float32 and in bfloat16.

Speculative decoding is exact *given the verifier's logits*. The verifier scores a chain of
``k + 1`` tokens in one forward under the tree mask; target-only decoding scores one token
per forward. The two compute the same function in a different order of float operations
(matmuls over ``k + 1`` rows instead of one, attention over another key layout), so their
logits differ in the last bits, and the decoder's law is the verifier's, not the one-token
forward's. This script measures how far apart they are (:func:`jaxspec.exactness.drift.forward_drift`):

* **teacher-forced logits**: for each task-mix prompt, its target-only greedy answer
  (``--new`` tokens) is scored twice, token by token (prefill of the prompt, then one-token
  forwards with the KV cache, as :func:`jaxspec.generate_autoregressive` runs), and in
  chunks of ``k + 1`` tokens under the chain's tree mask (the verification forward of
  :func:`jaxspec.generate` with every draft accepted, positions ``L + depth``): max
  ``|Δ logit|``, the total variation between the two laws at T = 1 per position (mean, max),
  and the positions whose argmax differs;
* **greedy divergence**: ``jaxspec.generate`` at T = 0 with the shipped head (its default
  tree) against ``generate_autoregressive`` at T = 0, ``--new`` tokens per prompt: the share
  of prompts whose outputs differ, and where they first differ.

    python benchmarks/float_drift.py [--prompts 2] [--new 48] [--k 3] [--out benchmarks/results]

Writes ``float_drift.json`` and ``float_drift.png``.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

TARGET, HEAD = "smollm2-135m", "smollm2-135m-head"


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=2, help="prompts per task-mix category (default 2)")
    p.add_argument("--new", type=int, default=48, help="new tokens per prompt (default 48)")
    p.add_argument("--k", type=int, default=3, help="drafted tokens per verification chunk (default 3)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    import jax

    import jaxspec
    from jaxspec.bench.common import log, machine_info, pyplot, write_report
    from jaxspec.bench.tasks import CATEGORIES, messages_of
    from jaxspec.exactness.drift import forward_drift
    from jaxspec.formats.checkpoint import load_draft

    tok = jaxspec.load_tokenizer(TARGET)
    prompts = [(c, tok.encode_chat(m)) for c in CATEGORIES for m in messages_of(c)[: args.prompts]]
    head = load_draft(HEAD)
    rows = {}
    for dtype in args.dtypes.split(","):
        target = jaxspec.load_model(TARGET, dtype=dtype)
        per = []
        t0 = time.perf_counter()
        for i, (cat, ids) in enumerate(prompts):
            kw = dict(max_new_tokens=args.new, sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
            ar = np.asarray(jaxspec.generate_autoregressive(jax.random.key(0), target, [ids], **kw).tokens)[0]
            sp = np.asarray(jaxspec.generate(jax.random.key(0), target, head, [ids], **kw).tokens)[0]
            diff = np.flatnonzero(ar != sp)
            d = forward_drift(target, ids, ar[None], args.k)
            per.append(dict(category=cat, prompt_tokens=len(ids), positions=d["positions"],
                            max_abs_dlogit=d["max_abs_dlogit"], tv_mean=d["tv_mean"], tv_max=d["tv_max"],
                            argmax_flips=d["argmax_flips"], greedy_diverged=bool(diff.size),
                            first_divergence=int(diff[0]) if diff.size else None))
            log(f"{dtype} prompt {i} ({cat}): max|dlogit| {per[-1]['max_abs_dlogit']:.3g}, TV mean "
                f"{per[-1]['tv_mean']:.2e} max {per[-1]['tv_max']:.2e}, argmax flips {per[-1]['argmax_flips']}, "
                f"greedy {'diverged at ' + str(diff[0]) if diff.size else 'identical'}")
        rows[dtype] = dict(
            prompts=per, seconds=round(time.perf_counter() - t0, 1),
            max_abs_dlogit=max(r["max_abs_dlogit"] for r in per),
            tv_mean=float(np.average([r["tv_mean"] for r in per], weights=[r["positions"] for r in per])),
            tv_max=max(r["tv_max"] for r in per),
            argmax_flips=sum(r["argmax_flips"] for r in per), positions=sum(r["positions"] for r in per),
            greedy_divergence_rate=float(np.mean([r["greedy_diverged"] for r in per])),
        )
        print(dtype, {k: v for k, v in rows[dtype].items() if k != "prompts"}, flush=True)

    def plot(result, path):
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for dtype, r in result["dtypes"].items():
            ax.scatter([p["tv_max"] for p in r["prompts"]], [p["max_abs_dlogit"] for p in r["prompts"]],
                       label=f"{dtype}: greedy divergence {r['greedy_divergence_rate']:.0%}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("max TV per position (T = 1) between chunked tree and one-token forwards")
        ax.set_ylabel("max |delta logit|")
        ax.set_title(f"SmolLM2-135M, {result['new_tokens']} tokens per prompt, chunks of {result['k'] + 1}",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    result = {"benchmark": "float_drift", "command": f"python benchmarks/float_drift.py --prompts {args.prompts} "
              f"--new {args.new} --k {args.k}", "target": TARGET, "drafter": HEAD, "new_tokens": args.new,
              "k": args.k, "prompts": len(prompts), "dtypes": rows, "machine": machine_info()}
    write_report(result, pathlib.Path(args.out), "float_drift", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
