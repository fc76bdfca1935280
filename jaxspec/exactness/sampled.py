"""The sampled path of :func:`jaxspec.exactness.verify`: exactness tests that need no
enumeration, for a law with more joint cells than :data:`~jaxspec.exactness.exact_laws.MAX_CELLS`
(any real vocabulary without a small top-k).

The decoder is sampled exactly as on the enumeration path (``S`` copies of the prompt, in
blocks of vmapped rows on every device, :func:`~jaxspec.exactness.sample_counts.count_samples`),
but each block returns its ``L`` tokens instead of joint cells. Then, with family-wise
``alpha`` split by Bonferroni over every test, fixed before any sample is drawn:

* the conditional PIT of the speculative tokens (:mod:`jaxspec.exactness.pit`), in both
  orders of the vocabulary (descending ``p``, token id): χ² on equal bins by position and
  pooled, and KS pooled -- against the target's exact next-token laws, one teacher-forced
  forward per sample;
* the same PIT of the target-only tokens (order ``p``): a control on the harness itself
  (the forward that gives the laws, and the target-only sampler);
* the hashed two-sample χ² of the speculative against the target-only sequences
  (:mod:`jaxspec.exactness.hashed`), for each prefix length ``1 .. L``.

Each test reports the smallest deviation it detects with power 0.9 at its level
(``TestResult.detectable``); a test that cannot reject whatever the samples makes the
report ``"inconclusive"``. Acceptance per depth is observed over every round of the
speculative run (it is enumerated only on the enumeration path).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

from jaxspec.core.settings import Sampling
from jaxspec.errors import SettingError
from jaxspec.exactness import stats
from jaxspec.exactness.exact_laws import MAX_CELLS, cells_bound
from jaxspec.exactness.drift import forward_drift
from jaxspec.exactness.hashed import hash_cells, hashed_tests
from jaxspec.exactness.pit import ORDERS, PitTest, pit_tests, pit_values
from jaxspec.exactness.report import TestResult
from jaxspec.exactness.sample_counts import finish_timings
from jaxspec.exactness.sampled_report import SampledReport

__all__ = ["METHODS", "PIT_BINS", "choose_method", "too_many_cells", "hashed_cells_for", "sampled_tests",
           "run_sampled", "SampledReport"]

#: equal bins of the PIT's χ² tests
PIT_BINS = 20
#: how :func:`~jaxspec.exactness.harness.verify` tests: "auto" (enumeration where the law's
#: cells fit, else sampled), "enumerate", "sampled"
METHODS = ("auto", "enumerate", "sampled")


def too_many_cells(law: Sampling, v: int, horizon: int) -> SettingError | None:
    """The refusal of enumeration for a law with more than :data:`MAX_CELLS` cells (from its
    bound, before anything is enumerated), or None where it fits."""
    top_k = law.top_k
    k = min(v, top_k or v)
    if cells_bound(v, horizon, temperature=law.temperature, top_k=k) <= MAX_CELLS:
        return None
    count = f"{k}**{horizon}{f' = {k**horizon}' if horizon <= 64 else ''}"
    whose = f"the target's {v} tokens give" if top_k is None else f"min(top_k, the target's {v} tokens) give"
    return SettingError({"top_k": top_k, "horizon": horizon},
                        f"{whose} up to {count} joint cells, more than MAX_CELLS = {MAX_CELLS}; expected a top_k "
                        f"with top_k**horizon <= {MAX_CELLS}, or a smaller horizon (or method='sampled', which "
                        f"needs no enumeration)")


def choose_method(method: str, law: Sampling, v: int, horizon: int) -> tuple[str, str]:
    """(the method as resolved, why): ``"auto"`` enumerates where the law's cells fit;
    ``"enumerate"`` on a law that does not fit is refused, naming top_k and horizon."""
    too_many = too_many_cells(law, v, horizon)
    if too_many is not None and method == "enumerate":
        raise too_many
    if method == "sampled":
        return "sampled", "method='sampled'"
    if too_many is not None:
        k = min(v, law.top_k or v)
        return "sampled", f"up to {k}**{horizon} joint cells, more than the MAX_CELLS = {MAX_CELLS} enumeration takes"
    return "enumerate", "the joint law fits enumeration"


def hashed_cells_for(num_samples: int) -> int:
    """Cells of the hashed two-sample test for ``num_samples`` per sample: a power of two
    near ``S / 64`` (64 expected per cell if the law spread evenly), in [16, 4096]."""
    return int(min(4096, max(16, 2 ** round(math.log2(max(num_samples, 1) / 64)))))


def _no_power(detectable: float) -> str:
    return ("" if detectable < 1.0 else
            f"detects only deviations >= {detectable:.3g} (power 0.9), and none can exceed 1: it cannot reject")


def _pit_result(t: PitTest, prefix: str) -> TestResult:
    ks = t.dof is None
    return TestResult(f"{prefix} {t.name}", "ks" if ks else "pit_chi2", t.statistic, 0 if ks else t.dof, t.pvalue,
                      t.threshold, t.n, note=t.note, no_power=_no_power(t.detectable), detectable=t.detectable)


def sampled_tests(key, target, prompt, spec, ar, sampling, *, alpha: float, bins: int = PIT_BINS,
                  num_cells: int | None = None, progress: bool = False) -> tuple[list[TestResult], dict, float]:
    """Every test of the module docstring on ``spec`` and ``ar`` int32[S, L] (the
    speculative and target-only tokens after ``prompt``) under ``sampling`` (the target's
    warps): (the tests, the data behind them for the report and its figures, the level
    of each test). ``key`` draws the PIT's uniforms (one key per run)."""
    horizon = spec.shape[1]
    num_cells = hashed_cells_for(min(len(spec), len(ar))) if num_cells is None else num_cells
    m_spec, m_ar, m_hash = len(ORDERS) * (horizon + 2), horizon + 2, horizon
    m = m_spec + m_ar + m_hash
    a_test = stats.bonferroni(alpha, m)
    spec_pit = pit_values(jax.random.fold_in(key, 0), target, prompt, spec, sampling, order=ORDERS,
                          progress=progress, desc="PIT of speculative")
    ar_pit = pit_values(jax.random.fold_in(key, 1), target, prompt, ar, sampling, order="p", progress=progress,
                        desc="PIT of target only")
    spec_res = pit_tests(spec_pit, bins=bins, alpha=alpha * m_spec / m)
    ar_res = pit_tests(ar_pit, bins=bins, alpha=alpha * m_ar / m)
    hashed = hashed_tests(spec, ar, num_cells=num_cells, alpha=alpha * m_hash / m)
    tests = [_pit_result(t, "speculative PIT") for t in spec_res.tests]
    tests += [_pit_result(t, "target-only PIT (control)") for t in ar_res.tests]
    for k, r, d in zip(hashed.lengths, hashed.tests, hashed.detectable, strict=True):
        # one cell seen in both samples: the first k tokens are (as far as S samples show) one
        # sequence under both decoders -- agreement, not a lack of samples; the PIT still tests
        # those tokens. Several cells pooled into one: too few samples for this test.
        seen = np.unique(hash_cells(np.concatenate([spec[:, :k], ar[:, :k]]), num_cells)).size
        no_power = ("every cell pooled into one (dof 0)" if r.dof < 1 and seen > 1 else
                    "" if r.dof < 1 else _no_power(d))
        tests.append(TestResult(f"hashed two-sample chi2, first {k} tokens", "chi2_two_sample", r.statistic, r.dof,
                                r.pvalue, hashed.threshold, r.n, note=r.note, detail=r.table(), no_power=no_power,
                                detectable=d))

    # a prefix whose rare sequences were pooled into one cell with the common one (a
    # near-certain first token) is vacuous, not a run without power, while a longer prefix of
    # the same family can reject: the family then has power, and the PIT tests those positions
    hashed_tests_ = [t for t in tests if t.kind == "chi2_two_sample"]
    if any(t.has_power for t in hashed_tests_):
        tests = [dataclasses.replace(t, no_power="", note=f"{t.note}; vacuous: {t.no_power}, a longer prefix tests "
                                     "with power") if t.kind == "chi2_two_sample" and t.no_power.startswith("every")
                 else t for t in tests]

    def hist(u):  # [S, L] -> int64[L, bins] (NaN, an impossible token, counts nowhere)
        b = np.minimum(np.nan_to_num(u, nan=-1.0) * bins, bins - 1).astype(np.int64)
        return np.stack([np.bincount(b[:, t][b[:, t] >= 0], minlength=bins) for t in range(u.shape[1])])

    data = {
        "pit_histograms": {"speculative [p]": hist(spec_pit[0].u), "speculative [id]": hist(spec_pit[1].u),
                           "target-only [p]": hist(ar_pit.u)},
        "impossible": {"speculative": spec_pit[0].num_impossible, "target_only": ar_pit.num_impossible},
        "hashed_cells": num_cells,
        "bins": bins,
    }
    return tests, data, a_test


