"""A PutStream's answer to a batch stays within the sidecar's --max-message-bytes whatever its writes'
errors say: an error quotes a client's id cut short, and the longest messages of a batch whose errors would
still not fit are cut further. A batch answered over the limit failed the whole stream (RESOURCE_EXHAUSTED,
"Sent message larger than max"), the batch's good writes committed, and the client resent the same writes
for the same answer."""

from __future__ import annotations

from pathlib import Path

import grpc

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.server.failures import MAX_DETAILS_BYTES, put_stream_response
from ckpt.v1 import service_pb2
from tests.support import start_sidecar

SMALLEST = 128 * 1024  # the least --max-message-bytes the sidecar takes
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
QUOTED = repr("\x01" * 64)  # how an error quotes a session id of such characters: its first 64


def stream(data_dir: Path, puts: list[service_pb2.PutRequest]) -> list[service_pb2.PutResult]:
    """``puts`` in one batch through a sidecar at the smallest message limit, and a last write on its own."""
    sidecar = start_sidecar(data_dir, "--max-message-bytes", str(SMALLEST))
    try:
        with CheckpointClient(sidecar.unix_target, max_message_bytes=SMALLEST) as client:
            after = service_pb2.PutRequest(session_id="after", state=b"x")
            results = list(client.put_stream([*puts, after], batch_size=len(puts)))
            assert results[-1].WhichOneof("outcome") == "response"
            assert client.get("after").state == b"x"  # the stream went on past the batch
            return results[:-1]
    finally:
        assert sidecar.stop() == 0, sidecar.log()


def test_an_error_quotes_a_long_session_id_cut_short_and_the_batch_is_answered(tmp_path: Path) -> None:
    good = [service_pb2.PutRequest(session_id=f"g{i}", state=b"ok") for i in range(10)]
    bad = [service_pb2.PutRequest(session_id="\x01" * 256) for _ in range(200)]  # quoted whole: 1 KiB each
    results = stream(tmp_path / "data", good + bad)
    assert [r.WhichOneof("outcome") for r in results] == ["response"] * 10 + ["error"] * 200
    for result in results[10:]:
        assert result.error.code == INVALID
        assert result.error.message == (
            f"session_id {QUOTED}... (256 characters) contains an ASCII control character (U+0000-U+001F or U+007F)"
        )


def test_a_batch_whose_errors_would_pass_the_limit_has_its_longest_messages_cut(tmp_path: Path) -> None:
    # 1000 writes of ~70 bytes, whose errors say ~360 bytes each: ~360 KB of answer, the limit 128 KiB.
    bad = [service_pb2.PutRequest(session_id="\x01" * 65) for _ in range(990)]
    empty = [service_pb2.PutRequest(session_id="") for _ in range(5)]  # a short error, kept whole
    good = [service_pb2.PutRequest(session_id=f"g{i}", state=b"ok") for i in range(5)]
    results = stream(tmp_path / "data", bad + empty + good)
    assert [r.WhichOneof("outcome") for r in results] == ["error"] * 995 + ["response"] * 5
    assert all(r.error.code == INVALID for r in results[:995])
    full = f"session_id {QUOTED}... (65 characters) contains an ASCII control character (U+0000-U+001F"
    for result in results[:990]:
        cut, mark = result.error.message.split("... (cut: ")
        assert full.startswith(cut) and len(cut) > 20, result.error.message
        assert mark == f"{len(full) + len(' or U+007F)')} bytes)"
    assert results[990].error.message.startswith("session_id is empty; it must be 1-256 bytes")


def test_a_batch_answer_fits_whatever_its_messages() -> None:
    def error(message: str) -> service_pb2.PutResult:
        return service_pb2.PutResult(error=service_pb2.PutError(code=3, message=message, current_version=2**63))

    done = service_pb2.PutResult(response=service_pb2.PutResponse(version=2**63, stored_bytes=2**40))
    for text in ("é" * (MAX_DETAILS_BYTES // 2), "x" * MAX_DETAILS_BYTES, "😀" * 400):
        results = [error(text) if i % 3 else done for i in range(1000)]
        for limit in (SMALLEST, 300_000, 10**6):
            response = put_stream_response(list(results), 2**60, limit)
            assert response.ByteSize() <= limit
            assert len(response.results) == 1000 and response.batch_id == 2**60
            assert response.results[0] == done
            messages = {r.error.message for r in response.results[1::3]}
            assert len(messages) == 1 and " (cut: " in messages.pop()
    short = [error("short"), error("y" * 5000), done]
    response = put_stream_response(short, 1, service_pb2.PutStreamResponse(results=short).ByteSize() - 100)
    assert response.results[0].error.message == "short"  # the short ones whole, the longest cut
    assert response.results[1].error.message.endswith("... (cut: 5000 bytes)")
    assert list(put_stream_response(short, 1, SMALLEST).results) == short  # within the limit: untouched
