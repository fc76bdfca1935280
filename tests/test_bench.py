"""jaxspec.bench and `jaxspec bench`: each benchmark at its tiny size writes its documented
JSON fields (positive, finite) and a PNG; the CLI prints one JSON object; bad input is a
clean error. Figures at tiny sizes mean nothing; the slow tests run the fuller paths."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.bench import BENCHMARKS, benchmark_module, common, run_benchmark
from jaxspec.cli import main


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _check_files(files, name):
    with open(files["json"]) as f:
        on_disk = json.load(f)
    assert on_disk["benchmark"] == name
    with open(files["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return on_disk


def _check_machine(m):
    for k in ("platform", "processor", "cpu_count", "jax", "backend", "device"):
        assert m[k], k


def test_decode_tiny(tmp_path):
    from jaxspec.bench.decode import ROW_FIELDS

    report, files = run_benchmark("decode", "tiny", tmp_path)
    on_disk = _check_files(files, "decode_speed")
    (row,) = on_disk["results"]
    assert set(ROW_FIELDS) <= set(row)
    for k in ("tau", "tokens_per_s", "target_only_tokens_per_s", "speedup", "ideal_speedup", "t_target_step_ms",
              "t_draft_step_ms", "t_verify_ms", "target_only_ms_per_token", "seconds_per_call", "loop_rounds"):
        assert _positive(row[k]), (k, row[k])
    assert (row["batch"], row["temperature"], row["tree"], row["kind"]) == (1, 0.0, "chain:4", "chain")
    assert 1.0 <= row["tau"] <= 5.0 and row["parents"] == [-1, 0, 1, 2]
    h = on_disk["headline"]
    assert h["decode_speedup"] == pytest.approx(row["speedup"]) and h["tau"] == pytest.approx(row["tau"])
    # the speedup is a ratio of medians over turns, so it lies within the per-turn range
    lo, hi = row["speedup_turn_range"]
    assert 0 < lo <= row["speedup"] * (1 + 1e-9) and row["speedup"] <= hi * (1 + 1e-9)
    tab = benchmark_module("decode").table(report)
    assert "chain:4" in tab and f"[{lo:.2f}–{hi:.2f}]" in tab


def _model_tokens(parents, a) -> float:
    """Tokens per round the positional model predicts for a tree, in plain Python: 1 +
    sum over nodes of the product of a[rank] along the node's root path (a[r] = 0 past
    the measured ranks)."""
    reach, seen = [], {}
    for p in parents:
        r = seen.get(p, 0)
        seen[p] = r + 1
        reach.append((reach[p] if p >= 0 else 1.0) * (a[r] if r < len(a) else 0.0))
    return 1.0 + sum(reach)


def _brute_best_tokens(a, n, max_depth) -> float:
    """max of _model_tokens over every tree of n nodes and depth <= max_depth (n! arrays)."""
    best = 0.0
    for par in itertools.product(*[range(-1, i) for i in range(n)]):
        depth = []
        for p in par:
            depth.append(depth[p] + 1 if p >= 0 else 1)
        if max(depth) <= max_depth:
            best = max(best, _model_tokens(par, a))
    return best


def test_decode_optimized_tree_matches_budget_and_is_the_model_optimum():
    """The benchmark's "optimized" entry: the tree it builds has the budget and depth of
    ``optimized_like``, and its reported predicted tau, and the static tree's, are the
    positional model's values of those parents, the optimized one the best over every
    tree of that budget and depth (brute force). Predictions only: the measured tau of
    the two trees is not compared here (the tiny pair is random; speed is the
    benchmark's business)."""
    from jaxspec.bench import decode
    from jaxspec.core.treespec import parse_tree

    cfg = decode.CONFIGS["tiny"]
    target, draft, _ = decode._models("tiny")
    for temp in (0.0, 1.0):
        acc = decode._acceptance(target, draft, cfg, temp)
        assert len(acc["mean"]) == cfg.max_rank and acc["num_positions"] > 0
        assert all(0.0 <= a <= 1.0 for a in acc["mean"]) and sum(acc["mean"]) <= 1.0 + 1e-6
        opt = decode._optimized(acc, cfg.optimized_like)
        like = parse_tree(cfg.optimized_like)
        spec, label, kind = decode._resolve(decode.OPTIMIZED, opt)
        assert (spec.num_nodes, kind, label) == (like.num_nodes, "optimized", f"optimized({cfg.optimized_like})")
        assert spec.depth <= like.depth and list(spec.parents) == opt["parents"]
        assert opt["expected_tokens"] == pytest.approx(_model_tokens(opt["parents"], acc["mean"]), abs=1e-9)
        assert opt["like_expected_tokens"] == pytest.approx(_model_tokens(like.parents, acc["mean"]), abs=1e-9)
        best = _brute_best_tokens(acc["mean"], like.num_nodes, like.depth)  # 6 nodes: 720 arrays
        assert opt["expected_tokens"] == pytest.approx(best, abs=1e-9), (opt, best)
        assert opt["expected_tokens"] >= opt["like_expected_tokens"] - 1e-12


def test_compile_tiny(tmp_path):
    report, files = run_benchmark("compile", "tiny", tmp_path)
    on_disk = _check_files(files, "compile_time")
    kinds = {r["kind"]: r for r in on_disk["rows"]}
    assert set(kinds) == {"generate_autoregressive", "accept"}
    for r in on_disk["rows"]:
        for k in ("first_call_s", "steady_call_s", "compile_s"):
            assert _positive(r[k]), (k, r)
        assert r["compile_s"] == pytest.approx(r["first_call_s"] - r["steady_call_s"])
        assert r["steady_call_s"] < r["first_call_s"] / 2, r  # the steady calls reuse the compilation
    assert _positive(kinds["accept"]["lower_s"]) and _positive(kinds["accept"]["backend_compile_s"])
    assert _positive(on_disk["headline"]["accept_compile_s"])


def test_rss_readings():
    from jaxspec.bench.harness import peak_rss_mb, rss_mb

    now, peak = rss_mb(), peak_rss_mb()
    assert _positive(now) and _positive(peak) and peak >= now * 0.99


def test_cli_json_tiny(tmp_path, capsys):
    assert main(["bench", "--tiny", "--json", "--only", "accept", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    result = json.loads(out)
    for k in ("accept_rounds_per_s", "rng_floor_rounds_per_s", "decode_speedup", "tau", "machine", "benchmarks"):
        assert k in result, k
    assert _positive(result["accept_rounds_per_s"]) and _positive(result["rng_floor_rounds_per_s"])
    assert result["decode_speedup"] is None and result["tau"] is None  # not run
    assert list(result["benchmarks"]) == ["accept"] and result["size"] == "tiny"
    # the accept benchmark's own report and files
    files = result["benchmarks"]["accept"]["files"]
    assert files == {"json": str(tmp_path / "accept_throughput.json"), "png": str(tmp_path / "accept_throughput.png")}
    on_disk = _check_files(files, "accept_throughput")
    _check_machine(on_disk["machine"])
    assert {r["scheme"] for r in on_disk["rows"]} == {"iid", "without_replacement", "deterministic"}
    for r in on_disk["rows"]:
        for k in ("accept_rounds_per_s", "rng_floor_rounds_per_s", "fraction_of_floor",
                  "read_floor_rounds_per_s", "fraction_of_read_floor",
                  "residual_floor_rounds_per_s", "fraction_of_residual_floor",
                  "residual_floor_fraction_of_rng_floor"):
            assert _positive(r[k]), (k, r)
        assert r["fraction_of_floor"] == pytest.approx(r["accept_rounds_per_s"] / r["rng_floor_rounds_per_s"])
        lo, hi = r["fraction_of_floor_turn_range"]  # one turn in the tiny config: a point
        assert 0 < lo <= hi and lo == pytest.approx(r["fraction_of_floor"]) and hi == pytest.approx(lo)
        lo, hi = r["accept_rounds_per_s_turn_range"]
        assert lo == pytest.approx(r["accept_rounds_per_s"]) and hi == pytest.approx(lo)
        assert r["fraction_of_read_floor"] == pytest.approx(
            r["accept_rounds_per_s"] / r["read_floor_rounds_per_s"])
        assert r["fraction_of_residual_floor"] == pytest.approx(
            r["accept_rounds_per_s"] / r["residual_floor_rounds_per_s"])
        assert r["residual_floor_fraction_of_rng_floor"] == pytest.approx(
            r["residual_floor_rounds_per_s"] / r["rng_floor_rounds_per_s"])
        lo, hi = r["residual_floor_fraction_of_rng_floor_turn_range"]
        assert lo == pytest.approx(r["residual_floor_fraction_of_rng_floor"]) and hi == pytest.approx(lo)
        assert _positive(r["sequential_rounds_per_s"])
        assert r["speedup_vs_sequential"] == pytest.approx(r["accept_rounds_per_s"] / r["sequential_rounds_per_s"])
        lo, hi = r["speedup_vs_sequential_turn_range"]
        assert lo == pytest.approx(r["speedup_vs_sequential"]) and hi == pytest.approx(lo)
    assert on_disk["headline"]["accept_rounds_per_s"] == pytest.approx(result["accept_rounds_per_s"])
    tab = benchmark_module("accept").table(on_disk)
    assert "| 8 | 32 |" in tab and "Speedup over the sequential walk" in tab
    r0 = on_disk["rows"][0]
    assert f"{r0['speedup_vs_sequential']:.2f}×" in tab


@pytest.mark.parametrize("scheme", [pytest.param("iid", marks=pytest.mark.slow), "without_replacement",
                                    pytest.param("deterministic", marks=pytest.mark.slow)])
def test_sequential_walk_is_the_same_rule(scheme):
    """The benchmark's sequential baseline emits the library's tokens for the same keys
    (so its speedup compares two implementations of one rule), on a chain, a wide tree
    and a deep uneven tree, with repeated sibling tokens under iid."""
    from jaxspec.bench.accept import accept_fn, bench_inputs, _sequential_fn

    rng = np.random.default_rng(7)
    for parents in ([-1, 0, 1, 2, 3], [-1, -1, -1, -1, 0, 0], [-1, -1, 0, 0, 0, 2, 2, 5, -1]):
        n, v, b = len(parents), 6, 512
        p, q, toks = bench_inputs(n, v, b, seed=n)
        if scheme != "iid":  # distinct siblings, as the draws produce them
            par = np.asarray(parents)
            t = np.zeros((b, n), np.int32)
            for row in range(b):
                for parent in set(parents):
                    kids = np.flatnonzero(par == parent)
                    t[row, kids] = rng.permutation(v)[: kids.size]
            toks = jnp.asarray(t)
        keys = jax.random.split(jax.random.key(n), b)
        lib = np.asarray(accept_fn(parents, scheme)(keys, toks, p, q))
        seq = np.asarray(_sequential_fn(parents, scheme)(keys, toks, p, q))
        np.testing.assert_array_equal(seq, lib)
        # not a trivial agreement: paths of several lengths were taken
        assert len(np.unique((lib >= 0).sum(axis=1))) >= 3, (parents, scheme)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "nope"], "invalid choice: 'nope'"),
        (["--quick", "--tiny"], "not allowed with argument"),
        (["--only"], "expected at least one argument"),
        (["--frobnicate"], "unrecognized arguments"),
        (["--rule", "nope"], "argument --rule: invalid choice: 'nope'"),
        (["--tiny", "--out", ""], "--out '': expected a folder path, got an empty one"),  # not the default
    ],
)
def test_cli_bad_arguments(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    assert main(["bench", "--tiny", "--only", "accept", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "expected a folder" in err


def test_time_calls_takes_turns():
    order = []

    def traced(name):
        def f(x):
            order.append(name)
            return x + 1
        return f

    times = common.time_calls({"a": (traced("a"), (jnp.ones(2),)), "b": (traced("b"), (jnp.ones(3),))},
                              repeats=3, min_time=0.0)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    assert order == ["a", "b"] * 4  # one warm-up call each, then 3 turns of one call each
    turns = common.time_calls_turns({"a": (traced("a"), (jnp.ones(2),))}, repeats=4, min_time=0.0)
    assert list(turns) == ["a"] and len(turns["a"]) == 4 and all(t > 0 for t in turns["a"])
    ticks = []  # progress: after each warm-up, then after each turn's call
    common.time_calls_turns({"a": (traced("a"), (jnp.ones(2),)), "b": (traced("b"), (jnp.ones(2),))},
                            repeats=2, min_time=0.0, progress=ticks.append)
    assert ticks == ["a", "b"] * 3
    assert common.time_call(traced("c"), jnp.ones(1), repeats=2, min_time=0.0) > 0
    # interleaved: fn(i) with i = -1 (warm-up), then 0, 1, 2 in turns; medians of the turns
    seen = []
    fns = {"x": lambda i: seen.append(("x", i)) or jnp.ones(1), "y": lambda i: seen.append(("y", i)) or jnp.ones(1)}
    per_turn, outs = common.interleaved_turns(fns, 3)
    assert seen == [("x", -1), ("y", -1)] + [(k, i) for i in range(3) for k in ("x", "y")]
    assert set(outs) == {"x", "y"} and all(len(v) == 3 and min(v) > 0 for v in per_turn.values())
    med, _ = common.interleaved(fns, 5)
    assert set(med) == {"x", "y"} and all(t > 0 for t in med.values())
    assert common.medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
    assert common.turn_range([1.0, 4.0, 3.0], [2.0, 2.0, 1.0]) == [0.5, 3.0]
    assert common.whiskers([2.0, 5.0], [[1.5, 3.0], None]) == [[0.5, 0.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="repeats = 0"):
        common.time_calls({"a": (traced("a"), (jnp.ones(1),))}, repeats=0)


def test_markdown_table_and_size_arguments(tmp_path):
    """The scripts' shared table printer and their --quick / --tiny / --out arguments."""
    import argparse  # noqa: PLC0415

    assert common.markdown_table(["a", "b"], [["1", "2"], ["x", "y"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |"
    p = argparse.ArgumentParser()
    resolve = common.size_arguments(p, quick="few", tiny="fewer", out=tmp_path)
    assert resolve(p.parse_args([])) == ("full", tmp_path)
    assert resolve(p.parse_args(["--quick"])) == ("quick", tmp_path / "quick")
    assert resolve(p.parse_args(["--tiny", "--out", str(tmp_path / "o")])) == ("tiny", tmp_path / "o" / "tiny")
    with pytest.raises(SystemExit):  # exclusive
        p.parse_args(["--quick", "--tiny"])


def test_every_benchmark_has_headline_keys():
    """``jaxspec bench --json`` reads each benchmark's headline keys from HEADLINE_KEYS: one
    entry per benchmark, and the queue benchmark's headline has exactly its keys."""
    from jaxspec.bench import queue
    from jaxspec.cli.bench import HEADLINE_KEYS

    assert set(HEADLINE_KEYS) == set(BENCHMARKS)
    report = {"rows": [{"drafter": d, "how": h, "temperature": 1.0, "speedup": 1.5}
                       for d in ("draft", "head") for h in ("batches", "queue")]}
    assert set(queue.headline(report)) == set(HEADLINE_KEYS["queue"])
    from jaxspec.bench import real

    rows = [{"category": c, "temperature": t, "batch": b, "mode": m, "tau": 2.0, "speedup": 1.2, "num_tokens": 10,
             "target_calls": 5, "seconds": 1.0} for c in ("chat", "code") for t in (0.0, 1.0) for b in (1, 8)
            for m in ("target-only", "ngram chain:4")]
    report = {"rows": rows, "config": {"temperatures": (0.0, 1.0), "batches": (1, 8)}}
    report["summary"] = real._summary(rows)
    assert set(real.headline(report)) == set(HEADLINE_KEYS["real"])


def test_bad_names():
    with pytest.raises(ValueError, match="benchmark = 'nope'"):
        benchmark_module("nope")
    with pytest.raises(ValueError, match="size = 'huge'"):
        common.check_size("huge")
    assert set(BENCHMARKS) == {"accept", "decode", "compile", "harness", "rules", "lookup", "head", "queue", "round",
                               "real"}
    from jaxspec.bench import DEFAULT_BENCHMARKS

    assert set(BENCHMARKS) - set(DEFAULT_BENCHMARKS) == {"real"}  # needs a real model: --only real


def test_rules_exact_and_sampled_agree(tmp_path):
    """The rule-gains benchmark without its generate part: the exact expectations are the
    enumeration's, block / traversal never below the token rule, and the library's rules,
    sampled, land within 5 standard errors of the enumerated expectation."""
    from jaxspec.bench import rules as rb  # noqa: PLC0415
    from jaxspec.exactness import rule_laws  # noqa: PLC0415

    cfg = rb.RuleBenchConfig(chain_lengths=(2, 3), chain_vocab=3, exact_trees=("branch:2,1",), tree_vocab=3,
                             sampled_trees=("branch:2,1", "chain:3"), sampled_rounds=1 << 14, generate=(),
                             temperatures=(1.0,), max_new_tokens=8, repeats=1)
    report = rb.run("tiny", config=cfg)
    t, d = rule_laws.random_tables(1, 3)
    assert [r["tree"] for r in report["exact"]] == ["chain:2", "chain:3", "branch:2,1"]
    for r in report["exact"]:
        par = rule_laws.chain(r["num_nodes"]) if r["kind"] == "chain" else (-1, -1, 0, 1)
        scheme = "iid" if r["kind"] == "chain" else "without_replacement"
        assert r["rules"]["token"] == pytest.approx(rule_laws.expected_tokens("token", par, t, d, 0, scheme), abs=1e-12)
        assert r["gain"] > 0  # stochastic drafts: strictly more
    exact_of = {"branch:2,1": report["exact"][2]["rules"],
                "chain:3": {"token": report["exact"][1]["rules"]["token"],
                            "traversal": report["exact"][1]["rules"]["block"]}}  # on a chain traversal is block
    for s in report["sampled"]:
        for rule in ("token", "traversal"):
            assert abs(s["mean"][rule] - exact_of[s["tree"]][rule]) < 5 * s["stderr"][rule], (s["tree"], rule, s)
        assert s["gain_stderr"] > 0
    assert report["generate"] == [] and report["headline"]["block_gain_chain4"] is None
    tab = rb.table(report)
    assert "| chain:3 | 3 | 3 |" in tab and "(sampled, 16384 rounds)" in tab
    files = common.write_report(report, tmp_path, rb.NAME, rb.plot)
    assert pathlib.Path(files["png"]).stat().st_size > 0


def test_rules_refuses_an_unsupported_rule_before_measuring():
    from jaxspec.bench import rules as rb  # noqa: PLC0415

    cfg = dataclasses.replace(rb.CONFIGS["tiny"], generate=(("branch:2,2", ("block",)),))
    with pytest.raises(ValueError, match="rule = 'block': not supported on a branching static tree"):
        rb.run("tiny", config=cfg)


def test_cli_decode_with_a_rule(tmp_path, capsys):
    assert main(["bench", "--tiny", "--json", "--only", "decode", "--rule", "block", "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    files = result["benchmarks"]["decode"]["files"]
    assert files["json"] == str(tmp_path / "decode_speed_block.json")
    on_disk = json.loads(pathlib.Path(files["json"]).read_text())
    assert on_disk["rule"] == "block" and on_disk["skipped"] == [] and _positive(result["tau"])


# ----------------------------------------------------------------------------- slow: fuller paths


@pytest.mark.slow
def test_harness_tiny(tmp_path):
    report, files = run_benchmark("harness", "tiny", tmp_path)
    on_disk = _check_files(files, "harness_memory")
    assert [p["num_samples"] for p in on_disk["points"]] == [512, 1024]
    for p in on_disk["points"]:
        for k in ("peak_rss_mb", "baseline_rss_mb", "growth_mb", "samples_per_s", "target_only_samples_per_s"):
            assert _positive(p[k]), (k, p)
        assert p["blocks"] >= 2 and p["passed"]
    assert _positive(on_disk["headline"]["harness_samples_per_s"])
    # streaming: memory does not grow with the number of samples
    assert on_disk["growth_ratio"] < 1.5


@pytest.mark.slow
def test_decode_every_tree_kind_batch_and_temperature(tmp_path):
    from jaxspec.bench import decode

    cfg = dataclasses.replace(
        decode.CONFIGS["tiny"],
        runs=((1, ("chain:4", decode.OPTIMIZED, "dynamic:depth=2,topk=2,nodes=3")), (8, ("chain:4",))),
        temperatures=(0.0, 1.0),
    )
    report = decode.run("tiny", config=cfg)
    assert len(report["results"]) == 8
    assert {r["kind"] for r in report["results"]} == {"chain", "optimized", "dynamic"}
    assert {(r["batch"], r["temperature"]) for r in report["results"]} == {(1, 0.0), (1, 1.0), (8, 0.0), (8, 1.0)}
    for r in report["results"]:
        assert _positive(r["speedup"]) and _positive(r["tau"])
        assert r["speedup_turn_range"][0] <= r["speedup"] * (1 + 1e-9) <= r["speedup_turn_range"][1] * (1 + 2e-9)
        assert (r["model_tau"] is None) == (r["kind"] == "dynamic")
    assert len(report["prompt_lens"]["8"]) == 8
    assert len(set(report["prompt_lens"]["8"])) == 8  # of different lengths
    decode.plot(report, tmp_path / "d.png")


@pytest.mark.slow
def test_compile_generate_tiny(tmp_path):
    from jaxspec.bench import compile_time

    cfg = dataclasses.replace(compile_time.CONFIGS["tiny"], trees=("chain:4", "dynamic:depth=2,topk=2,nodes=3"))
    report = compile_time.run("tiny", config=cfg)
    assert _positive(report["headline"]["generate_compile_s"])
    assert all(_positive(r["compile_s"]) for r in report["rows"])


def test_compile_process_rows_second_processes_load_the_first_ones_programs():
    """The command line's first and second processes over one fresh cache per store
    (target-only, 4 tokens): with either store, the second process on the same prompt and
    the one on a prompt of another length in the bucket store nothing new; only the first
    store (``$JAXSPEC_PROGRAM_STORE=on``) keeps traced programs; the rows carry what the
    table prints."""
    from jaxspec.bench import compile_time

    on, off = compile_time.STORES
    rows = compile_time.process_rows(4, modes=("target-only",))
    assert [(r["run"], r["store"]) for r in rows] == [
        ("first process", on), ("first process", off), ("second process", on), ("second process", off),
        ("second process, a prompt of another length", on)]
    for store in (on, off):
        entries = [r["cache_entries"] for r in rows if r["store"] == store]
        assert entries[0] > 0 and entries == [entries[0]] * len(entries), (store, entries)
    assert all(_positive(r["seconds_with_compile"]) and _positive(r["process_s"]) for r in rows)
    summary = compile_time.process_summary(rows)
    assert [s["processes"] for s in summary] == [1] * 5
    table = compile_time.table({"rows": [], "process_rows": rows})
    assert "second process, a prompt of another length" in table and off in table


# `slow` (91 s: four verify processes): test_compile_cache's test_a_second_verify_loads_its_block_programs
# checks the same loading, and the target-only rows above the table plumbing
@pytest.mark.slow
def test_compile_process_rows_time_a_second_verify(monkeypatch):
    """The ``verify`` mode: first and second ``jaxspec verify`` processes per store, whose
    first call is the harness's first speculative block; the second stores nothing new."""
    from jaxspec.bench import compile_time

    monkeypatch.setattr(compile_time, "VERIFY_SAMPLES", 500)
    on, off = compile_time.STORES
    rows = compile_time.process_rows(4, modes=("verify",))
    assert [(r["run"], r["store"]) for r in rows] == [
        ("first process", on), ("first process", off), ("second process", on), ("second process", off)]
    assert rows[0]["cache_entries"] == rows[2]["cache_entries"] > rows[1]["cache_entries"] == rows[3]["cache_entries"]
    assert all(_positive(r["seconds_with_compile"]) and r["name"].startswith("jaxspec verify") for r in rows)


def test_default_out_dir_keeps_quick_runs_apart(tmp_path, monkeypatch):
    """From the repository root a full run writes benchmarks/results, a quick or tiny one
    a subfolder of it (a quick run must never overwrite the published full run); elsewhere
    ./bench-results likewise."""
    from jaxspec.bench import common

    monkeypatch.chdir(tmp_path)
    assert common.default_out_dir() == tmp_path / "bench-results"
    assert common.default_out_dir("quick") == tmp_path / "bench-results" / "quick"
    for d in ("benchmarks", "jaxspec"):
        (tmp_path / d).mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    results = tmp_path / "benchmarks" / "results"
    assert common.default_out_dir("full") == results
    assert common.default_out_dir("quick") == results / "quick"
    assert common.default_out_dir("tiny") == results / "tiny"
    with pytest.raises(ValueError):
        common.default_out_dir("huge")
    # the scripts in benchmarks/ pass their own folder: the same subfolder rule
    assert common.default_out_dir("quick", base=tmp_path / "b") == tmp_path / "b" / "quick"
    assert common.default_out_dir(base=tmp_path / "b") == tmp_path / "b"


def test_floors_do_the_work_they_are_named_for():
    """The RNG floor draws the rule's numbers (a key split, N uniforms, one more); the read
    floor adds the sum of the p row picked by the uniforms; the residual floor instead adds
    sum(max(p - u0 q, 0)) over the p and q rows of that node -- checked against numpy
    on the same keys, so a floor that skipped its read would fail."""
    from jaxspec.bench.accept import _floor_fn, bench_inputs, _read_floor_fn, _residual_floor_fn

    n, v, b = 5, 7, 64
    p, q, _ = bench_inputs(n, v, b, seed=3)
    keys = jax.random.split(jax.random.key(11), b)
    rng_part, rows, u0 = [], [], []
    for k in keys:
        ka, ke = jax.random.split(k)
        u = np.asarray(jax.random.uniform(ka, (n,)), np.float64)
        rng_part.append(u.sum() + float(jax.random.uniform(ke, ())))
        rows.append(int((u < 0.5).sum()))
        u0.append(u[0])
    rng_part, rows, u0 = np.array(rng_part), np.array(rows), np.array(u0)
    pn, qn = np.asarray(p, np.float64), np.asarray(q, np.float64)
    idx = np.arange(b)
    np.testing.assert_allclose(np.asarray(_floor_fn(n)(keys)), rng_part, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(_read_floor_fn(n)(keys, p)),
                               rng_part + pn[idx, rows].sum(-1), rtol=1e-5)
    residual = np.maximum(pn[idx, rows] - u0[:, None] * qn[idx, rows], 0.0).sum(-1)
    assert np.mean(pn[idx, rows].sum(-1) - residual) > 0.1  # q's part moves the figures
    np.testing.assert_allclose(np.asarray(_residual_floor_fn(n)(keys, p, q)),
                               rng_part + residual, rtol=1e-5)


@pytest.mark.slow
def test_cli_rules_tiny(tmp_path, capsys):
    assert main(["bench", "--tiny", "--json", "--only", "rules", "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["block_gain_chain4"] > 0 and set(result["rule_tau_t1"]) == {"token", "block"}
    on_disk = json.loads((tmp_path / "rule_gains.json").read_text())
    assert [r["rule"] for r in on_disk["generate"]] == ["token", "block"]
    assert all(_positive(r["tokens_per_s"]) and r["tau"] >= 1.0 for r in on_disk["generate"])


def test_real_modes_refuses_bad_arguments_by_flag(capsys):
    """benchmarks/real_modes.py names the flag and the value before loading any model."""
    mod = _script("real_modes")
    assert mod._mode("runs/x/final chain:2") == ("runs/x/final", "chain:2")
    assert mod._mode("lookup+smollm2-135m-head branch:2,1,1") == ("lookup+smollm2-135m-head", "branch:2,1,1")
    for argv, needle in ((["--mode", "head"], "--mode 'head': expected 'DRAFTER TREE'"),
                         (["--mode", "head chain:1", "--prompts", "9"], "--prompts 9: expected 1 to 8"),
                         (["--mode", "head chain:1", "--quantize", "int4"], "argument --quantize: invalid choice: 'int4'")):
        with pytest.raises(SystemExit) as e:
            mod.main(argv)
        assert e.value.code == 2
        assert needle in capsys.readouterr().err


def test_round_cost_draft_widths_of_a_model_and_of_a_head():
    from jaxspec.bench.round_cost import draft_widths
    from jaxspec.core.treespec import parse_tree

    assert draft_widths(parse_tree("chain:3")) == (2, 1, 1)  # [prev, root], then each level above the deepest
    assert draft_widths(parse_tree("chain:3"), head=True) == (4, 1, 1)  # the head's depth + 1 pending pairs
    assert draft_widths(parse_tree("branch:2,2"), head=True) == (3, 2)


def test_round_cost_with_a_feature_head(monkeypatch):
    """round_cost's rows for a feature head (as benchmarks/smollm2_round.py runs SmolLM2's):
    the head's forward widths, and a round in one-token target forwards split into its
    forwards and the rest."""
    from _tiny import tiny_head
    from jaxspec.bench import round_cost

    target, _ = common.model_pair("tiny")
    monkeypatch.setattr(round_cost.common, "model_pair", lambda kind: (target, tiny_head(target)))
    cfg = dataclasses.replace(round_cost.CONFIGS["tiny"], profile=False)
    report = round_cost.run("tiny", config=cfg)
    (row,) = report["rows"]
    assert row["draft_forwards"] == [3, 1] and row["tree"] == "chain:2"
    assert row["round_steps"] > 0 and row["forwards_steps"] > 0
    assert row["not_forwards_steps"] == pytest.approx(row["round_steps"] - row["forwards_steps"])
    assert "not_forwards_steps_max" in report["headline"]
    assert "round in target steps" in round_cost.table(report)


def test_smollm2_round_refuses_bad_arguments(capsys):
    import importlib.util  # noqa: PLC0415

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "smollm2_round.py"
    spec = importlib.util.spec_from_file_location("smollm2_round", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.main(["--tokens", "1"])
    assert e.value.code == 2 and "--tokens 1 --repeats 5: expected at least 2 tokens" in capsys.readouterr().err


def test_publish_records_the_command_and_writes_both_files(tmp_path, capsys):
    """common.publish, the end of the scripts in benchmarks/: the command in the report, the
    JSON and the plot on disk, the table on stdout."""
    import types  # noqa: PLC0415

    def plot(report, path):
        pathlib.Path(path).write_bytes(b"png")

    module = types.SimpleNamespace(plot=plot, table=lambda report: f"| rows | {len(report['rows'])} |")
    report = {"rows": [1, 2]}
    assert common.publish(report, module, "x.py", ["--tokens", "8"], tmp_path, "x") == 0
    assert json.loads((tmp_path / "x.json").read_text())["command"] == "python benchmarks/x.py --tokens 8"
    assert (tmp_path / "x.png").read_bytes() == b"png"
    assert capsys.readouterr().out == f"| rows | 2 |\nwrote {tmp_path / 'x.json'} and {tmp_path / 'x.png'}\n"


def _script(name: str):
    import importlib.util  # noqa: PLC0415

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_int8_llamacpp_refuses_bad_counts_by_flag(capsys):
    """benchmarks/int8_llamacpp.py names the flag and the value before loading anything."""
    mod = _script("int8_llamacpp")
    for flag in ("--prompts", "--windows", "--repeats"):
        with pytest.raises(SystemExit) as e:
            mod.main([flag, "0"])
        assert e.value.code == 2
        assert f"{flag} = 0: expected an integer >= 1" in capsys.readouterr().err


def test_int8_llamacpp_quality_figures():
    """Its per-position figures (int8_smollm2.law_figures, which int8_variants shares) on literal laws: KL 0 and full agreement against itself; a
    law that moves mass from the argmax shows both, and its perplexity."""
    mod = _script("int8_llamacpp")
    ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]]))
    other = np.log(np.array([[0.3, 0.6, 0.1], [0.1, 0.8, 0.1]]))
    texts = [("t", [5, 0, 1], 0)]  # positions 0 and 1 predict ids 0 and 1
    same = mod.law_figures([ref], [ref], texts)
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-12) and same["greedy_agreement"] == 1.0
    q = mod.law_figures([ref], [other], texts)
    kl0 = 0.7 * np.log(0.7 / 0.3) + 0.2 * np.log(0.2 / 0.6)
    assert q["kl_mean"] == pytest.approx(kl0 / 2) and q["greedy_agreement"] == 0.5 and q["positions"] == 2
    assert q["perplexity"] == pytest.approx(np.exp(-(np.log(0.3) + np.log(0.8)) / 2))
    assert q["perplexity_float32"] == pytest.approx(np.exp(-(np.log(0.7) + np.log(0.8)) / 2))


def test_int8_variants_products_on_literal_inputs():
    """benchmarks/int8_variants.py's alternatives to int8_matmul: one block as wide as the
    input is the shipped per-row product; narrower blocks and float activations come closer to
    the float product; a width that is not a multiple of the block is refused."""
    from jaxspec.nn.int8 import int8_matmul, quantize_weights

    mod = _script("int8_variants")
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (3, 64)) * jnp.where(jnp.arange(64) % 16 == 0, 20.0, 1.0)  # outlier channels
    w = jax.random.normal(kw, (64, 8))
    wq, ws = quantize_weights(w)
    exact = np.asarray(x @ w)
    row = np.asarray(int8_matmul(x, wq, ws))
    np.testing.assert_allclose(np.asarray(mod.block_matmul(64)(x, wq, ws)), row, rtol=1e-6, atol=1e-5)
    err = {name: np.abs(np.asarray(f(x, wq, ws)) - exact).mean()
           for name, f in (("row", int8_matmul), ("b16", mod.block_matmul(16)), ("float", mod.float_activation_matmul))}
    assert err["float"] < err["b16"] < err["row"], err
    with pytest.raises(ValueError, match="not a multiple of block = 48"):
        mod.block_matmul(48)(x, wq, ws)


def test_int8_variants_fused_projections_compute_the_unfused_logits():
    """Without smoothing, the fused q/k/v and gate/up products of int8_variants.py give the
    unfused model's logits bit for bit (the same per-row activation scales, the same int32
    sums): its speed rows time the same arithmetic in another structure."""
    from flax import nnx

    from jaxspec.nn.model import forward_logits
    from jaxspec.nn.quant import quantize_model
    from _tiny import tiny_pair

    mod = _script("int8_variants")
    target, _ = tiny_pair(3)
    q = quantize_model(target, calibration=None)
    tokens = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
    plain = np.asarray(forward_logits(q, tokens))
    fused = mod.fused_copy(q)
    assert all(hasattr(layer.self_attn, "qkv") and hasattr(layer.mlp, "gate_up") for layer in fused.layers)
    with mod.fused_methods():
        got = np.asarray(forward_logits(fused, tokens))
    np.testing.assert_array_equal(got, plain)
    # and the fused kernels are what runs: a changed one changes the logits
    fused.layers[0].self_attn.qkv.kernel = nnx.Param(-fused.layers[0].self_attn.qkv.kernel[...])
    with mod.fused_methods():
        assert not np.array_equal(np.asarray(forward_logits(fused, tokens)), plain)


def test_int8_shape_drift_flags_and_figures(capsys):
    """benchmarks/int8_shape_drift.py: --prompts out of range is refused by flag; on a float32
    tiny model the padded and unpadded laws agree (argmax everywhere, KL at float noise)."""
    from _tiny import tiny_pair

    mod = _script("int8_shape_drift")
    with pytest.raises(SystemExit) as e:
        mod.main(["--prompts", "9"])
    assert e.value.code == 2 and "--prompts = 9: expected 1 to 8" in capsys.readouterr().err
    target, _ = tiny_pair(0)
    r = mod.drift(target, [("t", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 2)])
    assert r["positions"] == 7 and r["argmax_agreement"] == 1.0 and r["kl_max"] < 1e-5
