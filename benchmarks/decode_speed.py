"""Decoding speed: tree speculative decoding vs target-only sampling, side by side.

The logic lives in ``jaxspec.bench`` (also run by ``jaxspec bench --only decode``); see
benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/decode_speed.py [--quick] [--out benchmarks/results]

Writes ``decode_speed.json`` and ``decode_speed.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("decode", default_out=pathlib.Path(__file__).resolve().parent / "results"))
