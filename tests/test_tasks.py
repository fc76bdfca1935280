"""The task-mix prompts (jaxspec.bench.tasks) and the drafter's training instructions
(jaxspec.training.instructions): their shape, and that the benchmark is held out."""

import pytest

from jaxspec.bench.tasks import CATEGORIES, TASKS, messages_of
from jaxspec.training.instructions import CATEGORIES as TRAIN_CATEGORIES
from jaxspec.training.instructions import instructions


def test_six_categories_of_eight_chat_prompts():
    assert CATEGORIES == ("chat", "code", "math", "summary", "context", "translation")
    for cat in CATEGORIES:
        prompts = messages_of(cat)
        assert len(prompts) == 8 and len({repr(p) for p in prompts}) == 8, cat
        for msgs in prompts:
            assert msgs[-1]["role"] == "user" and all(m["content"].strip() for m in msgs)
            assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
    assert all(len(p) == 3 for p in TASKS["chat"])  # multi-turn: user, assistant, user
    with pytest.raises(ValueError, match="category = 'poetry'; expected one of"):
        messages_of("poetry")


def test_training_instructions_cover_the_categories_and_hold_the_benchmark_out():
    items = instructions()
    assert items == instructions()  # a fixed order and content
    assert {c for c, _ in items} == set(TRAIN_CATEGORIES) == set(CATEGORIES)
    assert all(sum(c == cat for c, _ in items) >= 15 for cat in CATEGORIES)
    bench = {m["content"] for prompts in TASKS.values() for msgs in prompts for m in msgs if m["role"] == "user"}
    train = {m["content"] for _, msgs in items for m in msgs if m["role"] == "user"}
    assert not bench & train
    assert len({repr(m) for _, m in items}) == len(items)
