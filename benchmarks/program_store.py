"""What the program store adds over JAX's persistent compilation cache alone: the first call
of a second process.

``jaxspec generate`` keeps compiled executables in JAX's persistent compilation cache and,
beside them, the traced programs (:mod:`jaxspec.decode.program_store`), so that a new
process skips tracing and lowering too. This script runs the same ``jaxspec generate``
command in fresh processes, in turns, under three settings, each with a cache folder of
its own warmed by one untimed run:

* ``cold``: ``--no-compile-cache`` (trace, lower and compile every time);
* ``executables``: the persistent compilation cache only (``JAXSPEC_PROGRAM_STORE=off``);
* ``store``: the persistent cache and the program store (the command line's default).

It reports, per setting, the median over turns of the first call's seconds
(``seconds_with_compile`` in the command's JSON: the time to the first tokens, including
loading or compiling the programs) and of the whole process's wall time; the ratios
``store / executables`` are what the program store earns.

    python benchmarks/program_store.py [--turns 7] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = ["generate", "--prompt", "def parse(line):", "--max-new-tokens", "32", "--seed", "0", "--json"]
MODES = ("cold", "executables", "store")


def run_once(mode: str, cache: pathlib.Path) -> dict:
    env = dict(os.environ, JAXSPEC_COMPILATION_CACHE=str(cache))
    argv = [sys.executable, "-m", "jaxspec.cli", *COMMAND]
    if mode == "cold":
        argv.append("--no-compile-cache")
    if mode == "executables":
        env["JAXSPEC_PROGRAM_STORE"] = "off"
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    out = json.loads(proc.stdout)
    return {"first_call_s": out["seconds_with_compile"], "process_s": wall, "tokens": out["tokens"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=7)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    rows = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        caches = {m: pathlib.Path(tmp) / m for m in MODES}
        for m in MODES:  # warm each setting's own folder (untimed)
            print(f"warming {m} ...", file=sys.stderr, flush=True)
            warm = run_once(m, caches[m])
        for turn in range(args.turns):
            for m in MODES:
                r = run_once(m, caches[m])
                assert r["tokens"] == warm["tokens"], "every setting must give the same tokens"
                rows[m].append(r)
                print(f"turn {turn + 1} {m}: first call {r['first_call_s']:.2f} s, process {r['process_s']:.2f} s",
                      file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[k] for r in rows[m]) for k in ("first_call_s", "process_s")} for m in MODES}
    report = {
        "benchmark": "program_store", "command": "jaxspec " + " ".join(COMMAND), "turns": args.turns,
        "load_average": os.getloadavg(), "medians": med, "turns_detail": {m: [{k: r[k] for k in ("first_call_s",
                                                                                                  "process_s")}
                                                                               for r in rows[m]] for m in MODES},
        "store_over_executables": {k: med["store"][k] / med["executables"][k] for k in ("first_call_s", "process_s")},
        "store_turn_range": [min(r["first_call_s"] for r in rows["store"]),
                             max(r["first_call_s"] for r in rows["store"])],
        "executables_turn_range": [min(r["first_call_s"] for r in rows["executables"]),
                                   max(r["first_call_s"] for r in rows["executables"])],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "program_store.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out / "program_store.png")
    for m in MODES:
        print(f"{m:12s} first call {med[m]['first_call_s']:.2f} s   process {med[m]['process_s']:.2f} s")
    print("store / executables:", {k: round(v, 3) for k, v in report["store_over_executables"].items()})
    return 0


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, m in enumerate(MODES):
        vals = [t["first_call_s"] for t in report["turns_detail"][m]]
        ax.scatter([i] * len(vals), vals, alpha=0.6)
        ax.hlines(report["medians"][m]["first_call_s"], i - 0.25, i + 0.25, color="k")
    ax.set_xticks(range(len(MODES)), MODES)
    ax.set_ylabel("first call of a new process (s)")
    ax.set_title("program store vs the persistent compilation cache alone")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
