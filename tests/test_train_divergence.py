"""A diverging run (issue 26): an inf / NaN loss or parameters stop ``train`` / ``distill``
with :class:`TrainingDiverged` (CLI: exit 1, one line on stderr naming the step, the value,
the last checkpoint and --lr), no final model is exported, no non-finite checkpoint is
written, and stdout stays strict JSON.

--lr 3e38 with --warmup-steps 1: step 1 runs at lr 0, step 2 at 3e38 (parameters near
float32's largest number, still finite), step 3's update makes them inf / NaN.
"""

import contextlib
import io
import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxspec import cli
from jaxspec.cli.train import _print_json
from jaxspec.formats.checkpoint import load_model, save_model
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import init_model
from jaxspec.training.corpus import load_corpus
from jaxspec.training.train import (
    PRESETS,
    TOKENIZER_CONFIG,
    TrainConfig,
    TrainingDiverged,
    distill,
    train,
)

TINY = PRESETS["tiny"]
TINY_DRAFT = ["--preset", "tiny", "--hidden-size", "16", "--layers", "1", "--heads", "1", "--kv-heads", "1",
              "--intermediate-size", "32", "--max-compute-ratio", "10"]
# three steps of 2 x 16 tokens, evaluated on 2 windows: seconds per run
RUN = ["--steps", "3", "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "16", "--no-progress",
       "--max-files", "2", "--eval-windows", "2"]
HUGE_LR = ["--lr", "3e38"]


def strict_json(s: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(s, parse_constant=refuse)


def _cfg(**kw):
    base = {"steps": 3, "warmup_steps": 1, "batch_size": 2, "seq_len": 16, "eval_windows": 2, "lr": 3e38}
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_files=2)


def _assert_finite_checkpoint(ckpt, step):
    assert json.loads((ckpt / "state.json").read_text())["step"] == step
    for name, a in load_file(ckpt / "state.safetensors").items():
        if np.issubdtype(a.dtype, np.floating):
            assert np.isfinite(a).all(), name


