"""The command line at its edges (issue 26): Ctrl-C at any moment (exit 130, one line,
no crash in the interpreter's teardown), command-line text that is not UTF-8, a custom
``--target`` without ``--draft``, and one tokenizer rule for ``generate`` and ``verify``."""

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import pytest

from jaxspec.cli import main
from jaxspec.cli.common import Command
from jaxspec.formats.checkpoint import save_model
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import init_model

# ----------------------------------------------------------------------------- Ctrl-C

# the ``jaxspec`` console script (``from jaxspec.cli import main; sys.exit(main())``), plus a
# line on stderr once the imports are done, so that a test interrupts the command itself
_SCRIPT = textwrap.dedent("""
    import sys
    from jaxspec.cli import main
    sys.argv = ["jaxspec", *sys.argv[1:]]
    print("<ready>", file=sys.stderr, flush=True)
    sys.exit(main())
""")

# ... and a SIGINT in the interpreter's teardown: an atexit callback (registered last, so
# run first) that interrupts the process after the command has returned its status
_LATE_SCRIPT = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from jaxspec.cli import main

    def late_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)

    atexit.register(late_ctrl_c)
    sys.argv = ["jaxspec", *sys.argv[1:]]
    sys.exit(main())
""")


def _env(tmp_path):
    env = dict(os.environ, JAXSPEC_COMPILATION_CACHE="off", JAXSPEC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile for real: the crash came from XLA's compiling threads
    return env


def _check_interrupted(code, err, command):
    assert code == 130, (code, err[-3000:])
    assert err.count("interrupted") == 1, err[-3000:]
    assert f"jaxspec {command}: interrupted\n" in err, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]


@pytest.mark.parametrize(
    "argv, wait_for, delay",
    [
        # while the first call compiles (the "compiling" line comes just before it)
        (["generate", "--prompt", "def f(x):", "--no-compile-cache"], "compiling", 0.3),
        # --tree auto: while its candidates compile and are timed
        (["generate", "--prompt", "def f(x):", "--tree", "auto", "--retune", "--no-compile-cache"], "<ready>", 3.0),
        # verify runs for days with 10**12 samples: early (models, first compilation) and later
        (["verify", "--samples", "1e12", "--no-progress", "--no-compile-cache"], "<ready>", 0.5),
        (["verify", "--samples", "1e12", "--no-progress", "--no-compile-cache"], "<ready>", 4.0),
    ],
    ids=["generate-compiling", "generate-auto", "verify-early", "verify-later"],
)
def test_ctrl_c_mid_run_exits_130_with_one_line(tmp_path, argv, wait_for, delay):
    """SIGINT while the command works (compiling with XLA's threads running): status 130
    and ``jaxspec <cmd>: interrupted`` once on stderr; no segfault in the interpreter's
    teardown (status 139), no traceback."""
    p = subprocess.Popen([sys.executable, "-c", _SCRIPT, *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    seen = []
    try:
        for line in p.stderr:  # until the line to wait for: after the imports, in the command
            seen.append(line)
            if wait_for in line:
                break
        else:
            pytest.fail(f"the command ended before {wait_for!r}: {''.join(seen)[-3000:]}")
        time.sleep(delay)
        assert p.poll() is None, "the command ended before the interrupt"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    _check_interrupted(p.returncode, "".join(seen) + err, argv[0])


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--prompt", "x", "--max-new-tokens", "0"],  # an error (status 2), jax imported
        ["verify", "--help"],  # status 0
        pytest.param(["generate", "--prompt", "x", "--max-new-tokens", "2", "--baseline", "--json", "--no-warmup"],
                     marks=pytest.mark.slow),  # a whole run, compilation included
    ],
    ids=["error", "help", "run"],
)
def test_ctrl_c_in_the_teardown_exits_130(tmp_path, argv):
    """SIGINT after the command has finished, while the interpreter runs its atexit
    callbacks: status 130 and one line, not "Exception ignored in atexit callback" and the
    command's own status."""
    r = subprocess.run([sys.executable, "-c", _LATE_SCRIPT, *argv], capture_output=True, text=True,
                       env=_env(tmp_path), timeout=300, check=False)
    _check_interrupted(r.returncode, r.stderr, argv[0])


# Ctrl-C where Python would drop the KeyboardInterrupt: in a garbage-collector callback (as
# JAX's, which runs often; also with the command cleaning up after it), or in a library that
# swallows it (``except BaseException``); and a second Ctrl-C after a swallowed one
_SWALLOW_SCRIPT = textwrap.dedent("""
    import collections, gc, hashlib, itertools, os, signal, sys, time
    from jaxspec.cli.common import Command
    from jaxspec.cli.main import _Interrupts, main

    WHERE = sys.argv[1]

    def ctrl_c_here():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here, inside

    def run(args):
        if WHERE == "gc":
            _Interrupts.GRACE_S = 600  # only the delivery outside the callback can end the 30 s
            gc.callbacks.append(lambda phase, info: phase == "start" and ctrl_c_here())
            gc.collect()
        elif WHERE == "cleanup":
            _Interrupts.GRACE_S = 600
            big = [b"x" * (8 << 20)] * 20
            try:
                # the SIGINT in a short callback, so that the first re-send comes during ...
                gc.callbacks.append(lambda phase, info: phase == "start" and os.kill(os.getpid(), signal.SIGINT))
                gc.collect()
                gc.callbacks.clear()
                # ... C code that first releases the GIL (the watchdog sends the signal again,
                # which only sets Python's flag), then holds it for about a second: the handler
                # runs after it, while the watchdog waits for the GIL
                collections.deque(itertools.chain(map(hashlib.sha256, big), range(50_000_000)), maxlen=0)
                time.sleep(30)
            except KeyboardInterrupt:
                print("cleaned up", file=sys.stderr, flush=True)  # e.g. train's "resume with ..."
                raise
        else:
            if WHERE == "twice":
                _Interrupts.GRACE_S = 600  # only the second Ctrl-C can end the 30 s
            for _ in range(2 if WHERE == "twice" else 1):
                try:
                    ctrl_c_here()
                except BaseException:
                    pass
        time.sleep(30)
        return 0

    sys.argv = ["jaxspec", "swallow"]
    sys.exit(main(commands=[Command("swallow", "ctrl-c where it is dropped", lambda p: run)]))
""")


@pytest.mark.parametrize("where", ["gc", "cleanup", "except", "twice"])
def test_ctrl_c_that_python_would_drop_still_exits_130(tmp_path, where):
    """A SIGINT in a gc callback is sent again until it arrives outside (the watchdog's 5 s
    deadline switched off), and no re-sent one ends the command's cleanup after the raise; one
    swallowed by the command is caught by the watchdog 5 s later; a second one exits at once,
    swallowed or not: status 130 and one line each time, no "Exception ignored in: <function
    ...>", before the command's 30 s end."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _SWALLOW_SCRIPT, where],
                       capture_output=True, text=True, env=_env(tmp_path), timeout=120, check=False)
    _check_interrupted(r.returncode, r.stderr, "swallow")
    assert time.perf_counter() - t0 < 25  # not the command's 30 s
    assert ("cleaned up" in r.stderr) == (where == "cleanup"), r.stderr


def _boom_command(where):
    """A command that raises KeyboardInterrupt while its parser is set up or while it runs."""

    def setup(p):
        if where == "setup":
            raise KeyboardInterrupt

        def run(args):
            print("partial output", end="")  # not flushed yet
            raise KeyboardInterrupt

        return run

    return Command("boom", "raise KeyboardInterrupt", setup)


@pytest.mark.parametrize("where", ["setup", "run"])
def test_ctrl_c_in_process_returns_130(capsys, where):
    """main(argv) (tests, other programs): returns 130 after one line naming the command,
    whether the interrupt comes while the parser is built or while the command runs; the
    SIGINT handler is left alone."""
    before = signal.getsignal(signal.SIGINT)
    assert main(["boom"], commands=[_boom_command(where)]) == 130
    assert capsys.readouterr().err == "jaxspec boom: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_as_the_program_flushes_and_skips_the_teardown(capsys, monkeypatch):
    """main() running the program (exit_on_interrupt, the default without argv): stdout is
    flushed, the line printed, and the process left with os._exit(130) (no teardown)."""
    cli_main = importlib.import_module("jaxspec.cli.main")  # jaxspec.cli.main is also the function

    class Exited(BaseException):
        pass

    flushed = []

    def fake_exit(code):
        flushed.append(capsys.readouterr())
        raise Exited(code)

    monkeypatch.setattr(cli_main.os, "_exit", fake_exit)
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Exited) as e:
            main(["boom"], commands=[_boom_command("run")], exit_on_interrupt=True)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a second Ctrl-C: no second line
    finally:
        signal.signal(signal.SIGINT, before)
    assert e.value.args == (130,)
    assert flushed[0].out == "partial output" and flushed[0].err == "jaxspec boom: interrupted\n"


def test_after_the_command_a_sigint_leaves_with_130(monkeypatch):
    """main() running the program: once the command returns, SIGINT is handled by a
    handler that leaves with os._exit(130) (the teardown cannot raise KeyboardInterrupt)."""
    cli_main = importlib.import_module("jaxspec.cli.main")  # jaxspec.cli.main is also the function

    ok = Command("ok", "succeed", lambda p: (lambda args: 0))
    codes = []
    monkeypatch.setattr(cli_main.os, "_exit", codes.append)
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main(["ok"], commands=[ok], exit_on_interrupt=True) == 0
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler) and handler is not signal.default_int_handler
        handler(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, before)
    assert codes == [130]



def _import_time_module(line):
    """The module of a ``-X importtime`` line ("import time: self | cumulative | name"), or None."""
    if not line.startswith("import time:") or line.count("|") != 2:
        return None
    return line.rsplit("|", 1)[1].strip()


@pytest.mark.parametrize(
    "how, argv, command, at",
    [
        # the console script of [project.scripts] (`jaxspec --help` imports no JAX: a command's
        # flags are set up only when it runs, tests/test_cli.py)
        ("script", ["generate", "--prompt", "def f(x):"], "generate", "jax."),
        ("module", ["generate", "--prompt", "def f(x):"], "generate", "jax."),  # python -m jaxspec.cli
        # later: JAX half imported (import jaxspec imports nothing heavy and the command line
        # imports flax only in the command, so JAX's import is the whole start)
        ("module", ["verify", "--samples", "1e12"], "verify", "jax._src.lax"),
    ],
)
def test_ctrl_c_while_importing_exits_130_with_one_line(tmp_path, how, argv, command, at):
    """SIGINT while the command still imports jaxspec and JAX (before main() runs): status
    130 and the one line, no KeyboardInterrupt traceback. The moment is not a guess: with
    ``-X importtime`` (PYTHONPROFILEIMPORTTIME) each finished import prints a line, and the
    signal goes out at the first line of a module under ``at`` (jaxspec/cli/__init__ is
    running; JAX's import, the first, has most of its second or so to go). Since the command
    line stopped registering a Threefry lowering at start, JAX is first imported by the
    command, after ``jaxspec.cli.main``: the signal then comes under main's own handler, and
    the status and the one line must be the same."""
    if how == "script":
        exe = os.path.join(os.path.dirname(sys.executable), "jaxspec")
        if not os.path.isfile(exe):
            pytest.skip("no jaxspec console script next to the interpreter (package not installed)")
        cmd = [exe, *argv]
    else:
        cmd = [sys.executable, "-m", "jaxspec.cli", *argv]
    env = dict(_env(tmp_path), PYTHONPROFILEIMPORTTIME="1")
    line = f"jaxspec {command}: interrupted\n" if command else "jaxspec: interrupted\n"
    for _ in range(3):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        seen = []
        try:
            for raw in p.stderr:
                seen.append(raw)
                module = _import_time_module(raw)
                if module is not None and module.startswith(at):
                    break
            else:
                pytest.fail(f"the command ended before importing {at}*: {''.join(seen)[-3000:]}")
            p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        err = "".join(seen) + rest
        imported = {_import_time_module(x) for x in err.splitlines(keepends=True)}
        err = "".join(x for x in err.splitlines(keepends=True) if _import_time_module(x) is None)
        assert p.returncode == 130, (p.returncode, err[-3000:])
        assert err == line, err[-3000:]  # nothing else: no traceback, no "Exception ignored"
        assert imported  # -X importtime lines were seen: the signal came while importing
        return



def test_the_import_time_line_knows_every_command():
    """jaxspec/cli/__init__ names the command in its line from a list of its own (its
    handler is in place before jaxspec.cli.main is imported): the subcommands of the
    command line."""
    from jaxspec.cli import COMMAND_NAMES
    from jaxspec.cli.main import COMMANDS

    assert COMMAND_NAMES == tuple(c.name for c in COMMANDS)


def test_importing_the_command_line_leaves_sigint_alone():
    """The start handler lasts only while jaxspec.cli imports; afterwards the process has
    the handler it had (``main`` run as the program installs its own)."""
    code = ("import signal, sys; before = signal.getsignal(signal.SIGINT); import jaxspec, jaxspec.cli; "
            "assert signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# ----------------------------------------------------------------------------- --prompt not UTF-8

NOT_UTF8 = os.fsdecode(b"ab\xff")  # what Python makes of the bytes a\xff on the command line: "ab\udcff"


@pytest.mark.parametrize("cmd", ["generate", "verify"])
@pytest.mark.parametrize(
    "value, what",
    [(NOT_UTF8, r"bytes b'\xff' at position 2 are not UTF-8"),
     ("x\ud800y", r"characters '\ud800' at position 1 are not UTF-8")],
)
def test_prompt_that_is_not_utf8_is_a_usage_error(capsys, cmd, value, what):
    assert main([cmd, "--prompt", value]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.endswith(f"jaxspec {cmd}: error: argument --prompt: expected valid UTF-8 text, "
                            f"got {value!r} ({what})\n"), cap.err
    assert "Traceback" not in cap.err and "codec" not in cap.err


def test_every_prompt_flag_checks_utf8():
    """Every subcommand with a --prompt (now generate and verify) refuses non-UTF-8 text at parsing."""
    from jaxspec.cli.common import utf8_text
    from jaxspec.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    with_prompt = []
    for name, p in sub.choices.items():
        for a in p._actions:
            if "--prompt" in a.option_strings:
                with_prompt.append(name)
                assert a.type is utf8_text, name
    assert {"generate", "verify"} <= set(with_prompt)


def test_prompt_bytes_on_the_real_command_line(tmp_path):
    """The bytes a\\xff as the process's argv (a shell in another locale, a file name)."""
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", "generate", "--prompt", b"a\xff"],
                       capture_output=True, env=_env(tmp_path), timeout=120, check=False)
    err = r.stderr.decode("utf-8", "backslashreplace")
    assert r.returncode == 2, err
    assert err.endswith("jaxspec generate: error: argument --prompt: expected valid UTF-8 text, got 'a\\udcff' "
                        "(bytes b'\\xff' at position 1 are not UTF-8)\n"), err


# ----------------------------------------------------------------------------- --target without --draft


def _model(folder, vocab=264, seed=0):
    cfg = ModelConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    save_model(init_model(cfg, jax.random.key(seed)), folder)
    return str(folder)


def _run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_custom_target_needs_a_draft_or_baseline(capsys, tmp_path):
    target = _model(tmp_path / "t")
    code, out, err = _run(capsys, "generate", "--prompt", "x", "--target", target)
    assert code == 2 and out == ""
    assert err == (f"jaxspec generate: error: --target {target}: expected a --draft for it (a draft model sharing "
                   "its tokenizer, or 'ngram' for prompt lookup, which needs no model), or --baseline for "
                   "target-only sampling; default-draft drafts only for default-target\n")
    assert "--draft default-draft" not in err
    # with --baseline no draft is needed: the next check (the context) is reached, before compiling
    code, out, err = _run(capsys, "generate", "--prompt", "x", "--target", target, "--baseline",
                          "--max-new-tokens", "1000")
    assert code == 2 and "--max-new-tokens = 1000: expected <= 127" in err and "draft" not in err, err
    # with --draft: both contexts count
    code, out, err = _run(capsys, "generate", "--prompt", "x", "--target", target, "--draft",
                          _model(tmp_path / "d", seed=1), "--max-new-tokens", "1000")
    assert code == 2 and "fit the target's and the draft's context of 128 tokens" in err, err


@pytest.mark.parametrize("target", ["default-target", None])
def test_default_target_keeps_the_default_draft(capsys, target):
    argv = ["generate", "--prompt", "x", "--max-new-tokens", "1000"] + (["--target", target] if target else [])
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "fit the target's and the draft's context of 256 tokens" in err, err


# ----------------------------------------------------------------------------- one tokenizer rule

_WORDS = ["<unk>", "<eos>", "def", "f", "(", ")", ":", "x", "return", "+", "1"] + [f"w{i}" for i in range(20)]


def _write_word_tokenizer(folder):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(_WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()
    tok.save(str(folder / "tokenizer.json"))


class _Stop(BaseException):
    """Raised by the stubs below with the prompt ids the command computed (a BaseException:
    the command line's last-resort handler turns an Exception into one line and status 1)."""


def _prompt_ids(monkeypatch, capsys, argv):
    """The prompt ids ``jaxspec generate`` / ``verify`` hand to the library (stopped there:
    nothing is compiled), or the (status, stderr) of an error before that."""
    import jaxspec.decode.generate as gen
    from jaxspec.exactness import harness

    def stop_generate(target, draft, prompts, **kw):
        raise _Stop(list(prompts[0]))

    def stop_verify(target, draft, *, prompt, **kw):
        raise _Stop(list(prompt))

    monkeypatch.setattr(gen, "prepare", stop_generate)  # the command prepares its generation once
    monkeypatch.setattr(harness, "verify", stop_verify)
    try:
        code = main(argv)
    except _Stop as e:
        return e.args[0]
    return code, capsys.readouterr().err


@pytest.mark.real
@pytest.mark.parametrize("vocab", [264, 40])
def test_generate_and_verify_tokenize_text_alike(monkeypatch, capsys, tmp_path, vocab):
    """A folder with tokenizer.json: both commands encode --prompt text with it, whatever the
    vocabulary size (verify refused text for 40 and byte-encoded it for 264)."""
    folder = tmp_path / "m"
    _model(folder, vocab)
    _write_word_tokenizer(folder)
    pair = ["--target", str(folder), "--draft", str(folder), "--prompt", "def f ( x ) :"]
    gen_ids = _prompt_ids(monkeypatch, capsys, ["generate", *pair, "--max-new-tokens", "4", "--no-warmup"])
    ver_ids = _prompt_ids(monkeypatch, capsys, ["verify", *pair, "--top-k", "2", "--no-compile-cache"])
    assert gen_ids == ver_ids == [2, 3, 4, 7, 5, 6]


def test_byte_folder_tokenizes_alike(monkeypatch, capsys, tmp_path):
    """No tokenizer.json, a 264-token vocabulary: both commands encode text as UTF-8 bytes."""
    folder = _model(tmp_path / "m")
    pair = ["--target", folder, "--draft", folder, "--prompt", "hé"]
    gen_ids = _prompt_ids(monkeypatch, capsys, ["generate", *pair, "--max-new-tokens", "4", "--no-warmup"])
    ver_ids = _prompt_ids(monkeypatch, capsys, ["verify", *pair, "--top-k", "2", "--no-compile-cache"])
    assert gen_ids == ver_ids == list("hé".encode())


def test_tokenizer_json_is_not_ignored_for_a_264_token_vocabulary(monkeypatch, capsys, tmp_path):
    """A tokenizer.json that cannot be read (not a tokenizer file; or no ``tokenizers``
    package): both commands refuse text with the same message naming --target and the
    file, instead of verify silently encoding bytes; token ids still need no tokenizer."""
    folder = _model(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    pair = ["--target", folder, "--draft", folder, "--prompt", "hi"]
    code_g, err_g = _prompt_ids(monkeypatch, capsys, ["generate", *pair, "--max-new-tokens", "4", "--no-warmup"])
    code_v, err_v = _prompt_ids(monkeypatch, capsys, ["verify", *pair, "--top-k", "2", "--no-compile-cache"])
    assert code_g == code_v == 2
    assert err_g.startswith(f"jaxspec generate: error: --target {folder}: ") and "tokenizer" in err_g, err_g
    assert err_v == err_g.replace("jaxspec generate:", "jaxspec verify:")
    ids = _prompt_ids(monkeypatch, capsys, ["verify", "--target", folder, "--draft", folder, "--prompt", "104,105",
                                            "--top-k", "2", "--no-compile-cache"])
    assert ids == [104, 105]


def test_text_for_a_folder_without_a_tokenizer_is_refused_alike(monkeypatch, capsys, tmp_path):
    """No tokenizer.json and a vocabulary that is not the byte tokenizer's: text is refused
    by both commands (generate used to feed byte ids >= the vocabulary to the model)."""
    folder = _model(tmp_path / "m", vocab=40)
    pair = ["--target", folder, "--draft", folder, "--prompt", "hi"]
    code, err = _prompt_ids(monkeypatch, capsys, ["generate", *pair, "--max-new-tokens", "4", "--no-warmup"])
    assert code == 2
    assert err == (f"jaxspec generate: error: --target {folder}: its folder has no tokenizer.json and its "
                   "vocab_size is 40, not the byte tokenizer's 264; expected the model's tokenizer.json in the "
                   "folder (text is tokenized with it)\n")
    code, err = _prompt_ids(monkeypatch, capsys, ["verify", *pair, "--top-k", "2", "--no-compile-cache"])
    assert code == 2
    assert err == (f"jaxspec verify: error: --target {folder}: its folder has no tokenizer.json and its "
                   "vocab_size is 40, not the byte tokenizer's 264; expected the model's tokenizer.json in the "
                   "folder (text is tokenized with it); or pass --prompt as comma-separated token ids, not 'hi'\n")
