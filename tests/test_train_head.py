"""Training a feature draft head (jaxspec.training.head.train_head, ``jaxspec train-head``)
on a tiny random target: alpha rises, resume is exact, divergence exports nothing, bad
inputs are refused naming the argument, and the CLI writes a head that load_head loads.

The target: 2 layers of width 32 over the byte vocabulary, its LM head scaled by 4 so that
its laws are sharp and context dependent (a random head's alpha starts near 0.02). Every
run here shares one TrainConfig (so one pytest process compiles the step once), except
the diverging one.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import cli
from jaxspec.formats.checkpoint import save_model
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.head import head_config, load_head, target_digest
from jaxspec.nn.model import forward_features, init_model
from jaxspec.training.corpus import load_corpus
from jaxspec.training.head import HeadLoss, evaluate_head, head_params, train_head
from jaxspec.training.train import (
    TOKENIZER_CONFIG,
    TrainConfig,
    TrainingDiverged,
    validation_windows,
)

TARGET_CONFIG = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
CFG = TrainConfig(steps=40, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=4, eval_every=20, eval_windows=16,
                  checkpoint_every=20, seed=1)
# the same run on the command line
RUN = ["--steps", "40", "--batch-size", "8", "--seq-len", "32", "--lr", "1e-2", "--warmup-steps", "4",
       "--eval-every", "20", "--eval-windows", "16", "--checkpoint-every", "20", "--seed", "1", "--max-files", "2",
       "--no-progress"]


def _target():
    t = init_model(TARGET_CONFIG, jax.random.key(0))
    t.lm_head.kernel[...] = t.lm_head.kernel[...] * 4.0
    return t


def _leaves(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model))]


def strict_json(s: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(s, parse_constant=refuse)


@pytest.fixture(scope="module")
def target():
    return _target()


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_files=2)


@pytest.fixture(scope="module")
def trained(target, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("head")
    return out, train_head(target, CFG, out, corpus=corpus, progress=False)


def test_training_raises_alpha_and_lowers_the_loss(trained, target, corpus):
    out, r = trained
    assert r.step == 40 and r.final_dir == out / "final"
    assert [h["step"] for h in r.history] == [20, 40]
    summary = json.loads((out / "summary.json").read_text())
    before = summary["before"]
    assert r.alpha_before == before["alpha"] < 0.1
    assert r.alpha_after == r.history[-1]["alpha"] > r.alpha_before + 0.1
    last = r.history[-1]
    assert last["val_loss"] < before["val_loss"] - 1.0
    assert last["val_kl"] < before["val_kl"] and last["val_feature_loss"] < before["val_feature_loss"]
    assert last["val_loss"] == pytest.approx(last["val_kl"] + 1.0 * last["val_feature_loss"])
    # the history's metrics are the returned head's; the summary is strict JSON
    val = validation_windows(corpus, CFG)
    assert evaluate_head(r.model, target, val)["alpha"] == pytest.approx(r.alpha_after, rel=1e-5)
    assert summary["kind"] == "train-head" and summary["history"] == r.history
    assert summary["alpha_after"] == r.alpha_after and summary["params"] == head_params(r.model)
    assert summary["feature_weight"] == 1.0 and summary["noise"] == 0.05
    strict_json((out / "summary.json").read_text())


def test_export_loads_back(trained, target):
    _, r = trained
    head = load_head(r.final_dir)
    assert head.config == r.model.config == head_config(target.config)
    for a, b in zip(_leaves(head), _leaves(r.model)):
        np.testing.assert_array_equal(a, b)
    meta = json.loads((r.final_dir / "config.json").read_text())
    assert meta["target_digest"] == target_digest(target)
    # the head owns fc, one layer and its norm; the embedding and the LM head are the target's
    d, v = TARGET_CONFIG.hidden_size, TARGET_CONFIG.vocab_size
    assert head_params(head) == head.config.num_params() - 2 * v * d + (2 * d * d + d)


def test_objective_matches_the_evaluation(trained, target, corpus):
    """Without noise the training loss of a batch is the evaluation's val_loss of it."""
    _, r = trained
    batch = jnp.asarray(validation_windows(corpus, CFG)[: CFG.batch_size])  # the shape evaluate compiled
    tg, tp = nnx.split(target)
    loss = float(HeadLoss(tg, 2.5, 0.0, 0)(r.model, batch, tp))
    ev = evaluate_head(r.model, target, np.asarray(batch), batch_size=CFG.batch_size, feature_weight=2.5)
    assert loss == pytest.approx(ev["val_loss"], rel=1e-4)
    assert ev["val_loss"] == pytest.approx(ev["val_kl"] + 2.5 * ev["val_feature_loss"])
    assert float(HeadLoss(tg, 2.5, 0.05, 0)(r.model, batch, tp)) != pytest.approx(loss, rel=1e-6)  # noisy inputs


