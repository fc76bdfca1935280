"""Before/after of a refactor, for two checkouts of the repository: a static part (lines
per module and per package of ``jaxspec/``, the longest functions, the branch count of
``speculative_round``, and the places each generation setting is validated), and the speed
of ``jaxspec bench --only decode --quick``, the two checkouts taken in turns (A B A B ...),
each in a fresh process.

    git worktree add /tmp/before <commit>
    python benchmarks/before_after.py /tmp/before . --turns 2 --out benchmarks/results/before_after_36.json
    python benchmarks/before_after.py /tmp/before . --static-only --out benchmarks/results/before_after_51.json

The decode benchmark reports each configuration's speedup over target-only sampling,
measured side by side within its own process; this script compares those ratios between the
two checkouts (never absolute times across processes), per configuration, over the turns.
The static part (``--static-only``) times nothing, so it needs no quiet machine: it reads
the source files (``ast``), and counts the checks one ``jaxspec.generate`` call makes
(:func:`checks_per_call`: calls, not times, and the compiled program never runs).

Validation sites (:func:`validation_sites`) are counted statically: each call, anywhere in
``jaxspec/``, of a function whose job is to check or resolve that setting (the names in
:data:`VALIDATORS`, the union of both checkouts' names, matched as ``f(...)`` or
``x.f(...)``); for the position limit, in a row of its own, each comparison or
``min``/``max`` that reads ``max_position_embeddings`` or ``max_positions`` outside
training and checkpoint loading (the rule re-derived in place, where a call delegates to
it); and, for the defaults, each assignment of a string literal to ``DEFAULT_TREE`` or
``DEFAULT_SCHEME``. A call site is a place in the code, not a count of runs per call (a
site inside a function called twice counts once); an inline check that calls no named
validator is not counted.
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


def package_lines(module_lines: dict) -> dict:
    """Lines per package of ``jaxspec/`` (its first-level folders; ``jaxspec/*.py`` as
    ``(top level)``), largest first, and their ``total``."""
    per: dict[str, int] = {}
    for path, n in module_lines.items():
        parts = pathlib.PurePath(path).parts  # ("jaxspec", package, ...) or ("jaxspec", "x.py")
        key = parts[1] if len(parts) > 2 else "(top level)"
        per[key] = per.get(key, 0) + n
    return {**dict(sorted(per.items(), key=lambda kv: -kv[1])), "total": sum(per.values())}


def _sources(root: pathlib.Path):
    """``(path relative to root, parsed module)`` of every ``jaxspec/**/*.py``."""
    for p in sorted((root / "jaxspec").rglob("*.py")):
        yield str(p.relative_to(root)), ast.parse(p.read_text())


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node)`` of every function and method, nested ones too
    (``Outer.method``, ``f.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def longest_functions(root: pathlib.Path, n: int = 10) -> list:
    """The ``n`` longest functions of ``jaxspec/`` by source lines (``def`` to last line,
    docstring included; a nested function is counted on its own and inside its parent)."""
    rows = [{"name": name, "file": path, "lines": node.end_lineno - node.lineno + 1}
            for path, tree in _sources(root) for name, node in _functions(tree)]
    return sorted(rows, key=lambda r: -r["lines"])[:n]


# setting -> the functions that check or resolve it (both checkouts' names: a name absent
# from one checkout simply has no calls there)
VALIDATORS = {
    "tree": ("parse_tree", "resolve_tree", "check_tree_size"),
    "scheme": ("check_scheme", "check_drafter_scheme"),
    "rule": ("resolve_rule", "check_rule", "_check_rule", "check_rule_output", "_with_rule"),
    "settings table (tree x scheme x rule x drafter)": ("check_settings",),
    "draft / drafter": ("as_drafter", "to_drafter", "check_drafter", "_check_draft", "_check_drafter",
                        "_check_graphdefs", "check_drafter_output", "check_head_for", "check_head_config_for",
                        "drafter.check"),
    "position limit / capacity": ("position_limit", "_check_positions", "cache_capacity", "speculation_slots",
                                  "bucket_config", "check_room"),
    "stop tokens": ("resolve_stop_tokens", "check_stop", "_check_stop"),
    "draft sampling law": ("draft_law", "check_draft_sampling", "refuse_draft_sampling",
                           "check_sampling('draft_sampling')"),
}
DEFAULT_NAMES = ("DEFAULT_TREE", "DEFAULT_SCHEME")
POSITION_ATTRS = ("max_position_embeddings", "max_positions")
# where a position limit is about training sequences or loading a checkpoint, not generation
NOT_GENERATION = ("jaxspec/training/", "jaxspec/cli/train.py", "jaxspec/formats/", "jaxspec/nn/")
INLINE_POSITION = "position limit read inline (compare / min / max)"


def _call_name(call: ast.Call) -> str | None:
    """The :data:`VALIDATORS` name a call matches: ``f(...)`` and ``x.f(...)`` as ``f``;
    ``<...draft...>.check(...)`` as ``drafter.check``; ``check_sampling("draft_sampling",
    ...)`` as written in the table."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name == "check" and isinstance(f, ast.Attribute) and "draft" in ast.unparse(f.value):
        return "drafter.check"
    if name == "check_sampling" and call.args and isinstance(call.args[0], ast.Constant) \
            and call.args[0].value == "draft_sampling":
        return "check_sampling('draft_sampling')"
    return name


def _reads_position_limit(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in POSITION_ATTRS for n in ast.walk(node))


def validation_sites(root: pathlib.Path) -> dict:
    """Setting -> ``{"count", "sites"}``, each site ``file:function -> validator`` (method:
    the module docstring)."""
    owner = {name: setting for setting, names in VALIDATORS.items() for name in names}
    sites: dict[str, list] = {k: [] for k in (*VALIDATORS, INLINE_POSITION, "default tree / scheme declarations")}
    for path, tree in _sources(root):
        where = {id(n): name for name, fn in _functions(tree) for n in ast.walk(fn)}  # innermost wins
        for node in ast.walk(tree):
            at = f"{path}:{where.get(id(node), '<module>')}"
            if isinstance(node, ast.Call) and _call_name(node) in owner:
                sites[owner[_call_name(node)]].append(f"{at} -> {_call_name(node)}")
            elif not path.startswith(NOT_GENERATION) and _reads_position_limit(node) and (
                    isinstance(node, ast.Compare)
                    or (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("min", "max"))):
                sites[INLINE_POSITION].append(f"{at} -> {ast.unparse(node)[:80]}")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in DEFAULT_NAMES:
                        sites["default tree / scheme declarations"].append(f"{at} -> {t.id} = {node.value.value!r}")
    return {k: {"count": len(v), "sites": sorted(v)} for k, v in sites.items()}


def checks_per_call(root: pathlib.Path) -> dict:
    """Validator -> calls during one ``jaxspec.generate(key, target, draft, prompt,
    max_new_tokens=8)`` with the embedded pair and every other argument at its default, the
    first call of a fresh process with ``root`` first on the path, counted by ``cProfile``
    (calls, not times: the compiled program is intercepted before it runs)."""
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--count-checks", "-", "-",
                           "--out", "-"], capture_output=True, text=True, cwd=root, check=True,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    return json.loads(proc.stdout)


def _count_checks() -> dict:
    """:func:`checks_per_call`'s child process."""
    import cProfile  # noqa: PLC0415

    import jax  # noqa: PLC0415

    import jaxspec  # noqa: PLC0415
    from jaxspec.decode import generate as gen  # noqa: PLC0415

    class Intercepted(Exception):
        pass

    def never_run(cfg):
        def call(*args):
            raise Intercepted
        return call

    gen.compiled = never_run  # run_compiled's compiled(cfg)(...): stop where the program would run
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    prof = cProfile.Profile()
    prof.enable()
    try:
        jaxspec.generate(jax.random.key(0), target, draft, [[72, 101, 108, 108, 111]], max_new_tokens=8)
    except Intercepted:
        pass
    prof.disable()
    prof.create_stats()
    here = str(pathlib.Path(jaxspec.__file__).parent)
    counts: dict[str, int] = {}
    for (path, _, fn), (_, calls, *_) in prof.stats.items():
        if not path.startswith(here):
            continue
        name = "drafter.check" if fn == "check" and "/decode/" in path else fn
        if name in {n for names in VALIDATORS.values() for n in names} | {"check_sampling", "check_transformer"}:
            counts[name] = counts.get(name, 0) + calls
    return dict(sorted(counts.items()))


def static(root: pathlib.Path) -> dict:
    """Everything this script measures without running anything."""
    lines = module_lines(root)
    return {"speculative_round": branches(root), "module_lines": lines, "package_lines": package_lines(lines),
            "modules_over_600_lines": {k: v for k, v in lines.items() if v > 600},
            "largest_module": max(lines.items(), key=lambda kv: kv[1]),
            "longest_functions": longest_functions(root), "validation_sites": validation_sites(root),
            "checks_per_generate_call": checks_per_call(root)}


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
    ap.add_argument("--static-only", action="store_true",
                    help="only the part that times nothing (source files, and the checks one generate call "
                         "makes); no benchmark is run")
    ap.add_argument("--count-checks", action="store_true", help=argparse.SUPPRESS)  # checks_per_call's child
    args = ap.parse_args()
    if args.count_checks:
        print(json.dumps(_count_checks()))
        return
    roots = {"before": args.before.resolve(), "after": args.after.resolve()}
    res = {name: {"commit": _commit(r), **static(r)} for name, r in roots.items()}
    if args.static_only:
        res["decode"] = "not run: needs a quiet machine (rerun without --static-only)"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print_static(res)
        return
    for name in roots:
        res[name]["decode"] = []
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
    res["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    plot(res, args.out.with_suffix(".png"))
    print_static(res)
    for name in roots:
        print(name, "decode median speedups", res[name]["decode_median_speedups"])


def _commit(root: pathlib.Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root)
    return proc.stdout.strip()


def print_static(res: dict) -> None:
    """The static part as the tables of benchmarks/README.md (markdown)."""
    b, a = res["before"], res["after"]
    print(f"| package | before ({b['commit']}) | after ({a['commit']}) |\n|---|---|---|")
    for k in sorted({*b["package_lines"], *a["package_lines"]} - {"total"},
                    key=lambda k: -a["package_lines"].get(k, 0)) + ["total"]:
        print(f"| {k} | {b['package_lines'].get(k, '-')} | {a['package_lines'].get(k, '-')} |")
    print("\n| setting | before | after |\n|---|---|---|")
    for k in b["validation_sites"]:
        print(f"| {k} | {b['validation_sites'][k]['count']} | {a['validation_sites'][k]['count']} |")
    print("\n| check: calls in one generate call | before | after |\n|---|---|---|")
    for k in sorted({*b["checks_per_generate_call"], *a["checks_per_generate_call"]}):
        print(f"| `{k}` | {b['checks_per_generate_call'].get(k, 0)} | {a['checks_per_generate_call'].get(k, 0)} |")
    for name in ("before", "after"):
        print(f"\n{name}: longest functions\n| function | file | lines |\n|---|---|---|")
        for r in res[name]["longest_functions"]:
            print(f"| `{r['name']}` | {r['file'].removeprefix('jaxspec/')} | {r['lines']} |")
        print(f"\n{name}: speculative_round {res[name]['speculative_round']}")


if __name__ == "__main__":
    main()
