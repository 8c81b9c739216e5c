"""Replies carrying states, encoded with the state spliced in (replybytes.py): the bytes protobuf gives.

The oracle is upb's own serialization of the same message; with at most one
label the bytes are compared (a map's order is upb's to choose), and always
the message parsed back.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckpt.codec import FrameKind
from ckpt.sidecar.server.convert import version_info_pb
from ckpt.sidecar.server.replybytes import get_response_bytes, list_versions_bytes, version_with_state_bytes
from ckpt.sidecar.store.types import GetResult, VersionInfo, WriteMode
from ckpt.v1 import service_pb2

U64 = st.integers(0, 2**64 - 1)
_states = st.one_of(
    st.just(b""),
    st.binary(max_size=300),
    st.integers(127, 129).map(lambda n: b"\x07" * n),  # the length's varint at its one/two-byte boundary
    st.sampled_from([1 << 14, (1 << 21) + 3]).map(lambda n: bytes(range(256)) * (n // 256) + b"\x01" * (n % 256)),
)
_infos = st.builds(
    VersionInfo,
    version=st.integers(1, 2**64 - 1),
    parent_version=U64,
    created_unix_nanos=st.integers(0, 2**63 - 1),
    frame_kind=st.sampled_from(list(FrameKind)),
    stored_bytes=U64,
    state_size=U64,
    labels=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    mode=st.sampled_from(list(WriteMode)),
    message_type=st.sampled_from(["", "acme.agent.v1.State", "ckpt.v1.Checkpoint"]),
)


def _with_state(info: VersionInfo, state: bytes) -> service_pb2.VersionInfo:
    msg = version_info_pb(info)
    msg.state = state
    return msg


@given(info=_infos, state=_states)
def test_a_get_reply_is_the_encoding_of_its_message(info: VersionInfo, state: bytes) -> None:
    got = GetResult(info.version, state, info)
    expected = service_pb2.GetResponse(
        version=got.version, state=state, info=version_info_pb(info), message_type=info.message_type
    )
    ours = get_response_bytes(got)
    assert service_pb2.GetResponse.FromString(ours) == expected
    if len(info.labels) <= 1:
        assert ours == expected.SerializeToString()


@given(info=_infos, state=_states)
def test_a_version_with_its_state_is_the_encoding_of_its_message(info: VersionInfo, state: bytes) -> None:
    expected = _with_state(info, state)
    ours = version_with_state_bytes(info, state)
    assert service_pb2.VersionInfo.FromString(ours) == expected
    if len(info.labels) <= 1:
        assert ours == expected.SerializeToString()


@given(
    versions=st.lists(st.tuples(_infos.filter(lambda i: len(i.labels) <= 1), _states), max_size=4),
    token=st.sampled_from(["", "t0k3n", "x" * 200]),
)
def test_a_history_page_with_states_is_the_encoding_of_its_message(
    versions: list[tuple[VersionInfo, bytes]], token: str
) -> None:
    expected = service_pb2.ListVersionsResponse(
        versions=[_with_state(info, state) for info, state in versions], next_page_token=token
    )
    ours = list_versions_bytes(versions, token)
    assert ours == expected.SerializeToString()
    assert service_pb2.ListVersionsResponse.FromString(ours) == expected


def test_an_empty_state_is_left_out_as_protobuf_leaves_it_out() -> None:
    info = VersionInfo(3, 2, 7, FrameKind.FULL, 10, 0, {}, WriteMode.REPLACE)
    reply = service_pb2.GetResponse.FromString(get_response_bytes(GetResult(3, b"", info)))
    assert not reply.state and reply.version == 3 and reply.info.version == 3
