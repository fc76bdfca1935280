"""The conditional probability integral transform (PIT): an exactness test that needs no
enumeration, so it runs at a real vocabulary size (docs/EVIDENCE.md ("Without enumeration") has the derivation).

Sampling from the target, each emitted token ``x_t`` is a draw from ``p(. | prefix_t)``
(``prefix_t`` = the prompt and ``x_1 .. x_{t-1}``), the *warped* law of
:func:`~jaxspec.core.sampling.warp_probs`. Order the vocabulary by descending ``p`` (ties:
lowest id first), let ``F(x-)`` be the mass strictly before ``x`` in that order, and draw
``U_t = F(x_t-) + W_t p(x_t)`` with ``W_t`` uniform on ``[0, 1)``. Under exactness the
``U_t`` are i.i.d. uniform on ``[0, 1)``, over positions and samples. One teacher-forced
target forward per sample gives every ``p(. | prefix_t)``::

    pit = pit_values(jax.random.key(1), target, prompt, tokens, Sampling(temperature=1.0))
    result = pit_tests(pit, alpha=1e-3)   # χ² by position and pooled, KS pooled; Bonferroni
    assert result.passed, result.summary()

Any order that is a fixed function of the prefix keeps the ``U_t`` uniform: ``order="id"``
(ascending token id, the order the library's samplers invert the CDF in) sees errors in the
uniforms behind a draw that the descending-``p`` order averages away; pass
``order=("p", "id")`` for both from the same forwards, and both to :func:`pit_tests`.

A token with ``p(x_t | prefix_t) == 0`` is impossible under the target law: it is counted
(``PitValues.impossible``), its ``U`` is NaN, and any such token is a certain rejection of
the tests that see it (p-value 0). At temperature 0 ``p`` is one-hot: the greedy token gets
``U = W`` (uniform), any other token is impossible, so the test is greedy equality.

Numerics: the order is that of the float32 warped probabilities (exact and reproducible);
``F`` and ``p(x)`` are sums in float64 of those probabilities renormalized in float64 (as
:mod:`jaxspec.exactness.exact_laws` does); ``W`` has 53 random bits from ``key``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import stats as scipy_stats

from jaxspec.checks import is_int
from jaxspec.core.sampling import warp_probs
from jaxspec.core.settings import Sampling
from jaxspec.errors import SettingError
from jaxspec.exactness import stats
from jaxspec.nn.model import Transformer, forward_features

__all__ = ["MAX_ROWS", "ORDERS", "PitValues", "PitTest", "PitResult", "pit_values", "pit_from_laws", "pit_tests"]

#: samples per teacher-forced forward (memory is flat in the sample count: one chunk's
#: ``[MAX_ROWS, L, V]`` laws at a time)
MAX_ROWS = 32
#: the orders of the vocabulary ``F`` may be taken in (any fixed function of the prefix is
#: valid): ``"p"``, descending probability, ties by lowest id (mass moving between likely and
#: unlikely tokens shows); ``"id"``, ascending token id, the order in which the library's
#: samplers invert the CDF (a bug in the uniforms behind a draw shows)
ORDERS = ("p", "id")


@dataclasses.dataclass(frozen=True)
class PitValues:
    """``u float64[S, L]`` (NaN where the token was impossible); ``impossible bool[S, L]``:
    the emitted token had probability 0 given its prefix; ``order``: the order ``F`` was
    taken in (:data:`ORDERS`)."""

    u: np.ndarray
    impossible: np.ndarray
    order: str = "p"

    @property
    def num_impossible(self) -> int:
        return int(self.impossible.sum())


# --------------------------------------------------------------------------- the transform


def pit_from_laws(probs, tokens, w, order: str = "p") -> tuple[np.ndarray, np.ndarray]:
    """The PIT of ``tokens`` int[...] under the laws ``probs`` float32[..., V], with the
    uniforms ``w`` float64[...]: ``(u float64[...], impossible bool[...])``.

    ``F(x-)`` sums ``p(y)`` over ``y`` before ``x``: for ``order="p"``, in the order of
    descending float32 ``p``, ties by lowest id (no sort: ``p(y) > p(x)``, or
    ``p(y) == p(x)`` and ``y < x``); for ``order="id"``, ``y < x``.

    Example: ``p = [.1, .4, .2, .3]`` orders the tokens 1, 3, 2, 0; token 2 has
    ``F(2-) = .7``, so its ``U`` lies in ``[.7, .9)``.
    """
    p32 = np.asarray(probs, np.float32)  # [..., V]
    x = np.asarray(tokens, np.int64)[..., None]  # [..., 1]
    p64 = p32.astype(np.float64)
    p64 /= p64.sum(axis=-1, keepdims=True)  # the law renormalized in float64
    px32 = np.take_along_axis(p32, x, axis=-1)  # [..., 1]
    ids = np.arange(p32.shape[-1])
    before = ids < x  # [..., V]
    if _check_order(order) == "p":
        before = (p32 > px32) | ((p32 == px32) & before)
    f_before = np.where(before, p64, 0.0).sum(axis=-1)  # [...]
    px = np.take_along_axis(p64, x, axis=-1)[..., 0]  # [...]
    impossible = px <= 0.0
    u = np.where(impossible, np.nan, np.minimum(f_before + np.asarray(w, np.float64) * px, 1.0))
    return u, impossible


def _check_order(order):
    if order not in ORDERS:
        raise SettingError({"order": order}, f"expected one of {', '.join(map(repr, ORDERS))}")
    return order


@functools.lru_cache(maxsize=16)
def _laws_fn(graphdef, prompt_len: int, warp: tuple):
    """jit(state, tokens int32[C, T + L - 1]) -> float32[C, L, V]: the warped law of each of
    the ``L`` emitted tokens given its prefix (teacher forcing; the unembedding only at the
    ``L`` positions that predict them). Compiled once per shape."""

    @jax.jit
    def f(state, tokens):
        model = nnx.merge(graphdef, state)
        feats = forward_features(model, tokens)[:, prompt_len - 1 :]  # [C, L, D]
        return warp_probs(model.unembed(feats), **dict(warp))

    return f


def _uniforms(key, shape) -> np.ndarray:
    """float64[shape] uniform on [0, 1): 53 bits of two uint32 draws from ``key``."""
    bits = np.asarray(jax.random.bits(key, (*shape, 2), jnp.uint32)).astype(np.uint64)
    word = (bits[..., 0] << np.uint64(32)) | bits[..., 1]
    return (word >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _check_inputs(target, prompt, samples, sampling, max_rows):
    if not isinstance(target, Transformer):
        raise SettingError({"target": type(target).__name__}, "expected a jaxspec Transformer")
    v = target.config.vocab_size
    p = np.asarray(prompt)
    if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= v:
        raise SettingError({"prompt": prompt}, f"expected a non-empty sequence of token ids in [0, {v})")
    s = np.asarray(samples)
    if s.ndim != 2 or 0 in s.shape or not np.issubdtype(s.dtype, np.integer):
        raise SettingError({"samples": f"{s.dtype}{list(s.shape)}"}, "expected int[S, L] with S, L >= 1")
    if s.min() < 0 or s.max() >= v:
        raise SettingError({"samples": f"values in [{s.min()}, {s.max()}]"},
                           f"expected token ids in [0, {v}) (every row L tokens: generate with stop_tokens=())")
    if sampling is not None and not isinstance(sampling, Sampling):
        raise SettingError({"sampling": sampling}, "expected a jaxspec.Sampling or None")
    if not is_int(max_rows) or max_rows < 1:
        raise SettingError({"max_rows": max_rows}, "expected an integer >= 1")
    return p.astype(np.int32), s.astype(np.int32), sampling or Sampling()


def pit_values(key, target: Transformer, prompt, samples, sampling: Sampling | None = None, *,
               order="p", max_rows: int = MAX_ROWS, progress: bool = False, desc: str = "PIT forwards"):
    """The PIT of ``samples`` int32[S, L] (L tokens emitted after ``prompt``) under the
    target's law warped by ``sampling`` (default ``Sampling()``): ``u float64[S, L]`` and
    the impossible tokens. ``key`` draws the ``W`` float64[S, L] (one ``W`` for every
    order). The forwards run in chunks of ``max_rows`` samples, zero-padded, so one
    program serves every chunk. ``order``: one of :data:`ORDERS` (a :class:`PitValues`), or
    a tuple of them (a tuple of :class:`PitValues`, from the same forwards). ``progress``:
    a progress bar (``desc``) over the samples on stderr."""
    prompt, samples, sampling = _check_inputs(target, prompt, samples, sampling, max_rows)
    orders = (order,) if isinstance(order, str) else tuple(order)
    if not orders:
        raise SettingError({"order": order}, f"expected one of {', '.join(map(repr, ORDERS))} or a tuple of them")
    for o in orders:
        _check_order(o)
    n, horizon = samples.shape
    t = prompt.size
    w = _uniforms(key, (n, horizon))  # [S, L]
    warp = (("temperature", sampling.temperature), ("top_k", sampling.top_k), ("top_p", sampling.top_p),
            ("min_p", sampling.min_p))
    graphdef, state = nnx.split(target)
    f = _laws_fn(graphdef, t, warp)
    seqs = np.zeros((n, t + horizon - 1), np.int32)  # [S, T + L - 1]: the last token predicts nothing
    seqs[:, :t] = prompt
    seqs[:, t:] = samples[:, :-1]
    rows = min(max_rows, n)
    u = np.empty((len(orders), n, horizon))
    impossible = np.empty((n, horizon), bool)
    from tqdm import tqdm  # noqa: PLC0415 (the text bar: no ipywidgets warning in notebooks)

    bar = tqdm(total=n, desc=desc, unit="samples", unit_scale=True, disable=not progress, file=sys.stderr,
               leave=False)
    for s in range(0, n, rows):
        chunk = seqs[s : s + rows]
        padded = np.concatenate([chunk, np.zeros((rows - chunk.shape[0], chunk.shape[1]), np.int32)])
        laws = np.asarray(f(state, jnp.asarray(padded)))[: chunk.shape[0]]  # [C, L, V]
        for i, o in enumerate(orders):
            u[i, s : s + rows], impossible[s : s + rows] = pit_from_laws(laws, samples[s : s + rows],
                                                                         w[s : s + rows], o)
        bar.update(chunk.shape[0])
    bar.close()
    out = tuple(PitValues(u[i], impossible, o) for i, o in enumerate(orders))
    return out[0] if isinstance(order, str) else out


# --------------------------------------------------------------------------- the tests


@dataclasses.dataclass(frozen=True)
class PitTest:
    """One test of uniformity. ``dof``: the χ² degrees of freedom (None for KS); ``n``: U
    values tested; ``threshold``: its Bonferroni level; ``detectable``: with power 0.9 at
    that level, the smallest deviation from uniform it detects -- for χ², the total
    variation between the binned law of U and uniform bins
    (:func:`~jaxspec.exactness.stats.min_detectable_tv`); for KS, the largest gap between
    U's CDF and the identity (the critical value plus the DKW radius of probability 0.1)."""

    name: str
    statistic: float
    dof: int | None
    n: int
    pvalue: float
    threshold: float
    detectable: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.pvalue > self.threshold

    def __str__(self) -> str:
        dof = "" if self.dof is None else f" dof={self.dof}"
        note = f" [{self.note}]" if self.note else ""
        return (f"{self.name}: stat={self.statistic:.4g}{dof} n={self.n} p={self.pvalue:.3g} "
                f"(threshold {self.threshold:.2g}; detects {self.detectable:.3g}){note}")


