"""``verify`` without enumeration (jaxspec/exactness/sampled.py): the method it picks, the
tests it runs, the power it prints, the blocks on several devices, and the command line on
a real-sized vocabulary. Thresholds fixed before the runs: alpha = 1e-3 family-wise for
passing decoders; a mutant must give verdict "rejected" (some test below its Bonferroni
level alpha / m)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _env import host_devices_env
from _tiny import tiny_pair

import jaxspec
from jaxspec.cli import main
from jaxspec.errors import SettingError
from jaxspec.exactness.harness import verify
from jaxspec.exactness.report import VerifyReport
from jaxspec.exactness.sampled import hashed_cells_for
from jaxspec.exactness.sampled_report import SampledReport
from jaxspec.formats.checkpoint import save_model

V = 49_152
L = 4


@pytest.fixture(scope="module")
def big_pair():
    return tiny_pair(0, vocab_size=V, hidden_size=16, num_heads=2, mix=0.05, head_scale=8.0)


def test_auto_enumerates_where_the_law_fits_and_samples_where_it_does_not(big_pair):
    small = verify(num_samples=2048, horizon=2, progress=False, prompt_bucket=None, check_acceptance=False)
    assert isinstance(small, VerifyReport) and small.config["method"] == "enumerate"
    big = verify(*big_pair, num_samples=512, horizon=L, progress=False, prompt_bucket=None)
    assert isinstance(big, SampledReport) and big.config["method"] == "sampled"
    assert "49152**4 joint cells" in big.config["method_reason"]
    # the tests fixed in advance: PIT in two orders + the control, by position and pooled (chi2, KS); hashed per length
    assert len(big.tests) == 2 * (L + 2) + (L + 2) + L
    assert big.alpha_per_test == pytest.approx(1e-3 / len(big.tests))
    assert big.verdict == "passed", big.summary()
    assert big.spec_samples.shape == big.ar_samples.shape == (512, L)
    assert big.spec_samples.min() >= 0 and big.spec_samples.max() < V
    assert big.spec_marginals.sum() == 512 * L and big.spec_marginals.shape == (L, V)
    assert all(0 < t.detectable < 1 for t in big.tests)
    d = big.detectable()
    assert d["pit_tv"] < d["hashed_tv"]  # pooled U values outnumber hashed sequences L to 1
    out = big.summary()
    assert "method: sampled" in out and "power 0.9 at this sample count" in out and out.endswith("PASSED: every test passed")
    report = json.loads(big.to_json())
    assert report["method"] == "sampled" and report["verdict"] == "passed" and len(report["tests"]) == len(big.tests)
    assert report["config"]["hashed_cells"] == hashed_cells_for(512) == 16


def test_enumerate_is_refused_by_name_where_the_law_does_not_fit(big_pair):
    with pytest.raises(SettingError, match=r"top_k = None and horizon = 4: .*49152\*\*4 .*method='sampled'"):
        verify(*big_pair, num_samples=64, horizon=L, progress=False, method="enumerate")
    with pytest.raises(SettingError, match=r"method = 'exact': expected one of 'auto', 'enumerate', 'sampled'"):
        verify(num_samples=64, progress=False, method="exact")


def test_sampled_path_at_a_small_vocabulary_passes_and_rejects_a_mutant():
    """V = 4, where enumeration also applies: the sampled tests pass the decoder and
    reject the no-residual-update mutant at 4096 samples (the enumeration path rejects it
    too, tests/test_verify.py). causal-mask is not rejected here at 4096 samples: on the
    default pair it moves the law too little for this count (test_pit.py rejects it at
    V = 49,152 with 2048)."""
    kw = dict(num_samples=4096, horizon=3, progress=False, prompt_bucket=None, method="sampled")
    ok = verify(tree="branch:2,2", scheme="iid", **kw)
    assert ok.verdict == "passed", ok.summary()
    bad = verify(mutant="no-residual-update", **kw)
    assert bad.verdict == "rejected", bad.summary()
    assert min(t.pvalue for t in bad.tests) < 1e-6
    assert "REJECTED" in bad.summary() and "MUTANT=no-residual-update" in bad.summary()


def test_few_samples_are_inconclusive_not_passed():
    r = verify(num_samples=8, horizon=2, progress=False, prompt_bucket=None, method="sampled")
    assert r.verdict in ("inconclusive", "rejected")
    if r.verdict == "inconclusive":
        assert r.inconclusive_reasons and "cannot reject" in " ".join(r.inconclusive_reasons)


_DEVICES = textwrap.dedent("""
    import json, jax
    from jaxspec.exactness.harness import verify
    kw = dict(num_samples=300, horizon=3, chunk_size=64, progress=False, prompt_bucket=None, method="sampled",
              check_acceptance=False)
    one = verify(devices=jax.devices()[:1], **kw)
    four = verify(devices=jax.devices()[:4], **kw)
    print(json.dumps({"n": len(jax.devices()), "same": bool((one.spec_samples == four.spec_samples).all()
                      and (one.ar_samples == four.ar_samples).all()), "rows": one.spec_samples.shape[0],
                      "p": [t.pvalue for t in one.tests] == [t.pvalue for t in four.tests]}))
