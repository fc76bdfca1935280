"""Compile time of generate, generate_autoregressive and the vmapped acceptance rule.

The logic lives in ``jaxspec.bench`` (also run by ``jaxspec bench --only compile``); see
benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/compile_time.py [--quick] [--out benchmarks/results]

Writes ``compile_time.json`` and ``compile_time.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("compile", default_out=pathlib.Path(__file__).resolve().parent / "results"))
