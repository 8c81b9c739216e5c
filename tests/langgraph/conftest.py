"""Fixtures of the LangGraph saver tests: a real sidecar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Sidecar, start_sidecar


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = start_sidecar(tmp_path / "data")
    yield s
    assert s.stop() == 0, s.log()
