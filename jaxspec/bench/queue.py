"""Continuous batching: many prompts through a few rows (``generate(..., rows=R)``) against
the same prompts in fixed batches of R, and against target-only in batches of R.

A fixed batch runs until its slowest row has its budget; with speculation the rows of a
batch end in different rounds (each row's tau is its own), so the early ones idle while
the batch finishes. With ``rows=R`` an ended row takes the next prompt inside the loop.
Per temperature, taking turns in one process (:func:`jaxspec.bench.common.tallied_turns`),
over the same ``num_prompts`` held-out prompts (the corpus's validation split, lengths 8 to
47 bytes, :func:`prompts`):

* ``target-only``: :func:`jaxspec.generate_autoregressive` over the prompts in batches of R;
* ``<drafter> batches``: :func:`jaxspec.generate` over the same batches of R;
* ``<drafter> queue``: one :func:`jaxspec.generate` call over all the prompts with ``rows=R``;

for each drafter (the default draft model and the default feature head, ``chain:4``). Rows
report tokens/s, the speedup over target-only and tau over every timed call; at temperature 0
``same_tokens_as_target_only``. ``tiny`` uses small random models (figures meaningless).

    report = run("tiny")
    [r["mode"] for r in report["rows"]][:3]   # ['target-only', 'draft batches', 'draft queue']
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxspec.bench import common
from jaxspec.core.settings import Sampling

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen

__all__ = ["NAME", "QueueBenchConfig", "CONFIGS", "prompts", "run", "plot", "headline", "table"]

NAME = "continuous_batching"


@dataclasses.dataclass(frozen=True)
class QueueBenchConfig:
    num_prompts: int
    rows: int
    tree: str
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    max_files: int | None  # of the corpus's validation split, for the prompts
    models: str = "default"  # "default" (embedded pair and head) or "tiny" (random)


CONFIGS = {
    "full": QueueBenchConfig(num_prompts=64, rows=8, tree="chain:4", temperatures=(0.0, 1.0), max_new_tokens=128,
                             repeats=3, max_files=40),
    "quick": QueueBenchConfig(num_prompts=24, rows=8, tree="chain:4", temperatures=(0.0, 1.0), max_new_tokens=48,
                              repeats=2, max_files=10),
    "tiny": QueueBenchConfig(num_prompts=6, rows=2, tree="chain:2", temperatures=(1.0,), max_new_tokens=8, repeats=1,
                             max_files=1, models="tiny"),
}


def prompts(num_prompts: int, max_files: int | None) -> list[list[int]]:
    """``num_prompts`` held-out prompts (:func:`jaxspec.bench.common.held_out_prompts`),
    prompt i of ``8 + (7 i mod 40)`` tokens."""
    return common.held_out_prompts([8 + (7 * i) % 40 for i in range(num_prompts)], max_files)


def _models(kind: str):
    target, draft = common.model_pair(kind)
    if kind == "tiny":
        from jaxspec.nn.head import head_config, init_head  # noqa: PLC0415

        return target, {"draft": draft, "head": init_head(head_config(target.config), jax.random.key(7))}
    from jaxspec.formats.checkpoint import load_draft  # noqa: PLC0415

    return target, {"draft": draft, "head": load_draft("default-head")}


def run(size: str = "quick", *, config: QueueBenchConfig | None = None) -> dict:
    """Measure every temperature of ``CONFIGS[size]`` (or ``config``)."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, drafters = _models(cfg.models)
    ps = prompts(cfg.num_prompts, cfg.max_files)
    rows = []
    for temp in cfg.temperatures:
        rows += _measure(cfg, target, drafters, ps, temp)
    report = {
        "benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
        "config": dataclasses.asdict(cfg), "prompt_lens": [len(p) for p in ps], "rows": rows,
    }
    report["headline"] = headline(report)
    return report


