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

``--peers jax`` checks the JAX engines' samplers instead (no torch needed):

    pip install --no-deps tpu-inference==0.32.0 easydel      # or --target DIR, then PYTHONPATH=DIR
    python benchmarks/peer_exactness.py --peers jax [--samples 1024]

* **vLLM tpu-inference**'s ``rejection_sample``
  (``tpu_inference/layers/jax/sample/rejection_sampler.py``), random and greedy paths, as the
  acceptance rule of jaxspec's round (``generate(rule=...)`` on a chain of 3 drafted by the
  embedded draft; the bonus token drawn by jaxspec from the last target row, as the engine's
  own sampler draws it), checked by :func:`~jaxspec.exactness.external.check_sampler` (PIT,
  hashed two-sample, directed) at T = 1.5, top-k 3 (random) and T = 0 (greedy); and a
  hand-built directed case (the zero coin on a draft token of target probability 0, and the
  top coin on a ``p == q`` row). The package's ``__init__`` imports vLLM
  (``tpu_inference/logger.py``: ``from vllm.logger import _VllmLogger``), which tpu-inference
  does not declare and which is not installed here; so the sampler module is loaded by file
  path: its import ``layers/common/binary_search.py`` (pure JAX) is loaded the same way, and
  its two other imports, ``layers/common/sharding.py`` (``ShardingAxisName``) and
  ``layers/jax/sample/sampling_metadata.py`` (``TPUSupportedSamplingMetadata``), which need
  vLLM, are replaced by modules holding only those two names: they are used by the
  ``RejectionSampler`` class (its mesh and metadata), never by ``rejection_sample``.
* **EasyDeL**: the version the index serves (0.3.0) has no chain sampler to check: its eSurge
  engine has a ``SpeculativeConfig`` and scheduler fields for speculative tokens, but no
  acceptance code (no ``esurge/speculative_decoding.py``; no rejection sampler anywhere in the
  package). The JSON records that.

Writes ``peer_exactness_jax.json`` and ``peer_exactness_jax.png``.
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
    p.add_argument("--peers", choices=("hf", "jax"), default="hf",
                   help="hf: transformers' assisted generation (default); jax: tpu-inference's and EasyDeL's samplers")
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



