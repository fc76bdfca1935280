"""Power of the exactness tests without enumeration against sample count: the conditional
PIT (both orders) and the hashed two-sample test, on the correct decoder and on every
mutant of jaxspec.exactness.mutants, at a real vocabulary (V = 49,152).

    python benchmarks/exactness_power.py [--seeds 1] [--quick] [--fresh] [--out benchmarks/results]

The setup is tests/test_pit.py's: the pair ``tiny_pair(0, vocab_size=49152, hidden_size=16,
num_heads=2, mix=0.05, head_scale=8.0)`` (tests/_tiny.py; rebuilt here with
``jaxspec.nn.model.init_model``, the same weights), prompt (1, 2, 3), L = 6 tokens, each
mutant on the configuration it breaks (``MUTANT_CONFIG``, with test_pit.py's
``MUTANT_WARPS``), the correct decoder as ``branch:2,2``, iid, token rule, T = 1. For each
decoder and seed r, ``N_MAX`` speculative samples are drawn once (decoder key 1 + 1000 r; the
PIT's W key 2 + 1000 r) with ``N_MAX`` target-only samples of the same warps (key
99 + 1000 r); seed 0 is test_pit.py's keys. Then, on the nested first n samples of both, for
n in ``NS``, each test family gives its Bonferroni-adjusted smallest p-value
(tests x min p, capped at 1), "rejected" when below 1e-6 (test_pit.py's threshold for
mutants):

* ``pit_p``: the PIT in the descending-p order, χ² (20 bins) at each of the 6 positions
  and pooled, KS pooled: 8 tests;
* ``pit_id``: the same in the token-id order: 8 tests;
* ``pit_both``: both orders as one family of 16 tests (test_pit.py's verdict);
* ``hashed``: the hashed two-sample χ² of the speculative against the target-only samples,
  for each prefix length 1 .. 6: 6 tests, ``jaxspec.exactness.sampled.hashed_cells_for(n)``
  cells (16 up to n = 1024, 32 at 2048; test_pit.py prints 64 cells at 2048).

Resumable: each (decoder, seed) is written into the JSON as it completes, and a rerun skips
those already there (``--fresh`` starts over). ``--quick``: n up to 256, one seed, the
correct decoder and three mutants, under ``--out``'s quick/ subfolder. Writes
``exactness_power.json`` and ``exactness_power.png`` (one panel per test family:
-log10 adjusted p against samples, the median over seeds, one line per decoder).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

V = 49_152
PROMPT = (1, 2, 3)
L = 6
N_MAX = 2048
NS = (64, 128, 256, 512, 1024, 2048)
THRESHOLD = 1e-6  # on the Bonferroni-adjusted smallest p-value of a family
BINS = 20
KEY_DECODER, KEY_W, KEY_REF, KEY_STRIDE = 1, 2, 99, 1000
FAMILIES = {
    "pit_p": "PIT, descending-p order (8 tests)",
    "pit_id": "PIT, token-id order (8 tests)",
    "pit_both": "PIT, both orders (16 tests; test_pit.py's verdict)",
    "hashed": "hashed two-sample, prefixes 1..6 (6 tests)",
}
CORRECT = "correct"
QUICK_MUTANTS = ("no-residual-update", "reused-uniform", "block-unclipped")
#: as tests/test_pit.py's MUTANT_WARPS: where a mutant runs at other warps than T = 1
MUTANT_WARPS = {"reused-uniform": {"sampling": 2.0}, "block-unclipped": {"draft_sampling": 2.0}}


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=1,
                   help="independent seeds R per decoder (default 1: one (decoder, seed) takes 60-110 s on the "
                        "shared 2-core CPU, 11 of them about 18 min; a rerun with a larger R adds only the new seeds)")
    p.add_argument("--decoders", default=None,
                   help="comma-separated subset of the decoders ('correct' and mutant names; default all)")
    p.add_argument("--quick", action="store_true",
                   help="n up to 256, one seed, the correct decoder and three mutants (a smoke run)")
    p.add_argument("--fresh", action="store_true", help="ignore the results already in the JSON and start over")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON and exit")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"),
                   help="output folder (default benchmarks/results; --quick: its quick/ subfolder)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- the pair and decoders


def big_pair():
    """(target, draft) of tests/_tiny.py's ``tiny_pair(0, vocab_size=49152, hidden_size=16,
    num_heads=2, mix=0.05, head_scale=8.0)``, built the same way: two random models (keys 0
    and 1000) with their LM heads times 8; the draft's parameters 0.95 target + 0.05 other."""
    import jax
    from flax import nnx

    from jaxspec.nn.config import ModelConfig
    from jaxspec.nn.model import init_model

    cfg = ModelConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, rope_theta=10.0, max_position_embeddings=64)
    mix, head_scale = 0.05, 8.0

    def model(seed):
        m = init_model(cfg, jax.random.key(seed))
        m.lm_head.kernel[...] = m.lm_head.kernel[...] * head_scale
        return m

    target, other = model(0), model(1000)
    gdef, t_state = nnx.split(target)
    _, o_state = nnx.split(other)
    draft = nnx.merge(gdef, jax.tree.map(lambda a, b: (1.0 - mix) * a + mix * b, t_state, o_state))
    return target, draft


