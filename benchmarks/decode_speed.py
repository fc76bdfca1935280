"""Decoding speed: tree speculative decoding vs target-only sampling, side by side.

For each temperature (0 and 1) and each tree (chains, static trees of several sizes, a
dynamic tree), batch 1, the same models in the same run:

* tokens/s of ``jaxspec.generate`` and of ``jaxspec.generate_autoregressive`` (median of
  several timed calls after a warm-up compile, ``block_until_ready``; the two, and the
  cost measurements below, take turns so that a changing machine load hits all alike),
  and the speedup;
* tau (tokens per target call) and the acceptance rate per depth;
* the measured costs of one target decode step, one draft step and one tree verification
  (each a jitted ``fori_loop`` of forwards divided by its length, so dispatch is not
  counted), and the *ideal* speedup they predict::

      ideal = tau * t_target_step / (draft_forwards_per_round * t_draft_step + t_verify(N + 1))

  The gap between ideal and measured speedup is framework overhead (draws, acceptance,
  cache commits, the loop), also reported per round (``overhead_ms_per_round``).

Models: ``--target``/``--draft`` take a name/folder for ``jaxspec.checkpoint.load_model``
(default: the embedded trained pair ``default-target`` / ``default-draft``, byte-level,
prompted with ``--prompt`` text) or ``random`` (a random target of 4 layers, hidden 256
and a random draft of 1 layer, hidden 64, vocabulary 256, prompted with ``--prompt-len``
random ids -- unrelated random models, so greedy acceptance is low).

    python benchmarks/decode_speed.py [--quick] [--target NAME] [--draft NAME]
        [--prompt TEXT] [--max-new-tokens 128] [--repeats 5] [--out benchmarks/results]

Writes ``decode_speed.json`` and ``decode_speed.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.cache import init_cache
from jaxspec.config import ModelConfig
from jaxspec.masks import tree_cache_mask
from jaxspec.model import Transformer, init_model
from jaxspec.treespec import DynamicTree, parse_tree

# the module itself: once the package re-exports the function ``generate``, the
# attribute ``jaxspec.generate`` is that function
gen = importlib.import_module("jaxspec.generate")

DEFAULT_PROMPT = "The history of the city begins with"
TREES = ["chain:2", "chain:4", "branch:2,2", "branch:3,2,1", "branch:4,2,2,1", "dynamic:depth=4,topk=4,nodes=16"]
QUICK_TREES = ["chain:3", "branch:2,2", "dynamic:depth=3,topk=2,nodes=6"]

RANDOM_TARGET = ModelConfig(
    vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
)
RANDOM_DRAFT = ModelConfig(
    vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
)


def _load(name: str, config: ModelConfig, seed: int) -> Transformer:
    if name == "random":
        return init_model(config, jax.random.key(seed))
    from jaxspec.checkpoint import load_model  # noqa: PLC0415 (optional until models exist)

    return load_model(name)


def _forward_loop(model: Transformer, t: int, capacity: int, prefix: int, loops: int = 16):
    """A zero-argument callable timing ``loops`` forwards of ``t`` new tokens at batch 1
    over a cache holding ``prefix`` tokens, in one jitted ``fori_loop`` (dispatch excluded:
    divide its time by ``loops``)."""
    gdef, state = nnx.split(model)
    cache = init_cache(model.config, 1, capacity).replace(lengths=jnp.asarray([prefix], jnp.int32))
    tm = np.tril(np.ones((t, t), bool))
    tokens = jnp.zeros((1, t), jnp.int32)

    @jax.jit
    def run(state, cache, tokens):
        m = nnx.merge(gdef, state)
        mask = tree_cache_mask(cache.lengths, tm, capacity)
        pos = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]

        def body(i, carry):
            cache, acc = carry
            logits, cache = m(tokens + (i % 2), pos, cache, mask)
            return cache, acc + logits[0, -1, 0]

        return jax.lax.fori_loop(0, loops, body, (cache, jnp.float32(0)))[1]

    return lambda i: run(state, cache, tokens)


def _interleaved(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Median wall seconds of each ``fn(i)``, the functions taking turns (so that a
    changing machine load hits them alike), after one warm-up (compile) call each."""
    for f in fns.values():
        jax.block_until_ready(f(-1))
    times = {k: [] for k in fns}
    outs = {}
    for i in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            outs[k] = jax.block_until_ready(f(i))
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, outs


