"""benchmarks/device_suite.py, the accelerator suite, at its CPU size (``--quick``): its parts
run and the report holds what the accelerator run is for (a subprocess, as a user runs the
script; ``long``: about a minute on 2 cores). The decode part is ``jaxspec bench --only decode``
at its tiny size, which tests/test_bench.py::test_decode_tiny runs: here ``--parts`` leaves it
out."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_run_writes_its_parts(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_suite.py"), "--quick", "--out", str(tmp_path),
                        "--parts", "exactness,verify_cost"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "quick"
    report = json.loads((out / "device_suite.json").read_text())
    assert (out / "device_suite.png").is_file()
    assert report["size"] == "quick" and list(report["parts"]) == ["verify_cost", "exactness"]  # the suite's order
    rows = report["parts"]["verify_cost"]["rows"]
    assert sorted({x["n"] for x in rows}) == [1, 2, 4, 8, 16]
    assert all(x["seconds"] > 0 for x in rows)
    assert all(x["over_one_token"] == 1.0 for x in rows if x["n"] == 1)
    ex = report["parts"]["exactness"]
    assert ex["num_samples"] == 10**5 and ex["verdict"] == "passed", ex
    assert all(0.0 <= p <= 1.0 for p in ex["pvalues"].values())
    assert report["total_seconds"] == sum(p["seconds"] for p in report["parts"].values())
    assert "| batch | N | ms | / one token |" in r.stdout


def test_a_bad_part_is_refused_before_anything_runs():
    for bad, said in (("decode,speed", "'speed' is not a part"), (",", "no part named")):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_suite.py"), "--parts", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and said in r.stderr and "decode, verify_cost, exactness" in r.stderr, r.stderr
