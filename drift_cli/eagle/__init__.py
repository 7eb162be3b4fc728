"""EAGLE-family draft heads: one decoder layer that drafts from the target's own hidden states.

`layout`   the checkpoint layouts read (vLLM / SGLang / SpecForge), kind detection; torch-free
`modules`  the heads as torch modules (EAGLE-1, EAGLE-3), their forward with a per-row KV cache
`drafter`  `HeadDrafter`: a head as the draft LM of `ModelDraftPolicy` (vanilla, drift, offline, osd)
`load`     loading a head by path against its target (refusing one that does not fit), saving one
`train`    a head initialised from its target and trained on the target's labels and features

docs/eagle.md has the conventions and the design.
"""

from drift_cli.eagle.layout import DRAFT_KINDS, HEAD_KINDS

__all__ = ["DRAFT_KINDS", "HEAD_KINDS", "is_head"]


def is_head(model) -> bool:
    """Whether a draft module is an EAGLE head (without importing torch for a plain model)."""
    return getattr(model, "eagle_kind", None) in HEAD_KINDS
