"""One of two processes that form one JAX cluster on this machine (tests/test_mesh.py):
``python _multihost_worker.py PROCESS_ID PORT``. Each process sees 2 host devices; together
they make a (data=2, model=2) mesh over 4 devices, run generate on it and print the tokens
as JSON (every process gets every row)."""

from __future__ import annotations

import json
import os
import sys

from _env import DEVICE_FLAG  # noqa: E402  (this script's folder is first on sys.path)

# 2 host devices, unless the caller asked (tests/test_mesh.py does); the caller's other flags stay
# (tests/conftest.py compiles without LLVM's expensive passes)
if DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEVICE_FLAG}=2".strip()

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
pid, port = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402

import jaxspec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tiny import tiny_pair  # noqa: E402

PROMPTS = [[1, 2, 3], [4, 5], [6]]

if __name__ == "__main__":
    target, draft = tiny_pair(3, vocab_size=16, hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=1)
    mesh = jaxspec.make_mesh(2, 2)
    out = jaxspec.generate(jax.random.key(7), target, draft, PROMPTS, max_new_tokens=8, tree="branch:2,2",
                           sampling=jaxspec.Sampling(temperature=1.0), stop_tokens=(), mesh=mesh)
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": jax.device_count(), "local_devices": jax.local_device_count(),
                      "tokens": np.asarray(out.tokens).tolist()}), flush=True)
    jax.distributed.shutdown()
