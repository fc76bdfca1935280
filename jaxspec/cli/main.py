"""The ``jaxspec`` command line: the parser over an explicit list of subcommands, and
:func:`main`, which runs one and turns its errors into one line and an exit status.

Exit statuses: 0 success; 2 bad input (``jaxspec <cmd>: error: <msg>``, never a
traceback), also ``JAX_PLATFORMS`` naming a platform JAX cannot start here; 1 another runtime
failure (one line; an unexpected exception says ``internal error`` and that ``jaxspec --debug
<cmd>`` prints its traceback); 130 interrupted (Ctrl-C at any moment: one line
``jaxspec <cmd>: interrupted``); a subcommand may define more (``jaxspec verify``: 1
rejected, 3 inconclusive).
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import NoReturn

from jaxspec.cli import bench, export, generate, train, verify
from jaxspec.errors import SettingError
from jaxspec.cli.common import CLIError, Command, in_flags, jax_platform_failure

__all__ = ["COMMANDS", "EXIT_INTERRUPTED", "build_parser", "main"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a process that Ctrl-C ended

#: the subcommands, in the order ``jaxspec --help`` lists them
COMMANDS: tuple[Command, ...] = (
    train.train_command,
    train.distill_command,
    train.train_head_command,
    bench.bench_command,
    export.export_command,
    generate.generate_command,
    verify.verify_command,
)


def build_parser(commands: Sequence[Command] = COMMANDS, *, only: str | None = None) -> argparse.ArgumentParser:
    """The ``jaxspec`` parser with one subparser per command (names must be distinct).

    ``only``: set up the flags of that command alone (none where it names no command); the
    others keep their names and help, which is all ``jaxspec --help`` and a usage error need.
    A command's setup imports what its defaults come from (the trainer's configuration, the
    harness's tables and with them SciPy and Optax: seconds at every start), which a run of
    another command never uses."""
    parser = argparse.ArgumentParser(
        prog="jaxspec", description="Lossless tree speculative decoding in JAX/XLA."
    )
    from jaxspec import __version__

    parser.add_argument("--version", action="version", version=f"jaxspec {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an unexpected error, print its traceback (jaxspec --debug COMMAND ...)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    seen = set()
    for c in commands:
        if c.name in seen:
            raise ValueError(f"command {c.name!r} is already registered")
        seen.add(c.name)
        p = sub.add_parser(c.name, help=c.help, description=c.help)
        if only is None or c.name == only:
            p.set_defaults(_handler=c.setup(p), _error_status=c.error_status)
    return parser


def main(argv: Sequence[str] | None = None, *, commands: Sequence[Command] = COMMANDS,
         exit_on_interrupt: bool | None = None) -> int:
    """Run the command line; returns the exit status (0 on success).

    Ctrl-C (``KeyboardInterrupt``) at any moment, from parsing to the end of the command:
    one line ``jaxspec <cmd>: interrupted`` on stderr and status 130.

    ``exit_on_interrupt`` (default: ``argv is None``, i.e. ``main`` runs the program itself:
    the ``jaxspec`` script, ``python -m jaxspec.cli``) makes that hold for the process, see
    :class:`_Interrupts`: it leaves with :func:`os._exit` (no interpreter teardown, where
    XLA's threads, stopped mid-compilation, can crash it: status 139), also for a SIGINT
    after the command (in ``atexit`` callbacks) or one that Python would swallow (in a
    garbage-collector callback). Called with an ``argv`` (tests, other programs), ``main``
    returns 130 instead and leaves the SIGINT handler alone.

    Before ``main`` runs, while the ``jaxspec`` script or ``python -m jaxspec.cli`` imports
    the command line and JAX (seconds), ``jaxspec/cli/__init__.py`` keeps a handler to the
    same effect (the line, ``os._exit(130)``) for the length of its imports; ``import
    jaxspec`` itself installs nothing.
    """
    if exit_on_interrupt is None:
        exit_on_interrupt = argv is None
    command = _command_name(sys.argv[1:] if argv is None else argv, commands)
    name = [f"jaxspec {command}" if command else "jaxspec"]  # for the messages
    interrupts = _Interrupts(name) if exit_on_interrupt else None
    try:
        if interrupts is not None:
            interrupts.install()
        status = _main(argv, commands, name, command)
        if interrupts is not None:  # from here on, a SIGINT cannot raise into the teardown
            interrupts.exit_on_next()
        return status
    except KeyboardInterrupt:
        if interrupts is not None:
            interrupts.exit()
        print(f"{name[0]}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, commands: Sequence[Command], name: list[str], command: str | None) -> int:
    parser = build_parser(commands, only=command or "")  # no command named: names and help only
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help / --version (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    name[0] = f"jaxspec {args.command}"
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning  # restored on leaving: the library's warnings, one line each
            return int(args._handler(args) or 0)
    except SettingError as e:  # a library refusal, in the command line's words
        print(f"{name[0]}: error: {in_flags(e, args)}", file=sys.stderr)
        return 2
    except (CLIError, ValueError, FileNotFoundError) as e:
        print(f"{name[0]}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the last resort: one line, never a raw traceback unless asked
        platforms = jax_platform_failure(e)
        if platforms is not None:
            print(f"{name[0]}: error: {platforms}", file=sys.stderr)
            return 2
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else f" (jaxspec --debug {args.command} ... prints the traceback)"
        if isinstance(e, (OSError, FloatingPointError, RuntimeError)):  # the machine or a device failed
            whole = str(e).strip()
            print(f"{name[0]}: error: {_first_line(e)}{hint if chr(10) in whole else ''}", file=sys.stderr)
        else:
            print(f"{name[0]}: internal error: {type(e).__name__}: {_first_line(e)}{hint}", file=sys.stderr)
        return args._error_status


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command line: ``warning: <message>``, without the
    file, line and source line Python adds."""
    try:
        print(f"warning: {message}", file=sys.stderr if file is None else file)
    except (OSError, ValueError, AttributeError):  # a closed stderr
        pass


def _command_name(argv: Sequence[str], commands: Sequence[Command]) -> str | None:
    """The command the command line names, or None, from the command line itself (before its
    parser is built: the command's setup imports JAX, and a Ctrl-C may come then)."""
    try:
        first = next((a for a in argv if not str(a).startswith("-")), None)
    except TypeError:  # not a sequence of strings: argparse reports it
        return None
    return first if first in {c.name for c in commands} else None


class _Interrupts:
    """SIGINT for :func:`main` running the program: status 130 and one line, whenever it comes.

    * During the command, a SIGINT raises ``KeyboardInterrupt`` (so that a command can say
      what it leaves, e.g. where ``train --resume`` continues); ``main`` catches it and calls
      :meth:`exit`: flush stdout and stderr, print the line, ``os._exit(130)``, skipping the
      interpreter's teardown (XLA's compiling threads crash it: status 139).
    * A SIGINT while a garbage-collector callback or a ``__del__`` runs (JAX has one; Python
      prints and drops exceptions raised there) is left pending: the watchdog thread sends it
      to the main thread again every :data:`RESEND_S` seconds until one arrives outside and
      raises. One re-sent signal is not enough: one that lands just before a blocking call
      (``time.sleep``, a read) sets Python's flag without interrupting the call, and the
      handler would run only when the call returns; the next one interrupts it.
    * Whatever swallows the ``KeyboardInterrupt`` (a library's ``except BaseException``),
      :data:`GRACE_S` seconds after the first SIGINT the watchdog exits the same way.
    * A SIGINT after the ``KeyboardInterrupt`` was raised (a second Ctrl-C while the command
      cleans up) exits at once. The watchdog sends nothing while the handler runs, so that
      no signal of its own comes after the raise.
    * After the command (:meth:`exit_on_next`): a SIGINT exits at once (during ``atexit``
      callbacks it would be "Exception ignored" and the command's status).
    """

    GRACE_S = 5.0
    RESEND_S = 0.05

    def __init__(self, name: list[str]):
        self.name = name  # main's holder of "jaxspec <cmd>"
        self.lock = threading.Lock()  # exit(): one line, whichever thread comes first
        # the watchdog's check-and-send against the handler's update (reentrant: a SIGINT can
        # run the handler again inside itself)
        self.pending_lock = threading.RLock()
        self.pending = False  # a SIGINT came while Python would drop it, not raised yet
        self.raised = False
        self.watchdog: threading.Thread | None = None

    def install(self) -> None:
        _on_sigint(self._during_command)

    def exit_on_next(self) -> None:
        _on_sigint(lambda signum, frame: self.exit())

    def exit(self) -> NoReturn:
        """The line (once, whichever thread comes first), flushed outputs, ``os._exit(130)``."""
        _on_sigint(signal.SIG_IGN)  # a second Ctrl-C meanwhile: no second line
        # Held to the end: a second caller waits for the first one's os._exit. At most 1 s: the
        # main thread, interrupted inside a write, holds that stream's lock, which the
        # watchdog's flush may be waiting for.
        self.lock.acquire(timeout=1.0)
        try:
            _flush()
            print(f"{self.name[0]}: interrupted", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a closed stream, or one whose write this interrupted
            pass
        finally:
            os._exit(EXIT_INTERRUPTED)

    def _during_command(self, signum, frame) -> None:
        if self.raised:
            self.exit()
        if self.watchdog is None:
            self.watchdog = threading.Thread(target=self._watch, name="jaxspec-interrupt", daemon=True)
            self.watchdog.start()
        swallowing = _in_swallowing_frame(frame)
        with self.pending_lock:
            self.pending, self.raised = swallowing, not swallowing
        if self.raised:
            raise KeyboardInterrupt

    def _watch(self) -> None:
        deadline = time.monotonic() + self.GRACE_S
        main_thread = threading.main_thread().ident
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self.RESEND_S, left))
            with self.pending_lock:
                # not while the main thread is inside the handler: CPython has cleared the
                # signal's flag before calling it, so a signal sent then would run the handler
                # once more after it has raised (the main thread can be stopped there, at the
                # handler's first instruction, to let this thread run)
                if self.pending and not _in_handler(sys._current_frames().get(main_thread)):
                    signal.pthread_kill(main_thread, signal.SIGINT)
        self.exit()


def _in_handler(frame) -> bool:
    """Whether ``frame`` runs (in) :meth:`_Interrupts._during_command`."""
    while frame is not None:
        if frame.f_code is _Interrupts._during_command.__code__:
            return True
        frame = frame.f_back
    return False


def _in_swallowing_frame(frame) -> bool:
    """Whether ``frame`` runs (in) a garbage-collector callback or a ``__del__``, where
    Python prints an exception as "Exception ignored in ..." and drops it."""
    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError, RuntimeError):  # a closed pipe, a closed or absent
            pass  # stream, a reentrant call (a signal handler interrupted this stream's write)


def _on_sigint(handler) -> None:
    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: Python delivers SIGINT to the main thread only
        pass