def run(args) -> dict:
    target = _load(args.target, RANDOM_TARGET, 0)
    draft = _load(args.draft, RANDOM_DRAFT, 1)
    if args.target == "random":
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, target.config.vocab_size, size=(1, args.prompt_len)).astype(np.int32)
    else:
        from jaxspec.tokenizer import ByteTokenizer  # noqa: PLC0415

        prompt = np.asarray([ByteTokenizer().encode(args.prompt, add_bos=True)], np.int32)
    args.prompt_len = prompt.shape[1]
    m = args.max_new_tokens
    trees = QUICK_TREES if args.quick else TREES
    cap = min(args.prompt_len + m + 64 + 1, target.config.max_position_embeddings)
    mid = args.prompt_len + m // 2  # cache fill at which forwards are costed
    loops = 16
    target_step = _forward_loop(target, 1, cap, mid, loops)
    draft_step = _forward_loop(draft, 1, cap, mid, loops)

    results = []
    for temp in (0.0, 1.0):

        def ar(i, temp=temp):
            key = jax.random.key(1000 + i)
            return gen.generate_autoregressive(key, target, prompt, max_new_tokens=m, temperature=temp)

        for name in trees:
            spec = parse_tree(name)
            scheme = "deterministic" if isinstance(spec, DynamicTree) or temp == 0.0 else "without_replacement"
            n = spec.num_nodes
            forwards = spec.depth + (1 if isinstance(spec, DynamicTree) else 0)

            def sp(i, temp=temp, spec=spec, scheme=scheme):
                key = jax.random.key(2000 + i)
                return gen.generate(
                    key, target, draft, prompt, max_new_tokens=m, tree=spec, scheme=scheme, temperature=temp
                )

            fns = {"ar": ar, "spec": sp, "target_step": target_step, "draft_step": draft_step,
                   "verify": _forward_loop(target, n + 1, cap, mid, loops)}
            sec, outs = _interleaved(fns, args.repeats)
            t_target_step, t_draft_step, t_verify = (sec[k] / loops for k in ("target_step", "draft_step", "verify"))
            s = outs["spec"].summary()
            ar_tps = int(np.asarray(outs["ar"].lengths).sum()) / sec["ar"]
            tps = s["tokens"] / sec["spec"]
            ideal = s["tau"] * t_target_step / (forwards * t_draft_step + t_verify)
            row = {
                "temperature": temp,
                "tree": name,
                "scheme": scheme,
                "num_nodes": n,
                "depth": spec.depth,
                "tau": s["tau"],
                "accept_rate_per_depth": s["accept_rate_per_depth"],
                "rounds": s["rounds"],
                "tokens_per_s": tps,
                "target_only_tokens_per_s": ar_tps,
                "speedup": tps / ar_tps,
                "ideal_speedup": ideal,
                "draft_forwards_per_round": forwards,
                "t_target_step_ms": t_target_step * 1e3,
                "t_draft_step_ms": t_draft_step * 1e3,
                "t_verify_ms": t_verify * 1e3,
                "target_only_ms_per_token": sec["ar"] / max(int(np.asarray(outs["ar"].lengths).sum()), 1) * 1e3,
                "seconds_per_call": sec["spec"],
                # wall time per round not explained by the model forwards
                "overhead_ms_per_round": (sec["spec"] / max(s["rounds"], 1) - forwards * t_draft_step - t_verify) * 1e3,
            }
            results.append(row)
            print(
                f"T={temp} {name:34s} {scheme:20s} tau {s['tau']:.3f}  {tps:8.1f} tok/s vs {ar_tps:8.1f}  "
                f"speedup {row['speedup']:.2f}x (ideal {ideal:.2f}x)  step {t_target_step * 1e3:.3f} / draft "
                f"{t_draft_step * 1e3:.3f} / verify {t_verify * 1e3:.3f} ms  "
                f"overhead {row['overhead_ms_per_round']:.3f} ms/round"
            )
    return {
        "benchmark": "decode_speed",
        "device": str(jax.devices()[0]),
        "backend": jax.default_backend(),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "target": args.target if args.target != "random" else RANDOM_TARGET.to_dict(),
        "draft": args.draft if args.draft != "random" else RANDOM_DRAFT.to_dict(),
        "batch": 1,
        "prompt": args.prompt if args.target != "random" else None,
        "prompt_len": args.prompt_len,
        "max_new_tokens": m,
        "repeats": args.repeats,
        "quick": bool(args.quick),
        "results": results,
    }


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in report["results"]})
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4.5), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        rows = [r for r in report["results"] if r["temperature"] == temp]
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["speedup"] for r in rows], 0.4, label="measured speedup")
        ax.bar(x + 0.2, [r["ideal_speedup"] for r in rows], 0.4, label="ideal (from tau and costs)")
        for i, r in enumerate(rows):
            ax.text(i, max(r["speedup"], r["ideal_speedup"]) * 1.02, f"tau {r['tau']:.2f}", ha="center", fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x, [r["tree"].replace("dynamic:", "dyn:") for r in rows], rotation=25, ha="right", fontsize=8)
        ax.set_title(f"temperature {temp:g} ({report['backend']}, batch 1)")
        ax.set_ylabel("speedup vs target-only")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer trees, 32 new tokens, 3 repeats")
    p.add_argument("--target", default="default-target", help="a name/folder for load_model, or 'random'")
    p.add_argument("--draft", default="default-draft", help="a name/folder for load_model, or 'random'")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text (byte-level models)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=32, help="random prompt length (random models)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.max_new_tokens is None:
        args.max_new_tokens = 32 if args.quick else 128
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    report = run(args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_speed.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "decode_speed.png")
    print(f"wrote {out / 'decode_speed.json'} and {out / 'decode_speed.png'}")


if __name__ == "__main__":
    main()
