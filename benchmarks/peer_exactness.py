"""Is Hugging Face ``transformers``' assisted generation lossless? jaxspec's exactness tests
for decoders written elsewhere (:func:`jaxspec.exactness.external.check_sampler`) on its
sampled speculative decoding, and on the same generation with the bug of transformers
#47932 put back.

    pip install -e '.[hf]'        # torch 2.13.0 (CPU build), transformers
    python benchmarks/peer_exactness.py [--samples 1024] [--quick] [--out benchmarks/results]

The embedded pair (default-target, default-draft) is exported with ``jaxspec.save_model``
and loaded with ``AutoModelForCausalLM.from_pretrained`` (float32, the weights jaxspec
holds). Each sampler draws ``--samples`` continuations of one prompt, one
``generate(assistant_model=draft, do_sample=True, top_k=K, max_new_tokens=L,
min_new_tokens=L, eos_token_id=None)`` call each (batch 1: assisted generation runs one row),
seeded per call. The law under test is the target's, warped by the same top-k
(``jaxspec.Sampling(top_k=K)``).

* ``target_only``: ``generate`` without an assistant (a control: must pass);
* ``assisted``: the installed transformers' assisted generation;
* ``assisted_bug_47932``: the same, with the draft's law taken *before* top-k: the
  candidate generator returns the assistant's raw logits (``output_logits``) instead of its
  processed scores, so the acceptance ratio ``p / q`` divides by a law the draft did not
  sample from. The test must reject it.

Writes ``peer_exactness.json`` and ``peer_exactness.png`` (the p-values of every test, by
sampler, against the threshold) under ``--out`` and prints the verdicts.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import tempfile
import time

PROMPT = "x = "  # a flat next-token law: much of the draft's mass lies outside its top-k


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=1024, help="samples per sampler (default 1024)")
    p.add_argument("--horizon", type=int, default=3, help="tokens tested per sample (default 3)")
    p.add_argument("--top-k", type=int, default=3, help="the top-k of both the law and the samplers (default 3)")
    p.add_argument("--temperature", type=float, default=1.5,
                   help="the temperature of both the law and the samplers (default 1.5)")
    p.add_argument("--quick", action="store_true", help="256 samples (a smoke run: little power)")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"),
                   help="output folder (default benchmarks/results; --quick: its quick/ subfolder)")
    return p.parse_args(argv)


def _import_hf():
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"peer_exactness.py: needs the hf extra (pip install -e '.[hf]'): {e}")
    return torch, transformers


@contextlib.contextmanager
def bug_47932(transformers, torch):
    """The draft law taken before top-k: the assistant's raw logits as the candidate logits."""
    gen = transformers.generation.candidate_generator.AssistedCandidateGenerator
    original = gen._generate_candidates

    def raw_logits(self, generation_args):
        generation_args["generation_config"].output_logits = True
        out = self.assistant_model.generate(**generation_args, **self.assistant_kwargs)
        self.assistant_kwargs["cache"] = out.cache
        return out.sequences, torch.stack(out.logits, dim=1)

    gen._generate_candidates = raw_logits
    try:
        yield
    finally:
        gen._generate_candidates = original


def _plot(result: dict, path: pathlib.Path) -> None:
    """Every test's p-value by sampler (log scale), against the smallest threshold."""
    import numpy as np

    from jaxspec.bench.common import pyplot

    plt = pyplot()
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (name, r) in enumerate(runs.items()):
        ps = [t["pvalue"] for t in r["pit"]] + [t["pvalue"] for t in r["hashed"]]
        ax.scatter([i] * len(ps), np.maximum(ps, 1e-300), label=f"{name}: {r['verdict']}", alpha=0.7)
    thr = min(t["threshold"] for r in runs.values() for t in r["pit"])
    ax.axhline(thr, color="0.4", lw=0.8, ls="--", label=f"PIT threshold {thr:.1e}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)), list(runs), fontsize=8)
    ax.set_ylabel("p-value (PIT and hashed two-sample tests)")
    ax.set_title(f"transformers {result['transformers']}: assisted generation, top-k {result['top_k']}, "
                 f"{result['samples']} samples", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = _args(argv)
    torch, transformers = _import_hf()
    import numpy as np

    import jaxspec
    from jaxspec.bench.common import log, machine_info, write_report
    from jaxspec.exactness.external import check_sampler

    n = 256 if args.quick else args.samples
    out_dir = pathlib.Path(args.out) / ("quick" if args.quick else "")
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    ids = jaxspec.ByteTokenizer().encode(PROMPT)
    tmp = pathlib.Path(tempfile.mkdtemp())
    jaxspec.save_model(target, tmp / "target")
    jaxspec.save_model(draft, tmp / "draft")
    hf_t = transformers.AutoModelForCausalLM.from_pretrained(tmp / "target", dtype=torch.float32).eval()
    hf_d = transformers.AutoModelForCausalLM.from_pretrained(tmp / "draft", dtype=torch.float32).eval()

    def hf_sampler(assistant):
        def sample(prompt_ids, count, seed):
            rows = []
            for i in range(count):
                torch.manual_seed(seed * 1_000_003 + i)
                kw = {} if assistant is None else {"assistant_model": assistant}
                with torch.no_grad():
                    o = hf_t.generate(torch.tensor([prompt_ids], dtype=torch.long), do_sample=True, top_k=args.top_k,
                                      top_p=1.0, temperature=args.temperature, max_new_tokens=args.horizon,
                                      min_new_tokens=args.horizon, eos_token_id=None, pad_token_id=0, **kw)
                rows.append(o[0, len(prompt_ids):len(prompt_ids) + args.horizon].numpy())
            return np.stack(rows)

        return sample

    law = jaxspec.Sampling(temperature=args.temperature, top_k=args.top_k)
    runs = {}
    for name, assistant, patched in (("target_only", None, False), ("assisted", hf_d, False),
                                     ("assisted_bug_47932", hf_d, True)):
        log(f"{name}: {n} samples ...")
        t0 = time.perf_counter()
        with bug_47932(transformers, torch) if patched else contextlib.nullcontext():
            report = check_sampler(hf_sampler(assistant), target, ids, num_samples=n, horizon=args.horizon,
                                   sampling=law, seed=0, name=name)
        runs[name] = {**report.to_dict(), "wall_s": time.perf_counter() - t0}
        print(report.summary(), flush=True)
    result = {
        "benchmark": "peer_exactness",
        "command": "python benchmarks/peer_exactness.py" + (" --quick" if args.quick else f" --samples {n}"),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "prompt": PROMPT, "samples": n, "horizon": args.horizon, "top_k": args.top_k, "temperature": args.temperature,
        "verdicts": {k: v["verdict"] for k, v in runs.items()},
        "runs": runs, "machine": machine_info(),
    }
    write_report(result, out_dir, "peer_exactness", _plot)
    for name, r in runs.items():
        print(f"{name}: {r['verdict']} (min p: PIT {min(t['pvalue'] for t in r['pit']):.3g}, hashed "
              f"{min(t['pvalue'] for t in r['hashed']):.3g}; {r['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
