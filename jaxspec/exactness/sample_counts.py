"""Counts of a compiled decoder's samples, streamed in blocks and sharded over devices: the
sampling side of :func:`jaxspec.exactness.verify`.

Samples come in *blocks* of ``chunk`` rows; block ``g`` of a run uses the key
``fold_in(run_key, g)``. Each step runs one block per device under ``shard_map`` over a
1-D mesh ``("chains",)``; every block is reduced on its device to integer counts (joint
cells, per-position tokens, accepted nodes per depth) and ``psum``-ed, so host memory is
flat in the number of samples and a block's computation has the same shapes on any number
of devices: the counts are a function of ``(run_key, chunk)`` only, identical on 1 and on 8
devices (idle devices of the last step get empty blocks). Rows past the sample count in
the last block are masked out. Multi-host: block indices and replicated inputs are built
with ``jax.make_array_from_callback``.

On a ``(data, model)`` mesh (:mod:`jaxspec.nn.sharding`), blocks go over ``data``, which
``shard_map`` makes manual, while ``model`` stays automatic: the models' parameters and
KV caches are split over it as in :func:`jaxspec.generate`, and XLA partitions each
block's forwards. The counts then depend on the model split only through the last bits
of its sums (see :mod:`jaxspec.nn.sharding`).
"""

from __future__ import annotations

import functools
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.decode.generate import store_text
from jaxspec.decode.program_store import StoredFunction, library_function_name, static_text
from jaxspec.nn.sharding import put

__all__ = ["count_samples", "finish_timings", "lookup_cells", "row_pair_depth", "MAX_PAIR_CELLS"]

_AXIS = "chains"

#: the most cells of a row-pair table (pairs of prefix cells, the outside cell included)
MAX_PAIR_CELLS = 1 << 16


def row_pair_depth(level_sizes) -> int:
    """How many first tokens the row-pair counts look at: the deepest ``k`` whose prefix
    cells (``level_sizes[k - 1]`` of them, plus one outside) fit a pair table of at most
    :data:`MAX_PAIR_CELLS` cells; 0 when not even the first token's do."""
    k = 0
    for i, n in enumerate(level_sizes):
        if (int(n) + 1) ** 2 <= MAX_PAIR_CELLS:
            k = i + 1
    return k


def _row_pairs(y, levels, valid, first: int):
    """int32[(n_k + 1)**2]: counts of (cell of row ``first + 2j``, cell of row ``first + 2j +
    1``) over a block's disjoint pairs of neighbouring rows, cells of the first ``k`` tokens
    (:func:`row_pair_depth`; ``n_k`` = outside the support), both rows valid."""
    k = row_pair_depth([par.shape[0] for par, _ in levels])
    n_k = levels[k - 1][0].shape[0]
    cell = lookup_cells(y[:, :k], levels[:k], n_k)  # [chunk]
    m = (y.shape[0] - first) // 2
    a, b = cell[first:first + 2 * m:2], cell[first + 1:first + 2 * m:2]
    ok = valid[first:first + 2 * m:2] * valid[first + 1:first + 2 * m:2]
    return jnp.zeros(((n_k + 1) ** 2,), jnp.int32).at[a * (n_k + 1) + b].add(ok)


def lookup_cells(y, levels, num_cells: int):
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


def _block_mesh(devices: tuple, mesh: Mesh | None) -> tuple[Mesh, str]:
    """(the mesh, its axis of blocks): a 1-D ``("chains",)`` mesh of ``devices``, or the
    ``data`` axis of a ``(data, model)`` mesh."""
    if mesh is None:
        return Mesh(np.asarray(devices, dtype=object), (_AXIS,)), _AXIS
    return mesh, "data"


