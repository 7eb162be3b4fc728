"""Click options shared by the commands that run models (bench, ablate, analyze)."""

from __future__ import annotations

from pathlib import Path

import click


def method_options(fn):
    """Every registered method's own click options (each declared once, next to its method)."""
    from drift_cli.methods import METHODS

    seen: set[str] = set()
    for name in reversed(METHODS.names()):
        for opt in METHODS[name].cli_options:
            if opt.name not in seen:
                seen.add(opt.name)
                fn.__click_params__ = getattr(fn, "__click_params__", []) + [opt]
    return fn


def model_options(fn):
    opts = [
        click.option("--zoo", "zoo", default="small", show_default=True, help="built-in model zoo preset"),
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
        click.option("--split", default="test", show_default=True, help="dev or test"),
        click.option("--max-prompts", type=int, default=None, help="use the first N prompts of the stream"),
        click.option("--max-new-tokens", type=int, default=None, help="override the scenario's generation length"),
        click.option("--gamma", type=int, default=4, show_default=True, help="draft block size"),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy"),
        click.option("--top-p", type=float, default=None, help="nucleus sampling threshold"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", type=click.Path(path_type=Path), default=Path("results"), show_default=True),
        click.option("--json", "as_json", is_flag=True, help="print run.json to stdout (and nothing else)"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn
