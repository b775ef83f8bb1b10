"""Which value of a metric is better, and which step is best: one rule for retention
(``checkpoint.keep_best``), early stopping (``train.stop_when``), the report's pick and the
job summary.

- Lower is better for losses and errors (``val/loss``, ``val:calibration_error``), higher for
  everything else (explained variance, rewards).
- The best step is the best finite value; ties go to the earliest step.
"""

from __future__ import annotations

import math
from typing import Iterable

LOWER_IS_BETTER = ("loss", "error")


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in LOWER_IS_BETTER)


def ranked(scores: Iterable[tuple[int, float]], metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs with finite values, best first, the earliest step first on ties."""
    sign = 1.0 if lower_is_better(metric) else -1.0
    finite = [(int(s), float(v)) for s, v in scores if isinstance(v, (int, float)) and math.isfinite(v)]
    return sorted(finite, key=lambda sv: (sign * sv[1], sv[0]))


def best(scores: Iterable[tuple[int, float]], metric: str) -> tuple[int, float] | None:
    """The best (step, value), or None when no value is finite."""
    r = ranked(scores, metric)
    return r[0] if r else None