def test_unrolled_objective_is_the_mean_over_depths(trained, target, corpus):
    """With ``unroll = S`` the loss (noise 0) is the mean of the per-depth objectives, which
    evaluate_head reports through ``val_loss``; depth 1 alone is the unroll-1 objective, and
    the per-depth alphas are the overlap at the positions each depth reaches."""
    _, r = trained
    batch = jnp.asarray(validation_windows(corpus, CFG)[: CFG.batch_size])
    tg, tp = nnx.split(target)
    ev1 = evaluate_head(r.model, target, np.asarray(batch), batch_size=CFG.batch_size)
    ev3 = evaluate_head(r.model, target, np.asarray(batch), batch_size=CFG.batch_size, unroll=3)
    assert float(HeadLoss(tg, 1.0, 0.0, 0, 3)(r.model, batch, tp)) == pytest.approx(ev3["val_loss"], rel=1e-4)
    for k in ("alpha", "val_kl", "val_feature_loss", "val_nll"):  # depth 1 is unchanged by unroll
        assert ev3[k] == pytest.approx(ev1[k], rel=1e-6)
    assert set(ev3) - set(ev1) == {"alpha_depth_2", "alpha_depth_3"} and "alpha_depth_2" not in ev1
    # by hand: depth 2 reads the head's depth-1 predictions, at positions p >= 1
    x = batch[:, :-1]
    feats = forward_features(target, x)
    tl = target.unembed(feats)
    preds = r.model.unrolled(target, x, feats, 2)
    p2 = jax.nn.softmax(target.unembed(preds[1]), axis=-1)
    overlap = np.asarray(jnp.sum(jnp.minimum(jax.nn.softmax(tl, axis=-1), p2), axis=-1))[:, 1:]
    assert ev3["alpha_depth_2"] == pytest.approx(float(overlap.mean()), rel=1e-5)
    assert ev3["alpha_depth_2"] != pytest.approx(ev3["alpha"], rel=1e-3)


def test_unrolled_training_improves_the_deeper_depths(trained, target, corpus, tmp_path):
    """The same run with ``unroll = 3``: its depth-2 and depth-3 acceptance (evaluated the
    same way for both heads) beats the unroll-1 head's."""
    _, r1 = trained
    r3 = train_head(target, CFG, tmp_path, corpus=corpus, progress=False, unroll=3)
    last = r3.history[-1]
    assert {"alpha_depth_2", "alpha_depth_3"} <= set(last)
    assert json.loads((tmp_path / "summary.json").read_text())["unroll"] == 3
    val = validation_windows(corpus, CFG)
    ev1 = evaluate_head(r1.model, target, val, unroll=3)
    assert last["alpha_depth_3"] == pytest.approx(evaluate_head(r3.model, target, val, unroll=3)["alpha_depth_3"],
                                                  rel=1e-5)
    assert last["alpha_depth_2"] > ev1["alpha_depth_2"] and last["alpha_depth_3"] > ev1["alpha_depth_3"]
    with pytest.raises(ValueError, match=r"unroll = 2 now but 3 in the checkpoint"):
        train_head(target, CFG, tmp_path, corpus=corpus, progress=False, resume=True, unroll=2)


