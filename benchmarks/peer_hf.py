"""jaxspec against Hugging Face ``transformers`` on the same models and prompts: assisted
generation (``assistant_model=``) and prompt lookup (``prompt_lookup_num_tokens=``) beside
its target-only ``generate``, and jaxspec's speculative and target-only decoding.

    pip install -e '.[hf]'        # torch 2.13.0 (CPU build), transformers, tokenizers
    python benchmarks/peer_hf.py [--quick | --tiny] [--out benchmarks/results]

The default pair is exported to a temporary folder with ``jaxspec.save_model`` and loaded
with ``AutoModelForCausalLM.from_pretrained`` (float32, the weights jaxspec runs). Each
prompt (byte tokens, batch 1) is decoded to exactly ``max_new_tokens`` tokens by every
mode (no stop token: ``eos_token_id=None`` for Hugging Face, ``stop_tokens=()`` for
jaxspec), greedy (T = 0) and sampled (T = 1, no top-k or top-p on either side). The modes
take turns, after one untimed call each (jaxspec compiles; torch warms up); a mode's
figure is its median tokens/s over the turns, and the ratios are of those medians.
Hugging Face runs with its defaults otherwise (assisted generation's heuristic number
of draft tokens), as a user would run it.

Writes ``peer_hf.json`` and ``peer_hf.png`` under ``--out`` (``--quick`` and ``--tiny``:
its ``quick/`` and ``tiny/`` subfolders) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

SIZES = {
    # prompts (None: all), max_new_tokens, turns; prompt lookup part: prompts per workload, max_new_tokens
    "full": (None, 128, 3, 4, 64),
    "quick": (3, 64, 2, 2, 32),
    "tiny": (1, 8, 1, 1, 8),
}
EXTRA_PROMPT = "def fibonacci(n):"


def _args(argv=None):
    from jaxspec.bench.common import size_arguments

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    resolve = size_arguments(p, quick="3 prompts, 64 tokens, 2 turns", tiny="1 prompt, 8 tokens, 1 turn",
                             out=pathlib.Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    return args, *resolve(args)


def _import_hf():
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"peer_hf.py: needs the hf extra (pip install -e '.[hf]'): {e}")
    return torch, transformers


def main(argv=None) -> int:
    args, size, out = _args(argv)
    torch, transformers = _import_hf()
    import jax
    import numpy as np

    import jaxspec
    from jaxspec.bench.common import log, machine_info, markdown_table, pyplot, write_report
    from jaxspec.bench.decode import BATCH_PROMPTS

    n_prompts, m, turns, n_lookup, m_lookup = SIZES[size]
    texts = [EXTRA_PROMPT, *BATCH_PROMPTS][:n_prompts]
    tok = jaxspec.ByteTokenizer()
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-peer-"))
    jaxspec.save_model(target, tmp / "target")
    jaxspec.save_model(draft, tmp / "draft")
    hf_t = transformers.AutoModelForCausalLM.from_pretrained(tmp / "target", dtype=torch.float32).eval()
    hf_d = transformers.AutoModelForCausalLM.from_pretrained(tmp / "draft", dtype=torch.float32).eval()

    def hf(ids, temp, seed, n, **extra):
        torch.manual_seed(seed)
        sample = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if temp > 0 else dict(do_sample=False)
        with torch.no_grad():
            out = hf_t.generate(torch.tensor([ids], dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                                eos_token_id=None, pad_token_id=0, **sample, **extra)
        return out[0, len(ids):].tolist()

    def ours(ids, temp, seed, speculative, m=m, drafter=draft):
        key = jax.random.key(seed)
        if speculative:
            out = jaxspec.generate(key, target, drafter, [ids], max_new_tokens=m, tree="chain:4",
                                   sampling=jaxspec.Sampling(temperature=temp), stop_tokens=())
        else:
            out = jaxspec.generate_autoregressive(key, target, [ids], max_new_tokens=m,
                                                  sampling=jaxspec.Sampling(temperature=temp), stop_tokens=())
        return np.asarray(jax.block_until_ready(out.tokens))[0].tolist()

    def timed_turns(fns, ids, temp, m):
        """Median tokens/s of each mode (one untimed call first, then turns) and its last output."""
        outs = {k: f(ids, temp, -1 % 2**31) for k, f in fns.items()}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for i in range(turns):
            for k, f in fns.items():
                t0 = time.perf_counter()
                outs[k] = f(ids, temp, i)
                times[k].append(time.perf_counter() - t0)
        assert all(len(o) == m for o in outs.values()), {k: len(o) for k, o in outs.items()}
        return {k: m / statistics.median(v) for k, v in times.items()}, {k: m / min(v) for k, v in times.items()}, outs

    modes = {
        "hf_assisted": lambda ids, t, s: hf(ids, t, s, m, assistant_model=hf_d),
        "hf_prompt_lookup": lambda ids, t, s: hf(ids, t, s, m, prompt_lookup_num_tokens=4),
        "hf_target_only": lambda ids, t, s: hf(ids, t, s, m),
        "jaxspec_speculative": lambda ids, t, s: ours(ids, t, s, True),
        "jaxspec_target_only": lambda ids, t, s: ours(ids, t, s, False),
    }
    rows = []
    for text in texts:
        ids = tok.encode(text)
        for temp in (0.0, 1.0):
            log(f"peer_hf: {text!r} T={temp:g}")
            rate, best, outs = timed_turns(modes, ids, temp, m)
            row = {"prompt": text, "prompt_tokens": len(ids), "temperature": temp,
                   "tokens_per_s": rate, "best_tokens_per_s": best,
                   "speculative_over_hf_assisted": rate["jaxspec_speculative"] / rate["hf_assisted"],
                   "jaxspec_speedup": rate["jaxspec_speculative"] / rate["jaxspec_target_only"],
                   "hf_assisted_speedup": rate["hf_assisted"] / rate["hf_target_only"],
                   "hf_prompt_lookup_speedup": rate["hf_prompt_lookup"] / rate["hf_target_only"],
                   "target_only_over_hf_target_only": rate["jaxspec_target_only"] / rate["hf_target_only"]}
            if temp == 0.0:  # greedy: every mode must emit the target's greedy tokens
                row["greedy_tokens_agree"] = {k: o == outs["jaxspec_target_only"] for k, o in outs.items()}
            rows.append(row)
    # prompt lookup, both libraries: the prompt_lookup benchmark's grounded and code workloads
    from jaxspec.bench.lookup import GROUNDED_FUNCTIONS, grounded_prompt

    ngram = jaxspec.NgramDraft()
    lookup_modes = {
        "hf_prompt_lookup": lambda ids, t, s: hf(ids, t, s, m_lookup, prompt_lookup_num_tokens=4),
        "hf_target_only": lambda ids, t, s: hf(ids, t, s, m_lookup),
        "jaxspec_ngram": lambda ids, t, s: ours(ids, t, s, True, m=m_lookup, drafter=ngram),
        "jaxspec_target_only": lambda ids, t, s: ours(ids, t, s, False, m=m_lookup),
    }
    workloads = {"grounded": [grounded_prompt(mod, name) for mod, name in GROUNDED_FUNCTIONS[:n_lookup]],
                 "code": list(BATCH_PROMPTS[1:1 + n_lookup])}
    lookup_rows = []
    for workload, prompt_texts in workloads.items():
        for text in prompt_texts:
            ids = tok.encode(text)
            for temp in (0.0, 1.0):
                log(f"peer_hf lookup: {workload} {text[:24]!r} T={temp:g}")
                rate, best, outs = timed_turns(lookup_modes, ids, temp, m_lookup)
                lookup_rows.append({
                    "workload": workload, "prompt": text, "prompt_tokens": len(ids), "temperature": temp,
                    "tokens_per_s": rate, "best_tokens_per_s": best,
                    "jaxspec_ngram_speedup": rate["jaxspec_ngram"] / rate["jaxspec_target_only"],
                    "hf_prompt_lookup_speedup": rate["hf_prompt_lookup"] / rate["hf_target_only"],
                    "ngram_over_hf_prompt_lookup": rate["jaxspec_ngram"] / rate["hf_prompt_lookup"],
                    **({"greedy_tokens_agree": {k: o == outs["jaxspec_target_only"] for k, o in outs.items()}}
                       if temp == 0.0 else {}),
                })
    ratios = {t: [r["speculative_over_hf_assisted"] for r in rows if r["temperature"] == t] for t in (0.0, 1.0)}
    report = {
        "benchmark": "peer_hf",
        "size": size,
        "machine": machine_info(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torch_threads": torch.get_num_threads()},
        "settings": {"max_new_tokens": m, "turns": turns, "jaxspec_tree": "chain:4", "batch": 1,
                     "hf_prompt_lookup_num_tokens": 4, "dtype": "float32", "lookup_max_new_tokens": m_lookup,
                     "jaxspec_ngram": ngram.spec},
        "rows": rows,
        "lookup_rows": lookup_rows,
        "summary": {f"T={t:g}": {"min_speculative_over_hf_assisted": min(v),
                                 "geomean_speculative_over_hf_assisted": float(np.exp(np.mean(np.log(v))))}
                    for t, v in ratios.items()},
    }

    def plot(rep, path):
        plt = pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), gridspec_kw={"width_ratios": [3, 3, 2]})
        names = list(modes)
        color = {k: f"C{i}" for i, k in enumerate([*names, "jaxspec_ngram"])}  # one color per mode, every panel
        for ax, temp in zip(axes[:2], (0.0, 1.0)):
            rs = [r for r in rep["rows"] if r["temperature"] == temp]
            x = np.arange(len(rs))
            w = 0.8 / len(names)
            for j, k in enumerate(names):
                ax.bar(x + (j - len(names) / 2 + 0.5) * w, [r["tokens_per_s"][k] for r in rs], w, label=k,
                       color=color[k])
            ax.set_xticks(x, [r["prompt"][:18] for r in rs], rotation=30, ha="right", fontsize=7)
            ax.set_title(f"T = {temp:g}, batch 1, {rep['settings']['max_new_tokens']} tokens")
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("tokens / s (median of turns)")
        axes[0].legend(fontsize=7)
        groups = [(w, t) for w in ("grounded", "code") for t in (0.0, 1.0)]
        lk = ("hf_prompt_lookup", "hf_target_only", "jaxspec_ngram", "jaxspec_target_only")
        x = np.arange(len(groups))
        for j, k in enumerate(lk):
            vals = [np.exp(np.mean(np.log([r["tokens_per_s"][k] for r in rep["lookup_rows"]
                                           if (r["workload"], r["temperature"]) == g] or [np.nan])))
                    for g in groups]
            axes[2].bar(x + (j - 1.5) * 0.2, vals, 0.2, label=k, color=color[k])
        axes[2].set_xticks(x, [f"{w} T={t:g}" for w, t in groups], rotation=30, ha="right", fontsize=7)
        axes[2].set_title(f"prompt lookup, {rep['settings']['lookup_max_new_tokens']} tokens (geomean)", fontsize=9)
        axes[2].grid(axis="y", alpha=0.3)
        axes[2].legend(fontsize=7)
        fig.suptitle("default pair: jaxspec vs Hugging Face transformers (torch CPU), same weights", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    files = write_report(report, out, "peer_hf", plot)
    print(markdown_table(["prompt", "T", "HF assisted", "HF prompt lookup", "HF target-only", "jaxspec speculative",
                  "jaxspec target-only", "jaxspec spec / HF assisted"],
                 [[repr(r["prompt"]), f"{r['temperature']:g}",
                   *(f"{r['tokens_per_s'][k]:.0f}" for k in modes), f"{r['speculative_over_hf_assisted']:.2f}x"]
                  for r in rows]))
    print()
    print(markdown_table(["workload", "prompt", "T", "HF prompt lookup tok/s (speedup)",
                  "jaxspec NgramDraft chain:4 (speedup)", "jaxspec / HF"],
                 [[r["workload"], repr(r["prompt"][:24]), f"{r['temperature']:g}",
                   f"{r['tokens_per_s']['hf_prompt_lookup']:.0f} ({r['hf_prompt_lookup_speedup']:.2f}x)",
                   f"{r['tokens_per_s']['jaxspec_ngram']:.0f} ({r['jaxspec_ngram_speedup']:.2f}x)",
                   f"{r['ngram_over_hf_prompt_lookup']:.2f}x"] for r in lookup_rows]))
    print(f"wrote {files['json']} and {files['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