@dataclasses.dataclass(frozen=True)
class PitResult:
    """The tests of :func:`pit_tests`; ``passed`` when every p-value is above its threshold."""

    tests: tuple[PitTest, ...]
    num_impossible: int
    alpha: float

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tests)

    @property
    def min_pvalue(self) -> float:
        return min(t.pvalue for t in self.tests)

    def summary(self) -> str:
        head = f"PIT: {'passed' if self.passed else 'REJECTED'} (alpha {self.alpha:g}, Bonferroni over " \
               f"{len(self.tests)} tests; {self.num_impossible} impossible tokens)"
        return "\n".join([head] + [f"  {t}" for t in self.tests])


def _chi2_test(name, u, impossible, bins, threshold) -> PitTest:
    n = int(u.size)
    detect = stats.min_detectable_tv(n, bins, alpha=threshold)
    bad = int(impossible.sum())
    if bad:
        return PitTest(name, math.inf, bins - 1, n, 0.0, threshold, detect, f"{bad} impossible tokens")
    counts = np.bincount(np.minimum((u * bins).astype(np.int64), bins - 1), minlength=bins)  # [bins]
    r = stats.chisquare_gof(counts, np.full(bins, 1.0 / bins))
    return PitTest(name, r.statistic, r.dof, n, r.pvalue, threshold, detect, r.note)


