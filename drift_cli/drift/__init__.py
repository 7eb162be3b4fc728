"""DRIFT's memory: configuration, the prototype bank and its snapshots."""

from drift_cli.drift.bank import DriftBank
from drift_cli.drift.config import DriftConfig

__all__ = ["DriftBank", "DriftConfig"]
