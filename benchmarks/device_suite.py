"""The accelerator suite: what decides whether trees pay on a device, in one short run.

    python benchmarks/device_suite.py            # on a GPU or TPU: about 8 minutes or less
    python benchmarks/device_suite.py --quick    # the same three parts, sized for a CPU (tests run it)
    python benchmarks/device_suite.py --parts verify_cost,exactness   # some of the parts only

Three parts, each timed and written to ``device_suite.json`` (with ``device_suite.png``,
the verification cost curve) under ``--out`` (default ``benchmarks/results/device``, or
its ``quick/`` subfolder):

1. **decode**: the decode benchmark (``jaxspec bench --only decode``, its quick size) on
   the embedded default pair: speculative vs target-only tokens/s, measured side by side.
2. **verify cost**: one forward of N = 1, 2, 4, ..., 64 tokens (a chain under its tree
   mask, over a cache of ``context`` committed tokens) against one decode step, on a
   random-weight Llama of about 1 B parameters in bfloat16 (``--quick``: a small float32
   model). The ratio ``forward(N) / forward(1)`` is what a tree of N nodes costs in
   target steps; speculation pays when tau exceeds it.
3. **exactness**: :func:`jaxspec.verify` on its defaults at 10^8 samples (``--quick``:
   10^5), with its verdict, p-values and samples/s.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
import time

SIZES = {
    # verify-cost model, N values, context, batch sizes, verify samples
    "full": (dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=8, dtype="bfloat16"),
             (1, 2, 4, 8, 16, 32, 64), 512, (1, 8), 10**8),
    "quick": (dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, dtype="float32"),
              (1, 2, 4, 8, 16), 64, (1,), 10**5),
}


PARTS = ("decode", "verify_cost", "exactness")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU-sized: a small model, 10^5 verify samples")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results" / "device"),
                   help="output folder (default benchmarks/results/device; --quick: its quick/ subfolder)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run, in the suite's order (default: all of {', '.join(PARTS)})")
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        p.error(f"--parts {args.parts!r}: {'no part named' if not parts else repr(bad[0]) + ' is not a part'};"
                f" expected a comma-separated subset of {', '.join(PARTS)}")
    args.parts = [x for x in PARTS if x in parts]
    return args


def verify_cost(model_kw: dict, ns, context: int, batches, log) -> dict:
    """Seconds of one target forward of N chain tokens over ``context`` committed tokens,
    per batch size, and each as a multiple of the N = 1 forward."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxspec
    from jaxspec.bench.common import time_call
    from jaxspec.nn.cache import init_cache
    from jaxspec.nn.masks import tree_cache_mask

    cfg = jaxspec.ModelConfig(max_position_embeddings=context + max(ns) + 1, **model_kw)
    model = jaxspec.init_model(cfg, jax.random.key(0))
    gdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnums=(0, 1))
    def forward(n: int, b: int, state, cache):
        m = nnx.merge(gdef, state)
        parents = jnp.arange(n, dtype=jnp.int32) - 1  # a chain of n nodes
        tokens = jnp.ones((b, n), jnp.int32)
        pos = jaxspec.tree_positions(parents, cache.lengths)
        mask = tree_cache_mask(cache.lengths, jaxspec.tree_mask(parents), cache.capacity)
        logits, _ = m(tokens, pos, cache, mask)
        return logits[:, -1].sum()

    out = {"params": cfg.num_params(), "dtype": cfg.dtype, "context": context, "rows": []}
    for b in batches:
        cache = init_cache(cfg, b, context + max(ns) + 1)
        cache = cache.replace(lengths=jnp.full((b,), context, jnp.int32))
        base = None
        for n in ns:
            t = time_call(functools.partial(forward, n, b), state, cache, repeats=5)
            base = t if n == 1 else base
            out["rows"].append({"batch": b, "n": n, "seconds": t, "over_one_token": t / base})
            log(f"device_suite: verify cost batch {b} N {n}: {t * 1e3:.3f} ms ({t / base:.2f}x one token)")
    return out


def main(argv=None) -> int:
    args = _args(argv)
    size = "quick" if args.quick else "full"
    import jax
    import numpy as np

    import jaxspec
    from jaxspec.bench import run_benchmark
    from jaxspec.bench.common import log, machine_info, pyplot, write_report

    model_kw, ns, context, batches, samples = SIZES[size]
    out_dir = pathlib.Path(args.out) / ("quick" if args.quick else "")
    report = {"benchmark": "device_suite", "size": size, "machine": machine_info(), "parts": {}}
    if "decode" in args.parts:
        t0 = time.perf_counter()
        dec, files = run_benchmark("decode", "tiny" if args.quick else "quick", out_dir)
        report["parts"]["decode"] = {"seconds": time.perf_counter() - t0, "report": files["json"],
                                     "headline": dec["headline"]}
    if "verify_cost" in args.parts:
        t0 = time.perf_counter()
        report["parts"]["verify_cost"] = {**verify_cost(model_kw, ns, context, batches, log),
                                          "seconds": time.perf_counter() - t0}
    if "exactness" in args.parts:
        t0 = time.perf_counter()
        rep = jaxspec.verify(num_samples=samples, progress=True)
        report["parts"]["exactness"] = {
            "seconds": time.perf_counter() - t0, "num_samples": samples, "verdict": rep.verdict,
            "pvalues": {t.name: t.pvalue for t in rep.tests},
            "speculative_samples_per_s": rep.timings["speculative_samples_per_s"],
        }
    report["total_seconds"] = sum(p["seconds"] for p in report["parts"].values())

    def plot(r, path):
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        if "verify_cost" not in r["parts"]:  # nothing to draw a curve of: the parts' times
            ax.bar(list(r["parts"]), [x["seconds"] for x in r["parts"].values()])
            ax.set_ylabel("seconds")
            ax.set_title(f"device suite parts, {r['machine']['device_kind']}", fontsize=8)
        else:
            vc = r["parts"]["verify_cost"]
            for b in sorted({x["batch"] for x in vc["rows"]}):
                xs = [x for x in vc["rows"] if x["batch"] == b]
                ax.plot([x["n"] for x in xs], [x["over_one_token"] for x in xs], "o-", label=f"batch {b}")
            ax.plot(ns, ns, ":", color="gray", label="N (no batching gain)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("tokens verified in one forward (N)")
            ax.set_ylabel("cost / one-token forward")
            ax.set_title(f"{vc['params'] / 1e6:.0f} M params, {vc['dtype']}, context {vc['context']}, "
                         f"{r['machine']['device_kind']}", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    files = write_report(report, out_dir, "device_suite", plot)
    if "decode" in report["parts"]:
        print(f"decode: {report['parts']['decode']['headline']}")
    if "verify_cost" in report["parts"]:
        print("| batch | N | ms | / one token |")
        print("|---|---|---|---|")
        for x in report["parts"]["verify_cost"]["rows"]:
            print(f"| {x['batch']} | {x['n']} | {x['seconds'] * 1e3:.3f} | {x['over_one_token']:.2f} |")
    if "exactness" in report["parts"]:
        ex = report["parts"]["exactness"]
        print(f"verify at {ex['num_samples']:.0e} samples: {ex['verdict']} "
              f"({ex['speculative_samples_per_s']:,.0f} samples/s); min p = {np.min(list(ex['pvalues'].values())):.3g}")
    print(f"total {report['total_seconds']:.0f} s on {jax.devices()[0].device_kind}")
    print(f"wrote {files['json']} and {files['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
