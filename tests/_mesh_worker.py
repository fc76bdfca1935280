"""Run in a subprocess by tests/test_mesh.py, with 8 host devices (XLA_FLAGS set by the
caller before JAX is imported): generate on several meshes against one device, the
placements of parameters and caches, and the harness on a mesh. Prints one JSON object."""

from __future__ import annotations

import json
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxspec
from jaxspec.decode import generate as gen
from jaxspec.decode.as_drafter import as_drafter
from jaxspec.nn import sharding

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _tiny import tiny_pair  # noqa: E402
from _user_drafter import bigram_from  # noqa: E402

# 8 query heads, 4 KV heads: split over a model axis of 2 or 4, replicated over 8
TARGET, DRAFT = tiny_pair(3, vocab_size=16, hidden_size=32, num_heads=8, num_kv_heads=4, num_layers=2,
                          head_scale=4.0)
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [1], [2, 2]]  # 6 ragged rows: padded on data = 8, 4
MESHES = ((8, 1), (2, 4), (1, 8))
TREES = ("chain:3", "branch:2,2", "dynamic:depth=3,topk=2,nodes=5")
# "all" (the slow test): every tree on every mesh, at temperatures 0 and 1;
# the default test's cases: the trees that branch on (2, 4). The chain and the data axis alone
# (a mesh's simplest cases, also in the streaming test's (4, 2)) and the model axis alone (the
# CLI test's (1, 2); (1, 8)'s replicated K/V projections are the placements test's) are left to
# the slow test, which runs every tree on every mesh
DEFAULT_CASES = tuple((tree, (2, 4)) for tree in TREES[1:])


def tokens(out) -> list:
    return np.asarray(out.tokens).tolist()


def generations(temperatures=(1.0,), cases=DEFAULT_CASES) -> dict:
    res = {}
    for temp in temperatures:
        for tree in [t for t in TREES if any(c == t for c, _ in cases)]:
            kw = dict(max_new_tokens=10, tree=tree, sampling=jaxspec.Sampling(temperature=temp), stop_tokens=(5,))
            ref = jaxspec.generate(jax.random.key(7), TARGET, DRAFT, PROMPTS, **kw)
            for shape in [m for t, m in cases if t == tree]:
                out = jaxspec.generate(jax.random.key(7), TARGET, DRAFT, PROMPTS, mesh=jaxspec.make_mesh(*shape), **kw)
                res[f"{tree} T={temp} mesh={shape}"] = {
                    "ref": tokens(ref), "mesh": tokens(out),
                    "ref_lengths": np.asarray(ref.lengths).tolist(), "lengths": np.asarray(out.lengths).tolist(),
                }
        kw = dict(max_new_tokens=10, sampling=jaxspec.Sampling(temperature=temp), stop_tokens=(5,))
        ref = jaxspec.generate_autoregressive(jax.random.key(7), TARGET, PROMPTS, **kw)
        out = jaxspec.generate_autoregressive(jax.random.key(7), TARGET, PROMPTS, mesh=jaxspec.make_mesh(2, 4), **kw)
        res[f"target-only T={temp} mesh=(2, 4)"] = {"ref": tokens(ref), "mesh": tokens(out)}
    # a drafter written against the protocol alone (tests/_user_drafter.py): its params replicated
    user = bigram_from(TARGET)
    kw = dict(max_new_tokens=10, tree="branch:2,2", sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=(5,))
    ref = jaxspec.generate(jax.random.key(7), TARGET, user, PROMPTS, **kw)
    out = jaxspec.generate(jax.random.key(7), TARGET, user, PROMPTS, mesh=jaxspec.make_mesh(2, 4), **kw)
    res["user drafter branch:2,2 T=1.0 mesh=(2, 4)"] = {"ref": tokens(ref), "mesh": tokens(out)}
    if cases == DEFAULT_CASES:
        return res
    ng = jaxspec.NgramDraft()
    kw = dict(max_new_tokens=10, tree="chain:3", sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    rep = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5]]
    ref = jaxspec.generate(jax.random.key(7), TARGET, ng, rep, **kw)
    out = jaxspec.generate(jax.random.key(7), TARGET, ng, rep, mesh=jaxspec.make_mesh(2, 4), **kw)
    res["ngram chain:3 T=0.0 mesh=(2, 4)"] = {"ref": tokens(ref), "mesh": tokens(out)}
    return res


def streamed() -> dict:
    """Streaming (``on_round``) on a (4, 2) mesh: the one-device tokens, and ``on_round``
    sees the caller's 6 rows, not the 8 the data axis of 4 pads them to."""
    res = {}
    for mode in ("speculative", "target-only"):
        kw = dict(max_new_tokens=10, sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=(5,))
        if mode == "speculative":
            def run(**extra):
                return jaxspec.generate(jax.random.key(7), TARGET, DRAFT, PROMPTS, tree="chain:3", **kw, **extra)
        else:
            def run(**extra):
                return jaxspec.generate_autoregressive(jax.random.key(7), TARGET, PROMPTS, **kw, **extra)
        seen = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = run(mesh=jaxspec.make_mesh(4, 2), on_round=lambda t, n: seen.append((t.shape, n.tolist())))
        res[mode] = {"warnings": [str(w.message)[:200] for w in caught],"ref": tokens(run()), "mesh": tokens(out), "shapes": sorted({list(s) == [6, 10] for s, _ in seen}),
                     "calls": len(seen), "loop_rounds": out.summary()["loop_rounds"],
                     "last_lengths": seen[-1][1], "lengths": np.asarray(out.lengths).tolist()}
    return res


