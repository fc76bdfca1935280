"""`jaxspec generate` on the embedded default pair: output, JSON fields, temperature-0
equality with the baseline, and clean errors (message + exit status 2, no traceback)."""

import json

import jax
import numpy as np
import pytest

from jaxspec.formats.checkpoint import save_model
from jaxspec.cli import main
from jaxspec.core.settings import Sampling
from jaxspec.nn.config import ModelConfig
from jaxspec.nn.model import init_model


def _run(capsys, *argv):
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--prompt", "x", "--target", "no-such-model"], "no-such-model"),
        (["--prompt", "x" * 400], "context"),
        (["--prompt", "x", "--tree", "branch:0,2"], "--tree"),
        (["--prompt", "x", "--tree", "weird"], "--tree"),
        (["--prompt", "x", "--temperature", "-1"], "error: --temperature -1.0: expected a finite number >= 0"),
        (["--prompt", "x", "--temperature", "nan"], "error: --temperature nan: expected a finite number >= 0"),
        (["--prompt", "x", "--top-p", "1.5"], "--top-p"),
        (["--prompt", "x", "--top-p", "0"], "--top-p"),
        (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--prompt", ""], "--prompt"),
        (["--prompt", "x", "--tree", "auto", "--auto-budgets", "0,2"], "--auto-budgets"),
        (["--prompt", "x", "--tree", "auto", "--auto-budgets", "a"], "--auto-budgets"),
        (["--prompt", "x", "--tree", "auto", "--auto-max-depth", "0"], "--auto-max-depth"),
        (["--prompt", "x" * 200, "--tree", "auto", "--max-new-tokens", "60"],
         "--tree auto: no budget in [2, 4, 6, 8, 12, 16, 24, 32] fits the context of 256 tokens with a 200-token "
         "prompt and --max-new-tokens 60 (room for -5 nodes); expected --max-new-tokens <= 53 for the smallest "
         "budget, 2"),
        # the cache capacity (prompt + new tokens [+ tree + 1]) is checked before compiling
        (["--prompt", "x", "--max-new-tokens", "1000"],
         "--max-new-tokens = 1000: expected <= 250, so that the new tokens, this 1-token prompt and --tree chain:4 "
         "(4 slots + 1) fit the target's and the draft's context of 256 tokens (max_position_embeddings)"),
        (["--prompt", "x" * 300],
         "--prompt: 300 tokens; expected at most 250 tokens, so that the prompt, at least one new token and "
         "--tree chain:4 (4 slots + 1) fit the target's and the draft's context"),
        (["--prompt", "x", "--tree", "branch:16,16"],
         "--tree branch:16,16: 272 tree slots + 1; expected at most 253 slots"),
        (["--prompt", "x", "--tree", "dynamic:depth=3,topk=4,nodes=6", "--max-new-tokens", "250"],  # 8 scratch slots
         "--max-new-tokens = 250: expected <= 246, so that the new tokens, this 1-token prompt and "
         "--tree dynamic:depth=3,topk=4,nodes=6 (8 slots + 1) fit"),
        # flags that conflict or do not apply
        (["--prompt", "x", "--baseline", "--tree", "garbage"], "--tree: tree spec 'garbage': expected"),
        (["--prompt", "x", "--tree", "chain:3", "--auto-budgets", "abc"], "--auto-budgets = 'abc': expected"),
        (["--prompt", "x", "--tree", "chain:3", "--auto-budgets", "4"],
         "--auto-budgets: applies only to --tree auto, got --tree chain:3"),
        (["--prompt", "x", "--retune"], "--retune: applies only to --tree auto, got --tree chain:4"),
        (["--prompt", "x", "--auto-max-depth", "3"], "--auto-max-depth: applies only to --tree auto"),
        (["--prompt", "x", "--tree", "dynamic:depth=2,topk=2,nodes=4", "--scheme", "iid"],
         "--scheme iid and --tree dynamic:depth=2,topk=2,nodes=4: a dynamic tree ranks fixed candidates; "
         "expected scheme 'deterministic'"),
        (["--prompt", "x", "--draft", "foo"], "error: --draft: load_model: unknown model 'foo'"),
        (["--prompt", "x", "--target", "foo"], "error: --target: load_model: unknown model 'foo'"),
        (["--prompt", "x", "--draft", "./no/such/folder"], "error: --draft: load_model: model folder"),
        (["--prompt", "x", "--top-p", "0"], "error: --top-p 0.0: expected a number in (0, 1]"),
        # --compare runs target-only itself; it and --tree auto's check time warmed-up calls
        (["--prompt", "x", "--compare", "--baseline"],
         "error: --compare and --baseline: --compare runs target-only decoding beside speculative decoding; "
         "pass one of them"),
        (["--prompt", "x", "--compare", "--no-warmup"], "error: --compare and --no-warmup: --compare times both"),
        (["--prompt", "x", "--tree", "auto", "--no-warmup"], "error: --tree auto and --no-warmup: --tree auto"),
        (["--prompt", "x", "--turns", "2"], "error: --turns: applies only to --compare and --tree auto"),
    ],
)
def test_errors_are_clean(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (code, err)
    assert needle in err and "Traceback" not in err, err
    assert err.startswith("jaxspec generate: error:"), err  # before "compiling and warming up"
    assert err.count("\n") == 1, err


def test_baseline_max_new_tokens_error_names_the_flag_not_a_tree(capsys):
    """--baseline: the cache holds the prompt and the new tokens only; the message says
    so before compiling, with the largest --max-new-tokens that fits."""
    code, out, err = _run(capsys, "--prompt", "xyz", "--max-new-tokens", "1000", "--baseline")
    assert code == 2 and out == ""
    assert err == ("jaxspec generate: error: --max-new-tokens = 1000: expected <= 253, so that the new tokens "
                   "and this 3-token prompt fit the target's context of 256 tokens (max_position_embeddings)\n")


@pytest.mark.parametrize("value", ["0", "-3", "a"])
def test_top_k_is_a_positive_int_usage_error(capsys, value):
    code, out, err = _run(capsys, "--prompt", "x", "--top-k", value)
    assert code == 2 and out == ""
    assert err.endswith(f"jaxspec generate: error: argument --top-k: expected a positive integer, got '{value}'\n")
    assert "Traceback" not in err


def _byte_model(folder, context, seed=0, eos_token_id=None):
    """A tiny random model on the byte tokenizer's vocabulary (264), saved to ``folder``."""
    cfg = ModelConfig(vocab_size=264, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context,
                      eos_token_id=eos_token_id)
    save_model(init_model(cfg, jax.random.key(seed)), folder)
    return str(folder)


def test_stops_at_the_targets_eos_like_the_library(capsys, tmp_path):
    """The command's stop tokens are the library's default (jaxspec.generate's): the target
    config's eos_token_id, reported under "stop_tokens"; none when the config has none."""
    argv = ["--prompt", "ab", "--max-new-tokens", "6", "--temperature", "0", "--baseline", "--json", "--no-warmup"]
    code, out, err = _run(capsys, *argv, "--target", _byte_model(tmp_path / "plain", 64))
    assert code == 0, err
    plain = json.loads(out)
    assert plain["stop_tokens"] == [] and plain["num_tokens"] == 6
    eos = plain["tokens"][2]  # the same weights, with the third greedy token as EOS
    code, out, err = _run(capsys, *argv, "--target", _byte_model(tmp_path / "eos", 64, eos_token_id=eos))
    assert code == 0, err
    res = json.loads(out)
    n = plain["tokens"].index(eos) + 1
    assert res["stop_tokens"] == [eos] and res["num_tokens"] == n and res["tokens"] == plain["tokens"][:n]


def test_json_statistics_are_summary_under_the_same_names(capsys):
    """--json carries GenerateResult.summary() verbatim: every key of SUMMARY_KEYS, equal to
    what jaxspec.generate returns for the same row, key, tree and stop tokens (one row, so
    sums and the batch maximum agree); "tokens" is the list of ids, "num_tokens" its length."""
    import jaxspec
    from jaxspec.decode.generate import SUMMARY_KEYS

    code, out, err = _run(capsys, "--prompt", "import os\n", "--max-new-tokens", "16", "--seed", "3", "--json")
    assert code == 0, err
    res = json.loads(out)
    target, draft = jaxspec.load_model("default-target"), jaxspec.load_model("default-draft")
    lib = jaxspec.generate(jax.random.key(3), target, draft, [list(b"import os\n")], max_new_tokens=16)
    s = lib.summary()
    assert tuple(s) == SUMMARY_KEYS and res["stop_tokens"] == [257]  # the default pair's EOS
    assert {k: res[k] for k in SUMMARY_KEYS} == s
    assert res["tokens"] == np.asarray(lib.tokens)[0, : s["num_tokens"]].tolist()
    assert res["num_tokens"] == len(res["tokens"]) and res["rounds"] == res["loop_rounds"] == res["target_calls"]


def test_room_errors_name_the_model_whose_context_is_short(capsys, tmp_path):
    """A draft with a shorter context than the target's bounds --max-new-tokens; the
    message names the draft's context (and comes before compiling)."""
    draft = _byte_model(tmp_path / "draft", 64)
    code, out, err = _run(capsys, "--prompt", "ab", "--draft", draft, "--max-new-tokens", "100")
    assert code == 2, err
    assert err == ("jaxspec generate: error: --max-new-tokens = 100: expected <= 57, so that the new tokens, "
                   "this 2-token prompt and --tree chain:4 (4 slots + 1) fit the draft's context of 64 tokens "
                   "(max_position_embeddings)\n")
    code, out, err = _run(capsys, "--prompt", "ab", "--draft", draft, "--max-new-tokens", "100", "--baseline")
    assert code == 0, err  # target-only: the draft's context does not matter


def test_library_errors_use_flag_names(capsys, tmp_path):
    """A tree that fits the context but needs more distinct siblings than the vocabulary
    has: the settings table's refusal, each setting named by its flag and the value it was
    given (--tree SPEC as typed, the scheme the draft chose), before compiling."""
    target, draft = _byte_model(tmp_path / "t", 512), _byte_model(tmp_path / "d", 512, seed=1)
    code, out, err = _run(capsys, "--prompt", "x", "--target", target, "--draft", draft, "--tree", "branch:265",
                          "--max-new-tokens", "2")
    assert code == 2, err
    assert err == ("jaxspec generate: error: --tree branch:265 and --scheme without_replacement: a node has 265 "
                   "children, more than the 264 distinct tokens of the vocabulary that scheme 'without_replacement' "
                   "draws them from; expected scheme 'iid' or a narrower tree\n")


def test_scheme_defaults_per_tree(capsys):
    """No --scheme: deterministic for a dynamic tree, without_replacement for a static one;
    --baseline reports none."""
    common = ["--prompt", "import os\n", "--max-new-tokens", "3", "--json", "--no-warmup"]
    code, out, err = _run(capsys, *common, "--tree", "dynamic:depth=2,topk=2,nodes=3")
    assert code == 0, err
    assert json.loads(out)["scheme"] == "deterministic"
    code, out, err = _run(capsys, *common, "--tree", "chain:1")
    assert code == 0, err
    assert json.loads(out)["scheme"] == "without_replacement"
    # an explicit --scheme is kept (a dynamic tree refusing one: test_errors_are_clean)


def test_auto_tree_keeps_the_measurement_when_the_cache_cannot_be_written(capsys, monkeypatch, tmp_path):
    """JAXSPEC_CACHE_DIR under a regular file: the cache entry cannot be written; auto_tree
    warns on stderr (naming JAXSPEC_CACHE_DIR and the entry) and returns what it measured."""
    from jaxspec.tuning.autotree import auto_tree

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(blocker / "cache"))
    cfg = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    target, draft = init_model(cfg, jax.random.key(0)), init_model(cfg, jax.random.key(1))
    stream = np.random.default_rng(0).integers(0, 64, size=4096).astype(np.int32)
    res = auto_tree(target, draft, scheme="deterministic", sampling=Sampling(temperature=1.0), budgets=(1, 3),
                    max_depth=2, held_out_tokens=stream, num_windows=4, window_len=32, loops=2, repeats=1,
                    context_len=64, progress=False)
    assert res.budget in (1, 3) and len(res.rows) == 2 and res.parents[0] == -1
    assert not res.from_cache and res.cache_path is None
    err = capsys.readouterr().err
    assert "auto_tree: warning: cannot write the cache entry " + str(blocker / "cache" / "autotree-") in err, err
    assert f"JAXSPEC_CACHE_DIR={blocker / 'cache'}" in err and "not cached" in err, err
    assert err.count("\n") == 1 and blocker.read_text() == "not a folder"