def _measure(cfg: QueueBenchConfig, target, drafters: dict, ps: list[list[int]], temp: float) -> list[dict]:
    m, r = cfg.max_new_tokens, cfg.rows
    batches = [ps[i : i + r] for i in range(0, len(ps), r)]
    kw = dict(max_new_tokens=m, sampling=Sampling(temperature=temp), stop_tokens=())

    def ar(i):
        return common.joined_results([gen.generate_autoregressive(jax.random.fold_in(jax.random.key(1000 + i), j), target, b, **kw)
                        for j, b in enumerate(batches)])

    fns = {"target-only": ar}
    for name, d in drafters.items():
        def batched(i, d=d):
            return common.joined_results([gen.generate(jax.random.fold_in(jax.random.key(2000 + i), j), target, d, b,
                                         tree=cfg.tree, **kw) for j, b in enumerate(batches)])

        def queued(i, d=d):
            return gen.generate(jax.random.key(3000 + i), target, d, ps, tree=cfg.tree, rows=r, **kw)

        fns[f"{name} batches"], fns[f"{name} queue"] = batched, queued
    turns, outs, totals = common.tallied_turns(fns, cfg.repeats)
    out = []
    for name in fns:
        drafter, _, how = name.partition(" ")
        row = {"temperature": temp, "mode": name, "drafter": None if not how else drafter, "how": how or "batches",
               "prompts": len(ps), "rows": r, "tree": cfg.tree if how else None,
               **common.speed_fields(name, turns, outs, totals),
               "num_tokens": int(np.asarray(outs[name].lengths).sum())}  # one call's: every prompt's budget
        if temp == 0.0:
            row["same_tokens_as_target_only"] = common.same_tokens(outs, name)
        out.append(row)
        common.log(f"queue: T={temp:g} {name:16s} tau {row['tau']:.2f} {row['tokens_per_s']:8.1f} tok/s vs "
                   f"{row['target_only_tokens_per_s']:8.1f}  {row['speedup']:.2f}x")
    return out


def headline(report: dict) -> dict:
    """Per temperature (``{"0": value, "1": value}``): the speedup over target-only of each
    drafter's queue and fixed batches (``queue_speedup``, ``queue_batches_speedup``: the
    draft model; ``queue_head_speedup``, ``queue_head_batches_speedup``: the head)."""
    keys = {("draft", "queue"): "queue_speedup", ("draft", "batches"): "queue_batches_speedup",
            ("head", "queue"): "queue_head_speedup", ("head", "batches"): "queue_head_batches_speedup"}
    out = {k: {} for k in keys.values()}
    for r in report["rows"]:
        key = keys.get((r["drafter"], r["how"]))
        if key is not None:
            out[key][f"{r['temperature']:g}"] = r["speedup"]
    return out


def table(report: dict) -> str:
    """Markdown: one row per (temperature, mode)."""
    lines = ["| T | mode | tau | tokens/s | speedup [turns] |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        lo, hi = r["speedup_turn_range"]
        lines.append(f"| {r['temperature']:g} | {r['mode']} | {r['tau']:.2f} | {r['tokens_per_s']:.0f} | "
                     f"{r['speedup']:.2f}× [{lo:.2f}–{hi:.2f}] |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Speedup over target-only per mode, one panel per temperature (whiskers: the
    slowest and fastest single turn)."""
    plt = common.pyplot()
    temps = list(dict.fromkeys(r["temperature"] for r in report["rows"]))
    fig, axes = plt.subplots(1, len(temps), figsize=(5.2 * len(temps), 3.8), squeeze=False)
    for ax, t in zip(axes[0], temps):
        rs = [r for r in report["rows"] if r["temperature"] == t]
        vals = [r["speedup"] for r in rs]
        ax.bar(range(len(rs)), vals, yerr=common.whiskers(vals, [r["speedup_turn_range"] for r in rs]),
               color=["0.6" if r["drafter"] is None else ("C0" if r["how"] == "batches" else "C1") for r in rs])
        for i, r in enumerate(rs):
            ax.text(i, 0.02, f"tau {r['tau']:.2f}", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(rs)), [r["mode"] for r in rs], fontsize=7, rotation=20)
        ax.set_ylabel("speedup vs target-only (batches)")
        c = report["config"]
        ax.set_title(f"T={t:g}: {c['num_prompts']} prompts, {c['rows']} rows, {c['tree']}", fontsize=9)
    fig.suptitle("continuous batching (rows=R) vs fixed batches of R")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
