"""generate, generate_autoregressive and verify on a device mesh (jaxspec.nn.sharding).

The mesh runs happen in subprocesses with 8 host devices (XLA_FLAGS must be set before
JAX starts): ``tests/_mesh_worker.py`` computes, the tests here check. The same tokens as
one device is the spec: row randomness is ``fold_in(key, b)`` whatever the mesh.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.nn import sharding
from _env import host_devices_env
from _tiny import tiny_pair

HERE = Path(__file__).parent
TIMEOUT = 900


def _worker(*parts: str) -> dict:
    env = host_devices_env(8)
    r = subprocess.run([sys.executable, str(HERE / "_mesh_worker.py"), *parts], capture_output=True, text=True,
                       env=env, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


TREES = ("chain:3", "branch:2,2", "dynamic:depth=3,topk=2,nodes=5")
GEN_CASES = [f"{tree} T=1.0 mesh=(2, 4)" for tree in TREES[1:]] + [
    "target-only T=1.0 mesh=(2, 4)", "user drafter branch:2,2 T=1.0 mesh=(2, 4)"]

# One subprocess per part of the worker, each part one test: a module fixture would run
# the worker once per xdist process.


def test_mesh_tokens_equal_one_device():
    """Sampled tokens (T = 1) on the mesh are the one-device tokens, for 6 ragged rows
    (padded to the data axis) and a stop token: a branching tree, a dynamic tree, target-only
    decoding and a user drafter on (2, 4). The slow test below runs every tree on every mesh
    at T = 0 and T = 1."""
    res = _worker("generations")["generations"]
    assert sorted(res) == sorted(GEN_CASES)
    bad = [k for k, r in res.items() if r["mesh"] != r["ref"] or r.get("lengths") != r.get("ref_lengths")]
    assert not bad, bad
    assert all(len(set(r["ref_lengths"])) > 1 for r in res.values() if "ref_lengths" in r)  # ragged ends


def test_streaming_on_a_mesh():
    """``on_round`` on a (4, 2) mesh: the one-device tokens, one call a round with the
    caller's 6 rows (not the 8 of the padded data axis), the last call the result."""
    res = _worker("streamed")["streamed"]
    for mode, r in res.items():
        assert r["mesh"] == r["ref"], mode
        assert r["shapes"] == [True], mode  # every call: int32[6, 10]
        assert r["calls"] == r["loop_rounds"] and r["last_lengths"] == r["lengths"], mode
        assert r["warnings"] == [], mode  # e.g. donated buffers a round's program could not reuse


@pytest.mark.slow
def test_mesh_tokens_equal_one_device_every_tree_every_mesh():
    res = _worker("generations_all")["generations"]
    assert len(res) == 2 * (3 * 3 + 1) + 2  # per temperature: trees x meshes, target-only; n-gram, user drafters
    bad = [k for k, r in res.items() if r["mesh"] != r["ref"]]
    assert not bad, bad


