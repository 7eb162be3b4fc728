"""The settings of a run (`drift bench`, `ablate`, `analyze`, a suite's cell): each declared once.

Every field of `BenchConfig` carries its flag, help, default and check (`drift_cli.knobs`), as
the methods' settings do. From them come the options of the commands that run models
(`drift_cli.commands.options.bench_config_options`), their `--help`, and the type checks of a
suite's settings (`drift_cli.suite.spec`). This module imports neither torch nor click: a bad
flag is refused before any model library loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from drift_cli import knobs
from drift_cli.devices import DEVICE, DTYPES, check_device, resolve_dtype
from drift_cli.eagle.layout import DRAFT_KINDS
from drift_cli.errors import BadInput
from drift_cli.knobs import Settings, at_least, between, finite, knob
from drift_cli.zoo.presets import DEFAULT_ZOO

DEFAULT_SCENARIO = "jargon"        # the stream a run uses when given neither --scenario nor --corpus
CONTROL_SCENARIO = "indist"
SPLITS = ("train", "dev", "test")
DRAFTERS = ("layer", "eagle")      # --drafter: the zoo's layer draft or its EAGLE-3 head
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4
MIN_TOP_P = 1e-6
MAX_THREADS = 1024
SEED_LIMIT = 2**63


def parse_sizes(text: str) -> tuple[int, ...]:
    """--batch-sizes 1,2,4 -> (1, 2, 4); BadInput on anything but integers."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise BadInput(f"--batch-sizes must be comma-separated integers (got {text!r})") from None


def _temperature(t: float) -> bool:
    return t == 0.0 or (finite(t) and MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)


def _sizes(sizes: tuple[int, ...]) -> bool:
    return bool(sizes) and min(sizes) >= 1 and len(set(sizes)) == len(sizes)


