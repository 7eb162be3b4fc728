"""The `drift` command (and `python -m drift_cli`): signal handlers first, then the slow imports.

The command modules import torch and transformers (two to three seconds). They are imported with
SIGINT/SIGTERM held (`interrupt.deferred`), so a Ctrl-C or SIGTERM then is one line
("interrupted") and exit 130 or 143 once they are in, never a KeyboardInterrupt traceback. Triton
is imported in the same block where it is installed: its C++ import calls back into Python, and a
KeyboardInterrupt raised inside such a callback aborts the process (`terminate called after
throwing an instance of 'nanobind::python_error'`); torch would import it later anyway, while a
model loads (transformers -> torch._dynamo -> triton). Once the command has exited, a late signal
is ignored and stderr is closed, so that the interpreter's shutdown adds nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys

from drift_cli import interrupt


def main() -> None:
    interrupt.install()
    try:
        with interrupt.deferred():
            from drift_cli.cli import main as cli_main

            with contextlib.suppress(Exception):
                import triton  # noqa: F401
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        interrupt.ignore()      # as after a command: nothing may kill or print during teardown
        _quiet_teardown()
        sys.exit(interrupt.exit_code())
    try:
        cli_main()
    except SystemExit as e:   # the command is done and has said what it had to say
        interrupt.ignore()
        _quiet_teardown()
        if e.code in interrupt.EXIT_CODES:
            # An interrupt that passed through code run by the PyRun_* C API (pybind11's exec,
            # which torch and Triton use) sets CPython's "unhandled KeyboardInterrupt" flag even
            # though this process caught it, and Py_RunMain then ends the process by SIGINT (-2)
            # instead of our 130. What the command wrote is written (atomically, fsynced), so
            # an interrupted command ends here, with its own status.
            sys.stdout.flush()
            os._exit(e.code)
        raise


def _quiet_teardown() -> None:
    """Nothing more on stderr once the command has exited: libtriton's nanobind teardown can print
    a known leak report at interpreter shutdown (Triton silences its own workers the same way).
    Only on SystemExit: an unexpected exception still prints its traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


if __name__ == "__main__":
    main()