def decoder_config(name: str) -> dict:
    """The configuration ``name`` runs in (JSON-able): tree, scheme, rule, the target's and
    the draft's temperature (None: the target's)."""
    from jaxspec.exactness import mutants
    from jaxspec.exactness.harness import MUTANT_CONFIG

    if name == CORRECT:
        return dict(tree="branch:2,2", scheme="iid", rule="token", temperature=1.0, draft_temperature=None,
                    description="the library's decoder")
    rule = mutants.MUTANT_RULE[name]
    tree, scheme = MUTANT_CONFIG[rule]
    warps = MUTANT_WARPS.get(name, {})
    # the acceptance step is the mutant's: rule "token" keeps it, "auto" keeps a block/traversal one
    return dict(tree=tree, scheme=scheme, rule="token" if rule == "token" else "auto",
                temperature=warps.get("sampling", 1.0), draft_temperature=warps.get("draft_sampling"),
                description=mutants.describe(name))


def decoder_names(quick: bool, only: str | None) -> list[str]:
    from jaxspec.exactness import mutants

    names = [CORRECT, *(QUICK_MUTANTS if quick else mutants.MUTANTS)]
    if only:
        wanted = [s.strip() for s in only.split(",") if s.strip()]
        bad = [w for w in wanted if w not in (CORRECT, *mutants.MUTANTS)]
        if bad:
            sys.exit(f"exactness_power.py: unknown decoders {bad}; expected {CORRECT!r} or one of {mutants.MUTANTS}")
        names = [n for n in (CORRECT, *mutants.MUTANTS) if n in wanted]
    return names


# --------------------------------------------------------------------------- one work item


def _family(tests_pvalues: list[tuple[str, float]]) -> dict:
    """Bonferroni-adjusted smallest p-value of a family of (name, p) tests."""
    where, p = min(tests_pvalues, key=lambda t: t[1])
    adj = min(1.0, len(tests_pvalues) * p)
    return {"adj_p": adj, "min_p": p, "tests": len(tests_pvalues), "where": where, "rejected": adj < THRESHOLD}


