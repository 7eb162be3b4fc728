"""Bank snapshots (`--bank-in/--bank-out`) through the Rust module's single serialisation path.

A snapshot holds one tenant bank: the books plus the arrays `keys` [N, d] (float32, or float16
when the bank's keys are fp16; bf16 keys are widened to float32 since numpy has no bf16),
`support` [N, m] int64, `bias` [N, m] float32 and `counts` [N] int64; metadata
`draft_fingerprint` and `config` (DriftConfig JSON). The Rust loader validates everything (format
version, checksum, shapes, values, recency, tenants, draft fingerprint) and raises a typed
`SnapshotError`; this module turns those into one-line `BadInput`s and additionally refuses a
snapshot whose N, d or m disagree with the run, or whose support ids are not below the run's
vocabulary size (the kernels index logits by them: nothing out of range ever reaches Rust). Nothing is half-loaded: tensors are built only
after every check passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from drift_cli.drift.bank import DriftBank
from drift_cli.drift.config import DriftConfig
from drift_cli.errors import BadInput


def _bank_module():
    from drift_cli import _bank
    return _bank


def snapshot_arrays(bank: DriftBank) -> dict[str, np.ndarray]:
    if bank.support is None:
        raise BadInput("--bank-out needs a sparse support (--support > 0); full-vocabulary banks are not saved")
    keys = bank.keys if bank.keys.dtype == torch.float16 else bank.keys.float()
    return {
        "keys": keys.detach().cpu().contiguous().numpy(),
        "support": bank.support.detach().cpu().contiguous().numpy(),
        "bias": bank.bias.detach().cpu().contiguous().numpy(),
        "counts": bank.counts.detach().cpu().contiguous().numpy(),
    }


def save_bank(bank: DriftBank, path: Path, draft_fingerprint: str | None) -> None:
    """Write one bank atomically (the Rust writer: temp file, fsync, rename)."""
    meta = {"draft_fingerprint": draft_fingerprint or "", "config": bank.cfg.to_json()}
    mod = _bank_module()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mod.save_snapshot(str(path), bank.books, snapshot_arrays(bank), meta)
    except (mod.SnapshotError, OSError) as e:
        raise BadInput(f"--bank-out {path} not written: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None


def load_bank(path: Path, cfg: DriftConfig, dim: int, vocab: int, device, key_dtype: torch.dtype,
              draft_fingerprint: str | None, backend: str = "auto") -> DriftBank:
    """Read and validate a snapshot into a new bank with the run's configuration."""
    mod = _bank_module()
    if not path.exists():
        raise BadInput(f"bank snapshot {path} does not exist")
    if not path.is_file():
        raise BadInput(f"bank snapshot {path} is not a regular file")
    try:
        books, arrays, meta = mod.load_snapshot(str(path), draft_fingerprint or None)
    except mod.SnapshotDraftMismatch as e:
        raise BadInput(f"bank snapshot {path} was made with a different draft model: {e}") from None
    except mod.SnapshotError as e:
        raise BadInput(f"bank snapshot {path} refused: {e}") from None
    except OSError as e:
        raise BadInput(f"bank snapshot {path}: {e.strerror or e}") from None
    keys, support, bias, counts = (arrays.get(name) for name in ("keys", "support", "bias", "counts"))
    if any(a is None for a in (keys, support, bias, counts)):
        raise BadInput(f"bank snapshot {path} lacks one of the arrays keys/support/bias/counts")
    want = {"keys": (cfg.bank_size, dim), "support": (cfg.bank_size, cfg.support),
            "bias": (cfg.bank_size, cfg.support), "counts": (cfg.bank_size,)}
    for name, shape in want.items():
        if tuple(arrays[name].shape) != shape:
            saved = _saved_config(meta)
            raise BadInput(f"bank snapshot {path}: {name} has shape {tuple(arrays[name].shape)}, this run needs "
                           f"{shape} (snapshot config {saved}; match --bank-size/--support and the draft)")
    if support.size and int(support.max()) >= vocab:
        raise BadInput(f"bank snapshot {path} refused: support id {int(support.max())} is out of range for this "
                       f"run's vocabulary of {vocab} tokens")
    tenants = list(books.tenants())
    with torch.inference_mode():
        bank = DriftBank(cfg, dim, vocab, device, key_dtype, tenant=tenants[0] if tenants else "default",
                         books=books, backend=backend)
        bank.keys.copy_(torch.from_numpy(np.ascontiguousarray(keys)).to(key_dtype))
        bank.support.copy_(torch.from_numpy(np.ascontiguousarray(support)).long())
        bank.bias.copy_(torch.from_numpy(np.ascontiguousarray(bias)).float())
        bank.counts.copy_(torch.from_numpy(np.ascontiguousarray(counts)).long())
        valid = books.valid_slots()          # the books also own the extent (hi, n_valid)
        bank.valid[torch.tensor(valid, dtype=torch.long, device=bank.valid.device)] = True
    return bank


def _saved_config(meta: dict) -> dict:
    try:
        return json.loads(meta.get("config", "{}"))
    except json.JSONDecodeError:
        return {}
