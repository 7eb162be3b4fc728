"""Output files, in one leaf module that imports nothing of ours but the errors.

- `strict_json`: RFC 8259 JSON text. A non-finite float (NaN, ±inf) becomes `null`, numpy values
  and paths become plain values, and `allow_nan=False` guarantees that no bare `NaN` or
  `Infinity` ever reaches a file or stdout.
- `check_output_target`: an output path may name a regular file or nothing. A device node, FIFO,
  socket or directory is refused (`BadInput`), so that a rename never replaces one.
- `refuse_inputs`: an output path that is one of the command's inputs (the same file by any name,
  or inside an input directory) is refused before anything is written.
- `cache_dir`: `$DRIFT_CACHE_DIR/<part>` (default `~/.cache/drift-bench`), refused when the
  variable names something that is not a directory.
- `atomic_write_bytes` / `atomic_write_json`: temp file beside the target, fsync, rename. The
  target check runs first, and a failing file system (full disk, read-only, permissions) is one
  `BadInput` line with nothing left behind.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

from drift_cli.errors import BadInput


def _finite(x: Any) -> Any:
    """`x` with every non-finite float replaced by None (recursively through dicts and lists)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if hasattr(x, "tolist"):          # numpy / torch scalars and arrays
        return _finite(x.tolist())
    if isinstance(x, Path):
        return str(x)
    return x


def strict_json(obj: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    """Strict JSON text of `obj` (non-finite floats -> null)."""
    return json.dumps(_finite(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def cache_dir(part: str) -> Path:
    """The cache directory for `part` (zoo, scenarios); BadInput when DRIFT_CACHE_DIR is not a directory."""
    base = Path(os.environ.get("DRIFT_CACHE_DIR") or "~/.cache/drift-bench").expanduser()
    if base.exists() and not base.is_dir():
        raise BadInput(f"DRIFT_CACHE_DIR {base} is not a directory")
    return base / part


def check_output_target(path: Path, flag: str = "output") -> Path:
    """Refuse `path` unless it is a regular file or does not exist (symlinks are followed)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise BadInput(f"{flag} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise BadInput(f"{flag} {path} is {kind}; give a new or regular file path (it would be replaced)")
    return path


def refuse_inputs(path: Path, inputs: Iterable[tuple[str, Any]], flag: str = "output") -> Path:
    """Refuse an output `path` that is one of the command's own inputs ((what, path) pairs; None
    skipped): the same file by any name (a link, `..`, a hard link), or a path inside an input
    directory (a checkpoint or corpus that the new file would change). Called before anything
    is written."""
    out = Path(path).expanduser()
    resolved = _resolve(out, flag)
    for what, given in inputs:
        if given is None:
            continue
        src = Path(given).expanduser()
        real = _resolve(src, what)
        if resolved == real or (out.exists() and src.exists() and os.path.samefile(out, src)):
            raise BadInput(f"{flag} {path} is {what} this command reads; give another path (it would be replaced)")
        if src.is_dir() and real in resolved.parents:
            raise BadInput(f"{flag} {path} is inside {what} {given}, which this command reads; give a path outside it")
    return out


def _resolve(path: Path, what: str) -> Path:
    """`path` with every link followed; a symlink loop is one BadInput line."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as e:
        raise BadInput(f"{what} {path}: {getattr(e, 'strerror', None) or e}") from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = check_output_target(Path(path))
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are ordinary files
        check_output_target(path)   # again just before the rename: nothing but a file is replaced
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any, sort_keys: bool = False) -> None:
    atomic_write_bytes(path, (strict_json(obj, indent=2, sort_keys=sort_keys) + "\n").encode())
