"""Method settings: each knob (flag, help, default, check) declared once, on its dataclass field;
the CLI flags and `drift ablate --values` are generated from / checked through them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from drift_cli import knobs
from drift_cli.commands.options import settings_options
from drift_cli.drift.config import DriftConfig
from drift_cli.errors import BadInput
from drift_cli.knobs import Settings, at_least, knob
from drift_cli.methods import METHODS, method_settings, settings_classes


@dataclass(frozen=True)
class Toy(Settings):
    size: int = knob(3, "--toy-size", "toy: a size", ok=at_least(1), rule="must be >= 1")
    rate: float = knob(0.5, "--toy-rate", "toy: a rate", ok=lambda x: 0 < x < 1, rule="must be in (0, 1)")
    on: bool = knob(True, "--toy-on", "toy: a switch", off_flag="--toy-off")
    mode: str = knob("a", "--toy-mode", "toy: a mode", choices=("a", "b"))
    plain: int = 7                                     # no knob: not a flag


def test_every_registered_setting_has_a_valid_default_and_one_flag():
    seen: dict[str, knobs.Knob] = {}
    for cls in settings_classes():
        cls().validate()                               # the defaults pass their own checks
        for f, k in knobs.knobs(cls):
            assert k.flag.startswith("--") and k.help, (cls, f.name)
            # a flag shared by two classes (--divergence) is one knob, with one help and default
            assert seen.setdefault(k.name, k) == k, k.flag
    assert {"gain", "bank_in", "osd_lr", "divergence", "pld_max_ngram", "suffix_max_depth"} <= set(seen)
    assert all(isinstance(c, type) for m in METHODS.names() for c in method_settings(m))


def test_from_options_check_and_parse_value():
    assert Toy.from_options({"toy_size": None, "toy_rate": 0.25, "other": 1}) == Toy(rate=0.25)
    assert Toy(size=2).validate() == Toy(size=2)
    for bad, message in ((Toy(size=0), "--toy-size must be >= 1, got 0"), (Toy(rate=math.nan), "--toy-rate must be in"),
                         (Toy(mode="c"), "--toy-mode must be one of a, b, got 'c'")):
        with pytest.raises(BadInput, match=message):
            bad.validate()
    assert knobs.parse_value(Toy, "size", " 4 ") == 4 and knobs.parse_value(Toy, "on", "off") is False
    for text, message in (("x", "--toy-size: 'x' is not a valid int"), ("0", "--toy-size must be >= 1, got 0")):
        with pytest.raises(BadInput, match=message):
            knobs.parse_value(Toy, "size", text)
    with pytest.raises(BadInput, match="got 'target-es' \\(did you mean 'target-est'\\?\\)"):
        DriftConfig(key="target-es").validate()
    with pytest.raises(BadInput, match=r"--gain must be in \[0, 100\] .*, got inf"):
        DriftConfig(gain=math.inf).validate()
    with pytest.raises(BadInput, match="--bank-size must be in"):
        DriftConfig(bank_size=10 ** 10).validate()


def test_generated_click_options_parse_default_to_none_and_check():
    seen = {}
    cmd = click.Command("x", params=settings_options([Toy]), callback=lambda **kw: seen.update(kw))
    runner = CliRunner()
    assert runner.invoke(cmd, []).exit_code == 0
    assert seen == {"toy_size": None, "toy_rate": None, "toy_on": None, "toy_mode": None}   # None: keep the default
    assert Toy.from_options(seen) == Toy()
    res = runner.invoke(cmd, ["--toy-size", "5", "--toy-off", "--toy-mode", "b"])
    assert res.exit_code == 0 and Toy.from_options(seen) == Toy(size=5, on=False, mode="b")
    bad = runner.invoke(cmd, ["--toy-rate", "2"])
    assert bad.exit_code == 2 and "Invalid value for '--toy-rate': must be in (0, 1), got 2.0" in bad.output
    assert "[default: 3]" in runner.invoke(cmd, ["--help"]).output
