"""A draft head's data from nothing but its target: the data stages of the recipe.

1. ``instructions``: the target writes user messages itself (:mod:`jaxspec.training.magpie`),
   filtered and deduplicated, beside the hand-written seed instructions
   -> ``instructions.jsonl``;
2. ``answers``: the target answers every instruction under each sampling setting
   (:mod:`jaxspec.training.answers`) -> ``answers/`` (token shards, a few MB: commit them).

Both stages resume where a stopped run left them::

    python -m jaxspec.training.recipe --target smollm2-135m --out runs/smollm2-data
    python -m jaxspec.training.recipe --target smollm2-135m --out runs/smollm2-data --hours 1.5

``--hours`` stops starting new work after that long (the records so far are kept); run
the same command again to go on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main", "model_digest"]


def model_digest(name_or_path, target) -> str:
    """The target's identity for ``meta.json``: the sha256 of its GGUF file when it has one,
    else the digest of its weights."""
    from jaxspec.nn.head import target_digest  # noqa: PLC0415
    from jaxspec.nn.packaged import is_packaged_name, packaged_file  # noqa: PLC0415
    from jaxspec.training.shards import file_digest  # noqa: PLC0415

    path = packaged_file(name_or_path) if is_packaged_name(name_or_path) else Path(name_or_path)
    if path.is_file():
        return file_digest(path)
    return "weights:" + target_digest(target)


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m jaxspec.training.recipe", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="a packaged name (smollm2-135m), a GGUF file or a model folder")
    p.add_argument("--out", required=True, help="run folder (resumed when it holds a stopped run)")
    p.add_argument("--stage", choices=("instructions", "answers", "all"), default="all")
    p.add_argument("--per-category", type=int, default=500, help="self-written instructions kept per category")
    p.add_argument("--max-new-tokens", type=int, default=256, help="an answer's token budget")
    p.add_argument("--rows", type=int, default=64, help="rows decoded at once")
    p.add_argument("--hours", type=float, default=None, help="start no new batch after this many hours")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    import jaxspec  # noqa: PLC0415
    from jaxspec.training.answers import write_answers  # noqa: PLC0415
    from jaxspec.training.magpie import build_instructions, read_instructions  # noqa: PLC0415
    from jaxspec.training.shards import count_tokens  # noqa: PLC0415

    deadline = time.time() + 3600 * args.hours if args.hours else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = jaxspec.load_model(args.target)
    tok = jaxspec.load_tokenizer(args.target)
    progress = not args.no_progress
    if args.stage in ("instructions", "all"):
        items = build_instructions(target, tok, out / "instructions.jsonl", per_category=args.per_category,
                                   rows=args.rows, seed=args.seed, progress=progress)
        print(f"instructions: {len(items)} (seeds included)", flush=True)
    if args.stage in ("answers", "all"):
        items = read_instructions(out / "instructions.jsonl")
        records = write_answers(target, tok, items, out / "answers", model_digest=model_digest(args.target, target),
                                max_new_tokens=args.max_new_tokens, rows=args.rows, seed=args.seed,
                                progress=progress, deadline=deadline)
        print(f"answers: {len(records)} records, {count_tokens(records)} answer tokens", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
