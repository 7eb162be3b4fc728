"""`drift zoo build|list|install|change-target`: train, install and inspect the built-in model zoo
(registered by drift_cli.cli)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from drift_cli.atomic import strict_json
from drift_cli.console import ProgressCallback, rich_progress, row_table
from drift_cli.methods.settings import DIVERGENCES
from drift_cli.zoo.presets import DEFAULT_ZOO


@click.group("zoo")
def zoo() -> None:
    """Build and list the built-in model zoo (tokenizer, target, draft, offline drafts)."""


@zoo.command("build")
@click.option("--preset", default=DEFAULT_ZOO, show_default=True,
              help="smollm | micro | small | large (smollm-dN: its draft cut from N target layers)")
@click.option("--offline", "offline_scenarios", multiple=True, metavar="SCENARIO",
              help="Also distil an offline draft for this scenario (repeatable).")
@click.option("--divergence", type=click.Choice(DIVERGENCES), default="fkl", show_default=True,
              help="Distillation divergence for --offline drafts.")
@click.option("--on-policy", is_flag=True, help="Offline drafts also train on their own samples.")
@click.option("--from-source", is_flag=True,
              help="A pretrained preset's draft is distilled here, not installed from its shipped tensors.")
@click.option("--ship", is_flag=True,
              help="Write the built draft's trained tensors as the preset's shipped draft (drift_cli/zoo/shipped/).")
@click.option("--drafter", type=click.Choice(["layer", "eagle"]), default="layer", show_default=True,
              help="eagle: a pretrained preset's EAGLE-3 head (and --offline heads) instead of its layer draft")
@click.option("--json", "as_json", is_flag=True, help="Print the build manifest as JSON.")
def build(preset: str, offline_scenarios: tuple[str, ...], divergence: str, on_policy: bool, from_source: bool,
          ship: bool, drafter: str, as_json: bool) -> None:
    """Build the zoo for PRESET (a no-op when the cached recipe is unchanged)."""
    from drift_cli.errors import BadInput
    from drift_cli.zoo import ensure_offline_draft, ensure_zoo
    from drift_cli.zoo.cache import read_json
    from drift_cli.zoo.presets import PRETRAINED, pretrained_preset

    if ship and pretrained_preset(preset) is None:
        raise BadInput(f"--ship applies to the pretrained presets; the '{preset}' zoo is built from source")
    if drafter == "eagle":
        if preset not in PRETRAINED:
            raise BadInput(f"--drafter eagle applies to the pretrained presets ({', '.join(PRETRAINED)})")
        if on_policy or ship or from_source:
            raise BadInput("--drafter eagle builds a head: --on-policy, --ship and --from-source are the layer draft's")
        _build_heads(PRETRAINED[preset], offline_scenarios, divergence, as_json)
        return
    with rich_progress(transient=False) as bars:
        progress = ProgressCallback(bars)
        pair = ensure_zoo(preset, progress=progress, from_source=from_source or ship)
        offline = [ensure_offline_draft(preset, s, divergence, on_policy, progress=progress) for s in offline_scenarios]
    if ship:
        from drift_cli.zoo.shipped import write_shipped

        Console(stderr=True).print(f"shipped draft written: {write_shipped(preset, pair.draft)}", highlight=False)
    manifest = read_json(pair.root / "manifest.json")
    if as_json:
        click.echo(strict_json(manifest, indent=2, sort_keys=True))
        return
    out = Console()
    out.print(_manifest_table(manifest))
    out.print(f"zoo: {pair.root}")
    for path in offline:
        out.print(f"offline draft: {path}")


@zoo.command("install")
@click.argument("source", type=click.Path(path_type=Path))
def install(source: Path) -> None:
    """Install a built zoo (a directory holding manifest.json, tokenizer/, target/, draft/) into the
    cache: e.g. the committed micro pair, results/baselines/micro, or a build copied from another
    machine. Pin files, not recipes: a rebuild on another CPU gives other weights."""
    from drift_cli.zoo.build import install_zoo, is_current_build

    pair = install_zoo(source)
    state = ("it is this machine's current build of the preset" if is_current_build(pair) else
             "this machine's scenario data give another recipe, so --zoo rebuilds; use the files by path")
    Console().print(f"installed zoo '{pair.preset}': {pair.root} ({state})", highlight=False)


@zoo.command("change-target")
@click.option("--preset", default=DEFAULT_ZOO, show_default=True, help="the zoo whose target is changed")
@click.option("--target", "target_path", default=None, help="or a target checkpoint (directory or GGUF file)")
@click.option("--change", required=True, help="bf16, int8 or finetune:DOMAIN")
@click.option("--json", "as_json", is_flag=True, help="Print the changed target's build record as JSON.")
def change_target(preset: str, target_path: str | None, change: str, as_json: bool) -> None:
    """Build (once, cached by recipe) the target re-quantised or briefly fine-tuned; print its path."""
    from drift_cli.zoo import ensure_zoo
    from drift_cli.zoo.cache import read_json
    from drift_cli.zoo.target_change import TargetChange, ensure_changed_target

    recipe = TargetChange.parse(change)
    with rich_progress(transient=False) as bars:
        progress = ProgressCallback(bars)
        base = target_path or ensure_zoo(preset, progress=progress).target
        path = ensure_changed_target(base, recipe, progress)
    if as_json:
        click.echo(strict_json({"path": str(path), **(read_json(path / "build.json") or {})}, indent=2, sort_keys=True))
        return
    Console().print(f"changed target ({recipe.label}): {path}", highlight=False)


def _build_heads(p, offline_scenarios: tuple[str, ...], divergence: str, as_json: bool) -> None:
    """`--drafter eagle`: the preset's EAGLE-3 head and its offline heads, each cached by recipe."""
    from drift_cli.zoo.cache import read_json
    from drift_cli.zoo.pretrained import ensure_pretrained_head, ensure_pretrained_offline_head

    with rich_progress(transient=False) as bars:
        progress = ProgressCallback(bars)
        head = ensure_pretrained_head(p, progress)
        offline = [ensure_pretrained_offline_head(p, s, divergence, progress) for s in offline_scenarios]
    records = {str(path): read_json(path / "build.json") for path in [head, *offline]}
    if as_json:
        click.echo(strict_json(records, indent=2, sort_keys=True))
        return
    table = row_table(f"zoo '{p.name}': EAGLE-3 heads",
                      ("head", "vocabulary", "label tokens", "agreement before -> after", "build s"))
    for path, b in records.items():
        table.add_row(path, f"{b['vocab']:,}", f"{b['label_tokens']:,}",
                      f"{b['agreement_before']:.3f} -> {b['agreement_after']:.3f}", f"{b['wall_time_s']:.1f}")
    Console().print(table)


