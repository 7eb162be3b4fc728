"""Shared test set-up.

TRITON_INTERPRET=1 must be set before any Triton kernel module is imported, so that the same
kernel tests run on a CPU-only machine (the interpreter) and on a GPU.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
