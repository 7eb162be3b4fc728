"""Errors a user can cause. The CLI turns every `BadInput` into one line on stderr and exit 2."""

from __future__ import annotations


class BadInput(Exception):
    """Input the user can fix: unknown names, missing paths, bad flag values. Exit code 2."""

    exit_code = 2


def require(checks: list[tuple[bool, str]]) -> None:
    """Raise `BadInput` with the message of the first failed (ok, message) check, in order."""
    for ok, message in checks:
        if not ok:
            raise BadInput(message)


def one_line(error: BaseException | str) -> str:
    """The first non-empty line of an error's text (a library's message may run to many lines)."""
    lines = [ln.strip() for ln in str(error).replace("\r", "\n").splitlines() if ln.strip()]
    return lines[0] if lines else type(error).__name__


class CheckFailed(Exception):
    """A check that ran and failed (the regression gate). Exit code 1."""

    exit_code = 1
