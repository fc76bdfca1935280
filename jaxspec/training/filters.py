"""Filters for instructions a chat model wrote itself (:mod:`jaxspec.training.magpie`):
length, language, repetition, leaked template markup, exact and near duplicates.

Each filter is a plain function of one text; :func:`keep_reason` names the first filter a
text fails (``None``: keep it), so a run can report why it dropped what it dropped::

    keep_reason("hi")                                  # 'short'
    keep_reason("Write a poem about the sea. " * 5)    # 'repetitive'
    keep_reason("How do I bake bread at home?")        # None

Near duplicates are found with MinHash over word 3-shingles (Broder 1997), bucketed by
locality-sensitive hashing: two texts whose shingle sets have Jaccard similarity J share a
band with probability ``1 - (1 - J**r)**b`` (``b`` bands of ``r`` rows; with 16 bands of 4
rows, 0.98 at J = 0.8 and 0.05 at J = 0.3), and a shared band is confirmed against the
estimated similarity, so the result does not depend on the order in which bands collide.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["normalize", "words", "keep_reason", "MinHashDedup", "REASONS", "ENGLISH_WORDS"]

#: the reasons :func:`keep_reason` gives, in the order it checks them
REASONS = ("empty", "short", "long", "markup", "not_text", "not_english", "repetitive", "refusal")

#: frequent English function words: an English instruction of a few words has some of them
ENGLISH_WORDS = frozenset(
    "a an the and or but if of to in on at for with from by about as is are was were be been do does did "
    "how what why when where which who whom whose can could would should will may might must i you he she "
    "it we they me my your our their this that these those there here not no yes some any all each every "
    "write give tell explain make list describe help please".split())

_REFUSALS = ("i'm sorry", "i am sorry", "as an ai", "i cannot", "i can't help", "i'm not able")
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)


def normalize(text: str) -> str:
    """Case-folded, NFKC-normalized, whitespace-collapsed text: exact duplicates up to case
    and spacing compare equal."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def words(text: str) -> list[str]:
    """The words of ``text`` after :func:`normalize` (letters and digits, inner apostrophes)."""
    return _WORD.findall(normalize(text))


def keep_reason(text: str, *, min_words: int = 4, max_words: int = 300,
                markers: Sequence[str] = ("<|", "|>", "[INST]", "<start_of_turn>", "<s>", "</s>")) -> str | None:
    """The first of :data:`REASONS` that ``text`` fails, or ``None`` to keep it.

    - ``short`` / ``long``: fewer than ``min_words`` or more than ``max_words`` words;
    - ``markup``: a chat-template marker (``markers``) leaked into the text;
    - ``not_text``: under 60% of the characters are letters, digits, spaces or punctuation;
    - ``not_english``: under 85% ASCII letters among letters, or (for 6 words or more) no
      frequent English word;
    - ``repetitive``: under 40% distinct words (for 10 words or more), or one word 3-gram
      taking over a quarter of the 3-grams;
    - ``refusal``: the instruction opens the way an assistant's refusal does.
    """
    if not text or not text.strip():
        return "empty"
    w = words(text)
    if len(w) < min_words:
        return "short"
    if len(w) > max_words:
        return "long"
    if any(m in text for m in markers):
        return "markup"
    printable = sum(ch.isalnum() or ch.isspace() or unicodedata.category(ch).startswith("P") for ch in text)
    if printable < 0.6 * len(text):
        return "not_text"
    letters = [ch for ch in text if ch.isalpha()]
    if letters and sum(ch.isascii() for ch in letters) < 0.85 * len(letters):
        return "not_english"
    if len(w) >= 6 and not ENGLISH_WORDS & set(w):
        return "not_english"
    if len(w) >= 10 and len(set(w)) < 0.4 * len(w):
        return "repetitive"
    grams = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
    if len(grams) >= 8:
        if max(Counter(grams).values()) > 0.25 * len(grams):
            return "repetitive"
    if normalize(text).startswith(_REFUSALS):
        return "refusal"
    return None


def _shingles(text: str, k: int) -> set[str]:
    w = words(text)
    if len(w) < k:
        return {" ".join(w)}
    return {" ".join(w[i:i + k]) for i in range(len(w) - k + 1)}


class MinHashDedup:
    """Keeps texts that are neither exact (after :func:`normalize`) nor near duplicates of a
    text kept before; ``threshold`` is the estimated Jaccard similarity of word
    ``shingle``-grams at or above which a text counts as a near duplicate::

        d = MinHashDedup()
        d.add("How do I bake bread at home?")                  # True: kept
        d.add("how do I bake bread at home ?")                 # False: exact duplicate
        d.add("How do I bake bread at home quickly?")          # False: near duplicate

    The hashes are fixed (seeded blake2b), so the same texts in the same order always give
    the same verdicts."""

    def __init__(self, *, threshold: float = 0.7, bands: int = 16, rows: int = 4, shingle: int = 3,
                 seed: int = 0):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"MinHashDedup: threshold = {threshold!r}; expected a number in (0, 1]")
        for name, v in (("bands", bands), ("rows", rows), ("shingle", shingle)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MinHashDedup: {name} = {v!r}; expected a positive integer")
        self.threshold, self.bands, self.rows, self.shingle = threshold, bands, rows, shingle
        n = bands * rows
        rng = np.random.default_rng(seed)
        self._a = rng.integers(1, (1 << 61) - 1, n, dtype=np.uint64)
        self._b = rng.integers(0, (1 << 61) - 1, n, dtype=np.uint64)
        self._exact: set[str] = set()
        self._buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
        self._sigs: list[np.ndarray] = []

    def signature(self, text: str) -> np.ndarray:
        """uint64[bands * rows]: the text's MinHash signature."""
        base = np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") >> 3
                         for s in _shingles(text, self.shingle)], dtype=np.uint64)
        # (a * x + b) mod 2^64 over uint64 wraps: a fixed family of permutations of the hashes
        with np.errstate(over="ignore"):
            perm = base[None, :] * self._a[:, None] + self._b[:, None]
        return perm.min(axis=1)

    def similar(self, text: str) -> float:
        """The largest estimated Jaccard similarity of ``text`` to a kept text (0.0: none shares a band)."""
        sig = self.signature(text)
        return self._best(sig)

    def _best(self, sig: np.ndarray) -> float:
        best = 0.0
        seen: set[int] = set()
        for band, key in enumerate(self._keys(sig)):
            for j in self._buckets[band].get(key, ()):
                if j not in seen:
                    seen.add(j)
                    best = max(best, float(np.mean(self._sigs[j] == sig)))
        return best

    def _keys(self, sig: np.ndarray) -> Iterable[bytes]:
        r = self.rows
        return (sig[i * r:(i + 1) * r].tobytes() for i in range(self.bands))

    def add(self, text: str) -> bool:
        """Keeps ``text`` and returns True unless it duplicates a kept text."""
        norm = normalize(text)
        if norm in self._exact:
            return False
        sig = self.signature(text)
        if self._best(sig) >= self.threshold:
            return False
        self._exact.add(norm)
        idx = len(self._sigs)
        self._sigs.append(sig)
        for band, key in enumerate(self._keys(sig)):
            self._buckets[band].setdefault(key, []).append(idx)
        return True

    def __len__(self) -> int:
        return len(self._sigs)
