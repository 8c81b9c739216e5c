import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The suite starts processes (subprocess: fork, then exec) from a process that uses gRPC. gRPC's fork
# handlers run in the forking thread, which holds the GIL, and a CI run hung for good in one (a Popen
# during a gRPC shutdown; pytest-timeout's thread could not take the GIL to end it). Children that exec
# at once never use the parent's gRPC state (the sidecar too starts its processes by fork and exec
# only): gRPC's own advice is to turn the handlers off then. Set before anything imports grpc (nothing
# above does).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

# Frames are checked for exact bytes, so timing-based flakiness only comes from
# the shared machines: no deadlines. CKPT_HYPOTHESIS_PROFILE=thorough runs ten
# times the examples (used before releases and after codec changes).
_suppressed = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=_suppressed)
settings.register_profile("thorough", max_examples=600, deadline=None, suppress_health_check=_suppressed)
settings.load_profile(os.environ.get("CKPT_HYPOTHESIS_PROFILE", "default"))


# The trajectory corpus lives outside the repository (../shared/data/trajectories). Tests
# use it where it is; a checkout without it gets a small stand-in corpus in the same
# format, so the harness and replay tests run everywhere instead of being skipped.
def _write_standin_corpus(directory: Path, trajectories: int = 24) -> None:
    rng = random.Random(7)
    words = ["read", "the", "failing", "test", "then", "patch", "the", "module", "and", "rerun", "suite"]
    lines = []
    for t in range(trajectories):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. " * 20},
            {"role": "user", "content": f"Task {t}: " + " ".join(rng.choices(words, k=40))},
        ]
        for turn in range(rng.randrange(4, 14)):
            call_id = f"call-{t}-{turn}"
            args = {"path": f"src/mod{rng.randrange(9)}.py", "line": rng.randrange(400)}
            messages.append(
                {
                    "role": "assistant",
                    "content": " ".join(rng.choices(words, k=25)),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": rng.choice(["read", "edit", "run"]), "arguments": json.dumps(args)},
                        }
                    ],
                }
            )
            output = "\n".join(f"{n:4d}  " + " ".join(rng.choices(words, k=12)) for n in range(rng.randrange(5, 80)))
            messages.append({"role": "tool", "content": output, "tool_call_id": call_id})
        messages.append({"role": "assistant", "content": "Done: " + " ".join(rng.choices(words, k=30))})
        lines.append(json.dumps({"id": f"standin/{t}", "source": "generated", "license": "MIT", "messages": messages}))
    (directory / "standin.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session", autouse=True)
def trajectory_corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from ckpt.bench import trajectories

    found = trajectories.find_corpus()
    if found is not None and found.is_dir():
        yield found
        return
    directory = tmp_path_factory.mktemp("trajectories")
    _write_standin_corpus(directory)
    previous = os.environ.get(trajectories.ENV_VAR)
    os.environ[trajectories.ENV_VAR] = str(directory)  # subprocesses (the bench CLI) see it too
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(trajectories.ENV_VAR, None)
        else:
            os.environ[trajectories.ENV_VAR] = previous


@pytest.fixture
def signal_dispositions() -> Iterator[None]:
    """For tests serving in this process: a sidecar leaves SIGTERM and SIGINT ignored for good
    (serve_async's exit), so pytest's own handlers are put back after the test."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# The opt-in benchmarks' corpus (tests/bench/test_*_bench.py, `make bench`).
def pytest_addoption(parser: pytest.Parser) -> None:
    from ckpt.bench import trajectories

    parser.addoption(
        "--trajectories",
        default=None,
        help=f"trajectory corpus directory (default: ${trajectories.ENV_VAR}, else {trajectories.DEFAULT_DIR})",
    )


@pytest.fixture(scope="session")
def trajectory_dir(request: pytest.FixtureRequest) -> str | None:
    from ckpt.bench import trajectories

    path: str | None = request.config.getoption("--trajectories")
    if trajectories.find_corpus(path) is None:
        pytest.fail(
            f"no trajectory corpus: pass --trajectories DIR or set {trajectories.ENV_VAR}"
            f" (default {trajectories.DEFAULT_DIR} does not exist)"
        )
    return path
