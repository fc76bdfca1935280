"""Exactness of a decoder written elsewhere: any sampler, tested against a jaxspec model
with the same weights.

A *sampler* is a plain callable ``sampler(prompt_ids: list[int], n: int, seed: int) ->
int[n, >= L]``: ``n`` independent continuations of the prompt, each at least ``L``
(``horizon``) tokens long, as the decoder under test emits them (Hugging Face's assisted
generation, vLLM, llama.cpp, your own). :func:`check_sampler` takes the target's
next-token law from ``target`` (a :class:`~jaxspec.nn.model.Transformer` holding the same
weights) and ``sampling`` (the warps the sampler was asked for), and runs the two tests
that need no enumeration, so any vocabulary size works:

* the conditional probability integral transform of the sampler's tokens
  (:mod:`jaxspec.exactness.pit`): by position and pooled, under the target's own law;
* the hashed two-sample χ² (:mod:`jaxspec.exactness.hashed`) of the sampler's sequences
  against ``n`` target-only samples drawn by :func:`jaxspec.generate_autoregressive`.

``alpha`` is split in two halves, one per family of tests (each Bonferroni within)::

    def hf_sampler(prompt_ids, n, seed):
        torch.manual_seed(seed)
        return np.stack([model.generate(torch.tensor([prompt_ids]), assistant_model=draft,
                                        do_sample=True, top_k=8, max_new_tokens=4, min_new_tokens=4,
                                        eos_token_id=None)[0, len(prompt_ids):].numpy()
                         for _ in range(n)])

    report = check_sampler(hf_sampler, target, [72, 105], num_samples=4096, horizon=4,
                           sampling=jaxspec.Sampling(top_k=8))
    print(report.summary())      # PASSED / REJECTED, each test, the smallest detectable deviations

``benchmarks/peer_exactness.py`` runs it on ``transformers``' assisted generation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxspec.checks import is_int
from jaxspec.core.settings import Sampling, check_sampling
from jaxspec.errors import SettingError
from jaxspec.exactness import stats
from jaxspec.exactness.hashed import HashedResult, hashed_tests
from jaxspec.exactness.pit import PitResult, pit_tests, pit_values
from jaxspec.nn.model import Transformer, check_transformer

__all__ = ["SamplerReport", "check_sampler", "sampler_tokens"]


@dataclasses.dataclass(frozen=True)
class SamplerReport:
    """The verdict on a sampler: the PIT tests, the hashed two-sample tests, what was run."""

    pit: PitResult
    hashed: HashedResult
    config: dict
    seconds: dict  # sampler, reference, tests

    @property
    def passed(self) -> bool:
        return self.pit.passed and self.hashed.passed

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "rejected"

    def summary(self) -> str:
        c = self.config
        head = (f"{self.verdict.upper()}: {c['sampler']} against the target's law ({c['sampling']}), "
                f"{c['num_samples']} samples of {c['horizon']} tokens after a {len(c['prompt'])}-token prompt; "
                f"alpha {c['alpha']:g} (half to each family)")
        return "\n".join([head, self.pit.summary(), self.hashed.summary()])

    def to_dict(self) -> dict:
        """JSON-ready: the verdict, every test's statistic and p-value, the configuration."""
        pit = [dict(name=t.name, statistic=t.statistic, dof=t.dof, n=t.n, pvalue=t.pvalue, threshold=t.threshold,
                    detectable=t.detectable, note=t.note) for t in self.pit.tests]
        hashed = [dict(length=k, statistic=r.statistic, dof=r.dof, pvalue=r.pvalue, detectable_tv=d)
                  for k, r, d in zip(self.hashed.lengths, self.hashed.tests, self.hashed.detectable, strict=True)]
        return dict(verdict=self.verdict, passed=self.passed, pit=pit, pit_impossible=self.pit.num_impossible,
                    hashed=hashed, hashed_cells=self.hashed.num_cells, config=self.config, seconds=self.seconds)


