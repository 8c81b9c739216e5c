"""Fixtures of the power cut tests: powercut.c built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.powercut.image import build_library


@pytest.fixture(scope="session")
def powercut_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("powercut"))
