"""The tests :func:`jaxspec.verify` runs on its counts, fixed before any sample is drawn:
χ² of the joint law and of each position against the exact law, the two-sample χ² against
target-only sampling, the target-only control, the two row-independence tests, and one
binomial test per depth of the first round's acceptance, all at one Bonferroni threshold.

Row independence: the samples are the rows of batched calls, so a decoder whose rows share
state (a key, a cache slot) can give every row the exact law while neighbouring rows are
dependent, which the per-row tests cannot see. The joint law of the first ``k`` tokens of
rows ``2j`` and ``2j + 1`` (and, separately, of rows ``2j + 1`` and ``2j + 2``) of one
call, over disjoint pairs, is tested against the product of the exact marginals (χ², the
exact law of a pair of independent rows), with ``k`` the deepest prefix whose pair table
has at most :data:`~jaxspec.exactness.sample_counts.MAX_PAIR_CELLS` cells."""

from __future__ import annotations

import re

import numpy as np
from scipy import stats as scipy_stats

from jaxspec.exactness import power, stats
from jaxspec.exactness.exact_laws import ExactLaw
from jaxspec.exactness.sample_counts import row_pair_depth
from jaxspec.exactness.report import MAX_MIN_DETECTABLE_TV, TestResult

__all__ = ["planned_tests", "law_tests", "pooled_away", "evidence", "prefix_probs", "ROW_PAIRINGS"]

#: the row-independence tests: (the counts' name, the first row of each pair, the test's name)
ROW_PAIRINGS = (("pairs_even", 0, "rows 2j, 2j+1"), ("pairs_odd", 1, "rows 2j+1, 2j+2"))


def planned_tests(horizon: int, acc_exp, row_pairs: bool = True) -> int:
    """How many tests a run makes: joint, one per position, two-sample, control, the two
    row-independence tests (where counted), and one per depth of an enumerated acceptance
    expectation."""
    return 1 + horizon + 2 + (len(ROW_PAIRINGS) if row_pairs else 0) + (
        0 if acc_exp is None else np.asarray(acc_exp).size)


def _prefix_nodes(law: ExactLaw, k: int) -> np.ndarray:
    """int[C]: each cell's ancestor of depth ``k`` (an index into ``law.levels[k - 1]``)."""
    node = np.arange(law.probs.size)
    for lvl in range(len(law.levels) - 1, k - 1, -1):  # from the cells up to depth k
        node = np.asarray(law.levels[lvl][0])[node]
    return node


def prefix_probs(law: ExactLaw, k: int) -> np.ndarray:
    """float64[n_k]: the exact probability of each node of depth ``k`` of the law's prefix
    tree (``law.levels[k - 1]``), summed over the cells below it."""
    return np.bincount(_prefix_nodes(law, k), weights=law.probs, minlength=len(law.levels[k - 1][0]))


def relabel(label: str, names) -> str:
    """A stats cell label ("12", "12(p=0)", "pooled(5)") with the index replaced by its name."""
    m = re.fullmatch(r"(\d+)(.*)", label)
    return names[int(m.group(1))] + m.group(2) if m else label


def pooled_away(dof: int, cells: int) -> str:
    """The ``no_power`` note of a χ² test of a law of ``cells`` positive cells: non-empty when
    pooling left one cell (dof 0) of several. One cell of one (greedy) is not pooling away:
    any sample outside it is a certain rejection."""
    if dof == 0 and cells > 1:
        return f"dof 0: its {cells} cells pooled into one (too few samples per cell), p = 1 whatever the samples"
    return ""


def _clip(acc_exp) -> list[float]:
    return [] if acc_exp is None else [float(min(max(e, 0.0), 1.0)) for e in acc_exp]


