"""Throughput of the vmapped acceptance rule vs two floors.

For each case ``(N, V, batch)``, tree and sibling scheme: tree-rounds per second of
``jax.jit(jax.vmap(speculative_accept))`` over a batch of independent chains (each with its
own probability rows ``p, q: float32[batch, N + 1, V]`` and tokens ``int32[batch, N]``),
next to, in the same run and taking turns with it (:func:`jaxspec.bench.common.time_calls`):

* the **RNG floor**: merely drawing the same random numbers (the key split, N acceptance
  uniforms and one residual uniform per round) -- a reference, not a target: this benchmark
  is a regression check of the rule's throughput;
* the **read floor**: the same random numbers plus one read of a single V-wide target row
  per round, chosen by the uniforms. Every exact rule does at least this much (it emits a
  token from some row's law, which depends on that row of ``p``); when V is large this,
  not the RNG, is what bounds the rule;
* the **residual floor**: the same random numbers plus one fused pass over the ``p`` *and*
  ``q`` rows of one node (chosen by the uniforms), summing ``max(p - u q, 0)``. In a round
  where a draft is rejected the emitted law is ``max(p - c q, 0) / s``, which depends on
  both rows at every token, so an exact rule reads both (at least once) to normalize it
  and draw from it: this is the least such a round can cost;

and, as a yardstick from the other side, the **sequential walk** (:func:`_sequential_fn`):
the same rule written the way one first would, one sibling at a time in a
``lax.while_loop`` with the residual vector renormalized after each rejection, vmapped the
same way (it emits the same tokens for the same keys). Under ``vmap`` it costs the slowest
lane's walk; the library's branch-free form costs every lane the same fixed work.

Median of repeats after a warm-up compile.

JSON (``accept_throughput.json``): ``rows`` of ``{N, V, batch, tree, scheme,
accept_rounds_per_s, accept_rounds_per_s_turn_range, rng_floor_rounds_per_s,
fraction_of_floor, fraction_of_floor_turn_range, read_floor_rounds_per_s,
fraction_of_read_floor, residual_floor_rounds_per_s, fraction_of_residual_floor,
residual_floor_fraction_of_rng_floor, residual_floor_fraction_of_rng_floor_turn_range,
sequential_rounds_per_s, speedup_vs_sequential,
speedup_vs_sequential_turn_range}`` (rates and fractions from the medians over turns; a
turn range is the lowest and highest value of a single turn); the headline figures (N = 8,
V = 32, batch 1024, chain, ``iid``) are ``headline``. Plot: rounds/s per case and scheme,
with both floors as ticks and the sequential walk as crosses, and below it the fraction of
the RNG floor with the 0.5 target line.

    report = run("tiny")
    report["headline"]["accept_rounds_per_s"] > 0    # True
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

import jaxspec
from jaxspec.bench import common
from jaxspec.core.numerics import accept_ratio, sum_last
from jaxspec.core.sampling import sample_categorical
from jaxspec.core.tree import tree_children

__all__ = ["NAME", "AcceptBenchConfig", "CONFIGS", "run", "plot", "headline", "table"]

NAME = "accept_throughput"


@dataclasses.dataclass(frozen=True)
class AcceptBenchConfig:
    """cases: ``(N, V, batch, {tree name: parents spec})``; a parents spec is
    ``("chain", k)`` or ``("branching", widths)``."""

    cases: tuple
    repeats: int
    min_time: float
    schemes: tuple[str, ...] = ("iid", "without_replacement", "deterministic")


_SMALL_TREES = (("chain", ("chain", 8)), ("tree(2,3)", ("branching", (2, 3))))
_LARGE = (64, 32000, 8, (("chain", ("chain", 64)), ("tree(4,3,4)", ("branching", (4, 3, 4)))))
# The batch matters: the floor reads no memory, while the rule must read the rows it
# judges (p and q: batch * (N + 1) * V * 8 bytes); once they leave the cache (batch 4096
# at N = 8, V = 32 is 9.4 MB) the rule turns memory-bound and its fraction of the floor
# falls. Every batch is reported; the headline is batch 1024 (2.4 MB of rows per call).
CONFIGS = {
    "full": AcceptBenchConfig(
        cases=tuple((8, 32, b, _SMALL_TREES) for b in (256, 1024, 4096)) + (_LARGE,),
        repeats=7, min_time=0.2),
    "quick": AcceptBenchConfig(
        cases=tuple((8, 32, b, _SMALL_TREES) for b in (1024, 4096)) + (_LARGE,),
        repeats=3, min_time=0.2),
    "tiny": AcceptBenchConfig(cases=((8, 32, 1024, (("chain", ("chain", 8)),)),), repeats=1, min_time=0.02),
}
#: the case whose figures are the headline (``jaxspec bench`` top-level keys)
HEADLINE = {"N": 8, "V": 32, "batch": 1024, "tree": "chain", "scheme": "iid"}


def _parents(spec) -> jax.Array:
    kind, arg = spec
    return jaxspec.chain(arg) if kind == "chain" else jaxspec.branching(arg)


def bench_inputs(n: int, v: int, batch: int, seed: int = 0):
    """p, q: float32[batch, n + 1, v] random laws; toks: int32[batch, n]."""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    p = jax.nn.softmax(jax.random.normal(k1, (batch, n + 1, v)) * 2.0, axis=-1)
    q = jax.nn.softmax(jax.random.normal(k2, (batch, n + 1, v)) * 2.0, axis=-1)
    toks = jax.random.randint(k3, (batch, n), 0, v, jnp.int32)
    return p, q, toks


def _round_floor(n: int, read=None):
    """jit ``(keys[B], *rows[B, N + 1, V]) -> float32[B]``: what one round of the rule draws
    (the key split, N acceptance uniforms, one more for the emitted token), summed, plus
    ``read(u, *rows)`` of each lane's rows (``None``: nothing is read)."""

    @jax.jit
    def floor(keys, *rows):
        def one(key, *lane_rows):
            ka, ke = jax.random.split(key)
            u = jax.random.uniform(ka, (n,))
            drawn = jnp.sum(u) + jax.random.uniform(ke, ())
            return drawn if read is None else drawn + read(u, *lane_rows)

        return jax.vmap(one)(keys, *rows)

    return floor


