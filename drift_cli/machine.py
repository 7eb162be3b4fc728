"""What a rebuild of the same recipe would need to match: the CPU, its vector extensions, the torch
build and its BLAS.

The same training recipe gives other weights on another CPU (its kernels round differently), so a
pinned checkpoint is tied to files, not to a recipe; this description, recorded in every run and
baseline, is how `drift regress check` tells "the same files on other hardware" from a rebuild.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

# The x86 / Arm flags that decide which kernels torch and its BLAS dispatch to.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "sve", "sve2")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    text = _cpuinfo()
    m = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else (platform.processor() or platform.machine())


def vector_extensions() -> list[str]:
    """The vector-extension flags of VECTOR_FLAGS this CPU reports, in that order."""
    m = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", _cpuinfo(), re.MULTILINE)
    present = set(m.group(1).split()) if m else set()
    return [f for f in VECTOR_FLAGS if f in present]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def torch_build() -> dict[str, str]:
    """torch's version, the CPU kernel level it dispatches to here, and the BLAS it was built with."""
    import torch

    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    return {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "blas": blas.group(1) if blas else "unknown", "git": torch.version.git_version or "unknown"}


def describe() -> dict:
    """The machine facts a bit-for-bit rebuild depends on (strict-JSON-ready)."""
    return {"arch": platform.machine(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "vector_extensions": vector_extensions(), "torch": torch_build()}


def differences(old: dict | None, new: dict) -> list[str]:
    """Readable 'what: old -> new' lines for the fields of `describe()` that differ; [] when
    `old` records none of them (a baseline from before they were recorded)."""
    if not isinstance(old, dict):
        return []
    flat_old, flat_new = _flatten(old), _flatten(new)
    return [f"{k}: {flat_old[k]} -> {flat_new.get(k)}" for k in flat_old if flat_old[k] != flat_new.get(k)]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = " ".join(v) if isinstance(v, list) else v
    return out


def available_memory(device) -> int | None:
    """Bytes a new allocation can take on `device` (a torch.device): a GPU's free memory; on the
    CPU the smaller of the kernel's MemAvailable and what the address-space limit (RLIMIT_AS)
    leaves this process. None when neither is known."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    import resource

    limits = []
    m = re.search(r"^MemAvailable:\s+(\d+) kB", _read("/proc/meminfo"), re.MULTILINE)
    if m:
        limits.append(int(m.group(1)) * 1024)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    used = re.search(r"^VmSize:\s+(\d+) kB", _read("/proc/self/status"), re.MULTILINE)
    if soft != resource.RLIM_INFINITY and used:
        limits.append(max(0, soft - int(used.group(1)) * 1024))
    return min(limits) if limits else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""
