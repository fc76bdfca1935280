import json
import subprocess
import sys

import pytest

from jaxspec import cli


def test_help(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: jaxspec" in out and "train" in out and "distill" in out
    for name in ("train", "distill"):
        assert cli.main([name, "--help"]) == 0
        out = capsys.readouterr().out
        assert f"usage: jaxspec {name}" in out and "--steps" in out and "--resume" in out


def test_missing_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().err
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--steps", "-3", "--out", "x"], "--steps: expected a positive integer"),
        (["train", "--lr", "fast", "--out", "x"], "--lr: expected a positive number"),
        (["train", "--preset", "huge", "--out", "x"], "invalid choice"),
        (["train", "--steps", "5"], "--out"),
        (["train", "--steps", "10", "--warmup-steps", "10", "--out", "x"], "warmup_steps"),
        (["train", "--seq-len", "4096", "--out", "x"], "max_position_embeddings"),
        (["train", "--heads", "3", "--out", "x"], "num_attention_heads"),
        (["distill", "--target", "no-such-model", "--out", "x"], "unknown model 'no-such-model'"),
        (["distill", "--target", "./no/such/folder", "--out", "x"], "does not exist"),
    ],
)
def test_bad_input_is_a_clean_error(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_console_entry_point_has_no_traceback():
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", "distill", "--target", "nope", "--out", "x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "jaxspec distill: error: load_model: unknown model 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_register_a_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))

    @cli.command("hello", help="say hello")
    def _hello(p):
        p.add_argument("--name", default="world")

        def run(args):
            if args.name == "":
                raise cli.CLIError("--name: expected a non-empty string")
            print(f"hello {args.name}")
            return 0

        return run

    assert cli.main(["hello", "--name", "jax"]) == 0
    assert capsys.readouterr().out == "hello jax\n"
    assert cli.main(["hello", "--name", ""]) == 2
    assert capsys.readouterr().err == "jaxspec hello: error: --name: expected a non-empty string\n"
    with pytest.raises(ValueError, match="already registered"):
        cli.command("hello", help="again")(_hello)


# The same settings as tests/test_train.py, so that one pytest process compiles each step once.
TINY_RUN = ["--preset", "tiny", "--steps", "24", "--batch-size", "8", "--seq-len", "32", "--lr", "1e-2",
            "--warmup-steps", "3", "--eval-every", "12", "--eval-windows", "16", "--checkpoint-every", "8",
            "--seed", "3", "--max-files", "6", "--no-progress"]
DISTILL_RUN = ["--steps", "20", "--batch-size", "8", "--seq-len", "32", "--lr", "1e-2", "--warmup-steps", "2",
               "--eval-every", "10", "--eval-windows", "16", "--checkpoint-every", "10", "--max-files", "6",
               "--no-progress"]


def test_train_resume_and_distill_end_to_end(tmp_path, capsys):
    run = str(tmp_path / "t")
    assert cli.main(["train", *TINY_RUN, "--out", run, "--stop-at", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["stopped_at_step"] == 10
    assert cli.main(["train", *TINY_RUN, "--out", run]) == 2  # refuses to overwrite without --resume
    assert "--resume" in capsys.readouterr().err
    assert cli.main(["train", *TINY_RUN, "--out", run, "--resume"]) == 0
    res = json.loads(capsys.readouterr().out)  # stdout: one JSON object; progress goes to stderr
    assert res["model"] == str(tmp_path / "t" / "final") and res["val_loss"] > 0

    draft = ["--preset", "tiny", "--hidden-size", "16", "--layers", "1", "--heads", "1", "--kv-heads", "1",
             "--intermediate-size", "32"]
    argv = ["distill", *DISTILL_RUN, *draft, "--target", res["model"], "--out", str(tmp_path / "d")]
    assert cli.main(argv + ["--max-compute-ratio", "10"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert 0 < res["alpha_before"] < res["alpha_after"] <= 1
    assert cli.main(argv[:-2] + ["--out", str(tmp_path / "d2")]) == 2  # tiny target: draft too costly at 1/8
    assert "per-token FLOPs" in capsys.readouterr().err


def test_command_modules_are_registered_on_import():
    import importlib
    from pathlib import Path

    registered = set(cli._COMMANDS)
    assert {"train", "distill"} <= registered
    for path in Path(cli.__file__).parent.glob("cli_*.py"):
        importlib.import_module(f"jaxspec.{path.stem}")  # already imported by jaxspec.cli: no new commands
    assert set(cli._COMMANDS) == registered