def _picked_row(u):
    """int32 in [0, N]: a row index that depends on the uniforms, so that it is data, as
    the emitted row is for the rule."""
    return jnp.sum(u < 0.5, dtype=jnp.int32)


def _floor_fn(n: int):
    """keys[B] -> float32[B]: draws exactly what one round needs (split, N + 1 uniforms)."""
    return _round_floor(n)


def _read_floor_fn(n: int):
    """(keys[B], p[B, N + 1, V]) -> float32[B]: the floor's random numbers plus one read
    of a V-wide row of ``p`` per round (the row picked by the uniforms)."""
    return _round_floor(n, lambda u, p: sum_last(p[_picked_row(u)]))


def _residual_floor_fn(n: int):
    """(keys[B], p, q[B, N + 1, V]) -> float32[B]: the floor's random numbers plus one fused
    pass over the ``p`` and ``q`` rows of one node (picked by the uniforms):
    ``sum(max(p - u q, 0))``, the residual mass an exact rule needs before it can draw
    from the residual of a rejecting round."""

    def mass(u, p, q):
        row = _picked_row(u)
        return sum_last(jnp.maximum(p[row] - u[0] * q[row], 0.0))

    return _round_floor(n, mass)


class _Walk(NamedTuple):
    """State of the sequential walk of one chain."""

    row: jax.Array  # int32[]: the row judging the current siblings (node + 1; 0 = root)
    rank: jax.Array  # int32[]: sibling rank tried next
    p: jax.Array  # float32[V]: the current target law (normalized residual)
    q: jax.Array  # float32[V]: without replacement: the draft row, tried tokens zeroed
    emitted: jax.Array  # int32[N + 1]: tokens so far, -1 padded
    count: jax.Array  # int32[]: accepted nodes
    done: jax.Array  # bool[]: no sibling left to try


