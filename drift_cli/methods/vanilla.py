"""`vanilla`: speculative decoding with the static draft."""

from drift_cli.methods.base import ModelDraftPolicy


class Vanilla(ModelDraftPolicy):
    name = "vanilla"
    description = "speculative decoding with the static draft"
