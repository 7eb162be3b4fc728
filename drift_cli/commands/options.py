"""Click options shared by the commands that run models (bench, ablate, analyze)."""

from __future__ import annotations

from pathlib import Path

import click

from drift_cli.knobs import Knob, default_of, knobs, problem


def knob_option(k: Knob, default) -> click.Option:
    """The click option of one knob: default None (= keep the settings' default), the knob's own
    check at parse time (a bad value is a usage error: one line, exit 2)."""
    def validate(ctx, param, value):
        message = problem(k, value)
        if message:
            raise click.BadParameter(message.removeprefix(f"{k.flag} "))
        return value

    shown = "" if default is None else f" [default: {default}]"
    if k.kind is bool:
        decls = [f"{k.flag}/{k.off_flag}"] if k.off_flag else [k.flag]
        return click.Option(decls, is_flag=True, default=None, help=k.help + shown, callback=validate)
    kind = {float: click.FLOAT, int: click.INT, Path: click.Path(path_type=Path)}.get(k.kind, click.STRING)
    if k.choices is not None:
        kind = click.Choice(k.choices)
    return click.Option([k.flag], type=kind, default=None, help=k.help + shown, callback=validate)


def settings_options(classes, skip: tuple[str, ...] = ()) -> list[click.Option]:
    """The click options of these settings classes' knobs, in order, each option name once."""
    out, seen = [], set(skip)
    for cls in classes:
        for f, k in knobs(cls):
            if k.cli and k.name not in seen:
                seen.add(k.name)
                out.append(knob_option(k, default_of(f)))
    return out


def method_cli_options(method) -> list[click.Option]:
    """One method's click options (from its settings classes)."""
    return settings_options(method.configs)


def add_options(fn, opts: list[click.Option]):
    for opt in reversed(opts):
        fn.__click_params__ = getattr(fn, "__click_params__", []) + [opt]
    return fn


def method_options(fn):
    """Every registered method's settings as click options (each declared once, on its dataclass)."""
    from drift_cli.methods import settings_classes

    return add_options(fn, settings_options(settings_classes()))


def ablate_options(fn):
    """Every registered method's settings (the γ controller's included) without --bank-out (ablate)."""
    from drift_cli.methods import settings_classes

    return add_options(fn, settings_options(settings_classes(), skip=("bank_out",)))


def drift_options(fn):
    """DRIFT's settings as click options, without --bank-out (ablate, analyze)."""
    from drift_cli.drift.config import DriftConfig, DriftFiles

    return add_options(fn, settings_options([DriftConfig, DriftFiles], skip=("bank_out",)))


def model_options(fn):
    opts = [
        click.option("--zoo", "zoo", default="small", show_default=True, help="built-in model zoo preset"),
        click.option("--draft-layers", "draft_layers", type=int, default=None,
                     help="pretrained presets: a draft cut from this many of the target's layers instead of the "
                          "preset's (the zoo PRESET-dN, built and cached on first use)"),
        click.option("--draft", type=str, default=None, help="draft checkpoint (local Hugging Face dir)"),
        click.option("--target", type=str, default=None, help="target checkpoint (local Hugging Face dir)"),
        click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, or auto"),
        click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16, float16"),
        click.option("--threads", type=int, default=None, help="torch CPU threads (default 1 on the CPU)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def decode_options(fn):
    opts = [
        click.option("--split", default="test", show_default=True, help="train, dev or test"),
        click.option("--max-prompts", type=int, default=None, help="use the first N prompts of the stream"),
        click.option("--max-new-tokens", type=int, default=None, help="override the scenario's generation length"),
        click.option("--gamma", type=int, default=4, show_default=True, help="draft block size"),
        click.option("--batch-size", type=int, default=1, show_default=True,
                     help="rows decoded together (continuous batching over the stream)"),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy"),
        click.option("--top-p", type=float, default=None, help="nucleus sampling threshold"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", type=click.Path(path_type=Path), default=Path("results"), show_default=True),
        click.option("--json", "as_json", is_flag=True, help="print run.json to stdout (and nothing else)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def bench_options(fn):
    """Every option of `drift bench` (suites type-check their settings against these)."""
    opts = [
        click.option("--scenario", default=None, help="scenario name (see `drift data list`); default jargon"),
        click.option("--corpus", default=None, help="ad-hoc shifted scenario from a text file, directory or JSONL"),
        click.option("--methods", default="all", show_default=True, help="'all' or a comma-separated list"),
        click.option("--no-control", is_flag=True, help="skip the indist control stream"),
        click.option("--batch-sizes", default=None,
                     help="comma-separated batch sizes: the batch-size curve (every method at each size)"),
        click.option("--shuffle", type=int, default=0, show_default=True,
                     help="stream shuffle N: another draw of the split's documents (0 = the scenario's stream)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return switch_options(model_options(decode_options(method_options(fn))))


def switch_options(fn):
    """A target-change stream (`drift bench`, `drift ablate`)."""
    opts = [
        click.option("--switch-target-after", "switch_after", type=int, default=None,
                     help="a target-change stream: prompts N, N+1, ... are verified by the changed target"),
        click.option("--switch-target", "switch_target", default=None,
                     help="the changed target: bf16, int8 or finetune:DOMAIN (built once, cached by recipe)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def bench_params() -> dict[str, click.Parameter]:
    """`drift bench`'s parameters by name, without importing the command line."""
    return {p.name: p for p in click.command()(bench_options(lambda **kw: None)).params if p.name}
