"""A feature head with a reduced draft vocabulary (EAGLE-3): the target's LM head at K rows,
q zero elsewhere. Its logits against the full head, greedy equality through ``generate``,
the exact law of verification (enumerated), saving and loading, and the refusals. (The
end-to-end chi-square law: tests/test_generate_exactness.py, the reduced-vocabulary cases.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny_pair

import jaxspec
from jaxspec.nn.head import head_config, init_head, load_head, save_head, whole_vocab
from jaxspec.nn.model import forward_features, init_model

V = 16
IDS = (3, 0, 7, 12, 5, 9)  # any order: the head's row k drafts id IDS[k]


@pytest.fixture(scope="module")
def models():
    target, _ = tiny_pair(5, vocab_size=V, hidden_size=16, num_heads=2, num_layers=2)
    return target, init_head(head_config(target.config), jax.random.key(7), draft_vocab=IDS)


def test_rows_of_the_lm_head_are_the_full_heads_columns(models):
    """``unembed_rows(h, ids)`` is ``unembed(h)[..., ids]``, tied and untied, with a softcap."""
    target, _ = models
    h = jax.random.normal(jax.random.key(1), (2, 3, 16))
    ids = jnp.asarray(IDS, jnp.int32)
    np.testing.assert_allclose(np.asarray(target.unembed_rows(h, ids)), np.asarray(target.unembed(h))[..., IDS],
                               rtol=1e-6, atol=1e-6)
    for change in (dict(tie_word_embeddings=True), dict(final_logit_softcapping=2.0)):
        other = init_model(dataclasses.replace(target.config, **change), jax.random.key(3))
        np.testing.assert_allclose(np.asarray(other.unembed_rows(h, ids)), np.asarray(other.unembed(h))[..., IDS],
                                   rtol=1e-6, atol=1e-6, err_msg=str(change))


def test_the_head_drafts_its_ids_only(models):
    """Logits: the full head's at the K ids, -inf elsewhere, so q is exactly 0 there."""
    target, head = models
    assert head.draft_vocab_size == len(IDS)
    toks = jnp.asarray([[1, 4, 2, 8]], jnp.int32)
    pred = head.teacher_forced(target, toks, forward_features(target, toks))
    got, full = np.asarray(head.logits(target, pred)), np.asarray(target.unembed(pred))
    other = np.setdiff1d(np.arange(V), IDS)
    np.testing.assert_allclose(got[..., IDS], full[..., IDS], rtol=1e-6, atol=1e-6)
    assert np.isneginf(got[..., other]).all()
    q = np.asarray(jax.nn.softmax(head.logits(target, pred), axis=-1))
    assert (q[..., other] == 0).all() and np.allclose(q.sum(-1), 1, atol=1e-6)


