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


def pytest_unconfigure(config):
    if os.environ.get("JAXSPEC_TEST_XLA_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


# Tests of more than about 25 s each on the 2-core CI machine (end-to-end CLI runs, device
# meshes, notebooks, the wider exactness cases, benchmark smoke runs): marked ``long``, which
# the default suite deselects (pyproject addopts) so that it stays near its 15-minute budget,
# and which ``.ci/run`` runs after it (``pytest -m long``). Node-id prefixes; a parametrized
# test is listed with its parameters, or without them for all of its cases.
LONG = (
    "notebooks/",
    "tests/test_mesh.py::test_mesh_tokens_equal_one_device",
    "tests/test_mesh.py::test_harness_passes_on_a_mesh",
    "tests/test_mesh.py::test_two_processes_one_mesh_same_tokens",
    "tests/test_mesh.py::test_cli_verify_on_a_mesh",
    "tests/test_mesh.py::test_cli_generate_on_a_mesh_gives_the_one_device_tokens",
    "tests/test_ngram_draft.py::test_lookup_benchmark_tiny",
    "tests/test_generate_exactness.py::test_generate_matches_exact_target_law[branch-",
    "tests/test_generate_exactness.py::test_generate_matches_exact_target_law[dynamic-",
    "tests/test_generate_exactness.py::test_generate_traversal_rule_matches_exact_target_law",
    "tests/test_generate_exactness.py::test_generate_ngram_draft_matches_exact_target_law[branch-",
    "tests/test_generate_exactness.py::test_generate_feature_head_matches_exact_target_law[branch-",
    "tests/test_generate_exactness.py::test_generate_ragged_batch_matches_each_prompts_law",
    "tests/test_cli_generate.py::test_tree_auto_end_to_end",
    "tests/test_exactness.py::test_counts_identical_on_1_and_8_devices",
    "tests/test_cli.py::test_train_resume_and_distill_end_to_end",
    "tests/test_bench.py::test_sequential_walk_is_the_same_rule",
    "tests/test_accept.py::test_traced_parents_match_static",
    "tests/test_rule_auto.py::test_verify_default_on_a_chain_is_block_and_checks_its_acceptance",
    "tests/test_autotree.py::test_timed_round_uses_the_rule_generate_uses",
    "tests/test_accept_stress.py::test_round_invariants_on_degenerate_rows",
    "tests/test_head.py::test_head_benchmark_tiny",
    "tests/test_head.py::test_cli_verify_with_a_head",
)


@pytest.hookimpl(tryfirst=True)  # before the -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(LONG):
            item.add_marker(pytest.mark.long)
