"""Throughput of the vmapped acceptance rule vs the random-number floor.

For each (N, V) case, tree and scheme: tree-rounds per second of
``jax.vmap(speculative_accept)`` over a batch of independent chains (each with its own
probability rows and tokens), next to the throughput of merely drawing the same random
numbers (the key split, N acceptance uniforms and one residual uniform per round) in the
same run. Prints a table and writes JSON.

    python benchmarks/accept_throughput.py [--quick] [--out benchmarks/results/accept_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.acceptance import SCHEMES, speculative_accept

CASES = [
    # (N, V, batch, {tree name: parents})
    (8, 32, 4096, {"chain": jaxspec.chain(8), "tree(2,3)": jaxspec.branching((2, 3))}),
    (64, 32000, 8, {"chain": jaxspec.chain(64), "tree(4,3,4)": jaxspec.branching((4, 3, 4))}),
]


def _time(fn, *args, repeats: int, min_time: float = 0.2) -> float:
    """Median seconds per call after a warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        calls = 0
        while True:
            jax.block_until_ready(fn(*args))
            calls += 1
            if time.perf_counter() - t0 >= min_time:
                break
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _inputs(n, v, batch, seed=0):
    key = jax.random.key(seed)
    k1, k2, k3 = jax.random.split(key, 3)
    p = jax.nn.softmax(jax.random.normal(k1, (batch, n + 1, v)) * 2.0, axis=-1)
    q = jax.nn.softmax(jax.random.normal(k2, (batch, n + 1, v)) * 2.0, axis=-1)
    toks = jax.random.randint(k3, (batch, n), 0, v, jnp.int32)
    return p, q, toks


def run(quick: bool = False) -> dict:
    rows = []
    for n, v, batch, trees in CASES:
        p, q, toks = _inputs(n, v, batch)
        keys = jax.random.split(jax.random.key(1), batch)

        @jax.jit
        def floor(keys):
            def one(key):
                ka, ke = jax.random.split(key)
                return jnp.sum(jax.random.uniform(ka, (n,))) + jax.random.uniform(ke, ())

            return jax.vmap(one)(keys)

        t_floor = _time(floor, keys, repeats=3 if quick else 7)
        for tree_name, parents in trees.items():
            for scheme in SCHEMES:
                fn = jax.jit(
                    jax.vmap(
                        lambda k, t, pp, qq, s=scheme, par=parents: speculative_accept(
                            k, par, t, pp, qq, scheme=s
                        ).tokens
                    )
                )
                t = _time(fn, keys, toks, p, q, repeats=3 if quick else 7)
                row = dict(
                    N=n,
                    V=v,
                    batch=batch,
                    tree=tree_name,
                    scheme=scheme,
                    accept_rounds_per_s=batch / t,
                    rng_floor_rounds_per_s=batch / t_floor,
                    fraction_of_floor=t_floor / t,
                )
                rows.append(row)
                print(
                    f"N={n:3d} V={v:6d} B={batch:5d} {tree_name:12s} {scheme:20s} "
                    f"{batch / t:14,.0f} rounds/s   floor {batch / t_floor:14,.0f}   "
                    f"{t_floor / t:6.3f} of floor",
                    flush=True,
                )
    return {
        "benchmark": "accept_throughput",
        "device": str(jax.devices()[0]),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "jax": jax.__version__,
        "quick": quick,
        "rows": rows,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "accept_throughput.json"))
    args = ap.parse_args(argv)
    result = run(quick=args.quick)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
