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
from jaxspec.formats.checkpoint import load_draft, load_model, save_model
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


def _reference_law(target, head, history, path):
    """The head's law after ``history`` (ending with the round's root) and the drafted
    ``path``, by teacher forcing on the whole sequence: positions up to the root read the
    target's features, each drafted position the head's own prediction before it."""
    root = len(history) - 1
    seq = jnp.asarray([list(history) + list(path)], jnp.int32)
    feats = forward_features(target, seq)
    for k in range(len(path)):
        feats = feats.at[:, root + k].set(head.teacher_forced(target, seq, feats)[:, root + k])
    return _law(target, head.teacher_forced(target, seq, feats)[:, root + len(path)])


def _path(tree, node):
    """Node indices from the root's child down to ``node`` (-1: the root, an empty path)."""
    out = []
    while node >= 0:
        out.append(node)
        node = int(tree.parents_array[node])
    return out[::-1]


# per row: the accepted nodes of round 1 (a path of the tree, -1 padded to depth)
ACCEPTED = {"chain:3": [[0, 1, -1], [-1, -1, -1], [0, 1, 2]],  # 2 nodes, none, all (ends at the deepest level)
            "branch:2,1,1": [[1, 3, -1], [0, 2, 4], [-1, -1, -1]]}  # sibling 1's branch, a deepest-level end


@pytest.mark.parametrize("tree_spec", list(ACCEPTED))
def test_every_drafted_law_matches_teacher_forcing_over_two_rounds(models, tree_spec):
    """A ragged batch (prompts of 5, 1 and 2 tokens) over two rounds: every forwarded row of
    the head's law (root, and nodes reading predicted features) equals teacher forcing on
    the row's whole sequence, in the first round and after a commit of paths of every
    length (none; a branch that is not the first sibling's; one ending at the deepest level,
    whose slots the first round never rewrote); a finished row keeps its whole state."""
    target, head = models
    tree = resolve_tree(tree_spec)
    w, n, b = tree.depth + 1, tree.num_nodes, 3
    forwarded = tree.levels[-1][0] + 1  # rows [root] + nodes above the deepest level
    prompts = [[3, 1, 4, 1, 5], [9], [2, 6]]
    lens = np.asarray([len(p) for p in prompts])
    toks = jnp.asarray([p + [0] * (5 - len(p)) for p in prompts], jnp.int32)
    tfeats, _ = prefill(target, toks, jnp.asarray(lens - 1), 32, features=True)
    st = start_head(head, target, tfeats, toks, jnp.asarray(lens - 1), 32, w)
    keys = jax.random.split(jax.random.key(0), b)
    warp = Warp(None, None)
    nodes, q, st2 = propose_head(head, target, st, keys, tree, "iid", warp, 1.0)
    nodes = np.asarray(nodes)
    for r in range(b):
        for row in range(forwarded):
            path = [int(nodes[r, j]) for j in _path(tree, row - 1)]
            np.testing.assert_allclose(np.asarray(q)[r, row], _reference_law(target, head, prompts[r], path),
                                       atol=2e-5, err_msg=f"round 1, batch row {r}, tree row {row}")

    # the target accepts ACCEPTED[r] and draws an extra token; its verification features of
    # [root] + the path are its features of the committed sequence (other rows: noise)
    acc = np.asarray(ACCEPTED[tree_spec], np.int32)
    extra = [7, 11, 13]
    verify = np.array(jax.random.normal(jax.random.key(9), (b, n + 1, 16)), np.float32)
    res_tokens = np.full((b, n + 1), -1, np.int32)
    histories, num = [], []
    for r in range(b):
        path = [int(nodes[r, j]) for j in acc[r] if j >= 0]
        hist = prompts[r] + path + [extra[r]]
        f = np.asarray(forward_features(target, jnp.asarray([hist], jnp.int32)))[0]
        root = len(prompts[r]) - 1
        rows = [0] + [int(j) + 1 for j in acc[r] if j >= 0]
        verify[r, rows] = f[root : root + len(rows)]
        res_tokens[r, : len(path) + 1] = path + [extra[r]]
        histories.append(hist)
        num.append(len(path) + 1)
    active = jnp.asarray([True, True, True])
    st3 = commit_head(st2, jnp.asarray(verify), jnp.asarray(res_tokens), jnp.asarray(acc), jnp.asarray(num), active)
    np.testing.assert_array_equal(np.asarray(st3.cache.lengths), lens)  # L + 1 = the old root's position + 1
    np.testing.assert_array_equal(np.asarray(st3.count), num)
    nodes2, q2, _ = propose_head(head, target, st3, keys, tree, "iid", warp, 1.0)
    nodes2 = np.asarray(nodes2)
    for r in range(b):
        for row in range(forwarded):
            path = [int(nodes2[r, j]) for j in _path(tree, row - 1)]
            np.testing.assert_allclose(np.asarray(q2)[r, row], _reference_law(target, head, histories[r], path),
                                       atol=2e-5, err_msg=f"round 2, batch row {r}, tree row {row}")

    done = commit_head(st2, jnp.asarray(verify), jnp.asarray(res_tokens), jnp.asarray(acc), jnp.asarray(num),
                       jnp.asarray([False, True, False]))
    for field in ("feats", "toks", "count"):
        kept, moved, old = (np.asarray(getattr(x, field)) for x in (done, st3, st2))
        np.testing.assert_array_equal(kept[[0, 2]], old[[0, 2]])
        np.testing.assert_array_equal(kept[1], moved[1])
    np.testing.assert_array_equal(np.asarray(done.cache.lengths), [lens[0] - 1, lens[1], lens[2] - 1])


