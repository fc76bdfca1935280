"""JAX's CPU lowering of Threefry (a loop) against the unrolled one of
:mod:`jaxspec.core.cpu_rng`, side by side in one process, on the default pair.

Each case (batch, tree, temperature; and target-only per batch and temperature) is
compiled twice: first under JAX's own lowering, then -- after
:func:`jaxspec.core.cpu_rng.use_unrolled_threefry` and a fresh compile
(:func:`jaxspec.decode.generate.compiled`'s cache emptied) -- under the unrolled one. The
two compiled programs then take turns on the same inputs and keys
(:func:`jaxspec.bench.common.interleaved_turns`; one key per case, so every call runs the
same rounds), and each row reports both times per
round, their ratio with its per-turn range, and whether both returned the same tokens (they
must: the two lowerings compute one function).

Not a ``jaxspec bench`` benchmark: it needs a process where the unrolled lowering is not yet
registered, and ``jaxspec bench`` registers it at start. Run it as
``python benchmarks/threefry_lowering.py`` (``JAXSPEC_ROLLED_THREEFRY`` does not apply).

    report = run("tiny")          # in a fresh process
    report["rows"][0]["same_tokens"]   # True
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.bench import common
from jaxspec.core import cpu_rng
from jaxspec.core.settings import Sampling

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen

__all__ = ["NAME", "ThreefryBenchConfig", "CONFIGS", "run", "headline", "table", "plot"]

NAME = "threefry_lowering"


@dataclasses.dataclass(frozen=True)
class ThreefryBenchConfig:
    batches: tuple[int, ...]
    trees: tuple[str, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    models: str = "default"


CONFIGS = {
    "full": ThreefryBenchConfig(batches=(1, 8), trees=("chain:4", "branch:3,2,1"), temperatures=(0.0, 1.0),
                                max_new_tokens=128, repeats=9),
    "quick": ThreefryBenchConfig(batches=(1,), trees=("chain:4",), temperatures=(0.0, 1.0), max_new_tokens=48,
                                 repeats=3),
    "tiny": ThreefryBenchConfig(batches=(1,), trees=("chain:2",), temperatures=(1.0,), max_new_tokens=8, repeats=1,
                                models="tiny"),
}


def _cases(cfg: ThreefryBenchConfig, target, draft):
    """``(row fields, static config, call(fn, i))`` per case."""
    from jaxspec.bench.decode import sibling_scheme  # noqa: PLC0415
    from jaxspec.core.treespec import parse_tree  # noqa: PLC0415

    tstate, dstate = nnx.state(target), nnx.state(draft)
    from jaxspec.bench.round_cost import inputs  # noqa: PLC0415

    stop = gen.stop_array(())  # no stop token
    out = []
    for batch in cfg.batches:
        _, tokens, lens = inputs(batch, target.config.vocab_size)
        for temp in cfg.temperatures:
            acfg, at = gen.build_ar_config(target, prompt_length=tokens.shape[1], max_new_tokens=cfg.max_new_tokens,
                                           sampling=Sampling(temperature=temp))

            def ar(fn, i, at=at, tokens=tokens, lens=lens):
                return fn(tstate, jax.random.key(1000), tokens, lens, jnp.float32(at), stop)

            out.append(({"batch": batch, "temperature": temp, "mode": "target-only", "tree": None}, acfg, ar))
            for tree in cfg.trees:
                spec = parse_tree(tree)
                scfg, t, dt = gen.build_config(target, draft, prompt_length=tokens.shape[1],
                                               max_new_tokens=cfg.max_new_tokens, tree=spec,
                                               scheme=sibling_scheme(spec, temp),
                                               sampling=Sampling(temperature=temp))

                def sp(fn, i, t=t, dt=dt, tokens=tokens, lens=lens):
                    return fn(tstate, dstate, jax.random.key(2000), tokens, lens, jnp.float32(t),
                              jnp.float32(dt), stop)

                out.append(({"batch": batch, "temperature": temp, "mode": "speculative", "tree": tree}, scfg, sp))
    return out


def run(size: str = "quick", *, config: ThreefryBenchConfig | None = None) -> dict:
    """Measure every case of ``CONFIGS[size]`` (or ``config``); raises ``RuntimeError`` in a
    process where the unrolled lowering is already in use."""
    if cpu_rng.unrolled_threefry_in_use():
        raise RuntimeError("threefry benchmark: the unrolled Threefry lowering is already registered in this "
                           "process; run it in a fresh one (python benchmarks/threefry_lowering.py)")
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, draft = common.model_pair(cfg.models)
    cases = _cases(cfg, target, draft)
    rolled = []
    for fields, c, call in cases:  # compile every case under JAX's lowering first
        fn = gen.compiled(c)
        jax.block_until_ready(call(fn, -1))
        rolled.append(fn)
    if not cpu_rng.use_unrolled_threefry():
        raise RuntimeError("threefry benchmark: this JAX does not expose the Threefry primitive's lowering")
    gen.compiled.cache_clear()  # the next compiled(c) traces and lowers anew
    rows = []
    for (fields, c, call), f_rolled in zip(cases, rolled):
        f_unrolled = gen.compiled(c)
        turns, outs = common.interleaved_turns({"rolled": lambda i, f=f_rolled, call=call: call(f, i),
                                                "unrolled": lambda i, f=f_unrolled, call=call: call(f, i)},
                                               cfg.repeats)
        sec = common.medians(turns)
        rounds = outs["rolled"].summary()["loop_rounds"]
        row = {**fields, "loop_rounds": rounds, "rolled_s": sec["rolled"], "unrolled_s": sec["unrolled"],
               "rolled_ms_per_round": sec["rolled"] / rounds * 1e3,
               "unrolled_ms_per_round": sec["unrolled"] / rounds * 1e3,
               "time_ratio": sec["unrolled"] / sec["rolled"],
               "time_ratio_turn_range": common.turn_range(turns["unrolled"], turns["rolled"]),
               "same_tokens": all(bool(np.array_equal(np.asarray(a), np.asarray(b)))
                                  for a, b in zip(jax.tree.leaves(outs["rolled"]), jax.tree.leaves(outs["unrolled"])))}
        rows.append(row)
        common.log(f"threefry: B={row['batch']} T={row['temperature']:g} {row['mode']:11s} {row['tree'] or '':13s} "
                   f"{row['rolled_ms_per_round']:.3f} -> {row['unrolled_ms_per_round']:.3f} ms/round "
                   f"({row['time_ratio']:.3f}x), same tokens: {row['same_tokens']}")
    report = {"benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
              "config": dataclasses.asdict(cfg), "rows": rows}
    report["headline"] = headline(report)
    return report


def headline(report: dict) -> dict:
    """``threefry_time_ratio``: per temperature (``{"0": ..., "1": ...}``), the unrolled
    time over the rolled time of the speculative rows, their geometric mean;
    ``threefry_same_tokens``: every row returned the same tokens."""
    out: dict = {}
    for t in sorted({r["temperature"] for r in report["rows"]}):
        xs = [r["time_ratio"] for r in report["rows"] if r["temperature"] == t and r["mode"] == "speculative"]
        out[f"{t:g}"] = float(np.exp(np.mean(np.log(xs))))
    return {"threefry_time_ratio": out, "threefry_same_tokens": all(r["same_tokens"] for r in report["rows"])}


def table(report: dict) -> str:
    """Markdown: one line per case."""
    lines = ["| batch | T | mode | tree | ms/round, JAX's lowering | unrolled | ratio [turns] | same tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lo, hi = r["time_ratio_turn_range"]
        lines.append(f"| {r['batch']} | {r['temperature']:g} | {r['mode']} | {r['tree'] or '-'} | "
                     f"{r['rolled_ms_per_round']:.3f} | {r['unrolled_ms_per_round']:.3f} | "
                     f"{r['time_ratio']:.3f} [{lo:.2f}–{hi:.2f}] | {'yes' if r['same_tokens'] else 'NO'} |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Time with the unrolled lowering over time with JAX's, per case (whiskers: the
    per-turn range; below 1: faster)."""
    plt = common.pyplot()
    rows = report["rows"]
    x = np.arange(len(rows))
    vals = [r["time_ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 3.8))
    ax.bar(x, vals, yerr=common.whiskers(vals, [r["time_ratio_turn_range"] for r in rows]), capsize=2,
           color=["0.6" if r["mode"] == "target-only" else ("C0" if r["temperature"] == 0 else "C1") for r in rows])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(x, [f"B{r['batch']} T{r['temperature']:g}\n{r['tree'] or 'target-only'}" for r in rows],
                  fontsize=7)
    ax.set_ylabel("time, unrolled / JAX's CPU lowering")
    ax.set_title("Threefry on CPU: unrolled rounds vs JAX's loop (same tokens)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
