import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import os
import re
import shutil
import tempfile

import pytest

# In-process CLI tests would otherwise switch JAX's persistent compilation cache on for the
# whole test process and write under the user's home; tests/test_compile_cache.py tests it
# in subprocesses with a folder of their own.
os.environ.setdefault("JAXSPEC_COMPILATION_CACHE", "off")

# One persistent XLA compilation cache for the whole run, shared by the xdist workers and by
# every subprocess a test starts (README blocks, CLI runs, notebook kernels), which compile the
# same programs of the default models again and again. JAX reads these variables when it is
# imported. A fresh folder per run (removed at its end), so no test reads a program compiled
# by another checkout. A JAX_COMPILATION_CACHE_DIR set by the caller is used and left in
# place: .ci/run sets one for all its stages, so that the later stages' CLI runs
# load the programs the default stage's runs compiled.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxspec-test-xla-")
    os.environ["JAXSPEC_TEST_XLA_CACHE_OWNER"] = str(os.getpid())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# A size limit switches on JAX's file lock around every read and write of the cache.
# Without it a write is a plain non-atomic write_bytes, and a second process reading the
# same program meanwhile (the subprocesses of both xdist workers compile the same default
# models' programs) can get a truncated executable. The limit is never reached by one run.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(16 * 2**30))

# XLA:CPU compiles without LLVM's expensive optimization passes in the tests: most of the
# suite's time is compiling small programs that then run briefly, and a sample of the long tests
# ran 12 % faster so (docs/DEVELOPMENT.md). The passes change how fast the code runs, not what it
# computes. The subprocesses inherit it; a caller's own XLA_FLAGS are kept.
_NO_EXPENSIVE_PASSES = "xla_llvm_disable_expensive_passes"
if _NO_EXPENSIVE_PASSES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_NO_EXPENSIVE_PASSES}=true".strip()

# The test processes themselves do not write to the persistent cache: writing some executables
# to it crashed an xdist worker (a segmentation fault inside JAX's
# compilation_cache.put_executable_and_time, in CI and in a local run of the long suite; most
# likely the memory-map exhaustion that _free_compiled_programs below prevents, not proven). The
# subprocesses the tests start (README blocks, CLI runs, notebook kernels) still share it.
import jax  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)


def _count_lines(path: str) -> int | None:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux
        return None


def _map_limit() -> int | None:
    try:
        return int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


MAP_LIMIT = _map_limit()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """After a test module, drop JAX's compiled programs once the process holds more than half
    of Linux's memory-map limit (vm.max_map_count, 65530 by default). Each XLA:CPU executable
    maps about 8 regions, and a worker that keeps every program it compiled reached 11,500 maps
    in 4 minutes of the long tests; an xdist worker that ran out segfaulted inside XLA's
    compiler (test_stream, test_rule_auto, in CI and here). Clearing only past the threshold
    keeps the programs most modules share (the default models') compiled."""
    yield
    if MAP_LIMIT is not None and (_count_lines("/proc/self/maps") or 0) > MAP_LIMIT // 2:
        import gc  # noqa: PLC0415

        jax.clear_caches()
        gc.collect()


def pytest_unconfigure(config):
    if os.environ.get("JAXSPEC_TEST_XLA_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


# The `long` mark: the node-id prefixes listed in tests/long_tests.txt (why: its header).
LONG = tuple(line.strip() for line in (pathlib.Path(__file__).parent / "long_tests.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#"))


STALE_LONG = pytest.StashKey[list]()


def stale_long_entries(entries, nodeids) -> list[str]:
    """The entries of tests/long_tests.txt that match none of ``nodeids`` although their file
    (or folder) was collected whole: a renamed or removed test, which would otherwise move
    back into the default tier without a word. Files collected only in part (``file::test``
    on the command line) are not judged."""
    nodeids = list(nodeids)
    files = {n.split("::")[0] for n in nodeids}
    stale = []
    for entry in entries:
        file = entry.split("::")[0]
        collected = file in files if "::" in entry or not entry.endswith("/") else any(f.startswith(file) for f in files)
        if collected and not any(n.startswith(entry) for n in nodeids):
            stale.append(entry)
    return stale


@pytest.hookimpl(tryfirst=True)  # before the -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(LONG):
            item.add_marker(pytest.mark.long)
    partial = {a.split("::")[0] for a in config.args if "::" in a}
    whole = [n for n in (item.nodeid for item in items) if n.split("::")[0] not in partial]
    # read by tests/test_long_tests.py::test_no_entry_is_stale (a failing test, not a crashed worker)
    config.stash[STALE_LONG] = stale_long_entries([e for e in LONG if e.split("::")[0] not in partial], whole)


# The `real` mark: tests that need the optional packages CI installs only after its first stage
# (the default suite); its last stage runs `-m '(long or real) and not slow'`. A default test
# skipped for want of one of them but not marked `real` would run in no CI stage at all, so such
# a skip fails instead (in the default stage, where they are missing): mark the test, its
# parameter or its module `real`.
EXTRAS = ("torch", "transformers", "gguf", "tokenizers", "jinja2", "accelerate")
_MISSING_EXTRA = re.compile(r"could not import '(%s)\b" % "|".join(EXTRAS))


def unmarked_extra_skip(reason: str, marked_real: bool) -> str | None:
    """The failure message for a skip for want of an optional package in a test not marked
    ``real``, or None when the skip is in order."""
    m = _MISSING_EXTRA.search(reason)
    if m is None or marked_real:
        return None
    return (f"skipped for want of {m.group(1)!r} but not marked `real`, so no CI stage would run it: "
            "add @pytest.mark.real (or pytestmark = pytest.mark.real before the module's importorskip)")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        message = unmarked_extra_skip(_skip_reason(report), item.get_closest_marker("real") is not None)
        if message:
            report.outcome, report.longrepr = "failed", f"{item.nodeid}: {message}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(collector, pytest.Module):
        source = pathlib.Path(collector.path).read_text(encoding="utf-8")
        message = unmarked_extra_skip(_skip_reason(report), "pytestmark = pytest.mark.real" in source)
        if message:
            report.outcome, report.longrepr = "failed", f"{collector.nodeid}: {message}"
