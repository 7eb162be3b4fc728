"""`drift profile`: the cost curve of the target and the draft for k = 1..K tokens beside the
weight-read floor, measured in one process (registered by drift_cli.cli).

The curve is `profile_costs`'s (drift_cli.engine.gamma: widths interleaved rep by rep, the
fastest rep kept; the floor is drift_cli.engine.floor's, timed inside the same reps). The time an
iteration spends outside the two models (`overhead_ms`) is the mean `iteration_overhead_ms` of a
short vanilla decode (γ 3) after the same prefix. The prefix is `--prefix` fixed token ids (the
cost of a forward depends on the positions, not on which tokens they hold).
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import click

from drift_cli.atomic import check_output_target
from drift_cli.errors import BadInput
from drift_cli.zoo.presets import DEFAULT_ZOO

MAX_K = 64
OVERHEAD_TOKENS = 24      # the vanilla decode that measures the time outside the models


@click.command("profile")
@click.option("--zoo", default=DEFAULT_ZOO, show_default=True, help="zoo preset whose pair is profiled")
@click.option("--drafter", type=click.Choice(["layer", "eagle"]), default="layer", show_default=True,
              help="pretrained presets: the layer draft or the EAGLE-3 head")
@click.option("--target", default=None, help="target checkpoint (with --draft; instead of --zoo)")
@click.option("--draft", default=None, help="draft checkpoint or EAGLE head (with --target)")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto")
@click.option("--dtype", default="auto", show_default=True,
              help="weights' dtype; auto = bfloat16 on CUDA, float32 on the CPU")
@click.option("--threads", type=int, default=None, help="torch CPU threads [default: 1 on the CPU]")
@click.option("--k-max", type=int, default=16, show_default=True, help="largest number of tokens scored")
@click.option("--reps", type=int, default=7, show_default=True, help="timed reps per width (the fastest is kept)")
@click.option("--prefix", type=int, default=200, show_default=True, help="cached positions before the scored tokens")
@click.option("--graph/--eager", default=False, show_default=True,
              help="time the CUDA-graph path (drift_cli.engine.graphs) where it exists; on the CPU the eager path")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="write the profile as JSON (atomically)")
@click.option("--png", type=click.Path(path_type=Path), default=None,
              help="draw the curves [default: next to --out, same name, .png]")
@click.option("--json", "as_json", is_flag=True, help="print the profile as JSON (and nothing else)")
def profile(zoo, drafter, target, draft, device, dtype, threads, k_max, reps, prefix, graph, out, png, as_json) -> None:
    """The cost of scoring k = 1..K tokens (target and draft) beside the weight-read floor."""
    from drift_cli.bench_config import BenchConfig, check_preset

    cfg = BenchConfig(zoo=zoo, drafter=drafter, target=target, draft=draft, device=device, dtype=dtype,
                      threads=threads)
    check_settings(cfg, k_max, reps, prefix)
    cfg.validate(unread_ok=True)
    check_preset(cfg)
    for path, flag in ((out, "--out"), (png, "--png")):
        if path is not None:
            check_output_target(path, flag)
    result = measure(cfg, k_max, reps, prefix, graph, say=None if as_json else click.echo)
    png = png or (out.with_suffix(".png") if out is not None else None)
    if out is not None:
        from drift_cli.atomic import atomic_write_json

        atomic_write_json(out, result)
    if png is not None:
        plot_profile(result, png)
    if as_json:
        from drift_cli.console import emit

        emit(result, True)
        return
    render(result, out, png)


def check_settings(cfg, k_max: int, reps: int, prefix: int) -> None:
    """The command's own numbers (before anything loads): one line, exit 2."""
    if not 1 <= k_max <= MAX_K:
        raise BadInput(f"--k-max must be in [1, {MAX_K}], got {k_max}")
    if reps < 1:
        raise BadInput(f"--reps must be >= 1, got {reps}")
    if prefix < 1:
        raise BadInput(f"--prefix must be >= 1, got {prefix}")
    if cfg.threads is not None and cfg.threads < 1:
        raise BadInput(f"--threads must be >= 1, got {cfg.threads}")


def graph_timer(graph: bool, device, say):
    """The CUDA-graph timer `time_forward(lm, k, reps)`, or None (the eager path)."""
    if not graph:
        return None
    if device.type != "cuda":
        return None                                  # on the CPU --graph is the eager path
    try:
        from drift_cli.engine.graphs import time_forward
    except ImportError:
        if say:
            say("--graph: the CUDA-graph path is unavailable here (no drift_cli.engine.graphs); timing the eager path")
        return None
    return time_forward


