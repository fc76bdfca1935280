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

``alpha`` is split in two halves, one per family of tests (each Bonferroni within).

Sampling cannot see a rule that fails only at the end of a uniform's range (a coin of
exactly 0 accepting a token of target probability 0 when the test reads ``u <= p / q``,
SGLang #35771: about 2^-23 per test). So :func:`check_sampler` also runs the **directed
check** (:func:`directed_uniforms`, ``directed=True``): it calls the sampler twice more,
``DIRECTED_SAMPLES`` samples each, with every uniform forced to an extreme of its range,
``minval`` (0) and then the largest float32 below ``maxval`` (1 - 2^-24), and fails if any
emitted token has probability 0 under the target's warped law given its prefix
(teacher-forced, as the PIT reads it). Interception: while the sampler runs,
``jax.random.uniform`` (the public name) and ``jax._src.random.uniform`` (the one JAX's own
``gumbel``, ``categorical``, ``bernoulli`` ... call) are replaced by a function returning
the forced value in the shape and dtype asked for, and JAX's trace caches are cleared
before and after (``jax.clear_caches``), so that a sampler jitted earlier is traced again
with the forced uniforms and nothing traced under them survives. Uniforms drawn any other
way (``jax.random.bits``, numpy, torch) are not intercepted: the report then says the
check saw no uniform (``intercepted`` False) and gives no directed verdict.

For example, Hugging Face's assisted generation (its uniforms come from torch, so the
directed check reports that it saw none)::

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

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checks import is_int
from jaxspec.core.settings import Sampling, check_sampling
from jaxspec.errors import SettingError
from jaxspec.exactness import stats
from jaxspec.exactness.hashed import HashedResult, hashed_tests
from jaxspec.exactness.pit import PitResult, pit_tests, pit_values
from jaxspec.nn.model import Transformer, check_transformer

__all__ = ["SamplerReport", "DirectedResult", "check_sampler", "sampler_tokens", "directed_uniforms",
           "forced_uniforms", "EXTREMES", "DIRECTED_SAMPLES"]

#: the forced uniforms of the directed check, as fractions of ``[minval, maxval)``: its
#: start, and the largest float32 below its end
EXTREMES = {"0": 0.0, "1 - 2^-24": float(np.nextafter(np.float32(1.0), np.float32(0.0)))}
#: samples per extreme in the directed check
DIRECTED_SAMPLES = 8


@contextlib.contextmanager
def forced_uniforms(value: float):
    """Every ``jax.random.uniform`` drawn inside (through the public name or JAX's own
    samplers) returns ``minval + value * (maxval - minval)``, clipped below ``maxval``, in the
    shape and dtype asked for; yields a one-element list counting the calls. JAX's trace
    caches are cleared on entry and exit (see the module docstring)."""
    from jax._src import random as jax_random  # noqa: PLC0415 (the name JAX's own samplers call)

    calls = [0]
    original = jax_random.uniform

    def forced(key, shape=(), dtype=float, minval=0.0, maxval=1.0, **kwargs):
        calls[0] += 1
        dt = jnp.dtype(jax.dtypes.canonicalize_dtype(dtype))
        lo, hi = jnp.asarray(minval, dt), jnp.asarray(maxval, dt)
        u = jnp.clip(lo + jnp.asarray(value, dt) * (hi - lo), lo, jnp.nextafter(hi, lo))
        return jnp.broadcast_to(u, tuple(shape) if not isinstance(shape, int) else (shape,)).astype(dt)

    jax.clear_caches()
    jax_random.uniform = forced
    jax.random.uniform = forced
    try:
        yield calls
    finally:
        jax_random.uniform = original
        jax.random.uniform = original
        jax.clear_caches()


