"""The feature draft head (:mod:`jaxspec.nn.head`, :mod:`jaxspec.decode.head_draft`): its
features and logits against independent paths, its round state against teacher forcing on
the whole sequence, greedy equality through ``generate``, saving and loading, and the errors.
(The law at T > 0: tests/test_generate_exactness.py, the head cases.)"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_config, tiny_head, tiny_pair

import jaxspec
from jaxspec.core.sampling import Warp
from jaxspec.core.treespec import DynamicTree, resolve_tree
from jaxspec.decode.head_draft import commit_head, propose_head, start_head
from jaxspec.nn.checkpoint import load_draft, load_model, save_model
from jaxspec.nn.head import FeatureHead, head_config, init_head, is_head_folder, load_head, save_head
from jaxspec.nn.model import forward_features, forward_logits, prefill

V = 16


@pytest.fixture(scope="module")
def models():
    target, _ = tiny_pair(3, vocab_size=V, hidden_size=16, num_heads=2, num_layers=2)
    return target, tiny_head(target, 3)


def _law(target, h):
    """The head's law from one predicted feature ``h [1, D]``: ``float32[V]``."""
    return np.asarray(jax.nn.softmax(target.unembed(h[:, None]), axis=-1))[0, 0]


def test_features_are_the_lm_heads_input(models):
    """``unembed(features)`` is the model's logits bit for bit, with and without a cache."""
    target, _ = models
    toks = jnp.asarray([[1, 5, 2, 7, 3], [4, 4, 0, 9, 1]], jnp.int32)
    f = forward_features(target, toks)
    assert f.shape == (2, 5, 16)
    np.testing.assert_array_equal(np.asarray(target.unembed(f)), np.asarray(forward_logits(target, toks)))
    feats, _ = prefill(target, toks, jnp.asarray([5, 3]), 8, features=True)
    logits, _ = prefill(target, toks, jnp.asarray([5, 3]), 8)
    np.testing.assert_array_equal(np.asarray(target.unembed(feats)), np.asarray(logits))
    np.testing.assert_allclose(np.asarray(feats), np.asarray(f), atol=1e-5)


def test_round_state_matches_teacher_forcing(models):
    """The head's law at every step of two rounds equals the head run on the whole
    sequence at once (teacher forcing, the training path): after the prompt, at a
    drafted node (which reads its parent's *predicted* feature), and after a commit of
    two accepted nodes plus the extra token (pending pairs of the target's features)."""
    target, head = models
    prompt = [3, 1, 4, 1, 5]
    toks = jnp.asarray([prompt], jnp.int32)
    tree = resolve_tree("chain:3")
    w = tree.depth + 1
    tfeats, _ = prefill(target, toks, jnp.asarray([4]), 32, features=True)
    st = start_head(head, target, tfeats, toks, jnp.asarray([4]), 32, w)
    keys = jax.random.split(jax.random.key(0), 1)
    nodes, q, st2 = propose_head(head, target, st, keys, tree, "iid", Warp(None, None), 1.0)
    nodes = [int(x) for x in np.asarray(nodes)[0]]

    seq = jnp.asarray([prompt + nodes], jnp.int32)
    true_f = forward_features(target, seq)
    ref = head.teacher_forced(target, seq, true_f)  # [1, 8, D]
    np.testing.assert_allclose(np.asarray(q)[0, 0], _law(target, ref[:, 4]), atol=1e-5)  # after the root
    # node 0 (position 5) reads the head's own prediction at 4, not the target's feature
    mixed = true_f.at[:, 4].set(ref[:, 4])
    ref1 = head.teacher_forced(target, seq, mixed)
    np.testing.assert_allclose(np.asarray(q)[0, 1], _law(target, ref1[:, 5]), atol=1e-5)

    # the target accepts nodes 0 and 1 and draws the extra token 9: the verification
    # features of [root, node 0, node 1] are the target's at positions 4, 5, 6
    extra = 9
    seq2 = jnp.asarray([prompt + nodes[:2] + [extra]], jnp.int32)
    f2 = forward_features(target, seq2)
    verify_feats = jnp.concatenate([f2[:, 4:7], jnp.zeros((1, 1, 16))], axis=1)  # [1, N + 1, D]
    res_tokens = jnp.asarray([[nodes[0], nodes[1], extra, -1]], jnp.int32)
    st3 = commit_head(st2, verify_feats, res_tokens, jnp.asarray([[0, 1, -1]], jnp.int32), jnp.asarray([3]),
                      jnp.asarray([True]))
    assert int(st3.cache.lengths[0]) == 5 and int(st3.count[0]) == 3
    _, q3, _ = propose_head(head, target, st3, keys, tree, "iid", Warp(None, None), 1.0)
    ref2 = head.teacher_forced(target, seq2, f2)
    np.testing.assert_allclose(np.asarray(q3)[0, 0], _law(target, ref2[:, 7]), atol=1e-5)

    # a finished row keeps its state
    st4 = commit_head(st2, verify_feats, res_tokens, jnp.asarray([[0, 1, -1]], jnp.int32), jnp.asarray([3]),
                      jnp.asarray([False]))
    assert int(st4.cache.lengths[0]) == 4 and int(st4.count[0]) == 1


