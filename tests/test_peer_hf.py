"""Smoke test of benchmarks/peer_hf.py (jaxspec vs Hugging Face transformers): its tiny
size runs end to end and writes a well-formed report. Needs the ``hf`` extra (skipped
without it; ``.ci/run`` installs it and runs this file). The figures are the full run's,
in benchmarks/results/peer_hf.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_hf.py"
LOOKUP_MODES = {"hf_prompt_lookup", "hf_target_only", "jaxspec_ngram", "jaxspec_target_only"}
MODES = {"hf_assisted", "hf_prompt_lookup", "hf_target_only", "jaxspec_speculative", "jaxspec_target_only"}


def test_peer_hf_tiny_run_writes_its_report(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "tiny" / "peer_hf.json").read_text())
    assert (tmp_path / "tiny" / "peer_hf.png").stat().st_size > 0
    assert rep["benchmark"] == "peer_hf" and rep["size"] == "tiny"
    assert [row["temperature"] for row in rep["rows"]] == [0.0, 1.0]
    for row in rep["rows"]:
        assert set(row["tokens_per_s"]) == MODES and all(v > 0 for v in row["tokens_per_s"].values())
    greedy = rep["rows"][0]["greedy_tokens_agree"]
    assert greedy["jaxspec_speculative"]  # lossless: greedy speculative = greedy target-only
    assert "jaxspec spec / HF assisted" in r.stdout
    # prompt lookup in both libraries: one grounded and one code prompt at each temperature
    lk = rep["lookup_rows"]
    assert [(x["workload"], x["temperature"]) for x in lk] == [("grounded", 0.0), ("grounded", 1.0), ("code", 0.0),
                                                               ("code", 1.0)]
    assert all(set(x["tokens_per_s"]) == LOOKUP_MODES for x in lk)
    assert lk[0]["greedy_tokens_agree"]["jaxspec_ngram"]
    assert "jaxspec NgramDraft chain:4" in r.stdout
