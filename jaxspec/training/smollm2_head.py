"""The recipe of the shipped ``smollm2-135m-head``: a feature draft head for SmolLM2-135M-Instruct
with a reduced draft vocabulary, trained on the target's own answers. Every stage resumes
where a stopped run left it, so the recipe spans sessions::

    python -m jaxspec.training.smollm2_head --out runs/smollm2-head            # all stages
    python -m jaxspec.training.smollm2_head --out runs/smollm2-head --stage train --steps 3000

Stages (each skipped when its output is complete):

1. ``responses``: the target answers every training instruction
   (:mod:`jaxspec.training.instructions`) at T = 0 and T = 1 (:mod:`jaxspec.training.responses`,
   the ``hf`` extra) -> ``responses.jsonl``.
2. ``features``: the target's features and log-normalizers on each chat (prompt + answer) and
   on :data:`CORPUS_CHUNKS` windows of the standard library's Python source, the repository's
   training corpus (:mod:`jaxspec.training.feature_cache`) -> ``features/``.
3. ``vocab``: the target's mean mass on the K most frequent ids, for each K of
   :data:`VOCAB_SIZES` (the ceiling of acceptance at T = 1) -> ``vocab.json``. The head drafts
   :data:`DRAFT_VOCAB` ids: with these coverages and the measured draft-step costs, the cost
   model's ideal speedup of ``chain:7`` is the same for 8,192 and 16,384 ids and lower for
   4,096 and for the whole vocabulary (benchmarks/README.md, ``cost_model``), and 8,192
   halves the training step's LM-head work against 16,384.
4. ``train``: the head (:func:`~jaxspec.training.head_cached.train_head_cached`, depths 1-3)
   -> ``checkpoint/``, ``final/`` and ``summary.json``.

docs/TRAINING.md records the shipped run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


__all__ = ["TARGET", "VOCAB_SIZES", "DRAFT_VOCAB", "CORPUS_CHUNKS", "sequences", "main"]

TARGET = "smollm2-135m"
VOCAB_SIZES = (1024, 2048, 4096, 8192, 16384)
DRAFT_VOCAB = 8192  # the ids the head drafts (stage 3 and benchmarks/README.md, cost_model: why)
CORPUS_CHUNKS = 96  # windows of the standard-library corpus, CORPUS_TOKENS tokens each
CORPUS_TOKENS = 384


def sequences(responses: list[dict], tokenizer, *, corpus_chunks: int = CORPUS_CHUNKS) -> list[list[int]]:
    """The token sequences the head trains on: each chat (prompt ids + answer ids), then
    ``corpus_chunks`` windows of the standard library's source, evenly spaced."""
    from jaxspec.training.corpus import list_source_files, stdlib_root  # noqa: PLC0415

    seqs = [r["prompt_ids"] + r["response_ids"] for r in responses]
    root = stdlib_root()
    files = list_source_files(root)
    step = max(1, len(files) // max(corpus_chunks, 1))
    for rel in files[::step][:corpus_chunks]:
        ids = tokenizer.encode((root / rel).read_text(encoding="utf-8", errors="replace"))[:CORPUS_TOKENS]
        if len(ids) >= 16:
            seqs.append(ids)
    return seqs


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m jaxspec.training.smollm2_head", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="run folder (resumed when it holds a stopped run)")
    p.add_argument("--stage", choices=("responses", "features", "vocab", "train", "all"), default="all")
    p.add_argument("--steps", type=int, default=3000, help="training steps (default 3000)")
    p.add_argument("--stop-at", type=int, default=None, help="stop training after this step (resume later)")
    p.add_argument("--vocab", type=int, default=DRAFT_VOCAB, help=f"the draft vocabulary's K (default {DRAFT_VOCAB})")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = ("responses", "features", "vocab", "train") if args.stage == "all" else (args.stage,)
    progress = not args.no_progress
    from jaxspec.training.responses import read_responses, write_responses  # noqa: PLC0415

    if "responses" in stages:
        write_responses(TARGET, out / "responses.jsonl", progress=progress)
    if not {"features", "vocab", "train"} & set(stages):
        return 0
    import jaxspec  # noqa: PLC0415
    from jaxspec.training.feature_cache import build_feature_cache  # noqa: PLC0415
    from jaxspec.training.head_cached import coverage, frequent_ids, train_head_cached  # noqa: PLC0415
    from jaxspec.training.train import CHECKPOINT_DIR, TrainConfig  # noqa: PLC0415

    target = jaxspec.load_model(TARGET)
    responses = read_responses(out / "responses.jsonl")
    if not responses:
        print(f"{out / 'responses.jsonl'}: no responses; run --stage responses first", file=sys.stderr)
        return 2
    seqs = sequences(responses, jaxspec.load_tokenizer(TARGET))
    cache = build_feature_cache(target, seqs, out / "features", progress=progress)
    if "vocab" in stages:  # a measurement: training reads --vocab, not this file
        ids = {k: frequent_ids(cache, k, vocab_size=target.config.vocab_size) for k in VOCAB_SIZES}
        cov = coverage(target, cache, ids)
        (out / "vocab.json").write_text(json.dumps({"coverage": {str(k): v for k, v in cov.items()}}, indent=2) + "\n")
        print("coverage of the K most frequent ids: " + ", ".join(f"{k}: {v:.3f}" for k, v in cov.items()))
    if "train" in stages:
        k = args.vocab
        ids = frequent_ids(cache, k, vocab_size=target.config.vocab_size)
        cfg = TrainConfig(steps=args.steps, batch_size=8, seq_len=128, lr=2e-3, warmup_steps=100, eval_every=250,
                          eval_windows=16, checkpoint_every=50)
        resume = (out / CHECKPOINT_DIR).exists()
        r = train_head_cached(target, cache, cfg, out, draft_vocab=ids, unroll=3, resume=resume,
                              progress=progress, stop_at=args.stop_at)
        print(f"step {r.step}: alpha {r.alpha_before:.3f} -> {r.alpha_after:.3f}" if r.final_dir else
              f"stopped at step {r.step}; run again to resume")
    return 0


if __name__ == "__main__":
    sys.exit(main())