@dataclasses.dataclass(frozen=True)
class DirectedResult:
    """The directed check: per forced extreme (:data:`EXTREMES`), the uniforms the sampler
    drew through ``jax.random`` (calls while tracing or running) and the emitted tokens of
    target probability 0 among ``num_samples`` samples of ``horizon`` tokens."""

    calls: dict  # extreme -> calls of jax.random.uniform
    impossible: dict  # extreme -> tokens of target probability 0
    first_impossible: dict  # extreme -> (sample, position, token) of the first one, or None
    num_samples: int
    horizon: int

    @property
    def intercepted(self) -> bool:
        return all(c > 0 for c in self.calls.values())

    @property
    def passed(self) -> bool:
        """No impossible token (a sampler whose uniforms were not intercepted passes: no verdict)."""
        return not any(self.impossible.values())

    def summary(self) -> str:
        if not self.intercepted and self.passed:
            return ("directed check: the sampler drew no uniform through jax.random.uniform (not intercepted): "
                    "no directed verdict")
        parts = [f"u = {k}: {self.impossible[k]} token(s) of target probability 0"
                 + (f" (first: sample {f[0]}, position {f[1] + 1}, token {f[2]})" if (f := self.first_impossible[k])
                    else "") + f" [{self.calls[k]} uniform calls]" for k in self.calls]
        head = "directed check PASSED" if self.passed else "directed check REJECTED"
        return f"{head} ({self.num_samples} samples of {self.horizon} tokens per extreme): " + "; ".join(parts)

    def to_dict(self) -> dict:
        return dict(passed=self.passed, intercepted=self.intercepted, calls=self.calls, impossible=self.impossible,
                    first_impossible={k: (None if v is None else list(v)) for k, v in self.first_impossible.items()},
                    num_samples=self.num_samples, horizon=self.horizon)


def directed_uniforms(sampler: Callable, target: Transformer, prompt: Sequence[int], *, horizon: int,
                      sampling: Sampling | None = None, seed: int = 0, num_samples: int = DIRECTED_SAMPLES,
                      name: str | None = None) -> DirectedResult:
    """The directed check of ``sampler`` (see the module docstring): its tokens under each
    forced extreme of the uniforms, and how many have target probability 0."""
    ids = _check(target, prompt, max(num_samples, 2), horizon, seed, sampler)
    law = check_sampling("sampling", sampling, Sampling())
    calls, impossible, first = {}, {}, {}
    for label, value in EXTREMES.items():
        with forced_uniforms(value) as count:
            tokens = sampler_tokens(sampler, ids, num_samples, seed, horizon, target.config.vocab_size, name=name)
        calls[label] = count[0]
        bad = pit_values(jax.random.key(seed), target, ids, tokens, law).impossible
        impossible[label] = int(bad.sum())
        hit = np.argwhere(bad)
        first[label] = None if hit.size == 0 else (int(hit[0, 0]), int(hit[0, 1]), int(tokens[hit[0, 0], hit[0, 1]]))
    return DirectedResult(calls, impossible, first, int(num_samples), int(horizon))


@dataclasses.dataclass(frozen=True)
class SamplerReport:
    """The verdict on a sampler: the PIT tests, the hashed two-sample tests, what was run."""

    pit: PitResult
    hashed: HashedResult
    config: dict
    seconds: dict  # sampler, reference, tests
    directed: DirectedResult | None = None  # the directed check (None: not run)

    @property
    def passed(self) -> bool:
        return self.pit.passed and self.hashed.passed and (self.directed is None or self.directed.passed)

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "rejected"

    def summary(self) -> str:
        c = self.config
        head = (f"{self.verdict.upper()}: {c['sampler']} against the target's law ({c['sampling']}), "
                f"{c['num_samples']} samples of {c['horizon']} tokens after a {len(c['prompt'])}-token prompt; "
                f"alpha {c['alpha']:g} (half to each family)")
        return "\n".join([head, self.pit.summary(), self.hashed.summary()]
                         + ([] if self.directed is None else [self.directed.summary()]))

    def to_dict(self) -> dict:
        """JSON-ready: the verdict, every test's statistic and p-value, the configuration."""
        pit = [dict(name=t.name, statistic=t.statistic, dof=t.dof, n=t.n, pvalue=t.pvalue, threshold=t.threshold,
                    detectable=t.detectable, note=t.note) for t in self.pit.tests]
        hashed = [dict(length=k, statistic=r.statistic, dof=r.dof, pvalue=r.pvalue, detectable_tv=d)
                  for k, r, d in zip(self.hashed.lengths, self.hashed.tests, self.hashed.detectable, strict=True)]
        return dict(verdict=self.verdict, passed=self.passed, pit=pit, pit_impossible=self.pit.num_impossible,
                    hashed=hashed, hashed_cells=self.hashed.num_cells, config=self.config, seconds=self.seconds,
                    directed=None if self.directed is None else self.directed.to_dict())


