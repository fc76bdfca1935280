"""The feature draft head against the separate draft model, side by side.

For every (batch, temperature, tree), on the same prompts, taking turns in one process
(:func:`jaxspec.bench.common.interleaved_turns`): target-only sampling, the default draft
model, and the default feature head (:class:`~jaxspec.nn.head.FeatureHead`, shipped as
``default-head``), each drafting the tree. Rows report tau (tokens per target call over the
timed calls), tokens/s and the speedup over target-only measured in the same turns.

Also, once per run:

* ``alpha``: the one-step acceptance ``mean sum_v min(p, q)`` of each drafter at
  temperature 1 on held-out windows of the corpus's validation split (teacher forced: the
  head reads the target's true features, as in its first draft step);
* the cost of one draft step: a one-token forward of the draft model and of the head over a
  cache (a jitted ``fori_loop`` divided by its length, so dispatch is not counted), and of
  one target step for scale.

Batch 8 decodes the decode benchmark's eight prompts of different lengths
(:data:`jaxspec.bench.decode.BATCH_PROMPTS`) together; batch 1 decodes ``single_prompts``
held-out prompts of ``single_prompt_len`` tokens (:func:`jaxspec.bench.common.held_out_prompts`:
the corpus's validation split; one length, so one compilation per mode) one after
another, a turn being that sequence, so a batch-1 row's tau and tokens/s are over all of
them. ``accepted_per_round`` is the mean
number of drafted nodes accepted at each depth per round (``accepted_per_depth`` summed over
rows and divided by the rounds, in the last timed turn). ``tiny`` uses small random models
and a random head (figures meaningless, code paths exercised).

JSON (``feature_head.json``): ``rows``, ``alpha``, ``step_ms``, ``headline`` (chain:4:
the head's and the draft's tau and speedup at temperatures 0 and 1, batch 1). Plot: tau and
speedup per mode, one panel per (batch, temperature).

    report = run("tiny")
    {r["mode"] for r in report["rows"]} >= {"draft chain:4", "head chain:4"}    # True
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.bench import common
from jaxspec.bench.decode import BATCH_PROMPTS
from jaxspec.core.settings import Sampling

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen
from jaxspec.nn.cache import init_cache
from jaxspec.nn.masks import causal_cache_mask

__all__ = ["NAME", "HeadBenchConfig", "CONFIGS", "run", "plot", "headline", "table"]

NAME = "feature_head"
HEADLINE_TREE = "chain:4"


@dataclasses.dataclass(frozen=True)
class HeadBenchConfig:
    batches: tuple[int, ...]
    trees: tuple[str, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    alpha_windows: int
    alpha_seq_len: int
    alpha_max_files: int | None
    single_prompts: int = 8  # batch 1: decode this many held-out prompts, one at a time
    single_prompt_len: int = 32
    models: str = "default"  # "default" (embedded pair and head) or "tiny" (random)
    loops: int = 32  # forwards per step-cost measurement


CONFIGS = {
    "full": HeadBenchConfig(batches=(1, 8), trees=("chain:4", "chain:6", "branch:2,1,1,1"), temperatures=(0.0, 1.0),
                            max_new_tokens=128, repeats=3, alpha_windows=64, alpha_seq_len=128, alpha_max_files=40),
    "quick": HeadBenchConfig(batches=(1, 8), trees=("chain:4",), temperatures=(0.0, 1.0), max_new_tokens=48,
                             repeats=2, alpha_windows=16, alpha_seq_len=128, alpha_max_files=10, single_prompts=2),
    "tiny": HeadBenchConfig(batches=(1,), trees=("chain:4",), temperatures=(1.0,), max_new_tokens=8, repeats=1,
                            alpha_windows=2, alpha_seq_len=16, alpha_max_files=1, single_prompts=2, single_prompt_len=12,
                    models="tiny", loops=2),
}


def _models(kind: str):
    """``(target, draft, head, names)``."""
    target, draft = common.model_pair(kind)
    if kind == "tiny":
        from jaxspec.nn.head import head_config, init_head  # noqa: PLC0415

        return target, draft, init_head(head_config(target.config), jax.random.key(7)), {
            "target": "tiny random", "draft": "its mixed draft", "head": "a random head"}
    from jaxspec.formats.checkpoint import load_draft  # noqa: PLC0415

    return target, draft, load_draft("default-head"), {
        "target": "default-target", "draft": "default-draft", "head": "default-head"}


def _prompt_sets(cfg: HeadBenchConfig, batch: int) -> list[list[list[int]]]:
    """The batches one call decodes in turn: ``single_prompts`` batches of one held-out
    prompt at batch 1, else one batch of ``batch`` prompts."""
    from jaxspec.formats.tokenizer import ByteTokenizer  # noqa: PLC0415

    if batch == 1:
        ps = common.held_out_prompts([cfg.single_prompt_len] * cfg.single_prompts, cfg.alpha_max_files)
        return [[p] for p in ps]
    tok = ByteTokenizer()
    return [[tok.encode(t, add_bos=True) for t in BATCH_PROMPTS[:batch]]]


def _in_turn(fn, sets):
    """``f(i)``: ``fn(i, prompts)`` for each batch of ``sets`` in turn, the results joined
    along the batch axis (one :class:`~jaxspec.GenerateResult` of every prompt)."""
    def f(i):
        return common.joined_results([fn(i, prompts) for prompts in sets])
    return f


def _alpha(cfg: HeadBenchConfig, target, draft, head) -> dict:
    from jaxspec.training.corpus import load_corpus  # noqa: PLC0415
    from jaxspec.training.head import evaluate_head  # noqa: PLC0415
    from jaxspec.training.train import TrainConfig, acceptance_alpha, validation_windows  # noqa: PLC0415

    corpus = load_corpus(max_files=cfg.alpha_max_files)
    windows = validation_windows(corpus, TrainConfig(seq_len=cfg.alpha_seq_len, eval_windows=cfg.alpha_windows))
    return {"draft": float(acceptance_alpha(target, draft, windows)),
            "head": float(evaluate_head(head, target, windows)["alpha"]), "windows": int(len(windows)),
            "seq_len": cfg.alpha_seq_len}


def _step_loop(step, state, cache, loops: int):
    """``f(i)``: ``loops`` one-token forwards ``step(state, cache, token, pos, mask)`` over
    ``cache`` in one jitted ``fori_loop`` (divide its time by ``loops``)."""
    b = cache.lengths.shape[0]
    mask = causal_cache_mask(cache.lengths, 1, cache.capacity)  # [B, 1, S]
    pos = cache.lengths[:, None]  # [B, 1]

    @jax.jit
    def run(state, cache):
        def body(i, carry):
            c, acc = carry
            out, c = step(state, c, jnp.full((b, 1), i % 7, jnp.int32), pos, mask)
            return c, acc + out[0, -1, 0]

        return jax.lax.fori_loop(0, loops, body, (cache, jnp.float32(0)))[1]

    return lambda i: run(state, cache)


def _step_costs(cfg: HeadBenchConfig, target, draft, head, prefix: int = 64) -> dict:
    """Milliseconds of one forward of one token at batch 1 over ``prefix`` cached tokens: the
    draft model's, the head's (including its LM-head projection, which a draft step needs),
    and the target's."""
    cap = prefix + 8
    tdef, tstate = nnx.split(target)
    ddef, dstate = nnx.split(draft)
    hdef, hstate = nnx.split(head)

    def start(config):
        return init_cache(config, 1, cap).replace(lengths=jnp.full((1,), prefix, jnp.int32))

    def model_step(gdef):
        def step(state, cache, tok, pos, mask):
            return nnx.merge(gdef, state)(tok, pos, cache, mask)
        return step

    def head_step(states, cache, tok, pos, mask):
        t, h = nnx.merge(tdef, states[0]), nnx.merge(hdef, states[1])
        feats = jnp.zeros((1, 1, head.config.hidden_size), jnp.float32)
        out, cache = h(t, feats, tok, pos, cache, mask)
        return t.unembed(out), cache

    fns = {
        "draft": _step_loop(model_step(ddef), dstate, start(draft.config), cfg.loops),
        "head": _step_loop(head_step, (tstate, hstate), start(head.config), cfg.loops),
        "target": _step_loop(model_step(tdef), tstate, start(target.config), cfg.loops),
    }
    turns, _ = common.interleaved_turns(fns, max(cfg.repeats, 3))
    sec = common.medians(turns)
    return {k: 1e3 * v / cfg.loops for k, v in sec.items()} | {"prefix": prefix}


