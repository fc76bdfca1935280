"""`jaxspec export` on the embedded draft: stale tokenizer files left in OUT_DIR by an
earlier export are removed (and reported), a source's own are copied, and an empty
OUT_DIR is refused."""

import json

from jaxspec.cli import main


def _export(capsys, *argv):
    code = main(["export", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stale_tokenizer_files_are_removed(capsys, tmp_path):
    """OUT_DIR held an exported model with a tokenizer.json; re-exporting the byte-level
    default-draft there (no tokenizer files) removes them, keeps unrelated files."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text('{"model": "stale"}')
    (out / "special_tokens_map.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    code, stdout, err = _export(capsys, "default-draft", str(out))
    assert code == 0, err
    info = json.loads(stdout)
    assert info["removed"] == ["tokenizer.json", "special_tokens_map.json"]
    assert not (out / "tokenizer.json").exists() and not (out / "special_tokens_map.json").exists()
    assert "tokenizer.json" not in info["files"] and "notes.txt" in info["files"]
    assert (out / "notes.txt").read_text() == "mine"
    assert "removed stale tokenizer.json, special_tokens_map.json" in err, err

    code, stdout, err = _export(capsys, "default-draft", str(out))  # nothing stale now
    assert code == 0 and json.loads(stdout)["removed"] == [] and "removed" not in err


def test_source_tokenizer_files_replace_stale_ones(capsys, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    assert _export(capsys, "default-draft", str(src))[0] == 0
    (src / "tokenizer.json").write_text('{"model": "source"}')
    out.mkdir()
    (out / "tokenizer.json").write_text('{"model": "stale"}')
    (out / "tokenizer_config.json").write_text("{}")
    code, stdout, err = _export(capsys, str(src), str(out))
    assert code == 0, err
    assert json.loads(stdout)["removed"] == ["tokenizer_config.json"]
    assert (out / "tokenizer.json").read_text() == '{"model": "source"}'
    assert not (out / "tokenizer_config.json").exists()


def test_empty_out_dir_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for empty in ("", " "):
        code, stdout, err = _export(capsys, "default-draft", empty)
        assert code == 2 and stdout == ""
        assert err == f"jaxspec export: error: OUT_DIR {empty!r}: expected a folder path, got an empty one\n"
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder
