"""Peak memory vs sample count, and samples/s, of the exactness harness.

The logic lives in ``jaxspec.bench`` (also run by ``jaxspec bench --only harness``); see
benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/harness_memory.py [--quick] [--out benchmarks/results]

Writes ``harness_memory.json`` and ``harness_memory.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("harness", default_out=pathlib.Path(__file__).resolve().parent / "results"))
