from __future__ import annotations

import pytest

from bench import trajectories


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--trajectories",
        default=None,
        help=f"trajectory corpus directory (default: ${trajectories.ENV_VAR}, else {trajectories.DEFAULT_DIR})",
    )


@pytest.fixture(scope="session")
def trajectory_dir(request: pytest.FixtureRequest) -> str | None:
    path: str | None = request.config.getoption("--trajectories")
    if trajectories.find_corpus(path) is None:
        pytest.fail(
            f"no trajectory corpus: pass --trajectories DIR or set {trajectories.ENV_VAR}"
            f" (default {trajectories.DEFAULT_DIR} does not exist)"
        )
    return path