def test_whole_vocab_copy_drafts_every_id_with_the_same_weights(models):
    """``whole_vocab``: the full LM head's logits (every id finite) from the same prediction,
    equal to the reduced head's at its ids; the reduced head is left as it is."""
    target, head = models
    full = whole_vocab(head)
    assert full.draft_vocab_size is None and head.draft_vocab_size == len(IDS)
    toks = jnp.asarray([[1, 4, 2, 8]], jnp.int32)
    feats = forward_features(target, toks)
    pred = head.teacher_forced(target, toks, feats)
    np.testing.assert_array_equal(np.asarray(full.teacher_forced(target, toks, feats)), np.asarray(pred))
    got = np.asarray(full.logits(target, pred))
    np.testing.assert_allclose(got, np.asarray(target.unembed(pred)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[..., IDS], np.asarray(head.logits(target, pred))[..., IDS], rtol=1e-6, atol=1e-6)
    out = jaxspec.generate(jax.random.key(0), target, full, [[1, 2, 3]], max_new_tokens=6, tree="chain:3",
                           sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    ref = jaxspec.generate_autoregressive(jax.random.key(0), target, [[1, 2, 3]], max_new_tokens=6,
                                          sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.parametrize("tree", ["chain:4", "branch:2,2,1"])
def test_greedy_equality(models, tree):
    """At temperature 0 the output is greedy target decoding, although the target's argmax
    is often an id the head cannot draft."""
    target, head = models
    prompts = [[1, 2, 3, 4, 5], [9], [3, 3, 1]]
    ref = jaxspec.generate_autoregressive(jax.random.key(1), target, prompts, max_new_tokens=20,
                                          sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    out = jaxspec.generate(jax.random.key(1), target, head, prompts, max_new_tokens=20, tree=tree,
                           sampling=jaxspec.Sampling(temperature=0.0), stop_tokens=())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert set(np.asarray(ref.tokens).ravel()) - set(IDS), "the greedy path must need an id outside the head's"


def test_exact_law_by_enumeration(models):
    """``verify(method="enumerate")``: the law of two rounds' tokens, enumerated, is the
    target's, and the acceptance matches its exact expectation (q = 0 outside the ids)."""
    target, head = models
    r = jaxspec.verify(target=target, draft=head, prompt=[1, 2], tree="chain:2", horizon=2, num_samples=1 << 16,
                       method="enumerate", progress=False)
    assert r.passed, r.summary()


def test_save_load_round_trip(models, tmp_path):
    target, head = models
    folder = save_head(head, tmp_path / "head", target=target)
    back = load_head(folder)
    assert back.draft_vocab_size == len(IDS)
    np.testing.assert_array_equal(np.asarray(back.draft_vocab.get_value()), IDS)
    h = jax.random.normal(jax.random.key(2), (1, 2, 16))
    np.testing.assert_array_equal(np.asarray(back.logits(target, h)), np.asarray(head.logits(target, h)))


def test_a_head_stored_in_float16_loads_as_float32(models, tmp_path):
    """``save_head(storage_dtype="float16")``: half the bytes on disk, cast back on loading,
    the ids exact."""
    target, head = models
    small = save_head(head, tmp_path / "f16", storage_dtype="float16")
    big = save_head(head, tmp_path / "f32")
    assert (small / "model.safetensors").stat().st_size < 0.6 * (big / "model.safetensors").stat().st_size
    back = load_head(small)
    np.testing.assert_array_equal(np.asarray(back.draft_vocab.get_value()), IDS)
    w, w16 = np.asarray(head.fc.kernel[...]), np.asarray(back.fc.kernel[...])
    assert w16.dtype == np.float32 and np.array_equal(w16, w.astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="storage_dtype = 'int8'; expected None or 'float16'"):
        save_head(head, tmp_path / "x", storage_dtype="int8")


def test_bad_ids_are_refused(models, tmp_path):
    target, head = models
    hc = head_config(target.config)
    with pytest.raises(ValueError, match="outside 0..15 or repeated ids"):
        init_head(hc, jax.random.key(0), draft_vocab=[1, 1, 2])
    with pytest.raises(ValueError, match="outside 0..15 or repeated ids"):
        init_head(hc, jax.random.key(0), draft_vocab=[1, 16])
    with pytest.raises(ValueError, match=r"draft_vocab = float64\[2\]; expected a non-empty 1-D"):
        init_head(hc, jax.random.key(0), draft_vocab=[1.0, 2.0])
    from safetensors.numpy import load_file, save_file

    folder = save_head(head, tmp_path / "head")
    tensors = load_file(folder / "model.safetensors")
    tensors["draft_vocab"] = np.asarray([3, 3, 7, 12, 5, 9], np.int32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match="tensor 'draft_vocab' holds ids outside 0..15 or repeated ids"):
        load_head(folder)


def test_the_shipped_smollm2_head_loads_by_name():
    """``smollm2-135m-head`` ships in the package (float16 on disk, about 8 MB) and loads by
    name as a FeatureHead for SmolLM2-135M's width and vocabulary, drafting 8,192 ids."""
    from jaxspec.formats.checkpoint import MODELS_DIR, embedded_models, load_draft
    from jaxspec.nn.head import FeatureHead, recorded_target_digest

    assert "smollm2-135m-head" in embedded_models()
    assert (MODELS_DIR / "smollm2-135m-head" / "model.safetensors").stat().st_size < 10e6
    head = load_draft("smollm2-135m-head")
    assert isinstance(head, FeatureHead) and head.draft_vocab_size == 8192
    assert (head.config.hidden_size, head.config.vocab_size) == (576, 49152)
    assert head.fc.kernel[...].dtype == jnp.float32 and recorded_target_digest(MODELS_DIR / "smollm2-135m-head")


def test_a_heads_preferred_tree_is_saved_loaded_and_drafted_by_default(models, tmp_path):
    """``preferred_tree`` travels in config.json; ``jaxspec.generate(tree=None)`` drafts it
    (one draft forward a round for chain:1), an explicit ``tree`` wins, and a bad spec on
    disk is refused naming the key."""
    target, head = models
    head.preferred_tree = "chain:1"
    try:
        save_head(head, tmp_path / "h", target=target)
    finally:
        head.preferred_tree = None
    loaded = load_head(tmp_path / "h")
    assert loaded.preferred_tree == "chain:1"
    kw = dict(max_new_tokens=6, sampling=jaxspec.Sampling(temperature=0), stop_tokens=())
    default = jaxspec.generate(jax.random.key(0), target, loaded, [[1, 2, 3]], **kw)
    chain3 = jaxspec.generate(jax.random.key(0), target, loaded, [[1, 2, 3]], tree="chain:3", **kw)
    assert default.accepted_per_depth.shape[1] == 1 and chain3.accepted_per_depth.shape[1] == 3
    assert int(default.draft_calls[0]) == int(default.rounds[0])  # depth 1: one draft forward a round
    assert default.tokens.tolist() == chain3.tokens.tolist()  # greedy: the same tokens either way
    assert jaxspec.generate(jax.random.key(0), target, head, [[1, 2, 3]], **kw).accepted_per_depth.shape[1] == 4

    cfg = tmp_path / "h" / "config.json"
    cfg.write_text(cfg.read_text().replace('"tree": "chain:1"', '"tree": "chain:zero"'))
    with pytest.raises(ValueError, match=r"chain:zero"):  # parsed where it is used
        jaxspec.generate(jax.random.key(0), target, load_head(tmp_path / "h"), [[1, 2, 3]], **kw)
    cfg.write_text(cfg.read_text().replace('"tree": "chain:zero"', '"tree": 3'))
    with pytest.raises(ValueError, match=r"config.json: tree = 3; expected a tree spec string"):
        load_head(tmp_path / "h")


def test_the_shipped_smollm2_head_prefers_the_tree_the_command_line_drafts():
    from jaxspec.formats.packaged import PACKAGED_MODELS  # noqa: PLC0415

    entry = PACKAGED_MODELS["smollm2-135m"]
    assert jaxspec.load_draft(entry.draft).preferred_tree == entry.tree == "chain:1"
