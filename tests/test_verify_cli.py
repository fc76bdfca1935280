"""``jaxspec verify``: flags, report output, exit status 0 / 1 / 2.

Runs in-process through ``jaxspec.cli.main`` with the configurations of
tests/test_exactness.py (same compiled functions, so the compile cache is shared).
"""

import json

import pytest

from jaxspec import cli  # registers jaxspec/cli_*.py, so "verify" too
from jaxspec.mutants import MUTANTS


def test_help_lists_the_flags(capsys):
    assert cli.main(["verify", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--tree", "--scheme", "--temperature", "--top-k", "--top-p", "--samples", "--horizon", "--seed",
                 "--target", "--draft", "--json", "--plots", "--mutant", "--prompt", "--alpha"):
        assert flag in out
    for name in MUTANTS:
        assert name in out


def test_passing_run_exits_0_with_json_and_plots(capsys, tmp_path):
    code = cli.main(["verify", "--samples", "16384", "--json", "--plots", str(tmp_path), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    report = json.loads(captured.out)
    assert report["passed"] is True and report["num_samples"] == 16384
    assert report["config"]["tree"] == "branch:2,2" and report["config"]["scheme"] == "iid"
    assert {p.name for p in tmp_path.iterdir()} == {"marginals.png", "joint.png", "acceptance.png"}


def test_mutant_exits_1_with_a_readable_summary(capsys):
    code = cli.main(["verify", "--mutant", "depth-row", "--samples", "2**15", "--no-acceptance", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert "MUTANT=depth-row" in out and "REJECTED" in out
    assert "(o-e)/sqrt(e)" in out  # the worst cells of a rejected test


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tree", "branch:x"], "tree spec 'branch:x'"),
        (["--scheme", "greedy"], "invalid choice"),
        (["--mutant", "off-by-one"], "invalid choice"),
        (["--samples", "0"], "--samples: expected a positive integer"),
        (["--samples", "1.5"], "--samples: expected a positive integer"),
        (["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
        (["--alpha", "0"], "--alpha: expected a number in (0, 1)"),
        (["--target", "default-target"], "--target and --draft"),
        (["--target", "no-such-model", "--draft", "no-such-model"], "no-such-model"),
        (["--prompt", "1,9"], "prompt[1] = 9"),
        (["--prompt", "hello"], "--prompt 'hello'"),
        (["--horizon", "12"], "pass a top_k"),
    ],
)
def test_bad_input_exits_2(argv, message, capsys):
    assert cli.main(["verify", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