def _manifest_table(manifest: dict) -> Table:
    if "loss_curves" not in manifest:
        return _pretrained_table(manifest)
    table = Table(title=f"zoo '{manifest['preset']}' ({manifest['hash'][:12]})")
    for col in ("model", "parameters", "FLOPs/token", "train tokens", "final loss", "build s"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for name in ("target", "draft"):
        curve = manifest["loss_curves"][name]
        table.add_row(name, f"{manifest['parameters'][name]:,}", f"{manifest['per_token_flops'][name]:,}",
                      f"{manifest['train_tokens'][name]:,}", f"{curve[-1][1]:.3f}" if curve else "-",
                      f"{manifest['wall_time_s'][name]:.1f}")
    table.caption = f"draft/target compute per token: {manifest['per_token_flops']['draft_over_target']:.3f}"
    return table


def _pretrained_table(manifest: dict) -> Table:
    """A zoo on a pretrained target: the shipped target, the draft cut from it and distilled."""
    d = manifest["draft"]
    table = row_table(f"zoo '{manifest['preset']}' ({manifest['hash'][:12]})",
                      ("model", "layers", "vocabulary", "label tokens", "agreement before -> after", "build s"))
    table.add_row("target", "-", "-", "-", f"gguf sha256 {manifest['target']['sha256'][:12]}", "-")
    table.add_row("draft", str(d["layers"]), f"{d['vocab']:,}", f"{d['label_tokens']:,}",
                  f"{d['agreement_before']:.3f} -> {d['agreement_after']:.3f}", f"{d['wall_time_s']:.1f}")
    return table


@zoo.command("list")
@click.option("--preset", default=None, help="Only this preset (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def list_(preset: str | None, as_json: bool) -> None:
    """Presets, whether the current recipe is built, and every cached build."""
    from drift_cli.zoo import preset_names, zoo_status

    statuses = [zoo_status(p) for p in ([preset] if preset else preset_names())]
    if as_json:
        click.echo(strict_json(statuses, indent=2, sort_keys=True))
        return
    table = Table(title="drift zoo")
    for col in ("preset", "current recipe", "built", "target params", "draft params", "offline drafts"):
        table.add_column(col)
    for s in statuses:
        current = next((b for b in s["builds"] if b["current"]), None)
        params = (current or {}).get("parameters") or {}
        table.add_row(s["preset"], s["current_hash"][:12], "yes" if s["built"] else "no",
                      _count(params.get("target")), _count(params.get("draft")),
                      ", ".join((current or {}).get("offline", [])) or "-")
    Console().print(table)


list_.name = "list"


def _count(n: int | None) -> str:
    return f"{n:,}" if n else "-"


@zoo.command("shift")
@click.option("--preset", default=DEFAULT_ZOO, show_default=True)
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
              help="Scenarios to measure (repeatable; default: indist code law jargon temporal).")
@click.option("--split", type=click.Choice(["train", "dev", "test"]), default="dev", show_default=True)
@click.option("--max-prompts", type=click.IntRange(min=1), default=40, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None, help="Default: the stream's.")
@click.option("--gamma", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--offline", type=click.Choice(DIVERGENCES), default=None,
              help="Also measure offline drafts distilled with this divergence (built if missing).")
@click.option("--json", "as_json", is_flag=True)
def shift(preset, scenarios, split, max_prompts, max_new_tokens, gamma, offline, as_json) -> None:
    """Greedy acceptance of the zoo draft vs its target per scenario (no timing): is the shift real?"""
    from drift_cli.zoo.shift import SHIFTED, shift_report

    with rich_progress(transient=False) as bars:
        progress = ProgressCallback(bars)
        report = shift_report(preset, tuple(scenarios) or ("indist",) + SHIFTED, split, max_prompts, gamma,
                              offline, max_new_tokens, progress)
    if as_json:
        click.echo(strict_json(report, indent=2, sort_keys=True))
        return
    table = row_table(f"greedy acceptance, zoo '{preset}', {split} split, gamma={gamma}",
                      ("scenario", "alpha (base)", "gap vs indist", "token agreement", "alpha (offline)", "offline gain"))
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for name, row in report["scenarios"].items():
        table.add_row(name, fmt(row["base"]["acceptance_rate"]), fmt(row["gap_vs_indist"]),
                      fmt(row["base"]["token_agreement"]),
                      fmt(row["offline"]["acceptance_rate"]) if "offline" in row else "-", fmt(row["offline_gain"]))
    Console().print(table)
