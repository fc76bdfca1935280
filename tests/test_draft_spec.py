"""Drafters named by a string (jaxspec.parse_draft): the library's specs, a user's drafter by
``module:attr`` and ``file.py:attr``, their refusals, and a user's drafter run through
``jaxspec generate`` and ``jaxspec verify`` by name."""

import subprocess
import sys
import textwrap

import pytest

import jaxspec
from jaxspec.decode.draft_spec import drafter_spec
from jaxspec.decode.layer_skip import LayerSkipDraft
from jaxspec.decode.ngram import NgramDraft

# a drafter of fixed choices: every node repeats the root token (lossless under the
# deterministic scheme whatever it proposes)
USER_DRAFTERS = textwrap.dedent('''
    import dataclasses

    import jax.numpy as jnp

    import jaxspec


    @dataclasses.dataclass(frozen=True)
    class Repeat:
        def check(self, target, request):
            if isinstance(request.tree, jaxspec.DynamicTree):
                raise ValueError(f"tree = {request.tree}: Repeat drafts static trees")
            return "deterministic"

        def forwards(self, tree):
            return 0

        def init(self, params, target, prompt):
            return ()

        def propose(self, params, target, state, ctx, keys, law):
            b, n = ctx.root.shape[0], law.tree.num_nodes
            return jaxspec.Proposal(jnp.broadcast_to(ctx.root[:, None], (b, n)).astype(jnp.int32), state)

        def commit(self, params, state, outcome, commit_cache):
            return state


    REPEAT = Repeat()


    def make():
        return Repeat()


    NOT_A_DRAFTER = 3


    def needs_args(x):
        return Repeat()
''')


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "user_drafters_spec.py").write_text(USER_DRAFTERS)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [n for n in sys.modules if "user_drafters_spec" in n]:
        del sys.modules[name]


def test_library_specs():
    assert jaxspec.parse_draft("ngram") == NgramDraft()
    assert jaxspec.parse_draft("ngram:max=4,min=2") == NgramDraft(max_ngram=4, min_ngram=2)
    assert jaxspec.parse_draft("layers:3") == LayerSkipDraft(3)
    assert drafter_spec("default-draft") is None  # a model name: parse_draft loads it
    assert isinstance(jaxspec.parse_draft("default-draft"), jaxspec.Transformer)


def test_user_drafter_by_module_and_by_file(user_dir):
    a = jaxspec.parse_draft("user_drafters_spec:REPEAT")  # not on sys.path: found under the current folder
    b = jaxspec.parse_draft("user_drafters_spec:make")  # a zero-argument function returning a drafter
    c = jaxspec.parse_draft("user_drafters_spec:Repeat")  # a class: called with no arguments
    d = jaxspec.parse_draft(f"{user_dir / 'user_drafters_spec.py'}:REPEAT")
    assert type(a).__name__ == type(b).__name__ == type(c).__name__ == type(d).__name__ == "Repeat"
    assert a == b == c


@pytest.mark.parametrize("spec, match", [
    ("user_drafters_spec:nope", r"user_drafters_spec has no attribute 'nope' \(it has"),
    ("user_drafters_spec:NOT_A_DRAFTER", "NOT_A_DRAFTER is a int; expected a drafter or a zero-argument callable"),
    ("user_drafters_spec:needs_args", r"calling needs_args\(\) failed"),
    ("no_such_module_here:X", "no module 'no_such_module_here' on sys.path, and no file"),
    ("missing.py:X", "no file missing.py"),
    ("ngram:foo=1", "unknown field 'foo'"),
    ("layers:x", "expected 'layers:K' with an integer K >= 1"),
    ("", "expected a non-empty string"),
])
def test_refusals_name_the_spec(user_dir, spec, match):
    with pytest.raises(ValueError, match=match):
        jaxspec.parse_draft(spec)


def test_user_drafter_decodes_greedy_exact(user_dir):
    import jax  # noqa: PLC0415

    target = jaxspec.load_model("default-target")
    drafter = jaxspec.parse_draft("user_drafters_spec:make")
    kw = dict(max_new_tokens=12, sampling=jaxspec.Sampling(temperature=0), stop_tokens=())
    spec = jaxspec.generate(jax.random.key(0), target, drafter, [[5, 6, 7]], tree="chain:2", **kw)
    base = jaxspec.generate_autoregressive(jax.random.key(0), target, [[5, 6, 7]], **kw)
    assert spec.tokens.tolist() == base.tokens.tolist()


def _cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "jaxspec.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_cli_generate_and_verify_run_a_user_drafter_by_name(user_dir):
    r = _cli(["generate", "--prompt", "def f(x):", "--draft", "user_drafters_spec:REPEAT", "--tree", "chain:2",
              "--max-new-tokens", "8", "--temperature", "0"], user_dir)
    assert r.returncode == 0, r.stderr
    r = _cli(["verify", "--target", "default-target", "--draft", "user_drafters_spec:REPEAT", "--tree", "chain:2",
              "--samples", "256", "--horizon", "2", "--top-k", "2"], user_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli(["generate", "--prompt", "x", "--draft", "user_drafters_spec:nope"], user_dir)
    assert r.returncode == 2 and "--draft: draft spec = 'user_drafters_spec:nope'" in r.stderr
