"""Where the committed micro pair lives: the files the project's own gate and tests use."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MICRO_FIXTURE = REPO / "results" / "baselines" / "micro"     # manifest.json, tokenizer/, target/, draft/
