"""Device and dtype names, checked without torch (a bad --device or --dtype is refused before
any model library loads); `drift_cli.models` turns them into torch's."""

from __future__ import annotations

import re

from drift_cli.errors import BadInput

# dtype names -> torch's attribute names
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d{1,4})?)$")
AUTO_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}   # --dtype auto: what users of each device run


def resolve_dtype(name: str, device: str) -> str:
    """--dtype auto -> bfloat16 on a CUDA device, float32 on the CPU; any other name as given."""
    if name != "auto":
        return name
    return AUTO_DTYPE["cuda" if device.startswith("cuda") else "cpu"]


def check_device(name: str) -> None:
    """cpu, auto, cuda or cuda:N naming a GPU that exists (BadInput otherwise); only a cuda
    device imports torch, to ask."""
    if not DEVICE.match(name):
        raise BadInput(f"--device must be cpu, cuda, cuda:N or auto (got '{name}')")
    if not name.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise BadInput(f"device '{name}' requested but CUDA is not available")
    _, _, index = name.partition(":")
    if index and int(index) >= torch.cuda.device_count():
        raise BadInput(f"device '{name}' requested but there are {torch.cuda.device_count()} CUDA devices")
