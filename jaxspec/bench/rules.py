"""Gains of the verification rules: block and traversal verification vs the token rule.

Three measurements, each comparing the rules on the same inputs:

* **exact** -- expected tokens per round (accepted tokens + the extra one), enumerated in
  float64 by :mod:`jaxspec.exactness.rule_laws` on random bigram tables (every draft outcome,
  the acceptance uniforms integrated out; no sampling): block vs token on chains of
  :attr:`RuleBenchConfig.chain_lengths` nodes, traversal vs token on the static trees of
  :attr:`RuleBenchConfig.exact_trees` (siblings ``without_replacement``). On a chain
  traversal verification is block verification, so chains list block only;
* **sampled** -- the same expectation for trees too large to enumerate (``V**N`` draft
  outcomes): the library's own rules vmapped over :attr:`RuleBenchConfig.sampled_rounds`
  independent rounds on the same tables, the token rule and traversal fed the *same* keys
  (common random numbers), so the paired difference has a small standard error;
* **generate** -- tau (tokens per target call) and tokens/s of :func:`jaxspec.generate` on the
  default pair with each rule, the same prompt and the same keys, next to target-only
  sampling; every (tree, temperature) row times its rules and target-only in turns
  (:func:`jaxspec.bench.common.interleaved_turns`), tau summed over every timed call.

At temperature 0 the target law is one-hot; then block and traversal accept exactly what the
token rule accepts (no gain), and the outputs agree token for token (``same_tokens``).

JSON (``rule_gains.json``): ``exact``, ``sampled`` and ``generate`` rows, ``headline``
(``block_gain_chain4``: exact expected tokens of block minus token on a 4-node chain;
``rule_tau_t1``/``rule_speedup_t1`` per rule on chain:4 at temperature 1). Plot: expected
tokens against tree size (left), measured speedup per rule (right).

    report = run("tiny")
    report["headline"]["block_gain_chain4"] >= 0    # True
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench import common
from jaxspec.bench.decode import DEFAULT_PROMPT, sibling_scheme
from jaxspec.core import rules as rules_mod
from jaxspec.core import sampling
from jaxspec.core.settings import Sampling
from jaxspec.core.treespec import StaticTree, parse_tree

# the module itself: the package re-exports the function ``generate`` under the same name
from jaxspec.decode import generate as gen
from jaxspec.exactness import rule_laws

__all__ = ["NAME", "RuleBenchConfig", "CONFIGS", "run", "plot", "headline", "table", "sampled_tokens"]

NAME = "rule_gains"
HEADLINE_TREE = "chain:4"


@dataclasses.dataclass(frozen=True)
class RuleBenchConfig:
    """Trees are :func:`~jaxspec.core.treespec.parse_tree` specs of static trees."""

    chain_lengths: tuple[int, ...]  # exact block vs token
    chain_vocab: int  # V of the chains' tables
    exact_trees: tuple[str, ...]  # exact traversal vs token
    tree_vocab: int  # V of the trees' tables (V**N draft outcomes are enumerated)
    sampled_trees: tuple[str, ...]  # sampled traversal vs token (V = chain_vocab)
    sampled_rounds: int
    generate: tuple[tuple[str, tuple[str, ...]], ...]  # (tree, rules) timed with generate
    temperatures: tuple[float, ...]
    max_new_tokens: int
    repeats: int
    table_seed: int = 1
    models: str = "default"  # "default" (embedded pair) or "tiny" (random)


CONFIGS = {
    "full": RuleBenchConfig(
        chain_lengths=(2, 3, 4, 5, 6, 7, 8), chain_vocab=4,
        exact_trees=("branch:2", "branch:3", "branch:2,1", "branch:2,2", "branch:3,1", "branch:2,1,1",
                     "branch:2,2,1"), tree_vocab=3,
        sampled_trees=("branch:2,2", "branch:3,2,1", "branch:4,2,2,1"), sampled_rounds=1 << 20,
        generate=(("chain:4", ("token", "block", "traversal")), ("branch:2,2", ("token", "traversal")),
                  ("branch:3,2,1", ("token", "traversal"))),
        temperatures=(0.0, 1.0), max_new_tokens=128, repeats=5,
    ),
    "quick": RuleBenchConfig(
        chain_lengths=(2, 3, 4, 5, 6), chain_vocab=4,
        exact_trees=("branch:2,1", "branch:2,2", "branch:2,1,1"), tree_vocab=3,
        sampled_trees=("branch:3,2,1",), sampled_rounds=1 << 16,
        generate=(("chain:4", ("token", "block", "traversal")), ("branch:2,2", ("token", "traversal"))),
        temperatures=(0.0, 1.0), max_new_tokens=32, repeats=2,
    ),
    "tiny": RuleBenchConfig(
        chain_lengths=(2, 3, 4), chain_vocab=3, exact_trees=("branch:2,1",), tree_vocab=3,
        sampled_trees=("branch:2,1",), sampled_rounds=1 << 10,
        generate=(("chain:4", ("token", "block")),), temperatures=(1.0,), max_new_tokens=8, repeats=1,
        models="tiny",
    ),
}


def _parents(spec: str) -> tuple[int, ...]:
    tree = parse_tree(spec)
    if not isinstance(tree, StaticTree):
        raise ValueError(f"tree = {spec!r}: expected a static tree spec (chain:K or branch:...)")
    return tuple(int(p) for p in tree.parents)


# --------------------------------------------------------------------------- exact


def _exact_rows(cfg: RuleBenchConfig) -> list[dict]:
    rows = []
    t, d = rule_laws.random_tables(cfg.table_seed, cfg.chain_vocab)
    for k in cfg.chain_lengths:
        par = rule_laws.chain(k)
        e = {r: rule_laws.expected_tokens(r, par, t, d, 0, "iid") for r in ("token", "block")}
        rows.append({"tree": f"chain:{k}", "kind": "chain", "num_nodes": k, "vocab": cfg.chain_vocab,
                     "scheme": "iid", "rules": e, "gain": e["block"] - e["token"], "against": "block"})
        common.log(f"rules: exact chain:{k} V={cfg.chain_vocab}: token {e['token']:.4f}  block {e['block']:.4f}")
    t, d = rule_laws.random_tables(cfg.table_seed, cfg.tree_vocab)
    for spec in cfg.exact_trees:
        par = _parents(spec)
        e = {r: rule_laws.expected_tokens(r, par, t, d, 0, "without_replacement") for r in ("token", "traversal")}
        rows.append({"tree": spec, "kind": "tree", "num_nodes": len(par), "vocab": cfg.tree_vocab,
                     "scheme": "without_replacement", "rules": e, "gain": e["traversal"] - e["token"],
                     "against": "traversal"})
        common.log(f"rules: exact {spec} V={cfg.tree_vocab}: token {e['token']:.4f}  traversal {e['traversal']:.4f}")
    return rows


# --------------------------------------------------------------------------- sampled


@functools.lru_cache(maxsize=8)
def _round_tokens_fn(parents: tuple[int, ...], scheme: str, rule: str):
    """jit ``(keys[B], t f32[V, V], d f32[V, V]) -> int32[B]``: tokens emitted by one round of
    ``rule`` per key, the tree drafted from the bigram rows of ``d`` after context token 0."""
    par = np.asarray(parents, np.int32)
    n = len(parents)
    kids = [[j for j in range(n) if par[j] == row - 1] for row in range(n + 1)]
    accept = rules_mod.rule_function(rule)

    def one(key, t, d):
        k_draft, k_acc = jax.random.split(key)
        node_tok = jnp.zeros((n,), jnp.int32)
        for row, ch in enumerate(kids):
            if ch:
                ctx = jnp.int32(0) if row == 0 else node_tok[row - 1]
                tok, _ = sampling.draw(jax.random.fold_in(k_draft, row), d[ctx], len(ch), scheme)
                node_tok = node_tok.at[np.asarray(ch)].set(tok)
        ctxs = jnp.concatenate([jnp.zeros((1,), jnp.int32), node_tok])  # [N + 1]: each row's context
        return accept(k_acc, par, node_tok, t[ctxs], d[ctxs], scheme).num_tokens

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def sampled_tokens(spec: str, rules: tuple[str, ...], *, vocab: int = 4, seed: int = 1, rounds: int = 1 << 16,
                   scheme: str = "without_replacement", chunk: int = 1 << 16) -> dict:
    """Mean tokens per round of each rule on one tree, sampled with the library's rules on the
    tables ``rule_laws.random_tables(seed, vocab)``; every rule gets the same keys. Returns
    ``{"mean": {rule: m}, "stderr": {rule: se}, "diff_stderr": {rule: se of (rule - rules[0])}}``."""
    if rounds < 1:
        raise ValueError(f"rounds = {rounds!r}: expected an integer >= 1")
    par = _parents(spec)
    t, d = (jnp.asarray(x, jnp.float32) for x in rule_laws.random_tables(seed, vocab))
    counts = {r: [] for r in rules}
    base = jax.random.key(seed)
    for start in range(0, rounds, chunk):
        keys = jax.random.split(jax.random.fold_in(base, start), min(chunk, rounds - start))
        for r in rules:
            counts[r].append(np.asarray(_round_tokens_fn(par, scheme, r)(keys, t, d)))
    x = {r: np.concatenate(c).astype(np.float64) for r, c in counts.items()}
    n = float(rounds)
    return {"mean": {r: float(v.mean()) for r, v in x.items()},
            "stderr": {r: float(v.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0 for r, v in x.items()},
            "diff_stderr": {r: float((x[r] - x[rules[0]]).std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
                            for r in rules}}


def _sampled_rows(cfg: RuleBenchConfig) -> list[dict]:
    rows = []
    for spec in cfg.sampled_trees:
        s = sampled_tokens(spec, ("token", "traversal"), vocab=cfg.chain_vocab, seed=cfg.table_seed,
                           rounds=cfg.sampled_rounds)
        rows.append({"tree": spec, "num_nodes": len(_parents(spec)), "vocab": cfg.chain_vocab,
                     "scheme": "without_replacement", "rounds": cfg.sampled_rounds, **s,
                     "gain": s["mean"]["traversal"] - s["mean"]["token"],
                     "gain_stderr": s["diff_stderr"]["traversal"]})
        common.log(f"rules: sampled {spec} V={cfg.chain_vocab} ({cfg.sampled_rounds} rounds): token "
                   f"{s['mean']['token']:.4f}  traversal {s['mean']['traversal']:.4f}  gain "
                   f"{rows[-1]['gain']:+.4f} ± {rows[-1]['gain_stderr']:.4f}")
    return rows


# --------------------------------------------------------------------------- generate


def _generate_rows(cfg: RuleBenchConfig) -> tuple[list[dict], list[int]]:
    from jaxspec.formats.tokenizer import ByteTokenizer  # noqa: PLC0415

    target, draft = common.model_pair(cfg.models)
    prompt = ByteTokenizer().encode(DEFAULT_PROMPT, add_bos=True)
    m = cfg.max_new_tokens
    rows = []
    for temp in cfg.temperatures:
        def ar(i, temp=temp):
            return gen.generate_autoregressive(jax.random.key(1000 + i), target, [prompt], max_new_tokens=m,
                                               sampling=Sampling(temperature=temp), stop_tokens=())

        for spec, rule_names in cfg.generate:
            tree = parse_tree(spec)
            scheme = sibling_scheme(tree, temp)
            fns = {"target_only": ar}
            for r in rule_names:
                def sp(i, r=r, temp=temp, tree=tree, scheme=scheme):
                    # the same key for every rule: turn i of each rule sees the same draws
                    return gen.generate(jax.random.key(2000 + i), target, draft, [prompt], max_new_tokens=m,
                                        tree=tree, scheme=scheme, sampling=Sampling(temperature=temp), rule=r,
                                        stop_tokens=())
                fns[r] = sp
            totals = {r: [0, 0] for r in rule_names}  # tokens, target calls over every timed call
            tokens_of = {r: [] for r in rule_names}

            def tally(fn, r):
                def f(i):
                    out = fn(i)
                    if i >= 0:
                        s = out.summary()
                        totals[r][0] += s["num_tokens"]
                        totals[r][1] += s["target_calls"]
                        tokens_of[r].append(np.asarray(out.tokens).tolist())
                    return out
                return f

            turns, outs = common.interleaved_turns(
                {k: (f if k == "target_only" else tally(f, k)) for k, f in fns.items()}, cfg.repeats)
            sec = common.medians(turns)
            ar_tokens = int(np.asarray(outs["target_only"].lengths).sum())
            ar_tps = ar_tokens / sec["target_only"]
            for r in rule_names:
                last_tokens = outs[r].summary()["num_tokens"]  # of the last timed call, as sec[r] is per call
                tps = last_tokens / sec[r]
                row = {"tree": spec, "temperature": temp, "scheme": scheme, "rule": r,
                       "tau": totals[r][0] / max(totals[r][1], 1), "num_tokens": totals[r][0],
                       "target_calls": totals[r][1], "tokens_per_s": tps, "target_only_tokens_per_s": ar_tps,
                       "speedup": tps / ar_tps,
                       "speedup_turn_range": [x * last_tokens / ar_tokens
                                              for x in common.turn_range(turns["target_only"], turns[r])],
                       "seconds_per_call": sec[r],
                       "same_tokens": tokens_of[r] == tokens_of[rule_names[0]]}
                rows.append(row)
                common.log(f"rules: generate T={temp:g} {spec:14s} {r:10s} tau {row['tau']:.3f}  "
                           f"{tps:7.1f} tok/s vs {ar_tps:7.1f}  speedup {row['speedup']:.2f}x")
    return rows, prompt


def run(size: str = "quick", *, config: RuleBenchConfig | None = None) -> dict:
    """Measure everything of ``CONFIGS[size]`` (or of ``config``); returns the report."""
    cfg = CONFIGS[common.check_size(size)] if config is None else config
    for spec, rule_names in cfg.generate:  # before any measurement: an unsupported pair fails at once
        tree = parse_tree(spec)
        for r in rule_names:
            for temp in cfg.temperatures:
                rules_mod.check_rule(r, sibling_scheme(tree, temp), tree)
    exact = _exact_rows(cfg)
    sampled = _sampled_rows(cfg)
    generated, prompt = _generate_rows(cfg) if cfg.generate else ([], [])
    report = {
        "benchmark": NAME, "size": size, "quick": size != "full", "machine": common.machine_info(),
        "config": dataclasses.asdict(cfg), "tables": "jaxspec.exactness.rule_laws.random_tables(seed, V), "
        "context token 0", "prompt_len": len(prompt) or None,
        "exact": exact, "sampled": sampled, "generate": generated,
    }
    report["headline"] = headline(report)
    return report


def headline(report: dict) -> dict:
    """Exact gain of block on a 4-node chain (``None`` when not enumerated), and per rule the
    tau and speedup of chain:4 at temperature 1 (the last temperature measured)."""
    chain4 = next((r for r in report["exact"] if r["tree"] == HEADLINE_TREE), None)
    temps = sorted({r["temperature"] for r in report["generate"]})
    temp = 1.0 if 1.0 in temps or not temps else temps[-1]
    rows = [r for r in report["generate"] if r["tree"] == HEADLINE_TREE and r["temperature"] == temp]
    return {"block_gain_chain4": None if chain4 is None else chain4["gain"],
            "block_tokens_chain4": None if chain4 is None else chain4["rules"]["block"],
            "token_tokens_chain4": None if chain4 is None else chain4["rules"]["token"],
            "headline_temperature": temp,
            "rule_tau_t1": {r["rule"]: r["tau"] for r in rows},
            "rule_speedup_t1": {r["rule"]: r["speedup"] for r in rows}}


def table(report: dict) -> str:
    """Markdown: the exact and sampled expectations, then the generate rows."""
    lines = ["| tree | N | V | token | block / traversal | gain |", "|---|---|---|---|---|---|"]
    for r in report["exact"]:
        lines.append(f"| {r['tree']} | {r['num_nodes']} | {r['vocab']} | {r['rules']['token']:.4f} | "
                     f"{r['rules'][r['against']]:.4f} ({r['against']}) | {r['gain']:+.4f} |")
    for r in report["sampled"]:
        lines.append(f"| {r['tree']} (sampled, {r['rounds']} rounds) | {r['num_nodes']} | {r['vocab']} | "
                     f"{r['mean']['token']:.4f} | {r['mean']['traversal']:.4f} (traversal) | "
                     f"{r['gain']:+.4f} ± {r['gain_stderr']:.4f} |")
    lines += ["", "| T | tree | rule | tau | tokens/s vs target-only | speedup [turns] |", "|---|---|---|---|---|---|"]
    for r in report["generate"]:
        lo, hi = r["speedup_turn_range"]
        lines.append(f"| {r['temperature']:g} | {r['tree']} | {r['rule']} | {r['tau']:.3f} | "
                     f"{r['tokens_per_s']:.0f} vs {r['target_only_tokens_per_s']:.0f} | "
                     f"{r['speedup']:.2f}× [{lo:.2f}–{hi:.2f}] |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Left: expected tokens per round against the number of draft nodes (exact: lines and
    markers; sampled: open markers with 2-SE bars). Right: measured speedup per rule."""
    plt = common.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.6))
    chains = [r for r in report["exact"] if r["kind"] == "chain"]
    if chains:
        n = [r["num_nodes"] for r in chains]
        ax.plot(n, [r["rules"]["token"] for r in chains], "o-", color="C0", label=f"token, chains (V={chains[0]['vocab']})")
        ax.plot(n, [r["rules"]["block"] for r in chains], "s-", color="C1", label="block, chains")
    trees = [r for r in report["exact"] if r["kind"] == "tree"]
    for i, r in enumerate(trees):
        kw = {"label": f"token / traversal, trees (exact, V={r['vocab']})"} if i == 0 else {}
        ax.plot([r["num_nodes"]] * 2, [r["rules"]["token"], r["rules"]["traversal"]], "-", color="0.6", lw=0.8)
        ax.plot(r["num_nodes"], r["rules"]["token"], "o", color="C0", ms=4)
        ax.plot(r["num_nodes"], r["rules"]["traversal"], "^", color="C2", **kw)
        ax.annotate(r["tree"].replace("branch:", ""), (r["num_nodes"], r["rules"]["traversal"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    for i, r in enumerate(report["sampled"]):
        kw = {"label": f"token / traversal, trees (sampled, V={r['vocab']})"} if i == 0 else {}
        ax.errorbar([r["num_nodes"]] * 2, [r["mean"]["token"], r["mean"]["traversal"]],
                    yerr=[2 * r["stderr"]["token"], 2 * r["stderr"]["traversal"]], fmt="none", ecolor="0.4")
        ax.plot(r["num_nodes"], r["mean"]["token"], "o", mfc="none", color="C0")
        ax.plot(r["num_nodes"], r["mean"]["traversal"], "^", mfc="none", color="C2", **kw)
        ax.annotate(r["tree"].replace("branch:", ""), (r["num_nodes"], r["mean"]["traversal"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("draft nodes N")
    ax.set_ylabel("expected tokens per round")
    ax.set_title("expected tokens per round on random bigram tables")
    ax.legend(fontsize=8)
    rows = report["generate"]
    labels = list(dict.fromkeys((r["tree"], r["temperature"]) for r in rows))
    rule_names = list(dict.fromkeys(r["rule"] for r in rows))
    width = 0.8 / max(len(rule_names), 1)
    for j, rule in enumerate(rule_names):
        xs, ys, errs, taus = [], [], [], []
        for i, lab in enumerate(labels):
            r = next((r for r in rows if (r["tree"], r["temperature"]) == lab and r["rule"] == rule), None)
            if r is not None:
                xs.append(i + (j - (len(rule_names) - 1) / 2) * width)
                ys.append(r["speedup"])
                errs.append(r["speedup_turn_range"])
                taus.append(r["tau"])
        bx.bar(xs, ys, width, yerr=common.whiskers(ys, errs), capsize=2, label=rule, color=f"C{j}")
        for x, y, tau in zip(xs, ys, taus):
            bx.text(x, y * 1.02, f"{tau:.2f}", ha="center", va="bottom", fontsize=7, rotation=90)
    bx.axhline(1.0, color="k", lw=0.8)
    bx.set_xticks(range(len(labels)), [f"{t}\nT={temp:g}" for t, temp in labels], fontsize=8)
    bx.set_ylabel("speedup vs target-only (labels: tau)")
    bx.set_title(f"generate, default pair, batch 1 ({report['machine']['backend']}, {report['size']})")
    if rows:
        bx.legend(fontsize=8)
    else:
        bx.text(0.5, 0.5, "generate not run", ha="center", va="center", transform=bx.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
