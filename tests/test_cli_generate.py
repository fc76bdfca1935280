"""`jaxspec generate` on the embedded default pair: output, JSON fields, temperature-0
equality with the baseline, and clean errors (message + exit status 2, no traceback)."""

import json

import pytest

from jaxspec.cli import main


def _run(capsys, *argv):
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--prompt", "x", "--target", "no-such-model"], "no-such-model"),
        (["--prompt", "x" * 400], "context"),
        (["--prompt", "x", "--tree", "branch:0,2"], "--tree"),
        (["--prompt", "x", "--tree", "weird"], "--tree"),
        (["--prompt", "x", "--temperature", "-1"], "error: --temperature: expected a finite number >= 0"),
        (["--prompt", "x", "--temperature", "nan"], "error: --temperature: expected a finite number >= 0"),
        (["--prompt", "x", "--top-p", "1.5"], "--top-p"),
        (["--prompt", "x", "--top-p", "0"], "--top-p"),
        (["--prompt", "x", "--top-k", "0"], "--top-k"),
        (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--prompt", ""], "--prompt"),
        (["--prompt", "x", "--tree", "auto", "--auto-budgets", "0,2"], "--auto-budgets"),
        (["--prompt", "x", "--tree", "auto", "--auto-budgets", "a"], "--auto-budgets"),
        (["--prompt", "x", "--tree", "auto", "--auto-max-depth", "0"], "--auto-max-depth"),
        (["--prompt", "x" * 200, "--tree", "auto", "--max-new-tokens", "60"], "--tree auto: no budget"),
    ],
)
def test_errors_are_clean(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (code, err)
    assert needle in err and "Traceback" not in err, err
    assert err.startswith("jaxspec generate: error:"), err


@pytest.mark.parametrize("seed", [str(2**32), "-1", "1" + "0" * 40])
def test_seed_out_of_range_is_a_usage_error(capsys, seed):
    code, out, err = _run(capsys, "--prompt", "x", "--seed", seed)
    assert code == 2 and out == ""
    assert err.endswith(f"jaxspec generate: error: argument --seed: expected an integer in [0, 2**32), got '{seed}'\n")
    assert "Traceback" not in err


def test_text_output_announces_the_untimed_first_call(capsys):
    """Without --json, one stderr line says that the first (compiling) call is not timed,
    before the streamed text; with --json stdout is exactly one JSON object."""
    common = ["--prompt", "import os\n", "--max-new-tokens", "24", "--temperature", "0", "--baseline"]
    code, out, err = _run(capsys, *common)
    assert code == 0, err
    lines = err.splitlines()
    assert lines.count("compiling and warming up (first call, not timed) ...") == 1, err
    assert lines.index("compiling and warming up (first call, not timed) ...") < next(
        i for i, line in enumerate(lines) if line.startswith("-- baseline:"))
    assert out.startswith("import os\n") and "compiling" not in out
    code, out, err = _run(capsys, *common, "--json")
    assert code == 0, err
    assert json.loads(out)["num_tokens"] == 24 and out.count("\n") == 1 and "compiling" not in out


def test_temperature_zero_speculative_equals_baseline(capsys):
    """Every sibling scheme on the default pair (V = 264: the draft draws go through the
    two-level inverse CDF) gives the baseline's greedy text at temperature 0."""
    common = ["--prompt", "import os\n", "--max-new-tokens", "24", "--temperature", "0", "--json"]
    code, out, _ = _run(capsys, *common, "--baseline")
    assert code == 0
    base = json.loads(out)
    for scheme in ("iid", "without_replacement", "deterministic"):
        code, out, err = _run(capsys, *common, "--tree", "branch:2,1", "--scheme", scheme)
        assert code == 0, (scheme, err)
        spec = json.loads(out)
        for k in ("text", "tokens", "tokens_per_target_call", "tokens_per_second", "rounds"):
            assert k in spec and k in base
        assert spec["tokens"] == base["tokens"] and spec["text"] == base["text"], scheme
        assert spec["num_tokens"] == 24 and base["tokens_per_target_call"] == 1.0
        assert spec["tokens_per_target_call"] > 1.0, scheme  # the draft's guesses are accepted


def test_tree_auto_end_to_end(capsys, monkeypatch, tmp_path):
    """--tree auto measures the pair (small budgets), reports the table and the choice
    on stderr and in --json, generates with the chosen tree, and caches the measurement:
    the second call reads it back instead of measuring."""
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(tmp_path))
    argv = ["--prompt", "def f(x):", "--tree", "auto", "--auto-budgets", "3,1",
            "--auto-max-depth", "2", "--scheme", "deterministic", "--temperature", "1",
            "--max-new-tokens", "16", "--json"]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    res = json.loads(out)
    auto = res["auto_tree"]
    assert res["tree"] == "auto" and res["num_tokens"] == 16
    assert [r["budget"] for r in auto["table"]] == [1, 3]
    best = max(auto["table"], key=lambda r: r["predicted_tokens_per_second"])
    assert auto["budget"] == best["budget"] and len(auto["parents"]) == auto["budget"]
    assert auto["parents"][0] == -1 and max(r["depth"] for r in auto["table"]) <= 2
    assert auto["predicted_tau"] == pytest.approx(best["predicted_tau"]) and auto["predicted_tau"] > 1
    assert auto["predicted_speedup"] == pytest.approx(
        best["predicted_tokens_per_second"] * auto["target_step_seconds"])
    assert all(r["round_seconds"] > 0 and r["verify_seconds"] > 0 for r in auto["table"])
    assert not auto["from_cache"] and auto["cache_path"].startswith(str(tmp_path))
    parents = ",".join(map(str, auto["parents"]))
    assert f"picked {auto['budget']} nodes" in err and f"parents:{parents}" in err, err
    assert "Traceback" not in err

    code, out, err = _run(capsys, *argv)  # same pair, settings and device: the cache
    assert code == 0, err
    again = json.loads(out)["auto_tree"]
    assert again["from_cache"] and again["parents"] == auto["parents"]
    assert again["table"] == auto["table"] and "cached in" in err
