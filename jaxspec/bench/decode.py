"""Decoding speed: tree speculative decoding vs target-only sampling, side by side.

For each batch size (1, and 8 prompts of different lengths), temperature (0 and 1) and
tree -- chains, static trees, an **optimized** tree and a **dynamic** tree -- on the same
models in the same run:

* tokens/s of :func:`jaxspec.generate` and of :func:`jaxspec.generate_autoregressive`
  (median of timed calls after a warm-up compile, ``block_until_ready``; the two, and the
  cost measurements below, take turns so that a changing machine load hits all alike),
  and the speedup (speculative / target-only tokens/s), with the lowest and highest
  speedup of a single turn (``speedup_turn_range``: how much it moved within the run);
* tau (tokens per target call) and the acceptance rate per depth;
* the measured costs of one target decode step, one draft step and one tree verification
  (each a jitted ``fori_loop`` of forwards divided by its length, so dispatch is not
  counted), and the *ideal* speedup they predict::

      ideal = tau * t_target_step / (draft_forwards_per_round * t_draft_step + t_verify(N + 1))

  The gap between ideal and measured speedup is framework overhead (draws, acceptance,
  cache commits, the loop), also reported per round (``overhead_ms_per_round``).

The optimized tree: the positional acceptance of the pair is measured per temperature with
:func:`jaxspec.tuning.optimize.measure_acceptance` on held-out windows of
:func:`jaxspec.training.corpus.load_corpus` (the validation split, never trained on), under the
scheme that temperature decodes with (``deterministic`` at 0, ``without_replacement`` at
1), and :func:`jaxspec.tuning.optimize.optimize_tree` builds the best tree with the node budget
and the depth of the static tree it is compared with (``optimized_like``), so both cost
the same draft forwards and one verification of the same size per round. Every static
tree's row also carries ``model_tau``, the tau the acceptance model predicts for it.

Models: ``default-target`` / ``default-draft`` (the embedded byte-level pair); the
``tiny`` size uses small random models (figures meaningless, code paths exercised).

JSON (``decode_speed.json``): ``results`` rows (see :data:`ROW_FIELDS`), ``acceptance``
and ``optimized`` per temperature, ``headline`` (chain:4, temperature 0, batch 1:
``decode_speedup``, ``tau``). Plot: measured and ideal speedup per tree, one panel per
(batch, temperature).

    report = run("tiny")
    report["headline"]["decode_speedup"] > 0     # True
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxspec.bench import common
from jaxspec.core.settings import Sampling
from jaxspec.core.treespec import DynamicTree, StaticTree, parse_tree

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen  # noqa: E402
from jaxspec.nn.model import Transformer

__all__ = ["NAME", "DecodeBenchConfig", "batch_prompts", "sibling_scheme", "CONFIGS", "ROW_FIELDS", "run", "plot", "headline", "table"]

NAME = "decode_speed"
DEFAULT_PROMPT = "The history of the city begins with"
#: batch 8: prompts of eight different lengths (9 to 43 bytes), prose and code
BATCH_PROMPTS = (
    "The history of the city begins with",
    "def parse(line):",
    "import os",
    "class Parser:\n    def __init__(self, text):",
    "for i in range(",
    "        return self._",
    "# Copyright 2001 Python",
    'if __name__ == "__main__":',
)
#: the tree of ``jaxspec generate`` (the headline row)
HEADLINE_TREE = "chain:4"
OPTIMIZED = "optimized"

ROW_FIELDS = (
    "batch", "temperature", "tree", "kind", "scheme", "num_nodes", "depth", "parents", "tau", "model_tau",
    "accept_rate_per_depth", "loop_rounds", "tokens_per_s", "target_only_tokens_per_s", "speedup", "speedup_turn_range",
    "ideal_speedup",
    "draft_forwards_per_round", "t_target_step_ms", "t_draft_step_ms", "t_verify_ms", "target_only_ms_per_token",
    "seconds_per_call", "overhead_ms_per_round",
)

TINY_VOCAB = common.TINY_VOCAB


@dataclasses.dataclass(frozen=True)
class DecodeBenchConfig:
    """runs: ``(batch, trees)`` pairs; a tree is a :func:`~jaxspec.core.treespec.parse_tree`
    spec or ``"optimized"`` (see the module docstring)."""

    runs: tuple[tuple[int, tuple[str, ...]], ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    optimized_like: str  # the static tree giving the optimized tree's budget and depth
    acceptance_windows: int  # held-out windows for measure_acceptance
    acceptance_seq_len: int
    acceptance_max_files: int | None  # files of the validation split read
    max_rank: int = 4  # sibling ranks measured
    num_draws: int = 8  # sibling draws per row (random schemes)
    models: str = "default"  # "default" (embedded pair) or "tiny" (random)
    loops: int = 16  # forwards per cost measurement


CONFIGS = {
    "full": DecodeBenchConfig(
        runs=((1, ("chain:2", "chain:4", "branch:2,2", "branch:3,2,1", OPTIMIZED, "branch:4,2,2,1",
                   "dynamic:depth=4,topk=4,nodes=16")),
              (8, ("chain:4", "branch:3,2,1", OPTIMIZED, "dynamic:depth=4,topk=4,nodes=16"))),
        temperatures=(0.0, 1.0), max_new_tokens=128, repeats=5, optimized_like="branch:3,2,1",
        acceptance_windows=64, acceptance_seq_len=128, acceptance_max_files=40,
    ),
    "quick": DecodeBenchConfig(
        runs=((1, ("chain:4", "branch:2,2", OPTIMIZED, "dynamic:depth=3,topk=2,nodes=6")),
              (8, ("chain:4",))),
        temperatures=(0.0, 1.0), max_new_tokens=32, repeats=3, optimized_like="branch:2,2",
        acceptance_windows=16, acceptance_seq_len=128, acceptance_max_files=10,
    ),
    "tiny": DecodeBenchConfig(
        runs=((1, ("chain:4",)),),
        temperatures=(0.0,), max_new_tokens=8, repeats=1, optimized_like="branch:2,2",
        acceptance_windows=2, acceptance_seq_len=16, acceptance_max_files=1, num_draws=2, models="tiny", loops=2,
    ),
}


def _models(kind: str) -> tuple[Transformer, Transformer, dict]:
    target, draft = common.model_pair(kind)
    if kind == "tiny":
        return target, draft, {"target": f"tiny random (exactness.default_pair, V={TINY_VOCAB})",
                               "draft": "its mixed draft"}
    return target, draft, {"target": "default-target", "draft": "default-draft"}


def batch_prompts(batch: int) -> list[list[int]]:
    """``batch`` byte-tokenized prompts (with BOS); batch 1: :data:`DEFAULT_PROMPT`."""
    from jaxspec.formats.tokenizer import ByteTokenizer  # noqa: PLC0415

    if not 1 <= batch <= len(BATCH_PROMPTS):
        raise ValueError(f"batch = {batch!r}: expected 1 .. {len(BATCH_PROMPTS)} (prompts available)")
    texts = [DEFAULT_PROMPT] if batch == 1 else list(BATCH_PROMPTS[:batch])
    tok = ByteTokenizer()
    return [tok.encode(t, add_bos=True) for t in texts]


def sibling_scheme(spec, temperature: float) -> str:
    """The scheme the benchmarks decode ``spec`` with: ``deterministic`` for a dynamic tree or at
    temperature 0 (the draft's top-k), else ``without_replacement``."""
    return "deterministic" if isinstance(spec, DynamicTree) or temperature == 0.0 else "without_replacement"


def _acceptance(target, draft, cfg: DecodeBenchConfig, temperature: float) -> dict:
    """Positional acceptance of the pair at ``temperature`` on held-out windows."""
    from jaxspec.training.corpus import eval_windows, load_corpus  # noqa: PLC0415
    from jaxspec.tuning.optimize import measure_acceptance  # noqa: PLC0415

    corpus = load_corpus(max_files=cfg.acceptance_max_files)
    windows = eval_windows(corpus.val, cfg.acceptance_windows, cfg.acceptance_seq_len)  # int32[W, T + 1]
    scheme = "deterministic" if temperature == 0.0 else "without_replacement"
    est = measure_acceptance(target, draft, windows, max_rank=cfg.max_rank, scheme=scheme,
                             sampling=Sampling(temperature=temperature),
                             key=jax.random.key(7), num_draws=cfg.num_draws)
    return {"temperature": temperature, "scheme": scheme, "mean": [float(x) for x in est.mean],
            "stderr": [float(x) for x in np.nan_to_num(est.stderr)], "num_positions": int(est.num_positions),
            "windows": int(windows.shape[0]), "window_len": int(windows.shape[1]),
            "val_files": len(corpus.val_files)}


def _optimized(acc: dict, like: str) -> dict:
    from jaxspec.tuning.optimize import expected_accepted, optimize_tree  # noqa: PLC0415

    ref = parse_tree(like)
    if not isinstance(ref, StaticTree):
        raise ValueError(f"optimized_like = {like!r}: expected a static tree spec")
    opt = optimize_tree(acc["mean"], ref.num_nodes, ref.depth)
    return {"temperature": acc["temperature"], "like": like, "budget": ref.num_nodes, "max_depth": ref.depth,
            "parents": [int(p) for p in opt.parents], "expected_tokens": float(opt.expected_tokens),
            "like_expected_tokens": float(expected_accepted(list(ref.parents), acc["mean"]) + 1.0)}


def _resolve(name: str, optimized: dict | None):
    if name == OPTIMIZED:
        return StaticTree.from_parents(optimized["parents"]), f"optimized({optimized['like']})", "optimized"
    spec = parse_tree(name)
    kind = "dynamic" if isinstance(spec, DynamicTree) else (
        "chain" if spec.num_nodes == spec.depth else "static")
    return spec, name, kind


def _supported(rule: str, spec, scheme: str) -> bool:
    from jaxspec.core.rules import check_rule  # noqa: PLC0415

    try:
        check_rule(rule, scheme, spec)
    except ValueError:
        return False
    return True


def run(size: str = "quick", *, config: DecodeBenchConfig | None = None, rule: str = "token") -> dict:
    """Measure every (batch, temperature, tree) of ``CONFIGS[size]`` (or of ``config``),
    verifying with ``rule`` (:data:`jaxspec.core.rules.RULES`; the trees it does not support
    are skipped and listed under ``skipped``); returns the report."""
    from jaxspec.core.rules import RULES  # noqa: PLC0415

    if rule not in RULES:
        raise ValueError(f"rule = {rule!r}: expected one of {', '.join(RULES)}")
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, draft, names = _models(cfg.models)
    m = cfg.max_new_tokens
    ctx = target.config.max_position_embeddings
    acceptance, optimized = {}, {}
    if any(OPTIMIZED in trees for _, trees in cfg.runs):
        for temp in cfg.temperatures:
            common.log(f"decode: measuring positional acceptance at temperature {temp:g} on held-out text")
            acceptance[temp] = _acceptance(target, draft, cfg, temp)
            optimized[temp] = _optimized(acceptance[temp], cfg.optimized_like)
            common.log(f"decode:   acceptance {np.round(acceptance[temp]['mean'], 3).tolist()} -> optimized "
                       f"parents {optimized[temp]['parents']} (model tau {optimized[temp]['expected_tokens']:.2f} "
                       f"vs {optimized[temp]['like_expected_tokens']:.2f} for {cfg.optimized_like})")

    results, skipped = [], []
    prompt_lens = {}
    for batch, trees in cfg.runs:
        prompts = batch_prompts(batch)
        lens = [len(p) for p in prompts]
        prompt_lens[batch] = lens
        cap = min(max(lens) + m + 64 + 1, ctx)
        mid = int(np.mean(lens)) + m // 2  # cache fill at which forwards are costed
        target_step = common.forward_loop([(target, 1)], batch, cap, mid, cfg.loops)
        draft_step = common.forward_loop([(draft, 1)], batch, cap, mid, cfg.loops)
        for temp in cfg.temperatures:

            def ar(i, temp=temp, prompts=prompts):
                return gen.generate_autoregressive(jax.random.key(1000 + i), target, prompts, max_new_tokens=m,
                                                   sampling=Sampling(temperature=temp), stop_tokens=())

            for name in trees:
                spec, label, kind = _resolve(name, optimized.get(temp))
                scheme = sibling_scheme(spec, temp)
                if not _supported(rule, spec, scheme):
                    skipped.append({"batch": batch, "temperature": temp, "tree": label, "scheme": scheme})
                    common.log(f"decode: B={batch} T={temp:g} {label}: skipped, rule {rule!r} does not support it "
                               f"with scheme {scheme!r}")
                    continue
                n = spec.num_nodes
                forwards = spec.depth + (1 if isinstance(spec, DynamicTree) else 0)

                def sp(i, temp=temp, spec=spec, scheme=scheme, prompts=prompts):
                    return gen.generate(jax.random.key(2000 + i), target, draft, prompts, max_new_tokens=m,
                                        tree=spec, scheme=scheme, sampling=Sampling(temperature=temp), rule=rule,
                                        stop_tokens=())

                fns = {"ar": ar, "spec": sp, "target_step": target_step, "draft_step": draft_step,
                       "verify": common.forward_loop([(target, n + 1)], batch, cap, mid, cfg.loops)}
                turns, outs = common.interleaved_turns(fns, cfg.repeats)
                row = _row(batch, temp, label, kind, scheme, spec, forwards, turns, outs, cfg.loops,
                           acceptance.get(temp))
                results.append(row)
                common.log(
                    f"decode: B={batch} T={temp:g} {label:34s} {scheme:20s} tau {row['tau']:.3f}  "
                    f"{row['tokens_per_s']:8.1f} tok/s vs {row['target_only_tokens_per_s']:8.1f}  "
                    f"speedup {row['speedup']:.2f}x (turns {row['speedup_turn_range'][0]:.2f}-"
                    f"{row['speedup_turn_range'][1]:.2f}x; ideal {row['ideal_speedup']:.2f}x)  "
                    f"overhead {row['overhead_ms_per_round']:.3f} ms/round")
    mach = common.machine_info()
    report = {
        "benchmark": NAME,
        "size": size,
        "quick": size != "full",
        "rule": rule,
        "machine": mach,
        # fields of the original script, kept for readers of older JSON
        "device": mach["device"], "backend": mach["backend"], "platform": mach["platform"], "jax": mach["jax"],
        **names,
        "batches": [b for b, _ in cfg.runs],
        "prompt": DEFAULT_PROMPT,
        "prompt_len": prompt_lens.get(1, [None])[0],
        "prompt_lens": {str(b): v for b, v in prompt_lens.items()},
        "max_new_tokens": m,
        "repeats": cfg.repeats,
        "acceptance": [acceptance[t] for t in sorted(acceptance)],
        "optimized": [optimized[t] for t in sorted(optimized)],
        "results": results,
        "skipped": skipped,
    }
    report["headline"] = headline(report)
    return report


def _row(batch, temp, label, kind, scheme, spec, forwards, turns, outs, loops, acc) -> dict:
    """One result row from the per-turn wall seconds of each timed function (``turns``)
    and the outputs of their last calls. A turn's speedup is the ratio of its two times
    scaled by the token counts of the last calls (every call emits the same count here:
    fixed ``max_new_tokens``, ``stop_tokens=()``)."""
    sec = common.medians(turns)
    t_target_step, t_draft_step, t_verify = (sec[k] / loops for k in ("target_step", "draft_step", "verify"))
    s = outs["spec"].summary()
    ar_tokens = int(np.asarray(outs["ar"].lengths).sum())
    ar_tps = ar_tokens / sec["ar"]
    tps = s["num_tokens"] / sec["spec"]
    model_tau = None
    if acc is not None and isinstance(spec, StaticTree):
        from jaxspec.tuning.optimize import expected_accepted  # noqa: PLC0415

        model_tau = float(expected_accepted(list(spec.parents), acc["mean"]) + 1.0)
    return {
        "batch": batch,
        "temperature": temp,
        "tree": label,
        "kind": kind,
        "scheme": scheme,
        "num_nodes": spec.num_nodes,
        "depth": spec.depth,
        "parents": list(spec.parents) if isinstance(spec, StaticTree) else None,
        "tau": s["tokens_per_target_call"],
        "model_tau": model_tau,
        "accept_rate_per_depth": s["accept_rate_per_depth"],
        "loop_rounds": s["loop_rounds"],  # rounds of the batch's loop (the most of any row)
        "tokens_per_s": tps,
        "target_only_tokens_per_s": ar_tps,
        "speedup": tps / ar_tps,
        # lowest and highest speedup of a single turn (speculative and target-only timed
        # seconds apart): how much the figure moved within the run
        "speedup_turn_range": [x * s["num_tokens"] / ar_tokens for x in common.turn_range(turns["ar"], turns["spec"])],
        "ideal_speedup": s["tokens_per_target_call"] * t_target_step / (forwards * t_draft_step + t_verify),
        "draft_forwards_per_round": forwards,
        "t_target_step_ms": t_target_step * 1e3,
        "t_draft_step_ms": t_draft_step * 1e3,
        "t_verify_ms": t_verify * 1e3,
        "target_only_ms_per_token": sec["ar"] / max(ar_tokens, 1) * 1e3,
        "seconds_per_call": sec["spec"],
        # wall time per round not explained by the model forwards
        "overhead_ms_per_round": (sec["spec"] / max(s["loop_rounds"], 1) - forwards * t_draft_step - t_verify) * 1e3,
    }


def headline(report: dict) -> dict:
    """``decode_speedup`` and ``tau`` of chain:4 at temperature 0, batch 1 (the default CLI
    tree), with its tokens/s and the target-only tokens/s."""
    for r in report["results"]:
        if r["tree"] == HEADLINE_TREE and r["temperature"] == 0.0 and r["batch"] == 1:
            return {"decode_speedup": r["speedup"], "tau": r["tau"], "tokens_per_s": r["tokens_per_s"],
                    "target_only_tokens_per_s": r["target_only_tokens_per_s"], "tree": HEADLINE_TREE}
    raise ValueError(f"report: no row for {HEADLINE_TREE} at temperature 0, batch 1")


def table(report: dict) -> str:
    """Markdown table: one line per (batch, tree), temperatures side by side."""
    temps = sorted({r["temperature"] for r in report["results"]})
    head = "| batch | tree |"
    for t in temps:
        head += f" T={t:g} tau | T={t:g} tokens/s spec vs target-only | T={t:g} speedup [turns] (ideal) |"
    lines = [head, "|---" * (2 + 3 * len(temps)) + "|"]
    keys = list(dict.fromkeys((r["batch"], r["tree"]) for r in report["results"]))
    for b, tree in keys:
        line = f"| {b} | {tree} |"
        for t in temps:
            r = next((r for r in report["results"] if (r["batch"], r["tree"], r["temperature"]) == (b, tree, t)),
                     None)
            line += (" - | - | - |" if r is None else
                     f" {r['tau']:.2f} | {r['tokens_per_s']:.0f} vs {r['target_only_tokens_per_s']:.0f} |"
                     f" {r['speedup']:.2f}× {_turns(r)}({r['ideal_speedup']:.2f}×) |")
        lines.append(line)
    return "\n".join(lines)


def _turns(r: dict) -> str:
    """``[lo–hi] `` of a row's per-turn speedups (empty for JSON written before they were
    recorded)."""
    lo_hi = r.get("speedup_turn_range")
    return f"[{lo_hi[0]:.2f}–{lo_hi[1]:.2f}] " if lo_hi else ""


def _upper(rows: list[dict]) -> list[float]:
    """Top of each row's measured bar: the fastest turn's speedup when recorded."""
    return [max(r["speedup"], (r.get("speedup_turn_range") or [0.0, 0.0])[1]) for r in rows]


def plot(report: dict, path) -> None:
    """Measured and ideal speedup per tree; one panel per (batch, temperature)."""
    plt = common.pyplot()
    panels = list(dict.fromkeys((r["batch"], r["temperature"]) for r in report["results"]))
    ncol = len({t for _, t in panels})
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4.2 * nrow), squeeze=False)
    for ax, (batch, temp) in zip(axes.flat, panels):
        rows = [r for r in report["results"] if (r["batch"], r["temperature"]) == (batch, temp)]
        x = np.arange(len(rows))
        ys = [r["speedup"] for r in rows]
        err = common.whiskers(ys, [r.get("speedup_turn_range") for r in rows])
        ax.bar(x - 0.2, ys, 0.4, yerr=err, capsize=2, error_kw={"lw": 0.8},
               label="measured speedup (whiskers: slowest-fastest turn)")
        ax.bar(x + 0.2, [r["ideal_speedup"] for r in rows], 0.4, label="ideal (from tau and costs)")
        tops = [max(r["ideal_speedup"], hi) for r, hi in zip(rows, _upper(rows))]
        for i, (r, top) in enumerate(zip(rows, tops)):
            ax.text(i, top * 1.02, f"tau {r['tau']:.2f}", ha="center", va="bottom", fontsize=8)
        # headroom above the tallest bar / whisker and its label for the legend
        ax.set_ylim(0, 1.35 * max(tops + [1.0]))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x, [r["tree"].replace("dynamic:", "dyn:") for r in rows], rotation=25, ha="right", fontsize=8)
        ax.set_title(f"temperature {temp:g}, batch {batch} ({report['machine']['backend']}, {report['size']})")
        ax.set_ylabel("speedup vs target-only")
        ax.legend(fontsize=8, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
