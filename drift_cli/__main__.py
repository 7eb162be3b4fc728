"""The `drift` command (and `python -m drift_cli`): signal handlers first, then the slow imports.

The command modules import torch (about a second and a half); a Ctrl-C or SIGTERM during those
imports is one line ("interrupted") and exit 130 or 143, never a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys

from drift_cli import interrupt


def main() -> None:
    interrupt.install()
    try:
        from drift_cli.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    cli_main()


if __name__ == "__main__":
    main()
