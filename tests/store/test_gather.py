"""The one batch-gathering rule (gather.close_in) that the writer thread and an event loop both follow."""

from __future__ import annotations

import pytest

from ckpt.sidecar.store.gather import GATHER_COMMITS, close_in


def _close_in(**overrides: float) -> float:
    inputs = {
        "gathered": 3,
        "expected": 8,
        "last_commit_seconds": 0.002,
        "since_hand_over_seconds": 0.001,
        "max_commit_delay_seconds": 0.01,
    } | overrides
    return close_in(**inputs)  # type: ignore[arg-type]


@pytest.mark.parametrize("expected", [0, 1])
def test_a_lone_writers_batch_closes_at_once(expected: int) -> None:
    assert _close_in(gathered=1, expected=expected) == 0.0


def test_a_batch_holding_the_writes_expected_closes_at_once() -> None:
    assert _close_in(gathered=8, expected=8) == 0.0
    assert _close_in(gathered=9, expected=8) == 0.0


def test_a_batch_waits_out_the_commits_durations_counted_from_the_last_hand_over() -> None:
    assert _close_in() == pytest.approx(GATHER_COMMITS * 0.002 - 0.001)


def test_the_wait_is_at_most_max_commit_delay_seconds() -> None:
    assert _close_in(last_commit_seconds=1.0, since_hand_over_seconds=0.0) == pytest.approx(0.01)


def test_a_batch_whose_time_passed_since_the_last_hand_over_closes_at_once() -> None:
    assert _close_in(since_hand_over_seconds=1.0) == 0.0


def test_no_wait_when_turned_off() -> None:
    assert _close_in(max_commit_delay_seconds=0.0) == 0.0
