"""Tokens per second against mesh shape, and how often a mesh changes a token, for the
default pair on this machine's host devices.

    python benchmarks/mesh_scaling.py [--quick] [--devices 8] [--out benchmarks/results]

Writes ``mesh_scaling.json`` and ``mesh_scaling.png``. On one CPU the 8 "devices" are
threads of the same cores: the figures show what a mesh costs in partitioning and
collectives, not what 8 accelerators would gain (informative only). The agreement part
holds on any machine: for each mesh, the tokens of the same key are compared with one
device's (a ``data`` split changes no arithmetic; a ``model`` split sums partial
products in another order, see :mod:`jaxspec.nn.sharding`).

Not part of ``jaxspec bench``: the host device count must be set before JAX starts,
so this script sets ``XLA_FLAGS`` itself and runs in its own process.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer tokens, rows and turns (minutes)")
    p.add_argument("--devices", type=int, default=8, help="host devices to create (default 8)")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"),
                   help="output folder (default benchmarks/results; --quick: its quick/ subfolder)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f"--xla_force_host_platform_device_count={args.devices}").strip()
    import jax
    import numpy as np

    import jaxspec
    from jaxspec.bench.common import interleaved_turns, log, machine_info, medians, pyplot, write_report
    from jaxspec.bench.decode import BATCH_PROMPTS
    from jaxspec.formats.tokenizer import ByteTokenizer

    quick = args.quick
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    tok = ByteTokenizer()
    prompts = [tok.encode(p) for p in BATCH_PROMPTS]  # 8 rows of 8 lengths
    m = 32 if quick else 64
    turns = 2 if quick else 3
    n = jax.device_count()
    # the default pair: 4 query / 2 KV heads (target), 2 / 1 (draft): a model axis of 1 or 2
    shapes = [(d, mdl) for mdl in (1, 2) for d in (1, 2, 4, 8) if d * mdl <= n]
    kw = dict(max_new_tokens=m, stop_tokens=())
    rows = []
    for shape in [None, *shapes]:
        mesh = None if shape is None else jaxspec.make_mesh(*shape)
        name = "one device" if shape is None else f"data={shape[0]},model={shape[1]}"
        log(f"mesh {name}")
        row = {"mesh": name, "data": 1 if shape is None else shape[0], "model": 1 if shape is None else shape[1]}
        for temp in (0.0, 1.0):
            fns = {
                "speculative": lambda i, t=temp, mesh=mesh: jaxspec.generate(
                    jax.random.key(i + 10), target, draft, prompts, tree="chain:4",
                    sampling=jaxspec.Sampling(temperature=t), mesh=mesh, **kw),
                "target_only": lambda i, t=temp, mesh=mesh: jaxspec.generate_autoregressive(
                    jax.random.key(i + 10), target, prompts, sampling=jaxspec.Sampling(temperature=t), mesh=mesh, **kw),
            }
            times, outs = interleaved_turns(fns, turns)
            med = medians(times)
            ntok = {k: int(np.asarray(o.lengths).sum()) for k, o in outs.items()}
            row[f"T={temp:g}"] = {
                "speculative_tok_s": ntok["speculative"] / med["speculative"],
                "target_only_tok_s": ntok["target_only"] / med["target_only"],
                "speedup": (ntok["speculative"] / med["speculative"]) / (ntok["target_only"] / med["target_only"]),
                "tokens_per_target_call": outs["speculative"].summary()["tokens_per_target_call"],
                "tokens": {k: np.asarray(o.tokens).tolist() for k, o in outs.items()},
            }
        rows.append(row)
    # agreement with one device: same keys (the last timed turn's), token by token
    ref = rows[0]
    for row in rows:
        for temp in ("T=0", "T=1"):
            for mode in ("speculative", "target_only"):
                a = np.asarray(ref[temp]["tokens"][mode])
                b = np.asarray(row[temp]["tokens"][mode])
                row[temp][f"{mode}_rows_equal"] = int((a == b).all(axis=1).sum())
                row[temp][f"{mode}_tokens_equal"] = float((a == b).mean())
    for row in rows:
        for temp in ("T=0", "T=1"):
            del row[temp]["tokens"]
    # more rows for the agreement alone: the prompts repeated, each row its own key fold_in(key, b)
    big = prompts * (4 if quick else 16)
    agreement = []
    for shape in [s for s in shapes if s[1] > 1] + [(min(n, 8), 1)]:
        mesh = jaxspec.make_mesh(*shape)
        log(f"agreement on data={shape[0]},model={shape[1]}: {len(big)} rows")
        for temp in (0.0, 1.0):
            for mode in ("speculative", "target_only"):
                def run(mesh, temp=temp, mode=mode):
                    if mode == "speculative":
                        return jaxspec.generate(jax.random.key(99), target, draft, big, tree="chain:4",
                                                sampling=jaxspec.Sampling(temperature=temp), mesh=mesh, **kw)
                    return jaxspec.generate_autoregressive(jax.random.key(99), target, big,
                                                           sampling=jaxspec.Sampling(temperature=temp),
                                                           mesh=mesh, **kw)
                a, b = np.asarray(run(None).tokens), np.asarray(run(mesh).tokens)
                differ = ~(a == b).all(axis=1)
                first = [int(np.argmax(a[i] != b[i])) for i in np.flatnonzero(differ)]
                agreement.append({"mesh": f"data={shape[0]},model={shape[1]}", "temperature": temp, "mode": mode,
                                  "rows": len(big), "tokens_per_row": m, "rows_differing": int(differ.sum()),
                                  "first_difference_at": first})
    report = {
        "benchmark": "mesh_scaling",
        "size": "quick" if quick else "full",
        "machine": machine_info(),
        "note": ("host devices share the same CPU cores: informative only; a data axis splits rows, "
                 "a model axis splits parameters and KV heads"),
        "settings": {"rows": len(prompts), "max_new_tokens": m, "turns": turns, "tree": "chain:4",
                     "devices": n},
        "rows": rows,
        "agreement": agreement,
    }

    def plot(rep, path):
        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        names = [r["mesh"] for r in rep["rows"]]
        x = np.arange(len(names))
        for ax, temp in zip(axes, ("T=0", "T=1")):
            ax.bar(x - 0.2, [r[temp]["speculative_tok_s"] for r in rep["rows"]], 0.4, label="speculative chain:4")
            ax.bar(x + 0.2, [r[temp]["target_only_tok_s"] for r in rep["rows"]], 0.4, label="target-only")
            ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"default pair, {rep['settings']['rows']} rows, {temp}")
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("tokens / s (all rows)")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{rep['settings']['devices']} host devices on {rep['machine']['cpu_count']} CPU cores "
                     "(informative only)", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    out = pathlib.Path(args.out) / ("quick" if quick else "")
    files = write_report(report, out, "mesh_scaling", plot)
    print("| mesh | T | speculative tok/s | target-only tok/s | speedup | rows equal to one device (spec, AR) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        for temp in ("T=0", "T=1"):
            c = r[temp]
            print(f"| {r['mesh']} | {temp[2:]} | {c['speculative_tok_s']:.0f} | {c['target_only_tok_s']:.0f} | "
                  f"{c['speedup']:.2f}x | {c['speculative_rows_equal']}/{len(prompts)}, "
                  f"{c['target_only_rows_equal']}/{len(prompts)} |")
    print()
    print("| mesh | T | mode | rows differing from one device |")
    print("|---|---|---|---|")
    for a in agreement:
        print(f"| {a['mesh']} | {a['temperature']:g} | {a['mode']} | {a['rows_differing']} of {a['rows']} "
              f"(first at token {a['first_difference_at'][:5]}) |")
    print(f"wrote {files['json']} and {files['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
