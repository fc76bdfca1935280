"""The unrolled CPU lowering of Threefry (jaxspec.core.cpu_rng): the cipher's known answers,
and the same bits and the same generated tokens as JAX's own lowering, in a fresh process
(registering it changes the process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.core import cpu_rng

# Random123's known-answer tests for Threefry-2x32 with 20 rounds: (key, counter, output)
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key,ctr,want", KAT)
def test_known_answers(key, ctr, want):
    u = [jnp.uint32(x) for x in (*key, *ctr)]
    got = cpu_rng.threefry2x32(*u)
    assert [int(x) for x in got] == list(want)


def test_broadcast_words_match_one_by_one():
    rng = np.random.default_rng(0)
    x1, x2 = (rng.integers(0, 2**32, size=(3, 5), dtype=np.uint32) for _ in range(2))
    k1, k2 = np.uint32(7), np.uint32(0xDEADBEEF)
    a, b = cpu_rng.threefry2x32(jnp.uint32(k1), jnp.uint32(k2), jnp.asarray(x1), jnp.asarray(x2))
    for i, j in np.ndindex(3, 5):
        ai, bi = cpu_rng.threefry2x32(jnp.uint32(k1), jnp.uint32(k2), jnp.uint32(x1[i, j]), jnp.uint32(x2[i, j]))
        assert (int(a[i, j]), int(b[i, j])) == (int(ai), int(bi))


def test_environment_switch(monkeypatch):
    monkeypatch.delenv(cpu_rng.ROLLED_ENV, raising=False)
    assert cpu_rng.wanted_by_environment()
    monkeypatch.setenv(cpu_rng.ROLLED_ENV, "0")
    assert cpu_rng.wanted_by_environment()
    monkeypatch.setenv(cpu_rng.ROLLED_ENV, "1")
    assert not cpu_rng.wanted_by_environment()


SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jaxspec
from jaxspec.core import cpu_rng
from jaxspec.exactness.harness import default_pair

def draws(key):
    k = jax.random.fold_in(key, 3)
    return [jax.random.bits(k, (7,)), jax.random.uniform(jax.random.split(key, 5)[3], (2, 3)),
            jax.random.gumbel(key, (11,)), jax.random.categorical(k, jnp.log(jnp.arange(1.0, 6.0))),
            jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), (4,)))(jnp.arange(6))]

target, draft = default_pair(0, vocab_size=32, hidden_size=16)
def decode():
    return jaxspec.generate(jax.random.key(5), target, draft, [[1, 2, 3], [4]], max_new_tokens=12,
                            tree="branch:2,1", sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=())

key = jax.random.key(42)
loops_before = jax.jit(lambda k: jax.random.split(k, 3)).lower(key).compile().as_text().count(" while(")
before = [np.asarray(x).tolist() for x in jax.jit(draws)(key)]
out_before = decode()
out = {"in_use_before": cpu_rng.unrolled_threefry_in_use(), "registered": jaxspec.use_unrolled_threefry(),
       "again": jaxspec.use_unrolled_threefry(), "in_use": cpu_rng.unrolled_threefry_in_use()}
jaxspec.decode.generate.compiled.cache_clear()  # compile anew, under the new lowering
after = [np.asarray(x).tolist() for x in jax.jit(lambda k: draws(k))(key)]
out_after = decode()
out["same_draws"] = before == after
out["same_tokens"] = all(np.array_equal(np.asarray(a), np.asarray(b))
                         for a, b in zip(jax.tree.leaves(out_before), jax.tree.leaves(out_after)))
hlo = jax.jit(lambda k: jax.random.split(k, 3)).lower(key).compile().as_text()
out["loops_in_a_split"] = [loops_before > 0, hlo.count(" while(")]
print(json.dumps(out))
"""


def _run(code, env=None):
    """The last stdout line of ``python -c code`` (environment ``env``, default this one), as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ) if env is None else env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_same_bits_and_same_tokens_in_a_fresh_process():
    got = _run(SCRIPT)
    assert got == {"in_use_before": False, "registered": True, "again": True, "in_use": True,
                   "same_draws": True, "same_tokens": True, "loops_in_a_split": [True, 0]}


CLI = r"""
import json
from jaxspec.cli import main
from jaxspec.cli.common import Command
from jaxspec.core import cpu_rng
seen = {}
def setup(p):
    def run(args):
        seen["in_use"] = cpu_rng.unrolled_threefry_in_use()
        return 0
    return run
status = main(["probe"], commands=[Command("probe", "report the lowering", setup)])
print(json.dumps({"status": status, **seen}))
"""


@pytest.mark.parametrize("env,want", [({}, True), ({cpu_rng.ROLLED_ENV: "1"}, False)])
def test_the_command_line_registers_it_unless_told_not_to(env, want):
    base = {k: v for k, v in os.environ.items() if k != cpu_rng.ROLLED_ENV}
    assert _run(CLI, {**base, **env}) == {"status": 0, "in_use": want}


def test_threefry_benchmark_tiny(tmp_path):
    """``python benchmarks/threefry_lowering.py --tiny``: both lowerings return the same
    tokens for every case, and the ratios are the quotients of the times."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "threefry_lowering.py")
    proc = subprocess.run([sys.executable, script, "--tiny", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "threefry_lowering.json").read_text())
    assert (tmp_path / "threefry_lowering.png").stat().st_size > 0
    assert {r["mode"] for r in report["rows"]} == {"target-only", "speculative"}
    for r in report["rows"]:
        assert r["same_tokens"] is True
        assert r["time_ratio"] == pytest.approx(r["unrolled_s"] / r["rolled_s"])
    assert report["headline"]["threefry_same_tokens"] is True
    assert "| 1 | 1 | speculative | chain:2 |" in proc.stdout


def test_threefry_benchmark_refuses_a_process_already_changed():
    code = ("from jaxspec.core import cpu_rng; from jaxspec.bench import threefry\n"
            "cpu_rng.use_unrolled_threefry()\n"
            "try:\n    threefry.run('tiny')\nexcept RuntimeError as e:\n    import json; print(json.dumps(str(e)))\n")
    assert "already registered" in _run(code)
