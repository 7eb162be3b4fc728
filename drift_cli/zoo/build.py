"""Building the zoo: tokenizer, target, draft, offline drafts; each cached by its recipe hash.

A component's recipe holds everything that determines its bytes: its preset entries, the code
version, the hash of its training documents and the hashes of the components it is built on.
The build root is named by the hash of all three base recipes; a component whose own recipe is
unchanged is copied from an earlier build instead of being retrained (a changed draft recipe
retrains only the draft).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from drift_cli.methods.settings import DIVERGENCES
from drift_cli.errors import BadInput
from drift_cli.registry import unknown
from drift_cli.zoo import cache
from drift_cli.zoo.distill import distill
from drift_cli.zoo.models import llama_config, new_model, parameter_count, per_token_flops, weights_sha256
from drift_cli.zoo.presets import (DEFAULT_ZOO, PRESETS, PRETRAINED, ModelShape, TrainRecipe, ZooPreset, preset_names,  # noqa: F401
                                   pretrained_preset)
from drift_cli.zoo.tokenizer import budgeted, encode_documents, load_tokenizer, train_tokenizer
from drift_cli.zoo.training import (DomainSampler, Progress, cpu_threads, next_token_loss, run_steps,
                                    training_device, windows)

COMPONENTS = ("tokenizer", "target", "draft")
hf_logging.disable_progress_bar()   # our own progress callback reports; no tqdm bars on stderr


@dataclass(frozen=True)
class ZooPair:
    preset: str
    root: Path
    tokenizer: Path
    target: Path
    draft: Path


def get_preset(name: str) -> ZooPreset:
    """A preset whose target is trained here (`micro`, `small`, `large`)."""
    if name not in PRESETS:
        raise unknown("zoo preset", name, preset_names())
    return PRESETS[name]


# ---- data --------------------------------------------------------------------------------------

def _training_documents():
    from drift_cli.scenarios import draft_training_documents, target_training_documents

    return list(target_training_documents()), list(draft_training_documents())


def _by_domain(docs) -> dict[str, list]:
    groups: dict[str, list] = {}
    for d in docs:
        groups.setdefault(d.domain, []).append(d)
    return groups


def _capped(docs: list, max_chars: int | None) -> list:
    """At most `max_chars` of a domain's documents: a fixed pseudo-random subset (by id hash)."""
    if max_chars is None:
        return docs
    out, total = [], 0
    for d in sorted(docs, key=lambda d: hashlib.sha256(d.id.encode()).digest()):
        if total >= max_chars:
            break
        out.append(d)
        total += len(d.text)
    return out


def _sampler(tokenizer: PreTrainedTokenizerFast, docs, length: int, batch: int, seed: int,
             alpha: float = 1.0, domain_chars: int | None = None) -> DomainSampler:
    """Windows of `length` tokens per domain (documents EOS-separated), mixed by `alpha`."""
    groups = _by_domain(docs)
    per_domain = [windows(encode_documents(tokenizer, [d.text for d in _capped(groups[k], domain_chars)]), length)
                  for k in sorted(groups)]
    return DomainSampler(per_domain, batch, seed, alpha)


# ---- recipes -----------------------------------------------------------------------------------

def base_recipes(preset: ZooPreset, target_data: str, draft_data: str) -> dict[str, dict]:
    """Per-component recipes (each with its own 'hash')."""
    tok = {"component": "tokenizer", "code_version": cache.CODE_VERSION, "vocab_size": preset.vocab_size,
           "tokenizer_chars": preset.tokenizer_chars, "data": target_data}
    data_cap = {"domain_chars": preset.domain_chars}
    tok["hash"] = cache.recipe_hash(tok)

    def model(name: str, shape: ModelShape, train: TrainRecipe, data: str) -> dict:
        r = {"component": name, "code_version": cache.CODE_VERSION, "tokenizer": tok["hash"],
             "vocab_size": preset.vocab_size, "shape": asdict(shape), "train": asdict(train), "data": data,
             **data_cap}
        return cache.seal(r)

    return {
        "tokenizer": tok,
        "target": model("target", preset.target, preset.target_train, target_data),
        "draft": model("draft", preset.draft, preset.draft_train, draft_data),
    }


