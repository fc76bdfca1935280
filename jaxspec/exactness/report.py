"""The report of :func:`jaxspec.exactness.verify`: each test (:class:`TestResult`) and the
counts, TV bounds and acceptance behind them (:class:`VerifyReport`), as text
(:meth:`VerifyReport.summary`), JSON (:meth:`VerifyReport.to_json`) and matplotlib figures
(:meth:`VerifyReport.figures`, :meth:`VerifyReport.save_plots`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
from scipy import stats as _scipy_stats

__all__ = ["TestResult", "VerifyReport", "MAX_MIN_DETECTABLE_TV", "verdict_lines", "mutant_not_rejected",
           "save_figures"]

#: A run whose joint test detects (power 0.9) only laws at least this far in total
#: variation from the exact law is inconclusive: TV never exceeds 1, so such a run cannot
#: detect any deviation. Fixed in advance; not tuned on outcomes.
MAX_MIN_DETECTABLE_TV = 1.0


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One test of the report; ``passed`` iff ``pvalue > threshold`` (not rejected).

    ``no_power``: empty when the test can reject on its ``n`` samples; otherwise why it
    cannot, whatever the samples (a χ² test whose cells were all pooled into one, dof 0;
    a binomial test whose most extreme outcome has a p-value above ``threshold``). Such a
    test is not evidence, and makes the report inconclusive.
    """

    __test__ = False  # not a pytest class

    name: str
    kind: str  # "chi2_gof" | "chi2_two_sample" | "binomial" | "pit_chi2" | "ks" (the sampled path)
    statistic: float
    dof: int
    pvalue: float
    threshold: float
    n: int
    note: str = ""
    detail: str = dataclasses.field(default="", repr=False, compare=False)  # observed vs expected
    no_power: str = ""
    #: the smallest deviation the test detects with power 0.9 at ``threshold`` (the sampled
    #: path's tests: :mod:`jaxspec.exactness.sampled`); None where not computed per test
    detectable: float | None = None

    @property
    def passed(self) -> bool:
        return self.pvalue > self.threshold

    @property
    def has_power(self) -> bool:
        return not self.no_power

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        d["has_power"] = self.has_power
        d["statistic"] = _finite(self.statistic)
        d.pop("detail")
        return d


def _finite(x):
    return x if math.isfinite(x) else (None if math.isnan(x) else ("inf" if x > 0 else "-inf"))


