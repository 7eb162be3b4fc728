"""Shared test set-up.

TRITON_INTERPRET=1 must be set before any Triton kernel module is imported, so that the same
kernel tests run on a CPU-only machine (the interpreter); on a CUDA machine the kernels run on
the GPU (set TRITON_INTERPRET=1 explicitly to force the interpreter there).
"""

import os
import sys
from pathlib import Path

import torch  # only to ask whether a GPU is present

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