def root_for(preset: ZooPreset, recipes: dict[str, dict]) -> tuple[Path, str]:
    h = cache.recipe_hash({"preset": preset.name, **{k: recipes[k]["hash"] for k in COMPONENTS}})
    return cache.cache_root() / f"{preset.name}-{h[:12]}", h


# ---- components --------------------------------------------------------------------------------

def _build_tokenizer(preset: ZooPreset, target_docs, out: Path, progress: Progress | None) -> dict:
    if progress:
        progress("tokenizer", 0, 1)
    groups = _by_domain(target_docs)
    texts = list(budgeted([[d.text for d in groups[k]] for k in sorted(groups)], preset.tokenizer_chars))
    tok = train_tokenizer(texts, preset.vocab_size)
    tok.save_pretrained(str(out))
    if progress:
        progress("tokenizer", 1, 1)
    return {"vocab_size": len(tok), "trained_on_chars": sum(len(t) for t in texts)}


def _build_model(preset: ZooPreset, name: str, shape: ModelShape, train: TrainRecipe, docs,
                 tokenizer: PreTrainedTokenizerFast, out: Path, progress: Progress | None) -> dict:
    device = training_device()
    config = llama_config(shape, preset.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id)
    model = new_model(config, train.seed).to(device)
    sampler = _sampler(tokenizer, docs, train.seq_len + 1, train.batch, train.seed, train.mix_alpha,
                       preset.domain_chars)
    curve = run_steps(model, lambda s: next_token_loss(model, sampler.batch_at(s).to(device), train.bf16),
                      train.steps, train.lr, train.warmup, train.weight_decay, train.min_lr_ratio,
                      name, progress)
    model.to("cpu").save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {
        "parameters": parameter_count(model),
        "per_token_flops": per_token_flops(shape, preset.vocab_size),
        "loss_curve": curve,
        "train_tokens": train.steps * train.batch * train.seq_len,
        "windows_per_domain": [int(w.shape[0]) for w in sampler.by_domain],
        "device": str(device),
    }


def _ensure_component(preset: ZooPreset, root: Path, name: str, recipe: dict, build) -> None:
    """Reuse, copy from another build, or build `name` under `root` (atomically)."""
    final = root / name
    if cache.component_matches(final, recipe["hash"]):
        return
    earlier = cache.find_built_component(preset.name, name, recipe["hash"], exclude=root)
    if earlier is not None:
        cache.copy_component(earlier, final)
        return
    with cache.atomic_directory(final) as tmp:
        start, cpu = time.perf_counter(), time.process_time()
        info = build(tmp)
        info["wall_time_s"] = round(time.perf_counter() - start, 2)
        info["cpu_time_s"] = round(time.process_time() - cpu, 2)   # < wall x threads when the CPU is shared
        info["weights_sha256"] = weights_sha256(tmp) if name != "tokenizer" else None
        cache.write_json_atomic(tmp / "build.json", info)
        cache.write_json_atomic(tmp / "recipe.json", recipe)


def _manifest(preset: ZooPreset, root: Path, root_hash: str, recipes: dict, wall: float) -> dict:
    built = {k: cache.read_json(root / k / "build.json") for k in COMPONENTS}
    t, d = built["target"], built["draft"]
    return {
        "preset": preset.name,
        "hash": root_hash,
        "recipe": {"preset_table": preset.as_dict(), "code_version": cache.CODE_VERSION,
                   "data": {"target": recipes["target"]["data"], "draft": recipes["draft"]["data"]},
                   "components": {k: recipes[k]["hash"] for k in COMPONENTS}},
        "parameters": {"target": t["parameters"], "draft": d["parameters"]},
        "per_token_flops": {"target": t["per_token_flops"], "draft": d["per_token_flops"],
                            "draft_over_target": round(d["per_token_flops"] / t["per_token_flops"], 4)},
        "loss_curves": {"target": t["loss_curve"], "draft": d["loss_curve"]},
        "train_tokens": {"target": t["train_tokens"], "draft": d["train_tokens"]},
        "wall_time_s": {**{k: built[k]["wall_time_s"] for k in COMPONENTS}, "ensure": round(wall, 2)},
        "cpu_time_s": {k: built[k].get("cpu_time_s") for k in COMPONENTS},
        "weights_sha256": {"target": t["weights_sha256"], "draft": d["weights_sha256"]},
        "tokenizer": built["tokenizer"],
    }


