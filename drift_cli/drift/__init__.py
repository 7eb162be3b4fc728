"""DRIFT's memory: configuration, the prototype bank and its snapshots."""

from drift_cli.drift.bank import DriftBank, ObserveStats
from drift_cli.drift.config import DriftConfig

__all__ = ["DriftBank", "DriftConfig", "ObserveStats"]
