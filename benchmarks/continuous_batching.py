"""Continuous batching (``generate(..., rows=8)``) over 64 held-out prompts, against the
same prompts in fixed batches of 8 and against target-only in batches of 8, for the default
draft model and the default feature head.

The logic lives in ``jaxspec.bench.queue`` (also run by ``jaxspec bench --only queue``);
see benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/continuous_batching.py [--quick] [--out benchmarks/results]

Writes ``continuous_batching.json`` and ``continuous_batching.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("queue", default_out=pathlib.Path(__file__).resolve().parent / "results"))
