"""Exactness verification as a product: does *this* decoder configuration reproduce the
target's law? (DESIGN.md §4.)

:func:`verify` runs the real decoder (:func:`jaxspec.generate`) on ``S`` copies of one
prompt (a batch of identical prompts is a batch of independent samples), keeps the first
``L`` emitted tokens, and tests them against the **exact** law, enumerated from the
target's own :func:`~jaxspec.model.forward_logits` and :func:`~jaxspec.sampling.warp_probs`
over the prefix tree of depth ``L`` of the target's support::

    report = verify(tree="branch:2,2", scheme="iid", num_samples=10**6)
    report.passed                 # every test above its Bonferroni threshold
    print(report.summary())       # the tests, TV bound, smallest detectable TV, acceptance
    report.save_plots("plots/")   # marginals.png, joint.png, acceptance.png
    report.to_json()

Tests (all fixed before any sample is drawn; family-wise ``alpha`` split by Bonferroni):

* χ² goodness of fit of the joint law of the ``L`` tokens, and of each position's
  marginal, against the exact law;
* two-sample χ² of the speculative counts against target-only sampling
  (:func:`~jaxspec.generate_autoregressive`, same sample count), and the target-only
  counts against the exact law (a control on the enumeration itself);
* acceptance per depth of the *first* round (a separate one-round run): exact binomial
  tests of the number of rows with an accepted node at depth ``d`` against its exact
  expectation, enumerated over every draft draw of the tree from the models' rows
  (static trees; skipped, with a note, for dynamic trees or when too many draws).

Plus the total-variation distance to the exact law with a ``1 - alpha`` upper confidence
bound and the smallest TV the joint test could have detected
(:func:`~jaxspec.stats.min_detectable_tv`, power 0.9).

Cells: token sequences of positive exact probability (``V**L`` of them at most, only
``top_k**L`` under a top-k), plus one "outside the support" cell whose observations are a
certain rejection. More than :data:`MAX_CELLS` cells is refused: pass a ``top_k``.

Sampling, streaming and sharding. Samples come in *blocks* of ``chunk_size`` rows; block
``g`` of run ``r`` (speculative, target-only, first round) uses the key
``fold_in(fold_in(key(seed), r), g)``. Each step runs one block per device under
``shard_map`` over a 1-D mesh ``("chains",)`` of all visible devices; every block is reduced
on its device to integer counts (joint cells, per-position tokens, accepted nodes per
depth) and ``psum``-ed, so host memory is flat in ``S`` and a block's computation has the
same shapes on any number of devices: the counts are a function of ``(seed, chunk_size)``
only, identical on 1 and on 8 devices (idle devices of the last step get empty blocks).
Rows past ``S`` in the last block are masked out.

Multi-host (e.g. a TPU pod slice or several GPU hosts): start every process with::

    import jax
    jax.distributed.initialize()      # coordinator/process ids from the environment
    from jaxspec.exactness import verify
    report = verify(target, draft, num_samples=10**9, chunk_size=1 << 16)
    if jax.process_index() == 0:
        print(report.summary())

Every process must call :func:`verify` with the same arguments and the same model weights.
The mesh then spans ``jax.devices()`` (all hosts); block indices and replicated inputs
are built with ``jax.make_array_from_callback``; the ``psum``-ed counts are fully
replicated, so every process reads the same report.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from scipy import stats as _scipy_stats

from jaxspec import mutants as _mutants
from jaxspec import stats
from jaxspec.config import ModelConfig
from jaxspec.model import Transformer, forward_logits, init_model
from jaxspec.sampling import warp_probs
from jaxspec.treespec import DynamicTree, StaticTree

# the module, not the function that jaxspec/__init__ may re-export under the same name
_gen = importlib.import_module("jaxspec.generate")

__all__ = [
    "MAX_CELLS",
    "DEFAULT_TREE",
    "DEFAULT_SCHEME",
    "DEFAULT_PROMPT",
    "TestResult",
    "VerifyReport",
    "verify",
    "default_pair",
    "exact_law",
    "expected_acceptance",
]

#: most joint cells (token sequences of positive probability) a run may have
MAX_CELLS = 1 << 20
#: most draft draws enumerated for the exact acceptance expectation
MAX_ACCEPT_TERMS = 2_000_000
#: the default configuration: two siblings per node and two levels, so that every mutant
#: of :mod:`jaxspec.mutants` has something to break
DEFAULT_TREE = "branch:2,2"
DEFAULT_SCHEME = "iid"
DEFAULT_PROMPT = (1, 2, 3)
_AXIS = "chains"


# --------------------------------------------------------------------------- default pair


def default_pair(seed: int = 0, *, vocab_size: int = 4, hidden_size: int = 16, head_scale: float = 4.0,
                 mix: float = 0.5) -> tuple[Transformer, Transformer]:
    """Tiny random ``(target, draft)`` with a small vocabulary (exact laws enumerable).

    One layer, two heads. The LM heads are scaled by ``head_scale`` so that next-token laws
    are sharp and depend on the context; the draft's parameters are
    ``(1 - mix) * target + mix * other`` for an independent ``other``, so acceptance is
    neither ~0 nor ~1.
    """
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, rope_theta=10.0,
                      max_position_embeddings=64)

    def make(key):
        m = init_model(cfg, key)
        m.lm_head.kernel[...] = m.lm_head.kernel[...] * head_scale
        return m

    target = make(jax.random.key(seed))
    other = make(jax.random.key(seed + 1000))
    gdef, t_state = nnx.split(target)
    _, o_state = nnx.split(other)
    draft = nnx.merge(gdef, jax.tree.map(lambda a, b: (1.0 - mix) * a + mix * b, t_state, o_state))
    return target, draft


# --------------------------------------------------------------------------- exact laws


@functools.lru_cache(maxsize=16)
def _logits_at_fn(graphdef):
    @jax.jit
    def f(state, tokens, pos):  # tokens int32[n, T], pos int32[] -> float32[n, V]
        return forward_logits(nnx.merge(graphdef, state), tokens)[:, pos]

    return f


def _next_laws(model: Transformer, prompt: Sequence[int], paths: np.ndarray, warp: dict, *, width: int,
               batch: int, raw: bool = False) -> np.ndarray:
    """float64[n, V]: warped next-token law after ``prompt + paths[i]`` (``paths`` int[n, d]),
    renormalized in float64 (``raw``: the float32 rows of :func:`warp_probs`).

    Every call has the shape ``[batch, len(prompt) + width]`` (paths right-padded; the
    causal forward never looks right), so one compilation serves every level."""
    gdef, state = nnx.split(model)
    f = _logits_at_fn(gdef)
    n, d = paths.shape
    t = len(prompt)
    seqs = np.zeros((n, t + width), np.int32)
    seqs[:, :t] = prompt
    seqs[:, t : t + d] = paths
    out = []
    for s in range(0, n, batch):
        rows = seqs[s : s + batch]
        padded = np.concatenate([rows, np.zeros((batch - rows.shape[0], t + width), np.int32)])
        logits = f(state, jnp.asarray(padded), jnp.int32(t - 1 + d))[: rows.shape[0]]
        out.append(np.asarray(warp_probs(logits, **warp)))
    probs = np.concatenate(out, axis=0)
    if raw:
        return probs
    probs = probs.astype(np.float64)
    return probs / probs.sum(axis=1, keepdims=True)


def _batch_for(v: int, top_k: int | None, levels: int) -> int:
    """Rows per enumeration forward: enough for the widest level, at most 2048."""
    k = v if top_k is None else min(v, top_k)
    widest = k ** max(levels - 1, 0)
    return int(min(2048, 1 << max(3, math.ceil(math.log2(max(widest, 1))))))


@dataclasses.dataclass(frozen=True, eq=False)
class ExactLaw:
    """The exact law of the first ``L`` tokens, as a prefix tree over the support.

    ``cells int32[C, L]`` (lexicographic), ``probs float64[C]``, ``marginals float64[L, V]``;
    ``levels[l] = (parent int32[n_l], token int32[n_l])``: nodes of depth ``l + 1`` sorted
    by (parent, token); the leaves (depth ``L``) are the cells.
    """

    cells: np.ndarray
    probs: np.ndarray
    marginals: np.ndarray
    levels: tuple[tuple[np.ndarray, np.ndarray], ...]


def exact_law(target: Transformer, prompt: Sequence[int], horizon: int, *, temperature: float = 1.0,
              top_k: int | None = None, top_p: float | None = None, max_cells: int = MAX_CELLS) -> ExactLaw:
    """Enumerate the law of the first ``horizon`` tokens sampled after ``prompt`` from the
    warped target: one batched :func:`forward_logits` per level over the live prefixes."""
    v = target.config.vocab_size
    warp = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    prefixes = np.zeros((1, 0), np.int32)
    probs = np.ones(1)
    levels = []
    batch = _batch_for(v, top_k, horizon)
    for lvl in range(horizon):
        laws = _next_laws(target, prompt, prefixes, warp, width=horizon - 1, batch=batch)  # [n, V]
        par, tok = np.nonzero(laws > 0)  # row-major: sorted by (parent, token)
        if par.size > max_cells:
            raise ValueError(
                f"horizon = {horizon}: {par.size} token sequences of positive probability at position "
                f"{lvl + 1}, more than {max_cells} countable cells; pass a smaller top_k (or horizon)"
            )
        probs = probs[par] * laws[par, tok]
        prefixes = np.concatenate([prefixes[par], tok[:, None].astype(np.int32)], axis=1)
        levels.append((par.astype(np.int32), tok.astype(np.int32)))
    probs = probs / probs.sum()
    marg = np.zeros((horizon, v))
    for i in range(horizon):
        marg[i] = np.bincount(prefixes[:, i], weights=probs, minlength=v)
    return ExactLaw(prefixes, probs, marg, tuple(levels))


# --------------------------------------------------------------------------- exact acceptance


def _draws(q: np.ndarray, q32: np.ndarray, m: int, scheme: str):
    """Every ordered sibling tuple the draft can draw from row ``q`` with its probability,
    as :func:`jaxspec.sampling.draw` draws them."""
    v = q.shape[0]
    if scheme == "deterministic":  # top-m of the float32 row, ties -> lower index
        order = np.lexsort((np.arange(v), -q32))[:m]
        yield tuple(int(x) for x in order), 1.0
        return
    support = [int(x) for x in np.flatnonzero(q > 0)]
    if scheme == "iid":
        def rec(prefix, pr):
            if len(prefix) == m:
                yield tuple(prefix), pr
                return
            for x in support:
                yield from rec(prefix + [x], pr * q[x])
        yield from rec([], 1.0)
        return
    fill = [int(x) for x in np.flatnonzero(q <= 0)]  # exhausted support: zeros by index
    take = min(m, len(support))

    def rec_wor(prefix, pr, left):
        if len(prefix) == take:
            yield tuple(prefix) + tuple(fill[: m - take]), pr
            return
        for x in support:
            if x not in prefix:
                yield from rec_wor(prefix + [x], pr * q[x] / left, left - q[x])
    yield from rec_wor([], 1.0, 1.0)


def _q_k(q, xs, k, scheme):
    v = q.shape[0]
    if scheme == "iid":
        return q
    onehot = np.eye(v)[xs[k]]
    if scheme == "deterministic" or k == 0 and q.sum() <= 0:
        return onehot
    rem = q.copy()
    rem[list(xs[:k])] = 0.0
    s = rem.sum()
    return rem / s if s > 0 else onehot


def _tried(p, q, xs, scheme):
    """P(sibling k accepted | tried), k = 0..m-1, as DESIGN.md §2 reads (float64)."""
    out = []
    for k, x in enumerate(xs):
        qk = _q_k(q, xs, k, scheme)
        out.append(min(1.0, p[x] / qk[x]) if qk[x] > 0 else float(p[x] > 0))
        res = np.maximum(p - qk, 0.0)
        s = res.sum()
        p = res / s if s > 0 else p
    return out


def _num_draws(s: int, m: int, scheme: str) -> int:
    if scheme == "deterministic":
        return 1
    if scheme == "iid":
        return s**m
    return math.perm(s, min(s, m))


def expected_acceptance(target: Transformer, draft: Transformer, prompt: Sequence[int], tree: StaticTree,
                        scheme: str, target_warp: dict, draft_warp: dict,
                        max_terms: int = MAX_ACCEPT_TERMS) -> np.ndarray:
    """float64[D]: for the first round after ``prompt``, ``E[accepted nodes at depth d]``
    (= P(the accepted path reaches depth d)), enumerated over every draft draw of the tree.

    Independent of the library's acceptance code: the rule is re-read from DESIGN.md §2 in
    float64 numpy; the rows are the models' own warped next-token laws after the prompt
    plus each drafted path. Raises ``ValueError`` when more than ``max_terms`` draws
    would be enumerated.
    """
    par = np.asarray(tree.parents, np.int64)
    n, depth_max = par.shape[0], tree.depth
    kids = [[] for _ in range(n + 1)]
    for j, p in enumerate(par.tolist()):
        kids[p + 1].append(j)
    node_depth = np.asarray(tree.depths)
    row_level = np.concatenate([[0], node_depth])
    # level by level: the paths a row of that level can be reached by, and their laws
    laws: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    level_paths = [()]
    terms = 0
    v = target.config.vocab_size
    if scheme == "deterministic":  # candidates per path: the top siblings only
        batch = _batch_for(v, max(len(k) for k in kids), depth_max)
    else:
        batch = _batch_for(v, draft_warp.get("top_k"), depth_max)
    for lvl in range(depth_max):
        rows = [r for r in range(n + 1) if row_level[r] == lvl and kids[r]]
        arr = np.asarray(level_paths, np.int32).reshape(len(level_paths), lvl)
        kw = dict(width=max(depth_max - 1, 0), batch=batch)
        p_rows = _next_laws(target, prompt, arr, target_warp, **kw)
        q32 = _next_laws(draft, prompt, arr, draft_warp, raw=True, **kw)  # raw: ranking (deterministic)
        q_rows = q32.astype(np.float64) / q32.astype(np.float64).sum(axis=1, keepdims=True)
        nxt = set()
        for i, path in enumerate(level_paths):
            laws[path] = (p_rows[i], q_rows[i], q32[i])
            s = int(np.count_nonzero(q_rows[i] > 0))
            for r in rows:
                terms += _num_draws(s, len(kids[r]), scheme)
            if terms > max_terms:
                raise ValueError(f"more than {max_terms} draft draws to enumerate")
            if lvl + 1 < depth_max:
                m = max(len(kids[r]) for r in rows) if rows else 0
                for xs, _ in _draws(q_rows[i], q32[i], m, scheme):
                    nxt.update(path + (x,) for x in xs)
        level_paths = sorted(nxt)
        if not level_paths:
            break

    @functools.lru_cache(maxsize=None)
    def e_row(row: int, path: tuple) -> np.ndarray:
        out = np.zeros(depth_max)
        ch = kids[row]
        if not ch:
            return out
        p, q, q32_row = laws[path]
        for xs, pr in _draws(q, q32_row, len(ch), scheme):
            a = _tried(p, q, xs, scheme)
            reach = 1.0
            for k, node in enumerate(ch):
                w = pr * reach * a[k]
                if w > 0:
                    out[node_depth[node] - 1] += w
                    out += w * e_row(node + 1, path + (xs[k],))
                reach *= 1.0 - a[k]
        return out

    return e_row(0, ())


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class _Setup:
    """The compiled configurations of one verification and its validated warps."""

    spec_cfg: _gen.SpecConfig
    first_cfg: _gen.SpecConfig  # the same, with a budget of one token: one round
    ar_cfg: _gen.ARConfig
    temperature: float
    draft_temperature: float
    target_warp: dict
    draft_warp: dict


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _setup(target, draft, prompt, horizon, tree, scheme, temperature, top_k, top_p,
           draft_temperature, draft_top_k, draft_top_p) -> _Setup:
    """What :func:`jaxspec.generate` (``max_new_tokens = horizon``, and ``1`` for the
    first-round run) and :func:`jaxspec.generate_autoregressive` compile for copies of
    ``prompt``: built, and validated, by their own :func:`jaxspec.generate.build_config`
    and :func:`~jaxspec.generate.build_ar_config`."""
    settings = dict(tree=tree, scheme=scheme, temperature=temperature, top_k=top_k, top_p=top_p,
                    draft_temperature=draft_temperature, draft_top_k=draft_top_k, draft_top_p=draft_top_p)
    t = len(prompt)
    spec_cfg, t_temp, d_temp = _gen.build_config(target, draft, prompt_length=t, max_new_tokens=horizon, **settings)
    first_cfg, _, _ = _gen.build_config(target, draft, prompt_length=t, max_new_tokens=1, **settings)
    ar_cfg, _ = _gen.build_ar_config(target, prompt_length=t, max_new_tokens=horizon, temperature=temperature,
                                     top_k=top_k, top_p=top_p)
    t_warp, d_warp = spec_cfg.target_warp, spec_cfg.draft_warp
    return _Setup(spec_cfg, first_cfg, ar_cfg, t_temp, d_temp,
                  dict(temperature=t_temp, top_k=t_warp.top_k, top_p=t_warp.top_p),
                  dict(temperature=d_temp, top_k=d_warp.top_k, top_p=d_warp.top_p))


# --------------------------------------------------------------------------- streamed counts


def _lookup(y, levels, num_cells: int):
    """int32[B]: cell of each row of ``y int32[B, L]`` (``num_cells`` when outside the
    support), by a vectorized lower-bound search of (parent, token) at each level."""
    b = y.shape[0]
    node = jnp.zeros((b,), jnp.int32)
    ok = jnp.ones((b,), jnp.bool_)
    for lvl, (par, tok) in enumerate(levels):
        n = par.shape[0]
        t = y[:, lvl]
        lo = jnp.zeros((b,), jnp.int32)
        hi = jnp.full((b,), n, jnp.int32)
        for _ in range(max(1, math.ceil(math.log2(n + 1)))):
            mid = (lo + hi) // 2
            i = jnp.clip(mid, 0, n - 1)
            less = (par[i] < node) | ((par[i] == node) & (tok[i] < t))
            live = lo < hi
            lo = jnp.where(live & less, mid + 1, lo)
            hi = jnp.where(live & ~less, mid, hi)
        i = jnp.clip(lo, 0, n - 1)
        found = (lo < n) & (par[i] == node) & (tok[i] == t)
        ok = ok & found
        node = jnp.where(found, i, 0)
    return jnp.where(ok, node, num_cells)


@functools.lru_cache(maxsize=32)
def _step_fn(kind: str, cfg, impl, devices: tuple, chunk: int, prompt: tuple, horizon: int, vocab: int):
    """jit(shard_map): one block of ``chunk`` rows per device -> psum-ed integer counts."""
    mesh = Mesh(np.asarray(devices, dtype=object), (_AXIS,))
    t = len(prompt)

    def local(states, key_data, block, n_valid, temps, levels):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), block[0])
        tokens = jnp.broadcast_to(jnp.asarray(prompt, jnp.int32), (chunk, t))
        lens = jnp.full((chunk,), t, jnp.int32)
        stop = jnp.zeros((0,), jnp.int32)
        if kind == "ar":
            res = impl(cfg, states[0], key, tokens, lens, temps[0], stop)
        else:
            res = impl(cfg, states[0], states[1], key, tokens, lens, temps[0], temps[1], stop)
        valid = (jnp.arange(chunk, dtype=jnp.int32) < n_valid[0]).astype(jnp.int32)  # [chunk]
        out = {}
        if kind != "first":
            y = res.tokens[:, :horizon]  # [chunk, L]
            num_cells = levels[-1][0].shape[0]
            cell = _lookup(y, levels, num_cells)
            out["joint"] = jnp.zeros((num_cells + 1,), jnp.int32).at[cell].add(valid)
            pos = jnp.broadcast_to(jnp.arange(horizon, dtype=jnp.int32), y.shape)
            out["marginals"] = jnp.zeros((horizon, vocab), jnp.int32).at[pos, jnp.clip(y, 0, vocab - 1)].add(
                valid[:, None])
        if kind != "ar":
            out["accepted"] = jnp.sum(res.accepted_per_depth * valid[:, None], axis=0)
            out["rounds"] = jnp.sum(res.rounds * valid)
            out["tokens"] = jnp.sum(res.lengths * valid)
        return jax.tree.map(lambda x: jax.lax.psum(x, _AXIS), out)

    f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(_AXIS), P(_AXIS), P(), P()), out_specs=P(),
                      check_vma=False)
    return jax.jit(f), mesh


def _global(arr: np.ndarray, sharding) -> jax.Array:
    """A global array from identical host values on every process (multi-host safe)."""
    if jax.process_count() == 1:
        return jax.device_put(arr, sharding)
    return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def _replicate(tree, sharding):
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda a: _global(np.asarray(a), sharding), tree)


def _stream(kind: str, cfg, impl, states, temps, key, prompt, horizon, vocab, levels, num_samples: int,
            chunk: int, devices, progress: bool, desc: str) -> tuple[dict, dict]:
    """Sum the counts of ``ceil(S / chunk)`` blocks, ``len(devices)`` blocks per step.
    Returns (int64 counts by name, {"compile_s", "total_s"})."""
    fn, mesh = _step_fn(kind, cfg, impl, tuple(devices), chunk, tuple(prompt), horizon, vocab)
    n_dev = len(devices)
    rep = NamedSharding(mesh, P())
    sharded = NamedSharding(mesh, P(_AXIS))
    states = _replicate(states, rep)
    key_data = _global(np.asarray(jax.random.key_data(key)), rep)
    temps = _global(np.asarray(temps, np.float32), rep)
    levels = _replicate(levels, rep)
    num_blocks = -(-num_samples // chunk)
    num_steps = -(-num_blocks // n_dev)
    totals: dict | None = None
    pending = None
    bar = _progress_bar(num_samples, desc, progress)

    def collect(out, n):
        nonlocal totals
        host = {k: np.asarray(v).astype(np.int64) for k, v in out.items()}
        totals = host if totals is None else {k: totals[k] + host[k] for k in totals}
        bar.update(n)

    timing = {"compile_s": 0.0}
    t_all = time.perf_counter()
    for s in range(num_steps):
        blocks = np.arange(s * n_dev, (s + 1) * n_dev, dtype=np.int32)
        n_valid = np.clip(num_samples - blocks.astype(np.int64) * chunk, 0, chunk).astype(np.int32)
        t0 = time.perf_counter()
        out = fn(states, key_data, _global(blocks, sharded), _global(n_valid, sharded), temps, levels)
        if s == 0:  # tracing and compilation happen in the first (blocking) dispatch
            timing["compile_s"] = time.perf_counter() - t0
        if pending is not None:
            collect(*pending)
        pending = (out, int(n_valid.sum()))
    collect(*pending)
    bar.close()
    timing["total_s"] = time.perf_counter() - t_all
    return totals, timing


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="samples", unit_scale=True, disable=not enabled, file=sys.stderr,
                leave=False)


# --------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One test of the report; ``passed`` iff ``pvalue > threshold``."""

    __test__ = False  # not a pytest class

    name: str
    kind: str  # "chi2_gof" | "chi2_two_sample" | "binomial"
    statistic: float
    dof: int
    pvalue: float
    threshold: float
    n: int
    note: str = ""
    detail: str = dataclasses.field(default="", repr=False, compare=False)  # observed vs expected

    @property
    def passed(self) -> bool:
        return self.pvalue > self.threshold

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
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

    @property
    def passed(self) -> bool:
        """True iff no test is rejected."""
        return all(t.passed for t in self.tests)

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
            "passed": self.passed,
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
            f"jaxspec verify: tree={c['tree']} scheme={c['scheme']} temperature={c['temperature']} "
            f"top_k={c['top_k']} top_p={c['top_p']} horizon={c['horizon']} prompt={c['prompt']}",
            *([f"  MUTANT={c['mutant']}: {c['mutant_bug']}"] if c.get("mutant") else []),
            f"  {self.num_samples:,} samples per run on {c['devices']} device(s); {self.num_cells} cells; "
            f"family alpha {self.alpha:g}, Bonferroni over {len(self.tests)} tests -> {self.alpha_per_test:.3g} each",
            "",
            f"  {'test':<44} {'statistic':>12} {'dof':>5} {'p-value':>11}  result",
        ]
        for t in self.tests:
            lines.append(f"  {t.name:<44} {t.statistic:>12.4g} {t.dof:>5} {t.pvalue:>11.4g}  "
                         f"{'pass' if t.passed else 'REJECTED'}")
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
        lines.append(f"  tokens per round (speculative run): {self.tokens_per_round:.4f}")
        for t in self.rejected:
            if t.detail:
                lines += ["", f"  {t.name}: {t.note}", *("    " + s for s in t.detail.splitlines())]
        lines += ["", "PASSED: every test passed" if self.passed
                  else f"REJECTED: {len(self.rejected)} of {len(self.tests)} tests rejected"]
        return "\n".join(lines)

    def save_plots(self, directory) -> list[str]:
        """Write :meth:`figures` as ``marginals.png``, ``joint.png`` and ``acceptance.png``
        into ``directory`` (created if needed); returns the paths."""
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, fig in self.figures().items():
            paths.append(os.path.join(directory, f"{name}.png"))
            fig.savefig(paths[-1], dpi=110)
        return paths

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


