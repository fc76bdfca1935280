"""Self-speculation (``jaxspec.LayerSkipDraft``): the default target's first K layers draft,
against the default draft model and target-only sampling, measured side by side.

    python benchmarks/layer_skip.py [--quick] [--out benchmarks/results]

On the embedded default target (6 layers), batch 1, three of the decode benchmark's code
prompts (``jaxspec.bench.decode.BATCH_PROMPTS`` 1, 2 and 4: ``def parse(line):``, ``import
os``, ``for i in range(``, with a BOS as that benchmark encodes them; each fits one prompt
bucket of 32 tokens, so each mode compiles once per temperature), at
temperature 0 and 1, the modes take turns per prompt (:func:`jaxspec.bench.common.tallied_turns`:
one untimed first call each, which compiles, then ``--turns`` timed turns, 5 by default, of
``--new-tokens`` tokens, 128 by default; turn i seeds every mode by i):

* ``target-only``: :func:`jaxspec.generate_autoregressive`;
* ``draft chain:4``: the default draft model (``jaxspec.load_draft("default-draft")``) on the
  default tree ``chain:4``;
* ``layers:K chain:4`` for K = 1 .. 5: ``LayerSkipDraft(K)`` on ``chain:4``.

Speculative modes use the decode benchmark's scheme (``deterministic`` at T = 0,
``without_replacement`` at T = 1). Per prompt: tau (tokens per target call, summed over the
timed calls), tokens/s (median over turns) and the speedup over target-only of the same
turns. Summary per (temperature, mode): tau over every prompt's calls, tokens/s over the
prompts (tokens / summed median seconds) and the geometric mean of the per-prompt speedups.

Writes ``layer_skip.json`` and ``layer_skip.png`` (speedup and tau against K, the draft
model as a reference line) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results"
TREE = "chain:4"
LAYERS = (1, 2, 3, 4, 5)
PROMPT_INDICES = (1, 2, 4)  # into BATCH_PROMPTS


def measure(prompts: list[list[int]], temperatures, new_tokens: int, turns: int, layers=LAYERS) -> list[dict]:
    import jax
    import numpy as np

    import jaxspec
    from jaxspec import LayerSkipDraft
    from jaxspec.bench import common
    from jaxspec.bench.decode import sibling_scheme

    target = jaxspec.load_model("default-target")
    draft = jaxspec.load_draft("default-draft")
    kw = dict(max_new_tokens=new_tokens, stop_tokens=())
    rows = []
    for temp in temperatures:
        scheme = sibling_scheme(TREE, temp)
        for p_idx, ids in enumerate(prompts):
            def ar(i, ids=ids, temp=temp):
                return jaxspec.generate_autoregressive(jax.random.key(1000 + i), target, [ids],
                                                       sampling=jaxspec.Sampling(temperature=temp), **kw)

            def spec(d, ids=ids, temp=temp):
                return lambda i: jaxspec.generate(jax.random.key(2000 + i), target, d, [ids], tree=TREE,
                                                  scheme=scheme, sampling=jaxspec.Sampling(temperature=temp), **kw)

            fns = {"target-only": ar, f"draft {TREE}": spec(draft)}
            fns.update({f"layers:{k} {TREE}": spec(LayerSkipDraft(k)) for k in layers})
            t0 = time.perf_counter()
            times, outs, totals = common.tallied_turns(fns, turns)
            sec = common.medians(times)
            ar_tokens = int(np.asarray(outs["target-only"].lengths).sum())
            ar_tps = ar_tokens / sec["target-only"]
            for name in fns:
                n = int(np.asarray(outs[name].lengths).sum())
                s = outs[name].summary()
                row = {"temperature": temp, "prompt": p_idx, "mode": name,
                       "layers": int(name.split()[0].split(":")[1]) if name.startswith("layers:") else None,
                       "scheme": None if name == "target-only" else scheme,
                       "tau": totals[name][0] / max(totals[name][1], 1), "num_tokens": totals[name][0],
                       "target_calls": totals[name][1], "tokens_per_call": n, "seconds_per_call": sec[name],
                       "seconds_turns": times[name],
                       "tokens_per_s": n / sec[name], "target_only_tokens_per_s": ar_tps,
                       "speedup": (n / sec[name]) / ar_tps,
                       "speedup_turn_range": [x * n / ar_tokens
                                              for x in common.turn_range(times["target-only"], times[name])],
                       "accept_rate_per_depth": s["accept_rate_per_depth"] if name != "target-only" else None}
                if temp == 0.0:
                    row["same_tokens_as_target_only"] = bool(
                        (np.asarray(outs[name].tokens) == np.asarray(outs["target-only"].tokens)).all())
                rows.append(row)
                common.log(f"layer_skip: T={temp:g} prompt {p_idx} {name:18s} tau {row['tau']:.2f} "
                           f"{row['tokens_per_s']:7.1f} tok/s vs {ar_tps:7.1f}  {row['speedup']:.2f}x")
            common.log(f"layer_skip: T={temp:g} prompt {p_idx}: {time.perf_counter() - t0:.0f} s")
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    import numpy as np

    out = []
    keys = list(dict.fromkeys((r["temperature"], r["mode"]) for r in rows))
    for temp, mode in keys:
        sel = [r for r in rows if (r["temperature"], r["mode"]) == (temp, mode)]
        tokens = sum(r["num_tokens"] for r in sel)
        out.append({
            "temperature": temp, "mode": mode, "layers": sel[0]["layers"], "prompts": len(sel),
            "tau": tokens / max(sum(r["target_calls"] for r in sel), 1),
            # tokens of one call per prompt over the prompts' summed median seconds per call
            "tokens_per_s": sum(r["tokens_per_call"] for r in sel) / sum(r["seconds_per_call"] for r in sel),
            "speedup": float(np.exp(np.mean([np.log(r["speedup"]) for r in sel]))),
            "speedup_prompt_range": [min(r["speedup"] for r in sel), max(r["speedup"] for r in sel)],
            "accept_rate_per_depth": (None if sel[0]["accept_rate_per_depth"] is None else
                                      np.mean([r["accept_rate_per_depth"] for r in sel], axis=0).tolist()),
            "same_tokens_as_target_only": (all(r["same_tokens_as_target_only"] for r in sel)
                                           if temp == 0.0 else None),
        })
    return out


def table(report: dict) -> str:
    lines = ["| T | mode | tau | tokens/s | speedup vs target-only (geo. mean over prompts) |",
             "|---|---|---|---|---|"]
    for s in report["summary"]:
        tau = "—" if s["mode"] == "target-only" else f"{s['tau']:.2f}"
        lines.append(f"| {s['temperature']:g} | {s['mode']} | {tau} | {s['tokens_per_s']:.1f} | {s['speedup']:.2f}× |")
    return "\n".join(lines)


def plot(report: dict, path: pathlib.Path) -> None:
    from jaxspec.bench import common

    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    temps = sorted({s["temperature"] for s in report["summary"]})
    for j, t in enumerate(temps):
        sel = [s for s in report["summary"] if s["temperature"] == t]
        ls = [s for s in sel if s["layers"] is not None]
        ks = [s["layers"] for s in ls]
        dm = next(s for s in sel if s["mode"].startswith("draft"))
        color = f"C{j}"
        sp = [s["speedup"] for s in ls]
        err = [[v - s["speedup_prompt_range"][0] for v, s in zip(sp, ls)],
               [s["speedup_prompt_range"][1] - v for v, s in zip(sp, ls)]]
        ax1.errorbar(ks, sp, yerr=err, fmt="o-", color=color, capsize=3,
                     label=f"LayerSkipDraft(K), T={t:g} (bars: prompt range)")
        ax1.axhline(dm["speedup"], color=color, ls="--", lw=1, label=f"draft model, T={t:g}")
        ax2.plot(ks, [s["tau"] for s in ls], "o-", color=color, label=f"LayerSkipDraft(K), T={t:g}")
        ax2.axhline(dm["tau"], color=color, ls="--", lw=1, label=f"draft model, T={t:g}")
    ax1.axhline(1.0, color="k", lw=0.8, ls=":")
    ax1.set_xlabel("K (the target's first K of 6 layers draft)")
    ax1.set_ylabel("speedup vs target-only (geo. mean over prompts)")
    ax1.set_title("speedup, chain:4, batch 1")
    ax2.axhline(5.0, color="k", lw=0.8, ls=":", label="chain:4 ceiling (depth + 1)")
    ax2.set_xlabel("K (the target's first K of 6 layers draft)")
    ax2.set_ylabel("tau (tokens per target call)")
    ax2.set_title("tau, chain:4, batch 1")
    for ax in (ax1, ax2):
        ax.set_xticks(list(LAYERS))
        ax.legend(fontsize=7)
    fig.suptitle("self-speculation on the default target vs the default draft model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one prompt, 16 tokens, one turn")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    p.add_argument("--prompts", type=int, default=None, help="how many of the three prompts (default 3)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 128")
    p.add_argument("--turns", type=int, default=None, help="timed turns per prompt (default 5)")
    a = p.parse_args(argv)
    from jaxspec.bench import common
    from jaxspec.bench.decode import BATCH_PROMPTS
    from jaxspec.formats.tokenizer import ByteTokenizer

    n_prompts = a.prompts or (1 if a.quick else 3)
    new = a.new_tokens or (16 if a.quick else 128)
    turns = a.turns or (1 if a.quick else 5)
    tok = ByteTokenizer()
    texts = [BATCH_PROMPTS[i] for i in PROMPT_INDICES[:n_prompts]]
    prompts = [tok.encode(t, add_bos=True) for t in texts]
    t0 = time.perf_counter()
    rows = measure(prompts, (0.0, 1.0), new, turns)
    report = {
        "benchmark": "layer_skip", "quick": bool(a.quick), "machine": common.machine_info(),
        "command": "python benchmarks/layer_skip.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {"target": "default-target", "draft": "default-draft", "tree": TREE, "layers": list(LAYERS),
                   "temperatures": [0.0, 1.0], "new_tokens": new, "turns": turns, "batch": 1,
                   "schemes": {"0": "deterministic", "1": "without_replacement"}},
        "prompts": [{"text": t, "num_tokens": len(ids)} for t, ids in zip(texts, prompts, strict=True)],
        "rows": rows,
    }
    report["summary"] = summarize(rows)
    report["seconds"] = time.perf_counter() - t0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "layer_skip.json").write_text(json.dumps(common.jsonable(report), indent=1) + "\n")
    plot(report, a.out / "layer_skip.png")
    print(table(report))
    common.log(f"layer_skip: {report['seconds']:.0f} s; wrote {a.out / 'layer_skip.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
