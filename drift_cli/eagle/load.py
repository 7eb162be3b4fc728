"""Loading a head by path against its target, and saving one in the layout it is read from.

A head that does not fit its target is refused with one line (`BadInput`) naming the misfit:
a hidden size or target_hidden_size other than the target's, a vocabulary of another size, a
`d2t` mapping outside the target's vocabulary (or mapping two draft ids to one token), a `t2d`
mask of another length or disagreeing with `d2t`, an aux layer id that is no layer of the target,
a missing weight or a weight of another shape.

The draft vocabulary becomes the engine's vocabulary subset (`drift_cli.engine.head`): draft id i
is target id i + d2t[i], and its lm_head row i scores that token; every other token gets the
logit OUTSIDE (probability exactly 0), so the acceptance rule and DRIFT see distributions over the
target's whole vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from drift_cli.eagle.layout import NAMES, aux_layers, check_head_config, detect_kind, read_config, strip_prefix
from drift_cli.eagle.modules import Eagle1Head, Eagle3Head, EagleHead, TargetParts
from drift_cli.engine.head import VOCAB_SUBSET_KEY
from drift_cli.errors import BadInput, one_line
from drift_cli.weights import refuse_non_finite

ARCHITECTURE = {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """name -> tensor (CPU) of every safetensors file, else of pytorch_model.bin; `model.` dropped.
    A .bin is read with torch's weights-only unpickler (never arbitrary objects), quietly; one that
    holds anything but tensors, and any non-finite weight, is refused naming the file or tensor."""
    files = sorted(path.glob("*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    try:
        if files:
            from safetensors.torch import load_file

            for f in files:
                out.update(load_file(str(f)))
        elif (path / "pytorch_model.bin").is_file():
            out = _read_bin(path / "pytorch_model.bin")
        else:
            raise BadInput(f"head {path} has no weights (*.safetensors or pytorch_model.bin)")
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad checkpoint
        raise BadInput(f"head {path}: cannot read its weights: {one_line(e)}") from e
    out = {strip_prefix(k): v for k, v in out.items()}
    refuse_non_finite(out.items(), f"head {path}")
    return out


def _read_bin(file: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin of tensors only: torch's weights-only unpickler, its warnings silenced."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise BadInput(f"{file} holds pickled objects that are not tensors; it is not unpickled "
                       f"(save the head as safetensors)") from None
    if not isinstance(out, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in out.items()):
        raise BadInput(f"{file} is not a mapping of weight names to tensors")
    return out


def head_config(raw: dict, vocab: int, layers: int = 1):
    """A LlamaConfig from a head's config.json (the target's vocabulary size)."""
    from transformers import LlamaConfig

    keep = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "vocab_size", "num_hidden_layers",
                                                      "auto_map", "torch_dtype", "dtype", "transformers_version")}
    try:
        config = LlamaConfig(**keep, vocab_size=vocab, num_hidden_layers=layers)
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"head config.json is not a Llama-style config: {one_line(e)}") from e
    from transformers.activations import ACT2FN

    if config.hidden_act not in ACT2FN:
        raise BadInput(f"head config.json hidden_act {config.hidden_act!r} is not an activation transformers knows")
    return config


def _check_sizes(path: Path, weights: dict, prefix: str, config, d_in: int) -> None:
    """The first layer's attention and MLP weights against the config's sizes, before the head is
    built (a config size that fits no weight is refused before anything is allocated)."""
    d, hd = config.hidden_size, config.head_dim
    _need(path, weights, prefix + "self_attn.q_proj.weight", (config.num_attention_heads * hd, d_in))
    _need(path, weights, prefix + "self_attn.k_proj.weight", (config.num_key_value_heads * hd, d_in))
    _need(path, weights, prefix + "mlp.gate_proj.weight", (config.intermediate_size, d))


def _need(path: Path, weights: dict, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if name not in weights:
        raise BadInput(f"head {path}: weight {name} is missing")
    w = weights[name]
    if shape is not None and tuple(w.shape) != shape:
        raise BadInput(f"head {path}: {name} has shape {list(w.shape)}, the target needs {list(shape)}")
    return w


def _target_shape(target: torch.nn.Module) -> tuple[int, int, int]:
    """(layers L, hidden size d_t, vocabulary V) of the target."""
    cfg = target.config
    return cfg.num_hidden_layers, cfg.hidden_size, target.get_output_embeddings().weight.shape[0]


def draft_vocabulary(path: Path, weights: dict, draft_vocab: int, vocab: int) -> list[int] | None:
    """The target ids of the draft vocabulary (draft id i -> i + d2t[i]); None when it is the whole
    vocabulary in order. Refuses a d2t outside the vocabulary or mapping two ids to one token."""
    if "d2t" not in weights:
        if draft_vocab != vocab:
            raise BadInput(f"head {path}: a draft vocabulary of {draft_vocab} tokens needs d2t (the target has {vocab})")
        return None
    d2t = weights["d2t"]
    if d2t.is_floating_point() and not bool((d2t == d2t.round()).all()):
        raise BadInput(f"head {path}: d2t holds fractional values (it maps draft ids to token offsets)")
    d2t = d2t.long()
    if tuple(d2t.shape) != (draft_vocab,):
        raise BadInput(f"head {path}: d2t has shape {list(d2t.shape)}, its draft vocabulary {draft_vocab} entries")
    ids = torch.arange(draft_vocab) + d2t
    if bool((ids < 0).any() or (ids >= vocab).any()):
        bad = int(ids[(ids < 0) | (ids >= vocab)][0])
        raise BadInput(f"head {path}: d2t maps a draft id to token {bad}, outside the target's vocabulary of {vocab}")
    if ids.unique().numel() != draft_vocab:
        raise BadInput(f"head {path}: d2t maps two draft ids to one target token")
    if "t2d" in weights:
        t2d = weights["t2d"].bool()
        if tuple(t2d.shape) != (vocab,):
            raise BadInput(f"head {path}: t2d has {t2d.numel()} entries, the target's vocabulary {vocab}")
        if int(t2d.sum()) != draft_vocab or not bool(t2d[ids].all()):
            raise BadInput(f"head {path}: t2d does not mark exactly the tokens d2t maps to")
    return None if bool((ids == torch.arange(draft_vocab)).all()) and draft_vocab == vocab else ids.tolist()


def _load_state(head: EagleHead, path: Path, weights: dict) -> None:
    """The checkpoint's tensors into the head: every parameter and buffer it has must be there
    (embeddings and EAGLE-1's lm_head are optional and were created only when present)."""
    state = head.state_dict()
    for name, value in state.items():
        w = _need(path, weights, name, tuple(value.shape))
        state[name] = w.to(value.dtype)
    head.load_state_dict(state, strict=True)


def _eagle3(path: Path, raw: dict, weights: dict, target: torch.nn.Module) -> Eagle3Head:
    layers, d_t, vocab = _target_shape(target)
    _check_vocab(path, raw, vocab)
    aux = aux_layers(raw, layers, f"head {path}: config.json")
    for k in aux:
        if not 0 <= k < layers:
            raise BadInput(f"head {path}: aux layer id {k} is not a layer of the {layers}-layer target (0..{layers - 1})")
    target_hidden = int(raw.get("target_hidden_size") or raw.get("hidden_size", 0))
    if target_hidden != d_t:
        raise BadInput(f"head {path}: target_hidden_size {target_hidden} does not fit the target's hidden size {d_t}")
    config = head_config(raw, vocab)
    d = config.hidden_size
    own_embed = "embed_tokens.weight" in weights
    if not own_embed and d != d_t:
        raise BadInput(f"head {path}: hidden size {d} does not fit the target's {d_t} (it reads the target's embeddings)")
    _need(path, weights, "fc.weight", (d, len(aux) * d_t))
    _check_sizes(path, weights, "midlayer.", config, 2 * d)
    lm_head = _need(path, weights, "lm_head.weight")
    draft_vocab = int(raw.get("draft_vocab_size") or lm_head.shape[0])
    _need(path, weights, "lm_head.weight", (draft_vocab, d))
    ids = draft_vocabulary(path, weights, draft_vocab, vocab)
    setattr(config, VOCAB_SUBSET_KEY, ids)
    head = Eagle3Head(config, aux, TargetParts(target.get_input_embeddings(), target.get_output_embeddings()),
                      d_t, draft_vocab)
    if own_embed:
        head.embed_tokens = torch.nn.Embedding(vocab, d)
    weights = dict(weights)
    weights.setdefault("d2t", torch.zeros(draft_vocab, dtype=torch.long))
    if "t2d" not in weights:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + weights["d2t"].long()] = True
        weights["t2d"] = t2d
    _load_state(head, path, weights)
    if ids is not None and draft_vocab == vocab:       # every token, in another order: rows in the target's
        with torch.no_grad():
            order = torch.tensor(ids)
            head.lm_head.weight[order] = head.lm_head.weight.clone()
            head.d2t.zero_()
        setattr(config, VOCAB_SUBSET_KEY, None)
    return head


