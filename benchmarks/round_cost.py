"""A round of ``jaxspec.generate`` against the model forwards it runs (batch 1 and 8, a chain
and a branching tree, T = 0 and 1), with a profile of each call by named scope.

The logic lives in ``jaxspec.bench.round_cost`` (also run by ``jaxspec bench --only round``);
see benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/round_cost.py [--quick] [--out benchmarks/results]

Writes ``round_cost.json`` and ``round_cost.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("round", default_out=pathlib.Path(__file__).resolve().parent / "results"))