def generations_all() -> dict:
    return generations((0.0, 1.0), tuple((t, m) for t in TREES for m in MESHES))


def errors() -> dict:
    """The messages of refused meshes and models."""
    out = {}

    def catch(name, fn):
        try:
            fn()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)

    big = jaxspec.make_mesh(2, 4)
    small, _ = tiny_pair(0, vocab_size=16, hidden_size=12, num_heads=3, num_kv_heads=3)
    gqa, _ = tiny_pair(0, vocab_size=16, hidden_size=24, num_heads=6, num_kv_heads=3)
    catch("heads", lambda: jaxspec.generate(jax.random.key(0), small, small, [[1]], max_new_tokens=2, mesh=big))
    catch("kv_heads", lambda: jaxspec.generate_autoregressive(jax.random.key(0), gqa, [[1]], max_new_tokens=2,
                                                              mesh=jaxspec.make_mesh(1, 2)))
    catch("draft_heads", lambda: jaxspec.generate(jax.random.key(0), TARGET, small, [[1]], max_new_tokens=2,
                                                  mesh=big))
    catch("not_a_mesh", lambda: jaxspec.generate(jax.random.key(0), TARGET, DRAFT, [[1]], max_new_tokens=2,
                                                 mesh="data=2"))
    catch("axis_names", lambda: jaxspec.generate(
        jax.random.key(0), TARGET, DRAFT, [[1]], max_new_tokens=2,
        mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("rows",))))
    catch("too_many", lambda: jaxspec.make_mesh(4, 4))
    catch("verify_devices_and_mesh", lambda: jaxspec.verify(mesh=big, devices=jax.devices(), num_samples=10))
    return out


def placements() -> dict:
    """Specs of the placed parameters, and the per-device cache shape in the compiled loop."""
    out = {}
    for shape in ((2, 4), (1, 8)):
        mesh = jaxspec.make_mesh(*shape)
        st = sharding.shard_state(nnx.state(TARGET), TARGET.config, mesh)
        layer = st["layers"][0]
        specs = {
            "q_proj": layer["self_attn"]["q_proj"]["kernel"],
            "k_proj": layer["self_attn"]["k_proj"]["kernel"],
            "o_proj": layer["self_attn"]["o_proj"]["kernel"],
            "gate_proj": layer["mlp"]["gate_proj"]["kernel"],
            "down_proj": layer["mlp"]["down_proj"]["kernel"],
            "embed_tokens": st["embed_tokens"]["embedding"],
            "lm_head": st["lm_head"]["kernel"],
            "norm": st["norm"]["weight"],
        }
        out[str(shape)] = {
            "specs": {k: [a for a in v[...].sharding.spec] for k, v in specs.items()},
            "q_proj_shard_shape": list(specs["q_proj"][...].addressable_shards[0].data.shape),
        }
        cfg, _, _ = gen.build_config(TARGET, as_drafter(DRAFT)[0], prompt_length=4, max_new_tokens=10,
                                     tree="branch:2,2",
                                     mesh=mesh)
        ds = sharding.shard_state(nnx.state(DRAFT), DRAFT.config, mesh)
        toks = sharding.put(np.ones((8, 4), np.int32), sharding.row_sharding(mesh, 2))
        lens = sharding.put(np.full((8,), 4, np.int32), sharding.row_sharding(mesh, 1))
        args = (st, ds, jax.random.key(0), toks, lens, jnp.float32(1.0), jnp.float32(1.0), jnp.zeros((1,), jnp.int32))
        hlo = gen.compiled(cfg).lower(*args).compile().as_text()
        c = TARGET.config
        kv_local = c.num_key_value_heads // shape[1] if c.num_key_value_heads % shape[1] == 0 else c.num_key_value_heads
        local = f"f32[{c.num_hidden_layers},{8 // shape[0]},{cfg.capacity},{kv_local},{c.head_dim}]"
        whole = f"f32[{c.num_hidden_layers},8,{cfg.capacity},{c.num_key_value_heads},{c.head_dim}]"
        out[str(shape)]["cache_local_in_hlo"] = hlo.count(local)
        out[str(shape)]["cache_whole_in_hlo"] = hlo.count(whole) if local != whole else 0
        res = gen.compiled(cfg)(*args)
        out[str(shape)]["tokens_spec"] = [a for a in res.tokens.sharding.spec]
    return out


def harness() -> dict:
    # 4 query and KV heads: split 4 ways on a (2, 4) mesh
    t, d = tiny_pair(5, vocab_size=4, hidden_size=16, num_heads=4, num_kv_heads=4, head_scale=4.0)
    kw = dict(tree="branch:2,2", scheme="iid", num_samples=2**15, chunk_size=2**13, progress=False,
              check_acceptance=False)
    one = jaxspec.verify(t, d, **kw)
    mesh = jaxspec.verify(t, d, mesh=jaxspec.make_mesh(2, 4), **kw)
    return {"one": {"verdict": one.verdict, "counts": one.spec_counts.tolist(), "mesh": one.config["mesh"]},
            "mesh": {"verdict": mesh.verdict, "counts": mesh.spec_counts.tolist(), "mesh": mesh.config["mesh"],
                     "pvalues": [x.pvalue for x in mesh.tests]}}


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    parts = sys.argv[1:] or ["generations", "placements", "harness", "errors"]
    print(json.dumps({p: globals()[p]() for p in parts}))