def _pair(preset: ZooPreset, root: Path) -> ZooPair:
    return ZooPair(preset.name, root, root / "tokenizer", root / "target", root / "draft")


def _is_built(root: Path, root_hash: str, recipes: dict) -> bool:
    """The manifest matches the recipe (its hash and every component's) and the components are in
    place; a damaged or edited manifest is rebuilt (components that still match are reused)."""
    manifest = cache.read_json(root / "manifest.json")
    if manifest is None or manifest.get("hash") != root_hash:
        return False
    recipe = manifest.get("recipe")
    components = recipe.get("components") if isinstance(recipe, dict) else None
    return components == {k: recipes[k]["hash"] for k in COMPONENTS} and \
        all(cache.component_matches(root / k, recipes[k]["hash"]) for k in COMPONENTS)


def ensure_zoo(preset: str = DEFAULT_ZOO, progress: Progress | None = None, from_source: bool = False) -> ZooPair:
    """The zoo for `preset`, built (or completed) if missing; a no-op when the recipe is unchanged.
    `from_source`: a pretrained preset's draft is distilled here, not installed from the shipped
    tensors (the toy zoos are always built from source)."""
    if (pretrained := pretrained_preset(preset)) is not None:
        from drift_cli.zoo.pretrained import ensure_pretrained_zoo

        return ZooPair(**vars(ensure_pretrained_zoo(pretrained, progress, from_source)))
    p = get_preset(preset)
    target_docs, draft_docs = _training_documents()
    recipes = base_recipes(p, cache.documents_hash(target_docs), cache.documents_hash(draft_docs))
    root, root_hash = root_for(p, recipes)
    if _is_built(root, root_hash, recipes):
        return _pair(p, root)
    with cache.build_lock(p.name), cpu_threads():
        if _is_built(root, root_hash, recipes):          # another process finished it while we waited
            return _pair(p, root)
        start = time.perf_counter()
        _ensure_component(p, root, "tokenizer", recipes["tokenizer"],
                          lambda out: _build_tokenizer(p, target_docs, out, progress))
        tok = load_tokenizer(root / "tokenizer")
        _ensure_component(p, root, "target", recipes["target"],
                          lambda out: _build_model(p, "target", p.target, p.target_train, target_docs, tok, out, progress))
        _ensure_component(p, root, "draft", recipes["draft"],
                          lambda out: _build_model(p, "draft", p.draft, p.draft_train, draft_docs, tok, out, progress))
        cache.write_json_atomic(root / "manifest.json", _manifest(p, root, root_hash, recipes, time.perf_counter() - start))
    return _pair(p, root)


# ---- installing built files --------------------------------------------------------------------

def install_zoo(source: Path) -> ZooPair:
    """Copy a built zoo root (manifest.json, tokenizer/, target/, draft/: a committed fixture, or
    a build from another machine) into the cache under its own recipe name, atomically (a no-op
    when it is there already). Files, not a recipe: a rebuild on another CPU gives other weights."""
    source = Path(source)
    manifest = cache.read_json(source / "manifest.json")
    if manifest is None or not isinstance(manifest.get("hash"), str) or manifest.get("preset") not in PRESETS:
        raise BadInput(f"{source} is not a built zoo (no manifest.json of a trained preset: "
                       f"{', '.join(PRESETS)})")
    components = (manifest.get("recipe") or {}).get("components") or {}
    for name in COMPONENTS:
        if not cache.component_matches(source / name, components.get(name, "")):
            raise BadInput(f"{source} is not a complete zoo: {name}/ is missing or is not the manifest's")
    p = get_preset(manifest["preset"])
    root = cache.cache_root() / f"{p.name}-{manifest['hash'][:12]}"
    with cache.build_lock(p.name):
        if (cache.read_json(root / "manifest.json") or {}) != manifest or \
                any(not cache.component_matches(root / n, components[n]) for n in COMPONENTS):
            cache.copy_component(source, root)
    return _pair(p, root)


def is_current_build(pair: ZooPair) -> bool:
    """Whether `pair` is its preset's build for this machine's scenario data (`--zoo` uses it);
    False when the data give another recipe (then `--zoo` rebuilds; the files still work by path)."""
    p = get_preset(pair.preset)
    target_docs, draft_docs = _training_documents()
    current, _ = root_for(p, base_recipes(p, cache.documents_hash(target_docs), cache.documents_hash(draft_docs)))
    return current == pair.root