def run_sampled(run, draw, *, alpha: float, progress: bool, t_start: float, config: dict) -> SampledReport:
    """The sampled path for a prepared run (:func:`jaxspec.exactness.harness.verify`'s):
    ``draw(run, None, False, progress, timings)`` gives the tokens of both runs."""
    timings = {}
    counts = draw(run, None, False, progress, timings)
    spec, ar = counts["spec"], counts["ar"]
    t0 = time.perf_counter()
    law = run.setup.target_warp
    sampling = Sampling(temperature=run.setup.temperature, top_k=law["top_k"], top_p=law["top_p"],
                        min_p=law["min_p"])
    tests, data, a_test = sampled_tests(jax.random.fold_in(jax.random.key(run.seed), 7), run.target, run.prompt,
                                        spec["samples"], ar["samples"], sampling, alpha=alpha, progress=progress)
    config = dict(config, hashed_cells=data["hashed_cells"], pit_bins=data["bins"], pit_orders=list(ORDERS))
    timings["tests_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the verifier's logits against one-token forwards over the first samples: the float gap
    # between the law the decoder samples and target-only decoding's (jaxspec/exactness/drift.py)
    config["drift"] = forward_drift(run.target, run.prompt, spec["samples"],
                                    getattr(run.setup.spec_cfg.tree, "depth", 1))
    timings["drift_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    timings = finish_timings(timings, run.num_samples)
    rounds = max(int(spec["rounds"]), 1)
    return SampledReport(
        config=config, tests=tuple(tests), alpha=alpha, alpha_per_test=a_test, num_samples=run.num_samples,
        spec_samples=spec["samples"], ar_samples=ar["samples"], spec_marginals=spec["marginals"],
        ar_marginals=ar["marginals"], pit_histograms=data["pit_histograms"], impossible=data["impossible"],
        acceptance_observed=spec["accepted"] / rounds, acceptance_rounds=int(spec["rounds"]),
        acceptance_note="acceptance per depth over every round of the speculative run (observed only: the "
                        "expectation is enumerated on the enumeration path only)",
        tokens_per_round=float(spec["tokens"] / rounds), timings=timings,
    )
