"""The built-in model zoo: one shared tokenizer, a target, a shifted draft and offline drafts.

The presets (`drift_cli.zoo.presets`) are plain data and load at once; the builders
(`drift_cli.zoo.build`, torch and transformers) load on first use of one of their names.
"""

from drift_cli.zoo.presets import PRESETS, ZooPreset, preset_names

_BUILD = ("ZooPair", "ensure_offline_draft", "ensure_zoo", "load_model", "zoo_status")

__all__ = ["PRESETS", "ZooPreset", "preset_names", *_BUILD]


def __getattr__(name: str):
    if name in _BUILD:
        from drift_cli.zoo import build

        return getattr(build, name)
    raise AttributeError(f"module 'drift_cli.zoo' has no attribute {name!r}")
