"""JAX's CPU lowering of Threefry (a loop of five iterations) against the unrolled lowering
of ``jaxspec.core.cpu_rng``, side by side in one process: the same tokens, the time per
round of each.

The logic lives in ``jaxspec.bench.threefry``; see benchmarks/README.md for what is
measured. It needs a fresh process (the command line registers the unrolled lowering at
start), so it is not one of ``jaxspec bench``'s benchmarks.

    python benchmarks/threefry_lowering.py [--quick] [--out benchmarks/results]

Writes ``threefry_lowering.json`` and ``threefry_lowering.png`` under ``--out``.
"""

import argparse
import pathlib
import sys

from jaxspec.bench import common, threefry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the short version (a minute on 2 CPU cores)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # seconds; for tests
    p.add_argument("--out", help="folder for the JSON and PNG (default: benchmarks/results, its quick/ "
                                 "subfolder with --quick)")
    args = p.parse_args(argv)
    size = "tiny" if args.tiny else ("quick" if args.quick else "full")
    base = pathlib.Path(__file__).resolve().parent / "results"
    out = args.out or common.default_out_dir(size, base=base)
    report = threefry.run(size)
    files = common.write_report(report, out, threefry.NAME, threefry.plot)
    print(threefry.table(report))
    print(f"wrote {files['json']} and {files['png']}")
    return 0 if report["headline"]["threefry_same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