@dataclasses.dataclass(frozen=True, eq=False)
class VerifyReport:
    """Outcome of :func:`verify`. Arrays are numpy; ``cells[c]`` is the token sequence of
    joint cell ``c``; ``*_counts[-1]`` counts samples outside the exact support.

    acceptance_observed / acceptance_expected: float64[D], per depth, the fraction of first
    rounds with an accepted node at that depth and its exact value (``None`` when not
    enumerated; see ``acceptance_note``).

    Verdict (:attr:`verdict`): ``"rejected"`` when any test is rejected; else
    ``"inconclusive"`` when the run has no statistical power (:attr:`inconclusive_reasons`:
    a test that cannot reject whatever the samples, see :attr:`TestResult.no_power`, or a
    smallest detectable TV >= :data:`MAX_MIN_DETECTABLE_TV`) or is a mutant's that no test
    rejected; else ``"passed"``.
    samples_needed: the fewest samples per run with which every planned test can reject
    and the smallest detectable TV is below :data:`MAX_MIN_DETECTABLE_TV` (necessary for a
    conclusive run; the two-sample test's pooling also depends on the counts).
    """

    config: dict
    tests: tuple[TestResult, ...]
    alpha: float
    alpha_per_test: float
    num_samples: int
    cells: np.ndarray
    exact: np.ndarray
    spec_counts: np.ndarray
    ar_counts: np.ndarray
    exact_marginals: np.ndarray
    spec_marginals: np.ndarray
    ar_marginals: np.ndarray
    tv: float
    tv_upper: float
    tv_target_only: float
    min_detectable_tv: float
    acceptance_observed: np.ndarray | None
    acceptance_expected: np.ndarray | None
    acceptance_samples: int
    acceptance_note: str
    tokens_per_round: float
    timings: dict
    samples_needed: int | None = None

    @property
    def passed(self) -> bool:
        """True iff no test is rejected and the run has power (:attr:`verdict` ``"passed"``)."""
        return self.verdict == "passed"

    @property
    def inconclusive_reasons(self) -> tuple[str, ...]:
        """Why this run cannot support a pass (empty when it can): a mutant that no test
        rejected (:func:`mutant_not_rejected`), each test without power, and a smallest
        detectable TV >= :data:`MAX_MIN_DETECTABLE_TV`."""
        reasons = [*mutant_not_rejected(self, f"TV >= {self.min_detectable_tv:.2g} (power 0.9)"),
                   *(f"{t.name}: {t.no_power}" for t in self.tests if t.no_power)]
        if not self.min_detectable_tv < MAX_MIN_DETECTABLE_TV:
            reasons.append(f"smallest TV the joint test detects (power 0.9) is {self.min_detectable_tv:.4g} "
                           f">= {MAX_MIN_DETECTABLE_TV:g}: it cannot detect any deviation")
        return tuple(reasons)

    @property
    def verdict(self) -> str:
        """``"rejected"`` (a test rejected), ``"inconclusive"`` (none rejected, no power) or
        ``"passed"``."""
        if self.rejected:
            return "rejected"
        return "inconclusive" if self.inconclusive_reasons else "passed"

    @property
    def rejected(self) -> tuple[TestResult, ...]:
        return tuple(t for t in self.tests if not t.passed)

    @property
    def num_cells(self) -> int:
        return int(self.exact.shape[0])

    def to_dict(self, *, include_counts: bool | None = None) -> dict:
        """JSON-able dict; counts per cell are included when ``include_counts`` (default:
        when there are at most 4096 cells)."""
        if include_counts is None:
            include_counts = self.num_cells <= 4096
        d = {
            "verdict": self.verdict,
            "passed": self.passed,
            "inconclusive_reasons": list(self.inconclusive_reasons),
            "samples_needed": self.samples_needed,
            "config": self.config,
            "alpha": self.alpha,
            "alpha_per_test": self.alpha_per_test,
            "num_samples": self.num_samples,
            "num_cells": self.num_cells,
            "tests": [t.to_dict() for t in self.tests],
            "tv": self.tv,
            "tv_upper_bound": self.tv_upper,
            "tv_confidence": 1.0 - self.alpha,
            "tv_target_only": self.tv_target_only,
            "min_detectable_tv": self.min_detectable_tv,
            "outside_support": {"speculative": int(self.spec_counts[-1]), "target_only": int(self.ar_counts[-1])},
            "acceptance": {
                "observed": None if self.acceptance_observed is None else self.acceptance_observed.tolist(),
                "expected": None if self.acceptance_expected is None else self.acceptance_expected.tolist(),
                "samples": self.acceptance_samples,
                "note": self.acceptance_note,
            },
            "tokens_per_round": self.tokens_per_round,
            "timings": self.timings,
        }
        if include_counts:
            d["cells"] = {
                "tokens": self.cells.tolist(),
                "exact": self.exact.tolist(),
                "speculative": self.spec_counts[:-1].tolist(),
                "target_only": self.ar_counts[:-1].tolist(),
            }
        return d

    def to_json(self, *, indent: int | None = 2, include_counts: bool | None = None) -> str:
        return json.dumps(self.to_dict(include_counts=include_counts), indent=indent)

    def summary(self) -> str:
        """A readable report: configuration, each test, TV, acceptance; the worst cells of
        every rejected test."""
        c = self.config
        lines = [
            f"jaxspec verify: tree={c['tree']} scheme={c['scheme']} rule={c.get('rule', 'token')} temperature={c['temperature']} "
            f"top_k={c['top_k']} top_p={c['top_p']} horizon={c['horizon']} prompt={c['prompt']}",
            *([f"  MUTANT={c['mutant']}: {c['mutant_bug']}"] if c.get("mutant") else []),
            f"  {self.num_samples:,} samples per run on {c['devices']} device(s); {self.num_cells} cells; "
            f"family alpha {self.alpha:g}, Bonferroni over {len(self.tests)} tests -> {self.alpha_per_test:.3g} each",
            "",
            f"  {'test':<44} {'statistic':>12} {'dof':>5} {'p-value':>11}  result",
        ]
        for t in self.tests:
            lines.append(f"  {t.name:<44} {t.statistic:>12.4g} {t.dof:>5} {t.pvalue:>11.4g}  "
                         f"{'REJECTED' if not t.passed else 'pass' if t.has_power else 'no power'}")
        lines += [
            "",
            f"  TV(speculative, exact) = {self.tv:.5f}; < {self.tv_upper:.5f} with confidence {1 - self.alpha:g}",
            f"  TV(target-only, exact) = {self.tv_target_only:.5f}; smallest TV the joint test detects "
            f"(power 0.9): {self.min_detectable_tv:.5f}",
        ]
        if self.acceptance_observed is not None:
            obs = ", ".join(f"{x:.4f}" for x in self.acceptance_observed)
            exp = ("n/a" if self.acceptance_expected is None
                   else ", ".join(f"{x:.4f}" for x in self.acceptance_expected))
            lines.append(f"  acceptance per depth (first round, {self.acceptance_samples:,} rounds): "
                         f"observed [{obs}] expected [{exp}]")
        if self.acceptance_note:
            lines.append(f"  note: {self.acceptance_note}")
        if c.get("scope"):
            lines.append(f"  note: {c['scope']}")
        lines.append(f"  tokens per round (speculative run): {self.tokens_per_round:.4f}")
        more = (f"; at least {self.samples_needed:,} samples per run are needed"
                if self.samples_needed is not None and self.samples_needed > self.num_samples else "")
        lines += verdict_lines(self, f"the run has no statistical power at {self.num_samples:,} samples per run{more}")
        return "\n".join(lines)

    def save_plots(self, directory) -> list[str]:
        """Write :meth:`figures` as ``marginals.png``, ``joint.png`` and ``acceptance.png``
        into ``directory`` (created if needed); returns the paths."""
        return save_figures(self.figures(), directory)

    def figures(self) -> dict:
        """matplotlib figures (``matplotlib.figure.Figure``, no pyplot state, any backend):

        * ``"marginals"``: per position, the exact law and the target-only and speculative
          frequencies;
        * ``"joint"``: standardized residuals ``(o - e) / sqrt(e)`` per joint cell;
        * ``"acceptance"``: per depth, the observed first-round acceptance (99.9%
          intervals) against its exact expectation.
        """
        from matplotlib.figure import Figure

        figs = {}
        cfg = self.config
        title = f"tree={cfg['tree']} scheme={cfg['scheme']} T={cfg['temperature']}" + (
            f"  MUTANT {cfg['mutant']}" if cfg.get("mutant") else "")
        pv = {t.name: t.pvalue for t in self.tests}

        horizon = self.exact_marginals.shape[0]
        fig = Figure(figsize=(4.5 * horizon, 3.6))
        axes = fig.subplots(1, horizon, squeeze=False)
        for i, ax in enumerate(axes[0]):
            ex = self.exact_marginals[i]
            toks = np.flatnonzero(ex > 0)
            seen = np.flatnonzero((self.spec_marginals[i] + self.ar_marginals[i]) > 0)
            toks = np.union1d(toks, seen)
            if toks.size > 24:
                toks = toks[np.argsort(-ex[toks], kind="stable")[:24]]
            x = np.arange(toks.size)
            n_s = max(self.spec_marginals[i].sum(), 1)
            n_a = max(self.ar_marginals[i].sum(), 1)
            ax.bar(x - 0.2, self.ar_marginals[i][toks] / n_a, 0.4, label="target only", color="tab:gray")
            ax.bar(x + 0.2, self.spec_marginals[i][toks] / n_s, 0.4, label="speculative", color="tab:blue")
            ax.scatter(x, ex[toks], marker="_", s=300, color="black", label="exact", zorder=3)
            ax.set_xticks(x, [str(t) for t in toks], fontsize=7)
            ax.set_xlabel("token")
            p = pv.get(f"position {i + 1} chi2 vs exact", float("nan"))
            ax.set_title(f"position {i + 1}  (p = {p:.3g})", fontsize=9)
        axes[0][0].set_ylabel("frequency")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        figs["marginals"] = fig

        fig = Figure(figsize=(9, 3.4))
        ax = fig.subplots()
        k = min(self.num_cells, 512)
        order = np.argsort(-self.exact, kind="stable")[:k]
        for counts, name, color in ((self.ar_counts, "target only", "tab:gray"),
                                    (self.spec_counts, "speculative", "tab:blue")):
            n = counts.sum()
            e = n * self.exact[order]
            z = (counts[order] - e) / np.sqrt(np.maximum(e, 1e-12))
            ax.plot(np.arange(k), z, ".", ms=3, label=name, color=color)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlabel(f"joint cell (by exact probability{', top 512' if self.num_cells > 512 else ''})")
        ax.set_ylabel("(observed - expected) / sqrt(expected)")
        p = pv.get("joint chi2 vs exact", float("nan"))
        ax.set_title(f"joint law of the first {horizon} tokens (p = {p:.3g}); outside support: "
                     f"{int(self.spec_counts[-1])} speculative", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs["joint"] = fig

        fig = Figure(figsize=(5, 3.4))
        ax = fig.subplots()
        if self.acceptance_observed is not None:
            d = np.arange(1, self.acceptance_observed.size + 1)
            n = max(self.acceptance_samples, 1)
            obs = self.acceptance_observed
            z = _scipy_stats.norm.isf(0.0005)
            ref = obs if self.acceptance_expected is None else self.acceptance_expected
            err = z * np.sqrt(np.maximum(ref * (1 - ref), 0) / n)
            if self.acceptance_expected is not None:
                ax.bar(d, self.acceptance_expected, 0.6, color="tab:gray", alpha=0.6, label="expected (exact)")
            ax.errorbar(d, obs, yerr=err, fmt="o", color="tab:blue", capsize=4, label="observed (99.9%)")
            ax.set_xticks(d)
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "acceptance run skipped", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("depth")
        ax.set_ylabel("P(accepted node at depth)")
        ax.set_title("first-round acceptance by depth" + (f"\n{self.acceptance_note}" if self.acceptance_note
                                                           else ""), fontsize=9)
        fig.tight_layout()
        figs["acceptance"] = fig
        return figs


def mutant_not_rejected(report, detects: str) -> tuple[str, ...]:
    """The reason a mutant's run that no test rejected is not a pass (empty for any other
    run): a mutant is a known bug, so its run not rejected says only that the tests, at this
    sample count, see no deviation below ``detects`` (e.g. ``"TV >= 0.16 (power 0.9)"``).
    ``report`` has ``config``, ``rejected`` and ``num_samples``."""
    mutant = report.config.get("mutant")
    if not mutant or report.rejected:
        return ()
    return (f"MUTANT={mutant} not rejected: this sample count ({report.num_samples:,} per run) can only "
            f"detect {detects}",)


def verdict_lines(report, no_power: str, *, details: int | None = None) -> list[str]:
    """The closing lines of a report's summary: the worst cells of its rejected tests that
    carry them (the first ``details``; all when None), then the verdict, ``no_power`` saying
    why an inconclusive run is, followed by its ``inconclusive_reasons``; a mutant's run
    that no test rejected reads ``NOT REJECTED``, never ``PASSED``. ``report`` has
    ``config``, ``verdict``, ``tests``, ``rejected`` and ``inconclusive_reasons``."""
    lines = []
    for t in [t for t in report.rejected if t.detail][:details]:
        note = f" ({t.note})" if t.note else ""  # a header never ends on an empty note
        lines += ["", f"  {t.name}{note}, worst cells first:", *("    " + s for s in t.detail.splitlines())]
    lines.append("")
    if report.verdict == "passed":
        lines.append("PASSED: every test passed")
    elif report.verdict == "rejected":
        lines.append(f"REJECTED: {len(report.rejected)} of {len(report.tests)} tests rejected")
    elif report.config.get("mutant"):  # inconclusive_reasons starts with mutant_not_rejected's
        lines.append(f"NOT REJECTED (inconclusive): {report.inconclusive_reasons[0]}")
        lines += [f"  {r}" for r in report.inconclusive_reasons[1:]]
    else:
        lines.append(f"INCONCLUSIVE: no test rejected, but {no_power}")
        lines += [f"  {r}" for r in report.inconclusive_reasons]
    return lines


def save_figures(figures: dict, directory) -> list[str]:
    """Write each figure of ``figures`` (name -> matplotlib Figure) as ``directory/name.png``
    (the folder created if needed); returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        paths.append(os.path.join(directory, f"{name}.png"))
        fig.savefig(paths[-1], dpi=110)
    return paths
