"""The built-in model zoo: one shared tokenizer, a target, a shifted draft and offline drafts."""

from drift_cli.zoo.build import ZooPair, ensure_offline_draft, ensure_zoo, load_model, preset_names, zoo_status
from drift_cli.zoo.presets import PRESETS, ZooPreset

__all__ = ["PRESETS", "ZooPair", "ZooPreset", "ensure_offline_draft", "ensure_zoo", "load_model",
           "preset_names", "zoo_status"]
