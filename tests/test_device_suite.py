"""benchmarks/device_suite.py, the accelerator suite, at its CPU size (``--quick``): the three
parts run and the report holds what the accelerator run is for (a subprocess, as a user runs
the script; ``long``: about two minutes on 2 cores)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_run_writes_the_three_parts(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_suite.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "quick"
    report = json.loads((out / "device_suite.json").read_text())
    assert (out / "device_suite.png").is_file()
    assert report["size"] == "quick" and set(report["parts"]) == {"decode", "verify_cost", "exactness"}
    assert pathlib.Path(report["parts"]["decode"]["report"]).is_file()
    assert report["parts"]["decode"]["headline"]["decode_speedup"] > 0
    rows = report["parts"]["verify_cost"]["rows"]
    assert sorted({x["n"] for x in rows}) == [1, 2, 4, 8, 16]
    assert all(x["seconds"] > 0 for x in rows)
    assert all(x["over_one_token"] == 1.0 for x in rows if x["n"] == 1)
    ex = report["parts"]["exactness"]
    assert ex["num_samples"] == 10**5 and ex["verdict"] == "passed", ex
    assert all(0.0 <= p <= 1.0 for p in ex["pvalues"].values())
    assert report["total_seconds"] == sum(p["seconds"] for p in report["parts"].values())
    assert "| batch | N | ms | / one token |" in r.stdout
