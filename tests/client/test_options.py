"""A client's own options are refused by name when wrong; an async client belongs to the loop it was made in."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.client import ENV_VARS, AsyncCheckpointClient, CheckpointClient
from tests.client.support import FLAVOURS, open_client
from tests.support import Sidecar


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"timeout_seconds": 0},
            ValueError,
            r"timeout_seconds must be > 0 and at most 3153600000 \(100 years\), got 0",
        ),
        # gRPC's deadline overflows past ~7.4e9 s: every call then failed at once as DEADLINE_EXCEEDED.
        (
            {"timeout_seconds": 1e10},
            ValueError,
            r"timeout_seconds must be > 0 and at most 3153600000 .*got 10000000000.0",
        ),
        ({"timeout_seconds": float("inf")}, ValueError, "at most 3153600000 .*got inf"),
        ({"timeout_seconds": float("nan")}, ValueError, "at most 3153600000 .*got nan"),
        ({"timeout_seconds": "5"}, TypeError, "timeout_seconds must be a number"),
        ({"retries": -1}, ValueError, "retries must be >= 0, got -1"),
        ({"max_message_bytes": 100}, ValueError, "max_message_bytes must be >= 1024, got 100"),
        ({"max_message_bytes": 2**31}, ValueError, "max_message_bytes must be <= 2147483647, got 2147483648"),
        ({"tls": "yes"}, TypeError, "tls must be a ClientTLS, True or False, not str"),
        ({"tls": True}, ValueError, "tls is for host:port targets"),
    ],
)
def test_bad_client_options_are_refused(
    tmp_path: Path, flavour: str, kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        open_client(flavour, f"unix:{tmp_path / 'x.sock'}", **kwargs)


def test_an_async_client_belongs_to_the_loop_it_was_made_in(sidecar: Sidecar) -> None:
    """Used from another loop, every call failed with asyncio's "attached to a different loop"."""
    with pytest.raises(RuntimeError, match="must be created in the event loop that uses it"):
        AsyncCheckpointClient(sidecar.unix_target)

    async def make() -> tuple[AsyncCheckpointClient, Any]:
        c = AsyncCheckpointClient(sidecar.unix_target)
        await c.put("loop", b"first")
        ref = await c.put_blob(b"blob", session_id="loop")
        return c, c.get_blob(ref)  # an iterator made in this loop, iterated in the next

    kept, chunks = asyncio.run(make())

    async def reuse() -> None:
        with pytest.raises(RuntimeError, match="belongs to the event loop it was created in, not this one"):
            await kept.get("loop")
        with pytest.raises(RuntimeError, match="belongs to the event loop it was created in, not this one"):
            kept.put_stream([])
        with pytest.raises(RuntimeError, match="belongs to the event loop it was created in, not this one"):
            await anext(chunks)

    asyncio.run(reuse())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_client_from_the_environment_names_the_variable_of_a_bad_value(
    tmp_path: Path, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = CheckpointClient if flavour == "sync" else AsyncCheckpointClient
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CKPT_TARGET", f"unix:{tmp_path / 'x.sock'}")
    monkeypatch.setenv("CKPT_MAX_MESSAGE_BYTES", "5")
    with pytest.raises(ValueError, match=r"^CKPT_MAX_MESSAGE_BYTES must be >= 1024, got 5$"):
        cls.from_env()
    with pytest.raises(ValueError, match=r"^max_message_bytes must be >= 1024, got 7$"):  # the argument wins
        cls.from_env(max_message_bytes=7)
    monkeypatch.setenv("CKPT_MAX_MESSAGE_BYTES", "1_048_576")  # int() reads it; as typed, it is no integer
    with pytest.raises(ValueError, match=r"^CKPT_MAX_MESSAGE_BYTES '1_048_576' is not an integer$"):
        cls.from_env()
    monkeypatch.delenv("CKPT_MAX_MESSAGE_BYTES")
    monkeypatch.setenv("CKPT_TLS_CLIENT_CERT_FILE", str(tmp_path / "agent.pem"))
    with pytest.raises(ValueError, match=r"^CKPT_TLS_CLIENT_CERT_FILE and CKPT_TLS_CLIENT_KEY_FILE go together"):
        cls.from_env()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("target", ["127.0.0.1:116916", "127.0.0.1:-14156", "localhost:5_0", "localhost:"])
def test_a_target_port_out_of_range_is_refused_not_wrapped(
    flavour: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC took port 116916 as 116916 - 65536 = 51380 and connected there: a client reached another port."""
    cls = CheckpointClient if flavour == "sync" else AsyncCheckpointClient
    with pytest.raises(ValueError, match=rf"^target port must be in 0\.\.65535, got '{target}'$"):
        cls(target)
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CKPT_TARGET", target)
    with pytest.raises(ValueError, match=rf"^CKPT_TARGET port must be in 0\.\.65535, got '{target}'$"):
        cls.from_env()


@pytest.mark.parametrize(
    "target", ["localhost:50051", "[::1]:50051", "[::1]", "dns:///localhost:50051", "ipv4:127.0.0.1:1"]
)
def test_targets_in_grpcs_forms_are_taken(target: str) -> None:
    CheckpointClient(target).close()  # no call: nothing needs to listen
