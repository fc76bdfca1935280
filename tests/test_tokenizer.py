import numpy as np
import pytest

from jaxspec.formats.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, BaseTokenizer, ByteTokenizer

TEXTS = ["", "hello", "def f(x):\n    return x  # ok\n", "é漢字🙂", "\x00\xff"]


def test_id_layout():
    tok = ByteTokenizer()
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258, 264)
    assert (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE) == (256, 257, 258, 264)
    assert VOCAB_SIZE % 8 == 0
    assert [tok.is_special(i) for i in (0, 255, 256, 263)] == [False, False, True, True]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_literal_example():
    tok = ByteTokenizer()
    assert tok.encode("é!") == [195, 169, 33]
    assert tok.encode("a", add_bos=True, add_eos=True) == [256, 97, 257]


def test_decode_skips_specials_and_padding():
    tok = ByteTokenizer()
    assert tok.decode([BOS_ID, 104, PAD_ID, 105, EOS_ID, 263, -1]) == "hi"
    assert tok.decode(np.array([[104], [105]], np.int32)) == "hi"  # arrays of any shape
    assert tok.decode(i for i in (104, 105)) == "hi"  # any iterable


def test_decode_invalid_utf8_is_replaced():
    tok = ByteTokenizer()
    assert tok.decode([195]) == "\ufffd"
    assert tok.decode([104, 0xFF, 105]) == "h\ufffdi"


def test_encode_rejects_non_str():
    with pytest.raises(ValueError, match="expected a str"):
        ByteTokenizer().encode(b"bytes")


def _word_tokenizer(bos_id=None, eos_id=None):
    """An in-memory HFTokenizer over a few words (needs the ``tokenizers`` package)."""
    tokenizers = pytest.importorskip("tokenizers")
    from jaxspec.formats.hf_tokenizer import HFTokenizer

    vocab = {w: i for i, w in enumerate(["<unk>", "<bos>", "<eos>", "a", "b"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return HFTokenizer(tok, bos_id=bos_id, eos_id=eos_id, source="words")


@pytest.mark.parametrize("kind", ["byte", pytest.param("hf", marks=pytest.mark.real)])
def test_bos_eos_framing_is_shared(kind):
    """Both tokenizers frame ids in BaseTokenizer.encode: [BOS] + ids + [EOS] on request."""
    tok = ByteTokenizer() if kind == "byte" else _word_tokenizer(bos_id=1, eos_id=2)
    assert type(tok).encode is BaseTokenizer.encode
    ids = tok.encode("a b")
    assert ids == ([97, 32, 98] if kind == "byte" else [3, 4])
    assert tok.encode("a b", add_bos=True) == [tok.bos_id, *ids]
    assert tok.encode("a b", add_eos=True) == [*ids, tok.eos_id]
    assert tok.encode("a b", add_bos=True, add_eos=True) == [tok.bos_id, *ids, tok.eos_id]
    assert tok.encode("", add_bos=True, add_eos=True) == [tok.bos_id, tok.eos_id]
    name = type(tok).__name__
    with pytest.raises(ValueError, match=rf"{name}\.encode: text is a bytes; expected a str"):
        tok.encode(b"a")


@pytest.mark.real
def test_missing_special_is_named():
    tok = _word_tokenizer(eos_id=2)
    assert tok.encode("a", add_eos=True) == [3, 2]
    with pytest.raises(ValueError, match=r"HFTokenizer\.encode: add_bos=True but words has no bos token"):
        tok.encode("a", add_bos=True)
    with pytest.raises(ValueError, match="add_eos=True but ByteTokenizer has no eos token"):
        ByteTokenizer(eos_id=None).encode("a", add_eos=True)