def test_cli_divergence_exits_nonzero_and_writes_no_final(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny", *RUN, *HUGE_LR, "--eval-every", "1", "--checkpoint-every", "1"]
    assert cli.main([*argv, "--out", str(out)]) == 1
    cap = capsys.readouterr()
    assert cap.out.strip() == "" or strict_json(cap.out) is not None
    assert "val_loss nan" in cap.err  # the evaluation line is still shown
    err = cap.err.strip().splitlines()[-1]
    assert err.startswith("jaxspec train: error: train: the run diverged at step 3: val_loss (validation) is nan.")
    assert f"the last finite checkpoint (step 2) is kept in {out / 'checkpoint'}" in err
    assert "--lr = 3e+38" in err and "--warmup-steps = 1" in err and "TrainConfig" not in err
    assert not (out / "final").exists() and not (out / "summary.json").exists()
    _assert_finite_checkpoint(out / "checkpoint", 2)

    # no checkpoint yet (the default --checkpoint-every is 100): the message says so
    out2 = tmp_path / "run2"
    assert cli.main(["train", "--preset", "tiny", *RUN, *HUGE_LR, "--eval-every", "1", "--out", str(out2)]) == 1
    err = capsys.readouterr().err
    assert "diverged at step 3" in err and "No final model and no checkpoint were written" in err
    assert not (out2 / "final").exists() and not (out2 / "checkpoint").exists()


def test_api_raises_on_nonfinite_training_loss(corpus, tmp_path):
    # evaluated only at the end: the training loss (read every step) is what catches it
    with pytest.raises(TrainingDiverged, match=r"diverged at step 4: the training loss is nan") as e:
        train(TINY, _cfg(steps=4, eval_every=100), tmp_path, corpus=corpus, progress=False)
    err = e.value
    assert isinstance(err, RuntimeError) and isinstance(err, FloatingPointError)
    assert (err.step, err.metric, err.last_checkpoint, err.last_checkpoint_step) == (4, "loss", None, None)
    assert np.isnan(err.loss)
    assert "TrainConfig.lr = 3e+38" in str(err)
    assert not (tmp_path / "final").exists() and not (tmp_path / "checkpoint").exists()


def test_api_checks_parameters_before_any_checkpoint(corpus, tmp_path):
    # step 3's update makes the parameters non-finite; its loss (computed before) is finite,
    # and no evaluation runs: the check before writing step 3's checkpoint catches it
    with pytest.raises(TrainingDiverged, match=r"diverged at step 3: \d+ parameter / optimizer-state tensors") as e:
        train(TINY, _cfg(steps=10, eval_every=100, checkpoint_every=1), tmp_path, corpus=corpus, progress=False,
              stop_at=3)
    err = e.value
    assert (err.step, err.metric, err.last_checkpoint_step) == (3, "params", 2)
    assert err.last_checkpoint == tmp_path / "checkpoint" and np.isfinite(err.loss)
    assert "['params']" in str(err)  # a parameter tensor is named first
    _assert_finite_checkpoint(tmp_path / "checkpoint", 2)
    assert not (tmp_path / "final").exists()


def test_resume_refuses_a_nonfinite_checkpoint(corpus, tmp_path):
    """A checkpoint that an older version wrote after diverging: refused when resuming."""
    cfg = _cfg(steps=10, lr=1e-2, eval_every=100)
    train(TINY, cfg, tmp_path, corpus=corpus, progress=False, stop_at=1)
    state = tmp_path / "checkpoint" / "state.safetensors"
    arrays = {k: np.array(v) for k, v in load_file(state).items()}
    name = next(k for k, a in arrays.items() if k.startswith("['params']") and a.dtype == np.float32)
    arrays[name].flat[0] = np.nan
    save_file(arrays, state)
    with pytest.raises(ValueError, match=r"holds non-finite values in 1 tensors .* had diverged"):
        train(TINY, cfg, tmp_path, corpus=corpus, progress=False, resume=True)


def test_normal_tiny_run_writes_final_and_strict_json(tmp_path, capsys):
    out = tmp_path / "t"
    assert cli.main(["train", "--preset", "tiny", *RUN, "--lr", "1e-2", "--out", str(out)]) == 0
    res = strict_json(capsys.readouterr().out)
    assert res["model"] == str(out / "final") and np.isfinite(res["val_loss"])
    load_model(out / "final")
    strict_json((out / "summary.json").read_text())


def test_cli_distill_divergence(tmp_path, capsys):
    target = save_model(init_model(TINY, jax.random.key(0)), tmp_path / "target", extra_config=TOKENIZER_CONFIG)
    draft = tmp_path / "d"
    argv = ["distill", *RUN, *TINY_DRAFT, *HUGE_LR, "--target", str(target), "--eval-every", "1",
            "--checkpoint-every", "1", "--out", str(draft)]
    assert cli.main(argv) == 1
    cap = capsys.readouterr()
    assert cap.out.strip() == "" or strict_json(cap.out) is not None
    err = cap.err.strip().splitlines()[-1]
    assert err.startswith("jaxspec distill: error: distill: the run diverged at step ")
    assert " is nan" in err and "--lr = 3e+38" in err
    assert not (draft / "final").exists() and not (draft / "summary.json").exists()
    found = json.loads((draft / "checkpoint" / "state.json").read_text())["step"]
    assert f"the last finite checkpoint (step {found}) is kept in {draft / 'checkpoint'}" in err
    _assert_finite_checkpoint(draft / "checkpoint", found)


def test_api_distill_raises(corpus, tmp_path):
    target = init_model(TINY, jax.random.key(0))  # a random target is enough to diverge from
    draft = ModelConfig(vocab_size=TINY.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=1, max_position_embeddings=256)
    with pytest.raises(TrainingDiverged, match="distill: the run diverged at step 4: the training loss is nan") as e:
        distill(target, draft, _cfg(steps=4, eval_every=100), tmp_path, corpus=corpus, progress=False,
                max_compute_ratio=None)
    assert (e.value.step, e.value.metric, e.value.last_checkpoint) == (4, "loss", None)
    assert not (tmp_path / "final").exists() and not (tmp_path / "checkpoint").exists()


def test_cli_json_is_strict():
    """stdout never carries NaN / Infinity: non-finite numbers are printed as null."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _print_json({"val_loss": float("nan"), "alpha": float("inf"), "params": 3, "model": "m"})
    assert strict_json(buf.getvalue()) == {"val_loss": None, "alpha": None, "params": 3, "model": "m"}