def test_resume_equals_uninterrupted(trained, target, corpus, tmp_path):
    from jaxspec.training.train import _train_step

    _, full = trained
    compiled = _train_step._cache_size()
    part = train_head(target, CFG, tmp_path, corpus=corpus, progress=False, stop_at=20)
    assert part.step == 20 and part.final_dir is None and not (tmp_path / "final").exists()
    assert part.alpha_before == full.alpha_before and np.isnan(part.alpha_after)
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 20
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        train_head(target, CFG, tmp_path, corpus=corpus, progress=False)
    with pytest.raises(ValueError, match=r"noise = 0.1 now but 0.05 in the checkpoint"):
        train_head(target, CFG, tmp_path, corpus=corpus, progress=False, resume=True, noise=0.1)
    # a checkpoint written before train_head had `unroll` records none: it resumes as unroll 1
    state = tmp_path / "checkpoint" / "state.json"
    meta = json.loads(state.read_text())
    assert meta["head_loss"].pop("unroll") == 1
    state.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"unroll = 2 now but 1 in the checkpoint"):
        train_head(target, CFG, tmp_path, corpus=corpus, progress=False, resume=True, unroll=2)
    resumed = train_head(target, CFG, tmp_path, corpus=corpus, progress=False, resume=True)
    assert resumed.step == 40 and resumed.final_dir == tmp_path / "final"
    for a, b in zip(_leaves(resumed.model), _leaves(full.model)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert [h["alpha"] for h in resumed.history] == pytest.approx([h["alpha"] for h in full.history], abs=1e-6)
    assert _train_step._cache_size() == compiled  # same configuration: no recompilation


def test_resume_refuses_another_target(trained, corpus, tmp_path):
    other = init_model(TARGET_CONFIG, jax.random.key(5))
    train_head(_target(), CFG, tmp_path, corpus=corpus, progress=False, stop_at=1)
    with pytest.raises(ValueError, match="target model differs"):
        train_head(other, CFG, tmp_path, corpus=corpus, progress=False, resume=True)


def test_diverging_lr_raises_and_writes_no_final(target, corpus, tmp_path):
    cfg = TrainConfig(steps=3, warmup_steps=1, batch_size=2, seq_len=16, eval_windows=2, lr=3e38,
                      eval_every=1, checkpoint_every=1)
    with pytest.raises(TrainingDiverged, match=r"train-head: the run diverged at step \d") as e:
        train_head(target, cfg, tmp_path, corpus=corpus, progress=False)
    assert e.value.step <= 3 and (e.value.last_checkpoint is None or e.value.last_checkpoint_step < e.value.step)
    assert not (tmp_path / "final").exists() and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "default-target"}, "train_head: target is a str; expected a jaxspec Transformer"),
    ({"config": {"steps": 3}}, "train_head: config is a dict; expected a TrainConfig"),
    ({"head_config": "big"}, "train_head: head_config is a str; expected a ModelConfig"),
    ({"head_config": dataclasses.replace(head_config(TARGET_CONFIG), hidden_size=64, head_dim=None)},
     "train_head: head_config.hidden_size = 64; expected the target's hidden_size = 32"),
    ({"head_config": dataclasses.replace(head_config(TARGET_CONFIG), vocab_size=300)},
     "train_head: head_config.vocab_size = 300; expected the target's vocab_size = 264"),
    ({"head_config": TARGET_CONFIG}, "train_head: head_config.num_hidden_layers = 2; expected 1"),
    ({"config": dataclasses.replace(CFG, seq_len=128)},
     "TrainConfig.seq_len = 128: expected <= the target's context length 64"),
    ({"head_config": dataclasses.replace(head_config(TARGET_CONFIG), max_position_embeddings=16)},
     "TrainConfig.seq_len = 32: expected <= the head's context length head_config.max_position_embeddings = 16"),
    ({"feature_weight": -1.0}, "train_head: feature_weight = -1.0; expected a finite number >= 0"),
    ({"noise": float("nan")}, "train_head: noise = nan; expected a finite number >= 0"),
    ({"stop_at": 0}, "train_head: stop_at = 0; expected a positive integer or None"),
    ({"unroll": 0}, "train_head: unroll = 0; expected an integer from 1 to 8"),
    ({"unroll": 2.0}, "train_head: unroll = 2.0; expected an integer from 1 to 8"),
    ({"config": dataclasses.replace(CFG, seq_len=4), "unroll": 5},
     "train_head: unroll = 5; expected <= TrainConfig.seq_len = 4"),
])
def test_bad_inputs_name_the_argument(kwargs, message, target, corpus, tmp_path):
    args = {"target": target, "config": CFG, **kwargs}
    out = tmp_path / "never"
    with pytest.raises(ValueError) as e:
        train_head(args.pop("target"), args.pop("config"), out, corpus=corpus, progress=False, **args)
    assert message in str(e.value), str(e.value)
    assert not out.exists()


@pytest.fixture(scope="module")
def target_folder(target, tmp_path_factory):
    return save_model(target, tmp_path_factory.mktemp("target"), extra_config=TOKENIZER_CONFIG)


