"""The same random bits with fewer XLA operations on CPU: Threefry-2x32 lowered without a loop.

Every ``jax.random`` call with the default key (``threefry2x32``) runs the Threefry-2x32
block cipher, JAX's ``threefry2x32_p`` primitive. On GPU and TPU, XLA receives its 20
rounds unrolled; on CPU, JAX lowers them as a ``while`` loop of five iterations (smaller
programs, faster compiles). A speculative round draws its keys and its random numbers in a
dozen separate calls (a ``fold_in`` and a draw per tree level, the acceptance rule's
uniforms), each a small loop of XLA operations whose dispatch costs more than the
arithmetic. :func:`use_unrolled_threefry` registers, for the CPU platform, a lowering of
the same primitive with the rounds unrolled (:func:`threefry2x32`): the same function, so
every key, every random number and every generated token is bit for bit what it was; only
programs compiled afterwards change: the draft's masks, warps and draws of a ``chain:4``
round at T = 1 take 87 XLA operations instead of 453. What that saves in time is a few percent at most on
the 2-core CPU measured, inside its run-to-run noise (``benchmarks/README.md``,
"``threefry_lowering``").

It changes the process: every later CPU compilation of a Threefry draw, jaxspec's or not,
gets the unrolled form. The ``jaxspec`` command line calls it at start (``JAXSPEC_ROLLED_THREEFRY=1``
keeps JAX's loop); a program using the library calls it once, before compiling::

    import jaxspec
    jaxspec.use_unrolled_threefry()     # True: registered (False: not available here)
    out = jaxspec.generate(...)          # same tokens as without, fewer operations a round
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

__all__ = ["threefry2x32", "use_unrolled_threefry", "unrolled_threefry_in_use", "wanted_by_environment",
           "use_unless_environment_says_not", "ROLLED_ENV"]

#: environment variable that keeps JAX's own (rolled) CPU lowering in the command line
ROLLED_ENV = "JAXSPEC_ROLLED_THREEFRY"

# Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2,
# 3", SC 2011): rotation constants of the even and odd groups of four rounds, and the key
# schedule's parity constant
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)

_state = {"in_use": False}


def _rotl(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1, k2, x1, x2):
    """Threefry-2x32-20 of the counter words ``(x1, x2)`` under the key ``(k1, k2)``
    (``uint32`` arrays of one broadcast shape), the rounds unrolled: the function of JAX's
    ``threefry2x32_p``. Returns the two output words."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    a, b = x1 + ks[0], x2 + ks[1]
    for group in range(5):  # five groups of four rounds, a key injection after each
        for r in _ROTATIONS[group % 2]:
            a = a + b
            b = _rotl(b, r) ^ a
        a = a + ks[(group + 1) % 3]
        b = b + ks[(group + 2) % 3] + np.uint32(group + 1)
    return a, b


def _lowering(k1, k2, x1, x2):
    shape = jnp.broadcast_shapes(jnp.shape(k1), jnp.shape(k2), jnp.shape(x1), jnp.shape(x2))
    return threefry2x32(*(jnp.broadcast_to(jnp.asarray(a, jnp.uint32), shape) for a in (k1, k2, x1, x2)))


def use_unrolled_threefry() -> bool:
    """Lower JAX's Threefry primitive with its rounds unrolled on CPU from now on (see the
    module docstring); idempotent. Returns False, changing nothing, where this JAX does not
    expose the primitive or the lowering registry (``jax.extend.random.threefry2x32_p``,
    ``jax.interpreters.mlir``)."""
    if _state["in_use"]:
        return True
    try:
        from jax.extend.random import threefry2x32_p  # noqa: PLC0415
        from jax.interpreters import mlir  # noqa: PLC0415

        rule = mlir.lower_fun(_lowering, multiple_results=True)
        register = mlir.register_lowering
    except (ImportError, AttributeError):
        return False
    # out of line, as JAX emits its own unrolled form on GPU: one function per program, not
    # a copy of the 20 rounds at every call site
    register(threefry2x32_p, rule, platform="cpu", inline=False)
    _state["in_use"] = True
    return True


def unrolled_threefry_in_use() -> bool:
    """Whether :func:`use_unrolled_threefry` has registered its lowering in this process."""
    return _state["in_use"]


def wanted_by_environment() -> bool:
    """False when :data:`ROLLED_ENV` is set to a non-empty value other than ``0``."""
    return os.environ.get(ROLLED_ENV, "") in ("", "0")


def use_unless_environment_says_not() -> bool:
    """:func:`use_unrolled_threefry` unless :data:`ROLLED_ENV` asks for JAX's loop (what the
    command line and the benchmark scripts call at start); whether it is in use."""
    return use_unrolled_threefry() if wanted_by_environment() else unrolled_threefry_in_use()
