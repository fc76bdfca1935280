"""The round-cost benchmark and its profile by named scope (jaxspec.bench.round_cost,
jaxspec.bench.scopes), and the entry points it times (start_program, run_compiled*)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import Sampling
from jaxspec.bench import round_cost, scopes
from jaxspec.cli import main
from jaxspec.decode import generate as gen
from jaxspec.decode.round import RoundState
from jaxspec.exactness.harness import default_pair
from jaxspec.nn.model import FORWARD_SCOPE

SCOPES = ("propose", "verify", "forward")

# a compiled module's text, cut down: a named loop-body op, an unnamed fused dot whose
# operand is named, a nested scope, an op of the loop body under no scope, one outside
HLO = """\
HloModule jit_f

%fused_computation.5 (param_0.5: f32[2,4]) -> f32[2,4] {
  %param_0.5 = f32[2,4]{1,0} parameter(0)
  ROOT %dot.1 = f32[2,4]{1,0} dot(%param_0.5, %param_0.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f32[2,4])) -> (s32[], f32[2,4]) {
  %p = (s32[], f32[2,4]) parameter(0)
  %copy_fusion.1 = f32[2,4]{1,0} fusion(%p), kind=kLoop, calls=%fc.1, metadata={op_name="jit(f)/while/body/verify/forward/mul"}
  %ynn_fusion.5 = f32[2,4]{1,0} fusion(%copy_fusion.1), kind=kCustom, calls=%fused_computation.5
  %add.3 = s32[] add(%p, %p), metadata={op_name="jit(f)/while/body/add"}
  %select.7 = f32[2,4]{1,0} select(%p, %ynn_fusion.5, %p), metadata={op_name="jit(f)/while/body/propose/select_n"}
  ROOT %tuple.2 = (s32[], f32[2,4]) tuple(%add.3, %select.7)
}

