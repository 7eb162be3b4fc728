"""The built-in methods' settings (`drift_cli.knobs` dataclasses), kept free of torch so that the
command line (`drift bench --help`, a refused flag) is generated and checked without loading a
model library. DRIFT's live in `drift_cli.drift.config`, OSD's in `drift_cli.osd.config`, the γ
controller's in `drift_cli.engine.gamma`; `drift_cli.methods` says which method owns which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

from drift_cli.errors import BadInput
from drift_cli.knobs import Settings, at_least, between, knob

DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")     # drift_cli.divergence implements them


def divergence_knob():
    """The `--divergence` setting, shared by `offline` (its distillation) and `osd` (its loss)."""
    return knob("fkl", "--divergence", "distillation divergence of the offline draft (and of osd)",
                choices=DIVERGENCES)


def within_context(flag: str, value: int, positions: int, what: str) -> None:
    """A match length bounded by the models' context (checked once the models are known)."""
    if value > positions:
        raise BadInput(f"{flag} {value} exceeds the models' context of {positions} positions: "
                       f"{what} longer than the context can never match")


@dataclass(frozen=True)
class ResidualConfig(Settings):
    """vanilla's residual recorder (`drift_cli.residuals`)."""

    residuals: int = knob(0, "--residuals", "vanilla: keep log p - log q at up to N rejected positions and report "
                          "their singular-value spectrum in run.json (0 = off; the recording is timed as adaptation)",
                          ok=at_least(0), rule="must be >= 0")


@dataclass(frozen=True)
class OfflineConfig(Settings):
    draft: str | None = knob(None, "--offline-draft", "offline draft checkpoint (default: the zoo's, built on demand)")
    divergence: str = divergence_knob()
    # the zoo's offline draft distilled on sequences the draft itself generated (on-policy data)
    on_policy: bool = knob(False, "--offline-on-policy", "offline: the zoo's draft distilled on on-policy data "
                           "(sequences the draft generates) instead of off-policy text", off_flag="--offline-off-policy")


@dataclass(frozen=True)
class PldConfig(Settings):
    # longest n-gram matched; shorter ones down to 1 are tried after it
    max_ngram: int = knob(3, "--pld-max-ngram", "pld: longest n-gram matched against the context (then shorter, down to 1)",
                          ok=at_least(1), rule="must be >= 1")

    def check_context(self, positions: int) -> None:
        """An n-gram longer than the models' context can never match (and would size the index)."""
        within_context("--pld-max-ngram", self.max_ngram, positions, "an n-gram")


@dataclass(frozen=True)
class SuffixConfig(Settings):
    # longest suffix kept in the tries (vLLM's default tree depth)
    max_depth: int = knob(24, "--suffix-max-depth", "suffix: longest suffix kept and matched",
                          ok=at_least(1), rule="must be >= 1")
    # draft length <= match length x this factor (and <= γ)
    max_spec_factor: float = knob(1.0, "--suffix-max-spec-factor", "suffix: draft at most match length x this many tokens",
                                  ok=lambda x: 0 < x < float("inf"), rule="must be > 0")
    # stop the draft when its path probability drops below this
    min_token_prob: float = knob(0.1, "--suffix-min-token-prob", "suffix: stop drafting below this path probability",
                                 ok=between(0.0, 1.0), rule="must be in [0, 1]")
    # output tokens held by the stream tries, all tenants together
    max_tokens: int = knob(65536, "--suffix-max-tokens",
                           "suffix: output tokens kept from earlier prompts, oldest evicted first",
                           ok=at_least(1), rule="must be >= 1")

    def check_context(self, positions: int) -> None:
        within_context("--suffix-max-depth", self.max_depth, positions, "a suffix")


HYBRID_COPY = ("suffix", "pld")                          # drift_cli.methods.hybrid maps them to methods
HYBRID_MODEL = ("drift", "vanilla", "offline", "osd")
HYBRID_RULES = ("score", "length", "learned")
LEARNING_MODELS = ("drift", "osd")                       # the model sources that learn (--hybrid-learn-copied)


@dataclass(frozen=True)
class HybridConfig(Settings):
    copy: str = knob("suffix", "--hybrid-copy", "hybrid: the copying source", choices=HYBRID_COPY)
    model: str = knob("drift", "--hybrid-model", "hybrid: the model source (its own settings apply unchanged)",
                      choices=HYBRID_MODEL, selects="hybrid model source")
    rule: str = knob("score", "--hybrid-rule", "hybrid: when a row copies (score: the copying draft's expected "
                     "accepted length; length: its length; learned: its length under the row's running acceptance)",
                     choices=HYBRID_RULES, selects="hybrid rule")
    # the score and learned rules: copy when the expected accepted length is at least this (tuned on
    # the micro zoo's dev streams, docs/model_free.md)
    min_score: float = knob(0.75, "--hybrid-min-score", "hybrid: score/learned rules: copy when the copying draft's "
                            "expected accepted length is at least this", ok=at_least(0.0), rule="must be >= 0 and finite",
                            needs=("rule", ("score", "learned")))
    # the length rule: copy when the copying draft has at least this many tokens
    min_length: int = knob(2, "--hybrid-min-length", "hybrid: length rule: copy when the copying draft has at "
                           "least this many tokens", ok=at_least(1), rule="must be >= 1", needs=("rule", "length"))
    # the model source also learns from the steps where copying proposed (a teacher-forced draft pass)
    learn_copied: bool = knob(False, "--hybrid-learn-copied", "hybrid: the model source also learns from copied "
                              "steps (a teacher-forced draft pass over them, timed as adaptation)",
                              off_flag="--hybrid-no-learn-copied", needs=("model", LEARNING_MODELS))

    def check_gamma(self, gamma: int, given: Collection[str]) -> None:
        """A copying draft holds at most --gamma tokens, so neither its length nor its expected
        accepted length ever exceeds --gamma: a threshold above it (given: the option names the
        user set) would never copy, and is refused."""
        for name, flag, what in (("min_length", "--hybrid-min-length", "length"),
                                 ("min_score", "--hybrid-min-score", "expected accepted length")):
            value = getattr(self, name)
            if f"hybrid_{name}" in given and value > gamma:
                raise BadInput(f"{flag} {value} exceeds --gamma {gamma}: a copying draft's {what} is at most "
                               f"--gamma, so the hybrid would never copy")
