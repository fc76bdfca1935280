"""Instructions whose responses, in the target's own words, train a draft head for a chat model.

A drafter is best trained on what the target says (EAGLE, Medusa): the target answers these
instructions (:mod:`jaxspec.training.responses`), and the head learns from the target's features on
prompt and answer. The set covers the six categories of the task-mix benchmark
(:mod:`jaxspec.bench.tasks`: chat, code, math, summarizing, answering from a context,
translating) without sharing a prompt with it (tests/test_tasks.py). Summaries and answers
from a context read passages of the standard library's own documentation (module docstrings),
so the set needs no download and varies with what is installed only through those passages::

    from jaxspec.training.instructions import instructions
    items = instructions()          # [(category, messages), ...], a fixed order
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

__all__ = ["instructions", "CATEGORIES"]

CATEGORIES = ("chat", "code", "math", "summary", "context", "translation")

_CHAT = (
    "What are some tips for sleeping better?", "How can I save money on groceries?",
    "Explain why the sky is blue in simple words.", "What should I pack for a weekend camping trip?",
    "Give me three ideas for a rainy Sunday afternoon.", "How do I write a polite email asking for a deadline extension?",
    "What is the difference between a virus and a bacterium?", "Why do cats purr?",
    "Suggest a simple breakfast that is high in protein.", "How can I become more productive when working from home?",
    "What are the benefits of learning a second language?", "How do I clean a cast iron pan?",
    "Write a short poem about autumn leaves.", "Tell me a fun fact about octopuses.",
    "What is a good way to start a conversation with a stranger?", "How do airplanes stay in the air?",
    "Give me advice for my first day at a new job.", "What is the best way to memorize vocabulary?",
    "How do I make a cup of pour-over coffee?", "Describe the water cycle.",
    "What are some easy houseplants for beginners?", "How can I reduce stress before an exam?",
    "Write a short thank-you note to a teacher.", "Why do we have seasons?",
    "Plan a three-day trip to Rome.", "What is the role of the heart in the human body?",
    "How do I politely say no to extra work?", "What are some good stretching exercises for the back?",
    "Explain what inflation is to a teenager.", "Write a short story about a robot who learns to paint.",
    "How do bees make honey?", "What should I consider when buying a used car?",
)

_CHAT_TURNS = (
    ("I want to get better at cooking.", "A good start is to master a few basic techniques, like chopping and sauteing.",
     "Which simple dish should I cook first?"),
    ("I can't decide between a cat and a dog.", "Both are great! It depends on your time, space and lifestyle.",
     "I live in a small flat and work long hours."),
    ("I'd like to read more books this year.", "Setting a small daily goal, like twenty pages, often helps.",
     "How do I find books I will actually enjoy?"),
    ("My laptop has become very slow.", "It could be too many startup programs, a full disk, or too little memory.",
     "How do I check which programs start automatically?"),
    ("I want to learn to draw.", "Drawing simple shapes and copying objects around you is a good beginning.",
     "How much time should I practise each day?"),
    ("I'm planning a birthday party for my daughter.", "Fun! How old is she turning, and how many guests?",
     "She is turning seven and we expect twelve children. Any game ideas?"),
)

_CODE_TASKS = (
    "reverses a linked list", "computes the factorial of a number recursively",
    "finds the largest element in a list without using max", "converts a temperature from Celsius to Fahrenheit",
    "checks whether two strings are anagrams", "flattens a nested list", "returns the second smallest number in a list",
    "counts the vowels in a string", "implements binary search on a sorted list",
    "removes all whitespace from a string", "computes the greatest common divisor of two integers",
    "transposes a matrix given as a list of lists", "checks whether a year is a leap year",
    "returns the running average of a list of numbers", "capitalizes the first letter of every word in a sentence",
    "finds the longest word in a sentence", "rotates a list by k positions", "sorts a list of dictionaries by a key",
    "validates an email address with a regular expression", "groups a list of words by their first letter",
)
_CODE_LANGUAGES = ("Python", "JavaScript", "C", "Rust")

_TRANSLATE = (
    "The children are playing in the garden.", "Could you tell me where the bus stop is?",
    "I have been learning to cook for two years.", "The shop closes at six in the evening.",
    "We should leave early to avoid the traffic.", "This soup is too hot to eat right now.",
    "My grandmother tells the best stories.", "The concert was cancelled because of the storm.",
    "Do you know a good doctor in this town?", "He forgot his umbrella at the office.",
    "The new bridge will open next spring.", "She reads the newspaper every morning with her coffee.",
)
_LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")


def _math(rng: random.Random) -> list[str]:
    out = []
    for _ in range(12):
        a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(5, 90)
        out += [
            f"A baker makes {a} loaves a day for {b} days and sells {c} of them. How many loaves are left? "
            "Explain step by step.",
            f"What is {a} times {b} plus {c}? Show the steps.",
            f"A car uses {b} litres of fuel per 100 km. How much fuel does it need for {a * 10} km? Explain.",
        ]
    return out


def _docstrings(limit: int) -> list[str]:
    """Long module docstrings of the standard library, as plain passages (sorted by file)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        if doc and 300 <= len(doc) <= 1500:
            found.append(" ".join(doc.split()))
        if len(found) >= limit:
            break
    return found


def instructions(*, seed: int = 0, passages: int = 40) -> list[tuple[str, list[dict[str, str]]]]:
    """The training instructions: ``[(category, messages)]`` in a fixed order (``seed`` draws the
    math problems' numbers; ``passages`` standard-library docstrings feed the summaries and the
    answers from a context)."""
    rng = random.Random(seed)
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    items = [("chat", user(t)) for t in _CHAT]
    items += [("chat", [{"role": r, "content": t} for r, t in zip(("user", "assistant", "user"), turns)])
              for turns in _CHAT_TURNS]
    items += [("code", user(f"Write a {lang} function that {task}."))
              for i, task in enumerate(_CODE_TASKS) for lang in (_CODE_LANGUAGES[i % 4], "Python") if lang]
    items += [("math", user(t)) for t in _math(rng)]
    docs = _docstrings(passages)
    items += [("summary", user(f"Summarize this documentation in a few sentences.\n\n{d}")) for d in docs[::2]]
    items += [("context", user(f"Read the text and answer the question.\n\nText: {d}\n\nQuestion: What is this "
                                "module for, and what does it provide?")) for d in docs[1::2]]
    items += [("translation", user(f"Translate into {_LANGUAGES[i % len(_LANGUAGES)]}: {s}"))
              for i, s in enumerate(_TRANSLATE)]
    items += [("translation", user(f"Translate into {_LANGUAGES[(i + 2) % len(_LANGUAGES)]}: {s}"))
              for i, s in enumerate(_TRANSLATE)]
    seen, unique = set(), []
    for cat, msgs in items:  # a code task whose two languages coincide appears once
        key = repr(msgs)
        if key not in seen:
            seen.add(key)
            unique.append((cat, msgs))
    return unique
