"""Before/after of a refactor, measured in one run on this machine: lines per module of
``jaxspec/``, the branch count of ``speculative_round``, and the speed of ``jaxspec bench
--only decode --quick``, for two checkouts of the repository taken in turns (A B A B ...),
each in a fresh process.

    git worktree add /tmp/before <commit>
    python benchmarks/before_after.py /tmp/before . --turns 2 --out benchmarks/results/before_after_36.json

The decode benchmark reports each configuration's speedup over target-only sampling,
measured side by side within its own process; this script compares those ratios between the
two checkouts (never absolute times across processes), per configuration, over the turns.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time


def branches(root: pathlib.Path, fn: str = "speculative_round") -> dict:
    """``if`` statements and expressions, and ``isinstance`` calls, in ``fn``."""
    tree = ast.parse((root / "jaxspec/decode/round.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            nodes = list(ast.walk(node))
            return {"if_branches": sum(isinstance(n, (ast.If, ast.IfExp)) for n in nodes),
                    "isinstance_calls": sum(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "isinstance"
                                            for n in nodes),
                    "lines": node.end_lineno - node.lineno + 1}
    raise SystemExit(f"{fn} not found in {root}")


def module_lines(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in sorted((root / "jaxspec").rglob("*.py"))}


def decode_quick(root: pathlib.Path) -> dict:
    """``jaxspec bench --only decode --quick --json`` with ``root`` first on the path."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=str(root))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "jaxspec.cli", "bench", "--only", "decode", "--quick", "--json",
                               "--out", out], capture_output=True, text=True, env=env, cwd=root, check=True)
        report = json.loads((pathlib.Path(out) / "decode_speed.json").read_text())
        report["summary"] = json.loads(proc.stdout)
        report["wall_s"] = time.perf_counter() - t0
        return report


def speedups(report: dict) -> dict:
    """Configuration -> speedup over target-only, from a decode report's ``results``."""
    return {f"{r['tree']} batch={r['batch']} T={r['temperature']}": r["speedup"]
            for r in report["results"] if "speedup" in r}


def plot(res: dict, path: pathlib.Path) -> None:
    """Median speedup over target-only per configuration, before and after."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    keys = sorted(set(res["before"]["decode_median_speedups"]) & set(res["after"]["decode_median_speedups"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys)), 4))
    for i, name in enumerate(("before", "after")):
        vals = [res[name]["decode_median_speedups"][k] for k in keys]
        ax.bar([j + 0.4 * i for j in range(len(keys))], vals, width=0.4, label=name)
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xticks([j + 0.2 for j in range(len(keys))], keys, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speedup over target-only (median of turns)")
    ax.set_title("jaxspec bench --only decode --quick, before and after")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=pathlib.Path)
    ap.add_argument("after", type=pathlib.Path)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args()
    roots = {"before": args.before.resolve(), "after": args.after.resolve()}
    res = {name: {"speculative_round": branches(r), "module_lines": module_lines(r), "decode": []}
           for name, r in roots.items()}
    for turn in range(args.turns):
        for name, root in roots.items():
            print(f"turn {turn + 1}: {name} ...", file=sys.stderr, flush=True)
            rep = decode_quick(root)
            res[name]["decode"].append({"speedups": speedups(rep), "wall_s": rep["wall_s"]})
    for name in roots:
        per = {}
        for t in res[name]["decode"]:
            for k, v in t["speedups"].items():
                per.setdefault(k, []).append(v)
        res[name]["decode_median_speedups"] = {k: statistics.median(v) for k, v in per.items()}
        lines = res[name]["module_lines"]
        res[name]["modules_over_600_lines"] = {k: v for k, v in lines.items() if v > 600}
        res[name]["largest_module"] = max(lines.items(), key=lambda kv: kv[1])
    res["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    plot(res, args.out.with_suffix(".png"))
    for name in roots:
        print(name, res[name]["speculative_round"], res[name]["modules_over_600_lines"],
              res[name]["decode_median_speedups"])


if __name__ == "__main__":
    main()
