import json
import subprocess
import sys

from pathlib import Path

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
        (["train", "--steps", "10", "--warmup-steps", "10", "--out", "x"], "--warmup-steps = 10: expected < --steps = 10"),
        (["train", "--seq-len", "4096", "--out", "x"], "--seq-len = 4096: expected <= --context = 256"),
        (["train", "--heads", "3", "--out", "x"], "--kv-heads = 2: expected a divisor of --heads = 3"),
        (["train", "--min-lr-ratio", "2", "--out", "x"], "argument --min-lr-ratio: expected a number in [0, 1], got '2'"),
        (["train", "--seed", str(2**32), "--out", "x"],
         f"argument --seed: expected an integer in [0, 2**32), got '{2**32}'"),
        (["train", "--seed", "-1", "--out", "x"], "argument --seed: expected an integer in [0, 2**32), got '-1'"),
        (["distill", "--seed", "1" + "0" * 30, "--out", "x"], "argument --seed: expected an integer in [0, 2**32)"),
        (["distill", "--target", "no-such-model", "--out", "x"], "--target: load_model: unknown model 'no-such-model'"),
        (["distill", "--target", "./no/such/folder", "--out", "x"], "--target: load_model: model folder"),
        (["distill", "--init", "no-such-model", "--out", "x"], "--init: load_model: unknown model 'no-such-model'"),
        (["train", "--hidden-size", "100", "--heads", "3", "--kv-heads", "1", "--out", "x"],
         "--hidden-size = 100: expected a multiple of --heads = 3"),
        # the target (default-target, context 256) scores every window position too
        (["distill", "--context", "512", "--seq-len", "400", "--out", "x"],
         "--seq-len = 400: expected <= the target's context length 256"),
        (["train", "--out", ""], "--out '': expected a folder path, got an empty one"),
        (["distill", "--out", "x", "--export", " "], "--export ' ': expected a folder path"),
    ],
)
def test_bad_input_is_a_clean_error(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("flags, head_dim", [
    (["--hidden-size", "64"], 32),  # preset tiny: 2 heads
    (["--heads", "4", "--kv-heads", "2"], 8),
    (["--layers", "3"], 16),  # unchanged: the preset's own
])
def test_model_flags_recompute_head_dim(flags, head_dim):
    """--hidden-size / --heads change hidden_size / heads, so the per-head width follows
    (it used to keep the preset's, silently building another model)."""
    from jaxspec.training.train import PRESETS

    args = cli.build_parser().parse_args(["train", "--out", "x", "--preset", "tiny", *flags])
    from jaxspec.cli import train as train_cli

    mc = train_cli._model_config(args)
    assert PRESETS["tiny"].hidden_size == 32 and PRESETS["tiny"].num_attention_heads == 2
    assert mc.head_dim == head_dim == mc.hidden_size // mc.num_attention_heads


def test_largest_seed_is_accepted():
    args = cli.build_parser().parse_args(["train", "--out", "x", "--seed", str(2**32 - 1)])
    assert args.seed == 2**32 - 1


@pytest.mark.parametrize("command", ["train", "distill"])
@pytest.mark.parametrize("flag", ["--out", "--export"])
def test_output_folders_are_checked_before_training(command, flag, tmp_path, capsys, monkeypatch):
    """An --out / --export that is a file, or under a file, is refused up front (exit 2,
    naming the flag and the path): nothing is trained, loaded or created."""
    import jaxspec.formats.checkpoint
    import jaxspec.training.train

    def never(*a, **k):
        raise AssertionError("the output folder should have been refused before any work")

    for name in ("train", "distill"):
        monkeypatch.setattr(jaxspec.training.train, name, never)
    monkeypatch.setattr(jaxspec.formats.checkpoint, "load_model", never)
    f = tmp_path / "file"
    f.write_text("")
    ok = str(tmp_path / "run")
    for bad, message in [(str(f), "expected a folder, got an existing file"),
                         (str(f / "sub"), f"cannot create this folder: {f} is a file, not a folder")]:
        argv = [command, "--out", bad] if flag == "--out" else [command, "--out", ok, "--export", bad]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err == f"jaxspec {command}: error: {flag} {bad}: {message}\n", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no run folder, no probe left behind


def test_check_output_dir(tmp_path):
    assert cli.check_output_dir("--out", tmp_path) == tmp_path  # an existing folder
    assert cli.check_output_dir("--out", tmp_path / "a" / "b") == tmp_path / "a" / "b"  # creatable
    assert list(tmp_path.iterdir()) == []  # checked, not created; the write test is removed
    if Path("/proc/self").is_dir():  # a folder nobody may create entries in, even root
        with pytest.raises(cli.CLIError, match=r"^OUT_DIR /proc/nope/x: cannot write into /proc \("):
            cli.check_output_dir("OUT_DIR", "/proc/nope/x")


@pytest.mark.parametrize("where", ["file", "under a file", "proc"])
def test_export_out_dir_is_checked(where, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    out = {"file": str(f), "under a file": str(f / "x"), "proc": "/proc/nope/x"}[where]
    assert cli.main(["export", "default-draft", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxspec export: error: OUT_DIR {out}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_console_entry_point_has_no_traceback():
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", "distill", "--target", "nope", "--out", "x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "jaxspec distill: error: --target: load_model: unknown model 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_register_a_command(capsys):
    @cli.command("hello", help="say hello")
    def hello(p):
        p.add_argument("--name", default="world")

        def run(args):
            if args.name == "":
                raise cli.CLIError("--name: expected a non-empty string")
            print(f"hello {args.name}")
            return 0

        return run

    commands = (*cli.COMMANDS, hello)
    assert cli.main(["hello", "--name", "jax"], commands=commands) == 0
    assert capsys.readouterr().out == "hello jax\n"
    assert cli.main(["hello", "--name", ""], commands=commands) == 2
    assert capsys.readouterr().err == "jaxspec hello: error: --name: expected a non-empty string\n"
    assert cli.main(["hello"]) == 2  # not in the default list
    with pytest.raises(ValueError, match="already registered"):
        cli.build_parser((*commands, hello))


def test_a_command_sets_up_its_own_flags_only():
    """main builds the chosen command's flags alone: ``jaxspec --help`` imports no JAX,
    ``jaxspec generate`` starts without the trainer's and the harness's imports (SciPy, Optax:
    seconds), and the top-level help and a usage error still name every command (a fresh
    process, so that nothing is imported yet)."""
    code = ("import sys; from jaxspec.cli.main import build_parser; "
            "build_parser(only=''); assert 'jax' not in sys.modules, 'the top-level parser imported JAX'; "
            "p = build_parser(only='generate'); a = p.parse_args(['generate', '--prompt', 'x']); "
            "print(a.prompt, callable(a._handler), sorted(m for m in ('scipy', 'optax', 'jaxspec.training.train', "
            "'jaxspec.exactness.harness') if m in sys.modules)); "
            "print(p.format_help())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    first, help_text = r.stdout.split("\n", 1)
    assert first == "x True []"
    assert all(c.name in help_text for c in cli.COMMANDS)
    assert cli.build_parser(only="").parse_args(["verify"]).command == "verify"  # no flags set up: names only


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
    stopped = json.loads(capsys.readouterr().out)
    assert stopped["stopped_at_step"] == 10 and "without --stop-at" in stopped["resume"]
    # resuming with the same --stop-at would stop again at once: refused, not a silent no-op
    assert cli.main(["train", *TINY_RUN, "--out", run, "--resume", "--stop-at", "10"]) == 2
    assert "--stop-at = 10: the checkpoint in" in capsys.readouterr().err
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
    err = capsys.readouterr().err
    assert "per-token FLOPs" in err and err.rstrip().endswith("(--max-compute-ratio)")


def test_every_command_module_is_listed():
    """jaxspec.cli.main lists its subcommands explicitly: every module of the package that
    defines a Command is in COMMANDS, and the names are the documented ones."""
    import importlib
    import pkgutil

    import jaxspec.cli as pkg

    listed = {id(c) for c in cli.COMMANDS}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"jaxspec.cli.{info.name}")
        for value in vars(mod).values():
            if isinstance(value, cli.Command) and value.__class__ is cli.Command:
                assert id(value) in listed, f"jaxspec.cli.{info.name}: {value.name} is not in COMMANDS"
    assert [c.name for c in cli.COMMANDS] == ["train", "distill", "train-head", "bench", "export", "generate", "verify"]


def test_ctrl_c_during_training_says_where_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) mid-run: exit 130 and say which checkpoint --resume uses."""
    import jaxspec.training.train as train_mod

    run = str(tmp_path / "t")
    real_step = train_mod._train_step
    calls = []

    def interrupted_step(*args, **kwargs):  # the user presses Ctrl-C during the 3rd step
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_mod, "_train_step", interrupted_step)
    assert cli.main(["train", *TINY_RUN, "--out", run]) == 130
    err = capsys.readouterr().err
    assert "no checkpoint was written yet" in err and "interrupted" in err
    monkeypatch.setattr(train_mod, "_train_step", real_step)
    assert cli.main(["train", *TINY_RUN, "--out", run, "--stop-at", "8"]) == 0  # checkpoint at step 8
    capsys.readouterr()
    calls.clear()
    monkeypatch.setattr(train_mod, "_train_step", interrupted_step)
    assert cli.main(["train", *TINY_RUN, "--out", run, "--resume"]) == 130
    err = capsys.readouterr().err
    assert f"the last checkpoint (step 8) is in {run}/checkpoint; rerun the same command with --resume" in err
