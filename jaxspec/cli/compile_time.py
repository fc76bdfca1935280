"""How long the first compilation of ``jaxspec generate``'s program takes, estimated from
its tree's size before it starts, so that a deep or wide tree (``chain:64``, a 64-leaf
star: minutes of compiling) is announced with a figure instead of minutes without a word.

The program unrolls the round's draft steps level by level (the depth) and the rule's
work over the nodes, and XLA's compile time grows faster than the program; the model
fitted here is ``BASE_S + PER_LEVEL_S * depth + PER_NODE_SQUARED_S * nodes**2``::

    >>> round(compile_seconds(num_nodes=4, depth=4))      # chain:4, the default
    16
    >>> round(compile_seconds(num_nodes=64, depth=64))    # chain:64: about 11 minutes
    658
"""

from __future__ import annotations

__all__ = ["compile_seconds", "long_compile_note", "LONG_COMPILE_S"]

#: The constants of :func:`compile_seconds`, a non-negative least-squares fit to the first
#: call's compile time (first call less the second) of ``jaxspec.generate``'s one-program
#: loop on the embedded pair (``default-target`` / ``default-draft``, 8 new tokens, no
#: compilation cache) on a shared 2-core CPU under a load of about 5 (issue 50, jax 0.10):
#: chain:1 12.8 s, chain:4 21.5, chain:8 35.6, chain:16 55.2; branch:8 20.6, branch:16 31.8,
#: branch:32 164 (residuals up to 16 s). A larger model or a faster machine moves it; it is
#: a rough figure, for a warning.
BASE_S = 10.1
PER_LEVEL_S = 0.84
PER_NODE_SQUARED_S = 0.145

#: an estimate at least this long is announced (one line on stderr)
LONG_COMPILE_S = 60.0


def compile_seconds(*, num_nodes: int, depth: int) -> float:
    """The estimated seconds of the first compilation of a tree of ``num_nodes`` draft
    nodes, ``depth`` levels deep (module docstring)."""
    return BASE_S + PER_LEVEL_S * depth + PER_NODE_SQUARED_S * num_nodes**2


def long_compile_note(tree, flag: str) -> str | None:
    """``"--tree chain:64 (64 nodes, 64 deep): compiling takes about 11 min ..."`` when the
    estimate for ``tree`` (a static or dynamic tree, with ``num_nodes`` and ``depth``) is at
    least :data:`LONG_COMPILE_S`; else ``None``. ``flag``: how the user wrote the tree."""
    try:
        nodes, depth = int(tree.num_nodes), int(tree.depth)
    except (AttributeError, TypeError):  # no tree (target-only decoding)
        return None
    s = compile_seconds(num_nodes=nodes, depth=depth)
    if s < LONG_COMPILE_S:
        return None
    about = f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"
    return (f"--tree {flag} ({nodes} nodes, {depth} deep): its first compilation takes about {about} "
            "(estimated from the tree's size on a 2-core CPU; the compilation cache keeps it for later runs)")
