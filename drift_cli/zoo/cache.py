"""The zoo cache: recipe hashes, atomic directory builds, a per-preset build lock.

Layout under `$DRIFT_CACHE_DIR` (default `~/.cache/drift-bench`):

    zoo/<preset>-<recipe hash[:12]>/
        manifest.json
        tokenizer/  target/  draft/           each with recipe.json (its own hash) and build.json
        offline/<scenario>-<divergence>[-onpolicy]/

A component directory is built under a temporary name in the same parent and renamed into place
only when complete, so a crash never leaves a half-written checkpoint where a reader looks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from drift_cli.atomic import atomic_write_json, cache_dir
from drift_cli.errors import BadInput

# Bump when the training or distillation code changes what a recipe produces.
CODE_VERSION = 1


def cache_root() -> Path:
    return cache_dir("zoo")


def offline_name(scenario: str, divergence: str, on_policy: bool) -> str:
    """The directory name of an offline draft under a zoo root's `offline/`."""
    return f"{scenario}-{divergence}" + ("-onpolicy" if on_policy else "")


def recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def build_threads(default: int = 1) -> int:
    """Intra-op CPU threads for a build: $DRIFT_TRAIN_THREADS, else `default` (1 for the toy zoos,
    every available core for the pretrained presets' drafts). The thread count fixes the order of
    float reductions: a toy zoo records it in its recipe (`seal`), a pretrained build in its
    build.json (its recipe names what is built, as the same recipe on another CPU also rounds
    differently)."""
    text = os.environ.get("DRIFT_TRAIN_THREADS", str(default))
    if not text.strip().isdigit() or not 1 <= int(text) <= 1024:
        raise BadInput(f"DRIFT_TRAIN_THREADS must be an integer from 1 to 1024 (got {text!r})")
    return int(text)


def seal(recipe: dict, record_threads: bool = True) -> dict:
    """A trained component's recipe with its build thread count and its hash. One thread, the
    default, stays out of the recipe, so the recipes built before the count was recorded keep
    their hash; `record_threads=False` (the pretrained presets) leaves the count out always."""
    threads = build_threads()
    if record_threads and threads != 1:
        recipe["threads"] = threads
    recipe["hash"] = recipe_hash(recipe)
    return recipe


def documents_hash(docs) -> str:
    """sha256 over (id, sha256(text)) of each document, in the given (training) order."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.id.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(d.text.encode()).digest())
    return h.hexdigest()


def write_json_atomic(path: Path, obj) -> None:
    atomic_write_json(path, obj, sort_keys=True)


def read_json(path: Path) -> dict | None:
    """The JSON object at `path`; None when it is missing, unreadable, not JSON or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def cached_builds(preset: str, current: Path, describe) -> list[dict]:
    """Every cached build root of `preset`: its path, whether it is `current`, whether it is
    complete, its offline drafts, and `describe(manifest)`'s fields (for `drift zoo list`)."""
    builds = []
    for root in sorted(cache_root().glob(f"{preset}-*")):
        if not root.is_dir():
            continue
        m = read_json(root / "manifest.json") or {}
        offline = sorted(x.name for x in (root / "offline").glob("*") if (x / "recipe.json").exists()) \
            if (root / "offline").is_dir() else []
        builds.append({"root": str(root), "current": root == current, "complete": bool(m),
                       **describe(m), "offline": offline})
    return builds


def component_matches(directory: Path, recipe_hash_: str) -> bool:
    recipe = read_json(directory / "recipe.json")
    return recipe is not None and recipe.get("hash") == recipe_hash_


def _fsync_tree(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(parent: Path, name: str) -> None:
    """Delete `.name.tmp-PID` / `.name.old-PID` left by builds whose process has died."""
    for leftover in parent.glob(f".{name}.*-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield an empty temp dir next to `final`; on success it replaces `final` in one rename."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent, final.name)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_component(source: Path, final: Path) -> None:
    with atomic_directory(final) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)


def find_built_component(preset: str, component: str, hash_: str, exclude: Path) -> Path | None:
    """A complete component with this recipe hash in another build of the same preset, if any."""
    for root in sorted(cache_root().glob(f"{preset}-*")):
        candidate = root / component
        if root != exclude and component_matches(candidate, hash_):
            return candidate
    return None


@contextlib.contextmanager
def build_lock(name: str) -> Iterator[None]:
    """An exclusive lock so that two processes never build the same preset at once."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fh = open(root / f".{name}.lock", "w")
    except OSError as e:
        raise BadInput(f"cannot build into the cache {root} (set DRIFT_CACHE_DIR to a writable directory): "
                       f"{e.strerror or e}") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
