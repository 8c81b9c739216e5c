"""Fixtures of the client tests: a real sidecar, and a fleet of them to restart under a stream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.support import Fleet
from tests.support import Sidecar, start_sidecar


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    """``fleet(*options)``: a Fleet on ``tmp_path / "data"``, closed when the test ends."""
    made: list[Fleet] = []

    def make(*extra: str) -> Fleet:
        made.append(Fleet(tmp_path / "data", *extra))
        return made[-1]

    yield make
    for f in made:
        f.close()