def law_tests(law: ExactLaw, spec: dict, ar: dict, accepted, acc_exp, *, alpha: float, num_samples: int
              ) -> tuple[list[TestResult], float]:
    """The run's tests and their common threshold ``alpha / planned``. ``spec``, ``ar``:
    the speculative and target-only counts (``joint`` over the law's cells plus one outside
    cell, ``marginals``); ``accepted``: the first round's accepted rows per depth (None
    without an acceptance expectation)."""
    horizon = len(law.marginals)
    exact_full = np.append(law.probs, 0.0)  # + the outside-support cell
    row_pairs = "pairs_even" in spec
    a_test = stats.bonferroni(alpha, planned_tests(horizon, acc_exp, row_pairs))
    labels = [",".join(map(str, c)) for c in law.cells.tolist()] + ["outside"]
    tests = []

    def chi(name, r, kind, cells, joint=True):
        detail = ""
        if r.observed is not None:  # cells named by token sequences (joint) or token ids
            lbl = (tuple(relabel(x, labels) for x in r.labels) if joint else r.labels) or None
            detail = stats.table(r.observed, r.expected, labels=lbl, max_rows=10)
        tests.append(TestResult(name, kind, float(r.statistic), int(r.dof), float(r.pvalue), a_test, int(r.n),
                                r.note, detail, pooled_away(int(r.dof), cells)))

    def gof(c, p):
        return stats.chisquare_gof(c, p, min_expected=stats.MIN_EXPECTED)

    n_cells = int(law.probs.size)
    chi("joint chi2 vs exact", gof(spec["joint"], exact_full), "chi2_gof", n_cells)
    for i in range(horizon):
        chi(f"position {i + 1} chi2 vs exact", gof(spec["marginals"][i], law.marginals[i]), "chi2_gof",
            int(np.count_nonzero(law.marginals[i])), joint=False)
    chi("joint two-sample chi2 vs target-only",
        stats.chisquare_two_sample(spec["joint"], ar["joint"], min_expected=stats.MIN_EXPECTED), "chi2_two_sample",
        n_cells)
    chi("control: target-only joint chi2 vs exact", gof(ar["joint"], exact_full), "chi2_gof", n_cells)
    if row_pairs:
        k = row_pair_depth([len(par) for par, _ in law.levels])
        pk = np.append(prefix_probs(law, k), 0.0)  # + outside
        product = np.outer(pk, pk).ravel()
        node_names = {}  # a depth-k node's tokens, read off any cell below it
        for cell, nd in zip(law.cells[:, :k].tolist(), _prefix_nodes(law, k).tolist(), strict=True):
            node_names.setdefault(nd, ",".join(map(str, cell)))
        single = [node_names.get(i, str(i)) for i in range(len(pk) - 1)] + ["outside"]
        pair_labels = [f"{a} | {b}" for a in single for b in single]
        for counts, _, label in ROW_PAIRINGS:
            name = f"{label}: joint of {k} token{'s' * (k > 1)} vs product of exact marginals"
            c = spec[counts]
            if c.sum() == 0:
                tests.append(TestResult(name, "chi2_gof", 0.0, 0, 1.0, a_test, 0, "no pair of rows in a block",
                                        no_power="no pair of rows in a block (chunk_size < 3 or one sample)"))
                continue
            r = gof(c, product)
            detail = "" if r.observed is None else stats.table(
                r.observed, r.expected, labels=tuple(relabel(x, pair_labels) for x in r.labels) or None,
                max_rows=10)
            tests.append(TestResult(name, "chi2_gof", float(r.statistic), int(r.dof), float(r.pvalue), a_test,
                                    int(r.n), r.note, detail, pooled_away(int(r.dof), int(np.count_nonzero(product)))))
    for d, (k, e) in enumerate(zip([] if acc_exp is None else accepted, _clip(acc_exp), strict=True)):
        pv = float(scipy_stats.binomtest(int(k), num_samples, e).pvalue)
        p_min = power.binomial_min_pvalue(num_samples, e)
        no_power = (f"its most extreme outcome has p = {p_min:.3g} > {a_test:.3g}: cannot reject on "
                    f"{num_samples} samples") if p_min > a_test else ""
        tests.append(TestResult(f"acceptance at depth {d + 1} (binomial)", "binomial", float(k / num_samples),
                                0, pv, a_test, num_samples, f"observed {int(k)} of {num_samples}, "
                                f"expected {e * num_samples:.1f}", no_power=no_power))
    assert len(tests) == planned_tests(horizon, acc_exp, row_pairs)
    return tests, a_test


def evidence(law: ExactLaw, spec: dict, ar: dict, acc_exp, *, alpha: float, a_test: float, num_samples: int
             ) -> dict:
    """The report's distances and power: TV to the exact law (with its ``1 - alpha`` upper
    bound), the target-only control's TV, the smallest TV the joint test detects, and the
    samples the power rules need."""
    exact_full = np.append(law.probs, 0.0)
    mdt = stats.min_detectable_tv(num_samples, max(law.probs.size, 2), alpha=a_test)
    needed = max([power.tv_samples(num_samples, mdt, MAX_MIN_DETECTABLE_TV), power.gof_samples(law.probs),
                  *(power.gof_samples(m) for m in law.marginals),
                  *(power.binomial_samples(e, a_test) for e in _clip(acc_exp))])
    return dict(tv=stats.total_variation(spec["joint"], exact_full),
                tv_upper=stats.tv_upper_bound(spec["joint"], exact_full, alpha=alpha),
                tv_target_only=stats.total_variation(ar["joint"], exact_full),
                min_detectable_tv=mdt, samples_needed=needed)
