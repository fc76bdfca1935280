"""``jaxspec verify``: flags, report output, exit status 0 / 1 / 2.

Runs in-process through ``jaxspec.cli.main`` with the configurations of
tests/test_exactness.py (same compiled functions, so the compile cache is shared).
"""

import json

import jax

import pytest

import jaxspec.exactness.harness
from jaxspec import cli
from jaxspec.exactness.mutants import MUTANTS


def test_help_lists_the_flags(capsys):
    assert cli.main(["verify", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--tree", "--scheme", "--temperature", "--top-k", "--top-p", "--samples", "--horizon", "--seed",
                 "--target", "--draft", "--json", "--plots", "--mutant", "--prompt", "--alpha", "--prompt-bucket"):
        assert flag in out
    for name in MUTANTS:
        assert name in out


def test_passing_run_exits_0_with_json_and_plots(capsys, tmp_path):
    code = cli.main(["verify", "--samples", "16384", "--json", "--plots", str(tmp_path), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    report = json.loads(captured.out)
    assert report["passed"] is True and report["num_samples"] == 16384
    # a bare verify tests what a bare generate runs
    from jaxspec.cli.generate import DEFAULT_SCHEME, DEFAULT_TREE
    assert report["config"]["tree"] == DEFAULT_TREE and report["config"]["scheme"] == DEFAULT_SCHEME
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
        (["--tree", "branch:x"], "error: --tree: tree spec 'branch:x'"),
        (["--tree", "bogus"], "error: --tree: tree spec 'bogus'"),
        (["--scheme", "greedy"], "invalid choice"),
        (["--mutant", "off-by-one"], "invalid choice"),
        (["--samples", "0"], "--samples: expected a positive integer"),
        (["--samples", "1.5"], "--samples: expected a positive integer"),
        (["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
        (["--alpha", "0"], "--alpha: expected a number in (0, 1)"),
        (["--target", "default-target"], "--target and --draft"),
        (["--target", "no-such-model", "--draft", "no-such-model"],
         "error: --target: load_model: unknown model 'no-such-model'"),
        (["--target", "default-target", "--draft", "no-such-model"],
         "error: --draft: load_model: unknown model 'no-such-model'"),
        (["--prompt", "1,9"], "prompt[1] = 9"),
        (["--prompt", "hello"], "--prompt 'hello'"),
        (["--horizon", "12", "--method", "enumerate"],
         "error: no --top-k and --horizon 12: the target's 4 tokens give up to 4**12 = 16777216 joint cells"),
        (["--horizon", "20", "--method", "enumerate"],
         "expected a top_k with top_k**horizon <= 1048576, or a smaller horizon"),
        (["--horizon", "1" + "0" * 30, "--method", "enumerate"],
         "--horizon 1" + "0" * 30 + ": the target's 4 tokens give up to 4**1"),
        (["--horizon", "13", "--top-k", "3", "--method", "enumerate"],
         "--top-k 3 and --horizon 13: min(top_k, the target's 4 tokens) give up to 3**13 = 1594323"),
        (["--seed", str(2**32)], f"argument --seed: expected an integer in [0, 2**32), got '{2**32}'"),
        (["--seed", "-1"], "argument --seed: expected an integer in [0, 2**32), got '-1'"),
        (["--samples", "10**30"], "argument --samples: expected a positive integer <= 1e12 (10**12), got '10**30'"),
        (["--samples", "1e30"], "argument --samples: expected a positive integer <= 1e12"),
        (["--samples", "1e400"], "argument --samples: expected a positive integer <= 1e12"),
        (["--samples", "10**999999999"], "argument --samples: expected a positive integer <= 1e12"),  # not computed
        (["--samples", "1000000000001"], "argument --samples: expected a positive integer <= 1e12"),
        (["--samples", "10**-2"], "argument --samples: expected a positive integer"),
    ],
)
def test_bad_input_exits_2(argv, message, capsys):
    assert cli.main(["verify", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err


def test_samples_bound_is_inclusive():
    args = cli.build_parser().parse_args(["verify", "--samples", "10**12", "--seed", str(2**32 - 1)])
    assert args.samples == 10**12 and args.seed == 2**32 - 1


def test_count_samples_refuses_an_int32_block_overflow():
    import jax

    from jaxspec.exactness.sample_counts import count_samples

    common = dict(kind="spec", cfg=None, impl=None, states=(), temps=(1.0, 1.0), key=jax.random.key(0),
                  prompt=(1,), horizon=1, vocab=4, levels=(), devices=jax.devices()[:1], progress=False, desc="x")
    with pytest.raises(ValueError, match=r"num_samples = 10{30}: .* blocks of chunk_size 16384"):
        count_samples(num_samples=10**30, chunk=16384, **common)
    with pytest.raises(ValueError, match=r"num_samples = 2147483648: 2147483648 blocks of chunk_size 1"):
        count_samples(num_samples=2**31, chunk=1, **common)
    with pytest.raises(ValueError, match=r"chunk_size = 2147483648: expected an integer in \[1, 2\*\*31\)"):
        count_samples(num_samples=2**31, chunk=2**31, **common)


def _no_sampling(monkeypatch):
    import jaxspec.exactness.harness

    def never(*a, **k):
        raise AssertionError("verify should have refused its arguments before sampling")

    monkeypatch.setattr(jaxspec.exactness.harness, "verify", never)


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_plots_folder_is_checked_before_sampling(where, tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    f = tmp_path / "file"
    f.write_text("")
    plots = str(f if where == "file" else f / "plots")
    assert cli.main(["verify", "--no-progress", "--plots", plots]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxspec verify: error: --plots {plots}: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("exc", [PermissionError(13, "Permission denied", "plots/joint.png"),
                                 OSError(28, "No space left on device"), RuntimeError("RESOURCE_EXHAUSTED: out of memory")])
def test_failures_exit_2_never_1(exc, capsys, monkeypatch):
    """Exit status 1 means a test rejected: an OSError (unwritable plots, full disk) or a
    device error while verifying exits 2 with its message."""
    import jaxspec.exactness.harness

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(jaxspec.exactness.harness, "verify", fail)
    assert cli.main(["verify", "--no-progress", "--samples", "1000"]) == 2
    err = capsys.readouterr().err
    assert err == f"jaxspec verify: error: {exc}\n"


def test_unwritable_plots_after_a_passing_run_exit_2(tmp_path, capsys, monkeypatch):
    from jaxspec.exactness.report import VerifyReport

    def fail(self, directory):
        raise PermissionError(13, "Permission denied", str(tmp_path / "marginals.png"))

    monkeypatch.setattr(VerifyReport, "save_plots", fail)
    code = cli.main(["verify", "--samples", "16384", "--json", "--plots", str(tmp_path), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert json.loads(captured.out)["passed"] is True
    assert captured.err.endswith(f"jaxspec verify: error: [Errno 13] Permission denied: '{tmp_path / 'marginals.png'}'\n")


# ----------------------------------------------------------------------------- verdict without power


def test_no_power_is_inconclusive_exit_3(capsys):
    """One sample: every chi-square test pools its cells into one (dof 0, p = 1 whatever the
    samples) and the smallest detectable TV exceeds 1: exit 3 and INCONCLUSIVE, never PASSED;
    the JSON carries the verdict, its reasons and the sample count the rules need."""
    argv = ["verify", "--samples", "1", "--no-acceptance", "--no-progress"]
    assert cli.main([*argv, "--json"]) == 3
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "inconclusive" and d["passed"] is False
    assert all(t["passed"] and not t["has_power"] and t["dof"] == 0 for t in d["tests"])
    assert d["min_detectable_tv"] >= 1
    reasons = d["inconclusive_reasons"]
    assert len(reasons) == len(d["tests"]) + 1 and "dof 0" in reasons[0] and "smallest TV" in reasons[-1]
    assert d["samples_needed"] > 1

    assert cli.main(argv) == 3
    out = capsys.readouterr().out
    assert "PASSED" not in out and out.count("no power") == len(d["tests"])
    verdict = [line for line in out.splitlines() if line.startswith("INCONCLUSIVE: ")]
    assert verdict == [f"INCONCLUSIVE: no test rejected, but the run has no statistical power at 1 samples per "
                       f"run; at least {d['samples_needed']:,} samples per run are needed"]


@pytest.mark.slow
def test_samples_needed_gives_a_conclusive_run(capsys):
    """The count an inconclusive run names is enough for the power rules (here it passes)."""
    assert cli.main(["verify", "--samples", "2", "--no-acceptance", "--no-progress", "--json"]) == 3
    needed = json.loads(capsys.readouterr().out)["samples_needed"]
    assert 2 < needed < 1000
    assert cli.main(["verify", "--samples", str(needed), "--no-acceptance", "--no-progress", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "passed" and d["inconclusive_reasons"] == [] and d["min_detectable_tv"] < 1
    assert all(t["has_power"] and t["dof"] >= 1 for t in d["tests"])


def test_help_documents_exit_status_and_draft_defaults(capsys):
    assert cli.main(["verify", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 INCONCLUSIVE" in out and "1 REJECTED" in out and "0 PASSED" in out
    assert "as generate" not in out
    assert ("--draft-temperature DRAFT_TEMPERATURE draft temperature (default: the target's --temperature for "
            "--scheme iid / without_replacement, 1 for deterministic)") in out
    assert "deterministic for dynamic trees" in out and "--min-p MIN_P target min-p" in out


# ----------------------------------------------------------------------------- refused before sampling


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plots", ""], "--plots '': expected a folder path, got an empty one"),
        (["--prompt", "1,2,99999"], "--prompt[2] = 99999: expected a token id in [0, 4)"),
        (["--prompt", "1,-1"], "--prompt[1] = -1: expected a token id in [0, 4)"),
        (["--tree", "dynamic:depth=2,topk=2,nodes=3", "--scheme", "iid"],
         "--scheme iid and --tree dynamic:depth=2,topk=2,nodes=3: a dynamic tree ranks fixed candidates; "
         "expected scheme 'deterministic'"),
        (["--min-p", "2"], "argument --min-p: expected a number in [0, 1], got '2'"),
        (["--temperature", "1e39"], "argument --temperature: expected a non-negative number (at most 3.4e38), "
                                    "got '1e39'"),
        (["--draft-temperature", "1e39"], "argument --draft-temperature: expected a non-negative number"),
        (["--temperature", "inf"], "argument --temperature: expected a non-negative number"),
    ],
)
def test_refused_before_sampling(argv, message, capsys, monkeypatch):
    import warnings

    _no_sampling(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. numpy's "overflow encountered in cast"
        assert cli.main(["verify", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]  # argparse's own errors follow its usage
    assert errors == [err.splitlines()[-1]] and message in errors[0] and "Traceback" not in err, err
    assert "scheme = " not in err and "scheme='" not in err


def test_float32_range_is_accepted():
    args = cli.build_parser().parse_args(["verify", "--temperature", "3.4e38", "--draft-temperature", "0"])
    assert args.temperature == 3.4e38 and args.draft_temperature == 0.0


def _verify_arguments(argv, monkeypatch) -> dict:
    """The keyword arguments ``jaxspec verify argv`` hands the harness (which is replaced by
    one that records them and fails, so the command exits 2 without sampling)."""
    import jaxspec.exactness.harness

    seen = {}

    def capture(*a, **k):
        seen.update(k)
        raise RuntimeError("captured")

    monkeypatch.setattr(jaxspec.exactness.harness, "verify", capture)
    assert cli.main(["verify", "--no-progress", *argv]) == 2
    return seen


@pytest.mark.parametrize(
    "argv, scheme",
    [
        (["--tree", "dynamic:depth=2,topk=2,nodes=3"], None),
        (["--tree", "dynamic:depth=2,topk=2,nodes=3", "--scheme", "deterministic"], "deterministic"),
        ([], None),
        (["--mutant", "depth-row"], "iid"),
        (["--tree", "chain:2", "--scheme", "without_replacement"], "without_replacement"),
    ],
)
def test_scheme_default_follows_the_tree(argv, scheme, capsys, monkeypatch):
    """--scheme not given: None, generate's default (the drafter's own: deterministic for a
    dynamic tree, without_replacement for a draft model on a static tree), or, for a mutant
    without --tree, the configuration it breaks; given: passed through."""
    seen = _verify_arguments(argv, monkeypatch)
    assert capsys.readouterr().err == "jaxspec verify: error: captured\n"
    assert seen["scheme"] == scheme


@pytest.mark.parametrize("argv, bucket", [([], 32), (["--prompt-bucket", "none"], None),
                                         (["--prompt-bucket", "8"], 8)])
def test_prompt_bucket_reaches_the_harness(argv, bucket, capsys, monkeypatch):
    """--prompt-bucket N: the harness tests the program padded to N columns; by default
    generate's (32), with 'none' the program of the prompt's own width."""
    assert _verify_arguments(argv, monkeypatch)["prompt_bucket"] == bucket


def test_prompt_bucket_is_checked(capsys):
    assert cli.main(["verify", "--prompt-bucket", "0"]) == 2
    assert "--prompt-bucket" in capsys.readouterr().err


def test_default_chunk_keeps_blocks_to_seconds():
    """verify's default block size: the tiny pair keeps 2^14 rows a block on CPU; a large
    vocabulary or model gets fewer rows (a block there costs 1-6 ms a sample on a 2-core
    CPU, so 2^14 rows took minutes between progress updates), never below 2^8."""
    from jaxspec.exactness.harness import CHUNK_MAX, CHUNK_MIN, default_chunk, default_pair, sample_cost

    cpu = jax.devices("cpu")
    tiny = default_pair(0)
    assert default_chunk(cpu, *tiny, 6, 3) == CHUNK_MAX["cpu"] == 1 << 14
    assert default_chunk(cpu, *tiny, 6, 8) == 1 << 14  # within the slack
    big_v = default_pair(0, vocab_size=1000)
    assert default_chunk(cpu, *big_v, 6, 3) == 256
    chunks = [default_chunk(cpu, *default_pair(0, vocab_size=v), 6, 3) for v in (4, 16, 64, 264, 1000)]
    assert chunks == sorted(chunks, reverse=True) and all(CHUNK_MIN["cpu"] <= c <= CHUNK_MAX["cpu"] for c in chunks)
    assert all(c & (c - 1) == 0 for c in chunks)  # powers of two
    # the cost is a ratio: more tree rows or horizon cost proportionally more
    t, d = (m.config for m in tiny)
    assert sample_cost(t, d, 13, 3) == pytest.approx(2 * sample_cost(t, d, 6, 3))
