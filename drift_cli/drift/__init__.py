"""DRIFT's memory: configuration, the prototype bank and its snapshots.

The configuration loads at once (the command line reads it); the bank (torch) on first use.
"""

from drift_cli.drift.config import DriftConfig

__all__ = ["DriftBank", "DriftConfig"]


def __getattr__(name: str):
    if name == "DriftBank":
        from drift_cli.drift.bank import DriftBank

        return DriftBank
    raise AttributeError(f"module 'drift_cli.drift' has no attribute {name!r}")
