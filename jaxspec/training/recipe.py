"""A draft head from nothing but its target: the whole recipe, in resumable stages.

1. ``instructions``: the target writes user messages itself (:mod:`jaxspec.training.magpie`),
   filtered and deduplicated, beside the hand-written seed instructions
   -> ``instructions.jsonl``. A target without a chat template (a base model) skips it: its
   prompts are windows of the standard library's source, which it continues;
2. ``answers``: the target answers every instruction under each sampling setting
   (:mod:`jaxspec.training.answers`) -> ``answers/`` (token shards, a few MB: commit them);
3. ``features``: the target's features on every prompt + answer, by teacher forcing
   (:mod:`jaxspec.training.feature_cache`, far cheaper per token than decoding; never commit
   them) -> ``features/``;
4. ``vocab``: the target's mass on the K most frequent ids for several K (the ceiling of
   acceptance at T = 1 for a head drafting K ids) -> ``vocab.json``;
5. ``train``: the head, on ``--vocab`` ids (:func:`~jaxspec.training.head_cached.train_head_cached`)
   -> ``checkpoint/``, ``final/``, ``summary.json``.

Every stage resumes where a stopped run left it::

    python -m jaxspec.training.recipe --target smollm2-135m --out runs/smollm2-head
    python -m jaxspec.training.recipe --target smollm2-135m --out runs/smollm2-head --stage answers --hours 1.5

``--hours`` stops the data stages from starting new batches after that long (what they
wrote is kept); run the same command again to go on. ``jaxspec train-head --target MODEL
--recipe DIR`` runs the same stages.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["STAGES", "VOCAB_SIZES", "main", "model_digest", "run_recipe", "base_prompts", "auto_feature_layers",
           "parse_feature_layers"]

STAGES = ("instructions", "answers", "features", "vocab", "train")
VOCAB_SIZES = (1024, 2048, 4096, 8192, 16384)  # the K whose coverage the vocab stage measures


def model_digest(name_or_path, target) -> str:
    """The target's identity for ``meta.json``: the sha256 of its GGUF file when it has one,
    else the digest of its weights."""
    from jaxspec.nn.head import target_digest  # noqa: PLC0415
    from jaxspec.formats.packaged import is_packaged_name, packaged_file  # noqa: PLC0415
    from jaxspec.training.shards import file_digest  # noqa: PLC0415

    path = packaged_file(name_or_path) if is_packaged_name(name_or_path) else Path(name_or_path)
    if path.is_file():
        return file_digest(path)
    return "weights:" + target_digest(target)


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m jaxspec.training.recipe", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="a packaged name (smollm2-135m), a GGUF file or a model folder")
    p.add_argument("--out", required=True, help="run folder (resumed when it holds a stopped run)")
    p.add_argument("--stage", choices=STAGES + ("all",), default="all")
    p.add_argument("--per-category", type=int, default=500, help="self-written instructions kept per category")
    p.add_argument("--max-new-tokens", type=int, default=256, help="an answer's token budget")
    p.add_argument("--rows", type=int, default=64, help="rows decoded at once")
    p.add_argument("--hours", type=float, default=None, help="start no new batch after this many hours")
    p.add_argument("--steps", type=int, default=3000, help="training steps (default 3000)")
    p.add_argument("--stop-at", type=int, default=None, help="stop training after this step (resume later)")
    p.add_argument("--vocab", type=int, default=8192, help="the ids the head drafts, the K most frequent (default 8192)")
    p.add_argument("--feature-layers", default=None, type=parse_feature_layers,
                   help="a multi-layer head (EAGLE-3): the target layers fused with the last ('1,14', or 'auto': "
                        "layer 1 and the middle one); default: the last layer only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def auto_feature_layers(num_layers: int) -> tuple[int, ...]:
    """A multi-layer head's default taps for a target of ``num_layers`` layers: the residuals
    entering layer 2 and the middle layer (EAGLE-3's low and middle; the last features are its
    high), one tap when they coincide."""
    return tuple(sorted({min(1, num_layers - 1), max(0, num_layers // 2 - 1)}))


def parse_feature_layers(text: str) -> tuple[int, ...] | str:
    """``"auto"`` or comma-separated layer indices (``"1,14"``), for ``--feature-layers``."""
    if text.strip() == "auto":
        return "auto"
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'auto' or layer indices such as 1,14") from None
    if not layers or list(layers) != sorted(set(layers)) or layers[0] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected increasing layer indices such as 1,14")
    return layers


def base_prompts(tokenizer, count: int = 512, tokens: int = 48) -> list[tuple[str, str]]:
    """Prompts for a target without a chat template: ``count`` windows of ``tokens`` tokens
    of the standard library's source, evenly spaced over its files (``("corpus", text)``)."""
    from jaxspec.training.corpus import list_source_files, stdlib_root  # noqa: PLC0415

    root = stdlib_root()
    files = list_source_files(root)
    step = max(1, len(files) // count)
    out = []
    for rel in files[::step][:count]:
        ids = tokenizer.encode((root / rel).read_text(encoding="utf-8", errors="replace"))[:tokens]
        if len(ids) >= 8:
            out.append(("corpus", tokenizer.decode(ids)))
    return out


def run_recipe(target, tokenizer, out, *, model_digest: str, stages=STAGES, per_category: int = 500,
               max_new_tokens: int = 256, rows: int = 64, steps: int = 3000, stop_at: int | None = None,
               vocab: int = 8192, train_config=None, hours: float | None = None, seed: int = 0,
               feature_layers: tuple[int, ...] | str | None = None, progress: bool = True) -> dict:
    """Runs ``stages`` of the recipe (module docstring) for ``target`` and its ``tokenizer``
    in folder ``out``; returns what each stage reports (counts, coverage, the training result).
    ``feature_layers``: a multi-layer head's target layers (or ``"auto"``, :func:`auto_feature_layers`);
    the features stage then keeps their taps."""
    from jaxspec.training.answers import write_answers  # noqa: PLC0415
    from jaxspec.training.magpie import build_instructions, read_instructions  # noqa: PLC0415
    from jaxspec.training.shards import count_tokens, read_shards  # noqa: PLC0415

    unknown = [st for st in stages if st not in STAGES]
    if unknown:
        raise ValueError(f"run_recipe: stages = {list(stages)}; {unknown[0]!r} is not one of {list(STAGES)}")
    deadline = time.time() + 3600 * hours if hours else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chat = getattr(tokenizer, "chat_template", None) is not None
    report: dict = {}
    if "instructions" in stages and chat:
        items = build_instructions(target, tokenizer, out / "instructions.jsonl", per_category=per_category,
                                   rows=rows, seed=seed, progress=progress)
        report["instructions"] = len(items)
    if "answers" in stages:
        items = read_instructions(out / "instructions.jsonl") if chat else base_prompts(tokenizer, 6 * per_category)
        records = write_answers(target, tokenizer, items, out / "answers", model_digest=model_digest,
                                max_new_tokens=max_new_tokens, rows=rows, seed=seed, progress=progress,
                                deadline=deadline)
        report["answers"] = {"records": len(records), "answer_tokens": count_tokens(records)}
        if deadline is not None and time.time() >= deadline:  # the answers may be unfinished: train later
            report["stopped"] = f"after {hours} hours, in the answers stage; run again to go on"
            return report
    if not {"features", "vocab", "train"} & set(stages):
        return report
    from jaxspec.training.feature_cache import build_feature_cache  # noqa: PLC0415
    from jaxspec.training.head_cached import coverage, frequent_ids, train_head_cached  # noqa: PLC0415
    from jaxspec.training.train import CHECKPOINT_DIR, TrainConfig  # noqa: PLC0415

    records = read_shards(out / "answers")
    if not records:
        raise ValueError(f"run_recipe: {out / 'answers'} holds no answers; run the answers stage first")
    if feature_layers == "auto":
        feature_layers = auto_feature_layers(target.config.num_hidden_layers)
    cache = build_feature_cache(target, [r.tokens for r in records], out / "features", progress=progress,
                                feature_layers=feature_layers)
    v = target.config.vocab_size
    if "vocab" in stages:  # a measurement: training reads `vocab`, not this file
        ks = [k for k in VOCAB_SIZES if k < v] + [v]
        cov = coverage(target, cache, {k: frequent_ids(cache, k, vocab_size=v) for k in ks})
        (out / "vocab.json").write_text(json.dumps({"coverage": {str(k): c for k, c in cov.items()}}, indent=2) + "\n")
        report["coverage"] = cov
    if "train" in stages:
        ids = None if vocab >= v else frequent_ids(cache, vocab, vocab_size=v)
        cfg = train_config or TrainConfig(steps=steps, batch_size=8, seq_len=128, lr=2e-3,
                                          warmup_steps=min(100, steps // 10), eval_every=250, eval_windows=16,
                                          checkpoint_every=50)
        r = train_head_cached(target, cache, cfg, out, draft_vocab=ids, unroll=3, feature_layers=feature_layers,
                              resume=(out / CHECKPOINT_DIR).exists(), progress=progress, stop_at=stop_at)
        report["train"] = r
    return report


def main(argv=None) -> int:
    args = _args(argv)
    import jaxspec  # noqa: PLC0415

    target = jaxspec.load_model(args.target)
    tok = jaxspec.load_tokenizer(args.target)
    stages = STAGES if args.stage == "all" else (args.stage,)
    rep = run_recipe(target, tok, args.out, model_digest=model_digest(args.target, target), stages=stages,
                     per_category=args.per_category, max_new_tokens=args.max_new_tokens, rows=args.rows,
                     steps=args.steps, stop_at=args.stop_at, vocab=args.vocab, hours=args.hours, seed=args.seed,
                     feature_layers=args.feature_layers,
                     progress=not args.no_progress)
    for name, value in rep.items():
        if name == "train":
            print(f"train: step {value.step}: alpha {value.alpha_before:.3f} -> {value.alpha_after:.3f}"
                  if value.final_dir else f"train: stopped at step {value.step}; run again to resume", flush=True)
        elif name == "coverage":
            print("coverage of the K most frequent ids: " + ", ".join(f"{k}: {c:.3f}" for k, c in value.items()))
        else:
            print(f"{name}: {value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