@pytest.mark.parametrize("tree", ["chain:4", "branch:2,2,1"])
def test_greedy_equality_on_a_ragged_batch(models, tree):
    """At temperature 0 a head-drafted generation is greedy target decoding, for prompts of
    different lengths (one token, too) in one batch, under the default rule (block on a
    chain) and the token rule."""
    target, head = models
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 3, 1]]
    ref = jaxspec.generate_autoregressive(jax.random.key(1), target, prompts, max_new_tokens=24, temperature=0.0,
                                          stop_tokens=())
    for rule in ("auto", "token"):
        out = jaxspec.generate(jax.random.key(1), target, head, prompts, max_new_tokens=24, tree=tree,
                               temperature=0.0, stop_tokens=(), rule=rule)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens), err_msg=f"{tree} {rule}")
        assert out.summary()["draft_calls"] == out.summary()["rounds"] * resolve_tree(tree).depth


def test_save_load_round_trip_and_load_draft(models, tmp_path):
    target, head = models
    folder = save_head(head, tmp_path / "head", target=target)
    assert is_head_folder(folder) and not is_head_folder(tmp_path)
    back = load_head(folder)
    toks = jnp.asarray([[1, 2, 3]], jnp.int32)
    f = forward_features(target, toks)
    np.testing.assert_array_equal(np.asarray(back.teacher_forced(target, toks, f)),
                                  np.asarray(head.teacher_forced(target, toks, f)))
    assert isinstance(load_draft(folder), FeatureHead)
    save_model(target, tmp_path / "target")
    assert isinstance(load_draft(tmp_path / "target"), jaxspec.Transformer)
    with pytest.raises(ValueError, match="feature draft head.*load_head"):
        load_model(folder)
    with pytest.raises(ValueError, match="load_head: .*jaxspec_head"):
        load_head(tmp_path / "target")


def test_load_head_names_the_bad_tensor(models, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, head = models
    folder = save_head(head, tmp_path / "head")
    tensors = load_file(folder / "model.safetensors")
    name = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != name}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=f"lacks tensor '{name}'"):
        load_head(folder)
    tensors[name] = np.zeros((3,), np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=f"tensor '{name}' is float32\\[3\\]"):
        load_head(folder)


def test_bad_inputs_are_refused(models):
    target, head = models
    with pytest.raises(ValueError, match="num_hidden_layers = 2; expected 1"):
        FeatureHead(tiny_config(vocab_size=V, hidden_size=16, num_layers=2), rngs=jax.random.key(0))
    other = init_head(head_config(tiny_config(vocab_size=V, hidden_size=8)), jax.random.key(0))
    with pytest.raises(ValueError, match="draft: hidden_size = 8; expected the target's hidden_size = 16"):
        jaxspec.generate(jax.random.key(0), target, other, [[1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="feature head drafts static trees"):
        jaxspec.generate(jax.random.key(0), target, head, [[1]], max_new_tokens=2,
                         tree=DynamicTree(depth=2, topk=2, num_nodes=3))
    with pytest.raises(ValueError, match="feature-head draft runs on one device"):
        jaxspec.generate(jax.random.key(0), target, head, [[1]], max_new_tokens=2, mesh=jaxspec.make_mesh(1, 1))


def test_head_benchmark_tiny(tmp_path):
    """``jaxspec bench --only head --size tiny``: the rows, alphas and step costs it reports."""
    from jaxspec.bench import benchmark_module, run_benchmark

    report, files = run_benchmark("head", "tiny", tmp_path)
    assert os.path.exists(files["json"]) and os.path.exists(files["png"])
    assert {r["mode"] for r in report["rows"]} == {"target-only", "draft chain:4", "head chain:4"}
    assert all(r["tau"] >= 1.0 and r["tokens_per_s"] > 0 for r in report["rows"])
    assert 0.0 <= report["alpha"]["head"] <= 1.0 and 0.0 <= report["alpha"]["draft"] <= 1.0
    assert all(report["step_ms"][k] > 0 for k in ("draft", "head", "target"))
    assert set(report["headline"]["head_tau"]) == {"1"} and set(report["headline"]["head_draft_tau"]) == {"1"}
    assert "| 1 | 1 | chain:4 |" in benchmark_module("head").table(report)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A byte-vocabulary target folder and a head folder for it, as ``jaxspec train-head``
    leaves them."""
    target, _ = tiny_pair(4, vocab_size=264, hidden_size=16, num_heads=2)
    head = tiny_head(target, 4)
    root = tmp_path_factory.mktemp("head_cli")
    save_model(target, root / "target")
    save_head(head, root / "head", target=target)
    return str(root / "target"), str(root / "head")


def test_cli_generate_with_a_head_equals_the_baseline_at_temperature_0(saved, capsys):
    import json

    from jaxspec.cli import main

    t, h = saved
    flags = ["generate", "--target", t, "--prompt", "def f(", "--temperature", "0", "--max-new-tokens", "12",
             "--json", "--no-compile-cache"]
    assert main([*flags, "--draft", h]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main([*flags, "--baseline"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == base["tokens"] and spec["draft"] == h
    assert main([*flags[:-2], "--draft", h, "--tree", "auto"]) == 2
    assert "--tree auto: times a draft model's trees" in capsys.readouterr().err


def test_cli_verify_with_a_head(saved, capsys):
    """``jaxspec verify --target DIR --draft HEAD``: the harness runs the head's rounds."""
    import json

    from jaxspec.cli import main

    t, h = saved
    code = main(["verify", "--target", t, "--draft", h, "--prompt", "1,2", "--horizon", "2", "--samples", "65536",
                 "--top-k", "4", "--tree", "chain:2", "--json", "--no-progress", "--no-compile-cache"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["passed"], report
