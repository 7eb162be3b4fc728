"""Fuzz and sample counts that scale with $DRIFT_TEST_SCALE (default 1, CI's setting; 4 for a
deeper soak, 0.25 for a quick local loop that gives up statistical power)."""

import os


def scaled(n: int) -> int:
    """`n` times $DRIFT_TEST_SCALE, at least 1."""
    return max(1, round(n * float(os.environ.get("DRIFT_TEST_SCALE", "1"))))
