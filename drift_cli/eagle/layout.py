"""The head checkpoint layouts read, and which kind a checkpoint is. Torch-free: `drift bench`
checks `--draft-kind` against a checkpoint before any model library loads.

A head is a directory with config.json and its weights (`*.safetensors`, or `pytorch_model.bin`):

EAGLE-1 (yuhuili/EAGLE-*, vLLM `llama_eagle.py`, SGLang `llama_eagle.py`): architectures
["LlamaForCausalLMEagle"] or ["EagleLlamaForCausalLM"]; `fc.weight` [d, 2d] (and `fc.bias` in the
original layout), `layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `layers.{i}.mlp.{gate,up,down}_proj.weight`,
`layers.{i}.post_attention_layernorm.weight`, `layers.{i}.input_layernorm.weight` for i > 0 (layer 0
has none in use); optionally `embed_tokens.weight` and `lm_head.weight` (else the target's).

EAGLE-3 (vLLM `llama_eagle3.py`, SpecForge `LlamaForCausalLMEagle3`): architectures
["LlamaForCausalLMEagle3"] or ["Eagle3LlamaForCausalLM"]; `fc.weight` [d, n·d_target],
`midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`midlayer.self_attn.{q,k,v}_proj.weight` [.., 2d], `midlayer.self_attn.o_proj.weight`,
`midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight` [draft_vocab, d],
`d2t` [draft_vocab] int64 (draft id i is target id i + d2t[i]), `t2d` [V] bool; optionally
`embed_tokens.weight`. The target layers it reads: `eagle_config.eagle_aux_hidden_state_layer_ids`
(or a top-level `eagle_aux_hidden_state_layer_ids`), default (2, L // 2, L - 3).

Without a known architecture name the kind comes from the weight names: `midlayer.*` or `d2t`
means EAGLE-3, `layers.0.*` with `fc.weight` EAGLE-1. A leading `model.` on the names is dropped.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from drift_cli.errors import BadInput

HEAD_KINDS = ("eagle", "eagle3")
DRAFT_KINDS = ("auto",) + HEAD_KINDS              # --draft-kind; auto: a head if the checkpoint is one
MODEL = "model"                                    # the kind of an ordinary draft model
ARCHITECTURES = {"LlamaForCausalLMEagle": "eagle", "EagleLlamaForCausalLM": "eagle",
                 "LlamaForCausalLMEagle3": "eagle3", "Eagle3LlamaForCausalLM": "eagle3"}
NAMES = {"eagle": "EAGLE-1", "eagle3": "EAGLE-3"}


def strip_prefix(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def read_config(path: Path) -> dict:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"draft {path}: cannot read config.json ({e})") from None
    if not isinstance(config, dict):
        raise BadInput(f"draft {path}: config.json is not a JSON object")
    return config


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's header (its first 8 bytes give the header's size)."""
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise BadInput(f"{file} is not a safetensors file (truncated header)")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 2**20:
            raise BadInput(f"{file} is not a safetensors file (a header of {size} bytes)")
        try:
            header = json.loads(fh.read(size))
        except ValueError:
            raise BadInput(f"{file} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise BadInput(f"{file} is not a safetensors file (its header is not a JSON object)")
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
            raise BadInput(f"{file} is not a safetensors file (tensor {name}: shape {shape!r} is not a list of "
                           f"sizes)")
        shapes[name] = shape
    return shapes


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def weight_shapes(path: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape over a checkpoint directory's safetensors files (None when it has none)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    return {strip_prefix(n): shape for f in files for n, shape in safetensors_shapes(f).items()}


def detect_kind(config: dict, names: dict[str, list[int]] | None, where: str = "config.json") -> str | None:
    """"eagle", "eagle3" or None (not a head) from the architecture name, else the weight names
    (and shapes: EAGLE-1's fc takes 2d)."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise BadInput(f"{where}: architectures must be a list of names, got {archs!r}")
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if names is None:
        return None
    if "d2t" in names or any(n.startswith("midlayer.") for n in names):
        return "eagle3"
    fc = names.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] == 2 * fc[0] and any(n.startswith("layers.0.") for n in names):
        return "eagle"
    return None


def resolve_kind(path: str | Path, requested: str) -> str:
    """The kind of the draft at `path`: "model", "eagle" or "eagle3". `requested` is --draft-kind:
    auto (whatever the checkpoint is), or a head kind the checkpoint must be (BadInput otherwise)."""
    p = Path(path).expanduser()
    if not p.is_dir() or not (p / "config.json").is_file():
        if requested != "auto":
            raise BadInput(f"--draft-kind {requested}: {p} is not a head checkpoint directory (no config.json)")
        return MODEL
    found = detect_kind(read_config(p), weight_shapes(p), str(p / "config.json"))
    if requested == "auto":
        return found or MODEL
    if found is None:
        raise BadInput(f"--draft-kind {requested}: {p} is not an EAGLE head (its config names no EAGLE "
                       f"architecture and its weights have no fc/midlayer layout)")
    if found != requested:
        raise BadInput(f"--draft-kind {requested}: {p} is an {NAMES[found]} head; give --draft-kind {found} or auto")
    return found


def aux_layers(config: dict, target_layers: int, where: str = "config.json") -> tuple[int, ...]:
    """The target hidden-state indices an EAGLE-3 head fuses (the config's, else (2, L // 2, L - 3))."""
    eagle = config.get("eagle_config", {})
    if not isinstance(eagle, dict):
        raise BadInput(f"{where}: eagle_config must be a JSON object, got {eagle!r}")
    key = "eagle_aux_hidden_state_layer_ids"
    ids = eagle[key] if eagle.get(key) is not None else config.get(key)
    if ids is None:
        return (2, target_layers // 2, target_layers - 3)
    if not isinstance(ids, list) or not ids or not all(_is_int(i) for i in ids):
        raise BadInput(f"{where}: {key} must be a non-empty list of integers, got {ids!r}")
    return tuple(ids)


# config.json fields a head reads: (name, what it must be, the check). Absent fields keep
# Llama's defaults; present ones must be of their JSON type, so a string or a fraction never
# reaches a size, and a size nobody could allocate is caught by the weight shapes it must match.
_SIZE = ("a positive integer", lambda x: _is_int(x) and x > 0)
_POSITIVE = ("a positive finite number", lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
             and math.isfinite(x) and x > 0)
HEAD_FIELDS = {
    "hidden_size": _SIZE, "intermediate_size": _SIZE, "num_attention_heads": _SIZE, "num_key_value_heads": _SIZE,
    "head_dim": _SIZE, "max_position_embeddings": _SIZE, "vocab_size": _SIZE, "num_hidden_layers": _SIZE,
    "target_hidden_size": _SIZE, "draft_vocab_size": _SIZE, "rope_theta": _POSITIVE, "rms_norm_eps": _POSITIVE,
    "hidden_act": ("an activation name", lambda x: isinstance(x, str)),
}


def check_head_config(path: Path, config: dict) -> None:
    """Refuse (one line) a head config.json field of the wrong type or value, before anything is built."""
    for name, (what, ok) in HEAD_FIELDS.items():
        if name in config and config[name] is not None and not ok(config[name]):
            raise BadInput(f"head {path}: config.json {name} must be {what}, got {config[name]!r}")
    for name in ("rope_scaling", "rope_parameters"):
        rope = config.get(name)
        if rope is not None and not isinstance(rope, dict):
            raise BadInput(f"head {path}: config.json {name} must be a JSON object, got {rope!r}")
        theta = (rope or {}).get("rope_theta")
        if theta is not None and not _POSITIVE[1](theta):
            raise BadInput(f"head {path}: config.json {name}.rope_theta must be {_POSITIVE[0]}, got {theta!r}")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise BadInput(f"head {path}: config.json num_attention_heads {heads} is not a multiple of "
                       f"num_key_value_heads {kv}")
