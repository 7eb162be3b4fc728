"""Click options of the commands that run models (bench, ablate, analyze), generated from the
settings dataclasses: `BenchConfig`'s (`drift_cli.bench_config`) and every method's."""

from __future__ import annotations

from pathlib import Path

import click

from drift_cli.errors import BadInput
from drift_cli.knobs import Knob, default_of, knobs, problem


class TextValue(click.ParamType):
    """A knob whose value is parsed from text by its own `parse` ("1,2,4" -> (1, 2, 4))."""

    def __init__(self, k: Knob) -> None:
        self.knob, self.name = k, "list"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.knob.parse(value)
        except BadInput as e:
            self.fail(str(e), param, ctx)


def knob_option(k: Knob, default) -> click.Option:
    """The click option of one knob: default None (= keep the settings' default), the knob's own
    check at parse time (a bad value is a usage error: one line, exit 2)."""
    def validate(ctx, param, value):
        message = problem(k, value)
        if message:
            raise click.BadParameter(message.removeprefix(f"{k.flag} "))
        return value

    if k.kind is bool:
        decls = [f"{k.flag}/{k.off_flag}" if k.off_flag else k.flag, k.name]
        return click.Option(decls, is_flag=True, default=None, help=knob_help(k, default), callback=validate)
    kind = {float: click.FLOAT, int: click.INT, Path: click.Path(path_type=Path)}.get(k.kind, click.STRING)
    if k.parse is not None:
        kind = TextValue(k)
    if k.choices is not None:
        kind = click.Choice(k.choices)
    return click.Option([k.flag, k.name], type=kind, default=None, help=knob_help(k, default), callback=validate)


def knob_help(k: Knob, default) -> str:
    """A setting's help line, as every command shows it: its help, then its default."""
    return k.help + ("" if default is None else f" [default: {default}]")


def settings_options(classes, skip: tuple[str, ...] = ()) -> list[click.Option]:
    """The click options of these settings classes' knobs, in order, each option name once."""
    out, seen = [], set(skip)
    for cls in classes:
        for f, k in knobs(cls):
            if k.cli and k.name not in seen:
                seen.add(k.name)
                out.append(knob_option(k, default_of(f)))
    return out


def method_cli_options(name: str) -> list[click.Option]:
    """One registered method's click options (from its settings classes)."""
    from drift_cli.methods import method_settings

    return settings_options(method_settings(name))


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
    """DRIFT's settings as click options, without --bank-out (analyze)."""
    from drift_cli.drift.config import DriftConfig, DriftFiles

    return add_options(fn, settings_options([DriftConfig, DriftFiles], skip=("bank_out",)))


# BenchConfig fields a command does not offer as flags (it sets them itself, or they do not apply)
NOT_IN_ABLATE = ("methods", "control", "batch_sizes")          # ablate has its own --methods
NOT_IN_ANALYZE = NOT_IN_ABLATE + ("switch_after", "switch_target")


def run_options(skip: tuple[str, ...] = ()):
    """`BenchConfig`'s fields as click options (less `skip`), then --json."""
    from drift_cli.bench_config import BenchConfig

    def wrap(fn):
        opts = [knob_option(k, default_of(f)) for f, k in knobs(BenchConfig) if f.name not in skip]
        opts.append(click.Option(["--json", "as_json"], is_flag=True, help="print run.json to stdout (and nothing else)"))
        return add_options(fn, opts)
    return wrap


def bench_options(fn):
    """Every option of `drift bench`: the run's settings, then every method's."""
    return run_options()(method_options(fn))
