"""Hardware-aware tree choice: the tree that maximizes predicted tokens per second of a
target/draft pair on *this* device.

A bigger tree accepts more per round but costs more per round (the target verifies
``N + 1`` tokens, the draft runs one forward per depth level, the acceptance rule walks
``N`` nodes). :func:`auto_tree` weighs the two, for each candidate node budget ``N``:

1. the pair's positional acceptance vector, measured on held-out text
   (:func:`jaxspec.tuning.optimize.measure_acceptance`);
2. ``tree_N = optimize_tree(acceptance, N, max_depth)`` and its predicted tokens per
   round ``tau_N = expected_accepted + 1``;
3. the measured wall time of one speculative round with ``tree_N`` on this device:
   a jitted ``fori_loop`` of real rounds (draft proposal of every level, the target's
   tree-verification forward of ``N + 1`` tokens against a KV cache of ``context_len``
   slots, warps, the acceptance rule that :func:`jaxspec.generate` will use for that tree
   (``rule``, resolved by :func:`jaxspec.core.rules.resolve_rule`: ``"auto"`` is block
   verification on a chain, the token rule on a branching tree), the cache commits), its
   time divided by its length so that dispatch is not counted, median of ``repeats``; the
   verification forward alone is timed the same way (``verify_s``, to show where the time
   goes);
4. the target-only decode step (forward of 1 token, warp, draw), timed the same way;

and picks ``argmax_N tau_N / round_s(N)`` (predicted speedup ``tau_N / round_s(N) *
target_step_s``). The result is cached on disk (see :func:`cache_key`), so
``jaxspec generate --tree auto`` measures once per pair, settings and device.

Example (the embedded pair; the first call measures, later calls read the cache)::

    import jax, jaxspec
    target = jaxspec.load_model("default-target")
    draft = jaxspec.load_model("default-draft")
    res = jaxspec.auto_tree(target, draft, scheme="deterministic", sampling=jaxspec.Sampling(temperature=1.0),
                            budgets=(2, 4, 8), max_depth=6, key=jax.random.key(0))
    print(res.table())          # N, depth, predicted tau, round ms, tokens/s, speedup
    out = jaxspec.generate(jax.random.key(1), target, draft, [[256, 100]],
                           max_new_tokens=32, tree=res.parents, scheme="deterministic")

The prediction trusts the positional model (see :mod:`jaxspec.tuning.optimize`): it ignores
that acceptances at successive depths are correlated, so measured tau of deep chains
tends to exceed the prediction a little; tau is the token rule's (block and traversal
verification accept at least as much; with ``scheme="deterministic"`` exactly as much).
Timings on a busy machine are noisy; pass ``retune=True`` (``--retune`` on the command
line) to measure again. A prediction is not a measurement of ``generate`` itself:
``jaxspec generate --tree auto`` checks the chosen tree against target-only decoding with
the real ``generate`` call and falls back to target-only where speculation is slower.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxspec.checks import is_int
from jaxspec.core import rules
from jaxspec.core.sampling import check_scheme
from jaxspec.core.settings import Sampling, check_sampling, draft_law
from jaxspec.core.treespec import StaticTree
from jaxspec.decode.combinations import check_settings
from jaxspec.decode.inputs import position_limit
from jaxspec.errors import SettingError
from jaxspec.nn.model import Transformer, check_transformer
from jaxspec.tuning.optimize import check_draws, measure_acceptance, optimize_tree
from jaxspec.tuning.round_timing import RoundCost, check_positive, measure_round_cost, measure_target_step

__all__ = [
    "AutoTreeRow",
    "AutoTreeResult",
    "RoundCost",
    "auto_tree",
    "tabulate",
    "measure_round_cost",
    "measure_target_step",
    "cache_key",
    "default_cache_dir",
]

#: bump when the measurement changes meaning: old cache entries are then ignored. (The rule
#: a round is timed with is a setting: entries cached before it was one timed every round with
#: the token rule, and stay valid for ``rule="token"`` alone; see :func:`auto_tree`.)
CACHE_VERSION = 1
DEFAULT_BUDGETS = (2, 4, 6, 8, 12, 16, 24, 32)


@dataclasses.dataclass(frozen=True)
class AutoTreeRow:
    """One candidate budget of the table of :func:`tabulate`."""

    budget: int
    depth: int
    parents: tuple[int, ...]
    predicted_tau: float  # predicted tokens per round (expected_accepted + 1)
    verify_s: float
    round_s: float
    tokens_per_s: float  # predicted, per batch row: predicted_tau / round_s
    speedup: float  # predicted tokens_per_s / target-only tokens per second
    rule: str = "token"  # the verification rule the round was timed with (resolved: never "auto")


@dataclasses.dataclass(frozen=True)
class AutoTreeResult:
    """Result of :func:`auto_tree` (or of :func:`tabulate` with injected figures).

    Attributes:
      parents:        the chosen tree (breadth first), for ``generate(tree=parents)``.
      budget:         its node count ``N``.
      predicted_tau:  predicted tokens per round (per target call) of the chosen tree.
      predicted_speedup: its predicted tokens/s over target-only decoding (< 1: the pair
                      does not pay off on this device; decode target-only instead).
      tokens_per_s:   its predicted tokens per second per batch row.
      target_step_s:  measured seconds of one target-only decode step.
      acceptance:     the positional acceptance vector used.
      rows:           the whole table, one :class:`AutoTreeRow` per budget.
      info:           what was measured and where (device, jax version, settings).
      from_cache:     True when read from the on-disk cache.
      cache_path:     the cache file (None when caching is off or the entry could not be written).
    """

    parents: tuple[int, ...]
    budget: int
    predicted_tau: float
    predicted_speedup: float
    tokens_per_s: float
    target_step_s: float
    acceptance: tuple[float, ...]
    rows: tuple[AutoTreeRow, ...]
    info: dict = dataclasses.field(default_factory=dict, compare=False)
    from_cache: bool = dataclasses.field(default=False, compare=False)
    cache_path: str | None = dataclasses.field(default=None, compare=False)

    @property
    def depth(self) -> int:
        return next(r.depth for r in self.rows if r.budget == self.budget)

    def table(self) -> str:
        """The table as aligned text; the chosen row is marked with ``*``."""
        head = (f"{'':1s} {'N':>4s} {'depth':>5s} {'rule':>5s} {'pred tau':>8s} {'verify ms':>9s} "
                f"{'round ms':>8s} {'tokens/s':>9s} {'speedup':>7s}")
        lines = [head]
        for r in self.rows:
            mark = "*" if r.budget == self.budget else " "
            lines.append(
                f"{mark} {r.budget:4d} {r.depth:5d} {r.rule:>5s} {r.predicted_tau:8.3f} {r.verify_s * 1e3:9.3f} "
                f"{r.round_s * 1e3:8.3f} {r.tokens_per_s:9.1f} {r.speedup:6.2f}x"
            )
        lines.append(f"  target-only step {self.target_step_s * 1e3:.3f} ms "
                     f"({1.0 / self.target_step_s:.1f} tokens/s)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("from_cache")
        d.pop("cache_path")
        return d

    @classmethod
    def from_dict(cls, d: dict, **extra) -> AutoTreeResult:
        rows = tuple(AutoTreeRow(**{**r, "parents": tuple(r["parents"])}) for r in d["rows"])
        return cls(**{**d, "parents": tuple(d["parents"]), "acceptance": tuple(d["acceptance"]),
                      "rows": rows, **extra})


# ----------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------


def _warp_entry(law: Sampling) -> list:
    """A law in the cache key: [temperature, top_k, top_p], plus min_p when it is set (the
    entries written before min-p existed keep their keys)."""
    w = law.warp
    return [law.temperature, w.top_k, w.top_p, *([] if w.min_p is None else [w.min_p])]


def _check_rule(rule) -> str:
    """A rule name every candidate tree takes (the settings table's ``auto`` rows, named
    by the one argument the caller gave)."""
    try:
        check_settings(auto=True, rule=rule)
    except SettingError as e:
        raise SettingError({"rule": rule}, e.expected) from None
    return rule


def _check_budgets(budgets) -> tuple[int, ...]:
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, (Sequence, np.ndarray)):
        raise ValueError(f"budgets: expected a non-empty sequence of node counts >= 1, got {budgets!r}")
    vals = list(budgets)
    if not vals:
        raise ValueError("budgets: expected a non-empty sequence of node counts >= 1, got []")
    for i, b in enumerate(vals):
        if not is_int(b) or b < 1:
            raise ValueError(f"budgets[{i}] = {b!r}: expected an integer node count >= 1")
    if len(set(vals)) != len(vals):
        raise ValueError(f"budgets: expected distinct node counts, got {vals}")
    return tuple(sorted(int(b) for b in vals))


# ----------------------------------------------------------------------------------
# The table and the choice (pure; costs injected)
# ----------------------------------------------------------------------------------


def tabulate(
    acceptance,
    budgets: Sequence[int],
    max_depth: int,
    round_cost: Callable[[StaticTree], RoundCost],
    target_step_s: float,
    rule: str = rules.AUTO,
) -> AutoTreeResult:
    """The table and the argmax of predicted tokens/s, from an acceptance vector and a
    cost function (measured by :func:`auto_tree`; injected in tests).

    Args:
      acceptance: float[K] positional acceptance vector (:func:`optimize_tree`).
      budgets: candidate node counts.
      max_depth: the deepest level allowed.
      round_cost: ``StaticTree -> RoundCost`` seconds of one round with that tree.
      target_step_s: seconds of one target-only decode step (> 0).
      rule: the verification rule ``round_cost`` times with; each row records it resolved
        for its tree (``"auto"``: ``"block"`` on a chain, ``"token"`` otherwise).

    Returns:
      :class:`AutoTreeResult` whose ``budget`` maximizes ``predicted_tau / round_s``
      (ties: the smaller budget).

    Example: acceptance ``[0.8]`` (chains only), budgets (1, 2, 4), rounds costing
    ``1 + 0.1 N`` ms, a 1 ms target step: tau = 1.8, 2.44, 3.36 tokens per 1.1, 1.2,
    1.4 ms -> 1636, 2033, 2400 tokens/s: N = 4, speedup 2.40x.
    """
    budgets = _check_budgets(budgets)
    max_depth = check_positive("max_depth", max_depth)
    if not isinstance(target_step_s, (int, float)) or not np.isfinite(target_step_s) or target_step_s <= 0:
        raise ValueError(f"target_step_s: expected seconds > 0, got {target_step_s!r}")
    rule = _check_rule(rule)
    acc = tuple(float(x) for x in np.asarray(acceptance, np.float64).reshape(-1))
    rows = []
    for n in budgets:
        opt = optimize_tree(acc, n, max_depth)
        tree = StaticTree.from_parents(opt.parents)
        cost = round_cost(tree)
        if not (np.isfinite(cost.round_s) and cost.round_s > 0):
            raise ValueError(f"round_cost: budget {n}: round_s = {cost.round_s!r}; expected seconds > 0")
        tps = opt.expected_tokens / cost.round_s
        rows.append(AutoTreeRow(
            budget=n, depth=tree.depth, parents=tree.parents, predicted_tau=opt.expected_tokens,
            verify_s=float(cost.verify_s), round_s=float(cost.round_s), tokens_per_s=tps,
            speedup=tps * target_step_s, rule=rules.resolve_rule(rule, tree),
        ))
    best = max(rows, key=lambda r: (r.tokens_per_s, -r.budget))
    return AutoTreeResult(
        parents=best.parents, budget=best.budget, predicted_tau=best.predicted_tau,
        predicted_speedup=best.speedup, tokens_per_s=best.tokens_per_s,
        target_step_s=float(target_step_s), acceptance=acc, rows=tuple(rows),
    )


# ----------------------------------------------------------------------------------
# Identity of a measurement, and the on-disk cache
# ----------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$JAXSPEC_CACHE_DIR`` if set, else ``~/.cache/jaxspec``."""
    env = os.environ.get("JAXSPEC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxspec"


def _model_fingerprint(model: Transformer) -> str:
    """sha256 (16 hex digits) of the config and of every parameter's bytes: two models
    share it only if they compute the same function. ``eos_token_id`` (when to stop, not what is
    computed; a later field) is left out, so entries cached before it existed still match."""
    cfg = model.config.to_dict()
    cfg.pop("eos_token_id", None)
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    for path, var in nnx.to_flat_state(nnx.state(model)):
        arr = np.asarray(var.get_value())
        h.update("/".join(map(str, path)).encode())
        h.update(str((arr.shape, arr.dtype)).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def cache_key(target: Transformer, draft: Transformer, settings: dict) -> str:
    """32 hex digits identifying a measurement: both models' fingerprints (config and
    weights), the settings (scheme, target and draft warps, budgets, max_depth, batch,
    context, held-out text digest, ...), the device kind, platform and jax version."""
    dev = jax.devices()[0]
    ident = {
        "version": CACHE_VERSION,
        "target": _model_fingerprint(target),
        "draft": _model_fingerprint(draft),
        "settings": settings,
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _held_out(target: Transformer, held_out_tokens, num_windows: int, window_len: int) -> np.ndarray:
    """int32[num_windows, window_len] evenly spaced windows of the held-out stream."""
    from jaxspec.formats.tokenizer import ByteTokenizer
    from jaxspec.training.corpus import eval_windows, load_corpus

    v = target.config.vocab_size
    if held_out_tokens is None:
        if v != ByteTokenizer().vocab_size:
            raise ValueError(
                f"held_out_tokens: required for a vocabulary of {v} tokens; the built-in held-out "
                f"text (jaxspec.training.corpus validation split) is byte-level ({ByteTokenizer().vocab_size} tokens)"
            )
        stream = load_corpus().val
    else:
        stream = np.asarray(held_out_tokens)
        if stream.ndim != 1 or stream.dtype.kind not in "iu":
            raise ValueError(
                f"held_out_tokens: expected a 1-D integer token stream, got shape {stream.shape} "
                f"dtype {stream.dtype}"
            )
        if stream.size < window_len:
            raise ValueError(
                f"held_out_tokens: {stream.size} tokens; expected at least window_len = {window_len}"
            )
        if stream.min() < 0 or stream.max() >= v:
            raise ValueError(
                f"held_out_tokens: expected token ids in [0, {v}), got range [{stream.min()}, {stream.max()}]"
            )
    return eval_windows(stream, num_windows, window_len - 1)


# ----------------------------------------------------------------------------------
# The whole measurement
# ----------------------------------------------------------------------------------


def auto_tree(
    target: Transformer,
    draft: Transformer,
    *,
    scheme: str,
    rule: str = rules.AUTO,
    sampling: Sampling | None = None,
    draft_sampling: Sampling | None = None,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    max_depth: int = 8,
    key=None,
    held_out_tokens=None,
    num_windows: int = 32,
    window_len: int = 128,
    max_rank: int = 16,
    num_draws: int = 8,
    batch_size: int = 1,
    context_len: int | None = None,
    loops: int = 8,
    repeats: int = 5,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    retune: bool = False,
    progress: bool = True,
) -> AutoTreeResult:
    """Measure the pair on this device and choose the static tree of highest predicted
    tokens/s (see the module docstring for what is measured).

    Args:
      target, draft: :class:`~jaxspec.nn.model.Transformer` with the same vocabulary.
      scheme, sampling, draft_sampling: as :func:`jaxspec.generate` (the acceptance vector
        depends on them).
      rule: the verification rule :func:`jaxspec.generate` will be called with:
        ``"auto"`` (its default: each candidate's rounds are timed with block verification
        if it is a chain, the token rule otherwise), ``"token"`` or ``"traversal"``.
      budgets: candidate node counts ``N``.
      max_depth: the deepest level a tree may have.
      key: ``jax.random.key`` (required unless ``scheme="deterministic"``).
      held_out_tokens: a 1-D token stream of held-out text; ``None`` = the validation split
        of :mod:`jaxspec.training.corpus` (byte-level vocabularies only).
      num_windows, window_len: held-out windows for the acceptance measurement.
      max_rank: sibling ranks measured (capped by the largest budget); later ranks count 0.
      num_draws: sibling draws per position for the random schemes.
      batch_size: rows decoded together (the costs are per round of the whole batch).
      context_len: KV cache slots of the timed forwards; ``None`` = the models'
        ``max_position_embeddings`` capped at 512 (attention runs over every slot).
      loops, repeats: each timing is a jitted loop of ``loops`` steps, median of ``repeats``.
      cache_dir: where results are cached; ``None`` = :func:`default_cache_dir`.
      use_cache: read and write the cache; ``retune=True`` measures again and overwrites it.
        A cache entry that cannot be written is a warning on stderr, not an error.
      progress: a tqdm progress bar on stderr.

    Returns:
      :class:`AutoTreeResult`.

    Raises:
      ValueError: naming the argument, for bad models, settings or budgets.
    """
    check_transformer("target", target)
    check_transformer("draft", draft)
    v = target.config.vocab_size
    if draft.config.vocab_size != v:
        raise ValueError(f"draft: vocab_size = {draft.config.vocab_size}; expected the target's vocab_size = {v}")
    check_scheme(scheme)
    rule = _check_rule(rule)
    law = check_sampling("sampling", sampling, Sampling())
    dlaw = draft_law(scheme, law, check_sampling("draft_sampling", draft_sampling))
    budgets = _check_budgets(budgets)
    max_depth = check_positive("max_depth", max_depth)
    num_draws, key = check_draws(scheme, key, num_draws)  # a key unless deterministic
    if scheme != "iid" and budgets[-1] > v:
        raise ValueError(f"budgets: {budgets[-1]} nodes could need more than vocab_size = {v} distinct "
                         f"siblings under scheme={scheme!r}; expected budgets <= {v}")
    num_windows = check_positive("num_windows", num_windows)
    window_len = check_positive("window_len", window_len, 2)
    max_rank = min(check_positive("max_rank", max_rank), budgets[-1], v)
    batch_size = check_positive("batch_size", batch_size)
    loops, repeats = check_positive("loops", loops), check_positive("repeats", repeats)
    limit = min(position_limit(target), position_limit(draft))  # the decoder's rule (both are Transformers)
    if window_len > limit:
        raise ValueError(f"window_len: {window_len} exceeds max_position_embeddings = {limit}")
    if context_len is None:
        context_len = min(limit, 512)
    context_len = check_positive("context_len", context_len, 2)
    if context_len > limit or context_len < budgets[-1] + 3:
        raise ValueError(f"context_len: expected {budgets[-1] + 3} <= context_len <= {limit} "
                         f"(the largest budget + 3 .. max_position_embeddings), got {context_len}")

    windows = _held_out(target, held_out_tokens, num_windows, window_len)  # int32[W, T]
    settings = {
        "scheme": scheme,
        # the rule of the timed rounds; absent for "token", whose rounds are timed as they were
        # before the rule was a setting, so that those cache entries keep their key
        **({} if rule == "token" else {"rule": rule}),
        "target_warp": _warp_entry(law),
        "draft_warp": _warp_entry(dlaw),
        "budgets": list(budgets), "max_depth": max_depth, "max_rank": max_rank,
        "num_draws": num_draws if scheme != "deterministic" else None,
        "key": None if scheme == "deterministic" else np.asarray(jax.random.key_data(key)).tolist(),
        "held_out": hashlib.sha256(windows.tobytes()).hexdigest()[:16],
        "batch_size": batch_size, "context_len": context_len,
    }
    path = None
    if use_cache:
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        path = folder / f"autotree-{cache_key(target, draft, settings)}.json"
        if path.is_file() and not retune:
            try:
                return AutoTreeResult.from_dict(json.loads(path.read_text()), from_cache=True,
                                                cache_path=str(path))
            except (ValueError, KeyError, TypeError):  # unreadable entry: measure again
                pass

    from tqdm import tqdm

    bar = tqdm(total=2 + len(budgets), desc="auto tree", file=sys.stderr, disable=not progress,
               leave=False)
    bar.set_postfix_str("acceptance")
    est = measure_acceptance(
        target, draft, windows, max_rank=max_rank, scheme=scheme, sampling=law, draft_sampling=dlaw, key=key,
        num_draws=num_draws, batch_size=8 if scheme == "deterministic" else 2,
    )
    bar.update()
    bar.set_postfix_str("target step")
    common = dict(batch_size=batch_size, context_len=context_len, loops=loops, repeats=repeats)
    step = measure_target_step(target, sampling=law, **common)
    bar.update()

    def cost(tree: StaticTree) -> RoundCost:
        bar.set_postfix_str(f"round of {tree.num_nodes} nodes")
        c = measure_round_cost(target, draft, tree, scheme=scheme, rule=rule, sampling=law, draft_sampling=dlaw,
                               **common)
        bar.update()
        return c

    result = tabulate(est.mean, budgets, max_depth, cost, step, rule=rule)
    bar.close()
    dev = jax.devices()[0]
    info = {
        **settings,
        "acceptance_stderr": est.stderr.tolist(), "acceptance_positions": est.num_positions,
        "device": str(dev), "device_kind": dev.device_kind, "jax": jax.__version__,
        "loops": loops, "repeats": repeats,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = dataclasses.replace(result, info=info)
    if path is not None and not _save(result, path, cache_dir):
        path = None  # the measurement stands; only the cache entry is missing
    return dataclasses.replace(result, cache_path=None if path is None else str(path))


def _save(result: AutoTreeResult, path: Path, cache_dir) -> bool:
    """Write the cache entry; on failure warn on stderr (naming where the folder came from)
    and return False: minutes of measurement are not thrown away for an unwritable cache."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(result.to_dict(), indent=1))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new entry
        return True
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if cache_dir is not None:
            source = "cache_dir"
        elif os.environ.get("JAXSPEC_CACHE_DIR"):
            source = f"JAXSPEC_CACHE_DIR={os.environ['JAXSPEC_CACHE_DIR']}"
        else:
            source = "the default folder; set JAXSPEC_CACHE_DIR to a writable folder"
        print(f"auto_tree: warning: cannot write the cache entry {path} ({e.strerror or e}; cache folder "
              f"from {source}); the measurement is used but not cached", file=sys.stderr)
        return False