def test_unrolled_depths_are_the_drafted_laws(models):
    """``FeatureHead.unrolled`` (training's forward of draft depths 1..S over a whole
    sequence in parallel) against drafting a chain with the head's cache
    (``propose_head``), on a ragged batch: with the sequence taken to be the prompt plus the
    drafted chain, depth k + 1 at the root's position + k is the law of tree row k."""
    target, head = models
    tree = resolve_tree("chain:4")
    prompts = [[3, 1, 4, 1, 5, 9], [2], [6, 5, 3]]
    lens = np.asarray([len(p) for p in prompts])
    toks = jnp.asarray([p + [0] * (6 - len(p)) for p in prompts], jnp.int32)
    tfeats, _ = prefill(target, toks, jnp.asarray(lens - 1), 32, features=True)
    st = start_head(head, target, tfeats, toks, jnp.asarray(lens - 1), 32, tree.depth + 1)
    keys = jax.random.split(jax.random.key(4), 3)
    nodes, q, _ = propose_head(head, target, st, keys, tree, "iid", Warp(None, None), 1.0)
    for r, prompt in enumerate(prompts):
        seq = jnp.asarray([prompt + [int(t) for t in np.asarray(nodes)[r]]], jnp.int32)  # prompt + chain
        preds = head.unrolled(target, seq, forward_features(target, seq), tree.depth + 1)  # [S, 1, T, D]
        root = len(prompt) - 1
        for k in range(tree.depth):  # row k: after k drafted tokens; the deepest node's law is never used
            np.testing.assert_allclose(_law(target, preds[k][:, root + k]), np.asarray(q)[r, k], atol=2e-5,
                                       err_msg=f"batch row {r}, depth {k + 1}")
    # depth 1 is teacher forcing; a deeper depth is not (it reads predicted features)
    seq = jnp.asarray([prompts[0]], jnp.int32)
    f = forward_features(target, seq)
    preds = head.unrolled(target, seq, f, 3)
    np.testing.assert_array_equal(np.asarray(preds[0]), np.asarray(head.teacher_forced(target, seq, f)))
    assert not np.allclose(np.asarray(preds[1][:, 2:]), np.asarray(preds[0][:, 2:]), atol=1e-3)


@pytest.mark.parametrize("tree", ["chain:4", "branch:2,2,1"])
def test_greedy_equality_on_a_ragged_batch(models, tree):
    """At temperature 0 a head-drafted generation is greedy target decoding, for prompts of
    different lengths (one token, too) in one batch, under the default rule (block on a
    chain) and the token rule."""
    target, head = models
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 3, 1]]
    ref = jaxspec.generate_autoregressive(jax.random.key(1), target, prompts, max_new_tokens=24,
                                          sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    for rule in ("auto", "token"):
        out = jaxspec.generate(jax.random.key(1), target, head, prompts, max_new_tokens=24, tree=tree,
                               sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=(), rule=rule)
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
    # batch 1 runs two prompts one after another: 8 new tokens each, tallied over the timed turn
    assert all(r["prompts"] == 2 and r["num_tokens"] == 2 * 8 for r in report["rows"])
    for r in report["rows"]:
        if r["tree"]:  # accepted nodes per round at depths 1..4: at most 1 each, never rising with depth
            acc = r["accepted_per_round"]
            assert len(acc) == 4 and all(1.0 >= a >= b >= 0.0 for a, b in zip(acc, acc[1:]))
            assert r["tau"] <= 1.0 + sum(acc) + 1e-6  # tokens <= accepted + target calls (a cut round: <)
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
    cap = capsys.readouterr()
    spec = json.loads(cap.out)
    assert "weight digest" not in cap.err  # the head was trained on (saved with) this target
    assert main([*flags, "--baseline"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == base["tokens"] and spec["draft"] == h
    assert main([*flags[:-2], "--draft", h, "--tree", "auto"]) == 2
    err = capsys.readouterr().err
    assert f"--tree auto and --draft {h}: a tree is chosen by timing a draft model's trees" in err, err


def test_cli_verify_with_a_head(saved, capsys):
    """``jaxspec verify --target DIR --draft HEAD``: the harness runs the head's rounds (a
    smoke test of the command: the head's exactness is tests/test_generate_exactness.py's)."""
    import json

    from jaxspec.cli import main

    t, h = saved
    code = main(["verify", "--target", t, "--draft", h, "--prompt", "1,2", "--horizon", "2", "--samples", "16384",
                 "--top-k", "4", "--tree", "chain:2", "--json", "--no-progress", "--no-compile-cache"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["passed"], report


def test_a_head_saved_for_another_target_is_warned_about(saved, tmp_path, capsys):
    """The CLI's check of the digest a head folder records against the target it drafts for:
    silent for its own target and for a folder that records none, a warning naming both
    digests for another target of the same shape."""
    from jaxspec.cli.common import warn_if_head_for_another_target
    from jaxspec.nn.head import recorded_target_digest, target_digest

    t, h = saved
    target = load_model(t)
    assert recorded_target_digest(h) == target_digest(target)
    assert not warn_if_head_for_another_target("--draft", h, target, t)
    other, _ = tiny_pair(5, vocab_size=264, hidden_size=16, num_heads=2)
    assert warn_if_head_for_another_target("--draft", h, other, "other-target")
    err = capsys.readouterr().err
    assert err.startswith(f"warning: --draft {h} was trained on a target with weight digest {target_digest(target)}")
    assert f"the target other-target has digest {target_digest(other)}" in err and "lossless" in err
    save_head(load_head(h), tmp_path / "bare")  # no target given: no digest recorded
    assert recorded_target_digest(tmp_path / "bare") is None
    assert not warn_if_head_for_another_target("--draft", str(tmp_path / "bare"), other, "other-target")
    assert capsys.readouterr().err == ""