@pytest.mark.parametrize("seed", [str(2**32), "-1", "1" + "0" * 40])
def test_seed_out_of_range_is_a_usage_error(capsys, seed):
    code, out, err = _run(capsys, "--prompt", "x", "--seed", seed)
    assert code == 2 and out == ""
    assert err.endswith(f"jaxspec generate: error: argument --seed: expected an integer in [0, 2**32), got '{seed}'\n")
    assert "Traceback" not in err


def test_text_output_announces_the_untimed_first_call(capsys):
    """Without --json, one stderr line says that the first (compiling) call is not timed,
    before the streamed text; with --json stdout is exactly one JSON object."""
    common = ["--prompt", "import os\n", "--max-new-tokens", "24", "--temperature", "0", "--baseline"]
    code, out, err = _run(capsys, *common)
    assert code == 0, err
    lines = err.splitlines()
    assert lines.count("compiling and warming up (first call, not timed) ...") == 1, err
    assert lines.index("compiling and warming up (first call, not timed) ...") < next(
        i for i, line in enumerate(lines) if line.startswith("-- baseline:"))
    assert out.startswith("import os\n") and "compiling" not in out
    # the closing line names the statistics as summary() and --json do
    (line,) = [line for line in lines if line.startswith("-- baseline:")]
    assert line.startswith("-- baseline: num_tokens 24, rounds 24, tokens_per_target_call 1.00, tokens_per_second "), line
    code, out, err = _run(capsys, *common, "--json")
    assert code == 0, err
    assert json.loads(out)["num_tokens"] == 24 and out.count("\n") == 1 and "compiling" not in out