def _ragged(raw) -> str:
    """What a sampler returned that is not one array: its rows' lengths, where it has rows."""
    try:
        lengths = sorted({len(r) for r in raw})
        return (f"{type(raw).__name__} of {len(raw)} rows of lengths "
                f"{lengths[0] if len(lengths) == 1 else f'{lengths[0]} to {lengths[-1]}'}")
    except TypeError:
        return type(raw).__name__


def sampler_tokens(sampler: Callable, prompt: Sequence[int], n: int, seed: int, horizon: int,
                   vocab_size: int, *, name: str | None = None) -> np.ndarray:
    """``int32[n, horizon]``: the sampler's first ``horizon`` tokens of ``n`` samples, its
    output checked (a :class:`~jaxspec.errors.SettingError` naming ``sampler`` otherwise).
    An exception raised inside the sampler is a ``RuntimeError`` saying so; an output that is
    not one integer array (ragged rows) is the sampler's output of the wrong shape."""
    label = {"sampler": name or getattr(sampler, "__name__", repr(sampler))}
    expected = f"expected int[{n}, >= {horizon}] (n samples of at least horizon tokens, every row as long)"
    try:
        raw = sampler(list(prompt), n, seed)
    except Exception as e:
        raise RuntimeError(f"sampler raised {type(e).__name__}: {e}") from e
    try:
        out = np.asarray(raw)
    except (ValueError, TypeError):  # numpy cannot make one array of it: ragged rows
        raise SettingError(label, f"returned output of the wrong shape: {expected}, got a {_ragged(raw)}") from None
    if out.dtype == object:  # an older numpy's array of ragged rows
        raise SettingError(label, f"returned output of the wrong shape: {expected}, got a {_ragged(raw)}")
    if out.ndim != 2 or out.shape[0] != n or out.shape[1] < horizon or not np.issubdtype(out.dtype, np.integer):
        raise SettingError(label, f"{expected}, got {out.dtype}{list(out.shape)}")
    out = out[:, :horizon]
    if out.min() < 0 or out.max() >= vocab_size:
        raise SettingError(label,
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
                  num_cells: int = 64, name: str | None = None, directed: bool = True) -> SamplerReport:
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
      directed: also run the directed check (:func:`directed_uniforms`): the uniforms the
        sampler draws through ``jax.random`` forced to 0 and to 1 - 2^-24; any token of
        target probability 0 rejects the sampler.

    Returns:
      :class:`SamplerReport`.
    """
    ids = _check(target, prompt, num_samples, horizon, seed, sampler)
    law = check_sampling("sampling", sampling, Sampling())
    stats.check_alpha(alpha, "alpha")
    from jaxspec.decode.generate import generate_autoregressive  # noqa: PLC0415 (the decode path on demand)

    seconds = {}
    t0 = time.perf_counter()
    tokens = sampler_tokens(sampler, ids, num_samples, seed, horizon, target.config.vocab_size, name=name)
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
    found = None
    if directed:
        t0 = time.perf_counter()
        found = directed_uniforms(sampler, target, ids, horizon=horizon, sampling=law, seed=seed, name=name)
        seconds["directed"] = time.perf_counter() - t0
    config = dict(sampler=name or getattr(sampler, "__name__", type(sampler).__name__), sampling=str(law),
                  prompt=ids, horizon=int(horizon), num_samples=int(num_samples), seed=int(seed), alpha=float(alpha),
                  vocab_size=int(target.config.vocab_size))
    return SamplerReport(pit, hashed, config, {k: round(v, 3) for k, v in seconds.items()}, found)
