"""Hostile inputs, third round (issue 50): the newer surfaces. GGUF files whose metadata lies
about the tensors, or that are cut short; chat templates that fail, recurse or render nothing;
lone surrogates in chat messages; a ``--chat`` message longer than the context; user drafters
whose ``check`` answers nothing; ``verify --samples`` past the block limit; ``JAX_PLATFORMS``
naming a platform the machine lacks, and any unexpected error of the command line. Each is
refused at the boundary with one line naming the key, flag or file, the value and what was
expected (exit 2 on the command line; 1 for an internal error)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
gguf = pytest.importorskip("gguf")

from _gguf_writer import write_gguf  # noqa: E402
from jaxspec.cli import main  # noqa: E402
from jaxspec.formats.checkpoint import config_to_hf, load_model  # noqa: E402
from jaxspec.nn.config import ModelConfig  # noqa: E402
from jaxspec.formats.gguf import gguf_config  # noqa: E402
from jaxspec.formats.gguf_tokenizer import load_gguf_tokenizer  # noqa: E402
from test_gguf import SMALL, _hf_tensors  # noqa: E402

HERE = Path(__file__).parent
TIMEOUT = 600


def _gguf(tmp_path, name: str = "m", **kw) -> Path:
    """A 2-layer llama GGUF file (hidden 64, vocab 300, context 128) with ``kw`` passed to
    the writer (``metadata=``, ``raw=``)."""
    cfg = ModelConfig(**SMALL)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, _hf_tensors(cfg), config_to_hf(cfg), **kw)
    return path


# ----------------------------------------------------------------------------- GGUF metadata

def test_gguf_block_count_beyond_its_tensors_is_refused_by_key(tmp_path):
    """``llama.block_count = 100000`` in a 2-layer file: the loader built a model of 100,000
    layers before looking for block 2's tensors (no output after 150 s). The count is checked
    against the blocks the file holds first, naming the key."""
    path = _gguf(tmp_path, metadata={"llama.block_count": 100000})
    want = (r"llama\.block_count = 100000, but the file holds the tensors of 2 blocks \(blk\.0 to blk\.1\); "
            r"expected 2")
    for fn in (gguf_config, load_model):
        with pytest.raises(ValueError, match=want):
            fn(path)
    fewer = _gguf(tmp_path, "fewer", metadata={"llama.block_count": 1})  # blk.1's tensors left over
    with pytest.raises(ValueError, match=r"llama\.block_count = 1, but .* 2 blocks .*expected 2"):
        gguf_config(fewer)


@pytest.mark.parametrize("key, value, needle", [
    ("llama.attention.head_count", 0, "llama.attention.head_count = 0: expected a positive integer"),
    ("llama.context_length", 0, "llama.context_length = 0: expected a positive integer"),
    ("llama.attention.layer_norm_rms_epsilon", 2.0, "llama.attention.layer_norm_rms_epsilon = 2.0: expected a "
                                                    "number in (0, 1)"),
    ("llama.attention.head_count_kv", 3, "llama.attention.head_count_kv = 3: expected a divisor"),
])
def test_gguf_metadata_errors_name_the_key(tmp_path, key, value, needle):
    """A bad metadata value was named by the ModelConfig field it became
    (``ModelConfig.num_attention_heads = 0``); now by the file's key."""
    path = _gguf(tmp_path, metadata={key: value})
    with pytest.raises(ValueError) as e:
        gguf_config(path)
    assert needle in str(e.value) and str(path) in str(e.value), str(e.value)


def test_gguf_eos_outside_the_vocabulary_is_ignored_with_one_warning(tmp_path):
    """The whole file was refused (``ModelConfig.eos_token_id = 5000``); llama.cpp ignores such
    an id with a warning and transformers loads the config: so does jaxspec, in one line."""
    path = _gguf(tmp_path, metadata={"tokenizer.ggml.eos_token_id": 5000})
    with pytest.warns(UserWarning) as record:
        cfg = gguf_config(path)
    assert cfg.eos_token_id is None
    msgs = [str(w.message) for w in record]
    assert len(msgs) == 1 and "\n" not in msgs[0], msgs
    assert f"{path}: tokenizer.ggml.eos_token_id = 5000 is not an id in [0, 300); ignored" in msgs[0]