def _ks_test(name, u, impossible, threshold) -> PitTest:
    n = int(u.size)
    detect = float(scipy_stats.kstwo.isf(threshold, n)) + math.sqrt(math.log(20.0) / (2 * n))
    bad = int(impossible.sum())
    if bad:
        return PitTest(name, math.inf, None, n, 0.0, threshold, detect, f"{bad} impossible tokens")
    r = scipy_stats.kstest(u, "uniform")
    return PitTest(name, float(r.statistic), None, n, float(r.pvalue), threshold, detect)


def pit_tests(pit, *, bins: int = 20, alpha: float = 1e-3, ks: bool = True) -> PitResult:
    """Uniformity of the PIT values ``pit`` (a :class:`PitValues`, or a sequence of them, e.g.
    the same samples in both :data:`ORDERS`): for each, χ² on ``bins`` equal bins at each
    position ``t`` (S values each) and pooled over every position (S * L values, i.i.d.
    under exactness), and a KS test of the pooled values (``ks``); family-wise ``alpha``
    split by Bonferroni over every test. Impossible tokens make every test that sees them
    fail (p = 0)."""
    pits = (pit,) if isinstance(pit, PitValues) else tuple(pit)
    if not pits or not all(isinstance(p, PitValues) for p in pits):
        raise SettingError({"pit": type(pit).__name__}, "expected the PitValues of pit_values, or a sequence of them")
    if not is_int(bins) or bins < 2:
        raise SettingError({"bins": bins}, "expected an integer >= 2")
    stats.check_alpha(alpha, "alpha")
    m = sum(np.shape(p.u)[1] + 1 + int(bool(ks)) for p in pits)
    threshold = stats.bonferroni(alpha, m)
    tests = []
    for p in pits:
        u, bad = np.asarray(p.u, np.float64), np.asarray(p.impossible, bool)  # [S, L]
        tag = "" if len(pits) == 1 else f"[{p.order}] "
        tests += [_chi2_test(f"{tag}position {t + 1} chi2", u[:, t], bad[:, t], bins, threshold)
                  for t in range(u.shape[1])]
        tests.append(_chi2_test(f"{tag}pooled chi2", u.ravel(), bad.ravel(), bins, threshold))
        if ks:
            tests.append(_ks_test(f"{tag}pooled KS", u.ravel(), bad.ravel(), threshold))
    return PitResult(tuple(tests), max(int(p.impossible.sum()) for p in pits), float(alpha))
