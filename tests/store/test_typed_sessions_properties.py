"""Random REPLACE and MERGE sequences on a registered, dynamic message type: every version reads back equal
as a message to what the writes made it, from the store that wrote it (hot) and from one reopened (cold).

The oracle is protobuf's own merge (MergeFrom) over the messages the writes sent; REPLACE versions must
also read back byte for byte. Chain policies that restart chains often (and so compact often) run beside
the default one.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt.codec import ChainPolicy
from ckpt.sidecar import Store, StoreConfig, WriteMode
from tests.support import AGENT_STATE, agent_file, agent_state_class, descriptor_set_of

STATE = agent_state_class()
POLICIES = {
    "default": ChainPolicy(),
    # a chain restart (a compaction) every few versions
    "short chains": ChainPolicy(max_depth=3, decode_floor_bytes=0, max_superseded_fraction=0.3),
    # long chains: superseded bytes pile up before any compaction
    "long chains": ChainPolicy(max_depth=64, decode_floor_bytes=1 << 20, max_superseded_fraction=0.9),
}

texts = st.text(alphabet="abcdefghij xyz0123456789", max_size=60)


@st.composite
def messages(draw: Any) -> Any:
    msg = STATE()
    for key in draw(st.lists(st.sampled_from(["e1", "e2", "e3", "e4"]), max_size=3, unique=True)):
        entity = msg.entities[key]
        entity.name = draw(texts)
        entity.score = draw(st.integers(-(2**40), 2**40))
        if draw(st.booleans()):
            entity.note.text = draw(texts)
    msg.log.extend(draw(st.lists(texts, max_size=3)))
    if draw(st.booleans()):
        msg.step = draw(st.integers(0, 1000))  # 0 too: optional, so set back to zero is kept
    if draw(st.booleans()):
        msg.last.text = draw(texts)
    return msg


writes = st.lists(st.tuples(st.sampled_from([WriteMode.REPLACE, WriteMode.MERGE]), messages()), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=writes, policy=st.sampled_from(sorted(POLICIES)))
def test_every_version_of_a_typed_session_reads_back_equal_as_a_message(sequence: list[Any], policy: str) -> None:
    expected: list[Any] = []
    sent: list[bytes] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = StoreConfig(data_dir=Path(tmp) / "data", chain_policy=POLICIES[policy], sweep_interval_seconds=3600)
        with Store(config) as store:
            store.register_types(descriptor_set_of(agent_file()))
            current = STATE()
            for n, (mode, msg) in enumerate(sequence, 1):
                data = msg.SerializeToString()
                store.put("s", data, mode=mode, expected_version=n - 1, message_type=AGENT_STATE)
                if mode is WriteMode.REPLACE:
                    current = STATE()
                current.MergeFrom(msg)
                expected.append(STATE.FromString(current.SerializeToString()))
                sent.append(data if mode is WriteMode.REPLACE else b"")
            check(store, expected, sent)  # hot: the state cache holds the head
        with Store(replace(config, cache_size_bytes=0)) as cold:
            check(cold, expected, sent)


def check(store: Store, expected: list[Any], sent: list[bytes]) -> None:
    assert store.get("s").version == len(expected)
    for version, (want, data) in enumerate(zip(expected, sent, strict=True), 1):
        got = store.get("s", version)
        assert got.info.message_type == AGENT_STATE
        assert STATE.FromString(got.state) == want, version
        if data:  # a REPLACE: byte for byte
            assert got.state == data, version
