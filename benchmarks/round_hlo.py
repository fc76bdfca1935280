"""The compiled speculative program of two or more checkouts, compared without timing it: for the
embedded pair (default-target + default-draft), on held-out prompts, it builds the program
that ``jaxspec.generate`` compiles (through the checkout's own ``generate``, its compiled
function intercepted and lowered with jax's AOT API, ``.lower(...).compile()``) and reports
``compiled.cost_analysis()`` (flops, bytes accessed), counts of the optimised HLO's
operations (while loops, conditionals, gathers, scatters, sorts, custom calls, RNG bit
generators, copies, ...), the while loops' carried bytes, and how many instructions differ
from the first checkout's program once names and source metadata are taken out, each
checkout in its own process.

    git worktree add /tmp/pre_d05 d05255e^
    git worktree add /tmp/at_d05 d05255e
    python benchmarks/round_hlo.py /tmp/pre_d05 /tmp/at_d05 . --batch 8 --temperature 1 \\
        --out benchmarks/results/round_hlo_51.json
    # the same through 8 rows of continuous batching (64 prompts), and with the feature head
    python benchmarks/round_hlo.py /tmp/pre_d05 . --prompts 64 --batch 8 \\
        --out benchmarks/results/round_hlo_51_queue.json
    python benchmarks/round_hlo.py /tmp/pre_d05 . --draft default-head --out benchmarks/results/round_hlo_51_head.json

A static comparison: it measures what the compiler is given and what it makes of it, never
how fast it runs (no program is executed).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# optimised-HLO opcodes counted (a line ``%name = shape opcode(...)``; fusions' bodies too)
OPS = ("while", "conditional", "gather", "scatter", "sort", "custom-call", "rng-bit-generator", "rng",
       "copy", "dynamic-slice", "dynamic-update-slice", "dot", "convolution", "reduce", "broadcast",
       "iota", "select", "fusion", "call", "all-reduce", "transpose", "concatenate", "pad")
_SHAPE_RE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}


def shape_bytes(text: str) -> int:
    """Bytes of every array shape written in ``text`` (an HLO tuple shape)."""
    total = 0
    for dtype, dims in _SHAPE_RE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dtype]
    return total


def instruction(line: str) -> tuple[str, str] | None:
    """``(shape, opcode)`` of an HLO instruction line ``[ROOT] %name = SHAPE OPCODE(...)``
    (a tuple shape is parenthesised, and may nest), or None for any other line."""
    head, eq, rest = line.partition(" = ")
    if not eq or not head.strip().lstrip("ROOT ").startswith("%"):
        return None
    rest = rest.lstrip()
    if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
        shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = rest.split("(", 1)[0]
    return (shape, op) if re.fullmatch(r"[a-z][a-z0-9-]*", op) else None


def hlo_stats(text: str) -> dict:
    """Opcode counts of an optimised HLO module's text, and each ``while``'s carry (the
    bytes and number of arrays of its tuple shape)."""
    counts = dict.fromkeys(OPS, 0)
    loops = []
    for line in text.splitlines():
        ins = instruction(line)
        if ins is None:
            continue
        shape, op = ins
        if op in counts:
            counts[op] += 1
        if op == "while":
            loops.append({"carry_bytes": shape_bytes(shape), "carry_arrays": len(_SHAPE_RE.findall(shape))})
    return {"ops": counts, "while_loops": loops, "hlo_lines": text.count("\n")}


def normalized_instructions(text: str) -> collections.Counter:
    """The instructions of an HLO module's text as a multiset, with what does not change
    the program taken out: instruction and operand names (``%fusion.12``), ``metadata``
    (source lines and op names), ``ROOT``."""
    out = collections.Counter()
    for line in text.splitlines():
        if instruction(line) is None:
            continue
        line = re.sub(r",?\s*metadata=\{[^{}]*\}", "", line)
        line = re.sub(r"%[\w.\-]+", "%", line)
        out[re.sub(r"\bROOT\s+", "", line).strip()] += 1
    return out


def probe(batch: int, temperature: float, tree: str, max_new_tokens: int, hlo_file: str | None = None,
          prompts: int | None = None, draft: str = "default-draft") -> dict:
    """In a process with the checkout first on the path: the compiled program of
    ``jaxspec.generate(key, target, draft, prompts, ...)`` for the embedded pair."""
    import jax  # noqa: PLC0415

    import jaxspec  # noqa: PLC0415
    from jaxspec.bench import queue  # noqa: PLC0415
    from jaxspec.decode import generate as gen  # noqa: PLC0415

    seen = []
    real = gen.compiled

    class Capture:
        def __init__(self, cfg):
            self.cfg = cfg

        def __call__(self, *args):
            seen.append((self.cfg, args))
            raise _Captured

    class _Captured(Exception):
        pass

    gen.compiled = Capture
    target = jaxspec.load_model("default-target")
    draft = jaxspec.load_draft(draft)
    # the held-out prompts of the queue benchmark (the first `batch`; with `prompts`, that
    # many through `batch` rows: generate(..., rows=batch))
    prompts, rows = (queue.prompts(batch, None), None) if prompts is None else (queue.prompts(prompts, None), batch)
    kwargs = dict(max_new_tokens=max_new_tokens, tree=tree, rows=rows)
    if "sampling" in gen.generate.__kwdefaults__:  # the one sampling value (issue 36)
        kwargs["sampling"] = jaxspec.Sampling(temperature=temperature)
    else:
        kwargs["temperature"] = temperature
    try:
        gen.generate(jax.random.key(0), target, draft, prompts, **kwargs)
    except _Captured:
        pass
    (cfg, args), = seen
    lowered = real(cfg).lower(*args)
    comp = lowered.compile()
    if hlo_file:
        pathlib.Path(hlo_file).write_text(comp.as_text())
    cost = comp.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    keep = ("flops", "transcendentals", "bytes accessed", "optimal_seconds")
    return {
        "jax": jax.__version__,
        "jaxspec": jaxspec.__file__,
        "config": {"rows": cfg.rows, "tree": str(cfg.tree), "scheme": cfg.scheme, "capacity": cfg.capacity,
                   "prompt_width": args[3].shape[1], "draft_def": type(cfg.draft_def).__name__,
                   "accept": getattr(getattr(cfg, "accept", None) or getattr(cfg.parts, "accept", None),
                                     "__name__", None)},
        "cost_analysis": {k: float(v) for k, v in cost.items() if k in keep},
        "compiled_hlo": hlo_stats(comp.as_text()),
        "lowered_lines": lowered.as_text().count("\n"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", type=pathlib.Path, nargs="+", help="checkouts to compare")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--tree", default="chain:4")
    ap.add_argument("--prompts", type=int, help="this many held-out prompts through --batch rows (rows=)")
    ap.add_argument("--draft", default="default-draft", help="default-draft or default-head")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--hlo-dir", type=pathlib.Path, help="keep each checkout's optimised HLO here")
    ap.add_argument("--hlo-file", help=argparse.SUPPRESS)  # the child process's
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe(args.batch, args.temperature, args.tree, args.max_new_tokens, args.hlo_file,
                               args.prompts, args.draft)))
        return
    hlo_dir = args.hlo_dir or pathlib.Path(tempfile.mkdtemp(prefix="round_hlo"))
    hlo_dir.mkdir(parents=True, exist_ok=True)
    first = None
    res = {"batch": args.batch, "prompts": args.prompts, "draft": args.draft, "temperature": args.temperature,
           "tree": args.tree,
           "max_new_tokens": args.max_new_tokens, "checkouts": {}}
    for root in args.roots:
        root = root.resolve()
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root)
        name = f"{root.name}@{head.stdout.strip()}"
        print(f"{root} ({head.stdout.strip()}) ...", file=sys.stderr, flush=True)
        hlo_file = (hlo_dir / f"{name}.hlo.txt").resolve()
        extra = ["--hlo-file", str(hlo_file)]
        proc = subprocess.run(
            [sys.executable, str(pathlib.Path(__file__).resolve()), str(root), "--probe", "--batch", str(args.batch),
             "--temperature", str(args.temperature), "--tree", args.tree, "--max-new-tokens",
             str(args.max_new_tokens), "--draft", args.draft, *extra,
             *(["--prompts", str(args.prompts)] if args.prompts else [])],
            capture_output=True, text=True, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), check=False)
        if proc.returncode:
            raise SystemExit(f"{root}: {proc.stderr[-3000:]}")
        res["checkouts"][name] = out = json.loads(proc.stdout.splitlines()[-1])
        ins = normalized_instructions(hlo_file.read_text())
        first = ins if first is None else first
        out["instructions"] = sum(ins.values())
        # against the first checkout: instructions only one of the two has (names and metadata aside)
        out["instructions_differing_from_first"] = sum(((ins - first) + (first - ins)).values())
    text = json.dumps(res, indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