def sampler_tokens(sampler: Callable, prompt: Sequence[int], n: int, seed: int, horizon: int,
                   vocab_size: int) -> np.ndarray:
    """``int32[n, horizon]``: the sampler's first ``horizon`` tokens of ``n`` samples, its
    output checked (a :class:`~jaxspec.errors.SettingError` naming ``sampler`` otherwise)."""
    try:
        out = np.asarray(sampler(list(prompt), n, seed))
    except Exception as e:
        raise RuntimeError(f"sampler raised {type(e).__name__}: {e}") from e
    if out.ndim != 2 or out.shape[0] != n or out.shape[1] < horizon or not np.issubdtype(out.dtype, np.integer):
        raise SettingError({"sampler": getattr(sampler, "__name__", repr(sampler))},
                           f"expected int[{n}, >= {horizon}] (n samples of at least horizon tokens), got "
                           f"{out.dtype}{list(out.shape)}")
    out = out[:, :horizon]
    if out.min() < 0 or out.max() >= vocab_size:
        raise SettingError({"sampler": getattr(sampler, "__name__", repr(sampler))},
                           f"expected token ids in [0, {vocab_size}) (no padding: every sample {horizon} tokens "
                           f"long), got [{out.min()}, {out.max()}]")
    return out.astype(np.int32)


def _check(target, prompt, num_samples, horizon, seed, sampler):
    check_transformer("target", target)
    if not callable(sampler):
        raise SettingError({"sampler": sampler}, "expected a callable sampler(prompt_ids, n, seed) -> int[n, >= L]")
    v = target.config.vocab_size
    ids = list(prompt) if isinstance(prompt, (list, tuple, np.ndarray)) else None
    if not ids or not all(is_int(t) and 0 <= t < v for t in ids):
        raise SettingError({"prompt": prompt}, f"expected a non-empty sequence of token ids in [0, {v})")
    for name, value, least in (("num_samples", num_samples, 2), ("horizon", horizon, 1), ("seed", seed, 0)):
        if not is_int(value) or value < least:
            raise SettingError({name: value}, f"expected an integer >= {least}")
    return [int(t) for t in ids]


def check_sampler(sampler: Callable, target: Transformer, prompt: Sequence[int], *, num_samples: int,
                  horizon: int, sampling: Sampling | None = None, seed: int = 0, alpha: float = 1e-3,
                  num_cells: int = 64, name: str | None = None) -> SamplerReport:
    """Test that ``sampler`` samples the target's law (see the module docstring).

    Args:
      sampler: ``sampler(prompt_ids, n, seed) -> int[n, >= horizon]``.
      target: a jaxspec model with the sampler's target weights (its next-token law).
      prompt: the prompt's token ids.
      num_samples: ``n``, the sampler's samples (and the target-only reference's).
      horizon: ``L``, the tokens of each sample tested.
      sampling: the warps the sampler samples under (default ``Sampling()``).
      seed: passed to the sampler; the reference and the PIT's uniforms use ``seed + 1``.
      alpha: family-wise error rate, half to the PIT, half to the hashed test.
      num_cells: cells of the hashed two-sample test.
      name: the sampler's name in the report (default its ``__name__``).

    Returns:
      :class:`SamplerReport`.
    """
    ids = _check(target, prompt, num_samples, horizon, seed, sampler)
    law = check_sampling("sampling", sampling, Sampling())
    stats.check_alpha(alpha, "alpha")
    from jaxspec.decode.generate import generate_autoregressive  # noqa: PLC0415 (the decode path on demand)

    seconds = {}
    t0 = time.perf_counter()
    tokens = sampler_tokens(sampler, ids, num_samples, seed, horizon, target.config.vocab_size)
    seconds["sampler"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    key = jax.random.key(seed + 1)
    ref = generate_autoregressive(jax.random.fold_in(key, 0), target, np.tile(np.asarray([ids], np.int32),
                                  (num_samples, 1)), max_new_tokens=horizon, sampling=law, stop_tokens=(),
                                  prompt_bucket=None)
    ref_tokens = np.asarray(ref.tokens)
    seconds["reference"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pit = pit_tests(pit_values(jax.random.fold_in(key, 1), target, ids, tokens, law), alpha=alpha / 2)
    hashed = hashed_tests(tokens, ref_tokens, num_cells=num_cells, alpha=alpha / 2)
    seconds["tests"] = time.perf_counter() - t0
    config = dict(sampler=name or getattr(sampler, "__name__", type(sampler).__name__), sampling=str(law),
                  prompt=ids, horizon=int(horizon), num_samples=int(num_samples), seed=int(seed), alpha=float(alpha),
                  vocab_size=int(target.config.vocab_size))
    return SamplerReport(pit, hashed, config, {k: round(v, 3) for k, v in seconds.items()})
