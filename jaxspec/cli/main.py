"""The ``jaxspec`` command line: the parser over an explicit list of subcommands, and
:func:`main`, which runs one and turns its errors into one line and an exit status.

Exit statuses: 0 success; 2 bad input (``jaxspec <cmd>: error: <msg>``, never a
traceback); 1 another runtime failure; 130 interrupted; a subcommand may define more
(``jaxspec verify``: 1 rejected, 3 inconclusive).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxspec.cli import bench, export, generate, train, verify
from jaxspec.cli.common import CLIError, Command

__all__ = ["COMMANDS", "build_parser", "main"]

#: the subcommands, in the order ``jaxspec --help`` lists them
COMMANDS: tuple[Command, ...] = (
    train.train_command,
    train.distill_command,
    bench.bench_command,
    export.export_command,
    generate.generate_command,
    verify.verify_command,
)


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The ``jaxspec`` parser with one subparser per command (names must be distinct)."""
    parser = argparse.ArgumentParser(
        prog="jaxspec", description="Lossless tree speculative decoding in JAX/XLA."
    )
    from jaxspec import __version__

    parser.add_argument("--version", action="version", version=f"jaxspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    seen = set()
    for c in commands:
        if c.name in seen:
            raise ValueError(f"command {c.name!r} is already registered")
        seen.add(c.name)
        p = sub.add_parser(c.name, help=c.help, description=c.help)
        p.set_defaults(_handler=c.setup(p))
    return parser


def main(argv: Sequence[str] | None = None, *, commands: Sequence[Command] = COMMANDS) -> int:
    """Run the command line; returns the exit status (0 on success)."""
    parser = build_parser(commands)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help / --version (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args._handler(args) or 0)
    except (CLIError, ValueError, FileNotFoundError) as e:
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except (OSError, FloatingPointError, RuntimeError) as e:
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        return 1
