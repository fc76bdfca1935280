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
        (["--prompt", "x", "--temperature", "-1"], "temperature"),
        (["--prompt", "x", "--top-p", "1.5"], "top-p"),
        (["--prompt", "x", "--top-p", "0"], "top-p"),
        (["--prompt", "x", "--top-k", "0"], "top-k"),
        (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--prompt", ""], "--prompt"),
    ],
)
def test_errors_are_clean(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (code, err)
    assert needle in err and "Traceback" not in err, err
    assert err.startswith("jaxspec generate: error:"), err


def test_temperature_zero_speculative_equals_baseline(capsys):
    common = ["--prompt", "import os\n", "--max-new-tokens", "24", "--temperature", "0", "--json"]
    code, out, _ = _run(capsys, *common, "--tree", "branch:2,1")
    assert code == 0
    spec = json.loads(out)
    code, out, _ = _run(capsys, *common, "--baseline")
    assert code == 0
    base = json.loads(out)
    for k in ("text", "tokens", "tokens_per_target_call", "tokens_per_second", "rounds"):
        assert k in spec and k in base
    assert spec["tokens"] == base["tokens"] and spec["text"] == base["text"]
    assert spec["num_tokens"] == 24 and base["tokens_per_target_call"] == 1.0
    assert spec["tokens_per_target_call"] > 1.0  # the draft's guesses are accepted