def test_parameters_and_caches_are_split():
    p = _worker("placements")["placements"]
    s24 = p["(2, 4)"]["specs"]
    # q/k/v and gate/up split by columns (heads, intermediate), o/down by rows, vocabulary split
    assert s24["q_proj"] == [None, "model"] and s24["k_proj"] == [None, "model"]
    assert s24["o_proj"] == ["model", None] and s24["down_proj"] == ["model", None]
    assert s24["gate_proj"] == [None, "model"]
    assert s24["embed_tokens"] == ["model", None] and s24["lm_head"] == [None, "model"]
    assert s24["norm"] == [None]
    assert p["(2, 4)"]["q_proj_shard_shape"] == [32, 32 // 4]  # [D, H*hd / 4] on each device
    # 4 KV heads on a model axis of 8: K/V projections replicated, query heads still split
    s18 = p["(1, 8)"]["specs"]
    assert s18["k_proj"] == [None, None] and s18["q_proj"] == [None, "model"]
    # the compiled loop holds the cache per device as [L, B/2, S, Hkv/4, hd], never whole;
    # the output rows stay split over data
    assert p["(2, 4)"]["cache_local_in_hlo"] > 0 and p["(2, 4)"]["cache_whole_in_hlo"] == 0
    assert p["(2, 4)"]["tokens_spec"] == ["data"]


# slow: the harness on a model-split mesh passes in test_cli_verify_on_a_mesh ((2, 2), through the
# command line), and its counts on 8 data-parallel devices equal one device's in test_exactness;
# this compares a (2, 4) mesh's counts with one device's at 2^15 samples (53 s)
@pytest.mark.slow
def test_harness_passes_on_a_mesh():
    h = _worker("harness")["harness"]
    assert h["mesh"]["mesh"] == {"data": 2, "model": 4}
    assert h["one"]["verdict"] == "passed" and h["mesh"]["verdict"] == "passed"
    one, mesh = np.asarray(h["one"]["counts"]), np.asarray(h["mesh"]["counts"])
    assert one.sum() == mesh.sum() == 2**15
    # a model split sums o_proj/down_proj partials in another order: a sample may move
    # cell when its uniform draw lies within that rounding of a boundary, rarely
    assert np.abs(one - mesh).sum() <= 2 * 8, (one, mesh)


def test_refused_meshes_name_the_problem():
    e = _worker("errors")["errors"]
    assert e["heads"].startswith("target: num_attention_heads = 3 is not divisible by the mesh's model axis (4)")
    assert e["kv_heads"].startswith("target: num_key_value_heads = 3 and the mesh's model axis (2)")
    assert e["draft_heads"].startswith("draft: num_attention_heads = 3")
    assert e["not_a_mesh"].startswith("mesh = 'data=2': expected a jax.sharding.Mesh")
    assert "axis names ('rows',)" in e["axis_names"]
    assert "16 devices; 8 visible" in e["too_many"] and "xla_force_host_platform_device_count" in e["too_many"]
    assert e["verify_devices_and_mesh"].startswith("devices/mesh: pass one of them")


@pytest.mark.parametrize("spec, sizes", [("data=2,model=4", {"data": 2, "model": 4}), ("model=8", {"model": 8}),
                                         (" data = 3 ", {"data": 3})])
def test_parse_mesh(spec, sizes):
    assert sharding.parse_mesh(spec) == sizes


@pytest.mark.parametrize("spec, msg", [("data=2,gpu=4", "unknown axis 'gpu'"), ("data=0", "data = 0"),
                                       ("data=2,data=2", "given twice"), ("data:2", "is not AXIS=SIZE"),
                                       ("", "expected 'data=N'")])
def test_parse_mesh_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        sharding.parse_mesh(spec)


def test_one_device_mesh_is_plain_generation():
    """A (1, 1) mesh runs in this process: same tokens as no mesh, and no padding."""
    t, d = tiny_pair(1, vocab_size=8, hidden_size=16, num_heads=2)
    kw = dict(max_new_tokens=4, tree="chain:2", sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=())
    a = jaxspec.generate(jax.random.key(3), t, d, [[1, 2], [3]], **kw)
    b = jaxspec.generate(jax.random.key(3), t, d, [[1, 2], [3]], mesh=jaxspec.make_mesh(1, 1), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert sharding.full_mesh(jaxspec.make_mesh(1, 1)).axis_names == ("data", "model")
    with pytest.raises(ValueError, match="make_mesh: model = 0"):
        jaxspec.make_mesh(1, 0)


def _cli(*argv, devices=None):
    env = host_devices_env(None)  # the CLI adds the host device count --mesh needs
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", *argv], capture_output=True, text=True, env=env,
                       timeout=TIMEOUT)
    return r


def test_cli_generate_on_a_mesh_gives_the_one_device_tokens():
    base = ["generate", "--prompt", "def fibonacci(n):", "--max-new-tokens", "16", "--json", "--seed", "3",
            "--no-warmup"]
    one = _cli(*base)
    mesh = _cli(*base, "--mesh", "data=1,model=2")
    assert one.returncode == 0 and mesh.returncode == 0, (one.stderr[-2000:], mesh.stderr[-2000:])
    a, b = json.loads(one.stdout), json.loads(mesh.stdout)
    assert b["mesh"] == {"data": 1, "model": 2} and a["mesh"] is None
    assert b["tokens"] == a["tokens"]


def test_cli_refuses_a_mesh_the_models_do_not_fit():
    r = _cli("generate", "--prompt", "x", "--max-new-tokens", "2", "--mesh", "model=4")
    assert r.returncode == 2
    assert "draft: num_attention_heads = 2 is not divisible by the mesh's model axis (4)" in r.stderr
    r = _cli("generate", "--prompt", "x", "--mesh", "data=2,gpu=4")
    assert r.returncode == 2 and "--mesh: unknown axis 'gpu'" in r.stderr
    r = _cli("generate", "--prompt", "x", "--mesh", "data=2", "--tree", "auto")
    assert r.returncode == 2 and "--tree auto and --mesh" in r.stderr


def test_cli_verify_on_a_mesh():
    r = _cli("verify", "--mesh", "data=2,model=2", "--samples", "8192", "--chunk-size", "4096", "--no-acceptance",
             "--json", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["config"]["mesh"] == {"data": 2, "model": 2} and rep["verdict"] == "passed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_one_mesh_same_tokens():
    """Two CPU processes form one JAX cluster (localhost coordinator, gloo collectives), a
    (2, 2) mesh over their 4 devices; both get every row, equal to one process's tokens."""
    port = _free_port()
    env = host_devices_env(2)
    procs = [subprocess.Popen([sys.executable, str(HERE / "_multihost_worker.py"), str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
    assert [o["process"] for o in outs] == [0, 1]
    assert all(o["processes"] == 2 and o["devices"] == 4 and o["local_devices"] == 2 for o in outs)
    t, d = tiny_pair(3, vocab_size=16, hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=1)
    ref = jaxspec.generate(jax.random.key(7), t, d, [[1, 2, 3], [4, 5], [6]], max_new_tokens=8, tree="branch:2,2",
                           sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=())
    assert outs[0]["tokens"] == outs[1]["tokens"] == np.asarray(ref.tokens).tolist()
