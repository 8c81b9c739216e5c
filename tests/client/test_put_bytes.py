"""A Put's request encoded with its state joined in (putbytes.py): the bytes protobuf gives.

The oracle is upb's own serialization of the same request (with at most one
label: a map's order is upb's to choose), and the request parsed back.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckpt.sidecar.client import CheckpointClient
from ckpt.sidecar.client.putbytes import PutCall, put_call_bytes
from ckpt.v1 import service_pb2
from tests.support import Sidecar

_states = st.one_of(
    st.binary(max_size=64),
    st.integers(127, 129).map(lambda n: b"\x07" * n),  # the length's varint at its one/two-byte boundary
    st.just(b"\x0a\x05hello" * (1 << 17)),
)
_requests = st.builds(
    service_pb2.PutRequest,
    session_id=st.text(max_size=200),  # past 127 bytes its length takes a second varint byte
    state=_states,
    mode=st.sampled_from([service_pb2.WRITE_MODE_REPLACE, service_pb2.WRITE_MODE_MERGE]),
    expected_version=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    request_id=st.text(alphabet="0123456789abcdef", max_size=32),
    labels=st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=1),
    message_type=st.sampled_from(["", "acme.agent.v1.State"]),
)


@given(request=_requests)
def test_a_put_is_encoded_as_protobuf_encodes_its_request(request: service_pb2.PutRequest) -> None:
    rest = service_pb2.PutRequest()
    rest.CopyFrom(request)
    rest.ClearField("state")
    call = PutCall(rest, request.state)
    assert call.message() == request
    assert put_call_bytes(call) == request.SerializeToString()
    assert put_call_bytes(call) == put_call_bytes(call)  # a retry sends the same


def test_a_large_state_put_through_the_client_reads_back_the_same(sidecar: Sidecar) -> None:
    state = bytes(range(256)) * (3 << 12)  # 3 MiB
    with CheckpointClient(sidecar.unix_target) as client:
        put = client.put("large", state, labels={"k": "v"})
        assert client.get("large").state == state
        again = client.put("large", state, expected_version=put.version)
        assert again.version == put.version + 1