# --------------------------------------------------------------------------- verify


def _check_count(name, x, minimum=1):
    if not _is_int(x) or x < minimum:
        raise ValueError(f"{name} = {x!r}: expected an integer >= {minimum}")
    return int(x)


def _check_prompt(prompt, v: int) -> tuple[int, ...]:
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise ValueError(f"prompt = {prompt!r}: expected a sequence of token ids")
    out = tuple(prompt)
    if not out:
        raise ValueError("prompt: expected at least one token, got an empty prompt")
    for i, t in enumerate(out):
        if not _is_int(t) or not 0 <= t < v:
            raise ValueError(f"prompt[{i}] = {t!r}: expected a token id in [0, {v})")
    return tuple(int(t) for t in out)


def _relabel(label: str, names) -> str:
    """A stats cell label ("12", "12(p=0)", "pooled(5)") with the index replaced by its name."""
    m = re.fullmatch(r"(\d+)(.*)", label)
    return names[int(m.group(1))] + m.group(2) if m else label


def _default_chunk(devices) -> int:
    return 1 << 14 if devices[0].platform == "cpu" else 1 << 16


def verify(
    target: Transformer | None = None,
    draft: Transformer | None = None,
    *,
    tree=DEFAULT_TREE,
    scheme: str = DEFAULT_SCHEME,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    draft_temperature: float | None = None,
    draft_top_k: int | None = None,
    draft_top_p: float | None = None,
    prompt: Sequence[int] | None = None,
    horizon: int = 3,
    num_samples: int = 10**6,
    chunk_size: int | None = None,
    seed: int = 0,
    mutant: str | None = None,
    alpha: float = 1e-3,
    check_acceptance: bool = True,
    devices: Sequence | None = None,
    progress: bool = True,
) -> VerifyReport:
    """Test that speculative decoding with this configuration samples the target's law.

    Args:
      target, draft: the model pair (both or neither; default :func:`default_pair`).
      tree, scheme, temperature, top_k, top_p, draft_*: as in :func:`jaxspec.generate`.
      prompt: token ids (default :data:`DEFAULT_PROMPT`).
      horizon: ``L``, the number of emitted tokens whose joint law is tested.
      num_samples: ``S`` samples for each run (speculative, target-only, first round).
      chunk_size: rows per block, i.e. per device per step (default 2^14 on CPU, 2^16
        on accelerators; at most ``S``); memory grows with it, never with ``S``. The counts
        depend on ``seed`` and ``chunk_size``, not on the number of devices.
      seed: sampling seed (the default models are fixed).
      mutant: a name in :data:`jaxspec.mutants.MUTANTS`: run a deliberately broken decoder.
      alpha: family-wise error rate, split over the tests by Bonferroni.
      check_acceptance: also run one-round decoding and test acceptance per depth.
      devices: devices of the 1-D mesh (default ``jax.devices()``).
      progress: tqdm progress bars on stderr.

    Raises:
      ValueError: bad input (named), or a law with more than :data:`MAX_CELLS` cells.
    """
    t_start = time.perf_counter()
    if (target is None) != (draft is None):
        raise ValueError("target/draft: pass both models, or neither for the default pair")
    if target is None:
        target, draft = default_pair(0)
    v = target.config.vocab_size
    horizon = _check_count("horizon", horizon)
    num_samples = _check_count("num_samples", num_samples)
    seed = _check_count("seed", seed, minimum=0)
    stats._check_alpha(alpha, "alpha")
    if mutant is not None:
        _mutants.check_mutant(mutant)
    prompt = _check_prompt(DEFAULT_PROMPT if prompt is None else prompt, v)
    setup = _setup(target, draft, prompt, horizon, tree, scheme, temperature, top_k, top_p,
                   draft_temperature, draft_top_k, draft_top_p)
    if setup.target_warp["top_k"] is None and setup.temperature != 0.0 and v**horizon > MAX_CELLS:
        raise ValueError(f"top_k = None: vocab_size**horizon = {v}**{horizon} cells exceed {MAX_CELLS}; "
                         "pass a top_k so that top_k**horizon cells are countable")
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices: expected at least one device")
    chunk = _default_chunk(devices) if chunk_size is None else _check_count("chunk_size", chunk_size)
    chunk = min(chunk, num_samples)  # never the device count: counts depend on (seed, chunk) only

    spec_cfg, first_cfg, impl = setup.spec_cfg, setup.first_cfg, _gen._spec_impl
    if mutant is not None:
        spec_cfg, impl = _mutants.spec_impl(mutant, spec_cfg)
        first_cfg, _ = _mutants.spec_impl(mutant, first_cfg)

    timings = {}
    t0 = time.perf_counter()
    law = exact_law(target, prompt, horizon, **setup.target_warp)
    levels = tuple((jnp.asarray(p), jnp.asarray(t)) for p, t in law.levels)
    timings["exact_law_s"] = time.perf_counter() - t0

    # the exact expectations, hence the set of tests, are fixed before any sample is drawn
    acc_exp, acc_note = None, ""
    if check_acceptance and isinstance(setup.spec_cfg.tree, DynamicTree):
        acc_note = "acceptance expectation not enumerated for dynamic trees (observed only)"
    elif check_acceptance:
        t0 = time.perf_counter()
        try:
            acc_exp = expected_acceptance(target, draft, prompt, setup.spec_cfg.tree, scheme, setup.target_warp,
                                          setup.draft_warp)
        except ValueError as e:
            acc_note = f"acceptance expectation not enumerated: {e}"
        timings["expected_acceptance_s"] = time.perf_counter() - t0

    states = (nnx.split(target)[1], nnx.split(draft)[1])
    temps = (setup.temperature, setup.draft_temperature)
    base = jax.random.key(seed)
    common = dict(prompt=prompt, horizon=horizon, vocab=v, levels=levels, num_samples=num_samples,
                  chunk=chunk, devices=devices, progress=progress)

    spec, timings["speculative"] = _stream("spec", spec_cfg, impl, states, temps, jax.random.fold_in(base, 0),
                                           desc="speculative", **common)
    ar, timings["target_only"] = _stream("ar", setup.ar_cfg, _gen._ar_impl, states[:1], temps[:1],
                                         jax.random.fold_in(base, 1), desc="target only", **common)

    # ------------------------------------------------------------------ acceptance
    acc_obs = None
    acc_n = 0
    if check_acceptance:
        first, timings["first_round"] = _stream("first", first_cfg, impl, states, temps,
                                                jax.random.fold_in(base, 2), desc="first round", **common)
        acc_n = num_samples
        acc_obs = first["accepted"] / num_samples

    # ------------------------------------------------------------------ tests
    exact_full = np.append(law.probs, 0.0)  # + the outside-support cell
    planned = 1 + horizon + 2 + (0 if acc_exp is None else acc_exp.size)
    a_test = stats.bonferroni(alpha, planned)
    labels = [",".join(map(str, c)) for c in law.cells.tolist()] + ["outside"]
    tests = []

    def chi(name, r, kind, joint=True):
        detail = ""
        if r.observed is not None:  # cells named by token sequences (joint) or token ids
            lbl = (tuple(_relabel(x, labels) for x in r.labels) if joint else r.labels) or None
            detail = stats.table(r.observed, r.expected, labels=lbl, max_rows=10)
        tests.append(TestResult(name, kind, float(r.statistic), int(r.dof), float(r.pvalue), a_test, int(r.n),
                                r.note, detail))

    chi("joint chi2 vs exact", stats.chisquare_gof(spec["joint"], exact_full), "chi2_gof")
    for i in range(horizon):
        chi(f"position {i + 1} chi2 vs exact", stats.chisquare_gof(spec["marginals"][i], law.marginals[i]),
            "chi2_gof", joint=False)
    chi("joint two-sample chi2 vs target-only", stats.chisquare_two_sample(spec["joint"], ar["joint"]),
        "chi2_two_sample")
    chi("control: target-only joint chi2 vs exact", stats.chisquare_gof(ar["joint"], exact_full), "chi2_gof")
    if acc_exp is not None:
        for d, (k, e) in enumerate(zip(first["accepted"], acc_exp, strict=True)):
            e = float(min(max(e, 0.0), 1.0))
            pv = float(_scipy_stats.binomtest(int(k), num_samples, e).pvalue)
            tests.append(TestResult(f"acceptance at depth {d + 1} (binomial)", "binomial", float(k / num_samples),
                                    0, pv, a_test, num_samples, f"observed {int(k)} of {num_samples}, "
                                    f"expected {e * num_samples:.1f}"))
    assert len(tests) == planned

    tv = stats.total_variation(spec["joint"], exact_full)
    tv_up = stats.tv_upper_bound(spec["joint"], exact_full, alpha=alpha)
    tv_ar = stats.total_variation(ar["joint"], exact_full)
    mdt = stats.min_detectable_tv(num_samples, max(law.probs.size, 2), alpha=a_test)
    config = {
        "tree": tree if isinstance(tree, str) else str(setup.spec_cfg.tree),
        "tree_resolved": str(setup.spec_cfg.tree),
        "scheme": scheme,
        "temperature": setup.temperature,
        "top_k": setup.target_warp["top_k"],
        "top_p": setup.target_warp["top_p"],
        "draft_temperature": setup.draft_temperature,
        "draft_top_k": setup.draft_warp["top_k"],
        "draft_top_p": setup.draft_warp["top_p"],
        "prompt": list(prompt),
        "horizon": horizon,
        "vocab_size": v,
        "num_samples": num_samples,
        "chunk_size": chunk,
        "devices": len(devices),
        "platform": devices[0].platform,
        "seed": seed,
        "mutant": mutant,
        "mutant_bug": None if mutant is None else _mutants.describe(mutant),
    }
    timings["total_s"] = time.perf_counter() - t_start
    for name in ("speculative", "target_only"):
        t = timings[name]
        timings[f"{name}_samples_per_s"] = num_samples / max(t["total_s"] - t["compile_s"], 1e-9)
    timings = {k: ({a: round(b, 3) for a, b in x.items()} if isinstance(x, dict) else round(float(x), 3))
               for k, x in timings.items()}
    return VerifyReport(
        config=config,
        tests=tuple(tests),
        alpha=alpha,
        alpha_per_test=a_test,
        num_samples=num_samples,
        cells=law.cells,
        exact=law.probs,
        spec_counts=spec["joint"],
        ar_counts=ar["joint"],
        exact_marginals=law.marginals,
        spec_marginals=spec["marginals"],
        ar_marginals=ar["marginals"],
        tv=tv,
        tv_upper=tv_up,
        tv_target_only=tv_ar,
        min_detectable_tv=mdt,
        acceptance_observed=acc_obs,
        acceptance_expected=acc_exp,
        acceptance_samples=acc_n,
        acceptance_note=acc_note,
        tokens_per_round=float(spec["tokens"] / max(spec["rounds"], 1)),
        timings=timings,
    )
