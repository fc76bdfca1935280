"""Compile time of the jitted entry points.

For :func:`jaxspec.generate` (a chain, a static tree and a dynamic tree) and
:func:`jaxspec.generate_autoregressive` on the embedded default pair (batch 1), and for the
vmapped acceptance rule (``jax.jit(jax.vmap(speculative_accept))``, N = 8, V = 32, batch
4096, chain, ``iid``):

* ``first_call_s``: wall time of the first call after ``jax.clear_caches()`` (trace +
  lower + compile + one run);
* ``steady_call_s``: median wall time of the same call once compiled;
* ``compile_s = first_call_s - steady_call_s``: what compilation costs the first call.

For the acceptance rule the ahead-of-time stages are also timed separately:
``jax.jit(f).lower(*args)`` (``lower_s``: trace and lowering to StableHLO) and
``.compile()`` (``backend_compile_s``: XLA).

Then, with ``processes`` (full and quick), the command line's persistent compilation
cache: ``jaxspec generate --json`` (speculative, and ``--baseline``) in processes sharing a
fresh cache folder, once with JAX's executables and jaxspec's traced programs
(``$JAXSPEC_PROGRAM_STORE=on``, the opt-in of ``--program-store``,
:mod:`jaxspec.decode.program_store`) and once with the executables only
(``$JAXSPEC_PROGRAM_STORE=off``, the command line's default): the first process of each (the cache
empty), then ``process_turns`` second processes on the same prompt, the two caches taking
turns, and one on a prompt of another length in the same 32-token bucket. Each records the
first call's ``seconds_with_compile`` (compile or load, then one generation), the timed
call's ``seconds``, the whole process's wall time (imports and model loading included)
and the entries the cache holds after it. Text mode (streaming) runs first and second
processes the same way (wall time and entries only: it prints no JSON). ``jaxspec verify
--json`` (``VERIFY_SAMPLES`` samples) does too; its ``seconds_with_compile`` is the
speculative run's first block (``timings.speculative.compile_s``: compile or load the
harness's block program, then sample one block).

JSON (``compile_time.json``): ``rows`` of ``{name, kind, first_call_s, steady_call_s,
compile_s}`` (+ ``lower_s``, ``backend_compile_s`` where timed); ``process_rows`` of
``{name, mode, store, run, prompt, seconds_with_compile, seconds, process_s, cache_entries}``
and their medians per (mode, store, run) in ``process_summary``.
Plot: horizontal bars of compile and steady time per entry point.

    report = run("tiny")
    all(r["compile_s"] > 0 for r in report["rows"])    # True
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import jax

import jaxspec
from jaxspec.bench import common

__all__ = ["NAME", "STORES", "CompileBenchConfig", "CONFIGS", "run", "plot", "headline", "table", "process_rows",
           "process_summary"]

NAME = "compile_time"


@dataclasses.dataclass(frozen=True)
class CompileBenchConfig:
    """trees: tree specs timed through :func:`jaxspec.generate` (may be empty);
    models: ``"default"`` (embedded pair) or ``"tiny"`` (small random pair)."""

    trees: tuple[str, ...]
    max_new_tokens: int
    repeats: int
    models: str = "default"
    accept_case: tuple[int, int, int] = (8, 32, 4096)  # N, V, batch
    processes: bool = False  # time the command line's first and second processes
    process_turns: int = 1  # second processes of each store, taking turns


CONFIGS = {
    "full": CompileBenchConfig(trees=("chain:4", "branch:3,2,1", "dynamic:depth=4,topk=4,nodes=16"),
                               max_new_tokens=128, repeats=5, processes=True, process_turns=3),
    "quick": CompileBenchConfig(trees=("chain:4", "branch:2,2", "dynamic:depth=3,topk=2,nodes=6"),
                                max_new_tokens=32, repeats=3, processes=True),
    "tiny": CompileBenchConfig(trees=(), max_new_tokens=8, repeats=1, models="tiny", accept_case=(8, 32, 256)),
}


def _first_and_steady(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(seconds of the first call after clearing every jit cache, median of ``repeats``
    steady calls)."""
    jax.clear_caches()
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def _models(kind: str):
    desc = (f"tiny random pair (exactness.default_pair, V={common.TINY_VOCAB})" if kind == "tiny"
            else "default-target/draft")
    return common.model_pair(kind), desc