""")


def test_the_tokens_depend_on_seed_and_chunk_not_on_the_devices():
    """Blocks of 64 rows over 4 host devices give the one-device tokens row for row (300
    samples: 5 blocks, the last one partial, idle devices in the last step)."""
    env = host_devices_env(4)
    r = subprocess.run([sys.executable, "-c", _DEVICES], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"n": 4, "same": True, "rows": 300, "p": True}


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory, big_pair):
    path = tmp_path_factory.mktemp("v49152")
    save_model(big_pair[0], path)
    return path


@pytest.mark.parametrize("draft", ["ngram", "layers:1"])
def test_cli_on_a_real_sized_vocabulary_with_modelless_drafters(big_folder, draft, capsys, tmp_path):
    code = main(["verify", "--target", str(big_folder), "--draft", draft, "--samples", "256", "--horizon", "3",
                 "--prompt", "1,2,3,1,2", "--prompt-bucket", "none", "--json", "--no-progress",
                 "--plots", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    report = json.loads(captured.out)
    assert report["method"] == "sampled" and report["verdict"] == "passed"
    assert report["config"]["drafter"] == ("NgramDraft" if draft == "ngram" else "LayerSkipDraft")
    assert report["config"]["vocab_size"] == V and report["num_samples"] == 256
    assert {p.name for p in tmp_path.iterdir()} == {"pit.png", "hashed.png", "acceptance.png"}


def test_cli_method_enumerate_on_a_real_sized_vocabulary_names_the_flags(big_folder, capsys):
    code = main(["verify", "--target", str(big_folder), "--draft", "ngram", "--method", "enumerate",
                 "--samples", "64", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--top-k" in err and "--horizon" in err and "MAX_CELLS" in err


def test_summary_names_the_method_and_each_tests_power():
    r = verify(num_samples=1024, horizon=2, progress=False, prompt_bucket=None, method="sampled")
    lines = r.summary().splitlines()
    table = [s for s in lines if s.startswith(("  speculative PIT", "  target-only PIT", "  hashed two-sample chi2,"))]
    assert len(table) == len(r.tests)
    assert all(s.split()[-1] in ("pass", "REJECTED", "no power") for s in table)
    assert np.isclose(r.to_dict()["detectable"]["pit_tv"], [t.detectable for t in r.tests
                                                            if t.name == "speculative PIT [p] pooled chi2"][0])
    assert isinstance(jaxspec.exactness.SampledReport, type)
    # the float drift of the verification forward against one-token forwards (float32: last bits)
    d = r.config["drift"]
    assert d["positions"] > 0 and d["dtype"] == "float32" and d["max_abs_dlogit"] < 1e-3, d
    assert any(s.startswith("  float drift (float32)") for s in lines)


def test_a_one_sequence_prefix_is_agreement_not_a_lack_of_power():
    """The hashed test of a prefix that is one sequence in both samples (a near-certain
    first token, as after a code prompt on SmolLM2) has dof 0 but is no reason for
    INCONCLUSIVE; several sequences pooled into one cell for want of samples are."""
    import jax

    from jaxspec.core.settings import Sampling
    from jaxspec.exactness.harness import default_pair
    from jaxspec.exactness.sampled import sampled_tests

    target, _ = default_pair(0)
    rng = np.random.default_rng(0)
    spec, ar = rng.integers(0, 4, (256, 2)), rng.integers(0, 4, (256, 2))
    spec[:, 0] = ar[:, 0] = 2
    tests, _, _ = sampled_tests(jax.random.key(0), target, (1, 2, 3), spec, ar, Sampling(), alpha=1e-3)
    first = next(t for t in tests if t.name == "hashed two-sample chi2, first 1 tokens")
    assert first.dof == 0 and first.no_power == ""
    few = np.array([[0, 1], [1, 2]])  # two sequences, far too few samples: pooled into one cell
    tests, _, _ = sampled_tests(jax.random.key(0), target, (1, 2, 3), few, few[::-1], Sampling(), alpha=1e-3)
    first = next(t for t in tests if t.name == "hashed two-sample chi2, first 1 tokens")
    assert first.dof == 0 and first.no_power == "every cell pooled into one (dof 0)"


def test_a_vacuous_prefix_beside_a_longer_one_with_power_is_not_inconclusive():
    """A near-certain first token (two rare rows beside 254 common ones: pooled into one
    cell) is vacuous for the 1-token hashed test; the 2-token test has power, so the run is
    not inconclusive for it (the SmolLM2 run of docs/EVIDENCE.md)."""
    import jax

    from jaxspec.core.settings import Sampling
    from jaxspec.exactness.harness import default_pair
    from jaxspec.exactness.sampled import sampled_tests

    target, _ = default_pair(0)
    rng = np.random.default_rng(1)
    spec, ar = rng.integers(0, 4, (256, 2)), rng.integers(0, 4, (256, 2))
    spec[:, 0] = ar[:, 0] = 2
    spec[:2, 0] = 3
    tests, _, _ = sampled_tests(jax.random.key(0), target, (1, 2, 3), spec, ar, Sampling(), alpha=1e-3)
    one, two = (next(t for t in tests if t.name == f"hashed two-sample chi2, first {k} tokens") for k in (1, 2))
    assert one.dof == 0 and one.no_power == "" and "vacuous" in one.note
    assert two.dof >= 1 and two.has_power
