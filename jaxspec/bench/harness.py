"""Peak memory against sample count, and samples/s, of the exactness harness.

:func:`jaxspec.exactness.verify` streams its counts in blocks of ``chunk_size`` chains, so
its memory should not grow with the number of samples ``S``. Each point ``S`` runs in a
**fresh subprocess** (so that an earlier, larger point cannot mask a later one in the
process's high-water mark): the child builds the default tiny pair, reads its resident
memory (``baseline_rss_mb``), runs ``verify(num_samples=S, chunk_size=C)`` and reads the
peak resident memory of its life (``peak_rss_mb``, ``VmHWM`` of ``/proc/self/status``, else
``ru_maxrss``); ``growth_mb = peak - baseline`` is what verify itself needed.

Samples/s: speculative chains per second (and target-only samples per second) of each
point, from the report's timings, excluding the first step (which also compiles; so
every point has at least two blocks); the headline is the largest point's.

JSON (``harness_memory.json``): ``points`` of ``{num_samples, chunk_size, blocks,
baseline_rss_mb, peak_rss_mb, growth_mb, samples_per_s, target_only_samples_per_s,
seconds, passed}``, ``growth_ratio`` (growth at the largest over the smallest point).
Plot: peak and growth vs S (log-scale x), and samples/s vs S.

    report = run("tiny")
    report["points"][-1]["peak_rss_mb"] > 0      # True
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from jaxspec.bench import common

__all__ = ["NAME", "HarnessBenchConfig", "CONFIGS", "run", "plot", "headline", "table", "peak_rss_mb",
           "rss_mb"]

NAME = "harness_memory"


@dataclasses.dataclass(frozen=True)
class HarnessBenchConfig:
    """One verify run per entry of ``sample_counts``, each with ``chunk_size`` chains per
    block and the default verify configuration unless overridden."""

    sample_counts: tuple[int, ...]
    chunk_size: int
    tree: str = "branch:2,2"
    scheme: str = "iid"
    horizon: int = 3
    check_acceptance: bool = True
    timeout_s: float = 1800.0


CONFIGS = {
    "full": HarnessBenchConfig(sample_counts=(1 << 15, 1 << 16, 1 << 18, 1 << 20), chunk_size=1 << 14),
    "quick": HarnessBenchConfig(sample_counts=(1 << 13, 1 << 15, 1 << 17), chunk_size=1 << 12,
                                check_acceptance=False),
    "tiny": HarnessBenchConfig(sample_counts=(1 << 9, 1 << 10), chunk_size=1 << 8, tree="chain:2", horizon=2,
                               check_acceptance=False),
}


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])  # "VmHWM:   123456 kB"
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """Resident memory of this process now, MiB (``VmRSS``; else the peak so far)."""
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else peak_rss_mb()


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (``VmHWM``, else ``ru_maxrss``)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    import resource  # noqa: PLC0415

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024  # bytes on macOS, KiB on Linux


def measure_point(num_samples: int, chunk_size: int, *, tree: str, scheme: str, horizon: int,
                  check_acceptance: bool) -> dict:
    """Run verify once in *this* process and report its memory and speed (call it in a
    fresh process: the peak is the process's lifetime peak)."""
    from jaxspec.exactness.harness import default_pair, verify  # noqa: PLC0415

    target, draft = default_pair(0)
    baseline = rss_mb()
    t0 = time.perf_counter()
    rep = verify(target, draft, tree=tree, scheme=scheme, horizon=horizon, num_samples=num_samples,
                 chunk_size=chunk_size, check_acceptance=check_acceptance, progress=False)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    n_first = min(num_samples, rep.config["chunk_size"] * rep.config["devices"])  # samples of the first step
    return {
        "num_samples": num_samples,
        "chunk_size": rep.config["chunk_size"],
        "blocks": -(-num_samples // rep.config["chunk_size"]),
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak,
        "growth_mb": peak - baseline,
        "samples_per_s": _rate(num_samples - n_first, rep.timings["speculative"]),
        "target_only_samples_per_s": _rate(num_samples - n_first, rep.timings["target_only"]),
        "compile_s": rep.timings["speculative"]["compile_s"],
        "seconds": seconds,
        "passed": rep.passed,
    }


def _rate(samples: int, timing: dict) -> float | None:
    """Samples per second after the first step (which also traces and compiles); ``None``
    when everything ran in that first step."""
    seconds = timing["total_s"] - timing["compile_s"]
    return samples / seconds if samples > 0 and seconds > 0 else None


def _point_in_subprocess(s: int, cfg: HarnessBenchConfig) -> dict:
    cmd = [sys.executable, "-m", "jaxspec.bench.harness", "--num-samples", str(s), "--chunk-size",
           str(cfg.chunk_size), "--tree", cfg.tree, "--scheme", cfg.scheme, "--horizon", str(cfg.horizon)]
    if not cfg.check_acceptance:
        cmd.append("--no-acceptance")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"harness point S={s}: subprocess failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(size: str = "quick", *, config: HarnessBenchConfig | None = None) -> dict:
    """One subprocess per sample count of ``CONFIGS[size]`` (or of ``config``); returns the
    report."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    points = []
    for s in cfg.sample_counts:
        pt = _point_in_subprocess(s, cfg)
        points.append(pt)
        common.log(f"harness: S={s:>9,d} (chunk {pt['chunk_size']}, {pt['blocks']} blocks)  peak "
                   f"{pt['peak_rss_mb']:7.1f} MiB (baseline {pt['baseline_rss_mb']:6.1f}, growth "
                   f"{pt['growth_mb']:6.1f})  {pt['samples_per_s']:9,.0f} samples/s  {pt['seconds']:.1f} s")
    report = {
        "benchmark": NAME,
        "size": size,
        "quick": size != "full",
        "machine": common.machine_info(),
        "verify": {"models": "exactness.default_pair(0)", "tree": cfg.tree, "scheme": cfg.scheme,
                   "horizon": cfg.horizon, "check_acceptance": cfg.check_acceptance, "chunk_size": cfg.chunk_size},
        "points": points,
        "growth_ratio": points[-1]["growth_mb"] / max(points[0]["growth_mb"], 1e-9),
        "sample_ratio": points[-1]["num_samples"] / points[0]["num_samples"],
    }
    report["headline"] = headline(report)
    return report


def headline(report: dict) -> dict:
    """Samples/s and peak memory at the largest point; growth ratio largest / smallest."""
    last = report["points"][-1]
    return {"harness_samples_per_s": last["samples_per_s"], "harness_num_samples": last["num_samples"],
            "harness_peak_rss_mb": last["peak_rss_mb"], "harness_growth_ratio": report["growth_ratio"]}


def table(report: dict) -> str:
    """Markdown table: one line per sample count."""
    lines = ["| samples | blocks | peak RSS | growth over baseline | speculative samples/s | target-only samples/s |",
             "|---|---|---|---|---|---|"]
    for p in report["points"]:
        lines.append(f"| {p['num_samples']:,} | {p['blocks']} | {p['peak_rss_mb']:.0f} MiB | {p['growth_mb']:.0f} MiB |"
                     f" {p['samples_per_s']:,.0f} | {p['target_only_samples_per_s']:,.0f} |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Left: peak RSS and growth vs samples; right: samples/s vs samples."""
    plt = common.pyplot()
    pts = report["points"]
    s = [p["num_samples"] for p in pts]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.plot(s, [p["peak_rss_mb"] for p in pts], "o-", label="peak RSS")
    a.plot(s, [p["growth_mb"] for p in pts], "s-", label="growth over baseline (verify itself)")
    a.set_xscale("log", base=2)
    a.set_ylim(bottom=0)
    a.set_xlabel("samples S")
    a.set_ylabel("MiB")
    a.set_title(f"exactness harness memory (chunk {report['verify']['chunk_size']})", fontsize=9)
    a.legend(fontsize=8)
    b.plot(s, [p["samples_per_s"] for p in pts], "o-", label="speculative")
    b.plot(s, [p["target_only_samples_per_s"] for p in pts], "s-", label="target-only")
    b.set_xscale("log", base=2)
    b.set_ylim(bottom=0)
    b.set_xlabel("samples S")
    b.set_ylabel("samples / s (compile excluded)")
    m = report["machine"]
    b.set_title(f"harness throughput ({m['backend']}, {m['cpu_count']} cores, {report['size']})", fontsize=9)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main(argv=None) -> None:
    """Child entry point: one point, its JSON on the last line of stdout."""
    p = argparse.ArgumentParser(description="one exactness-harness memory point (used by jaxspec bench)")
    p.add_argument("--num-samples", type=int, required=True)
    p.add_argument("--chunk-size", type=int, required=True)
    p.add_argument("--tree", default="branch:2,2")
    p.add_argument("--scheme", default="iid")
    p.add_argument("--horizon", type=int, default=3)
    p.add_argument("--no-acceptance", action="store_true")
    a = p.parse_args(argv)
    out = measure_point(a.num_samples, a.chunk_size, tree=a.tree, scheme=a.scheme, horizon=a.horizon,
                        check_acceptance=not a.no_acceptance)
    print(json.dumps(out))


if __name__ == "__main__":
    _main()
