import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import os
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
# by another checkout; a JAX_COMPILATION_CACHE_DIR set by the caller is left alone.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxspec-test-xla-")
    os.environ["JAXSPEC_TEST_XLA_CACHE_OWNER"] = str(os.getpid())
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    # A size limit switches on JAX's file lock around every read and write of the cache.
    # Without it a write is a plain non-atomic write_bytes, and a second process reading the
    # same program meanwhile (the subprocesses of both xdist workers compile the same default
    # models' programs) can get a truncated executable. The limit is never reached by one run.
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(16 * 2**30))

# The test processes themselves do not write to the persistent cache: writing some executables
# to it crashed an xdist worker (a segmentation fault inside JAX's
# compilation_cache.put_executable_and_time, in CI and in a local run of the long suite). The
# subprocesses the tests start (README blocks, CLI runs, notebook kernels) still share it.
import jax  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)


def pytest_unconfigure(config):
    if os.environ.get("JAXSPEC_TEST_XLA_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


# The `long` mark: the node-id prefixes listed in tests/long_tests.txt (why: its header).
LONG = tuple(line.strip() for line in (pathlib.Path(__file__).parent / "long_tests.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)  # before the -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(LONG):
            item.add_marker(pytest.mark.long)
