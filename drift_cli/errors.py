"""Errors a user can cause, and failures of one method. The CLI turns every `BadInput` into one
line on stderr and exit 2; a method that raised while it ran (`MethodFailure`) into one line and
exit 1, after every other method's results are written."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass


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


def one_line(e: BaseException) -> str:
    """'Type: first line of the message', for a report of one line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def debugging() -> bool:
    """`drift --debug` (or DRIFT_DEBUG=1, which the flag sets so that worker processes inherit it):
    a method's failure also prints its traceback."""
    return os.environ.get("DRIFT_DEBUG", "") not in ("", "0")


@dataclass(frozen=True)
class MethodFailure:
    """A method that raised while it was built or ran. Its run.json row is `{"error": to_json()}`;
    the run is incomplete. `exception` (its frames cleared) lets a caller that cannot go on without
    the method raise it again."""

    method: str
    type: str
    message: str            # the message's first line (the whole text is in `traceback`)
    traceback: str
    exception: Exception

    @classmethod
    def of(cls, method: str, e: Exception) -> "MethodFailure":
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        traceback.clear_frames(e.__traceback__)     # the frames hold the stream's tensors
        lines = str(e).strip().splitlines()
        return cls(method, type(e).__name__, lines[0] if lines else "", text, e)

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message}


def failure_line(method: str, error: dict) -> str:
    """'method NAME failed: Type: message', from its run.json row's `error` (the CLI's stderr line,
    a suite cell's error)."""
    what = f"{error.get('type', 'Exception')}: {error.get('message', '')}".rstrip(": ")
    return f"method {method} failed: {what}"