def test_no_warmup_generates_once_and_says_the_timing_includes_compilation(capsys, monkeypatch):
    """--no-warmup: one call (not a silent compiling call and a timed one), the same tokens
    for the same seed, and both the stderr line and the JSON say what the timing covers."""

    from jaxspec.decode import generate as gen  # the command imports it from there when it runs

    calls = []
    real = gen.Prepared.run  # the command prepares each mode once, then runs it per call
    monkeypatch.setattr(gen.Prepared, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    common = ["--prompt", "import os\n", "--max-new-tokens", "12", "--baseline", "--seed", "5"]
    code, out, err = _run(capsys, *common, "--json")
    assert code == 0, err
    warm = json.loads(out)
    assert len(calls) == 2 and warm["timing_includes_compile"] is False
    calls.clear()
    code, out, err = _run(capsys, *common, "--json", "--no-warmup")
    assert code == 0, err
    once = json.loads(out)
    assert len(calls) == 1 and once["timing_includes_compile"] is True
    assert once["tokens"] == warm["tokens"] and once["seconds"] == once["seconds_with_compile"]
    code, out, err = _run(capsys, *common, "--no-warmup")
    assert code == 0 and "compiling (the timing includes it) ..." in err and "(including compilation)" in err


@pytest.mark.slow  # the library's own greedy equality: tests/test_generate.py
def test_temperature_zero_speculative_equals_baseline(capsys):
    """Every sibling scheme on the default pair (V = 264: the draft draws go through the
    two-level inverse CDF) gives the baseline's greedy text at temperature 0."""
    common = ["--prompt", "import os\n", "--max-new-tokens", "24", "--temperature", "0", "--json"]
    code, out, _ = _run(capsys, *common, "--baseline")
    assert code == 0
    base = json.loads(out)
    for scheme in ("iid", "without_replacement", "deterministic"):
        code, out, err = _run(capsys, *common, "--tree", "branch:2,1", "--scheme", scheme)
        assert code == 0, (scheme, err)
        spec = json.loads(out)
        for k in ("text", "tokens", "tokens_per_target_call", "tokens_per_second", "rounds"):
            assert k in spec and k in base
        assert spec["tokens"] == base["tokens"] and spec["text"] == base["text"], scheme
        assert spec["num_tokens"] == 24 and base["tokens_per_target_call"] == 1.0
        assert spec["tokens_per_target_call"] > 1.0, scheme  # the draft's guesses are accepted


def test_tree_auto_end_to_end(capsys, monkeypatch, tmp_path):
    """--tree auto measures the pair (small budgets), reports the table and the choice
    on stderr and in --json, checks the pick against target-only with the real generate
    calls and generates with whichever was faster, and caches the measurement: the second
    call reads it back instead of measuring."""
    monkeypatch.setenv("JAXSPEC_CACHE_DIR", str(tmp_path))
    argv = ["--prompt", "def f(x):", "--tree", "auto", "--auto-budgets", "3,1",
            "--auto-max-depth", "2", "--scheme", "deterministic", "--temperature", "1",
            "--max-new-tokens", "16", "--json"]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    res = json.loads(out)
    auto = res["auto_tree"]
    assert res["num_tokens"] == 16
    # the check: both modes timed, the faster one generated
    cmp = res["compare"]
    assert auto["measured_speedup"] == cmp["speedup"] > 0
    assert auto["fallback"] == (cmp["speedup"] < 1) and auto["chosen"] == ("target-only" if auto["fallback"] else "tree")
    mode = "target_only" if auto["fallback"] else "speculative"
    assert res["mode"] == ("baseline" if auto["fallback"] else "speculative")
    assert res["tree"] == (None if auto["fallback"] else "auto") and res["seconds"] == cmp[mode]["seconds"]
    assert ("falling back to target-only" in err) == auto["fallback"], err
    assert [r["rule"] for r in auto["table"]] == ["block", "token"]  # 1 node: a chain; 3 nodes, depth <= 2: a tree
    assert [r["budget"] for r in auto["table"]] == [1, 3]
    best = max(auto["table"], key=lambda r: r["predicted_tokens_per_second"])
    assert auto["budget"] == best["budget"] and len(auto["parents"]) == auto["budget"]
    assert auto["parents"][0] == -1 and max(r["depth"] for r in auto["table"]) <= 2
    assert auto["predicted_tau"] == pytest.approx(best["predicted_tau"]) and auto["predicted_tau"] > 1
    assert auto["predicted_speedup"] == pytest.approx(
        best["predicted_tokens_per_second"] * auto["target_step_seconds"])
    assert all(r["round_seconds"] > 0 and r["verify_seconds"] > 0 for r in auto["table"])
    assert not auto["from_cache"] and auto["cache_path"].startswith(str(tmp_path))
    parents = ",".join(map(str, auto["parents"]))
    assert f"picked {auto['budget']} nodes" in err and f"parents:{parents}" in err, err
    assert "Traceback" not in err

    code, out, err = _run(capsys, *argv)  # same pair, settings and device: the cache
    assert code == 0, err
    again = json.loads(out)["auto_tree"]
    assert again["from_cache"] and again["parents"] == auto["parents"]
    assert again["table"] == auto["table"] and "cached in" in err


def _compare_line(err):
    (line,) = [x for x in err.splitlines() if x.startswith("-- speculative ") and " vs target-only " in x]
    return line


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram"]], ids=["default-pair", "ngram"])
def test_compare_runs_both_modes_in_turns(capsys, draft):
    """--compare at temperature 0: both modes on the same prompt and seed, an untimed first call
    each then 3 timed turns each; the JSON carries both modes' figures and their ratio, the
    same tokens (greedy decoding of the target) and says so; stderr has the one-line summary."""
    argv = ["--prompt", "import os\nimport sys\nimport os\n", "--compare", "--temperature", "0",
            "--max-new-tokens", "16", *draft]
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    res = json.loads(out)
    cmp = res["compare"]
    sp, tg = cmp["speculative"], cmp["target_only"]
    assert cmp["turns"] == 3 and len(sp["seconds_turns"]) == len(tg["seconds_turns"]) == 3
    for m in (sp, tg):
        assert m["num_tokens"] == 16 and m["seconds"] > 0 and m["seconds_with_compile"] > 0
        assert m["tokens_per_second"] == pytest.approx(16 / m["seconds"]) and m["seconds"] in m["seconds_turns"]
    assert cmp["speedup"] == pytest.approx(sp["tokens_per_second"] / tg["tokens_per_second"]) and cmp["speedup"] > 0
    assert cmp["speedup_turn_range"][0] <= cmp["speedup_turn_range"][1]
    assert cmp["same_tokens"] is True and cmp["same_tokens_expected"] is True
    assert tg["tokens_per_target_call"] == 1.0 and sp["tokens_per_target_call"] >= 1.0
    # the top level is the speculative run, timed as the median of its turns
    assert res["mode"] == "speculative" and res["seconds"] == sp["seconds"] and res["num_tokens"] == 16
    assert res["draft"].startswith("ngram:max=") if draft else res["draft"] == "default-draft"
    line = _compare_line(err)
    assert line == (f"-- speculative {sp['tokens_per_second']:.1f} tok/s vs target-only {tg['tokens_per_second']:.1f} "
                    f"tok/s ({cmp['speedup']:.2f}×" + ("; speculative is slower here" if cmp["speedup"] < 1 else "")
                    + "); same tokens: yes"), line
    if draft:
        return
    code, text_out, err = _run(capsys, *argv)  # text: the speculative text (not streamed) and both lines
    assert code == 0, err
    assert text_out == argv[1] + res["text"] + "\n"
    assert "then 3 timed turns of each" in err and "-- speculative: num_tokens 16," in err, err
    assert "(median of 3 turns;" in err and _compare_line(err).endswith("same tokens: yes"), err


def test_tree_auto_falls_back_to_target_only_when_speculation_is_slower(capsys, monkeypatch):
    """--tree auto checks its pick against target-only with the real generate calls; where the
    measured speculative tokens/s is lower (forced here: the speculative turns' seconds are
    inflated), it says so on stderr and generates target-only, recording both in --json."""
    from jaxspec.cli import gen_timing as cli_timing
    from jaxspec.tuning import autotree

    picked = autotree.tabulate([0.8], (2,), 2, lambda tree: autotree.RoundCost(1e-3, 1e-3), 1e-3)
    assert picked.parents == (-1, 0) and picked.predicted_speedup > 1  # a 2-chain predicted to pay off
    asked = {}

    def fake_auto_tree(target, draft, **kw):  # the measurement itself: tests/test_autotree.py
        asked.update(kw)
        return picked

    monkeypatch.setattr(autotree, "auto_tree", fake_auto_tree)
    real = cli_timing.time_modes

    def slow_speculation(fns, turns):
        times, outs, firsts = real(fns, turns)
        times["speculative"] = [t * 100 for t in times["speculative"]]
        return times, outs, firsts

    monkeypatch.setattr(cli_timing, "time_modes", slow_speculation)
    code, out, err = _run(capsys, "--prompt", "def f(x):", "--tree", "auto", "--temperature", "0",
                          "--max-new-tokens", "8", "--turns", "1", "--json")
    assert code == 0, err
    assert asked["rule"] == "auto" and asked["scheme"] == "without_replacement"
    res = json.loads(out)
    auto, cmp = res["auto_tree"], res["compare"]
    assert cmp["turns"] == 1 and cmp["speedup"] < 0.1 and cmp["same_tokens"] is True
    assert auto["fallback"] is True and auto["chosen"] == "target-only" and auto["measured_speedup"] == cmp["speedup"]
    assert auto["predicted_speedup"] == picked.predicted_speedup and auto["parents"] == [-1, 0]
    assert res["mode"] == "baseline" and res["tree"] is None and res["draft"] is None
    assert res["tokens_per_target_call"] == 1.0 and res["rounds"] == 8  # generated target-only
    assert res["seconds"] == cmp["target_only"]["seconds"]
    assert ("-- --tree auto: speculative decoding with the picked tree is slower than target-only here "
            f"(measured {cmp['speedup']:.2f}×, predicted {picked.predicted_speedup:.2f}×): falling back to "
            "target-only decoding") in err, err
    assert "speculative is slower here); same tokens: yes" in _compare_line(err)