def run(size: str = "quick", *, config: CompileBenchConfig | None = None) -> dict:
    """Time the first and steady calls of every entry point of ``CONFIGS[size]`` (or of
    ``config``)."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    (target, draft), models = _models(cfg.models)
    prompt = [jaxspec.ByteTokenizer().encode("The history of the city begins with", add_bos=True)]
    m = cfg.max_new_tokens
    rows = []

    def record(row):
        row["compile_s"] = row["first_call_s"] - row["steady_call_s"]
        rows.append(row)
        common.log(f"compile: {row['name']:40s} first call {row['first_call_s']:7.2f} s, steady "
                   f"{row['steady_call_s'] * 1e3:8.2f} ms -> compile {row['compile_s']:6.2f} s")

    for tree in cfg.trees:
        spec = jaxspec.parse_tree(tree)
        scheme = "deterministic" if isinstance(spec, jaxspec.DynamicTree) else "without_replacement"

        def call(spec=spec, scheme=scheme):
            return jaxspec.generate(jax.random.key(0), target, draft, prompt, max_new_tokens=m, tree=spec,
                                    scheme=scheme, sampling=jaxspec.Sampling(temperature=1.0))

        first, steady = _first_and_steady(call, cfg.repeats)
        record({"name": f"generate {tree}", "kind": "generate", "tree": tree, "scheme": scheme,
                "first_call_s": first, "steady_call_s": steady})

    def ar():
        return jaxspec.generate_autoregressive(jax.random.key(0), target, prompt, max_new_tokens=m,
                                               sampling=jaxspec.Sampling(temperature=1.0))

    first, steady = _first_and_steady(ar, cfg.repeats)
    record({"name": "generate_autoregressive", "kind": "generate_autoregressive", "first_call_s": first,
            "steady_call_s": steady})

    rows.append(_accept_row(*cfg.accept_case, cfg.repeats))
    r = rows[-1]
    common.log(f"compile: {r['name']:40s} first call {r['first_call_s']:7.2f} s (lower {r['lower_s']:.2f} s + "
               f"compile {r['backend_compile_s']:.2f} s), steady {r['steady_call_s'] * 1e3:8.3f} ms")
    report = {
        "benchmark": NAME,
        "size": size,
        "quick": size != "full",
        "machine": common.machine_info(),
        "models": models,
        "max_new_tokens": m,
        "repeats": cfg.repeats,
        "rows": rows,
    }
    if cfg.processes:
        report["process_rows"] = process_rows(m, turns=cfg.process_turns)
        report["process_summary"] = process_summary(report["process_rows"])
    report["headline"] = headline(report)
    return report


#: the prompts of the process rows: 35 and 51 bytes, both in the bucket of 33-64 tokens
PROCESS_PROMPTS = ("The history of the city begins with", "The history of the city begins with a small harbour")


def _cache_entries(folder: pathlib.Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


PROCESS_MODES = ("speculative", "target-only", "text", "verify")
VERIFY_SAMPLES = 10_000  # enough for one block of the harness; the process times its programs
#: the two caches a process row runs with: JAX's executables and jaxspec's traced programs
#: ($JAXSPEC_PROGRAM_STORE=on: --program-store), or the executables only (=off: the command line's default)
STORES = ("executables and programs", "executables only")


def _command(mode: str, prompt: str | None, max_new_tokens: int) -> list[str]:
    """The ``jaxspec`` command line a process row of ``mode`` runs."""
    if mode == "verify":
        return ["verify", "--samples", str(VERIFY_SAMPLES), "--no-progress", "--json"]
    extra = ["--baseline"] if mode == "target-only" else []
    return ["generate", "--prompt", prompt, "--max-new-tokens", str(max_new_tokens), *extra] + (
        [] if mode == "text" else ["--json"])


def _timings(mode: str, stdout: str) -> dict:
    """``seconds_with_compile`` and ``seconds`` from a process's JSON (none in text mode;
    for ``verify``, its first speculative block)."""
    if mode == "text":
        return {}
    out = json.loads(stdout)
    if mode == "verify":
        return {"seconds_with_compile": out["timings"]["speculative"]["compile_s"]}
    return out


def process_rows(max_new_tokens: int, prompts: tuple[str, str] = PROCESS_PROMPTS,
                 modes: tuple[str, ...] = PROCESS_MODES, turns: int = 1) -> list[dict]:
    """The first and second processes of ``jaxspec generate`` (or ``verify``) over one fresh
    persistent compilation cache per mode and store (module docstring): per mode, the first
    process of each store, then ``turns`` second processes of each taking turns, then (not
    in text or verify mode) one on a prompt of another length with the first store (programs
    too). The environment is this process's less any JAX cache settings of its own, so the
    command line's own cache is what is timed."""
    rows = []
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                        "JAXSPEC_PROGRAM_STORE")}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            same = None if mode == "verify" else prompts[0]  # verify samples the harness's own prompt
            plan = [("first process", same, st) for st in STORES]
            plan += [("second process", same, st) for _ in range(turns) for st in STORES]
            if mode not in ("text", "verify"):
                plan.append(("second process, a prompt of another length", prompts[1], STORES[0]))
            for run, prompt, store in plan:
                folder = pathlib.Path(tmp) / mode / str(STORES.index(store))
                command = _command(mode, prompt, max_new_tokens)
                argv = [sys.executable, "-m", "jaxspec.cli", *command]
                store_env = {"JAXSPEC_PROGRAM_STORE": "on" if store == STORES[0] else "off"}
                t0 = time.perf_counter()
                r = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                                   env=dict(env, JAXSPEC_COMPILATION_CACHE=str(folder), **store_env))
                wall = time.perf_counter() - t0
                if r.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv[2:])} failed:\n{r.stderr[-2000:]}")
                out = _timings(mode, r.stdout)
                row = {"name": f"jaxspec {command[0]} ({mode}, {store}): {run}", "mode": mode, "store": store,
                       "run": run, "prompt": prompt, "seconds_with_compile": out.get("seconds_with_compile"),
                       "seconds": out.get("seconds"), "process_s": wall, "cache_entries": _cache_entries(folder)}
                rows.append(row)
                first = "" if row["seconds_with_compile"] is None else \
                    f"first call {row['seconds_with_compile']:6.2f} s, "
                common.log(f"compile: {row['name']:90s} {first}process {wall:6.2f} s, "
                           f"{row['cache_entries']} cache entries")
    return rows


