"""The report of :func:`jaxspec.exactness.verify` on its sampled path
(:mod:`jaxspec.exactness.sampled`): the PIT and hashed two-sample tests with the smallest
deviation each detects, as text (:meth:`SampledReport.summary`), JSON
(:meth:`SampledReport.to_json`) and figures (:meth:`SampledReport.save_plots`). It answers
what :class:`~jaxspec.exactness.report.VerifyReport` answers (``verdict``, ``passed``,
``tests``, ``config``), so code and the command line take either."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from scipy import stats as scipy_stats

from jaxspec.exactness.report import TestResult, mutant_not_rejected, save_figures, verdict_lines

__all__ = ["SampledReport"]

#: the pooled χ² test of each PIT histogram (names as :mod:`jaxspec.exactness.sampled` gives them)
_POOLED_TEST = {"speculative [p]": "speculative PIT [p] pooled chi2", "speculative [id]": "speculative PIT [id] pooled chi2",
                "target-only [p]": "target-only PIT (control) pooled chi2"}


def _drift_line(d: dict | None) -> list[str]:
    """The summary's line on the float drift (jaxspec/exactness/drift.py), where measured."""
    if not d or not d.get("positions"):
        return []
    return [f"  float drift ({d['dtype']}): the verification forward (chunks of {d['chunk']} under the tree mask) "
            f"against one-token forwards over {d['positions']} positions of the first {d['samples']} samples: "
            f"max |delta logit| {d['max_abs_dlogit']:.3g}, TV per position mean {d['tv_mean']:.3g} max "
            f"{d['tv_max']:.3g}, argmax differs at {d['argmax_flips']}; the decoder samples the verifier's law"]


