"""The feature draft head (``default-head``) vs the draft model (``default-draft``) and
target-only sampling: tau, tokens/s and speedup per batch, temperature and tree, the
one-step alphas and the cost of one draft step.

The logic lives in ``jaxspec.bench.head`` (also run by ``jaxspec bench --only head``);
see benchmarks/README.md for what is measured, the JSON fields and the plot.

    python benchmarks/feature_head.py [--quick] [--out benchmarks/results]

Writes ``feature_head.json`` and ``feature_head.png`` under ``--out``.
"""

import pathlib
import sys

from jaxspec.bench import script_main

if __name__ == "__main__":
    sys.exit(script_main("head", default_out=pathlib.Path(__file__).resolve().parent / "results"))