# ---- offline drafts ----------------------------------------------------------------------------

def load_model(path: Path) -> torch.nn.Module:
    """A zoo checkpoint (a directory, or the GGUF file of a pretrained target) in fp32."""
    from drift_cli.models import resolve_checkpoint

    directory, _ = resolve_checkpoint(path, "zoo model")
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def ensure_offline_draft(preset: str, scenario: str, divergence: str = "fkl", on_policy: bool = False,
                         progress: Progress | None = None) -> Path:
    """The base draft distilled from the target on `scenario`'s train split; cached."""
    if divergence not in DIVERGENCES:
        raise unknown("divergence", divergence, DIVERGENCES)
    if (pretrained := pretrained_preset(preset)) is not None:
        from drift_cli.zoo.pretrained import ensure_pretrained_offline

        return ensure_pretrained_offline(pretrained, scenario, divergence, on_policy, progress)
    from drift_cli.scenarios import documents

    pair = ensure_zoo(preset, progress)
    p = get_preset(preset)
    docs = list(documents(scenario, "train"))
    zoo_hash = cache.read_json(pair.root / "manifest.json")["hash"]
    recipe = {"component": "offline", "code_version": cache.CODE_VERSION, "zoo": zoo_hash, "scenario": scenario,
              "divergence": divergence, "on_policy": on_policy, "distill": asdict(p.distill),
              "domain_chars": p.domain_chars,
              "data": cache.documents_hash(docs)}
    cache.seal(recipe)
    final = pair.root / "offline" / cache.offline_name(scenario, divergence, on_policy)
    if cache.component_matches(final, recipe["hash"]):
        return final
    with cache.build_lock(f"{p.name}-offline"), cpu_threads():
        if cache.component_matches(final, recipe["hash"]):
            return final
        with cache.atomic_directory(final) as tmp:
            start, cpu = time.perf_counter(), time.process_time()
            info = _distill_offline(p, pair, docs, divergence, on_policy, tmp, progress, final.name)
            info["wall_time_s"] = round(time.perf_counter() - start, 2)
            info["cpu_time_s"] = round(time.process_time() - cpu, 2)
            info["weights_sha256"] = weights_sha256(tmp)
            cache.write_json_atomic(tmp / "build.json", info)
            cache.write_json_atomic(tmp / "recipe.json", recipe)
    return final


def _distill_offline(p: ZooPreset, pair: ZooPair, docs, kind: str, on_policy: bool, out: Path,
                     progress: Progress | None, label: str) -> dict:
    device = training_device()
    tok = load_tokenizer(pair.tokenizer)
    draft, target = load_model(pair.draft).to(device), load_model(pair.target).to(device)
    sampler = _sampler(tok, docs, p.distill.seq_len + 1, p.distill.batch, p.distill.seed, 1.0, p.domain_chars)
    curve = distill(draft, target, sampler, p.distill, kind, on_policy, f"offline {label}", progress,
                    device=device)
    draft.to("cpu").save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"loss_curve": curve, "train_tokens": p.distill.steps * p.distill.batch * p.distill.seq_len,
            "windows_per_domain": [int(w.shape[0]) for w in sampler.by_domain], "device": str(device)}


# ---- status ------------------------------------------------------------------------------------

def zoo_status(preset: str) -> dict:
    """What is built for `preset`: the current recipe's root and every cached build."""
    if (pretrained := pretrained_preset(preset)) is not None:
        from drift_cli.zoo.pretrained import pretrained_status

        return pretrained_status(pretrained)
    p = get_preset(preset)
    target_docs, draft_docs = _training_documents()
    recipes = base_recipes(p, cache.documents_hash(target_docs), cache.documents_hash(draft_docs))
    current, current_hash = root_for(p, recipes)
    builds = cache.cached_builds(p.name, current, lambda m: {
        "parameters": m.get("parameters"), "per_token_flops": m.get("per_token_flops"),
        "wall_time_s": m.get("wall_time_s")})
    return {"preset": p.name, "current_root": str(current), "current_hash": current_hash,
            "built": (cache.read_json(current / "manifest.json") or {}).get("hash") == current_hash,
            "builds": builds}