def _eagle1(path: Path, raw: dict, weights: dict, target: torch.nn.Module) -> Eagle1Head:
    layers, d_t, vocab = _target_shape(target)
    _check_vocab(path, raw, vocab)
    held = len({name.split(".")[1] for name in weights if name.startswith("layers.")})
    n = raw.get("num_hidden_layers") or 1
    if n != held:
        raise BadInput(f"head {path}: config.json num_hidden_layers {n} but its weights hold {held} layers")
    config = head_config(raw, vocab, n)
    d = config.hidden_size
    if d != d_t:
        raise BadInput(f"head {path}: hidden size {d} does not fit the target's {d_t} (EAGLE-1 reads the target's "
                       f"final state)")
    _need(path, weights, "fc.weight", (d, 2 * d))
    _check_sizes(path, weights, "layers.0.", config, d)
    setattr(config, VOCAB_SUBSET_KEY, None)
    head = Eagle1Head(config, (layers,), TargetParts(target.get_input_embeddings(), target.get_output_embeddings()),
                      "fc.bias" in weights, "lm_head.weight" in weights)
    if "embed_tokens.weight" in weights:
        head.embed_tokens = torch.nn.Embedding(vocab, d)
    _load_state(head, path, weights)
    return head


def _check_vocab(path: Path, raw: dict, vocab: int) -> None:
    size = raw.get("vocab_size")
    if size is not None and size != vocab:
        raise BadInput(f"head {path}: vocabulary of {size} tokens does not fit the target's {vocab}")


