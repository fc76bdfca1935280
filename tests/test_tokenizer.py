import numpy as np
import pytest

from jaxspec.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer

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
