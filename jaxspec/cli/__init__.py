"""The ``jaxspec`` command line (``jaxspec generate | verify | bench | train | distill |
export``): :func:`main` runs it; one module per subcommand, shared pieces in
:mod:`jaxspec.cli.common`."""

from jaxspec.cli.common import CLIError, Command, check_output_dir, command
from jaxspec.cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "CLIError", "Command", "build_parser", "check_output_dir", "command", "main"]