def test_truncated_gguf_names_the_tensor_and_the_bytes(tmp_path, capsys):
    """A file cut short read ``cannot reshape array of size 3032 into shape (64,96)``; now the
    tensor, the bytes it needs and where, and the file's size (the model and tokenizer loaders,
    and the command line, exit 2)."""
    whole = _gguf(tmp_path).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    want = rf"{cut}: truncated: tensor '[\w.]+' needs \d+ bytes at offset \d+, the file has {len(whole) * 2 // 3}"
    with pytest.raises(ValueError, match=want):
        load_model(cut)
    with pytest.raises(ValueError, match=want):
        load_gguf_tokenizer(cut)
    code = main(["generate", "--target", str(cut), "--baseline", "--prompt", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "truncated: tensor" in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------- chat templates

_TEMPLATES = {
    "range": ("{% for i in range(10**9) %}x{% endfor %}", "range(1000000000) has 1000000000 items"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "nothing": ("{% if false %}x{% endif %}", "rendered no text"),
    "string": ("{{ 'x' * 10**9 }}", "exceeds the sandbox's 1000000 items"),
    "power": ("{{ 2 ** 100000000 }}", "exceeds the sandbox's 4096 bits"),
    "output": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
               "rendered more than 4000000 characters"),
    "syntax": ("{% for %}", "does not parse"),
    "undefined": ("{{ foo.bar }}", "UndefinedError: 'foo' is undefined"),
}


@pytest.mark.parametrize("case", sorted(_TEMPLATES))
def test_failing_chat_template_is_named(tmp_path, case):
    """A template that loops 10**9 times gave jinja2's ``OverflowError`` traceback, one that
    recurses ``maximum recursion depth exceeded`` naming nothing, one that renders nothing
    ``prompt_length = 0``. Rendered in a sandbox with limits, each failure is "the chat
    template of FILE failed: ..."."""
    source, needle = _TEMPLATES[case]
    path = _gguf(tmp_path, metadata={"tokenizer.chat_template": source})
    tok = load_gguf_tokenizer(path)
    with pytest.raises(ValueError) as e:
        tok.encode_chat([{"role": "user", "content": "hi"}])
    assert f"the chat template of {path} failed: " in str(e.value) and needle in str(e.value), str(e.value)


def test_failing_chat_template_on_the_command_line(tmp_path, capsys):
    path = _gguf(tmp_path, metadata={"tokenizer.chat_template": _TEMPLATES["recursion"][0]})
    code = main(["generate", "--target", str(path), "--baseline", "--chat", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("jaxspec generate: error: --chat: ") and f"the chat template of {path} failed" in err, err


def test_lone_surrogate_in_a_chat_message_is_named(tmp_path):
    """``encode_chat`` raised ``TypeError: TextInputSequence must be str`` for a str message
    holding a lone surrogate; ``encode`` too. Now: not valid UTF-8, and where."""
    path = _gguf(tmp_path, metadata={"tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    tok = load_gguf_tokenizer(path)
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] is not valid UTF-8: '\\udcff' at position 2 "
                                         r"is a lone surrogate"):
        tok.encode_chat([{"role": "user", "content": "ab\udcffc"}])
    with pytest.raises(ValueError, match=r"GGUFTokenizer\.encode: text is not valid UTF-8: '\\udcff' at position 1"):
        tok.encode("a\udcff")
    from jaxspec.formats.tokenizer import ByteTokenizer

    with pytest.raises(ValueError, match=r"ByteTokenizer\.encode: text is not valid UTF-8"):
        ByteTokenizer().encode("a\udcff")


def test_long_chat_message_names_chat_and_the_room_left(tmp_path, capsys):
    """A ``--chat`` message longer than the context was refused as ``--prompt: 16699 tokens``."""
    path = _gguf(tmp_path, metadata={"tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    code = main(["generate", "--target", str(path), "--baseline", "--chat", "hello " * 200, "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--prompt" not in err and "error: --chat: the message in the chat template is " in err, err
    assert "at most 127 fit (shorten the message by at least" in err and "context of 128 tokens" in err, err


# ----------------------------------------------------------------------------- a user's drafter

@pytest.mark.parametrize("answer", [None, "sideways"])
def test_user_drafter_whose_check_answers_no_scheme_is_named(answer):
    """A drafter whose ``check`` returned None (or a string that is no scheme) got ``scheme =
    None: expected one of ...``, naming neither the drafter nor ``check``."""
    import dataclasses

    import jax
    import numpy as np

    import jaxspec
    from _tiny import tiny_pair
    from _user_drafter import Bigram

    @dataclasses.dataclass(frozen=True)
    class Silent(Bigram):
        def check(self, target, request):
            super().check(target, request)
            return answer

    target, _ = tiny_pair(0, vocab_size=8)
    holder = (Silent(8), np.zeros((8, 8), np.float32))  # a drafter with params: the pair
    with pytest.raises(ValueError, match=rf"^draft: Silent\.check returned {answer!r}; expected the sibling scheme "
                                         r"it will draw with, one of 'iid', "):
        jaxspec.generate(jax.random.key(0), target, holder, [[1], [2]], max_new_tokens=2, tree="chain:2")


# ----------------------------------------------------------------------------- the command line's last resort

def _failing_command(exc: BaseException):
    from jaxspec.cli import Command

    def setup(p):
        return lambda args: (_ for _ in ()).throw(exc)

    return Command("boom", "fails", setup)


def test_unexpected_error_is_one_line_with_the_debug_hint(capsys):
    """An exception the command line did not expect printed a raw traceback; now one line
    naming it and ``--debug``, exit 1; ``jaxspec --debug`` prints the traceback too."""
    commands = [_failing_command(KeyError("some_key"))]
    assert main(["boom"], commands=commands) == 1
    err = capsys.readouterr().err
    assert err == ("jaxspec boom: internal error: KeyError: 'some_key' (jaxspec --debug boom ... prints the "
                   "traceback)\n"), err
    assert main(["--debug", "boom"], commands=commands) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("internal error: KeyError: 'some_key'\n"), err
    # a device or machine failure: its first line, and the hint when there is more
    assert main(["boom"], commands=[_failing_command(RuntimeError("RESOURCE_EXHAUSTED: out of memory\nmore"))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: RESOURCE_EXHAUSTED: out of memory (jaxspec --debug" in err, err


def test_library_warnings_are_one_line_on_the_command_line(tmp_path, capsys):
    """A GGUF whose EOS id is outside the vocabulary loads with a warning of one line (Python
    adds the file, the line and the source line)."""
    path = _gguf(tmp_path, metadata={"tokenizer.ggml.eos_token_id": 5000})
    code = main(["generate", "--target", str(path), "--baseline", "--prompt", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if "eos_token_id = 5000" in ln]
    assert lines and all(ln.startswith("warning: ") for ln in lines), err
    assert "UserWarning" not in err and "warnings.warn" not in err, err


@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"), reason="a CUDA device here")
@pytest.mark.parametrize("cmd", [["generate", "--prompt", "hi", "--max-new-tokens", "2"],
                                 ["verify", "--samples", "100", "--no-progress"]])
def test_jax_platforms_naming_a_missing_platform(cmd):
    """``JAX_PLATFORMS=cuda`` on a machine without CUDA: a 58-line traceback ending in a bare
    ``AssertionError``; now one line naming the variable and the platforms that start, exit 2."""
    env = dict(os.environ, JAX_PLATFORMS="cuda")
    r = subprocess.run([sys.executable, "-m", "jaxspec.cli", *cmd], capture_output=True, text=True, env=env,
                       timeout=TIMEOUT)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (f"jaxspec {cmd[0]}: error: JAX_PLATFORMS=cuda: JAX could not start cuda; the platforms available here: "
            "cpu" in r.stderr), r.stderr


# ----------------------------------------------------------------------------- verify --samples

def test_verify_samples_past_the_block_limit_are_refused_by_flag(monkeypatch, capsys):
    """``verify --samples 1e12`` (which ``--help`` allowed) exited after 13 s of loading with
    ``num_samples = ...: 3906250000 blocks of chunk_size 256``, in library names. The block
    count is checked from the flags before anything is loaded, naming ``--samples`` and
    ``--chunk-size``; without ``--chunk-size``, the default chunk is checked before compiling."""
    import jaxspec.cli.verify as cli_verify
    import jaxspec.exactness.harness as harness

    monkeypatch.setattr(cli_verify, "load_flag_model", lambda *a, **k: pytest.fail("a model was loaded"))
    want = ("3906250000 blocks; expected at most 2147483647 blocks (an int32 block index over 1 device(s)): "
            "--samples <= 549755813632, or --chunk-size >= 466")
    for argv, whose in [(["--chunk-size", "256"], "--chunk-size 256"),
                        (["--target", "smollm2-135m", "--draft", "layers:2"],
                         "no --chunk-size (a --target's default chunk can be 256)")]:
        assert main(["verify", "--samples", "1e12", *argv, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"error: --samples 1000000000000 and {whose}: {want}" in err and err.count("\n") == 1, err
    monkeypatch.setattr(harness, "default_chunk", lambda *a, **k: 256)  # the tiny pair's, on a costly tree
    monkeypatch.setattr(harness, "verify", lambda *a, **k: pytest.fail("verify ran"))
    assert main(["verify", "--samples", "1e12", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--samples 1000000000000 and no --chunk-size (the default chunk for these models and tree is 256)" in err
    assert main(["verify", "--help"]) == 0  # --help states the limit that holds
    assert "blocks of --chunk-size samples: with a --target and no --chunk-size (whose default can be 256), at " \
           "most 5.5e+11" in " ".join(capsys.readouterr().out.split())


def test_verify_refuses_too_many_cells_of_a_target_before_loading_it(monkeypatch, capsys):
    """``verify --target smollm2-135m --method enumerate`` with too many cells was refused
    after the model loaded (69 s on the reporter's machine): the vocabulary is read from the
    file's metadata and the cells refused first, by flag."""
    import jaxspec.cli.verify as cli_verify
    from jaxspec.formats.packaged import packaged_file

    try:
        packaged_file("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    monkeypatch.setattr(cli_verify, "load_flag_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["verify", "--target", "smollm2-135m", "--draft", "layers:2", "--method", "enumerate", "--horizon",
                 "2", "--top-k", "2000", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "error: --top-k 2000 and --horizon 2: min(top_k, the target's 49152 tokens) give up to 2000**2" in err, err


# ----------------------------------------------------------------------------- Sampling changed after its check

def test_sampling_changed_after_it_was_made_is_refused_where_it_is_read():
    """``object.__setattr__(s, "temperature", nan)`` on a frozen ``Sampling`` decoded
    silently; ``generate`` checks the values again where it reads them."""
    import jax

    import jaxspec
    from _tiny import tiny_pair

    s = jaxspec.Sampling(temperature=0.7)
    object.__setattr__(s, "temperature", float("nan"))
    target, draft = tiny_pair(0, vocab_size=8)
    with pytest.raises(jaxspec.SettingError, match=r"^sampling\.temperature = nan: .*changed after it was made"):
        jaxspec.generate(jax.random.key(0), target, draft, [[1, 2]], max_new_tokens=2, sampling=s)
    with pytest.raises(jaxspec.SettingError, match=r"^sampling\.temperature = nan"):
        jaxspec.generate_autoregressive(jax.random.key(0), target, [[1, 2]], max_new_tokens=2, sampling=s)


def test_rows_beyond_the_prompts_are_named_as_such(monkeypatch):
    """``rows=10**9`` with one prompt was refused with "pass fewer prompts"."""
    import jax

    import jaxspec
    from _tiny import tiny_pair
    from jaxspec.decode import memory

    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 8 << 30)
    target, draft = tiny_pair(0, vocab_size=8)
    with pytest.raises(ValueError, match=r"^rows = 1000000000 exceeds the 1 prompt\(s\): 1000000000 rows would need "
                                         r".*; expected rows <= 1 \(a row beyond the prompts decodes nothing\)$"):
        jaxspec.generate(jax.random.key(0), target, draft, [[1, 2]], max_new_tokens=2, rows=10**9)


# ----------------------------------------------------------------------------- a prompt whose prefill cannot fit

def _long_context_model():
    """A 2-layer model of 4 heads with a 4096-token context (its prefill's scores grow with
    the square of the prompt; the rest stays small)."""
    import jax

    from jaxspec.nn.model import init_model

    cfg = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return init_model(cfg, jax.random.key(0))


def test_prompt_whose_prefill_cannot_fit_is_refused_naming_its_length(monkeypatch):
    """An 8,101-token prompt on SmolLM2 passed the context check, then its prefill failed with
    ``RESOURCE_EXHAUSTED: Out of memory allocating 7609225640 bytes``: the estimate left out
    the prefill's attention scores, float32 [rows, heads, P, S]. Here a 3,000-token prompt on
    a small model (scores of about 0.4 GB) against a device of 256 MiB: refused before
    compiling, naming the prompt's length and the longest that fits."""
    import jax
    import numpy as np

    import jaxspec
    from jaxspec.decode import generate as gen
    from jaxspec.decode import memory

    monkeypatch.setattr(memory, "device_memory_bytes", lambda: 256 << 20)
    monkeypatch.setattr(gen, "run_compiled", lambda *a, **k: pytest.fail("compiled: the prefill was not counted"))
    monkeypatch.setattr(gen, "run_compiled_autoregressive",
                        lambda *a, **k: pytest.fail("compiled: the prefill was not counted"))
    model = _long_context_model()
    prompt = [np.arange(3000, dtype=np.int32) % 256]
    want = (r"^prompts: a prompt of 3000 tokens \(padded to 3008\) needs about [\d.]+ GiB for its one row, more than "
            r"the device's 0\.2 GiB \(its prefill's attention scores over 3008 x \d+ positions alone: [\d.]+ GiB\); "
            r"expected a prompt of at most about (\d+) tokens$")
    for call in (lambda: jaxspec.generate_autoregressive(jax.random.key(0), model, prompt, max_new_tokens=8),
                 lambda: jaxspec.generate(jax.random.key(0), model, model, prompt, max_new_tokens=8)):
        with pytest.raises(ValueError, match=want) as e:
            call()
        longest = int(re.search(want, str(e.value)).group(1))
        assert 1000 < longest < 3000, str(e.value)


def test_memory_estimate_covers_what_xla_allocates_for_a_prefill():
    """The estimate of one row is at least what XLA's compilation of the prefill keeps
    (temporaries and outputs, ``Compiled.memory_analysis``), for a prompt long enough that
    the attention scores dominate; compiled only, nothing allocated."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.decode.memory import estimate_generate_bytes
    from jaxspec.nn.model import prefill

    model = _long_context_model()
    gdef, state = nnx.split(model)
    width, capacity = 1024, 1056

    def start(state, tokens, lens):
        return prefill(nnx.merge(gdef, state), tokens, lens, capacity)

    spec = (jax.ShapeDtypeStruct((1, width), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32))
    used = jax.jit(start).lower(state, *spec).compile().memory_analysis()
    xla = used.temp_size_in_bytes + used.output_size_in_bytes
    est = estimate_generate_bytes(model.config, None, rows=1, width=width, capacity=capacity, tree_rows=1)
    assert est >= xla, f"estimate {est / 2**20:.1f} MiB < XLA's {xla / 2**20:.1f} MiB"


# ----------------------------------------------------------------------------- a mutant at too few samples

def test_mutant_not_rejected_at_too_few_samples_is_not_passed(capsys):
    """``verify --mutant depth-row --draft layers:2`` at 256 samples on SmolLM2 printed PASSED,
    exit 0, while ``--help`` says a mutant must be rejected. Here the tiny pair at 64
    samples, where the joint test detects only TV >= 0.55: the verdict says the mutant was
    not rejected and what this sample count can detect, exit 3 (no test rejected, no power
    to see the bug), never PASSED."""
    code = main(["verify", "--mutant", "depth-row", "--samples", "64", "--no-progress"])
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    assert code == 3, out
    assert "PASSED" not in out, out
    assert re.fullmatch(r"NOT REJECTED \(inconclusive\): MUTANT=depth-row not rejected: this sample count \(64 per "
                        r"run\) can only detect TV >= 0\.\d+ \(power 0\.9\)", last), last


# ----------------------------------------------------------------------------- a tree that compiles for minutes

@pytest.mark.parametrize("tree, warned", [
    ("chain:24", "--tree chain:24 (24 nodes, 24 deep): its first compilation takes about 2 min"),
    ("branch:64", "--tree branch:64 (64 nodes, 1 deep): its first compilation takes about 10 min"),
    ("chain:4", None),
])
def test_generate_warns_before_a_tree_that_compiles_for_minutes(tree, warned, monkeypatch, capsys):
    """Deep trees (chain:24 to chain:64, a 64-leaf star) compiled for minutes with no word:
    ``jaxspec generate`` says first, in one line, how long the compilation will take
    (jaxspec.cli.compile_time, fitted on the embedded pair). The generation itself is
    stubbed: only what is printed before it is tested."""
    from jaxspec.cli import generate as cli_generate

    monkeypatch.setattr(cli_generate, "_run_modes", lambda *a: ({"stub": True}, None))
    code = main(["generate", "--prompt", "hi", "--tree", tree, "--json", "--max-new-tokens", "4",
                 "--no-compile-cache"])
    err = capsys.readouterr().err
    assert code == 0, err
    if warned is None:
        assert "warning" not in err, err
    else:
        assert err.count("\n") == 1 and err.startswith(f"warning: {warned} "), err