@functools.lru_cache(maxsize=32)
def _step_fn(kind: str, cfg, impl, devices: tuple, mesh: Mesh | None, chunk: int, prompt: tuple, horizon: int,
             vocab: int, width: int, keep_tokens: bool = False, levels_shape: tuple | None = None):
    """jit(shard_map): one block of ``chunk`` rows per device (per ``data`` index of a
    mesh) -> psum-ed integer counts, and with ``keep_tokens`` (no enumerated law: no joint
    cells) the block's tokens ``samples`` int32[chunk, L] per device, gathered over the
    axis. The prompt is right-padded with 0 to ``width`` columns, as
    :func:`jaxspec.generate` pads it to a prompt bucket."""
    text = _store_text(kind, cfg, impl, devices, mesh, chunk, prompt, horizon, vocab, width, keep_tokens,
                       levels_shape)
    mesh, axis = _block_mesh(devices, mesh)
    t = len(prompt)
    padded = np.zeros((width,), np.int32)
    padded[:t] = prompt

    def local(states, key_data, block, n_valid, temps, levels):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), block[0])
        tokens = jnp.broadcast_to(jnp.asarray(padded), (chunk, width))
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
            if keep_tokens:
                out["samples"] = y
            else:
                num_cells = levels[-1][0].shape[0]
                cell = lookup_cells(y, levels, num_cells)
                out["joint"] = jnp.zeros((num_cells + 1,), jnp.int32).at[cell].add(valid)
                if kind == "spec" and row_pair_depth([par.shape[0] for par, _ in levels]) > 0:
                    # rows 2j, 2j + 1 and rows 2j + 1, 2j + 2 of one batched call: the row-independence tests
                    out["pairs_even"] = _row_pairs(y, levels, valid, 0)
                    out["pairs_odd"] = _row_pairs(y, levels, valid, 1)
            pos = jnp.broadcast_to(jnp.arange(horizon, dtype=jnp.int32), y.shape)
            out["marginals"] = jnp.zeros((horizon, vocab), jnp.int32).at[pos, jnp.clip(y, 0, vocab - 1)].add(
                valid[:, None])
        if kind != "ar":
            out["accepted"] = jnp.sum(res.accepted_per_depth * valid[:, None], axis=0)
            out["rounds"] = jnp.sum(res.rounds * valid)
            out["tokens"] = jnp.sum(res.lengths * valid)
        return {k: (v if k == "samples" else jax.lax.psum(v, axis)) for k, v in out.items()}

    pairs = (kind == "spec" and not keep_tokens and levels_shape is not None
             and row_pair_depth(levels_shape) > 0)
    names = (["samples" if keep_tokens else "joint", "marginals"] if kind != "first" else []) + (
        ["accepted", "rounds", "tokens"] if kind != "ar" else []) + (["pairs_even", "pairs_odd"] if pairs else [])
    out_specs = {k: (P(axis) if k == "samples" else P()) for k in names}  # samples: [devices * chunk, L]
    f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(axis), P(axis), P(), P()), out_specs=out_specs,
                      axis_names={axis}, check_vma=False)
    return StoredFunction(f, f"verify_{kind}_block", text), mesh, axis


def _store_text(kind, cfg, impl, devices: tuple, mesh: Mesh | None, *sizes) -> str | None:
    """The program store's key text for one block's program (the command line's second
    ``jaxspec verify`` then loads it instead of tracing it), or ``None`` where it is never
    stored: several devices or a mesh (the exported program would carry their layout),
    round parts that are not the library's (:func:`jaxspec.decode.generate.store_text`),
    or a program function that is not jaxspec's own."""
    if mesh is not None or len(devices) != 1:
        return None
    cfg_text, impl_name = store_text(cfg), library_function_name(impl)
    if cfg_text is None or impl_name is None:
        return None
    return static_text((kind, impl_name, cfg_text, *sizes))


