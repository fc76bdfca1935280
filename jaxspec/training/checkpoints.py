"""Training checkpoints: one folder of a run's arrays (``state.safetensors``: parameters
and optimizer state, flattened by key path) and its JSON metadata (``state.json``), swapped
in whole so that a crash mid-write leaves the previous checkpoint intact; and the checks that
read one back, naming the file and what is wrong with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

__all__ = ["STATE_FILE", "META_FILE", "flat_arrays", "unflat_arrays", "nonfinite_arrays", "save_checkpoint",
           "find_checkpoint", "read_checkpoint_meta", "read_checkpoint_state"]

STATE_FILE = "state.safetensors"
META_FILE = "state.json"


def flat_arrays(tree) -> dict[str, np.ndarray]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def unflat_arrays(template, arrays: dict[str, np.ndarray], source: Path):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for p, x in leaves:
        name = jax.tree_util.keystr(p)
        if name not in arrays:
            raise ValueError(f"resume: {source}: missing tensor {name!r}")
        a = arrays[name]
        if a.shape != x.shape or a.dtype != x.dtype:
            raise ValueError(
                f"resume: {source}: tensor {name!r} is {a.dtype}{list(a.shape)}; expected {x.dtype}{list(x.shape)}"
            )
        out.append(jnp.asarray(a))
    return jax.tree_util.tree_unflatten(treedef, out)



def nonfinite_arrays(arrays: dict[str, np.ndarray]) -> list[str]:
    """Names of the floating-point host arrays holding an inf or a NaN."""
    return [k for k, a in arrays.items() if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all()]


def save_checkpoint(ckpt_dir: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write params + optimizer state (:func:`flat_arrays`) + JSON metadata; swap directories so a
    crash mid-write leaves the previous checkpoint intact."""
    tmp, old = ckpt_dir.with_name(ckpt_dir.name + ".tmp"), ckpt_dir.with_name(ckpt_dir.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(arrays, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if ckpt_dir.exists():
        ckpt_dir.rename(old)
    tmp.rename(ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(ckpt_dir: Path) -> Path | None:
    for d in (ckpt_dir, ckpt_dir.with_name(ckpt_dir.name + ".old")):
        if (d / META_FILE).is_file() and (d / STATE_FILE).is_file():
            return d
    return None


# The entries of a checkpoint's META_FILE that resuming reads, and what each must be.
_META_ENTRIES = {
    "kind": (str, "a string"), "model_config": (dict, "a JSON object"), "train_config": (dict, "a JSON object"),
    "step": (int, "an integer >= 0"), "sampler_state": (dict, "a JSON object"), "history": (list, "a JSON list"),
    "train_time_s": ((int, float), "a number"),
}


def _damaged(path: Path, what: str) -> ValueError:
    return ValueError(f"resume: {path}: {what}; the checkpoint is damaged: start the run again in another out_dir "
                      f"(--out), or delete {path.parent} to start over in this one")


def read_checkpoint_meta(folder: Path) -> dict:
    """The metadata of the checkpoint in ``folder`` (its ``META_FILE``), checked to hold
    every entry resuming reads; ``ValueError`` naming the file and what is wrong with it
    (not JSON, not an object, an entry missing or of the wrong type)."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise _damaged(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _damaged(path, f"not valid JSON ({e})") from None
    except OSError as e:
        raise _damaged(path, f"cannot be read ({e.strerror or e})") from None
    if not isinstance(meta, dict):
        raise _damaged(path, f"expected a JSON object, got a JSON {type(meta).__name__}")
    for name, (kind, expected) in _META_ENTRIES.items():
        if name not in meta:
            raise _damaged(path, f"no {name!r} entry")
        v = meta[name]
        if not isinstance(v, kind) or isinstance(v, bool) or (name == "step" and v < 0):
            raise _damaged(path, f"{name!r} = {repr(v)[:80]}; expected {expected}")
    return meta


def read_checkpoint_state(folder: Path) -> dict[str, np.ndarray]:
    """The arrays of the checkpoint in ``folder``; ``ValueError`` naming the file when it
    cannot be read (truncated, not safetensors)."""
    path = Path(folder) / STATE_FILE
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise _damaged(path, f"cannot be read as safetensors ({e})") from None