def process_summary(rows: list[dict]) -> list[dict]:
    """Per mode, store and run: the median first call (``seconds_with_compile``), steady
    call and process time over the processes of that kind (several second processes take
    turns), and how many there were."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["mode"], r.get("store", STORES[0]), r["run"]), []).append(r)

    def med(rs, k):
        vals = [r[k] for r in rs if r[k] is not None]
        return statistics.median(vals) if vals else None

    return [{"mode": mode, "store": store, "run": run, "processes": len(rs),
             "seconds_with_compile": med(rs, "seconds_with_compile"), "seconds": med(rs, "seconds"),
             "process_s": med(rs, "process_s"), "cache_entries": rs[-1]["cache_entries"]}
            for (mode, store, run), rs in groups.items()]


def _accept_row(n: int, v: int, batch: int, repeats: int) -> dict:
    """First/steady call and the AOT stages of the vmapped acceptance rule."""
    from jaxspec.bench.accept import accept_fn, bench_inputs  # noqa: PLC0415

    p, q, toks = bench_inputs(n, v, batch)  # [B, N + 1, V], [B, N + 1, V], [B, N]
    keys = jax.random.split(jax.random.key(1), batch)
    parents = jaxspec.chain(n)
    fn = accept_fn(parents, "iid")  # one jit object: the steady calls must hit its cache
    first, steady = _first_and_steady(lambda: fn(keys, toks, p, q), repeats)
    jax.clear_caches()
    t0 = time.perf_counter()
    lowered = accept_fn(parents, "iid").lower(keys, toks, p, q)
    t_lower = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered.compile()
    t_compile = time.perf_counter() - t0
    return {"name": f"vmap(speculative_accept) N={n} V={v} B={batch}", "kind": "accept", "N": n, "V": v,
            "batch": batch, "scheme": "iid", "first_call_s": first, "steady_call_s": steady,
            "compile_s": first - steady, "lower_s": t_lower, "backend_compile_s": t_compile}


def headline(report: dict) -> dict:
    """Compile seconds of the default CLI path (``generate chain:4``, when measured), of
    target-only generation and of the acceptance rule."""
    by = {r["name"]: r for r in report["rows"]}
    out = {"generate_autoregressive_compile_s": by["generate_autoregressive"]["compile_s"],
           "accept_compile_s": next(r["compile_s"] for r in report["rows"] if r["kind"] == "accept")}
    if "generate chain:4" in by:
        out["generate_compile_s"] = by["generate chain:4"]["compile_s"]
    procs = {(r["mode"], r.get("store", STORES[0]), r["run"]): r
             for r in report.get("process_summary") or report.get("process_rows", ())}
    if procs:
        first = procs[("speculative", STORES[0], "first process")]["seconds_with_compile"]
        second = procs[("speculative", STORES[0], "second process")]["seconds_with_compile"]
        out["first_process_first_call_s"], out["second_process_first_call_s"] = first, second
        off = procs.get(("speculative", STORES[1], "second process"))
        if off is not None:
            out["second_process_first_call_executables_only_s"] = off["seconds_with_compile"]
    return out


def table(report: dict) -> str:
    """Markdown table: entry point, first call, steady call, compile."""
    lines = ["| entry point | first call | steady call | compile (first - steady) |", "|---|---|---|---|"]
    for r in report["rows"]:
        extra = (f" (lower {r['lower_s']:.2f} s + XLA {r['backend_compile_s']:.2f} s)" if "lower_s" in r else "")
        lines.append(f"| {r['name']} | {r['first_call_s']:.2f} s | {r['steady_call_s'] * 1e3:.1f} ms | "
                     f"{r['compile_s']:.2f} s{extra} |")
    summary = report.get("process_summary") or (process_summary(report["process_rows"])
                                                 if report.get("process_rows") else None)
    if summary:
        lines += ["", "| `jaxspec` command (mode) | cache | run | processes | first call (`seconds_with_compile`, "
                      "median) | process (median) | cache entries |", "|---|---|---|---|---|---|---|"]
        for r in summary:
            first = "—" if r["seconds_with_compile"] is None else f"{r['seconds_with_compile']:.2f} s"
            lines.append(f"| {r['mode']} | {r['store']} | {r['run']} | {r['processes']} | {first} | "
                         f"{r['process_s']:.1f} s | {r['cache_entries']} |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Horizontal bars: compile seconds and steady-call seconds per entry point."""
    plt = common.pyplot()
    rows = report["rows"]
    y = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    ax.barh([i + 0.2 for i in y], [r["compile_s"] for r in rows], 0.4, label="compile (first - steady call)")
    ax.barh([i - 0.2 for i in y], [r["steady_call_s"] for r in rows], 0.4, label="steady call")
    ax.set_yticks(list(y), [r["name"] for r in rows], fontsize=8)
    ax.set_xlabel("seconds")
    m = report["machine"]
    ax.set_title(f"compile time ({m['backend']}, {m['cpu_count']} cores, {report['size']}, {report['models']})",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
