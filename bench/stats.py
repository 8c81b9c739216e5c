"""The one percentile rule every benchmark reports with, and the medians over rounds."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100) by nearest rank: the smallest value
    with at least q% of the values at or below it. ``values`` need not be sorted.

    Nearest rank never interpolates, so a reported p99 is a latency that was
    actually measured; p0 is the minimum and p100 the maximum.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100, got {q}")
    ordered = sorted(values)
    # The tolerance keeps q * n / 100 from rounding up past an exact rank (0.99 * 100 -> 99.00000000000001).
    rank = math.ceil(q * len(ordered) / 100 - 1e-9)
    return ordered[max(rank, 1) - 1]


def medians(rounds: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each numeric figure's median over the rounds (the figures of the first round name them)."""
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in rounds) for k in keys}
