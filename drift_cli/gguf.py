"""GGUF checkpoints: a `.gguf` file (or a directory holding exactly one) as a draft or a target.

transformers reads GGUF through `from_pretrained(dir, gguf_file=name)` (with the `gguf` package)
and dequantises the weights to the requested float dtype. That takes seconds to tens of seconds,
so the dequantised model is cached once as a plain safetensors checkpoint under
`$DRIFT_CACHE_DIR/gguf/<sha256[:16]>/`, keyed by the sha256 of the GGUF file: the second load is
a normal checkpoint load. The fingerprint of a GGUF model is that sha256 (the file is the
identity, whatever its name). The tokenizer comes from the GGUF file too, saved beside the
weights, so the usual same-tokenizer check works across a GGUF target and a safetensors draft.

transformers refuses `save_pretrained` on a GGUF-loaded model, so the weights are copied into a
fresh model built from the same config (without its quantization entry).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from drift_cli import atomic
from drift_cli.errors import BadInput

GGUF_MAGIC = b"GGUF"
SUFFIX = ".gguf"
INSTALL_HINT = "pip install gguf accelerate"


def is_gguf(path: str | Path) -> bool:
    """A `.gguf` file, or a directory with a `.gguf` file and no config.json."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix == SUFFIX
    return p.is_dir() and not (p / "config.json").exists() and any(p.glob(f"*{SUFFIX}"))


def gguf_file(path: str | Path, role: str) -> Path:
    """The one GGUF file that `path` names; BadInput when there is none or several, or it is no GGUF."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.glob(f"*{SUFFIX}"))
        if len(found) != 1:
            raise BadInput(f"{role} directory {p} holds {len(found)} .gguf files; name the file")
        p = found[0]
    if not p.is_file():
        raise BadInput(f"{role} GGUF file not found: {p}")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise BadInput(f"{role} file {p} is not a GGUF file (its first bytes are not 'GGUF')")
    return p


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    return atomic.cache_dir("gguf")


def _require_packages() -> None:
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise BadInput(f"loading a GGUF checkpoint needs the package(s) {', '.join(missing)}: {INSTALL_HINT}")


def _dequantise(file: Path, out: Path) -> None:
    """Write `file` as a float32 safetensors checkpoint with its tokenizer into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kw = {"gguf_file": file.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), **kw)
        loaded = AutoModelForCausalLM.from_pretrained(str(file.parent), dtype=torch.float32, **kw)
    except Exception as e:  # noqa: BLE001 - a corrupt file or an architecture transformers lacks
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"cannot load the GGUF file {file}: {first}") from e
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    fresh.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def checkpoint(path: str | Path, role: str = "model") -> tuple[Path, str]:
    """(directory of the dequantised checkpoint, sha256 of the GGUF file); built once, cached."""
    from drift_cli.zoo.cache import atomic_directory, build_lock, read_json, write_json_atomic

    file = gguf_file(path, role)
    digest = file_sha256(file)
    final = cache_dir() / digest[:16]
    marker = final / "gguf.json"
    if (read_json(marker) or {}).get("sha256") == digest:
        return final, digest
    _require_packages()
    with build_lock(f"gguf-{digest[:16]}"):
        if (read_json(marker) or {}).get("sha256") == digest:
            return final, digest
        with atomic_directory(final) as tmp:
            _dequantise(file, tmp)
            write_json_atomic(tmp / "gguf.json", {"sha256": digest, "source": str(file),
                                                   "bytes": file.stat().st_size})
    return final, digest