def run(size: str = "quick", *, config: HeadBenchConfig | None = None) -> dict:
    """Measure every (batch, temperature, tree) of ``CONFIGS[size]`` (or ``config``)."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, draft, head, names = _models(cfg.models)
    rows = []
    for batch in cfg.batches:
        sets = _prompt_sets(cfg, batch)
        for temp in cfg.temperatures:
            rows += _measure(cfg, target, draft, head, batch, sets, temp)
    report = {
        "benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
        "config": dataclasses.asdict(cfg), "models": names, "rows": rows,
        "alpha": _alpha(cfg, target, draft, head), "step_ms": _step_costs(cfg, target, draft, head),
    }
    report["headline"] = headline(report)
    return report


def _measure(cfg, target, draft, head, batch, sets, temp) -> list[dict]:
    m = cfg.max_new_tokens

    def ar(i, prompts):
        return gen.generate_autoregressive(jax.random.key(1000 + i), target, prompts, max_new_tokens=m,
                                           sampling=Sampling(temperature=temp), stop_tokens=())

    fns = {"target-only": _in_turn(ar, sets)}
    for spec in cfg.trees:
        for kind, model in (("draft", draft), ("head", head)):
            def sp(i, prompts, spec=spec, model=model):
                return gen.generate(jax.random.key(2000 + i), target, model, prompts, max_new_tokens=m, tree=spec,
                                    sampling=Sampling(temperature=temp), stop_tokens=())
            fns[f"{kind} {spec}"] = _in_turn(sp, sets)
    turns, outs, totals = common.tallied_turns(fns, cfg.repeats)
    rows = []
    for name in fns:
        kind, _, tree = name.partition(" ")
        row = {"batch": batch, "temperature": temp, "mode": name, "drafter": kind, "tree": tree or None,
               "prompts": sum(len(x) for x in sets), **common.speed_fields(name, turns, outs, totals)}
        if tree:
            rounds = max(int(np.asarray(outs[name].rounds).sum()), 1)
            row["accepted_per_round"] = [float(a) / rounds
                                         for a in np.asarray(outs[name].accepted_per_depth).sum(axis=0)]
        if temp == 0.0:
            row["same_tokens_as_target_only"] = common.same_tokens(outs, name)
        rows.append(row)
        common.log(f"head: batch {batch} T={temp:g} {name:22s} tau {row['tau']:.2f} {row['tokens_per_s']:8.1f} tok/s "
                   f"vs {row['target_only_tokens_per_s']:8.1f}  {row['speedup']:.2f}x")
    return rows


def headline(report: dict) -> dict:
    """Batch 1, :data:`HEADLINE_TREE`: per temperature (``{"0": value, "1": value}``), the
    head's and the draft model's tau (``head_tau``, ``head_draft_tau``) and speedup over
    target-only (``head_speedup``, ``head_draft_speedup``); and the one-step alphas
    (``head_alpha``, ``head_draft_alpha``)."""
    out = {"head_tau": {}, "head_draft_tau": {}, "head_speedup": {}, "head_draft_speedup": {},
           "head_alpha": report["alpha"]["head"], "head_draft_alpha": report["alpha"]["draft"]}
    for r in report["rows"]:
        if r["batch"] != 1 or r["tree"] != HEADLINE_TREE:
            continue
        t = f"{r['temperature']:g}"
        key = "head" if r["drafter"] == "head" else "head_draft"
        out[f"{key}_tau"][t] = r["tau"]
        out[f"{key}_speedup"][t] = r["speedup"]
    return out


def table(report: dict) -> str:
    """Markdown: one row per (batch, temperature, tree): tau and speedup of each drafter."""
    lines = ["| batch | T | tree | tau draft | tau head | speedup draft | speedup head |", "|---|---|---|---|---|---|---|"]
    by = {(r["batch"], r["temperature"], r["mode"]): r for r in report["rows"]}
    for b, t, tree in dict.fromkeys((r["batch"], r["temperature"], r["tree"]) for r in report["rows"] if r["tree"]):
        d, h = by[(b, t, f"draft {tree}")], by[(b, t, f"head {tree}")]
        lines.append(f"| {b} | {t:g} | {tree} | {d['tau']:.2f} | {h['tau']:.2f} | {d['speedup']:.2f}× | "
                     f"{h['speedup']:.2f}× |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Tau and speedup over target-only per tree and drafter, one column per (batch, T)."""
    plt = common.pyplot()
    panels = list(dict.fromkeys((r["batch"], r["temperature"]) for r in report["rows"]))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.4), squeeze=False)
    trees = list(dict.fromkeys(r["tree"] for r in report["rows"] if r["tree"]))
    for j, (b, t) in enumerate(panels):
        for i, (field, label) in enumerate((("tau", "tau (tokens per target call)"),
                                            ("speedup", "speedup vs target-only"))):
            ax = axes[i, j]
            for k, drafter in enumerate(("draft", "head")):
                vals = [next((r[field] for r in report["rows"] if (r["batch"], r["temperature"], r["mode"])
                              == (b, t, f"{drafter} {tree}")), np.nan) for tree in trees]
                ax.bar(np.arange(len(trees)) + (k - 0.5) * 0.38, vals, 0.38, label=drafter)
            if field == "speedup":
                ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks(np.arange(len(trees)), trees, fontsize=8)
            ax.set_ylabel(label)
            ax.set_title(f"batch {b}, temperature {t:g}")
            ax.legend(fontsize=8)
    fig.suptitle("feature head vs draft model, default target (same turns)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
