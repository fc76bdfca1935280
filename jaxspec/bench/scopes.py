"""Where a compiled call spends its device time, by :func:`jax.named_scope`.

A round of :func:`jaxspec.generate` runs its steps under named scopes (``propose``,
``verify``, ``accept``, ``commit``, ``emit``; :mod:`jaxspec.decode.round`). This module
runs a jitted function under :func:`jax.profiler.trace`, reads the executed XLA operations
from the trace (the Perfetto JSON the profiler writes), and charges each to the scope its
HLO instruction came from (the ``op_name`` metadata of the compiled module)::

    prof = profile_scopes(jax.jit(f), (x,), ("propose", "verify"))
    prof["seconds"]    # {"propose": ..., "verify": ..., "loop": ..., "outside": ...}
    # nested scopes are joined: with scopes ("propose", "forward"), "propose/forward"
    prof["ops"]        # operations executed per scope

Instructions without a scope of their own (XLA's fused dot kernels carry no metadata) take
the scope of an operand, else of a user (never through a parameter or a tuple, which every
scope shares). Operations of a loop under no listed scope are charged to ``"loop"``, the
rest (e.g. the prefill before the loop) to ``"outside"``.

The profiler costs time per operation, so the seconds are those of the profiled run; use
their *shares* (:func:`shares`) against an unprofiled timing. The trace format is the
profiler's, not a stable API: when nothing in the trace matches the compiled module,
:func:`profile_scopes` raises ``RuntimeError`` instead of returning empty figures.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import tempfile
from collections.abc import Callable, Sequence

import jax

__all__ = ["LOOP", "OUTSIDE", "instruction_scopes", "profile_scopes", "shares"]

LOOP = "loop"
OUTSIDE = "outside"

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERANDS = re.compile(r"%([\w.\-]+)")
_OPCODE = re.compile(r"\b([a-z][\w\-]*)\(")
_PLUMBING = ("parameter", "tuple", "get-tuple-element")
_CONTAINERS = ("while", "conditional", "call")  # their trace events enclose the operations inside


def _scope_of(op_name: str, scopes: Sequence[str]) -> str:
    parts = op_name.split("/")
    inside = [p for p in parts if p in scopes]
    if inside:
        return "/".join(dict.fromkeys(inside))  # nested scopes: "propose/forward"
    return LOOP if "while" in parts else OUTSIDE  # a loop's body or condition runs every iteration


def instruction_scopes(hlo_text: str, scopes: Sequence[str]) -> dict[str, str]:
    """``{instruction name: scope}`` for the compiled HLO module ``hlo_text``
    (``jitted.lower(...).compile().as_text()``): the ``scopes`` in the instruction's
    ``op_name``, outermost first and joined by ``/`` (``"propose/forward"``), else
    ``"loop"`` inside a loop body, else ``"outside"``; an instruction without ``op_name``
    takes its first named operand's scope, else a user's."""
    named: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    plumbing: set[str] = set()  # parameters and tuples: shared by every scope, never a scope's source
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        inst = m.group(1)
        rhs = line.split(" = ", 1)[1].split(", metadata=", 1)[0]
        opcode = _OPCODE.search(rhs)
        if opcode and opcode.group(1) in _PLUMBING:
            plumbing.add(inst)
            continue
        op = _OP_NAME.search(line)
        if op:
            named[inst] = _scope_of(op.group(1), scopes)
        operands[inst] = [o for o in _OPERANDS.findall(rhs) if o != inst]
    users: dict[str, list[str]] = collections.defaultdict(list)
    for inst, ops in operands.items():
        for o in ops:
            users[o].append(inst)
    out = dict(named)
    for _ in range(8):  # chains of unnamed instructions (bitcast -> fusion -> dot) resolve in a few passes
        known = dict(out)  # each pass reads the previous one: the result does not depend on the order
        for inst in operands:
            if inst in known:
                continue
            near = [o for o in operands[inst] if o in known] or [u for u in users.get(inst, ()) if u in known]
            if near:
                out[inst] = known[near[0]]
        if len(out) == len(known):
            break
    return out


def profile_scopes(fn: Callable, args: tuple, scopes: Sequence[str], *, calls: int = 1) -> dict:
    """Run the jitted ``fn(*args)`` (already compiled: call it once before) ``calls`` times
    under the profiler and charge every executed operation to a scope
    (:func:`instruction_scopes`).

    Returns ``{"seconds": {scope: s}, "ops": {scope: count}, "calls": calls,
    "unattributed_seconds": s}``: totals over the calls of the profiled run.
    ``unattributed_seconds`` is time in trace events named like an operation that no scope
    was found for: an instruction of the module nothing named is near, or another program's.
    """
    names = instruction_scopes(fn.lower(*args).compile().as_text(), scopes)
    opts = jax.profiler.ProfileOptions()
    opts.python_tracer_level = 0  # Python frames would crowd the trace and slow the run
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True, profiler_options=opts):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        traces = sorted(pathlib.Path(tmp).rglob("perfetto_trace.json.gz"))
        if not traces:
            raise RuntimeError("profile_scopes: the profiler wrote no perfetto_trace.json.gz")
        with gzip.open(traces[-1]) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    seconds: dict[str, float] = collections.Counter()
    ops: dict[str, int] = collections.Counter()
    unattributed = 0.0
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name = e.get("name", "")
        if name.startswith(_CONTAINERS):
            continue
        scope = names.get(name)
        if scope is None:
            if re.fullmatch(r"[\w\-]+\.\d+", name):
                unattributed += e["dur"] * 1e-6
            continue
        seconds[scope] += e["dur"] * 1e-6
        ops[scope] += 1
    if not seconds:
        raise RuntimeError("profile_scopes: no trace event matched an operation of the compiled module "
                           "(has the profiler's trace format changed?)")
    return {"seconds": dict(seconds), "ops": dict(ops), "calls": calls, "unattributed_seconds": unattributed}


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """Each scope's fraction of the total."""
    total = sum(seconds.values())
    return {k: v / total for k, v in seconds.items()}