@dataclasses.dataclass(frozen=True, eq=False)
class SampledReport:
    """Outcome of the sampled path. ``spec_samples`` / ``ar_samples`` int32[S, L]: the
    speculative and target-only tokens tested; ``*_marginals`` int64[L, V]: their token
    counts per position; ``pit_histograms``: per PIT, int64[L, bins] counts of ``U`` by
    position; ``impossible``: tokens of probability 0 given their prefix, per run (each is a
    certain rejection); ``acceptance_observed`` float64[D]: accepted nodes per round at
    each depth, over ``acceptance_rounds`` rounds.

    Verdict: ``"rejected"`` when any test is rejected; else ``"inconclusive"`` when a test
    cannot reject whatever the samples (:attr:`TestResult.no_power`) or the run is a
    mutant's (:func:`~jaxspec.exactness.report.mutant_not_rejected`); else ``"passed"``."""

    config: dict
    tests: tuple[TestResult, ...]
    alpha: float
    alpha_per_test: float
    num_samples: int
    spec_samples: np.ndarray
    ar_samples: np.ndarray
    spec_marginals: np.ndarray
    ar_marginals: np.ndarray
    pit_histograms: dict
    impossible: dict
    acceptance_observed: np.ndarray
    acceptance_rounds: int
    acceptance_note: str
    tokens_per_round: float
    timings: dict
    method: str = "sampled"

    @property
    def rejected(self) -> tuple[TestResult, ...]:
        return tuple(t for t in self.tests if not t.passed)

    @property
    def inconclusive_reasons(self) -> tuple[str, ...]:
        d = self.detectable()
        detects = ", ".join(f"TV >= {d[k]:.2g} {where}" for k, where in (
            ("hashed_tv", f"between the hashed laws of the {self.config['horizon']} tokens"),
            ("pit_tv", "in the PIT's law")) if d[k] is not None) + " (power 0.9)"
        return (*mutant_not_rejected(self, detects), *(f"{t.name}: {t.no_power}" for t in self.tests if t.no_power))

    @property
    def verdict(self) -> str:
        if self.rejected:
            return "rejected"
        return "inconclusive" if self.inconclusive_reasons else "passed"

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    def detectable(self) -> dict:
        """The smallest deviation (power 0.9) of the pooled tests: ``pit_tv`` (TV between
        the binned law of U and uniform, speculative PIT in order ``p``), ``pit_ks`` (the
        largest gap of U's CDF), ``hashed_tv`` (TV between the two laws of the hashed
        cells of the whole ``L`` tokens)."""
        by_name = {t.name: t.detectable for t in self.tests}
        horizon = self.config["horizon"]
        return {"pit_tv": by_name.get("speculative PIT [p] pooled chi2"),
                "pit_ks": by_name.get("speculative PIT [p] pooled KS"),
                "hashed_tv": by_name.get(f"hashed two-sample chi2, first {horizon} tokens")}

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "passed": self.passed,
            "method": self.method,
            "inconclusive_reasons": list(self.inconclusive_reasons),
            "config": self.config,
            "alpha": self.alpha,
            "alpha_per_test": self.alpha_per_test,
            "num_samples": self.num_samples,
            "tests": [t.to_dict() for t in self.tests],
            "detectable": self.detectable(),
            "impossible": self.impossible,
            "pit_histograms": {k: v.tolist() for k, v in self.pit_histograms.items()},
            "acceptance": {"observed": self.acceptance_observed.tolist(), "expected": None,
                           "rounds": self.acceptance_rounds, "note": self.acceptance_note},
            "tokens_per_round": self.tokens_per_round,
            "timings": self.timings,
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:
        """What was tested, each test with its p-value and the deviation it detects, the
        acceptance, the verdict; the worst cells of a rejected hashed test."""
        c = self.config
        d = self.detectable()
        lines = [
            f"jaxspec verify: tree={c['tree']} scheme={c['scheme']} rule={c['rule']} drafter={c['drafter']} "
            f"temperature={c['temperature']} top_k={c['top_k']} top_p={c['top_p']} min_p={c['min_p']} "
            f"horizon={c['horizon']} prompt={c['prompt']}",
            *([f"  MUTANT={c['mutant']}: {c['mutant_bug']}"] if c.get("mutant") else []),
            f"  method: sampled ({c['method_reason']}): the conditional PIT against the target's exact next-token "
            f"laws, and hashed cells ({c['hashed_cells']}) against target-only sampling",
            f"  {self.num_samples:,} samples of {c['horizon']} tokens per run on {c['devices']} device(s); family "
            f"alpha {self.alpha:g}, Bonferroni over {len(self.tests)} tests -> {self.alpha_per_test:.3g} each",
            "",
            f"  {'test':<52} {'statistic':>11} {'dof':>4} {'p-value':>10} {'detects':>8}  result",
        ]
        for t in self.tests:
            dof = "-" if t.kind == "ks" else str(t.dof)
            lines.append(f"  {t.name:<52} {t.statistic:>11.4g} {dof:>4} {t.pvalue:>10.3g} {t.detectable:>8.3g}  "
                         f"{'REJECTED' if not t.passed else 'pass' if t.has_power else 'no power'}")
        lines += [
            "",
            f"  power 0.9 at this sample count: the pooled PIT chi2 detects TV {d['pit_tv']:.4g} between the binned "
            f"law of U and uniform, KS a CDF gap of {d['pit_ks']:.4g}; the hashed test detects TV "
            f"{d['hashed_tv']:.4g} between the hashed laws of the {c['horizon']} tokens",
            f"  impossible tokens (probability 0 under the target's law): {self.impossible['speculative']} "
            f"speculative, {self.impossible['target_only']} target-only",
            *_drift_line(c.get("drift")),
            "  acceptance per depth: [" + ", ".join(f"{x:.4f}" for x in self.acceptance_observed)
            + f"] over {self.acceptance_rounds:,} rounds; tokens per round {self.tokens_per_round:.4f}",
            f"  note: {self.acceptance_note}",
        ]
        if c.get("scope"):
            lines.append(f"  note: {c['scope']}")
        # the worst cells of the first two rejected tests that have cells
        lines += verdict_lines(self, f"a test has no power at {self.num_samples:,} samples", details=2)
        return "\n".join(lines)

    def save_plots(self, directory) -> list[str]:
        """Write :meth:`figures` as ``pit.png``, ``hashed.png`` and ``acceptance.png`` into
        ``directory`` (created if needed); returns the paths."""
        return save_figures(self.figures(), directory)

    def figures(self) -> dict:
        """matplotlib figures (no pyplot state):

        * ``"pit"``: per PIT, the pooled histogram of U against uniform with its 99.9% band;
        * ``"hashed"``: standardized residuals of the hashed cells of the whole ``L``
          tokens, speculative against the pooled law of both runs;
        * ``"acceptance"``: accepted nodes per round at each depth.
        """
        from matplotlib.figure import Figure

        from jaxspec.exactness.hashed import hash_cells  # noqa: PLC0415

        cfg = self.config
        title = f"tree={cfg['tree']} scheme={cfg['scheme']} T={cfg['temperature']}" + (
            f"  MUTANT {cfg['mutant']}" if cfg.get("mutant") else "")
        pv = {t.name: t.pvalue for t in self.tests}
        z = scipy_stats.norm.isf(0.0005)
        figs = {}

        fig = Figure(figsize=(4.2 * len(self.pit_histograms), 3.4))
        axes = fig.subplots(1, len(self.pit_histograms), squeeze=False)[0]
        for ax, (name, h) in zip(axes, self.pit_histograms.items(), strict=True):
            pooled = h.sum(axis=0)
            n, bins = pooled.sum(), pooled.size
            e = n / bins
            density = pooled / max(e, 1e-12)
            band = z * np.sqrt(e * (1 - 1 / bins)) / max(e, 1e-12)
            ax.axhspan(1 - band, 1 + band, color="tab:gray", alpha=0.3, label="99.9% band (one bin)")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.stairs(density, np.linspace(0.0, 1.0, bins + 1), color="tab:blue", lw=1.5, label="observed")
            ax.set_ylim(0.0, max(1.5, 1 + 1.5 * band, 1.1 * float(density.max(initial=0.0))))
            p = pv.get(_POOLED_TEST.get(name, ""), float("nan"))
            ax.set_title(f"{name} PIT, pooled (n = {n:,}; p = {p:.3g})", fontsize=9)
            ax.set_xlabel("U")
        axes[0].set_ylabel("density (uniform = 1)")
        axes[0].legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        figs["pit"] = fig

        fig = Figure(figsize=(9, 3.4))
        ax = fig.subplots()
        cells = cfg["hashed_cells"]
        a = np.bincount(hash_cells(self.spec_samples, cells), minlength=cells)
        b = np.bincount(hash_cells(self.ar_samples, cells), minlength=cells)
        pooled = (a + b) / max(a.sum() + b.sum(), 1)
        e = a.sum() * pooled
        ax.plot(np.arange(cells), (a - e) / np.sqrt(np.maximum(e, 1e-12)), ".", ms=3, color="tab:blue")
        ax.axhline(0, color="black", lw=0.8)
        horizon = cfg["horizon"]
        ax.set_xlabel(f"hashed cell of the first {horizon} tokens")
        ax.set_ylabel("speculative: (o - e) / sqrt(e)")
        ax.set_title(f"hashed two-sample (p = {pv.get(f'hashed two-sample chi2, first {horizon} tokens', float('nan')):.3g})",
                     fontsize=9)
        fig.tight_layout()
        figs["hashed"] = fig

        fig = Figure(figsize=(5, 3.4))
        ax = fig.subplots()
        dep = np.arange(1, self.acceptance_observed.size + 1)
        ax.bar(dep, self.acceptance_observed, 0.6, color="tab:blue")
        ax.set_xticks(dep)
        ax.set_xlabel("depth")
        ax.set_ylabel("accepted nodes per round")
        ax.set_title(f"acceptance over {self.acceptance_rounds:,} rounds (observed)", fontsize=9)
        fig.tight_layout()
        figs["acceptance"] = fig
        return figs
