"""The command line's persistent compilation cache (jaxspec/cli/compile_cache.py): the first
run stores its compiled programs (and, with --program-store, its traced ones), a second
identical run finds every one of them (it writes no new entry), and the off switches store
nothing. Timings are measured in
benchmarks/, not asserted here."""

import json
import os
import subprocess
import sys

import pytest

ARGS = ["generate", "--prompt", "ab", "--max-new-tokens", "8", "--tree", "chain:2", "--no-warmup", "--json"]


def _env(**extra) -> dict:
    """The test process's environment without the run-wide XLA cache of tests/conftest.py:
    these tests watch jaxspec switch the cache on and off by itself."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    return dict(env, JAX_PLATFORMS="cpu", **extra)


def _run(env_cache, *extra, log=None, **env_extra):
    """``jaxspec generate`` in a new process; with ``log`` (a list), its stderr is appended."""
    env = _env(JAXSPEC_COMPILATION_CACHE=str(env_cache), **env_extra)
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", *ARGS, *extra], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    if log is not None:
        log.append(r.stderr)
    return json.loads(r.stdout)


def _entries(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_second_run_reuses_every_compiled_program(tmp_path):
    """...and every traced program: the second process traces no generation loop
    (JAX_LOG_COMPILES logs each trace by the function's name)."""
    cache = tmp_path / "xla"
    logs = []
    first = _run(cache, "--program-store", log=logs, JAX_LOG_COMPILES="1")
    stored = _entries(cache)
    assert stored, "the first run stored nothing"
    assert _entries(cache / "programs"), "the first run stored no traced program"
    assert "Finished tracing speculative_program" in logs[0]
    second = _run(cache, "--program-store", log=logs, JAX_LOG_COMPILES="1")
    assert _entries(cache) == stored, "the second run compiled a program the first had stored"
    assert "Finished tracing speculative_program" not in logs[1], "the second run traced the loop again"
    assert second["tokens"] == first["tokens"]  # same seed, same program: same tokens
    print(f"seconds_with_compile: first {first['seconds_with_compile']:.2f}, second "
          f"{second['seconds_with_compile']:.2f}; {len(stored)} entries")


@pytest.mark.parametrize("mode", ["text", "other-prompt-length"])
def test_streamed_runs_and_other_prompt_lengths_reuse_the_programs(tmp_path, mode):
    """Text mode streams each round (no host callback in any program), and prompts of
    lengths in one bucket share a program: a second process stores nothing new, and every
    program it compiles (JAX_LOG_COMPILES) is a hit of the persistent cache. (A program with
    a host callback is never stored: it would compile in every process without a hit.)"""
    cache = tmp_path / "xla"
    args = [a for a in ARGS if a != "--json"]
    second = args
    if mode == "other-prompt-length":
        args, second = ARGS, [("the prompt of another length" if a == "ab" else a) for a in ARGS]
    env = _env(JAXSPEC_COMPILATION_CACHE=str(cache), JAX_LOG_COMPILES="1", JAXSPEC_PROGRAM_STORE="on")
    runs = [subprocess.run([sys.executable, "-m", "jaxspec.cli", *a], capture_output=True, text=True, env=env,
                           timeout=600) for a in (args,)]
    assert runs[0].returncode == 0, runs[0].stderr
    stored = _entries(cache)
    assert stored, "the first run stored nothing"
    runs.append(subprocess.run([sys.executable, "-m", "jaxspec.cli", *second], capture_output=True, text=True,
                               env=env, timeout=600))
    assert runs[1].returncode == 0, runs[1].stderr
    assert _entries(cache) == stored, f"the second run ({mode}) compiled a program the first had stored"
    compiles = runs[1].stderr.count("Finished XLA compilation of")
    hits = runs[1].stderr.count("Persistent compilation cache hit for")
    assert compiles > 0 and hits == compiles, (compiles, hits, runs[1].stderr[-3000:])
    assert "Finished tracing stream_step" not in runs[1].stderr  # the programs' traces are stored too
    assert "Finished tracing speculative_program" not in runs[1].stderr
    if mode != "other-prompt-length":
        assert runs[1].stdout == runs[0].stdout  # same seed, same program: same text


def test_a_second_verify_loads_its_block_programs(tmp_path):
    """``jaxspec verify --program-store`` uses both stores too: the second process stores
    nothing new, traces none of the harness's block programs, and reports the same counts."""
    cache = tmp_path / "xla"
    args = ["verify", "--samples", "2000", "--tree", "chain:2", "--horizon", "2", "--no-progress", "--json",
            "--program-store"]
    env = _env(JAXSPEC_COMPILATION_CACHE=str(cache), JAX_LOG_COMPILES="1")

    def run():
        r = subprocess.run([sys.executable, "-m", "jaxspec.cli", *args], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    runs = [run()]
    stored = _entries(cache)
    runs.append(run())
    assert len(_entries(cache / "programs")) == 3  # the speculative, target-only and first-round blocks
    assert _entries(cache) == stored, "the second run compiled a program the first had stored"
    for kind in ("spec", "ar", "first"):
        assert f"Finished tracing verify_{kind}_block" in runs[0].stderr
        assert f"Finished tracing verify_{kind}_block" not in runs[1].stderr
    first, second = (json.loads(r.stdout) for r in runs)
    first.pop("timings"), second.pop("timings")
    assert first == second


@pytest.mark.parametrize("how", ["flag", "env"])
def test_off_switches_store_nothing(tmp_path, how):
    cache = tmp_path / "xla"
    if how == "flag":
        _run(cache, "--no-compile-cache")
    else:
        env = _env(JAXSPEC_COMPILATION_CACHE="off", HOME=str(tmp_path), JAXSPEC_CACHE_DIR=str(tmp_path / "home-cache"))
        r = subprocess.run([sys.executable, "-m", "jaxspec.cli", *ARGS], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr
        assert _entries(tmp_path / "home-cache") == []
    assert _entries(cache) == []


def test_the_program_store_is_on_by_default(tmp_path):
    """By default the command line stores the compiled executables and the traced programs;
    --no-program-store keeps the executables only. How $JAXSPEC_PROGRAM_STORE overrides the
    flag is program_store_wanted's (the next test), which enable_compilation_cache asks."""
    cache = tmp_path / "xla"
    _run(cache, "--no-program-store")
    assert _entries(cache) and not (cache / "programs").exists()
    _run(cache)
    assert _entries(cache / "programs")


def test_program_store_wanted_reads_the_variable(monkeypatch):
    from jaxspec.cli.compile_cache import program_store_wanted  # noqa: PLC0415

    monkeypatch.delenv("JAXSPEC_PROGRAM_STORE", raising=False)
    assert program_store_wanted(True) and not program_store_wanted(False)
    for value, want in (("on", True), ("1", True), ("off", False), ("no", False), ("", True)):
        monkeypatch.setenv("JAXSPEC_PROGRAM_STORE", value)
        assert program_store_wanted(True) is want, value


def test_default_folder_is_under_the_jaxspec_cache(monkeypatch, tmp_path):
    from jaxspec.cli.compile_cache import compilation_cache_dir

    monkeypatch.delenv("JAXSPEC_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(tmp_path))
    assert compilation_cache_dir() == tmp_path / "compilation"
    monkeypatch.setenv("JAXSPEC_COMPILATION_CACHE", "OFF")
    assert compilation_cache_dir() is None


def test_the_suites_shared_cache_is_locked():
    """tests/conftest.py shares one persistent compilation cache between the xdist workers and
    their subprocesses (its own folder or the caller's, such as .ci/run's); a size limit is what
    makes JAX lock it (filelock) around each read and write, so that no process reads a program
    another is still writing."""
    import jax

    import filelock  # noqa: F401  (JAX needs it once the limit is set)

    assert jax.config.jax_compilation_cache_max_size > 0