def _sequential_fn(parents, scheme: str):
    """(keys[B], toks[B, N], p[B, N+1, V], q[B, N+1, V]) -> int32[B, N + 1]: the rule
    read literally (docs/DESIGN.md section 2) -- one sibling at a time in a
    ``lax.while_loop``, the residual vector renormalized over the vocabulary after every
    rejection -- the way one would first write it. The same keys, uniforms and final
    inverse-CDF draw as :func:`jaxspec.speculative_accept`, so the two emit the same
    tokens (tests/test_bench.py). Under ``vmap`` the loop runs until the slowest lane is
    done, each step a select over every lane's state: the cost the branch-free rule avoids.
    """
    n = len(parents)
    # [row, rank] -> node; a -1 column more, so that rank = number of children reads "none"
    kids = jnp.pad(tree_children(parents), ((0, 0), (0, 1)), constant_values=-1)  # [N + 1, N + 1]

    def one(key, toks, P, Q):
        key_accept, key_emit = jax.random.split(key)
        u = jax.random.uniform(key_accept, (n,), jnp.float32)

        def step(w: _Walk) -> _Walk:
            node = kids[w.row, w.rank]
            x = toks[jnp.maximum(node, 0)]
            at_x = jnp.arange(P.shape[-1]) == x
            if scheme == "iid":
                qk = Q[w.row]
            elif scheme == "without_replacement":
                mass = jnp.sum(w.q)
                qk = jnp.where(mass > 0, w.q / jnp.where(mass > 0, mass, 1.0), at_x.astype(jnp.float32))
            else:
                qk = at_x.astype(jnp.float32)
            ok = u[jnp.maximum(node, 0)] < accept_ratio(w.p[x], qk[x])
            res = jnp.maximum(w.p - qk, 0.0)
            total = jnp.sum(res)
            rejected = jnp.where(total > 0, res / jnp.where(total > 0, total, 1.0), w.p)
            nxt = node + 1
            moved = _Walk(nxt, jnp.int32(0), P[nxt], Q[nxt],
                          w.emitted.at[w.count].set(x), w.count + 1, jnp.bool_(False))
            stayed = _Walk(w.row, w.rank + 1, rejected, jnp.where(at_x, 0.0, w.q),
                           w.emitted, w.count, jnp.bool_(False))
            out = jax.tree.map(lambda a, b: jnp.where(ok, a, b), moved, stayed)
            return out._replace(done=kids[out.row, out.rank] < 0)

        start = _Walk(jnp.int32(0), jnp.int32(0), P[0], Q[0], jnp.full((n + 1,), -1, jnp.int32),
                      jnp.int32(0), kids[0, 0] < 0)
        end = jax.lax.while_loop(lambda w: ~w.done, step, start)
        return end.emitted.at[end.count].set(sample_categorical(key_emit, end.p).astype(jnp.int32))

    return jax.jit(jax.vmap(one))


def accept_fn(parents, scheme: str):
    """(keys[B], toks[B, N], p[B, N+1, V], q[B, N+1, V]) -> int32[B, N + 1] emitted tokens."""
    return jax.jit(jax.vmap(
        lambda k, t, pp, qq: jaxspec.speculative_accept(k, parents, t, pp, qq, scheme=scheme).tokens
    ))


