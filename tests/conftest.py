"""Shared test set-up: the interpreter for Triton, one fresh cache per run, the committed micro pair.

TRITON_INTERPRET=1 must be set before any Triton kernel module is imported, so that the same
kernel tests run on a CPU-only machine (the interpreter); on a CUDA machine the kernels run on
the GPU (set TRITON_INTERPRET=1 explicitly to force the interpreter there).

The cache policy: tests never touch the user's cache. Each run (all its xdist workers together)
gets one fresh `DRIFT_CACHE_DIR` under the system temp dir, removed when the run ends; the
scenario splits are extracted into it on first use (about 30 s), and the micro zoo is installed
into it from the committed files in results/baselines/micro/ (never rebuilt: another CPU would
give other weights). `DRIFT_TEST_CACHE_DIR=DIR` keeps the run's cache in DIR instead, so that a
developer's next run skips the extraction; DIR is never deleted.

The heavy tiers, by what makes a test heavy (markers, `pyproject.toml`): `zoo_build` (trains a
zoo or an offline draft), `subprocess` (fresh `drift` processes), `stats` (statistics over many
samples), `faults` (kills, signals, injected failures), `slow` (long in some other way). `make test`
deselects them; `make test-all` runs everything. `DRIFT_TEST_SCALE` (default 1) multiplies the
fuzz and sample counts (tests/scale.py); CI runs every tier at 1.
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch  # only to ask whether a GPU is present

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):      # one intra-op thread per worker: the workers fill the cores
    torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pinned import MICRO_FIXTURE  # noqa: E402


def _session_cache() -> str:
    """The run's DRIFT_CACHE_DIR, made once by the first process (xdist workers inherit it)."""
    if "DRIFT_TEST_SESSION_CACHE" not in os.environ:
        kept = os.environ.get("DRIFT_TEST_CACHE_DIR")
        if kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
            path = kept
        else:
            path = tempfile.mkdtemp(prefix="drift-tests-")
            atexit.register(shutil.rmtree, path, True)
        os.environ["DRIFT_TEST_SESSION_CACHE"] = path
    return os.environ["DRIFT_TEST_SESSION_CACHE"]


os.environ["DRIFT_CACHE_DIR"] = _session_cache()
# no plain progress lines on a captured stderr (tests count its lines); test_progress turns them on
os.environ.setdefault("DRIFT_PROGRESS_INTERVAL", "off")


@pytest.fixture(scope="session", autouse=True)
def micro_zoo():
    """The micro zoo of this run: the committed files, installed into the run's cache."""
    from drift_cli.zoo.build import install_zoo

    return install_zoo(MICRO_FIXTURE)


@pytest.fixture(autouse=True)
def no_real_pair(monkeypatch):
    """`make test` stays on the toy zoos and random-init pairs: a test that reaches the real pair
    (the default zoo, `smollm`, whose draft and offline drafts take minutes to install or build)
    fails at once, naming the command that forgot its `--zoo micro`."""
    from drift_cli.zoo import pretrained
    from drift_cli.zoo.presets import PRETRAINED

    real = pretrained.ensure_pretrained_zoo

    def guarded(p, *args, **kwargs):
        if p.file in {q.file for q in PRETRAINED.values()}:
            raise AssertionError(f"a test reached the real pair '{p.name}' (the default zoo): give --zoo micro")
        return real(p, *args, **kwargs)

    monkeypatch.setattr(pretrained, "ensure_pretrained_zoo", guarded)
