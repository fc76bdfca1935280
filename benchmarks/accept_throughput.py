"""Throughput of the vmapped acceptance rule vs the random-number floor.

The logic lives in ``jaxspec.bench`` (also run by ``jaxspec bench --only accept``); see
benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/accept_throughput.py [--quick] [--out benchmarks/results]

Writes ``accept_throughput.json`` and ``accept_throughput.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("accept", default_out=pathlib.Path(__file__).resolve().parent / "results"))