@dataclass
class BenchConfig(Settings):
    # the stream
    scenario: str | None = knob(DEFAULT_SCENARIO, "--scenario", "scenario name (see `drift data list`)")
    corpus: str | None = knob(None, "--corpus", "ad-hoc shifted scenario from a text file, directory or JSONL "
                              "(instead of --scenario)")
    split: str = knob("test", "--split", "the scenario's split", choices=SPLITS)
    max_prompts: int | None = knob(None, "--max-prompts", "use the first N prompts of the stream",
                                   ok=at_least(1), kind=int, rule="must be >= 1")
    max_new_tokens: int | None = knob(None, "--max-new-tokens", "override the scenario's generation length",
                                      ok=at_least(1), kind=int, rule="must be >= 1")
    # 0: the scenario's own stream; N > 0: stream shuffle N (another draw of the split)
    shuffle: int = knob(0, "--shuffle", "stream shuffle N: another draw of the split's documents "
                        "(0 = the scenario's stream)", ok=between(0, 2**31 - 1), rule="must be in [0, 2^31)")
    methods: str = knob("all", "--methods", "'all' or a comma-separated list")
    control: bool = knob(True, "--control", "also run ar and vanilla on the indist control stream",
                         off_flag="--no-control")
    # a target-change stream: prompts N, N+1, ... use the changed target
    switch_after: int | None = knob(None, "--switch-target-after", "a target-change stream: prompts N, N+1, ... "
                                    "are verified by the changed target", dest="switch_after",
                                    ok=at_least(1), kind=int, rule="must be >= 1")
    # the change: bf16, int8 or finetune:DOMAIN (zoo/target_change.py)
    switch_target: str | None = knob(None, "--switch-target", "the changed target: bf16, int8 or finetune:DOMAIN "
                                     "(built once, cached by recipe)")
    # the models
    zoo: str = knob(DEFAULT_ZOO, "--zoo", "built-in model zoo preset: smollm (the real pair, SmolLM2-135M), "
                    "micro or small (toys, for tests)")
    # a pretrained preset's draft cut from this many target layers (its -dN variant)
    draft_layers: int | None = knob(None, "--draft-layers", "pretrained presets: a draft cut from this many of the "
                                    "target's layers instead of the preset's (the zoo PRESET-dN, built and cached "
                                    "on first use)", ok=between(1, 4096), kind=int, rule="must be in [1, 4096]")
    # the zoo's drafter on a pretrained preset: its layer draft, or an EAGLE-3 head (docs/eagle.md)
    drafter: str = knob("layer", "--drafter", "pretrained presets: the zoo's drafter: layer (a draft cut from the "
                        "target's first layers) or eagle (an EAGLE-3 head that drafts from the target's hidden "
                        "states; built once from the same labels, cached)", choices=DRAFTERS)
    draft: str | None = knob(None, "--draft", "draft checkpoint (local Hugging Face dir or GGUF file), or an EAGLE "
                             "head's directory (config.json + weights, as vLLM, SGLang and SpecForge write them)")
    draft_kind: str = knob("auto", "--draft-kind", "what --draft is: auto (a head if its config or weights say so, "
                           "else a draft model), eagle (an EAGLE-1 head) or eagle3 (an EAGLE-3 head)",
                           choices=DRAFT_KINDS)
    target: str | None = knob(None, "--target", "target checkpoint (local Hugging Face dir or GGUF file)")
    device: str = knob("auto", "--device", "cpu, cuda, cuda:N, or auto", ok=lambda d: bool(DEVICE.match(d)),
                       rule="must be cpu, cuda, cuda:N or auto")
    # auto: bfloat16 on CUDA, float32 on the CPU (`devices.resolve_dtype`)
    dtype: str = knob("auto", "--dtype", "weights' dtype; auto = bfloat16 on CUDA, float32 on the CPU",
                      choices=("auto", *DTYPES))
    # torch CPU threads; None: 1 on the CPU (see docs/engine.md)
    threads: int | None = knob(None, "--threads", "torch CPU threads (default 1 on the CPU)",
                               ok=between(1, MAX_THREADS), kind=int, rule=f"must be in [1, {MAX_THREADS}]")
    # a neutral load on a second thread while each method runs (drift_cli/engine/load.py)
    background_load: bool = knob(False, "--background-load", "run every method with a second thread busy doing "
                                 "matmuls of the draft's shape (a neutral load, the fair budget against "
                                 "osd --osd-async; its CPU seconds go into the method's report)")
    # decoding
    gamma: int = knob(4, "--gamma", "draft block size", ok=at_least(1), rule="must be >= 1")
    batch_size: int = knob(1, "--batch-size", "rows decoded together (continuous batching over the stream)",
                           ok=at_least(1), rule="must be >= 1")
    # --batch-sizes: the batch-size curve (each B, every method)
    batch_sizes: tuple[int, ...] | None = knob(None, "--batch-sizes", "comma-separated batch sizes: the batch-size "
                                               "curve (every method at each size)", kind=tuple, parse=parse_sizes,
                                               ok=_sizes, rule="must list distinct sizes >= 1")
    temperature: float = knob(0.0, "--temperature", "0 = greedy", ok=_temperature,
                              rule=f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
    top_p: float | None = knob(None, "--top-p", "nucleus sampling threshold", kind=float,
                               ok=between(MIN_TOP_P, 1.0), rule=f"must be in [{MIN_TOP_P:g}, 1] (a smaller "
                               "nucleus is the top token alone: that is --temperature 0)")
    seed: int = knob(0, "--seed", "sampling seed", ok=between(0, SEED_LIMIT - 1), rule="must be in [0, 2^63)")
    out: Path = knob(Path("results"), "--out", "results root: runs go to OUT/<scenario>/<run id>/")
    options: dict[str, Any] = field(default_factory=dict)   # method options (--gain, --osd-lr, ...)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "BenchConfig":
        """Parsed option values (None = not given) -> a config, unchecked: this class's knobs by
        option name, every other option a method option. --corpus without --scenario replaces
        the default scenario."""
        mine = {k.name: f.name for f, k in knobs.knobs(cls)}
        given = {mine[k]: v for k, v in options.items() if k in mine and v is not None}
        if given.get("corpus") is not None and "scenario" not in given:
            given["scenario"] = None
        return cls(**given, options={k: v for k, v in options.items() if k not in mine})

    def validate(self, policies: Collection[str] | None = None, unread_ok: bool = False) -> None:
        """Every check that needs no model (BadInput, one line). policies: the γ controllers the
        run selects (default: --gamma-policy's), for the check of flags nobody reads; unread_ok:
        skip that check (a suite's cell: the suite checks it over all its cells)."""
        knobs.check(self)
        if (self.scenario is None) == (self.corpus is None):
            raise BadInput("give exactly one of --scenario NAME or --corpus PATH")
        if (self.draft is None) != (self.target is None):
            raise BadInput("give both --draft and --target, or neither (then --zoo is used)")
        if self.draft is not None and self.draft_layers is not None:
            raise BadInput("--draft-layers picks a zoo draft: it does not apply with --draft/--target")
        check_drafter(self)
        if (self.switch_after is None) != (self.switch_target is None):
            raise BadInput("give both --switch-target-after N and --switch-target KIND, or neither")
        self.zoo_name()
        from drift_cli.methods import resolve_methods

        resolve_methods(self.methods)
        given = {k for k, v in self.options.items() if v is not None}
        for settings in self.configs().values():      # bounds a setting takes from --gamma
            if hasattr(settings, "check_gamma"):
                settings.check_gamma(self.gamma, given)
        if not unread_ok:
            check_unread_options(self, policies)
        check_bank_out(self)
        check_worker_threads(self)
        self.target_change()
        check_device(self.device)               # last: it may ask torch (the others need none)

    def check(self, policies: Collection[str] | None = None) -> None:
        """`validate`, then the scenario and the zoo preset looked up: what `drift bench` checks
        before it loads a model."""
        self.validate(policies)
        from drift_cli import scenarios

        if self.corpus is None:
            scenarios.load_scenario(self.scenario)
        check_preset(self)

    def zoo_name(self) -> str:
        """The zoo preset the run uses: --zoo, or its draft-size variant for --draft-layers."""
        from drift_cli.zoo.presets import draft_variant

        try:
            return draft_variant(self.zoo, self.draft_layers)
        except ValueError as e:
            raise BadInput(str(e)) from None

    def target_change(self):
        """The parsed --switch-target (None without one); BadInput on a bad pair of flags."""
        if self.switch_after is None:
            return None
        from drift_cli.zoo.target_change import TargetChange

        return TargetChange.parse(self.switch_target)

    def configs(self) -> dict[type, Any]:
        """Every registered method's settings from `options`, validated (BadInput)."""
        from drift_cli.methods import settings_classes

        return {c: c.from_options(self.options).validate() for c in settings_classes()}

    @property
    def device_name(self) -> str:
        if self.device == "auto":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    @property
    def dtype_name(self) -> str:
        """The weights' dtype the run loads: --dtype, with auto resolved by the device."""
        return resolve_dtype(self.dtype, self.device_name)


def check_drafter(cfg: BenchConfig) -> None:
    """--drafter picks a zoo's drafter, --draft-kind describes --draft PATH: each where it applies."""
    if cfg.draft is not None and cfg.drafter != "layer":
        raise BadInput("--drafter picks a zoo's drafter; with --draft PATH give --draft-kind (auto, eagle, eagle3)")
    if cfg.draft is None and cfg.draft_kind != "auto":
        raise BadInput(f"--draft-kind {cfg.draft_kind} describes --draft PATH; a zoo's head is --drafter eagle")
    if cfg.drafter == "eagle":
        from drift_cli.zoo.presets import PRETRAINED, pretrained_preset

        if cfg.draft_layers is not None:
            raise BadInput("--draft-layers sizes the layer draft; --drafter eagle drafts with a head")
        if pretrained_preset(cfg.zoo) is None or cfg.zoo not in PRETRAINED:
            raise BadInput(f"--drafter eagle applies to the pretrained presets ({', '.join(PRETRAINED)}); the "
                           f"'{cfg.zoo}' zoo has no head (run a head by path: --draft HEAD --target TARGET)")
        if cfg.options.get("offline_on_policy"):
            raise BadInput("--offline-on-policy: an EAGLE head's offline heads train on the target's own text "
                           "and trajectories (a head cannot generate without the target)")
    if cfg.draft is not None:
        from drift_cli.eagle.layout import resolve_kind

        resolve_kind(cfg.draft, cfg.draft_kind)


def check_preset(cfg: BenchConfig) -> None:
    """A zoo preset that exists (unless --draft/--target are given)."""
    if cfg.draft is None:
        from drift_cli.registry import unknown
        from drift_cli.zoo.presets import preset_names, pretrained_preset

        if cfg.zoo not in preset_names() and pretrained_preset(cfg.zoo) is None:
            raise unknown("preset", cfg.zoo, preset_names())


def unread_option(cfg: BenchConfig, policies: Collection[str] | None = None, only: str | None = None) -> str | None:
    """The first method or controller flag given that nothing in the run reads, as the message
    naming it and who would read it; None when every given flag is read. Defaults (None) are
    not given; a zoo preset's method defaults count as given values of the selector. only: judge
    this option alone (the others still select what runs: --hybrid-rule, --hybrid-model...)."""
    from drift_cli.methods import owners, resolve_methods, settings_classes, with_sources
    from drift_cli.zoo.presets import method_defaults

    named = set(resolve_methods(cfg.methods))
    running = with_sources(named, cfg.options)
    preset = method_defaults(cfg.zoo_name() if cfg.draft is None else None)
    readers: dict[str, list[str]] = {}           # option name -> the methods that read it (a flag may be shared)
    given = []
    for cls in settings_classes():
        for f, k in knobs.knobs(cls):
            readers.setdefault(k.name, []).extend(owners(cls))
            if cfg.options.get(k.name) is not None and k.name not in {g[2].name for g in given}:
                given.append((cls, f, k))
    for cls, f, k in given:
        if only is not None and k.name != only:
            continue
        users = readers[k.name]
        if users and not (named if getattr(cls, "method_only", False) else running) & set(users):
            names = ", ".join(users[:-1]) + " and " + users[-1] if len(users) > 1 else users[0]
            who = names + (" methods, which" if len(users) > 1 else " method, which")
            return f"{k.flag} is only used by the {who} --methods {cfg.methods} does not run"
        if k.needs is not None:
            sel_f, sel = knobs.find(cls, k.needs[0])
            wanted = k.needed()
            value = cfg.options.get(sel.name)
            value = preset.get(sel.name, knobs.default_of(sel_f)) if value is None else value
            selected = set(policies) if policies is not None and sel.flag == "--gamma-policy" else {value}
            if not selected & set(wanted):
                return (f"{k.flag} is only used by the {' or '.join(wanted)} {sel.selects}, which "
                        f"{sel.flag} {','.join(sorted(selected))} does not select")
    return unread_tree_option(cfg, running, only)


def unread_tree_option(cfg: BenchConfig, running: set[str], only: str | None = None) -> str | None:
    """The tree flags (`TreeConfig`) nothing reads: any of them without --tree-nodes N > 0;
    --tree-shape / --tree-branch when no method drafts trees from a draft model (`suffix` and
    `pld` grow their own); --tree-learn when no drift bank runs (the method, or hybrid's model)."""
    from drift_cli.engine.tree import TreeConfig

    # the draft-model drafters (hybrid's model source is in `running`); a plugin may read them too
    model = running - {"ar", "pld", "suffix", "hybrid"}
    for f, k in knobs.knobs(TreeConfig):
        if cfg.options.get(k.name) is None or k.name == "tree_nodes" or only not in (None, k.name):
            continue
        if not cfg.options.get("tree_nodes"):
            return f"{k.flag} shapes token trees, which only --tree-nodes N (N > 0) turns on"
        if k.name in ("tree_shape", "tree_branch") and not model:
            return (f"{k.flag} shapes the trees a draft model grows; --methods {cfg.methods} runs none "
                    "(suffix and pld grow their own)")
        if k.name == "tree_learn" and "drift" not in running:
            hybrid = " (hybrid runs it as --hybrid-model drift)" if "hybrid" in running else ""
            return (f"{k.flag} is only used by the drift method (its bank on trees), which --methods {cfg.methods} "
                    f"does not run{hybrid}")
    return None


def check_unread_options(cfg: BenchConfig, policies: Collection[str] | None = None) -> None:
    message = unread_option(cfg, policies)
    if message:
        raise BadInput(message)


def check_worker_threads(cfg: BenchConfig) -> None:
    """--osd-threads: torch's thread count is process-wide, so osd's worker thread runs with the
    run's (--threads); another value cannot be honoured and is refused (docs/osd.md)."""
    worker = cfg.options.get("osd_threads")
    if worker is not None and worker != (cfg.threads or 1):
        raise BadInput(f"--osd-threads {worker}: torch's thread count is process-wide, so the osd worker thread "
                       f"runs with the run's --threads ({cfg.threads or 1}); give them equal")


def check_bank_out(cfg: BenchConfig) -> None:
    """--bank-out must name a new or regular file, or a directory, in a writable place, and none
    of the run's inputs (--bank-in among them: a run never replaces what it read)."""
    from drift_cli.atomic import check_output_target, refuse_inputs

    bank_out = cfg.options.get("bank_out")
    if bank_out is not None:
        refuse_inputs(bank_out, [("--bank-in", cfg.options.get("bank_in")), ("--corpus", cfg.corpus),
                                 ("--draft", cfg.draft), ("--target", cfg.target),
                                 ("--offline-draft", cfg.options.get("offline_draft"))], "--bank-out")
    if bank_out is not None and not Path(bank_out).is_dir():   # a directory holds one file per tenant
        check_output_target(Path(bank_out), "--bank-out")
        parent = Path(bank_out).parent
        if parent.exists() and not os.access(parent, os.W_OK):
            raise BadInput(f"--bank-out {bank_out}: directory {parent} is not writable")