def family_results(spec, ref, pits, n: int) -> dict:
    """Every family of the module docstring on the first ``n`` rows of the speculative
    samples ``spec`` int[N, L] (their PIT values ``pits``, both orders) and the target-only
    ``ref`` int[N, L]."""
    from jaxspec.exactness.hashed import hashed_tests
    from jaxspec.exactness.pit import PitValues, pit_tests
    from jaxspec.exactness.sampled import hashed_cells_for

    head = [PitValues(p.u[:n], p.impossible[:n], p.order) for p in pits]
    by_order = {p.order: [(t.name, t.pvalue) for t in pit_tests(p, bins=BINS).tests] for p in head}
    both = [(t.name, t.pvalue) for t in pit_tests(head, bins=BINS).tests]
    cells = hashed_cells_for(n)
    h = hashed_tests(spec[:n], ref[:n], num_cells=cells)
    out = {"pit_p": _family(by_order["p"]), "pit_id": _family(by_order["id"]), "pit_both": _family(both),
           "hashed": _family([(f"first {k} tokens", r.pvalue) for k, r in zip(h.lengths, h.tests)])}
    out["hashed"]["cells"] = cells
    out["impossible"] = int(head[0].impossible.sum())
    return out


class Sampler:
    """Draws the samples of one (decoder, seed), keeping the target-only samples of each
    (temperature, seed) for the decoders that share them."""

    def __init__(self, pair, n_max: int):
        self.pair, self.n_max, self.refs, self.parts = pair, n_max, {}, {}

    def target_only(self, temperature: float, seed: int):
        import jax
        import numpy as np

        import jaxspec

        k = (temperature, seed)
        if k not in self.refs:
            prompts = np.tile(PROMPT, (self.n_max, 1))
            self.refs[k] = np.asarray(jaxspec.generate_autoregressive(
                jax.random.key(KEY_REF + KEY_STRIDE * seed), self.pair[0], prompts, max_new_tokens=L,
                sampling=jaxspec.Sampling(temperature), stop_tokens=()).tokens)
        return self.refs[k]

    def run(self, name: str, seed: int, ns) -> dict:
        import jax
        import numpy as np

        import jaxspec
        from jaxspec.exactness import mutants
        from jaxspec.exactness.pit import ORDERS, pit_values

        cfg = decoder_config(name)
        target, draft = self.pair
        sampling = jaxspec.Sampling(cfg["temperature"])
        draft_sampling = None if cfg["draft_temperature"] is None else jaxspec.Sampling(cfg["draft_temperature"])
        if name != CORRECT and name not in self.parts:
            self.parts[name] = mutants.decoder(name)  # its rule (its own acceptance step, or cfg's) and parts
        t0 = time.perf_counter()
        ref = self.target_only(cfg["temperature"], seed)
        t1 = time.perf_counter()
        spec = np.asarray(jaxspec.generate(
            jax.random.key(KEY_DECODER + KEY_STRIDE * seed), target, draft, np.tile(PROMPT, (self.n_max, 1)),
            max_new_tokens=L, tree=cfg["tree"], scheme=cfg["scheme"], sampling=sampling,
            draft_sampling=draft_sampling, stop_tokens=(), prompt_bucket=None,
            rule=mutants.mutant_rule(name) or cfg["rule"] if name != CORRECT else cfg["rule"],
            parts=self.parts[name]["parts"] if name != CORRECT else None).tokens)
        assert spec.shape == (self.n_max, L) and spec.min() >= 0, spec.shape
        t2 = time.perf_counter()
        pits = pit_values(jax.random.key(KEY_W + KEY_STRIDE * seed), target, PROMPT, spec, sampling, order=ORDERS)
        t3 = time.perf_counter()
        by_n = {str(n): family_results(spec, ref, pits, n) for n in ns}
        t4 = time.perf_counter()
        return {"by_n": by_n, "keys": {"decoder": KEY_DECODER + KEY_STRIDE * seed, "w": KEY_W + KEY_STRIDE * seed,
                                       "target_only": KEY_REF + KEY_STRIDE * seed},
                "seconds": {"target_only": round(t1 - t0, 2), "speculative": round(t2 - t1, 2),
                            "pit_forwards": round(t3 - t2, 2), "tests": round(t4 - t3, 2), "total": round(t4 - t0, 2)}}