def run(size: str = "quick", *, config: AcceptBenchConfig | None = None) -> dict:
    """Measure every case, tree and scheme of ``CONFIGS[size]`` (or of ``config``); returns
    the report. Within a case, the floors and every rule take turns."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    rows = []
    for n, v, batch, trees in cfg.cases:
        p, q, toks = bench_inputs(n, v, batch)
        keys = jax.random.split(jax.random.key(1), batch)
        calls = {"floor": (_floor_fn(n), (keys,)), "read": (_read_floor_fn(n), (keys, p)),
                 "residual": (_residual_floor_fn(n), (keys, p, q))}
        for tree_name, spec in trees:
            parents = _parents(spec)
            for scheme in cfg.schemes:
                calls[(tree_name, scheme)] = (accept_fn(parents, scheme), (keys, toks, p, q))
                calls[("sequential", tree_name, scheme)] = (_sequential_fn(parents, scheme), (keys, toks, p, q))
        common.log(f"accept: N={n} V={v} B={batch}: compiling {(len(calls) - 3) // 2} rules and as many "
                   f"sequential walks, timing {cfg.repeats} turns of {cfg.min_time:g} s each ...")
        turns = common.time_calls_turns(calls, repeats=cfg.repeats, min_time=cfg.min_time)
        times = common.medians(turns)
        t_floor, t_read, t_res = times.pop("floor"), times.pop("read"), times.pop("residual")
        res_lo, res_hi = common.turn_range(turns["floor"], turns["residual"])
        t_seq = {k[1:]: times.pop(k) for k in list(times) if k[0] == "sequential"}
        for (tree_name, scheme), t in times.items():
            # the same fraction turn by turn (rule and floor timed seconds apart): how much
            # it moves within the run
            rule_turns = turns[(tree_name, scheme)]
            frac_lo, frac_hi = common.turn_range(turns["floor"], rule_turns)
            rows.append({
                "N": n, "V": v, "batch": batch, "tree": tree_name, "scheme": scheme,
                "accept_rounds_per_s": batch / t,
                "accept_rounds_per_s_turn_range": [batch / max(rule_turns), batch / min(rule_turns)],
                "rng_floor_rounds_per_s": batch / t_floor,
                "fraction_of_floor": t_floor / t,
                "fraction_of_floor_turn_range": [frac_lo, frac_hi],
                "read_floor_rounds_per_s": batch / t_read,
                "fraction_of_read_floor": t_read / t,
                "residual_floor_rounds_per_s": batch / t_res,
                "fraction_of_residual_floor": t_res / t,
                "residual_floor_fraction_of_rng_floor": t_floor / t_res,
                "residual_floor_fraction_of_rng_floor_turn_range": [res_lo, res_hi],
                "sequential_rounds_per_s": batch / t_seq[(tree_name, scheme)],
                "speedup_vs_sequential": t_seq[(tree_name, scheme)] / t,
                "speedup_vs_sequential_turn_range": common.turn_range(
                    turns[("sequential", tree_name, scheme)], rule_turns),
            })
            common.log(f"accept: N={n:3d} V={v:6d} B={batch:5d} {tree_name:12s} {scheme:20s} "
                       f"{batch / t:14,.0f} rounds/s   {t_floor / t:6.3f} of RNG floor "
                       f"({batch / t_floor:,.0f}/s; turns {frac_lo:.2f}-{frac_hi:.2f})   "
                       f"{t_read / t:6.3f} of read floor ({batch / t_read:,.0f}/s)   "
                       f"{t_res / t:6.3f} of residual floor ({batch / t_res:,.0f}/s = {t_floor / t_res:.2f} "
                       f"of the RNG floor, turns {res_lo:.2f}-{res_hi:.2f})   "
                       f"{t_seq[(tree_name, scheme)] / t:5.2f}x the sequential walk")
    report = {
        "benchmark": NAME,
        "size": size,
        "quick": size != "full",
        "repeats": cfg.repeats,
        "machine": common.machine_info(),
        "rows": rows,
    }
    report["headline"] = headline(report)
    return report


def headline(report: dict) -> dict:
    """``accept_rounds_per_s``, ``rng_floor_rounds_per_s``, ``fraction_of_floor`` of the
    :data:`HEADLINE` case (N = 8, V = 32, batch 1024, chain, iid)."""
    for r in report["rows"]:
        if all(r[k] == v for k, v in HEADLINE.items()):
            return {k: r[k] for k in ("accept_rounds_per_s", "rng_floor_rounds_per_s", "fraction_of_floor")}
    raise ValueError(f"report: no row for the headline case {HEADLINE}")


def table(report: dict) -> str:
    """Markdown tables, one line per (case, tree), schemes as columns: rounds/s (fraction of
    the RNG floor / of the read floor / of the residual floor), then the floors' rates;
    then the speedup over the sequential walk (its lowest and highest single turn in
    brackets)."""
    schemes = list(dict.fromkeys(r["scheme"] for r in report["rows"]))
    lines = ["| N | V | batch | tree | " + " | ".join(schemes) + " | RNG floor | read floor | residual floor |",
             "|---" * (7 + len(schemes)) + "|"]
    groups: dict[tuple, dict] = {}
    for r in report["rows"]:
        groups.setdefault((r["N"], r["V"], r["batch"], r["tree"]), {})[r["scheme"]] = r
    for (n, v, b, tree), by in groups.items():
        cells = [f"{_rate(by[s]['accept_rounds_per_s'])} ({_fractions(by[s])})" if s in by else "-"
                 for s in schemes]
        first = next(iter(by.values()))
        read, res = first.get("read_floor_rounds_per_s"), first.get("residual_floor_rounds_per_s")
        lines.append(f"| {n} | {v} | {b} | {tree} | " + " | ".join(cells)
                     + f" | {_rate(first['rng_floor_rounds_per_s'])} | {_rate(read) if read else '-'}"
                     + f" | {_rate(res) if res else '-'} |")
    if all("speedup_vs_sequential" in r for r in report["rows"]):
        lines += ["", "Speedup over the sequential walk (same keys, same tokens):", "",
                  "| N | V | batch | tree | " + " | ".join(schemes) + " |", "|---" * (4 + len(schemes)) + "|"]
        for (n, v, b, tree), by in groups.items():
            cells = [_speedup(by[s]) if s in by else "-" for s in schemes]
            lines.append(f"| {n} | {v} | {b} | {tree} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _speedup(r: dict) -> str:
    lo, hi = r["speedup_vs_sequential_turn_range"]
    return f"{r['speedup_vs_sequential']:.2f}× [{lo:.2f}–{hi:.2f}]"


def _fractions(r: dict) -> str:
    """``RNG / read / residual`` fractions; the floors a report predates are left out."""
    parts = [r["fraction_of_floor"], r.get("fraction_of_read_floor"), r.get("fraction_of_residual_floor")]
    return " / ".join(f"{x:.2f}" for x in parts if x is not None)


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M/s" if x >= 1e6 else f"{x:,.0f}/s"


def plot(report: dict, path) -> None:
    """Two panels per (case, tree) and scheme. Top: rounds/s (log scale), whiskers from the
    slowest to the fastest turn, the floors as ticks, the sequential walk's rate as a cross. Bottom: the fraction of the RNG floor
    (whiskers: its lowest and highest single turn) with the 0.5 target line, and the read
    and residual floors' own fractions of the RNG floor as ticks (what an exact rule cannot
    beat in a round that reads one row / that rejects)."""
    plt = common.pyplot()
    rows = report["rows"]
    groups = list(dict.fromkeys((r["N"], r["V"], r["batch"], r["tree"]) for r in rows))
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    width = 0.8 / len(schemes)
    fig, (ax, axf) = plt.subplots(2, 1, figsize=(max(6, 2.2 * len(groups)), 7.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    for j, s in enumerate(schemes):
        xs, sel = [], []
        for i, g in enumerate(groups):
            for r in rows:
                if (r["N"], r["V"], r["batch"], r["tree"]) == g and r["scheme"] == s:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    sel.append(r)
        for axis, key in ((ax, "accept_rounds_per_s"), (axf, "fraction_of_floor")):
            ys = [r[key] for r in sel]
            err = common.whiskers(ys, [r.get(f"{key}_turn_range") for r in sel])
            axis.bar(xs, ys, width, yerr=err, capsize=2, error_kw={"lw": 0.8}, label=s)
        seq = [(x, r["sequential_rounds_per_s"]) for x, r in zip(xs, sel) if "sequential_rounds_per_s" in r]
        if seq:
            ax.scatter(*zip(*seq), marker="x", color="k", s=18, zorder=3,
                       label="sequential walk" if j == 0 else None)
    for i, g in enumerate(groups):
        first = next(r for r in rows if (r["N"], r["V"], r["batch"], r["tree"]) == g)
        ax.hlines(first["rng_floor_rounds_per_s"], i - 0.45, i + 0.45, color="k", lw=2,
                  label="RNG floor" if i == 0 else None)
        if "read_floor_rounds_per_s" in first:
            ax.hlines(first["read_floor_rounds_per_s"], i - 0.45, i + 0.45, color="0.5", lw=2, ls="--",
                      label="read floor (RNG + one V-wide row)" if i == 0 else None)
            axf.hlines(first["read_floor_rounds_per_s"] / first["rng_floor_rounds_per_s"], i - 0.45, i + 0.45,
                       color="0.5", lw=2, ls="--", label="read floor / RNG floor" if i == 0 else None)
        if "residual_floor_rounds_per_s" in first:
            ax.hlines(first["residual_floor_rounds_per_s"], i - 0.45, i + 0.45, color="0.2", lw=1.5, ls=":",
                      label="residual floor (RNG + one pass over p and q)" if i == 0 else None)
            axf.hlines(first["residual_floor_rounds_per_s"] / first["rng_floor_rounds_per_s"], i - 0.45, i + 0.45,
                       color="0.2", lw=1.5, ls=":", label="residual floor / RNG floor" if i == 0 else None)
    axf.axhline(0.5, color="r", lw=1, ls=":", label="0.5 of the RNG floor (for reading)")
    ax.set_yscale("log")
    axf.set_xticks(range(len(groups)), [f"N={n} V={v}\nB={b} {t}" for n, v, b, t in groups], fontsize=7)
    ax.set_ylabel("tree-rounds / s")
    axf.set_ylabel("fraction of the RNG floor")
    axf.set_ylim(0, max(1.1, max((r.get("fraction_of_floor_turn_range", [0, 0])[1] for r in rows), default=0) * 1.05))
    m = report["machine"]
    ax.set_title(f"vmapped acceptance vs floors ({m['backend']}, {m['cpu_count']} cores, {report['size']})",
                 fontsize=9)
    ax.legend(fontsize=8)
    axf.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
