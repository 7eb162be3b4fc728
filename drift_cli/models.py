"""Loading a draft/target pair from local Hugging Face checkpoints or GGUF files.

The pair is refused before any model runs when the tokenizers differ (same vocabulary and the
same token-to-id map are required). Each checkpoint is fingerprinted: sha256 over its config and
weight files, the identity the regression gate pins; a GGUF model's fingerprint is the sha256 of
its file, and it loads from its dequantised cache (`drift_cli.gguf`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from drift_cli.devices import DTYPES as DTYPE_NAMES, check_device
from drift_cli.errors import BadInput, one_line
from drift_cli.weights import refuse_non_finite

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
DTYPES = {name: getattr(torch, dtype) for name, dtype in DTYPE_NAMES.items()}


@dataclass
class ModelInfo:
    path: str
    fingerprint: str
    parameters: int
    kind: str = "model"           # a draft's: model, or an EAGLE head (eagle, eagle3)

    def to_json(self) -> dict:
        return {"path": self.path, "fingerprint": self.fingerprint, "parameters": self.parameters, "kind": self.kind}


@dataclass
class Pair:
    draft: torch.nn.Module
    target: torch.nn.Module
    tokenizer: object
    draft_info: ModelInfo
    target_info: ModelInfo

    @property
    def eos_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)


def checkpoint_dir(path: str | Path, role: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(f"{role} checkpoint not found: {p}")
    if not (p / "config.json").is_file():
        raise BadInput(f"{role} path {p} is not a Hugging Face checkpoint (no config.json)")
    if not any(f.suffix in WEIGHT_SUFFIXES for f in p.iterdir()):
        raise BadInput(f"{role} checkpoint {p} has no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    return p


def resolve_checkpoint(path: str | Path, role: str) -> tuple[Path, str]:
    """(a loadable checkpoint directory, its fingerprint) for a checkpoint directory or a GGUF file."""
    from drift_cli import gguf

    if gguf.is_gguf(path):
        return gguf.checkpoint(path, role)
    directory = checkpoint_dir(path, role)
    return directory, fingerprint(directory)


def fingerprint(path: str | Path) -> str:
    """sha256 over config.json and every weight file (sorted by name, names included)."""
    p = Path(path)
    h = hashlib.sha256()
    files = [p / "config.json"] + sorted(f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def load_tokenizer(path: Path, role: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - any loader failure is a bad checkpoint
        raise BadInput(f"cannot load the {role} tokenizer from {path}: {str(e).splitlines()[0]}") from e


def check_same_tokenizer(draft_tok, target_tok) -> None:
    """Same vocabulary and same token-to-id map, or a one-line BadInput."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv == tv:
        return
    only_d = len(set(dv) - set(tv))
    only_t = len(set(tv) - set(dv))
    moved = sum(1 for t in set(dv) & set(tv) if dv[t] != tv[t])
    raise BadInput(
        f"draft and target tokenizers differ (vocab {len(dv)} vs {len(tv)}; {only_d} tokens only in the draft, "
        f"{only_t} only in the target, {moved} with different ids): speculative decoding needs one tokenizer"
    )


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        from drift_cli.registry import unknown

        raise unknown("dtype", name, DTYPES)
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    """cpu, cuda or cuda:N (an existing GPU); anything else is BadInput."""
    check_device(name)
    return torch.device(name)


def load_model(path: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"cannot load the model at {path}: {one_line(e)}") from e
    refuse_non_finite(model.state_dict().items(), f"model {path}")
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_pair(draft: str | Path, target: str | Path, device: str = "cpu", dtype: str = "float32",
              draft_kind: str = "auto") -> Pair:
    """Check both paths and tokenizers first, then load the models. An EAGLE head as the draft
    (`draft_kind`, or detected with auto) is checked against the target instead of a tokenizer."""
    from drift_cli.eagle.layout import MODEL, resolve_kind

    kind = resolve_kind(draft, draft_kind)
    if kind != MODEL:
        return load_head_pair(draft, target, kind, device, dtype)
    (dpath, dprint), (tpath, tprint) = resolve_checkpoint(draft, "draft"), resolve_checkpoint(target, "target")
    dtok, ttok = load_tokenizer(dpath, "draft"), load_tokenizer(tpath, "target")
    check_same_tokenizer(dtok, ttok)
    dev, dt = parse_device(device), parse_dtype(dtype)
    dmodel, tmodel = load_model(dpath, dev, dt), load_model(tpath, dev, dt)
    info = lambda p, f, m: ModelInfo(str(p), f, sum(x.numel() for x in m.parameters()))  # noqa: E731
    return Pair(dmodel, tmodel, ttok, info(draft, dprint, dmodel), info(target, tprint, tmodel))


def load_head_pair(head: str | Path, target: str | Path, kind: str, device: str = "cpu", dtype: str = "float32") -> Pair:
    """An EAGLE head (`drift_cli.eagle`) and its target: the head shares the target's tokenizer and
    is refused (BadInput, one line) when its shapes, vocabulary or layers do not fit the target."""
    from drift_cli.eagle.load import load_head

    hpath = checkpoint_dir(head, "draft head")
    hprint = fingerprint(hpath)
    tpath, tprint = resolve_checkpoint(target, "target")
    tok = load_tokenizer(tpath, "target")
    dev, dt = parse_device(device), parse_dtype(dtype)
    tmodel = load_model(tpath, dev, dt)
    hmodel = load_head(hpath, tmodel, kind, dev, dt)
    count = lambda m: sum(x.numel() for x in m.parameters())  # noqa: E731 (the head's own: not the target's parts)
    return Pair(hmodel, tmodel, tok, ModelInfo(str(head), hprint, count(hmodel), kind),
                ModelInfo(str(target), tprint, count(tmodel)))
