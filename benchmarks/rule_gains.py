"""Gains of block and traversal verification over the token rule: exact expected tokens per
round on bigram tables, and tau / tokens/s of generate per rule on the default pair.

The logic lives in ``jaxspec.bench`` (also run by ``jaxspec bench --only rules``); see
benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/rule_gains.py [--quick] [--out benchmarks/results]

Writes ``rule_gains.json`` and ``rule_gains.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("rules", default_out=pathlib.Path(__file__).resolve().parent / "results"))