ENTRY %main (a: f32[2,4]) -> f32[2,4] {
  %a = f32[2,4]{1,0} parameter(0)
  %mul.9 = f32[2,4]{1,0} multiply(%a, %a), metadata={op_name="jit(f)/mul"}
}
"""


def test_instruction_scopes_of_a_literal_module():
    got = scopes.instruction_scopes(HLO, SCOPES)
    assert got["copy_fusion.1"] == "verify/forward"  # nested scopes, outermost first
    assert got["ynn_fusion.5"] == "verify/forward"  # no metadata: its operand's scope
    assert "dot.1" not in got  # inside a fused computation, no metadata, nothing named near it
    assert got["add.3"] == scopes.LOOP  # a loop body op under no listed scope
    assert got["select.7"] == "propose"
    assert got["mul.9"] == scopes.OUTSIDE


def test_profile_charges_the_work_to_its_scope():
    """A scope doing a 256x256 matmul chain takes most of the time; a scope adding two
    numbers takes little; every executed operation lands in a scope."""
    w = jnp.ones((256, 256), jnp.float32) * 1e-3

    @jax.jit
    def f(x):
        def body(i, x):
            with jax.named_scope("verify"):
                for _ in range(4):
                    x = jnp.tanh(x @ w)
            with jax.named_scope("propose"):
                s = x[0, 0] + 1.0
            return x + s * 1e-6

        return jax.lax.fori_loop(0, 20, body, x)

    x = jnp.ones((256, 256), jnp.float32)
    jax.block_until_ready(f(x))
    prof = scopes.profile_scopes(f, (x,), SCOPES, calls=2)
    assert prof["calls"] == 2
    sh = scopes.shares(prof["seconds"])
    assert prof["unattributed_seconds"] < 0.05 * sum(prof["seconds"].values())  # the loop's own plumbing at most
    assert sum(sh.values()) == pytest.approx(1.0)
    assert sh["verify"] > 0.5 and sh["verify"] > 5 * sh.get("propose", 0.0)
    assert prof["ops"]["verify"] >= 2 * 20 * 4  # at least the 4 dots of 20 iterations, twice


def test_every_model_forward_runs_under_the_forward_scope():
    target, _ = default_pair(0, vocab_size=16, hidden_size=16)
    fn = jax.jit(lambda st, t: nnx.merge(nnx.graphdef(target), st)(
        t, jnp.zeros_like(t), _cache(target, t.shape[0]), jnp.ones((t.shape[0], t.shape[1], 8), bool))[0])
    hlo = fn.lower(nnx.state(target), jnp.zeros((1, 2), jnp.int32)).compile().as_text()
    got = scopes.instruction_scopes(hlo, (FORWARD_SCOPE,))
    dots = [k for k in got if k.startswith("dot")]
    assert dots and all(got[k] == FORWARD_SCOPE for k in dots)


def _cache(model, b):
    from jaxspec.nn.cache import init_cache

    return init_cache(model.config, b, 8)


def _configs(target, draft, tokens, tree="chain:2"):
    from jaxspec.decode.as_drafter import as_drafter

    scfg, t, dt = gen.build_config(target, as_drafter(draft)[0], prompt_length=tokens.shape[1], max_new_tokens=6,
                                   tree=tree,
                                   sampling=Sampling(temperature=1.0))
    acfg, at = gen.build_ar_config(target, prompt_length=tokens.shape[1], max_new_tokens=6,
                                   sampling=Sampling(temperature=1.0))
    return scfg, t, dt, acfg, at


def test_entry_points_the_benchmark_times_match_generate():
    """run_compiled / run_compiled_autoregressive on models split once return what
    generate / generate_autoregressive return; a target graphdef passed in gives the same
    configuration; start_program is the prefill (roots = last prompt tokens)."""
    target, draft = default_pair(0, vocab_size=16, hidden_size=16)
    prompts = [[1, 2, 3], [4, 5]]
    tokens = jnp.asarray([[1, 2, 3], [4, 5, 0]], jnp.int32)
    lens = jnp.asarray([3, 2], jnp.int32)
    scfg, t, dt, acfg, at = _configs(target, draft, tokens)
    assert scfg == gen.build_config(target, scfg.draft_def, prompt_length=3, max_new_tokens=6, tree="chain:2",
                                    sampling=Sampling(temperature=1.0), target_def=nnx.graphdef(target))[0]
    assert acfg == gen.build_ar_config(target, prompt_length=3, max_new_tokens=6, sampling=Sampling(temperature=1.0),
                                       graphdef=nnx.graphdef(target))[0]
    key = jax.random.key(3)
    want = gen.generate(key, target, draft, prompts, max_new_tokens=6, tree="chain:2",
                        sampling=Sampling(temperature=1.0), stop_tokens=())
    got = gen.run_compiled(scfg, nnx.state(target), nnx.state(draft), key, tokens, lens, t, dt, ())
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    want = gen.generate_autoregressive(key, target, prompts, max_new_tokens=6,
                                       sampling=Sampling(temperature=1.0), stop_tokens=())
    got = gen.run_compiled_autoregressive(acfg, nnx.state(target), key, tokens, lens, at, ())
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    st = gen.start_program(scfg, nnx.state(target), nnx.state(draft), tokens, lens)
    assert isinstance(st, RoundState)
    np.testing.assert_array_equal(np.asarray(st.root), [3, 5])
    np.testing.assert_array_equal(np.asarray(st.prev), [2, 4])
    np.testing.assert_array_equal(np.asarray(st.tcache.lengths), [2, 1])
    np.testing.assert_array_equal(np.asarray(st.emitted.n_out), [0, 0])
    cache, root = gen.start_program(acfg, nnx.state(target), None, tokens, lens)
    np.testing.assert_array_equal(np.asarray(root), [3, 5])
    np.testing.assert_array_equal(np.asarray(cache.lengths), [2, 1])


def test_tiny_report(tmp_path):
    """``jaxspec bench --tiny --only round``: every ratio is the quotient of its timings,
    the profile's shares cover the round's scopes and sum to one, and the files are written."""
    assert main(["bench", "--tiny", "--json", "--only", "round", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "round_cost.json").read_text())
    assert (tmp_path / "round_cost.png").stat().st_size > 0
    (row,) = report["rows"]
    assert row["batch"] == 1 and row["tree"] == "chain:2" and row["draft_forwards"] == [2, 1]
    assert row["model_ms"] == pytest.approx(row["draft_ms"] + row["verify_ms"])
    assert row["forwards_in_turn_ms"] > 0
    assert row["round_ms"] == pytest.approx((row["generate_s"] - row["prefill_s"]) / row["loop_rounds"] * 1e3)
    assert row["round_over_model"] == pytest.approx(row["round_ms"] / row["model_ms"])
    assert row["device_round_over_model"] == pytest.approx(row["device_round_ms"] / row["model_ms"])
    assert row["host_ms_per_call"] == pytest.approx(row["generate_return_ms"] - row["compiled_return_ms"])
    assert 0 < row["compiled_return_ms"] < row["compiled_s"] * 1e3  # returns before the device is done
    shares = row["profile"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    for k in ("propose", "propose/forward", "verify/forward", "accept", "commit", "emit"):
        assert shares.get(k, 0.0) > 0, k
    assert row["profile"]["ops_per_round"]["verify/forward"] > 0
    (ar,) = report["target_only"]
    assert ar["step_over_forward"] == pytest.approx(ar["step_ms"] / ar["forward_ms"])
    assert report["headline"]["round_over_model_max"] == pytest.approx(row["round_over_model"])
    tab = round_cost.table(report)
    assert f"{row['round_over_model']:.2f}×" in tab and f"{ar['step_over_forward']:.2f}×" in tab


def test_draft_widths_of_a_round():
    from jaxspec.core.treespec import parse_tree

    assert round_cost.draft_widths(parse_tree("chain:4")) == (2, 1, 1, 1)
    assert round_cost.draft_widths(parse_tree("branch:3,2,1")) == (2, 3, 6)


def test_graphdefs_passed_in_are_checked():
    """build_config takes the drafter (as_drafter's, once, at the public boundary) and the
    target's graphdef when the caller has it; a model or another object is refused, naming
    what to pass."""
    from jaxspec.decode.ngram import NgramDraft

    target, draft = default_pair(0, vocab_size=16, hidden_size=16)
    kw = dict(prompt_length=3, max_new_tokens=4, tree="chain:2")
    with pytest.raises(ValueError, match=r"target_def = State: expected an nnx.GraphDef"):
        gen.build_config(target, NgramDraft(), target_def=nnx.state(target), **kw)
    with pytest.raises(ValueError, match=r"graphdef = State: expected an nnx.GraphDef"):
        gen.build_ar_config(target, prompt_length=3, max_new_tokens=4, graphdef=nnx.state(target))
    with pytest.raises(ValueError, match=r"draft = Transformer: expected a drafter .*as_drafter\(draft\)\[0\]"):
        gen.build_config(target, draft, **kw)
    ng = NgramDraft()
    same = gen.build_config(target, ng, target_def=nnx.graphdef(target), **kw)[0]
    assert same == gen.build_config(target, ng, **kw)[0]
