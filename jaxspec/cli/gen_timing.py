"""How ``jaxspec generate`` times and reports its modes: the streaming printer, the timed
side-by-side turns of ``--compare`` and ``--tree auto``'s check, and their JSON entries."""

from __future__ import annotations

import statistics
import sys
import time

__all__ = ["Stream", "time_modes", "row_tokens", "comparison", "comparison_line", "check_auto_choice",
           "auto_summary"]


class Stream:
    """The ``on_round`` function: prints row 0's new text as each round completes.

    Decodes everything emitted so far and prints the part not yet printed (works for any
    tokenizer); a trailing replacement character (an incomplete UTF-8 sequence) is held
    back until the next round completes it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.enabled = False
        self.printed = ""

    def __call__(self, tokens, lengths):
        if not self.enabled:
            return
        import numpy as np

        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        text = self.tokenizer.decode(tokens[0, : int(lengths[0])].tolist())
        text = text.rstrip("\ufffd")
        if text.startswith(self.printed):
            sys.stdout.write(text[len(self.printed) :])
            sys.stdout.flush()
            self.printed = text

    def finish(self, text: str) -> None:
        rest = text[len(self.printed) :] if text.startswith(self.printed) else ""
        sys.stdout.write(rest + "\n")
        sys.stdout.flush()
        self.enabled = False


def time_modes(fns: dict, turns: int):
    """Time the modes side by side, as the benchmarks do
    (:func:`jaxspec.bench.common.interleaved_turns`): one untimed first call each (it
    compiles), then ``turns`` turns in which every mode runs once, each call ended by
    ``block_until_ready``. ``fns`` maps a name to a function of no argument.

    Returns ``({name: [wall seconds per turn]}, {name: output of its last call},
    {name: wall seconds of its first call, compilation included})``.
    """
    import jax

    from jaxspec.bench.common import interleaved_turns

    firsts = {}

    def timed(name, fn):
        def call(i):
            if i >= 0:
                return fn()
            t0 = time.perf_counter()  # the warm-up call: timed here, with its compilation
            out = jax.block_until_ready(fn())
            firsts[name] = time.perf_counter() - t0
            return out

        return call

    times, outs = interleaved_turns({k: timed(k, f) for k, f in fns.items()}, turns)
    return times, outs, firsts


def row_tokens(out) -> list[int]:
    import numpy as np

    return np.asarray(out.tokens)[0, : int(np.asarray(out.lengths)[0])].tolist()


def comparison(times: dict, outs: dict, firsts: dict, turns: int, temperature: float) -> dict:
    """The ``"compare"`` entry of ``--json``: each mode's figures (median seconds of the
    timed turns, tokens/s from it), the ratio of tokens/s, its range over single turns,
    and whether both modes emitted the same tokens (expected at temperature 0 only)."""
    modes = {}
    for name in ("speculative", "target_only"):
        s = outs[name].summary()
        sec = statistics.median(times[name])
        modes[name] = {
            "num_tokens": s["num_tokens"],
            "tokens_per_second": s["num_tokens"] / sec if sec > 0 else None,
            "seconds": sec,
            "seconds_turns": list(times[name]),
            "seconds_with_compile": firsts[name],
            "tokens_per_target_call": s["tokens_per_target_call"],
            "rounds": s["rounds"],
        }
    sp, tg = modes["speculative"], modes["target_only"]
    ratio = (sp["tokens_per_second"] / tg["tokens_per_second"]
             if sp["tokens_per_second"] and tg["tokens_per_second"] else None)
    per_turn = [(sp["num_tokens"] / a) / (tg["num_tokens"] / b)
                for a, b in zip(times["speculative"], times["target_only"], strict=True) if a > 0 and b > 0]
    return {
        "turns": turns,
        **modes,
        "speedup": ratio,  # speculative tokens/s over target-only tokens/s
        "speedup_turn_range": [min(per_turn), max(per_turn)] if per_turn else None,
        "same_tokens": row_tokens(outs["speculative"]) == row_tokens(outs["target_only"]),
        "same_tokens_expected": temperature == 0,
    }


def comparison_line(c: dict) -> str:
    """``speculative X tok/s vs target-only Y tok/s (Z×); same tokens: yes``."""
    def rate(mode):
        tps = c[mode]["tokens_per_second"]
        return "n/a" if tps is None else f"{tps:.1f}"

    ratio = c["speedup"]
    line = f"speculative {rate('speculative')} tok/s vs target-only {rate('target_only')} tok/s ("
    line += "n/a)" if ratio is None else f"{ratio:.2f}×" + ("; speculative is slower here)" if ratio < 1 else ")")
    if c["same_tokens"]:
        same = "yes"
    elif c["same_tokens_expected"]:
        same = "NO, expected yes at temperature 0 (both are greedy decoding of the target)"
    else:
        same = "no (expected at temperature > 0: the same law, other draws)"
    return f"{line}; same tokens: {same}"


def check_auto_choice(res, c: dict) -> bool:
    """Report on stderr how the ``--tree auto`` pick fared against target-only in the
    timed comparison; True (fall back to target-only) where it was slower."""
    slower = c["speedup"] is None or c["speedup"] < 1.0
    measured = "n/a" if c["speedup"] is None else f"{c['speedup']:.2f}×"
    if slower:
        print(f"-- --tree auto: speculative decoding with the picked tree is slower than target-only here "
              f"(measured {measured}, predicted {res.predicted_speedup:.2f}×): falling back to target-only "
              "decoding", file=sys.stderr)
    else:
        print(f"-- --tree auto: the picked tree beats target-only here (measured {measured}, predicted "
              f"{res.predicted_speedup:.2f}×): generating with it", file=sys.stderr)
    return slower


def auto_summary(res, comparison: dict | None = None, fell_back: bool = False) -> dict:
    """The ``"auto_tree"`` entry of ``--json``: the prediction, the table, and what the
    check against target-only measured (``measured_speedup``) and chose (``chosen``:
    ``"tree"`` or ``"target-only"``)."""
    return {
        "chosen": "target-only" if fell_back else "tree",
        "fallback": fell_back,
        "measured_speedup": None if comparison is None else comparison["speedup"],
        "measured_tokens_per_second": None if comparison is None else {
            k: comparison[k]["tokens_per_second"] for k in ("speculative", "target_only")},
        "parents": list(res.parents),
        "budget": res.budget,
        "depth": res.depth,
        "predicted_tau": res.predicted_tau,
        "predicted_speedup": res.predicted_speedup,
        "predicted_tokens_per_second": res.tokens_per_s,
        "target_step_seconds": res.target_step_s,
        "acceptance": list(res.acceptance),
        "from_cache": res.from_cache,
        "cache_path": res.cache_path,
        "table": [
            {"budget": r.budget, "depth": r.depth, "rule": r.rule, "predicted_tau": r.predicted_tau,
             "verify_seconds": r.verify_s, "round_seconds": r.round_s,
             "predicted_tokens_per_second": r.tokens_per_s, "predicted_speedup": r.speedup}
            for r in res.rows
        ],
    }