def measure(cfg, k_max: int, reps: int, prefix: int, graph: bool, say=None) -> dict:
    """The profile of cfg's pair (see the module's docstring) as a strict-JSON-ready dict."""
    import torch

    from drift_cli import machine
    from drift_cli.bench import load_models
    from drift_cli.engine import cpu_linear
    from drift_cli.engine.gamma import profile_costs
    from drift_cli.engine.lm import CausalLM
    from drift_cli.methods.base import draft_lm
    from drift_cli.results import versions

    models = load_models(cfg)
    pair = models.pair
    target, draft = CausalLM(pair.target, "target"), draft_lm(pair.draft)
    positions = getattr(pair.target.config, "max_position_embeddings", None) or prefix + k_max + OVERHEAD_TOKENS
    if prefix + max(k_max, OVERHEAD_TOKENS) >= positions:
        raise BadInput(f"--prefix {prefix} plus {max(k_max, OVERHEAD_TOKENS)} scored tokens exceeds the target's "
                       f"context of {positions} positions")
    vocab = target.vocab_size
    prompt = [(7919 * i + 11) % vocab for i in range(prefix)]
    timer = graph_timer(graph, target.device, say)
    costs = profile_costs(target, draft, prompt, k_max - 1, reps, draft_widths=k_max)
    verify = list(costs.verify_ms)
    draft_curve = list(costs.draft_curve_ms) or [costs.draft_ms_per_token]
    if timer is not None:                             # the CUDA-graph path's curves instead of the eager ones
        from drift_cli.engine.graphs import make_lm

        verify = [float(timer(make_lm(pair.target, "target", "graph"), k, reps, context=prefix))
                  for k in range(1, k_max + 1)]
        if isinstance(draft, CausalLM):                # a layer draft (an EAGLE head's step stays eager)
            graphed = make_lm(draft.model, "draft", "graph")
            draft_curve = [float(timer(graphed, k, reps, context=prefix)) for k in range(1, k_max + 1)]
    overhead = overhead_ms(target, pair.draft, prompt)
    return {
        "verify_ms": verify,
        "verify_ratio": [v / verify[0] for v in verify],
        "draft_ms": draft_curve,
        "draft_ms_per_token": draft_curve[0],
        "overhead_ms": overhead,
        "floor_ms": costs.floor_ms,
        "draft_floor_ms": costs.draft_floor_ms,
        "floor_bytes": costs.floor_bytes,
        "draft_floor_bytes": costs.draft_floor_bytes,
        "k_max": k_max,
        "reps": reps,
        "prefix": prefix,
        "path": "graph" if timer is not None else "eager",
        "cpu_linear": {"enabled": cpu_linear.enabled(), "layers": cpu_linear.install(pair.target)
                       if target.device.type == "cpu" else 0, "max_rows": cpu_linear.MAX_ROWS},
        "where": {
            "device": str(target.device),
            "dtype": cfg.dtype_name,
            "threads": torch.get_num_threads(),
            "shapes": {"target": shape(pair.target), "draft": shape(pair.draft)},
            "models": {"target": pair.target_info.path, "draft": pair.draft_info.path, "zoo": models.zoo_preset},
            "versions": versions(),
            "cpu": machine.cpu_model(),
            "vector_extensions": machine.vector_extensions(),
            "gpu": torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else None,
            "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    }


def overhead_ms(target, draft, prompt: list[int]) -> float:
    """The mean time per iteration outside the two models in a short vanilla decode (γ 3)."""
    from drift_cli import metrics
    from drift_cli.engine.loop import DecodeConfig, generate
    from drift_cli.engine.sampling import Sampler
    from drift_cli.methods.vanilla import Vanilla

    cfg = DecodeConfig(gamma=3, max_new_tokens=OVERHEAD_TOKENS)
    policy = Vanilla(draft)
    generate(target, policy, prompt, cfg, Sampler())                      # warm-up
    steps = generate(target, policy, prompt, cfg, Sampler()).steps
    return min(metrics.iteration_overhead_ms(s) for s in steps) if steps else 0.0


def shape(model) -> dict:
    """A model's shape as its config states it (what the costs depend on)."""
    c = model.config
    keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings")
    out = {k: getattr(c, k, None) for k in keys}
    out["parameters"] = sum(p.numel() for p in model.parameters())
    return out


def render(result: dict, out: Path | None, png: Path | None) -> None:
    from drift_cli.console import row_table, stdout_console

    w = result["where"]
    table = row_table(f"cost by tokens scored: {w['device']} {w['dtype']}, {w['threads']} thread(s), "
                      f"{result['path']} path, {w['cpu']}",
                      ("k", "target ms", "× k=1", "× floor", "draft ms", "× draft floor"))
    floor, dfloor = result["floor_ms"], result["draft_floor_ms"]
    for k, v in enumerate(result["verify_ms"], start=1):
        d = result["draft_ms"][k - 1] if k <= len(result["draft_ms"]) else None
        table.add_row(str(k), f"{v:.2f}", f"{v / result['verify_ms'][0]:.2f}",
                      f"{v / floor:.2f}" if floor else "-", "-" if d is None else f"{d:.2f}",
                      f"{d / dfloor:.2f}" if d is not None and dfloor else "-")
    console = stdout_console()
    console.print(table)
    console.print(f"weight-read floor: target {floor:.2f} ms ({result['floor_bytes'] / 1e6:.1f} MB), "
                  f"draft {dfloor:.2f} ms ({result['draft_floor_bytes'] / 1e6:.1f} MB); "
                  f"time outside the models per iteration {result['overhead_ms']:.2f} ms", highlight=False)
    for label, path in (("profile", out), ("plot", png)):
        if path is not None:
            console.print(f"{label}: {path}", highlight=False)


def plot_profile(result: dict, path: Path) -> None:
    """Target and draft cost against k, each with its floor as a dashed line."""
    from drift_cli.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, floor_key, label in ((axes[0], "verify_ms", "floor_ms", "target"),
                                      (axes[1], "draft_ms", "draft_floor_ms", "draft")):
        ys = result[key]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{label}: scoring k tokens")
        if result[floor_key]:
            ax.axhline(result[floor_key], color="grey", ls="--", lw=1, label="weight-read floor")
        ax.set_xticks(range(1, len(ys) + 1))
        ax.set_xlabel("tokens scored k")
        ax.set_ylabel("ms per forward")
        ax.set_ylim(bottom=0)
        ax.set_title(label)
        ax.legend()
    w = result["where"]
    fig.suptitle(f"{w['device']} {w['dtype']}, {w['threads']} thread(s), {result['path']} path")
    fig.tight_layout()
    save_figure(fig, path)
