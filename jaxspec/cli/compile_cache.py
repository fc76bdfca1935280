"""JAX's persistent compilation cache for the command line: a second ``jaxspec generate``
or ``jaxspec verify`` with the same configuration loads its compiled programs from disk
instead of compiling them again. By default the command line also keeps the traced programs
(``--no-program-store`` or ``$JAXSPEC_PROGRAM_STORE=off`` to opt out) (``programs/``, :mod:`jaxspec.decode.program_store`), so
that a second process skips tracing and lowering too: its first tokens came 0.82 s after
start against 2.11 s with the executables alone (benchmarks/README.md, ``program_store``).

Where: ``$JAXSPEC_COMPILATION_CACHE`` if set (a folder, or ``off`` to disable), else
``compilation/`` under the jaxspec cache folder (``$JAXSPEC_CACHE_DIR``, default
``~/.cache/jaxspec``, the folder auto-tree results go to). ``--no-compile-cache`` on a
command turns it off for that run. The Python API leaves JAX's settings alone: call
:func:`enable_compilation_cache` to opt in.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV", "PROGRAMS", "STORE_ENV", "compilation_cache_dir", "enable_compilation_cache",
           "program_store_wanted"]

ENV = "JAXSPEC_COMPILATION_CACHE"
STORE_ENV = "JAXSPEC_PROGRAM_STORE"  # "on": the traced programs too (--program-store); else the executables only
PROGRAMS = "programs"  # the subfolder of traced programs (jaxspec.decode.program_store)


def _off(value: str) -> bool:
    return value.strip().lower() in ("off", "0", "false", "no", "none")


def program_store_wanted(default: bool = False) -> bool:
    """Whether to keep the traced programs: ``$JAXSPEC_PROGRAM_STORE`` ``on`` (or ``1``,
    ``true``, ``yes``) or ``off`` (``0``, ``false``, ``no``, ``none``) when set, else ``default``
    (the command line's ``--program-store`` / ``--no-program-store``)."""
    env = os.environ.get(STORE_ENV, "").strip().lower()
    if env in ("on", "1", "true", "yes"):
        return True
    return False if env and _off(env) else default


def compilation_cache_dir() -> Path | None:
    """The folder the cache uses, or None when ``$JAXSPEC_COMPILATION_CACHE`` is ``off``."""
    env = os.environ.get(ENV, "").strip()
    if _off(env):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("JAXSPEC_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "jaxspec") / "compilation"


def enable_compilation_cache(folder: str | os.PathLike | None = None, *, store_programs: bool = False) -> Path | None:
    """Point JAX's persistent compilation cache at ``folder`` (default
    :func:`compilation_cache_dir`) and cache every program, however quick to compile
    (the speculative loop's pieces each compile fast; together they are seconds). With
    ``store_programs`` (``$JAXSPEC_PROGRAM_STORE`` ``on`` / ``off`` overrides it), also keep the traced programs of
    jaxspec's generation loops and of the exactness harness's blocks in its ``programs/``
    subfolder (:mod:`jaxspec.decode.program_store`).
    Returns the folder, or None when disabled or when it cannot be created (the run then
    compiles as usual)."""
    import jax  # noqa: PLC0415 (the CLI imports jax only when a command runs)

    from jaxspec.decode import program_store  # noqa: PLC0415 (imports jax)

    path = compilation_cache_dir() if folder is None else Path(folder)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # the traced programs beside the executables: a second process then skips tracing and
    # lowering too, not only XLA's compilation (jaxspec.decode.program_store)
    program_store.use_folder(path / PROGRAMS if program_store_wanted(store_programs) else None)
    return path
