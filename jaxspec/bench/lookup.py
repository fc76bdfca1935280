"""Prompt lookup (n-gram) drafts against the draft model and target-only sampling.

Workloads, each a few prompts for the default target (whose context is 256 positions, so
every prompt is short):

* **grounded** -- a standard-library function (read from this Python's own sources,
  docstring dropped, cut to whole lines of at most ``grounded_bytes`` bytes), then its first
  line again: the text to continue is in the prompt;
* **self** -- ``X + Y + X`` where ``Y`` is the target's own greedy continuation of ``X``:
  the prompt holds exactly what greedy decoding emits next (the lookup's best case);
* **code** -- the decode benchmark's short code prompts, which hold nothing to copy.

For every (workload, temperature) the modes take turns on the same prompts
(:func:`jaxspec.bench.common.interleaved_turns`): target-only, ``jaxspec.NgramDraft`` on
each tree of :attr:`LookupBenchConfig.ngram_trees`, and the default draft model on
``chain:4``. Rows report tau (tokens per target call, summed over the timed calls),
tokens/s and the speedup over target-only measured in the same turns.

JSON (``prompt_lookup.json``): ``rows`` (per prompt), ``summary`` (per workload: tau over
all calls, geometric-mean speedup) and ``headline`` (per workload at temperature 0: the best
n-gram mode's speedup and tau, the draft model's speedup). Plot: speedup per mode, one panel
per temperature.

    report = run("tiny")
    {r["mode"] for r in report["rows"]} >= {"ngram chain:4", "draft chain:4"}    # True
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect

import jax
import numpy as np

from jaxspec.bench import common
from jaxspec.bench.decode import BATCH_PROMPTS
from jaxspec.core.settings import Sampling

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen
from jaxspec.decode.ngram import NgramDraft

__all__ = ["NAME", "LookupBenchConfig", "CONFIGS", "GROUNDED_FUNCTIONS", "grounded_prompt", "run", "plot",
           "headline", "table"]

NAME = "prompt_lookup"
#: (module, function) of the grounded workload's prompts: pure-Python standard-library code
GROUNDED_FUNCTIONS = (("shlex", "quote"), ("string", "capwords"), ("glob", "escape"), ("textwrap", "indent"))
WORKLOADS = ("grounded", "self", "code")


@dataclasses.dataclass(frozen=True)
class LookupBenchConfig:
    prompts_per_workload: int
    ngram_trees: tuple[str, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    grounded_bytes: int = 120
    models: str = "default"  # "default" (embedded pair) or "tiny" (random)


CONFIGS = {
    "full": LookupBenchConfig(prompts_per_workload=4, ngram_trees=("chain:4", "chain:8", "branch:3,1,1,1"),
                              temperatures=(0.0, 1.0), max_new_tokens=64, repeats=5),
    "quick": LookupBenchConfig(prompts_per_workload=2, ngram_trees=("chain:4", "branch:3,1,1,1"),
                               temperatures=(0.0, 1.0), max_new_tokens=48, repeats=2),
    "tiny": LookupBenchConfig(prompts_per_workload=1, ngram_trees=("chain:4",), temperatures=(1.0,),
                              max_new_tokens=8, repeats=1, grounded_bytes=30, models="tiny"),
}


def grounded_prompt(module: str, name: str, max_bytes: int = 120) -> str:
    """The function's source without its docstring, whole lines up to ``max_bytes``
    bytes, then a blank line and its first line again."""
    import ast  # noqa: PLC0415
    import importlib  # noqa: PLC0415
    import textwrap  # noqa: PLC0415

    src = textwrap.dedent(inspect.getsource(getattr(importlib.import_module(module), name)))
    lines = src.splitlines()
    fn = ast.parse(src).body[0]
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        del lines[first.lineno - 1 : first.end_lineno]  # the docstring's lines
    kept, size = [], 0
    for line in lines:
        if size + len(line.encode()) + 1 > max_bytes and kept:
            break
        kept.append(line)
        size += len(line.encode()) + 1
    return "\n".join(kept) + "\n\n" + kept[0] + "\n"


def _prompts(cfg: LookupBenchConfig, target, tok) -> dict[str, list[list[int]]]:
    k = cfg.prompts_per_workload
    grounded = []
    for module, name in GROUNDED_FUNCTIONS[:k]:
        try:
            grounded.append(tok.encode(grounded_prompt(module, name, cfg.grounded_bytes)))
        except (OSError, TypeError, AttributeError, ImportError) as e:  # no source in this Python
            common.log(f"lookup: skipping {module}.{name} ({e})")
    code = [tok.encode(t) for t in BATCH_PROMPTS[1 : 1 + k]]
    self_prompts = []
    for x in code:
        y = gen.generate_autoregressive(jax.random.key(0), target, [x], max_new_tokens=cfg.max_new_tokens,
                                        sampling=Sampling(temperature=0.0), stop_tokens=())
        self_prompts.append(x + np.asarray(y.tokens)[0].tolist() + x)
    return {"grounded": grounded, "self": self_prompts, "code": code}


def run(size: str = "quick", *, config: LookupBenchConfig | None = None) -> dict:
    """Measure every (workload, temperature, prompt) of ``CONFIGS[size]`` (or ``config``)."""
    from jaxspec.formats.tokenizer import ByteTokenizer  # noqa: PLC0415

    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, draft = common.model_pair(cfg.models)
    tok = ByteTokenizer()
    m = cfg.max_new_tokens
    prompts = _prompts(cfg, target, tok)
    rows = []
    for workload in WORKLOADS:
        for temp in cfg.temperatures:
            for p_idx, ids in enumerate(prompts[workload]):
                rows += _measure(cfg, target, draft, workload, p_idx, ids, temp, m)
    report = {
        "benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
        "config": dataclasses.asdict(cfg), "ngram": dataclasses.asdict(NgramDraft()),
        "prompts": {w: [{"num_tokens": len(p), "sha1": hashlib.sha1(bytes(str(p), "ascii")).hexdigest()[:12],
                         "text": tok.decode(p)} for p in ps] for w, ps in prompts.items()},
        "rows": rows,
    }
    report["summary"] = _summary(rows)
    report["headline"] = headline(report)
    return report


def _measure(cfg, target, draft, workload, p_idx, ids, temp, m) -> list[dict]:
    lookup = NgramDraft()

    def ar(i):
        return gen.generate_autoregressive(jax.random.key(1000 + i), target, [ids], max_new_tokens=m,
                                           sampling=Sampling(temperature=temp), stop_tokens=())

    fns = {"target-only": ar}
    for spec in cfg.ngram_trees:
        def ng(i, spec=spec):
            return gen.generate(jax.random.key(2000 + i), target, lookup, [ids], max_new_tokens=m, tree=spec,
                                sampling=Sampling(temperature=temp), stop_tokens=())
        fns[f"ngram {spec}"] = ng

    def dm(i):
        return gen.generate(jax.random.key(2000 + i), target, draft, [ids], max_new_tokens=m, tree="chain:4",
                            sampling=Sampling(temperature=temp), stop_tokens=())

    fns["draft chain:4"] = dm
    turns, outs, totals = common.tallied_turns(fns, cfg.repeats)
    rows = []
    for name in fns:
        row = {"workload": workload, "prompt": p_idx, "temperature": temp, "mode": name,
               **common.speed_fields(name, turns, outs, totals)}
        if temp == 0.0:
            row["same_tokens_as_target_only"] = common.same_tokens(outs, name)
        rows.append(row)
        common.log(f"lookup: {workload:8s} T={temp:g} prompt {p_idx} {name:20s} tau {row['tau']:.2f} "
                   f"{row['tokens_per_s']:7.1f} tok/s vs {row['target_only_tokens_per_s']:7.1f}  {row['speedup']:.2f}x")
    return rows


def _summary(rows: list[dict]) -> list[dict]:
    """Per (workload, temperature, mode): tau over all prompts' calls, and the geometric mean
    of the per-prompt speedups."""
    out = []
    keys = sorted({(r["workload"], r["temperature"], r["mode"]) for r in rows},
                  key=lambda k: (WORKLOADS.index(k[0]), k[1], k[2]))
    for w, t, mode in keys:
        sel = [r for r in rows if (r["workload"], r["temperature"], r["mode"]) == (w, t, mode)]
        out.append({"workload": w, "temperature": t, "mode": mode, "prompts": len(sel),
                    "tau": sum(r["num_tokens"] for r in sel) / max(sum(r["target_calls"] for r in sel), 1),
                    "speedup": float(np.exp(np.mean([np.log(r["speedup"]) for r in sel])))})
    return out


def headline(report: dict) -> dict:
    """At the lowest temperature measured, per workload: the best n-gram mode's speedup
    (``lookup_speedup_t0``) and tau (``lookup_tau_t0``), and the draft model's speedup
    (``lookup_draft_speedup_t0``), each a ``{workload: value}`` dict; plus which mode won."""
    temps = sorted({s["temperature"] for s in report["summary"]})
    out = {"lookup_speedup_t0": {}, "lookup_tau_t0": {}, "lookup_draft_speedup_t0": {}, "lookup_best_mode": {},
           "headline_temperature": temps[0] if temps else None}
    for w in WORKLOADS:
        sel = [s for s in report["summary"] if temps and s["workload"] == w and s["temperature"] == temps[0]]
        ng = [s for s in sel if s["mode"].startswith("ngram")]
        dm = [s for s in sel if s["mode"].startswith("draft")]
        if ng:
            best = max(ng, key=lambda s: s["speedup"])
            out["lookup_speedup_t0"][w] = best["speedup"]
            out["lookup_tau_t0"][w] = best["tau"]
            out["lookup_best_mode"][w] = best["mode"]
        if dm:
            out["lookup_draft_speedup_t0"][w] = dm[0]["speedup"]
    return out


def table(report: dict) -> str:
    """Markdown: one row per (workload, temperature, mode) over the workload's prompts."""
    lines = ["| workload | T | mode | tau | speedup vs target-only (geo. mean over prompts) |", "|---|---|---|---|---|"]
    for s in report["summary"]:
        if s["mode"] == "target-only":
            continue
        lines.append(f"| {s['workload']} | {s['temperature']:g} | {s['mode']} | {s['tau']:.2f} | {s['speedup']:.2f}× |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Speedup over target-only per mode and workload, one panel per temperature."""
    plt = common.pyplot()
    temps = sorted({s["temperature"] for s in report["summary"]})
    fig, axes = plt.subplots(1, len(temps), figsize=(6.5 * len(temps), 4.2), squeeze=False)
    modes = [m for m in dict.fromkeys(s["mode"] for s in report["summary"]) if m != "target-only"]
    width = 0.8 / max(len(modes), 1)
    for ax, t in zip(axes[0], temps):
        for j, mode in enumerate(modes):
            vals = []
            for w in WORKLOADS:
                s = next((s for s in report["summary"] if (s["workload"], s["temperature"], s["mode"]) == (w, t, mode)),
                         None)
                vals.append(s["speedup"] if s else np.nan)
            xs = np.arange(len(WORKLOADS)) + (j - (len(modes) - 1) / 2) * width
            ax.bar(xs, vals, width, label=mode)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(WORKLOADS)), WORKLOADS)
        ax.set_ylabel("speedup vs target-only (same turns)")
        ax.set_title(f"temperature {t:g}")
        ax.legend(fontsize=8)
    fig.suptitle("prompt lookup vs the draft model, default target, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