def test_cli_end_to_end(target_folder, trained, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train-head", "--target", str(target_folder), *RUN, "--out", str(out)]) == 0
    cap = capsys.readouterr()
    res = strict_json(cap.out)  # stdout: one strict JSON object; the log goes to stderr
    assert res["model"] == str(out / "final") and "train-head step 40" in cap.err
    assert 0 < res["alpha_before"] < res["alpha_after"] <= 1 and res["val_kl"] > 0
    head = load_head(res["model"])
    assert res["params"] == head_params(head)
    _, r = trained  # the same run through the library, on the target saved and loaded
    assert res["alpha_after"] == pytest.approx(r.alpha_after, abs=1e-5)
    assert json.loads((out / "summary.json").read_text())["final_dir"] == res["model"]


def test_cli_stop_resume_and_head_flags(target_folder, tmp_path, capsys):
    out = str(tmp_path / "run")
    base = ["train-head", "--target", str(target_folder), *RUN, "--out", out]
    assert cli.main([*base, "--stop-at", "20"]) == 0
    stopped = strict_json(capsys.readouterr().out)
    assert stopped["stopped_at_step"] == 20 and "--resume" in stopped["resume"]
    assert cli.main(base) == 2  # refuses to overwrite without --resume
    assert "--resume" in capsys.readouterr().err
    assert cli.main([*base, "--resume", "--noise", "0"]) == 2
    assert "--noise = 0.0 now but 0.05 in the checkpoint" in capsys.readouterr().err
    assert cli.main([*base, "--resume", "--unroll", "2"]) == 2
    assert "--unroll = 2 now but 1 in the checkpoint" in capsys.readouterr().err
    # the head's size flags reach the head config (checked before any training)
    assert cli.main(["train-head", "--target", str(target_folder), *RUN, "--kv-heads", "3", "--out", out + "x"]) == 2
    err = capsys.readouterr().err
    assert "--kv-heads = 3: expected a divisor of --heads = 2" in err and "Traceback" not in err
    assert cli.main(["train-head", "--target", "no-such-model", "--out", out + "y"]) == 2
    assert "--target: load_model: unknown model 'no-such-model'" in capsys.readouterr().err
    assert cli.main(["train-head", "--target", str(target_folder), "--seq-len", "128", "--out", out + "z"]) == 2
    assert "--seq-len = 128: expected <= the target's context length 64" in capsys.readouterr().err


def test_cli_divergence_exits_1(target_folder, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train-head", "--target", str(target_folder), "--steps", "3", "--warmup-steps", "1", "--batch-size", "2",
            "--seq-len", "16", "--eval-windows", "2", "--eval-every", "1", "--checkpoint-every", "1", "--lr", "3e38",
            "--max-files", "2", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 1
    cap = capsys.readouterr()
    assert cap.out.strip() == "" or strict_json(cap.out) is not None
    err = cap.err.strip().splitlines()[-1]
    assert err.startswith("jaxspec train-head: error: train-head: the run diverged at step "), err
    assert "--lr = 3e+38" in err and "TrainConfig" not in err
    assert not (out / "final").exists()


def test_cli_recipe_end_to_end_on_a_base_model(tmp_path, capsys):
    """``jaxspec train-head --recipe`` on the embedded target (a base model, no chat template:
    it continues corpus windows): data, features, vocabulary and training in one command,
    and a second run finds the data stages done."""
    out = tmp_path / "recipe"
    argv = ["train-head", "--target", "default-target", "--recipe", "--per-category", "4", "--max-new-tokens", "8",
            "--steps", "3", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "16", "--eval-windows", "2",
            "--eval-every", "2", "--checkpoint-every", "2", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    res = strict_json(capsys.readouterr().out)
    assert res["answers"]["records"] >= 24 and res["answers"]["answer_tokens"] > 0
    assert res["model"] == str(out / "final") and 0 <= res["alpha_after"] <= 1
    assert load_head(res["model"]).config.vocab_size == 264  # the embedded target's ids: 256 bytes + specials
    assert not (out / "instructions.jsonl").exists()  # no chat template: corpus windows instead
    shards = sorted((out / "answers").glob("shard_*.npz"))
    assert cli.main([*argv, "--resume"]) == 0  # every data stage done; training resumes at its end
    assert sorted((out / "answers").glob("shard_*.npz")) == shards
    # the same answers, a multi-layer head: the features stage keeps the taps of 'auto' layers
    import shutil

    from jaxspec.training.recipe import auto_feature_layers

    capsys.readouterr()
    multi = tmp_path / "multi"
    shutil.copytree(out / "answers", multi / "answers")
    argv_multi = [a if a != str(out) else str(multi) for a in argv] + ["--feature-layers", "auto"]
    assert cli.main(argv_multi) == 0
    res = strict_json(capsys.readouterr().out)
    layers = auto_feature_layers(jaxspec_load_layers())
    assert load_head(res["model"]).feature_layers == layers
    assert json.loads((multi / "features" / "meta.json").read_text())["feature_layers"] == list(layers)
    assert cli.main(["train-head", "--feature-layers", "1", "--out", str(tmp_path / "x")]) == 2  # needs --recipe
    assert "--feature-layers: a multi-layer head trains from cached features" in capsys.readouterr().err


def jaxspec_load_layers() -> int:
    import jaxspec

    return jaxspec.load_model("default-target").config.num_hidden_layers
