"""How many samples does the harness need to reject the ``draft-precision`` mutant?

The mutant (:mod:`jaxspec.exactness.mutants`) draws the draft's tokens from its
log-probabilities rounded to bfloat16 while the rule divides by the float32 ``q``, as
DeepSpec #31 did. Its law error is far smaller than the other mutants', so instead of
sampling until it shows, this script computes the mutant's **exact** law of the first ``L``
emitted tokens (float64 enumeration over every draft draw, the token rule of
docs/DESIGN.md §2 as :mod:`jaxspec.exactness.rule_laws` writes it, with the draws taken from
the rounded rows and the rule handed the unrounded ones), and from it the power of the
harness's joint χ² test at every sample count (noncentral χ² with
``lambda = n * sum (p_mut - p)^2 / p`` over the cells, ``dof = cells - 1``).

Tables (bigram: a row per previous token; V = 4, like the harness's default pair):
``pair``: the default pair's warped laws after the prompt ``1 2 3`` and one more token;
``random``: :func:`jaxspec.exactness.rule_laws.random_tables`. Trees: ``branch:2,2`` (the
mutant's default configuration) and ``chain:3``, scheme ``iid``.

    python benchmarks/draft_precision_power.py [--out benchmarks/results]

Writes ``draft_precision_power.json`` and ``draft_precision_power.png`` (power against
samples) under ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import pathlib

import numpy as np

LEVEL = 1e-6  # the threshold a mutant is rejected at (docs/EVIDENCE.md), Bonferroni in the harness: 1e-3 / 10
HARNESS_LEVEL = 1e-4
POWER = 0.9


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--horizon", type=int, default=3, help="tokens of the joint law (default 3, the harness's)")
    p.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    return p.parse_args(argv)


def rounded(q: np.ndarray) -> np.ndarray:
    """The law the mutant draws from: log q rounded to bfloat16, renormalized (float64)."""
    import jax.numpy as jnp

    q32 = np.asarray(q, np.float32)
    pos = q32 > 0
    logq = np.where(pos, np.log(np.where(pos, q32, 1.0)), -np.inf).astype(np.float32)
    low = np.asarray(jnp.asarray(logq).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    out = np.where(pos, np.exp(low - low.max(axis=-1, keepdims=True)), 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def mutant_emitted_law(parents, t, d_draw, d_rule, c0: int, length: int) -> np.ndarray:
    """Exact law of the first ``length`` tokens: drafts drawn from ``d_draw``, the token rule
    handed ``d_rule`` (iid siblings). ``t``, ``d_*``: bigram tables float64[V, V]."""
    from jaxspec.exactness import rule_laws as rl

    v = t.shape[0]
    kids = rl.children(parents)

    @functools.cache
    def round_law(c):
        out: dict = {}
        for tok, _, pr in rl.draft_outcomes(parents, d_draw, c, "iid"):
            laws = [None] * len(parents)
            for r, ks in enumerate(kids):
                ctx = c if r == 0 else tok[r - 1]
                for node in ks:
                    laws[node] = d_rule[ctx]
            rl.token_round(parents, tok, laws, t, c, out, pr)
        return out

    @functools.cache
    def f(c, n):
        out = np.zeros((v,) * n)
        for b, pr in round_law(c).items():
            if len(b) >= n:
                out[b[:n]] += pr
            else:
                out[b] += pr * f(b[-1], n - len(b))
        return out

    return f(int(c0), int(length))


def pair_tables():
    """Bigram tables from the harness's default pair: row c = the target's (draft's) law after
    the prompt 1 2 3 followed by c (temperature 1)."""
    import jax
    import jax.numpy as jnp

    from jaxspec.core.sampling import warp_probs
    from jaxspec.exactness.harness import DEFAULT_PROMPT, default_pair
    from jaxspec.nn.model import forward_logits

    target, draft = default_pair(0)
    v = target.config.vocab_size
    seqs = jnp.asarray([list(DEFAULT_PROMPT) + [c] for c in range(v)], jnp.int32)
    rows = [np.asarray(warp_probs(jax.jit(forward_logits)(m, seqs)[:, -1]), np.float64) for m in (target, draft)]
    return [r / r.sum(axis=1, keepdims=True) for r in rows]


def samples_needed(lam1: float, dof: int, level: float, power: float = POWER) -> int:
    """The least n at which the χ² test at ``level`` rejects with ``power`` (noncentral χ²)."""
    from scipy import stats

    crit = stats.chi2.isf(level, dof)
    lo, hi = 1.0, 1.0
    while stats.ncx2.sf(crit, dof, hi * lam1) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stats.ncx2.sf(crit, dof, mid * lam1) < power else (lo, mid)
    return int(np.ceil(hi))


def main(argv=None) -> int:
    args = _args(argv)
    from scipy import stats

    from jaxspec.bench.common import pyplot, write_report
    from jaxspec.exactness import rule_laws as rl

    tables = {"pair": pair_tables(), "random": rl.random_tables(0, 4)}
    trees = {"branch:2,2": rl.branching((2, 2)), "chain:3": rl.chain(3)}
    rows = []
    ns = np.logspace(5, 12, 57)
    for tname, (t, d) in tables.items():
        d_draw = rounded(d)
        for trname, parents in trees.items():
            exact = rl.target_law(t, 0, args.horizon).ravel()
            mut = mutant_emitted_law(parents, t, d_draw, d, 0, args.horizon).ravel()
            keep = exact > 0
            lam1 = float(np.sum((mut[keep] - exact[keep]) ** 2 / exact[keep]))
            dof = int(keep.sum()) - 1
            crit = {lvl: stats.chi2.isf(lvl, dof) for lvl in (LEVEL, HARNESS_LEVEL)}
            rows.append(dict(
                tables=tname, tree=trname, horizon=args.horizon, cells=int(keep.sum()),
                q_rounding_tv=float(0.5 * np.abs(d_draw - d).sum(axis=1).max()),
                law_tv=float(0.5 * np.abs(mut - exact).sum()), lambda_per_sample=lam1, dof=dof,
                samples_p_1e6=samples_needed(lam1, dof, LEVEL),
                samples_harness_level=samples_needed(lam1, dof, HARNESS_LEVEL),
                power_curve={f"{n:.3g}": float(stats.ncx2.sf(crit[LEVEL], dof, n * lam1)) for n in ns[::4]},
            ))
            print(f"{tname} {trname}: q rounding TV <= {rows[-1]['q_rounding_tv']:.2e}, law TV {rows[-1]['law_tv']:.2e}, "
                  f"lambda/n {lam1:.3e}: {rows[-1]['samples_p_1e6']:.3g} samples for power 0.9 at p < 1e-6", flush=True)

    def plot(result, path):
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in result["rows"]:
            dof, lam1 = r["dof"], r["lambda_per_sample"]
            ax.plot(ns, [stats.ncx2.sf(stats.chi2.isf(LEVEL, dof), dof, n * lam1) for n in ns],
                    label=f"{r['tables']} tables, {r['tree']} (law TV {r['law_tv']:.1e})")
        ax.axvline(1e6, color="0.5", ls=":", lw=0.8, label="verify's default 10^6")
        ax.set_xscale("log")
        ax.set_xlabel("samples")
        ax.set_ylabel("power of the joint chi2 at p < 1e-6")
        ax.set_title("draft-precision (draws from bf16 log q, rule with f32 q): exact power", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    result = {"benchmark": "draft_precision_power", "command": "python benchmarks/draft_precision_power.py",
              "level": LEVEL, "power": POWER, "rows": rows}
    write_report(result, pathlib.Path(args.out), "draft_precision_power", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
