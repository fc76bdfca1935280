"""The ``jaxspec`` command line (``jaxspec generate | verify | bench | train | distill |
export``): :func:`main` runs it; one module per subcommand, shared pieces in
:mod:`jaxspec.cli.common`.

Ctrl-C while the command starts. The console script (``jaxspec = "jaxspec.cli:main"``) and
``python -m jaxspec.cli`` import this package, hence JAX, for seconds before :func:`main`
installs its SIGINT handling. ``import jaxspec`` is light (it imports nothing heavy, see
``jaxspec/__init__.py``), so the first heavy import is below: a SIGINT handler installed
just before it exits 130 with the one line ``jaxspec <cmd>: interrupted``, as at any later
moment, not a KeyboardInterrupt traceback. Once the imports are done, the previous handler
is back, so importing this package leaves the process as it found it; :func:`main`, run as
the program, installs its own handling at once. What is left uncovered: the interpreter's
start and ``import jaxspec`` (a few milliseconds, against seconds for JAX), and the few
statements between the end of this import and ``main``'s first line.
"""

import os
import signal
import sys

#: the subcommands, for the line of an interrupted start (checked against
#: ``jaxspec.cli.main.COMMANDS`` by tests/test_cli_robust.py; this module cannot import it
#: before the handler is in place)
COMMAND_NAMES = ("train", "distill", "train-head", "bench", "export", "generate", "verify")


def _exit_130_on_ctrl_c(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: no second line
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    name = f"jaxspec {first}" if first in COMMAND_NAMES else "jaxspec"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass
    os._exit(130)  # no teardown: XLA's threads may be half-started


try:
    _previous_sigint = signal.signal(signal.SIGINT, _exit_130_on_ctrl_c)
    _installed = True
except ValueError:  # not the main thread: Python delivers SIGINT to the main thread only
    _installed = False
try:
    from jaxspec.cli.common import CLIError, Command, check_output_dir, command
    from jaxspec.cli.main import COMMANDS, build_parser, main
finally:
    if _installed and signal.getsignal(signal.SIGINT) is _exit_130_on_ctrl_c:  # the process as it was
        signal.signal(signal.SIGINT, signal.SIG_DFL if _previous_sigint is None else _previous_sigint)

__all__ = ["COMMANDS", "COMMAND_NAMES", "CLIError", "Command", "build_parser", "check_output_dir", "command", "main"]
