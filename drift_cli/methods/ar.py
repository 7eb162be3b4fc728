"""`ar`: the target alone, autoregressive. It drafts nothing, so every iteration of the shared
loop is one target step: the latency baseline for every speedup."""

from drift_cli.methods.base import DraftPolicy


class Autoregressive(DraftPolicy):
    name = "ar"
    drafts = False
    description = "the target alone, autoregressive (the latency baseline)"
