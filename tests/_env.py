"""The environment of the subprocesses that tests start on CPU with several host devices."""

from __future__ import annotations

import os

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def host_devices_env(n: int | None) -> dict[str, str]:
    """``os.environ`` for a subprocess on CPU with ``n`` host devices (``None``: none asked
    for, as when the command line's ``--mesh`` adds the count itself). The other XLA flags
    stay: tests/conftest.py compiles without LLVM's expensive passes, which the mesh
    subprocesses, compiling for 8 devices, need most."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    if n is not None:
        flags.append(f"{DEVICE_FLAG}={n}")
    return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
