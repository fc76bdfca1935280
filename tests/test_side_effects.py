"""A library without side effects (issue 36, point 5): ``import jaxspec`` changes no process
state and imports nothing heavy, and the decode path (load the embedded pair, generate)
imports jax, flax and numpy (and safetensors, to read a checkpoint), never scipy, plotting,
tokenizer or model-conversion libraries.

Each check runs in a fresh interpreter: what a test process has already imported says
nothing about what jaxspec imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: top-level packages the library must not import on the decode path (scipy comes with the
#: exactness harness, matplotlib with its plots, tokenizers/jinja2/gguf with real-model
#: loading, torch/transformers only in the peer benchmark and its tests)
FORBIDDEN = ("scipy", "matplotlib", "tokenizers", "gguf", "jinja2", "torch", "transformers", "tqdm")


def _run(code: str, tmp_path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXSPEC_CACHE_DIR=str(tmp_path / "cache"),
               JAXSPEC_COMPILATION_CACHE="off")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_PRELUDE = f"""
import json, signal, sys
FORBIDDEN = {FORBIDDEN!r}
def imported(names):
    return sorted({{m.split(".")[0] for m in sys.modules}} & set(names))
"""


def test_import_jaxspec_changes_nothing_and_imports_nothing_heavy(tmp_path):
    out = _run(_PRELUDE + """
        before = signal.getsignal(signal.SIGINT)
        import jaxspec
        same_handler = signal.getsignal(signal.SIGINT) is before
        heavy = imported(FORBIDDEN + ("jax", "flax", "safetensors"))
        print(json.dumps({"same_handler": same_handler, "heavy": heavy}))
    """.replace("\n        ", "\n"), tmp_path)
    assert out["same_handler"], "import jaxspec changed the SIGINT handler"
    assert out["heavy"] == [], f"import jaxspec imported {out['heavy']} (every public name is imported on first use)"


def test_the_decode_path_imports_only_jax_flax_numpy(tmp_path):
    out = _run(_PRELUDE + """
        before = signal.getsignal(signal.SIGINT)
        import jax
        import jaxspec
        target = jaxspec.load_model("default-target")
        draft = jaxspec.load_model("default-draft")
        res = jaxspec.generate(jax.random.key(0), target, draft, [[1, 2, 3]], max_new_tokens=4, tree="chain:2",
                               sampling=jaxspec.Sampling(temperature=1.0))
        res.tokens.block_until_ready()
        print(json.dumps({"same_handler": signal.getsignal(signal.SIGINT) is before,
                          "forbidden": imported(FORBIDDEN), "tokens": list(res.tokens.shape)}))
    """.replace("\n        ", "\n"), tmp_path)
    assert out["tokens"] == [1, 4], out
    assert out["forbidden"] == [], f"load_model + generate imported {out['forbidden']}"
    assert out["same_handler"], "generate changed the SIGINT handler"


def test_a_forbidden_import_is_seen(tmp_path):
    """The probe itself: a module imported in the subprocess shows up (scipy: a dependency of
    jaxspec, so installed wherever the suite runs)."""
    out = _run(_PRELUDE + "import scipy\nprint(json.dumps(imported(FORBIDDEN)))\n", tmp_path)
    assert out == ["scipy"]