def count_samples(kind: str, cfg, impl, states, temps, key, prompt, horizon, vocab, levels, num_samples: int,
                  chunk: int, devices, progress: bool, desc: str, mesh: Mesh | None = None,
                  width: int | None = None) -> tuple[dict, dict]:
    """Run ``impl(cfg, *states, ...)`` (a program of :mod:`jaxspec.decode.generate`:
    ``speculative_program``, a mutant's through ``cfg.parts``, or ``autoregressive_program``)
    on ``num_samples`` copies of ``prompt`` and sum the counts of its
    ``ceil(num_samples / chunk)`` blocks, ``len(devices)`` blocks per step.

    ``kind``: ``"spec"`` (speculative: ``joint`` cells of the first ``horizon`` tokens by
    :func:`lookup_cells` over ``levels``, per-position ``marginals``, ``accepted`` per
    depth, ``rounds``, ``tokens``), ``"ar"`` (target-only: ``joint``, ``marginals``) or
    ``"first"`` (one round: ``accepted``, ``rounds``, ``tokens``); ``"spec"`` also counts
    ``pairs_even`` and ``pairs_odd``, the cells of neighbouring rows of one batched call
    (:func:`_row_pairs`), for the row-independence tests. With ``levels=None``
    (no enumerated law) ``"spec"`` and ``"ar"`` return the tokens themselves instead of
    joint cells: ``samples`` int32[num_samples, horizon], rows in block order.
    With ``mesh`` (a ``(data, model)`` mesh; ``devices`` is then unused), blocks run over
    its ``data`` axis and ``states`` must already be placed on it
    (:func:`jaxspec.nn.sharding.shard_state`), as ``cfg.mesh`` expects. ``width``: the
    padded prompt width ``cfg`` was built for (default ``len(prompt)``).
    Returns (int64 counts by name, {"compile_s", "total_s"})."""
    n_dev = len(devices) if mesh is None else int(mesh.shape["data"])
    if not 1 <= chunk < 2**31:
        raise ValueError(f"chunk_size = {chunk}: expected an integer in [1, 2**31) (rows are int32-indexed)")
    num_blocks = -(-num_samples // chunk)
    if num_blocks + n_dev > 2**31:  # block indices are int32; past that, blocks would repeat keys
        raise ValueError(
            f"num_samples = {num_samples}: {num_blocks} blocks of chunk_size {chunk}; expected at most "
            f"{2**31 - n_dev} blocks (an int32 block index): use fewer samples or a larger chunk_size"
        )
    keep = levels is None
    fn, mesh_, axis = _step_fn(kind, cfg, impl, tuple(devices) if mesh is None else (), mesh, chunk,
                               tuple(prompt), horizon, vocab, len(prompt) if width is None else int(width), keep,
                               None if keep else tuple(int(p.shape[0]) for p, _ in levels))
    rep = NamedSharding(mesh_, P())
    sharded = NamedSharding(mesh_, P(axis))
    if mesh is None:
        states = jax.tree.map(lambda a: put(a, rep), states)
    key_data = put(np.asarray(jax.random.key_data(key)), rep)
    temps = put(np.asarray(temps, np.float32), rep)
    levels = jax.tree.map(lambda a: put(a, rep), levels)
    num_steps = -(-num_blocks // n_dev)
    totals: dict | None = None
    pending = None
    bar = _progress_bar(num_samples, desc, progress)

    rows = []  # with keep: each step's valid token rows, int32[n, L]

    def collect(out, n_valid):
        nonlocal totals
        if keep:
            y = np.asarray(out.pop("samples")).reshape(n_dev, chunk, horizon)  # block d = rows of device d
            rows.extend(y[d, :k] for d, k in enumerate(n_valid.tolist()) if k)
        host = {k: np.asarray(v).astype(np.int64) for k, v in out.items()}
        totals = host if totals is None else {k: totals[k] + host[k] for k in totals}
        bar.update(int(n_valid.sum()))

    timing = {"compile_s": 0.0}
    t_all = time.perf_counter()
    for s in range(num_steps):
        blocks = np.arange(s * n_dev, (s + 1) * n_dev, dtype=np.int32)
        n_valid = np.clip(num_samples - blocks.astype(np.int64) * chunk, 0, chunk).astype(np.int32)
        t0 = time.perf_counter()
        out = fn(states, key_data, put(blocks, sharded), put(n_valid, sharded), temps, levels)
        if s == 0:  # tracing and compilation happen in the first (blocking) dispatch
            timing["compile_s"] = time.perf_counter() - t0
            t_run = time.perf_counter()
        if pending is not None:
            collect(*pending)
            if s == 1 and progress and num_steps > 2:
                # the first block's run time (its counts just arrived) times the blocks left:
                # at a few hundred samples/s the bar alone would sit at 0 % for minutes
                per_step = time.perf_counter() - t_run
                bar.write(f"{desc}: about {_duration(per_step * (num_steps - 1))} left "
                          f"({n_dev * chunk / per_step:,.0f} samples/s after compiling in {timing['compile_s']:.0f} s)",
                          file=sys.stderr)
        pending = (out, n_valid)
    collect(*pending)
    bar.close()
    if keep:
        totals["samples"] = np.concatenate(rows).astype(np.int32)
    timing["total_s"] = time.perf_counter() - t_all
    return totals, timing


def finish_timings(timings: dict, num_samples: int) -> dict:
    """A report's timings: each run's samples/s after compiling (from its ``total_s`` and
    ``compile_s``), every figure rounded to milliseconds."""
    for name in ("speculative", "target_only"):
        t = timings[name]
        timings[f"{name}_samples_per_s"] = num_samples / max(t["total_s"] - t["compile_s"], 1e-9)
    return {k: ({a: round(b, 3) for a, b in x.items()} if isinstance(x, dict) else round(float(x), 3))
            for k, x in timings.items()}


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"7.5 min"``, ``"3.2 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _progress_bar(total: int, desc: str, enabled: bool):
    # the text bar, not tqdm.auto: in a notebook without ipywidgets tqdm.auto warns
    # "IProgress not found" into the stored outputs
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="samples", unit_scale=True, disable=not enabled, file=sys.stderr,
                leave=False)
