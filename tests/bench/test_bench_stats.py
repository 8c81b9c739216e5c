"""The benchmarks' one percentile rule (nearest rank), pinned by a boundary table."""

from __future__ import annotations

import random

import pytest

from ckpt.bench.stats import percentile

HUNDRED = [float(i) for i in range(1, 101)]  # 1..100: the q-th percentile is q itself


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        (HUNDRED, 50, 50.0),
        (HUNDRED, 99, 99.0),  # not the maximum: 0.99 * 100 must not round up to rank 100
        (HUNDRED, 99.5, 100.0),
        ([float(i) for i in range(1, 3001)], 99, 2970.0),  # of 3,000 reads, the 31st slowest
        (HUNDRED, 100, 100.0),
        (HUNDRED, 0, 1.0),
        (HUNDRED, 1, 1.0),
        (HUNDRED, 1.01, 2.0),
        ([float(i) for i in range(1, 1001)], 99.9, 999.0),
        ([float(i) for i in range(1, 1001)], 99, 990.0),
        ([7.0], 50, 7.0),
        ([7.0], 99, 7.0),
        ([1.0, 2.0], 50, 1.0),
        ([1.0, 2.0], 50.1, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 75, 3.0),
    ],
)
def test_percentile_is_the_nearest_rank_of_any_order(values: list[float], q: float, expected: float) -> None:
    shuffled = list(values)
    random.Random(len(values)).shuffle(shuffled)
    assert percentile(values, q) == expected
    assert percentile(shuffled, q) == expected  # unsorted input is fine


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 100.5)])
def test_bad_input_is_refused(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)
