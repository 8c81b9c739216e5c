"""The one percentile rule every benchmark reports with."""

from __future__ import annotations

import math
from collections.abc import Sequence


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
