"""`drift data build|list`: extract the scenario suite and show what is built (registered by drift_cli.cli)."""

from __future__ import annotations


import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drift_cli.atomic import strict_json
from drift_cli.console import row_table
from drift_cli.errors import BadInput

SPLITS = ("train", "dev", "test")


def _leaves(names: tuple[str, ...]) -> list:
    """The scenarios to build: named ones (all by default), mixed ones expanded to components."""
    from drift_cli.scenarios import load_scenario, scenario_names

    out: dict[str, object] = {}
    for name in names or tuple(scenario_names()):
        sc = load_scenario(name)
        for leaf in ([load_scenario(c) for c in sc.components] if sc.components else [sc]):
            out.setdefault(leaf.name, leaf)
    return list(out.values())


def build_summary(b) -> dict:
    return {"scenario": b.scenario.name, "version": b.scenario.version, "key": b.key,
            "built": b.built, "sources_extracted": b.sources_built, "directory": str(b.directory),
            "splits": {s: {"documents": m["documents"], "text_bytes": m["text_bytes"], "sha256": m["sha256"]}
                       for s, m in b.manifests.items()}}


@click.group("data")
def data() -> None:
    """Extract the scenario suite from real text on this machine and list it."""


@data.command("build")
@click.argument("scenarios", nargs=-1)
@click.option("--force", is_flag=True, help="Re-extract even when the cache is current.")
@click.option("--prune", is_flag=True, help="Afterwards, delete superseded builds from the cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the build summary as JSON (only that on stdout).")
def build(scenarios: tuple[str, ...], force: bool, prune: bool, as_json: bool) -> None:
    """Extract SCENARIOS (default: all), split them and write per-split manifests."""
    from drift_cli.scenarios.build import build_scenario, prune_cache

    leaves = _leaves(scenarios)
    console = Console(stderr=True)
    results = []
    bars = Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console)
    with bars:
        for sc in leaves:
            task = bars.add_task(sc.name, total=len(sc.sources), note="")

            def advance(sb, task=task):
                bars.update(task, advance=1, note=f"{sb.spec.id}: {'extracted' if sb.built else 'cached'}")

            results.append(build_scenario(sc, force=force, on_source=advance))
    summaries = [build_summary(b) for b in results]
    if prune:
        removed = prune_cache()
        console.print(f"pruned {len(removed)} superseded cache entries")
    if as_json:
        click.echo(strict_json(summaries, indent=2, sort_keys=True))
        return
    table = Table(title="drift data build")
    for col in ("scenario", "status", *(f"{s} docs" for s in SPLITS), "cache key"):
        table.add_column(col, justify="right" if "docs" in col else "left")
    for s in summaries:
        status = "built" if s["built"] else "cached"
        table.add_row(s["scenario"], status, *(str(s["splits"][x]["documents"]) for x in SPLITS), s["key"][:12])
    Console().print(table)


def list_rows() -> list[dict]:
    """One row per scenario: sources present, and per-split documents/bytes if built."""
    from drift_cli.scenarios import load_scenario, scenario_names
    from drift_cli.scenarios.build import cached_manifests, latest_build

    rows = []
    for name in scenario_names():
        sc = load_scenario(name)
        row = {"scenario": name, "version": sc.version, "description": sc.description,
               "components": list(sc.components), "sources": "present", "missing": None, "splits": None}
        leaves = [load_scenario(c) for c in sc.components] if sc.components else [sc]
        manifests = []
        for leaf in leaves:
            try:
                manifests.append(cached_manifests(leaf))
            except BadInput as e:
                snapshot = latest_build(leaf)
                row["sources"] = "snapshot" if snapshot and row["sources"] != "missing" else "missing"
                row["missing"] = str(e)
                manifests.append(snapshot.manifests if snapshot else None)
        if all(m is not None for m in manifests):
            row["splits"] = {s: {"documents": sum(m[s]["documents"] for m in manifests),
                                 "text_bytes": sum(m[s]["text_bytes"] for m in manifests)} for s in SPLITS}
        rows.append(row)
    return rows


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}M"


@data.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def list_(as_json: bool) -> None:
    """Show every scenario: version, whether its sources are installed (or only a cached
    snapshot of the same recipe is), documents/bytes per split."""
    rows = list_rows()
    if as_json:
        click.echo(strict_json(rows, indent=2, sort_keys=True))
        return
    table = Table(title="drift data list")
    table.add_column("scenario")
    table.add_column("v", justify="right")
    table.add_column("sources")
    for s in SPLITS:
        table.add_column(f"{s} docs / text", justify="right")
    for r in rows:
        if r["splits"]:
            cells = [f"{r['splits'][s]['documents']} / {_mb(r['splits'][s]['text_bytes'])}" for s in SPLITS]
        else:
            cells = ["not built (drift data build)" if r["sources"] != "missing" else "-", "", ""]
        name = r["scenario"] + (f" ({'+'.join(r['components'])})" if r["components"] else "")
        status = {"present": "[green]present[/]", "snapshot": "[yellow]snapshot[/]"}.get(r["sources"], "[red]missing[/]")
        table.add_row(name, str(r["version"]), status, *cells)
    console = Console()
    console.print(table)
    for r in rows:
        if r["missing"]:
            console.print(f"[red]{r['scenario']}[/]: {r['missing']}")


@data.command("shift")
@click.argument("scenarios", nargs=-1)
@click.option("--split", default="test", show_default=True, type=click.Choice(SPLITS))
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def shift(scenarios: tuple[str, ...], split: str, as_json: bool) -> None:
    """Lexical shift of each scenario's split against the draft's training text (model-free)."""
    from drift_cli.scenarios import documents, draft_training_documents, scenario_names
    from drift_cli.scenarios.shift import ReferenceText, lexical_shift

    ref = ReferenceText.of(draft_training_documents())
    rows = {name: lexical_shift(documents(name, split), ref).to_json() for name in scenarios or scenario_names()}
    if as_json:
        click.echo(strict_json(rows, indent=2, sort_keys=True))
        return
    table = row_table(f"lexical shift of the {split} split vs the draft's training text",
                      ("scenario", "docs", "words", "word OOV", "bigrams seen", "unigram CE (nats)"))
    for name, r in rows.items():
        table.add_row(name, str(r["documents"]), str(r["words"]), f"{r['word_oov']:.3f}",
                      f"{r['bigram_seen']:.3f}", f"{r['unigram_ce_nats']:.2f}")
    Console().print(table)
