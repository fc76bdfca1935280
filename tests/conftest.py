import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import os

# In-process CLI tests would otherwise switch JAX's persistent compilation cache on for the
# whole test process and write under the user's home; tests/test_compile_cache.py tests it
# in subprocesses with a folder of their own.
os.environ.setdefault("JAXSPEC_COMPILATION_CACHE", "off")
