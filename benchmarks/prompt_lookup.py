"""Prompt lookup (n-gram) drafts vs the draft model and target-only sampling, on prompts
that hold their continuation (grounded, self) and on prompts that do not (code).

The logic lives in ``jaxspec.bench.lookup`` (also run by ``jaxspec bench --only lookup``);
see benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/prompt_lookup.py [--quick] [--out benchmarks/results]

Writes ``prompt_lookup.json`` and ``prompt_lookup.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("lookup", default_out=pathlib.Path(__file__).resolve().parent / "results"))
