"""`drift regress pin|check`: the acceptance regression gate (logic in `drift_cli.regress`).

Exit codes: 0 the check passed, 1 acceptance fell by more than the tolerance, 2 bad input
(missing, corrupt or wrong-version baseline, different tokenizer, different stream).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import click

from drift_cli.console import ProgressCallback, emit, rich_progress, stdout_console
from drift_cli.regress import DEFAULT_TOLERANCE, RegressConfig

_D = RegressConfig()


@click.group()
def regress() -> None:
    """Pin a draft/target pair's acceptance and catch regressions when a checkpoint changes."""


def pair_options(fn, zoo_default: str | None):
    opts = [
        click.option("--zoo", default=zoo_default, show_default=zoo_default is not None,
                      help="built-in zoo preset" + ("" if zoo_default else " (default: the baseline's pair)")),
        click.option("--draft", default=None, help="draft checkpoint (local Hugging Face dir)"),
        click.option("--target", default=None, help="target checkpoint (local Hugging Face dir)"),
        click.option("--device", default=_D.device if zoo_default else None, show_default=bool(zoo_default),
                     help="cpu, cuda, ..." + ("" if zoo_default else " (default: the baseline's)")),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def pin_pair_options(fn):
    return pair_options(fn, _D.zoo)


def check_pair_options(fn):
    """No defaults: without flags the check re-measures the pair the baseline recorded."""
    return pair_options(fn, None)


@regress.command()
@click.option("--methods", default=_D.methods, show_default=True, help="vanilla or vanilla,drift")
@click.option("--scenario", default=None, help=f"regression stream scenario (default {_D.scenario})")
@click.option("--corpus", default=None, help="or an ad-hoc corpus (text file, directory, JSONL)")
@click.option("--split", default=_D.split, show_default=True)
@click.option("--max-prompts", type=int, default=_D.max_prompts, show_default=True, help="first N prompts")
@click.option("--max-new-tokens", type=int, default=_D.max_new_tokens, show_default=True)
@click.option("--gamma", type=int, default=_D.gamma, show_default=True)
@click.option("--temperature", type=float, default=_D.temperature, show_default=True, help="0 = greedy")
@click.option("--seed", type=int, default=_D.seed, show_default=True)
@click.option("--dtype", default=_D.dtype, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="baseline file (default results/baselines/<preset or target name>.json)")
@click.option("--json", "as_json", is_flag=True, help="print the baseline to stdout (and nothing else)")
@pin_pair_options
def pin(methods, scenario, corpus, split, max_prompts, max_new_tokens, gamma, temperature, seed, dtype, out, as_json,
        zoo, draft, target, device) -> None:
    """Measure the pair's acceptance on a fixed regression stream and write a baseline."""
    from drift_cli.atomic import check_output_target, refuse_inputs
    from drift_cli.regress import default_baseline_path, pin as run_pin, write_baseline
    from drift_cli.results import check_writable

    if scenario is None and corpus is None:
        scenario = _D.scenario
    cfg = RegressConfig(zoo=None if draft else zoo, draft=draft, target=target, methods=methods, scenario=scenario,
                        corpus=corpus, split=split, max_prompts=max_prompts, max_new_tokens=max_new_tokens,
                        gamma=gamma, temperature=temperature, seed=seed, device=device, dtype=dtype)
    cfg.method_names()
    cfg.bench_config()
    path = check_output_target(out or default_baseline_path(cfg), "--out")
    refuse_inputs(path, [("--corpus", corpus), ("--draft", draft), ("--target", target)], "--out")
    check_writable(path.parent)
    with rich_progress() as progress:
        baseline = run_pin(cfg, ProgressCallback(progress))
    write_baseline(path, baseline)
    if as_json:
        emit(baseline, True)
        return
    console = stdout_console()
    for name, m in baseline["methods"].items():
        lo, hi = m["acceptance_ci95"]
        console.print(f"{name}: acceptance {m['acceptance_rate']:.3f} (95% CI {lo:.3f}-{hi:.3f} over prompts, "
                      f"{m['drafted_tokens']} drafted tokens)", highlight=False)
    console.print(f"baseline written to {path}", highlight=False)


@regress.command()
@click.option("--baseline", "baseline_path", type=click.Path(path_type=Path), required=True, help="baseline JSON")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True,
              help="largest allowed drop in acceptance (absolute)")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the check report here (DIR)")
@click.option("--json", "as_json", is_flag=True, help="print the check report to stdout (and nothing else)")
@check_pair_options
def check(baseline_path, tolerance, out, as_json, zoo, draft, target, device) -> None:
    """Re-measure acceptance on the baseline's stream; exit 1 if it fell by more than the tolerance."""
    from drift_cli.regress import check as run_check, config_from_baseline, enforce, load_baseline
    from drift_cli.atomic import atomic_write_json
    from drift_cli.results import check_writable

    doc = load_baseline(baseline_path)
    cfg = config_from_baseline(doc, zoo, draft, target, device)
    cfg.bench_config()
    if out is not None:
        check_writable(out)
    with rich_progress() as progress:
        report = run_check(doc, cfg, tolerance, ProgressCallback(progress))
    if out is not None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        atomic_write_json(Path(out) / f"regress-check-{stamp}.json", report)
    if as_json:
        emit(report, True)
    elif report["passed"]:
        stdout_console().print(report["message"], highlight=False, markup=False)
    enforce(report)