def load_head(path: str | Path, target: torch.nn.Module, kind: str = "auto", device: torch.device | None = None,
              dtype: torch.dtype | None = None) -> EagleHead:
    """The head at `path` bound to `target` (its embeddings, EAGLE-1's lm_head), frozen, in eval mode.
    kind: auto (from the checkpoint), eagle or eagle3 (must match it). BadInput when it does not fit."""
    p = Path(path).expanduser()
    raw = read_config(p)
    check_head_config(p, raw)
    weights = read_weights(p)
    found = detect_kind(raw, {k: list(v.shape) for k, v in weights.items()}, str(p / "config.json"))
    if found is None:
        raise BadInput(f"{p} is not an EAGLE head (no EAGLE architecture in config.json, no fc/midlayer weights)")
    if kind not in ("auto", found):
        raise BadInput(f"--draft-kind {kind}: {p} is an {NAMES[found]} head")
    head = (_eagle3 if found == "eagle3" else _eagle1)(p, raw, weights, target)
    ref = target.get_output_embeddings().weight
    head.to(device=device or ref.device, dtype=dtype or ref.dtype).eval()
    head.requires_grad_(False)
    return head


def config_json(head: EagleHead) -> dict:
    """The head's config.json in the layout it is read from (vLLM / SpecForge)."""
    c = head.config
    out = {"architectures": [ARCHITECTURE[head.eagle_kind]], "model_type": "llama",
           "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
           "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "hidden_act": c.hidden_act,
           "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
           "attention_bias": bool(getattr(c, "attention_bias", False)), "tie_word_embeddings": False,
           "num_hidden_layers": c.num_hidden_layers}
    rope = dict(c.rope_parameters or {})
    out["rope_theta"] = rope.get("rope_theta", 10000.0)
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = rope
    if isinstance(head, Eagle3Head):
        out.update(num_hidden_layers=1, draft_vocab_size=head.lm_head.weight.shape[0],
                   target_hidden_size=head.fc.in_features // len(head.target_layers),
                   norm_before_residual=head.norm_before_residual,
                   eagle_config={"eagle_aux_hidden_state_layer_ids": list(head.target_layers)})
    return out


def save_head(head: EagleHead, path: str | Path) -> Path:
    """config.json and model.safetensors in the layout `load_head` (and vLLM, SGLang) read."""
    from safetensors.torch import save_file

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in head.state_dict().items()}
    save_file(tensors, str(p / "model.safetensors"), metadata={"format": "pt"})
    (p / "config.json").write_text(json.dumps(config_json(head), indent=2, sort_keys=True) + "\n")
    return p