def _pvalue_panel(ax, runs: dict, fontsize: int) -> None:
    """Each engine's p-values (PIT and hashed two-sample tests), one column a run, against the
    PIT threshold, on a log scale."""
    for i, (name, r) in enumerate(runs.items()):
        ps = [t["pvalue"] for t in r["pit"]] + [t["pvalue"] for t in r["hashed"]]
        ax.scatter([i] * len(ps), np.maximum(ps, 1e-300), label=f"{name}: {r['verdict']}", alpha=0.7)
    thr = min(t["threshold"] for r in runs.values() for t in r["pit"])
    ax.axhline(thr, color="0.4", lw=0.8, ls="--", label=f"PIT threshold {thr:.1e}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)), list(runs), fontsize=fontsize)
    ax.set_ylabel("p-value (PIT and hashed two-sample tests)")

def _plot(result: dict, path: pathlib.Path) -> None:
    """Every test's p-value by sampler (log scale), against the smallest threshold."""
    import numpy as np

    from jaxspec.bench.common import pyplot

    plt = pyplot()
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(8, 4))
    _pvalue_panel(ax, runs, fontsize=8)
    ax.set_title(f"transformers {result['transformers']}: assisted generation, top-k {result['top_k']}, "
                 f"{result['samples']} samples", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_tpu_inference_sampler():
    """tpu-inference's ``rejection_sampler`` module, loaded by file path (see the module
    docstring: the package's ``__init__`` needs vLLM)."""
    import importlib.util
    import types

    spec = importlib.util.find_spec("tpu_inference")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("peer_exactness.py --peers jax: needs tpu-inference (pip install --no-deps tpu-inference==0.32.0)")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    for name in ("tpu_inference", "tpu_inference.layers", "tpu_inference.layers.common", "tpu_inference.layers.jax",
                 "tpu_inference.layers.jax.sample"):
        mod = types.ModuleType(name)
        mod.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules.setdefault(name, mod)

    def load(name, rel):
        s = importlib.util.spec_from_file_location(name, root / rel)
        m = importlib.util.module_from_spec(s)
        sys.modules[name] = m
        s.loader.exec_module(m)
        return m

    load("tpu_inference.layers.common.binary_search", "layers/common/binary_search.py")
    sharding = types.ModuleType("tpu_inference.layers.common.sharding")
    sharding.ShardingAxisName = type("ShardingAxisName", (), {})  # used by RejectionSampler only
    metadata = types.ModuleType("tpu_inference.layers.jax.sample.sampling_metadata")
    metadata.TPUSupportedSamplingMetadata = type("TPUSupportedSamplingMetadata", (), {})  # a type hint there
    sys.modules[sharding.__name__], sys.modules[metadata.__name__] = sharding, metadata
    return load("tpu_inference.layers.jax.sample.rejection_sampler", "layers/jax/sample/rejection_sampler.py"), root


def tpu_rule(rs, do_sampling: bool):
    """tpu-inference's ``rejection_sample`` as a jaxspec rule (one row, a chain of n drafts):
    the drafts, their draft rows ``Q[:n]`` and target rows ``P[:n]``; the bonus token drawn
    from ``P[n]`` (the engine samples it with its own sampler; argmax when greedy)."""
    import jax
    import jax.numpy as jnp

    from jaxspec.core.rule_types import accept_result
    from jaxspec.core.sampling import sample_categorical

    def rule(key, parents, tokens, target_probs, draft_probs, scheme):
        n = tokens.shape[0]
        kb, kr = jax.random.split(key)
        bonus = sample_categorical(kb, target_probs[n]) if do_sampling else jnp.argmax(target_probs[n])
        out = rs.rejection_sample(tokens, jnp.array([n], jnp.int32), draft_probs[:n] if do_sampling else None,
                                  target_probs[:n], bonus[None].astype(jnp.int32), do_sampling, key=kr)  # [n + 1]
        all_in = out[n] != rs.PLACEHOLDER_TOKEN_ID
        k = jnp.where(all_in, n, jnp.sum(out[:n] != rs.PLACEHOLDER_TOKEN_ID) - 1).astype(jnp.int32)
        extra = jnp.where(all_in, out[n], out[jnp.minimum(k, n - 1)]).astype(jnp.int32)
        nodes = jnp.arange(n, dtype=jnp.int32)
        return accept_result(tokens, k, k - 1, jnp.where(nodes < k, nodes, -1), extra)

    rule.__name__ = f"tpu_inference_rejection_sample_{'random' if do_sampling else 'greedy'}"
    return rule


def tpu_directed(rs) -> dict:
    """Hand-built rows under forced uniforms: (1) the zero coin: one draft token of target
    probability 0 (q = 0.5), every uniform forced to 0; (2) the top coin: p == q with the
    draft token at p = q = 0.01, every uniform forced to 1 - 2^-24. What is emitted, and the
    target probability of each emitted token."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxspec.exactness.external import EXTREMES, forced_uniforms

    v = 8
    cases = {}
    p = np.zeros((2, v), np.float32)
    p[0, [1, 2]] = [0.5, 0.5]
    p[1, [3, 4]] = [0.5, 0.5]
    q = np.zeros((2, v), np.float32)
    q[0, [0, 1]] = [0.5, 0.5]  # draft token 0: q = 0.5, p = 0
    q2 = np.zeros((2, v), np.float32)
    q2[0, [1, 2, 5]] = [0.01, 0.49, 0.5]
    p2 = q2.copy()  # p == q; draft token 1 at p = q = 0.01
    p2[1] = p[1]
    for name, (P, Q, tok, u) in {"zero coin: draft token of p = 0, u = 0": (p, q, 0, "0"),
                                 "top coin: p == q, draft token at 0.01, u = 1 - 2^-24": (p2, q2, 1, "1 - 2^-24")
                                 }.items():
        with forced_uniforms(EXTREMES[u]):
            out = np.asarray(jax.jit(lambda P, Q: rs.rejection_sample(
                jnp.array([tok], jnp.int32), jnp.array([1], jnp.int32), Q[:1], P[:1], jnp.array([3], jnp.int32),
                True, key=jax.random.key(0)))(jnp.asarray(P), jnp.asarray(Q)))
        emitted = [int(x) for x in out if x != rs.PLACEHOLDER_TOKEN_ID]
        rows = [0] * (len(emitted) - 1) + [0 if out[1] == rs.PLACEHOLDER_TOKEN_ID else 1]
        probs = [float(P[r, t]) for r, t in zip(rows, emitted)]
        cases[name] = dict(output=[int(x) for x in out], emitted=emitted, target_probs=probs,
                           impossible=any(x == 0.0 for x in probs))
        print(f"tpu-inference directed, {name}: output {out.tolist()}, target probabilities {probs}", flush=True)
    return cases


def _plot_jax(result: dict, path: pathlib.Path) -> None:
    """Left: every statistical test's p-value by sampler; right: the directed check's tokens
    of target probability 0 (of 8 samples) at each forced extreme."""
    import numpy as np

    from jaxspec.bench.common import pyplot

    plt = pyplot()
    runs = result["runs"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    _pvalue_panel(ax, runs, fontsize=7)
    ax.set_title(f"statistical tests, {result['samples']} samples, T = {result['temperature']}, "
                 f"top-k {result['top_k']} (greedy: T = 0)", fontsize=8)
    ax.legend(fontsize=7)
    extremes = list(next(iter(runs.values()))["directed"]["impossible"])
    width = 0.8 / len(extremes)
    for j, e in enumerate(extremes):
        bx.bar(np.arange(len(runs)) + j * width, [r["directed"]["impossible"][e] for r in runs.values()], width,
               label=f"uniforms forced to {e}")
    bx.set_xticks(np.arange(len(runs)) + width / 2, list(runs), fontsize=7, rotation=12)
    bx.set_ylabel("tokens of target probability 0")
    bx.set_title("directed check (8 samples per extreme)", fontsize=8)
    bx.legend(fontsize=7)
    fig.suptitle(f"tpu-inference {result.get('tpu_inference')}: rejection_sample as jaxspec's rule on the "
                 f"embedded pair ({result['tpu_inference_acceptance_line'].split('/')[-1]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_jax(args) -> int:
    import jax
    import numpy as np

    import jaxspec
    from jaxspec.bench.common import log, machine_info, write_report
    from jaxspec.exactness.external import check_sampler

    n = 256 if args.quick else args.samples
    out_dir = pathlib.Path(args.out) / ("quick" if args.quick else "")
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    ids = jaxspec.ByteTokenizer().encode(PROMPT)
    rs, root = load_tpu_inference_sampler()
    line = next(i for i, t in enumerate((root / "layers/jax/sample/rejection_sampler.py").read_text().splitlines(), 1)
                if "accepted = ratio >= uniform_probs" in t)

    def sampler(rule, law):
        def sample(prompt_ids, count, seed):
            out = jaxspec.generate(jax.random.key(seed), target, draft, np.tile([prompt_ids], (count, 1)),
                                   max_new_tokens=args.horizon, sampling=law, tree="chain:3", scheme="iid",
                                   rule=rule, stop_tokens=(), prompt_bucket=None)
            return np.asarray(out.tokens)
        return sample

    random_law = jaxspec.Sampling(temperature=args.temperature, top_k=args.top_k)
    runs = {}
    for name, rule, law in (("jaxspec_token_rule (control)", "token", random_law),
                            ("tpu_inference_random", tpu_rule(rs, True), random_law),
                            ("tpu_inference_greedy", tpu_rule(rs, False), jaxspec.Sampling(temperature=0.0))):
        log(f"{name}: {n} samples ...")
        t0 = time.perf_counter()
        report = check_sampler(sampler(rule, law), target, ids, num_samples=n, horizon=args.horizon, sampling=law,
                               seed=0, name=name)
        runs[name] = {**report.to_dict(), "wall_s": time.perf_counter() - t0}
        print(report.summary(), flush=True)
    import importlib.metadata as md

    result = {
        "benchmark": "peer_exactness_jax",
        "command": "python benchmarks/peer_exactness.py --peers jax" + (" --quick" if args.quick else f" --samples {n}"),
        "tpu_inference": md.version("tpu-inference"), "easydel": md.version("easydel"), "jax": jax.__version__,
        "tpu_inference_loading": "rejection_sampler.py and binary_search.py loaded by file path; sharding.py and "
                                 "sampling_metadata.py (they import vLLM) replaced by modules holding ShardingAxisName "
                                 "and TPUSupportedSamplingMetadata, which rejection_sample does not use",
        "tpu_inference_acceptance_line": f"tpu_inference/layers/jax/sample/rejection_sampler.py:{line}: "
                                         "accepted = ratio >= uniform_probs",
        "tpu_inference_directed": tpu_directed(rs),
        "easydel_sampler": "none: easydel 0.3.0 (the newest on the index) has SpeculativeConfig and scheduler fields "
                           "but no acceptance / rejection-sampling code (no esurge/speculative_decoding.py)",
        "prompt": PROMPT, "samples": n, "horizon": args.horizon, "top_k": args.top_k, "temperature": args.temperature,
        "verdicts": {k: v["verdict"] for k, v in runs.items()}, "runs": runs, "machine": machine_info(),
    }
    write_report(result, out_dir, "peer_exactness_jax", _plot_jax)
    for name, r in runs.items():
        d = r["directed"]
        print(f"{name}: {r['verdict']} (min p: PIT {min(t['pvalue'] for t in r['pit']):.3g}, hashed "
              f"{min(t['pvalue'] for t in r['hashed']):.3g}; directed impossible {d['impossible']}; {r['wall_s']:.0f} s)")
    return 0


def main(argv=None) -> int:
    args = _args(argv)
    if args.peers == "jax":
        return main_jax(args)
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
