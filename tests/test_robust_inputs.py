"""Hostile inputs, second round (issue 41): a ``--mesh`` of more devices than exist, meshes
built by ``jax.make_mesh`` (explicit axis types), damaged checkpoints given to ``--resume``,
``distill --init`` with another config, and ``verify`` asked for more joint cells than it
counts. Each is refused at the boundary, naming the flag or argument, the value and what
was expected (exit status 2 on the command line), or, for ``jax.make_mesh``, accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxspec import Sampling
from jaxspec.cli import main
from jaxspec.formats.checkpoint import save_model
from jaxspec.nn.model import init_model
from _env import host_devices_env

HERE = Path(__file__).parent
TIMEOUT = 900


def _python(code: str, *, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=TIMEOUT,
                          cwd=HERE)


# ----------------------------------------------------------------------------- --mesh: too many devices

def test_mesh_flag_refuses_more_host_devices_than_the_limit():
    """``--mesh data=1000`` on a CPU machine: the command line made 1000 host devices and
    XLA aborted while compiling for them (exit -6, or the kernel killed it). It makes at
    most :func:`jaxspec.nn.sharding.host_device_limit` itself, and refuses the mesh with
    the count of devices available, exit 2."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the command line sets the host device count --mesh needs
    probe = textwrap.dedent("""
        import jax
        from jaxspec.cli.common import CLIError, flag_mesh
        try:
            flag_mesh({"data": 1000})
            print("made", jax.device_count())
        except CLIError as e:
            print("refused", jax.device_count(), e)
    """)
    r = _python(probe, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.strip().splitlines()[-1]
    assert out.startswith("refused"), out
    from jaxspec.nn.sharding import host_device_limit

    limit = host_device_limit()
    assert out.split()[1] == str(limit)  # no more host devices than the limit were made
    assert "--mesh data=1000,model=1" in out and f"1000 devices; {limit} visible" in out, out
    assert "XLA_FLAGS" in out, out  # how to ask for more


def test_cli_refuses_a_mesh_of_more_host_devices_than_the_limit():
    """The whole command: exit 2 and one line with the count of devices available."""
    from jaxspec.nn.sharding import host_device_limit

    limit = host_device_limit()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", "generate", "--prompt", "x", "--mesh", "data=1000"],
                       capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert f"1000 devices; {limit} visible" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


# ----------------------------------------------------------------------------- jax.make_mesh

_JAX_MESH = textwrap.dedent("""
    import json
    import jax
    import numpy as np
    import jaxspec
    from _tiny import tiny_pair

    t, d = tiny_pair(3, vocab_size=16, hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=1, head_scale=4.0)
    prompts = [[1, 2, 3], [4, 5], [6]]
    kw = dict(max_new_tokens=6, sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=())

    def tokens(fn):
        try:
            return np.asarray(fn().tokens).tolist()
        except Exception as e:  # noqa: BLE001 - reported to the test
            return f"{type(e).__name__}: {e}"[:400]

    def spec(mesh):
        return tokens(lambda: jaxspec.generate(jax.random.key(7), t, d, prompts, tree="chain:2", mesh=mesh, **kw))

    def ar(mesh):
        return tokens(lambda: jaxspec.generate_autoregressive(jax.random.key(7), t, prompts, mesh=mesh, **kw))

    explicit = jax.make_mesh((2, 2), ("data", "model"))
    out = {"axis_types": [str(a) for a in explicit.axis_types],
           "spec": {"one": spec(None), "jaxspec": spec(jaxspec.make_mesh(2, 2)), "jax": spec(explicit)},
           "ar": {"one": ar(None), "jaxspec": ar(jaxspec.make_mesh(2, 2)), "jax": ar(explicit)}}
    try:
        jaxspec.generate(jax.random.key(7), t, d, prompts, mesh=jax.make_mesh((2, 2), ("rows", "model")), **kw)
        out["bad_names"] = None
    except ValueError as e:
        out["bad_names"] = str(e)
    print(json.dumps(out))
""")


def test_jax_make_mesh_gives_the_one_device_tokens():
    """``jax.make_mesh`` (explicit axis types in jax 0.10) failed inside the decode loop
    with a ``ShardingTypeError``; ``generate`` and ``generate_autoregressive`` now give the
    one-device tokens on it, as on ``jaxspec.make_mesh``. Other axis names are refused,
    naming the expected ones."""
    env = host_devices_env(4)
    r = _python(_JAX_MESH, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert "Explicit" in res["axis_types"][0]  # the kind of mesh the issue is about
    for mode in ("spec", "ar"):
        got = res[mode]
        assert isinstance(got["one"], list), got["one"]
        assert got["jaxspec"] == got["one"], (mode, got["jaxspec"])
        assert got["jax"] == got["one"], (mode, got["jax"])
    assert "axis names ('rows', 'model')" in res["bad_names"], res["bad_names"]
    assert "expected 'data', 'model' or both" in res["bad_names"], res["bad_names"]


# ----------------------------------------------------------------------------- train --resume, damaged

_TRAIN = ["train", "--preset", "tiny", "--steps", "4", "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1",
          "--eval-every", "4", "--eval-windows", "2", "--checkpoint-every", "2", "--max-files", "2", "--no-progress"]

_META = {"kind": "train", "model_config": {}, "train_config": {}, "corpus_digest": "x", "step": 2,
         "sampler_state": {}, "history": [], "train_time_s": 1.0}


def _checkpoint(tmp_path, meta_text: str, state: bytes | None = None) -> Path:
    """``tmp_path/run`` with a ``checkpoint`` folder of the given files."""
    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(meta_text)
    if state is None:
        save_file({"x": np.zeros(3, np.float32)}, ckpt / "state.safetensors")
    else:
        (ckpt / "state.safetensors").write_bytes(state)
    return ckpt


def _truncated_state(tmp_path) -> bytes:
    save_file({"['params']['w']": np.arange(64, dtype=np.float32)}, tmp_path / "whole.safetensors")
    data = (tmp_path / "whole.safetensors").read_bytes()
    return data[: len(data) // 2]


@pytest.mark.parametrize("case", ["not-json", "not-an-object", "no-model-config", "bad-step", "truncated-state"])
def test_resume_from_a_damaged_checkpoint_names_the_file(tmp_path, capsys, case):
    """``train --resume`` from a damaged folder showed a JSON parse error, ``KeyError:
    'model_config'`` or safetensors' "incomplete metadata"; now one line naming the file
    and what is wrong with it, exit 2."""
    meta = dict(_META)
    if case == "no-model-config":
        del meta["model_config"]
    if case == "bad-step":
        meta["step"] = "two"
    text = {"not-json": '{"kind": "train", "step":', "not-an-object": "[1, 2]"}.get(case, json.dumps(meta))
    ckpt = _checkpoint(tmp_path, text, _truncated_state(tmp_path) if case == "truncated-state" else None)
    code = main([*_TRAIN, "--out", str(tmp_path / "run"), "--resume"])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and err.count("error:") == 1, err
    want = {
        "not-json": (f"{ckpt / 'state.json'}: not valid JSON",),
        "not-an-object": (f"{ckpt / 'state.json'}: expected a JSON object",),
        "no-model-config": (f"{ckpt / 'state.json'}: no 'model_config'",),
        "bad-step": (f"{ckpt / 'state.json'}: 'step' = 'two'", "expected an integer >= 0"),
        "truncated-state": (f"{ckpt / 'state.safetensors'}: cannot be read",),
    }[case]
    for needle in want:
        assert needle in err, err
    assert "damaged" in err and "--out" in err, err  # what to do: start over in another folder


def test_train_head_resume_from_a_damaged_checkpoint_names_the_file(tmp_path):
    """``train_head`` reads the checkpoint's settings before ``fit``: the same message."""
    import jaxspec.training.head as head_mod
    from jaxspec.training.train import PRESETS, TrainConfig

    ckpt = _checkpoint(tmp_path, "not json")
    import jax

    target = init_model(PRESETS["tiny"], jax.random.key(0))
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=4, eval_windows=2)
    with pytest.raises(ValueError, match=f"resume: {ckpt / 'state.json'}: not valid JSON"):
        head_mod.train_head(target, cfg, tmp_path / "run", resume=True, progress=False)


# ----------------------------------------------------------------------------- distill --init

def test_distill_init_with_another_config_names_the_flag(tmp_path, capsys):
    """``distill --init DIR`` whose config differs from the requested draft: the differing
    fields, by their flags, and ``--init`` with its value, which brought them."""
    import dataclasses

    import jax
    from jaxspec.training.train import PRESETS

    target = save_model(init_model(PRESETS["tiny"], jax.random.key(0)), tmp_path / "target")
    other = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=1, num_attention_heads=1, head_dim=None)
    init = save_model(init_model(other, jax.random.key(1)), tmp_path / "init")
    code = main(["distill", "--target", str(target), "--init", str(init), "--preset", "tiny", "--layers", "1",
                 "--max-compute-ratio", "10", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
                 "--warmup-steps", "1", "--max-files", "2", "--no-progress", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert f"--init {init}" in err, err
    assert "--heads = 1 in --init, 2 requested" in err and "intermediate" not in err, err


# ----------------------------------------------------------------------------- verify: too many cells

@pytest.mark.parametrize("argv, needles", [
    # a top-k above the vocabulary keeps every token: 4**12 cells
    (["--top-k", "100", "--horizon", "12"],
     ["--top-k 100 and --horizon 12", "4**12 = 16777216 joint cells", "more than MAX_CELLS = 1048576"]),
    (["--top-k", "3", "--horizon", "13"], ["--top-k 3 and --horizon 13", "3**13 = 1594323 joint cells"]),
])
def test_verify_refuses_too_many_cells_before_enumerating(monkeypatch, capsys, argv, needles):
    """A top-k given: the check of ``vocab**horizon`` cells did not apply, and the exact
    law was enumerated level by level (dense ``[rows, V]`` laws) until the kernel killed
    it. ``min(top_k, V)**horizon`` is known from the flags: refused before enumerating
    (``--method enumerate``; ``auto`` tests such a law without enumeration)."""
    import jaxspec.exactness.harness as harness

    def no_enumeration(*a, **k):
        raise AssertionError("exact_law was called: the cell count was not checked first")

    monkeypatch.setattr(harness, "exact_law", no_enumeration)
    code = main(["verify", *argv, "--method", "enumerate", "--samples", "1000", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    for needle in needles:
        assert needle in err, err


def test_verify_library_refuses_too_many_cells_with_a_top_k(monkeypatch):
    import jaxspec
    import jaxspec.exactness.harness as harness

    monkeypatch.setattr(harness, "exact_law", lambda *a, **k: pytest.fail("exact_law was called"))
    with pytest.raises(jaxspec.SettingError, match=r"^top_k = 100 and horizon = 12: min\(top_k, the target's 4 tokens\) "
                                                   r"give up to 4\*\*12 = 16777216 joint cells"):
        jaxspec.verify(sampling=jaxspec.Sampling(top_k=100), horizon=12, num_samples=1000, progress=False,
                       method="enumerate")


# ----------------------------------------------------------------------------- a caller's rule or drafter

def _caller_code_cases():
    """(name, a rule or a draft that breaks the protocol, the message expected): each is run
    under jax.eval_shape before the loop is traced, and named by its field."""
    import dataclasses

    import jax.numpy as jnp

    from jaxspec.core.token_rule import accept_core

    sys.path.insert(0, str(HERE))
    from _user_drafter import Bigram

    def tuple_rule(*a):
        return tuple(accept_core(*a))

    def float_rule(*a):
        r = accept_core(*a)
        return r._replace(tokens=r.tokens.astype(jnp.float32))

    @dataclasses.dataclass(frozen=True)
    class FloatTokens(Bigram):
        def propose(self, *a):
            p = super().propose(*a)
            return p._replace(tokens=p.tokens.astype(jnp.float32))

    @dataclasses.dataclass(frozen=True)
    class StateGrows(Bigram):
        def commit(self, params, state, outcome, commit_cache):
            return (outcome.num,)

    @dataclasses.dataclass(frozen=True)
    class NoLaws(Bigram):
        def propose(self, *a):
            return super().propose(*a)._replace(probs=None)

    @dataclasses.dataclass(frozen=True)
    class Typo(Bigram):
        def propose(self, params, target, state, ctx, keys, law):
            return ctx.roots

    return [
        ("rule", tuple_rule, r"rule = .*tuple_rule: returned tuple; expected a jaxspec.AcceptResult"),
        ("rule", float_rule, r"rule = .*float_rule: AcceptResult.tokens = float32\[7\]; expected int32\[7\]"),
        ("draft", FloatTokens, r"draft: FloatTokens.propose: Proposal.tokens = float32\[2, 6\]; expected int32\[2, 6\]"),
        ("draft", StateGrows, r"draft: StateGrows.commit returned its state with structure .*expected init's"),
        ("draft", NoLaws, r"draft: NoLaws.propose returned probs = None \(fixed choices\) under scheme 'iid'"),
        ("draft", Typo, r"draft: Typo.propose failed when traced .*AttributeError: .*'roots'"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_caller_rule_or_drafter_breaking_the_protocol_is_named(case):
    """A rule returning the wrong structure or dtype, or a drafter whose proposal or state
    breaks the protocol, used to fail inside the traced loop (``DynamicJaxprTracer has no
    attribute num_tokens``, a ``while_loop`` carry mismatch). Checked once with
    ``jax.eval_shape`` on abstract inputs, before the loop: named with its field."""
    import jax

    import jaxspec
    from _tiny import tiny_pair

    kind, obj, match = _caller_code_cases()[case]
    target, draft = tiny_pair(0, vocab_size=8)
    kw = dict(max_new_tokens=2, tree="branch:2,2", scheme="iid")
    with pytest.raises(ValueError, match=match):
        if kind == "rule":
            jaxspec.generate(jax.random.key(0), target, draft, [[1], [2]], rule=obj, **kw)
        else:
            table = np.zeros((8, 8), np.float32)
            holder = (obj(8), table)  # a drafter with params: the pair
            jaxspec.generate(jax.random.key(0), target, holder, [[1], [2]], **kw)


# ----------------------------------------------------------------------------- q = 0 drafts

def test_speculative_accept_refuses_a_token_the_draft_law_could_not_draw():
    """A drafted token whose ``draft_probs`` entry is 0 was accepted with certainty
    (``p / q = inf``): 4 of 4 such tokens accepted, a law far from p, no error. That is the
    sign of ``q`` computed under other warps than the draws (Hugging Face #47932). With
    concrete inputs it is refused, naming the node, the token and its q; without replacement
    a sibling may have q = 0 once the earlier ones took q's whole mass; the deterministic
    scheme reads no q."""
    import jax

    from jaxspec import speculative_accept

    v = 4
    p = np.full((3, v), 0.25, np.float32)
    q = np.array([[0.5, 0.5, 0.0, 0.0]] * 3, np.float32)
    key = jax.random.key(0)
    for scheme in ("iid", "without_replacement"):
        with pytest.raises(ValueError, match=r"tokens\[1\] = 3: draft_probs\[0\]\[3\] = 0, so the draft law of "
                                             r"node 1's parent row could not have drawn it"):
            speculative_accept(key, [-1, -1], np.array([0, 3]), p, q, scheme=scheme)
    # without replacement, siblings 0 and 1 exhaust q's support: a third child has q = 0
    r = speculative_accept(key, [-1, -1, -1], np.array([0, 1, 2]), np.full((4, v), 0.25, np.float32),
                           np.array([[0.5, 0.5, 0.0, 0.0]] * 4, np.float32), scheme="without_replacement")
    assert int(r.num_tokens) >= 1
    speculative_accept(key, [-1, -1], np.array([0, 3]), p, q, scheme="deterministic")  # q is not read


# ----------------------------------------------------------------------------- sizes that cannot fit

@pytest.mark.parametrize("spec,needle", [
    ("chain:200", "tree spec 'chain:200': depth 200 exceeds MAX_TREE_DEPTH = 64"),
    ("chain:1000000000", "tree spec 'chain:1000000000': 1000000000 nodes exceed MAX_TREE_NODES = 1024"),
    ("branch:1000000000", "tree spec 'branch:1000000000': 1000000000 nodes exceed MAX_TREE_NODES = 1024"),
    ("dynamic:depth=3,topk=1000,nodes=10", "candidates per round exceed MAX_DYNAMIC_POOL = 65536"),
])
def test_trees_that_cannot_fit_are_refused_before_anything_is_built(spec, needle, capsys):
    """``--tree chain:200`` was killed by the kernel while compiling 200 unrolled draft
    forwards, ``chain:1000000000`` raised MemoryError and ``branch:1000000000`` was killed:
    the node count and the depth are known from the spec, and refused from it (exit 2)."""
    assert main(["generate", "--tree", spec, "--prompt", "hi", "--max-new-tokens", "4"]) == 2
    assert needle in capsys.readouterr().err


def test_generate_refuses_more_rows_than_fit_and_says_how_many_do(monkeypatch):
    """A million rows of a tiny model asked for 80 GB and were killed: the memory of a call
    is estimated from its shapes first (jaxspec.decode.memory), and a call that cannot fit
    is refused with the number of rows that would, as ``rows=`` (continuous batching)."""
    import re

    import jax

    import jaxspec
    from jaxspec.decode import memory

    sys.path.insert(0, str(HERE))
    from _tiny import tiny_pair

    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 8 << 30)  # a machine of 8 GiB
    target, draft = tiny_pair(0, vocab_size=264)
    prompts = np.ones((10**6, 4), np.int32)
    with pytest.raises(ValueError, match=r"prompts: 1000000 rows would need about [\d.]+ GiB .* more than the "
                                         r"device's 8.0 GiB; about (\d+) rows fit: pass fewer prompts, or rows=\d+"):
        jaxspec.generate(jax.random.key(0), target, draft, prompts, max_new_tokens=32)
    with pytest.raises(ValueError, match=r"prompts: 1000000 rows would need"):
        jaxspec.generate_autoregressive(jax.random.key(0), target, prompts, max_new_tokens=32)
    try:
        jaxspec.generate(jax.random.key(0), target, draft, prompts, max_new_tokens=32)
    except ValueError as e:
        fit = int(re.search(r"about (\d+) rows fit", str(e)).group(1))
    assert 5 * 10**4 < fit < 10**6  # the tiny model's rows: about 100 kB each (the prefill's scores most)