# --------------------------------------------------------------------------- the summary and the plot


def summarize(result: dict) -> dict:
    """``power[family][decoder][n]``: the fraction of seeds rejected; ``median_adj_p`` the
    median adjusted p over seeds; ``first_rejected[family][decoder]``: the smallest n at
    which every seed is rejected (None if none)."""
    import numpy as np

    power, median, first = {}, {}, {}
    for fam in FAMILIES:
        power[fam], median[fam], first[fam] = {}, {}, {}
        for name, seeds in result["runs"].items():
            if not seeds:
                continue
            ns = [n for n in map(str, result["setup"]["ns"])]
            power[fam][name] = {n: float(np.mean([s["by_n"][n][fam]["rejected"] for s in seeds.values()])) for n in ns}
            median[fam][name] = {n: float(np.median([s["by_n"][n][fam]["adj_p"] for s in seeds.values()])) for n in ns}
            first[fam][name] = next((int(n) for n in ns if power[fam][name][n] == 1.0), None)
    return {"power": power, "median_adj_p": median, "first_n_all_seeds_rejected": first}


def _neglog(p: float, floor: float = 1e-300) -> float:
    return -math.log10(max(p, floor))


def plot(result: dict, path: pathlib.Path) -> None:
    """One panel per family: -log10 adjusted p (median over seeds; each seed a dot) against
    samples, one line per decoder, the correct decoder dashed, the threshold dotted."""
    import numpy as np

    from jaxspec.bench.common import pyplot

    plt = pyplot()
    ns = result["setup"]["ns"]
    names = [n for n in result["runs"] if result["runs"][n]]
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5), sharex=True, sharey=True)
    for ax, (fam, title) in zip(axes.ravel(), FAMILIES.items()):
        for i, name in enumerate(names):
            seeds = result["runs"][name]
            ys = np.array([[_neglog(s["by_n"][str(n)][fam]["adj_p"]) for n in ns] for s in seeds.values()])
            correct = name == CORRECT
            color = "black" if correct else plt.cm.tab10(i % 10)
            ax.plot(ns, np.median(ys, axis=0), ls="--" if correct else "-", marker="o", ms=3, color=color,
                    lw=2.0 if correct else 1.2, label=name)
            if ys.shape[0] > 1:
                for row in ys:
                    ax.scatter(ns, row, s=6, color=color, alpha=0.35)
        ax.axhline(-math.log10(THRESHOLD), color="0.3", ls=":", lw=1.2)
        ax.text(ns[0], -math.log10(THRESHOLD) * 1.15, "threshold 1e-6", fontsize=7, color="0.3")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, 400)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("samples n (speculative; as many target-only)")
    for ax in axes[:, 0]:
        ax.set_ylabel("-log10 adjusted p (300 = p underflows to 0)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    r = max((len(s) for s in result["runs"].values()), default=0)
    seeds = "one seed" if r == 1 else f"median over {r} seeds; dots: each seed"
    fig.suptitle(f"Exactness tests without enumeration at V = {V:,}: -log10 adjusted p against samples ({seeds})",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict) -> str:
    """Markdown: per decoder, the smallest n at which every seed is rejected, per family."""
    first = result["summary"]["first_n_all_seeds_rejected"]
    lines = ["| decoder | " + " | ".join(FAMILIES) + " |", "|---" * (len(FAMILIES) + 1) + "|"]
    for name in result["runs"]:
        if result["runs"][name]:
            lines.append(f"| {name} | " + " | ".join(str(first[f].get(name) or "-") for f in FAMILIES) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def _setup(n_max: int, ns) -> dict:
    return {"vocab_size": V, "pair": "tiny_pair(0, vocab_size=49152, hidden_size=16, num_heads=2, mix=0.05, "
                                     "head_scale=8.0) (tests/_tiny.py), rebuilt with jaxspec.nn.model.init_model",
            "prompt": list(PROMPT), "horizon": L, "n_max": n_max, "ns": list(ns), "threshold": THRESHOLD,
            "pit_bins": BINS, "families": FAMILIES,
            "keys": f"decoder {KEY_DECODER} + {KEY_STRIDE} r, W {KEY_W} + {KEY_STRIDE} r, target-only "
                    f"{KEY_REF} + {KEY_STRIDE} r for seed r (seed 0: tests/test_pit.py's keys)",
            "hashed_cells": "jaxspec.exactness.sampled.hashed_cells_for(n)"}


def _write(result: dict, jpath: pathlib.Path) -> None:
    from jaxspec.bench.common import jsonable

    tmp = jpath.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(jsonable(result), indent=2) + "\n")
    tmp.replace(jpath)


def main(argv=None) -> int:
    args = _args(argv)
    out_dir = pathlib.Path(args.out) / ("quick" if args.quick else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, ppath = out_dir / "exactness_power.json", out_dir / "exactness_power.png"
    if args.plot_only:
        plot(json.loads(jpath.read_text()), ppath)
        print(f"wrote {ppath}")
        return 0

    from tqdm import tqdm

    from jaxspec.bench.common import log, machine_info

    n_max = 256 if args.quick else N_MAX
    ns = tuple(n for n in NS if n <= n_max)
    seeds = 1 if args.quick else args.seeds
    names = decoder_names(args.quick, args.decoders)
    setup = _setup(n_max, ns)
    result = None
    if jpath.is_file() and not args.fresh:
        result = json.loads(jpath.read_text())
        if result.get("setup") != json.loads(json.dumps(setup)):
            sys.exit(f"exactness_power.py: {jpath} was made with another setup; rerun with --fresh")
    if result is None:
        result = {"benchmark": "exactness_power", "setup": setup, "decoders": {}, "runs": {},
                  "time": {"items_s": 0.0, "sessions": []}}
    result["command"] = "python benchmarks/exactness_power.py" + (" --quick" if args.quick else f" --seeds {seeds}")
    result["seeds"] = max(seeds, result.get("seeds", 0))
    for name in names:
        result["decoders"][name] = decoder_config(name)
        result["runs"].setdefault(name, {})
    items = [(name, s) for s in range(seeds) for name in names if str(s) not in result["runs"][name]]
    log(f"exactness_power: {len(items)} items to run ({len(names)} decoders x {seeds} seeds, "
        f"{sum(len(v) for v in result['runs'].values())} (decoder, seed) already in {jpath})")
    t_start = time.perf_counter()
    sampler = Sampler(big_pair(), n_max) if items else None
    bar = tqdm(items, unit="item", file=sys.stderr)
    for name, s in bar:
        bar.set_description(f"{name} seed {s}")
        r = sampler.run(name, s, ns)
        result["runs"][name][str(s)] = r
        result["time"]["items_s"] = round(result["time"]["items_s"] + r["seconds"]["total"], 1)
        result["summary"] = summarize(result)
        result["machine"] = machine_info()
        _write(result, jpath)
        last = r["by_n"][str(ns[-1])]
        tqdm.write(f"{name} seed {s}: {r['seconds']['total']:.0f} s; at n = {ns[-1]} adjusted p: "
                   + ", ".join(f"{f} {last[f]['adj_p']:.3g}" for f in FAMILIES), file=sys.stderr)
    if items:
        result["time"]["sessions"].append({"items": len(items), "wall_s": round(time.perf_counter() - t_start, 1)})
    result["time"]["total_wall_s"] = round(sum(x["wall_s"] for x in result["time"]["sessions"]), 1)
    result["summary"] = summarize(result)
    result["machine"] = result.get("machine") or machine_info()
    _write(result, jpath)
    plot(result, ppath)
    print(table(result))
    print(f"wrote {jpath} and {ppath} ({result['time']['total_wall_s']:.0f} s of runs in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
