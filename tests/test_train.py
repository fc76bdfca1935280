"""Corpus, training and distillation (tiny models, a few dozen steps on a corpus slice)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxspec.formats.checkpoint import load_model
from jaxspec.nn.config import ModelConfig
from jaxspec.training.corpus import (
    EXCLUDED_DIRS,
    BatchSampler,
    eval_windows,
    is_validation,
    list_source_files,
    load_corpus,
)
from jaxspec.nn.model import init_model
from jaxspec.formats.tokenizer import BOS_ID, EOS_ID
from jaxspec.training.train import (
    PRESETS,
    TrainConfig,
    acceptance_alpha,
    distill,
    evaluate_loss,
    flops_per_token,
    train,
)

TINY = PRESETS["tiny"]
TINY_DRAFT = ModelConfig(vocab_size=264, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=1, max_position_embeddings=256)
CFG = TrainConfig(steps=24, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=3, eval_every=12,
                  eval_windows=16, checkpoint_every=8, seed=3)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_files=6)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    return out, train(TINY, CFG, out, corpus=corpus, progress=False)


# ----------------------------------------------------------------------------- corpus
def test_file_list_is_sorted_and_filtered():
    files = list_source_files()
    assert files == sorted(files) == list_source_files()
    assert len(files) > 100 and "os.py" in files
    for f in files:
        assert f.endswith(".py")
        assert not set(f.split("/")[:-1]) & EXCLUDED_DIRS, f


def test_split_is_disjoint_fixed_and_by_module():
    files = list_source_files()
    val = [f for f in files if is_validation(f, 0.05)]
    assert 0 < len(val) < len(files) // 5
    # the hash of the path alone decides: independent of order and of the other files
    assert [f for f in reversed(files) if is_validation(f, 0.05)] == val[::-1]
    corpus = load_corpus()
    assert set(corpus.train_files).isdisjoint(corpus.val_files)
    assert sorted(corpus.train_files + corpus.val_files) == files
    assert list(corpus.val_files) == val


def test_streams(corpus):
    for stream, files in ((corpus.train, corpus.train_files), (corpus.val, corpus.val_files)):
        assert stream.dtype == np.uint16 and stream[0] == BOS_ID and stream[-1] == EOS_ID
        assert int((stream == BOS_ID).sum()) == int((stream == EOS_ID).sum()) == len(files)
    first = (load_corpus(max_files=1).train[1:-1]).astype(np.uint8).tobytes()
    assert first == (__import__("pathlib").Path(corpus.root) / corpus.train_files[0]).read_bytes()
    assert load_corpus(max_files=6).digest == corpus.digest


def test_sampler_is_deterministic_and_resumable(corpus):
    a = BatchSampler(corpus.train, 4, 16, seed=7)
    b = BatchSampler(corpus.train, 4, 16, seed=7)
    first = a.next()
    assert first.shape == (4, 17) and first.dtype == np.int32
    np.testing.assert_array_equal(first, b.next())
    state = json.loads(json.dumps(a.get_state()))  # JSON-able
    expected = [a.next() for _ in range(3)]
    c = BatchSampler(corpus.train, 4, 16, seed=0)
    c.set_state(state)
    for e in expected:
        np.testing.assert_array_equal(c.next(), e)
    assert not np.array_equal(BatchSampler(corpus.train, 4, 16, seed=8).next(), first)


def test_more_eval_windows_than_the_stream_holds_is_refused(corpus, tmp_path):
    """More windows than distinct start positions would only repeat windows (and make every
    evaluation slow): an error naming the field, before any training."""
    from jaxspec.training.train import _val_windows

    distinct = corpus.val.size - CFG.seq_len
    assert _val_windows(corpus, dataclasses.replace(CFG, eval_windows=distinct)).shape == (distinct, CFG.seq_len + 1)
    too_many = dataclasses.replace(CFG, eval_windows=distinct + 1)
    with pytest.raises(ValueError, match=rf"TrainConfig.eval_windows = {distinct + 1}: .* expected at most {distinct:,}"):
        train(TINY, too_many, tmp_path, corpus=corpus, progress=False)
    assert not (tmp_path / "checkpoint").exists()


def test_eval_windows(corpus):
    w = eval_windows(corpus.val, 5, 16)
    assert w.shape == (5, 17)
    np.testing.assert_array_equal(w, eval_windows(corpus.val, 5, 16))
    np.testing.assert_array_equal(w[0], corpus.val[:17])
    np.testing.assert_array_equal(w[-1], corpus.val[-17:])


# ----------------------------------------------------------------------------- train
def test_train_loss_decreases(trained, corpus):
    out, result = trained
    val = eval_windows(corpus.val, CFG.eval_windows, CFG.seq_len)
    initial = evaluate_loss(init_model(TINY, jax.random.key(CFG.seed)), val)
    assert initial > 5.0  # ~ ln(264) = 5.58
    assert [h["step"] for h in result.history] == [12, 24]
    assert result.history[-1]["val_loss"] < initial - 1.0
    assert result.history[-1]["val_loss"] == pytest.approx(evaluate_loss(result.model, val), rel=1e-5)
    assert result.step == 24 and result.final_dir == out / "final"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["history"] == result.history and summary["params"] == TINY.num_params()


def test_export_loads_back(trained):
    _, result = trained
    loaded = load_model(result.final_dir)
    assert loaded.config == result.model.config and loaded.config.eos_token_ids == (EOS_ID,)  # generate stops there
    for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, _params(loaded))),
                    jax.tree.leaves(jax.tree.map(np.asarray, _params(result.model)))):
        np.testing.assert_array_equal(a, b)


def _params(model):
    from flax import nnx

    return nnx.state(model)


def test_resume_equals_uninterrupted(trained, corpus, tmp_path):
    from jaxspec.training.train import _train_step

    _, full = trained
    compiled = _train_step._cache_size()
    part = train(TINY, CFG, tmp_path, corpus=corpus, progress=False, stop_at=10)
    assert part.step == 10 and part.final_dir is None and part.history == []
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 10
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        train(TINY, CFG, tmp_path, corpus=corpus, progress=False)
    resumed = train(TINY, CFG, tmp_path, corpus=corpus, progress=False, resume=True)
    assert resumed.step == 24
    for a, b in zip(jax.tree.leaves(_params(resumed.model)), jax.tree.leaves(_params(full.model))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    assert [h["val_loss"] for h in resumed.history] == pytest.approx([h["val_loss"] for h in full.history], abs=1e-6)
    assert _train_step._cache_size() == compiled  # same configuration: no recompilation


def test_resume_errors(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(TINY, CFG, tmp_path / "fresh", corpus=corpus, progress=False, resume=True)
    train(TINY, CFG, tmp_path / "run", corpus=corpus, progress=False, stop_at=1)
    other = TrainConfig(**{**CFG.__dict__, "lr": 5e-3})
    with pytest.raises(ValueError, match="lr"):
        train(TINY, other, tmp_path / "run", corpus=corpus, progress=False, resume=True)


def test_train_config_validation():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=10, warmup_steps=10)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=-1.0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        train(TINY, TrainConfig(seq_len=512), "/nonexistent/never-written")


# ----------------------------------------------------------------------------- distill
def test_distill_raises_alpha(trained, corpus, tmp_path):
    _, target = trained
    cfg = TrainConfig(steps=20, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=2, eval_every=10,
                      eval_windows=16, checkpoint_every=10)
    result = distill(target.model, TINY_DRAFT, cfg, tmp_path, corpus=corpus, progress=False, max_compute_ratio=None)
    assert result.alpha_after > result.alpha_before + 0.1
    assert result.history[-1]["val_kl"] < result.history[0]["val_kl"]
    val = eval_windows(corpus.val, cfg.eval_windows, cfg.seq_len)
    assert acceptance_alpha(target.model, result.model, val) == pytest.approx(result.alpha_after, rel=1e-5)
    assert acceptance_alpha(target.model, target.model, val) == pytest.approx(1.0, abs=1e-5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["alpha_before"] == result.alpha_before and summary["alpha_after"] == result.alpha_after


def test_distill_refuses_expensive_draft(trained, corpus, tmp_path):
    _, target = trained
    with pytest.raises(ValueError, match="per-token FLOPs"):
        distill(target.model, TINY, CFG, tmp_path, corpus=corpus, progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        distill(target.model, TINY_DRAFT.__class__(**{**TINY_DRAFT.to_dict(), "vocab_size": 300}), CFG, tmp_path,
                corpus=corpus, progress=False, max_compute_ratio=None)


def test_shipped_presets_compute_ratio():
    t, d = PRESETS["target"], PRESETS["draft"]
    assert t.num_params() >= 4_000_000
    for ctx in (1, 128, t.max_position_embeddings):
        assert flops_per_token(d, ctx) <= flops_per_token(t, ctx) / 8
