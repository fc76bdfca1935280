"""``python -m jaxspec.cli``: the ``jaxspec`` command."""

import sys

from jaxspec.cli import main

if __name__ == "__main__":
    sys.exit(main())
