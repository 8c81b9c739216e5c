"""What a user imports: the clients' package names every public class, and the packages are typed."""

from __future__ import annotations

import importlib.resources
import tomllib

import ckpt.sidecar.client as client
from tests.support import ROOT


def test_the_client_package_exports_the_clients_their_errors_and_options() -> None:
    errors = [
        "AlreadyExists",
        "Checkpoint",
        "ClientClosed",
        "Conflict",
        "DataLoss",
        "DeadlineExceeded",
        "EventConflict",
    ]
    errors += ["FailedPrecondition", "InvalidArgument", "NotFound", "ResourceExhausted", "Unavailable"]
    clients = {
        "AsyncCheckpointClient",
        "CheckpointClient",
        "ClientTLS",
        "DEFAULT_RETRIES",
        "ENV_VARS",
        "EventFilter",
        "event",
        "parse_state",
    }
    assert set(client.__all__) == clients | {f"{name}Error" for name in errors}
    for name in client.__all__:
        assert getattr(client, name) is not None, name
    classes = [getattr(client, f"{name}Error") for name in errors if name != "ClientClosed"]
    assert all(issubclass(cls, client.CheckpointError) for cls in classes)
    assert issubclass(client.ClientClosedError, ValueError)


def test_the_packages_are_marked_typed_for_type_checkers() -> None:
    for package in ("ckpt.sidecar", "ckpt.codec", "ckpt"):
        assert importlib.resources.files(package).joinpath("py.typed").is_file(), package
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("ckpt.sidecar", "ckpt.codec", "ckpt"):
        assert "py.typed" in data.get(package, []), package
