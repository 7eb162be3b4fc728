"""Shipped drafts: a pretrained preset's distilled draft, its trained tensors committed beside the code.

Distilling the `smollm` draft costs about half an hour of a 2-core CPU, most of it the target
scoring text. Only part of the draft is trained: its decoder layers, its final norm and the rows
of its head over its vocabulary subset (`distill_on_labels`); the embeddings and every other head
row are the target's. Those trained tensors, in float16, are what ships (`shipped/<preset>/`):

    draft.safetensors   model.layers.*, model.norm.weight, and `head_rows` [K, d] (the subset's rows)
    config.json         the draft's config (its layer count and `draft_vocab_ids`)
    recipe.json         the recipe the tensors were built from (the same dict and hash as a build's)
    build.json          the build's record (agreement, label tokens, wall and CPU time per step)

The `smollm` preset ships its draft (23.6 MB). A run whose current recipe hash equals the shipped
one installs the draft into the cache in under a second: the draft is cut from the target as a
build would cut it and the shipped tensors are loaded over it. Any other recipe (another target
file, other training documents, another preset entry) builds from source, as does `drift zoo
build --preset smollm --from-source`. `tests/test_shipped.py` checks that the shipped recipe is
the current one.

Tolerance: the shipped tensors are the fp32 build rounded to float16 (relative error at most
2^-11 per element; every trained value of the smollm draft lies well inside float16's range).
`drift zoo build --preset smollm --from-source --ship` rebuilds and rewrites them. A build runs with
deterministic algorithms and a fixed thread count, so on the CPU and thread count recorded in
build.json a rewrite should give the same bytes; another CPU rounds differently (a pinned pair is
files, not a recipe).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from drift_cli.engine.head import VOCAB_SUBSET_KEY
from drift_cli.zoo import cache

SHIPPED_ROOT = Path(__file__).parent / "shipped"
SHIPPED_DTYPE = torch.float16
HEAD_ROWS = "head_rows"
SOURCE = "shipped"          # build.json "source" of a draft installed from the shipped files


def shipped_dir(preset: str) -> Path:
    return SHIPPED_ROOT / preset


def shipped_recipe(preset: str) -> dict | None:
    return cache.read_json(shipped_dir(preset) / "recipe.json")


def is_installed_from_shipped(draft_dir: Path) -> bool:
    return (cache.read_json(draft_dir / "build.json") or {}).get("source") == SOURCE


def _trained(name: str) -> bool:
    return name.startswith("model.layers.") or name == "model.norm.weight"


def write_shipped(preset: str, draft_dir: Path) -> Path:
    """Write the trained tensors of the built draft in `draft_dir` to `shipped/<preset>/` (atomic)."""
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)
    ids = getattr(draft.config, VOCAB_SUBSET_KEY, None)
    if not ids:
        raise ValueError(f"{draft_dir}: a shipped draft needs a vocabulary subset ({VOCAB_SUBSET_KEY})")
    state = draft.state_dict()
    tensors = {k: v.to(SHIPPED_DTYPE).contiguous() for k, v in state.items() if _trained(k)}
    tensors[HEAD_ROWS] = state["lm_head.weight"][torch.tensor(ids)].to(SHIPPED_DTYPE).contiguous()
    final = shipped_dir(preset)
    with cache.atomic_directory(final) as tmp:
        save_file(tensors, str(tmp / "draft.safetensors"), metadata={"preset": preset})
        (tmp / "config.json").write_text(json.dumps(draft.config.to_dict(), indent=1, sort_keys=True) + "\n")
        for name in ("recipe.json", "build.json"):
            shutil.copy2(draft_dir / name, tmp / name)
    return final


def shipped_vocabulary(preset: str) -> list[int]:
    """The shipped draft's vocabulary subset (the ids its head rows score, in order)."""
    return json.loads((shipped_dir(preset) / "config.json").read_text())[VOCAB_SUBSET_KEY]


@torch.no_grad()
def install_shipped(preset: str, draft: torch.nn.Module, tokenizer, out: Path) -> dict:
    """`draft`, freshly cut from the target over `shipped_vocabulary(preset)`, with the shipped
    tensors loaded over it, saved to `out` (a build's temporary directory); returns its build record."""
    src = shipped_dir(preset)
    ids = shipped_vocabulary(preset)
    tensors = load_file(str(src / "draft.safetensors"))
    state = draft.state_dict()
    missing = sorted(k for k in state if _trained(k) and k not in tensors)
    if missing or HEAD_ROWS not in tensors:
        raise ValueError(f"{src}: the shipped draft lacks {', '.join(missing) or HEAD_ROWS}")
    for name, value in tensors.items():
        if name == HEAD_ROWS:
            state["lm_head.weight"][torch.tensor(ids)] = value.float()
        else:
            state[name].copy_(value.float())
    draft.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    record = cache.read_json(src / "build.json") or {}
    built = {k: record.pop(k) for k in ("wall_time_s", "cpu_time_s") if k in record}
    return {**record, "source": SOURCE, "shipped_dtype": str(SHIPPED_DTYPE).removeprefix("torch."),
            "built": built}
