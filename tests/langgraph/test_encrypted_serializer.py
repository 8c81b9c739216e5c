"""A saver given LangGraph's EncryptedSerializer (AES, pycryptodome) stores every value encrypted and still
stores a step's change alone: each serialization is a new ciphertext, so the elements a list shares with the
head are told apart by their plaintext, and only the ones a step adds are encrypted and written."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import START, MessagesState, StateGraph

from ckpt.langgraph.v1 import records_pb2
from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.langgraph import CkptSaver
from ckpt.sidecar.langgraph.elements import Elements
from ckpt.sidecar.store import Store
from tests.support import Sidecar

KEY = b"0123456789abcdef0123456789abcdef"
MARKER = "plaintext-marker"
TURNS = 12
#: A turn's checkpoints: its input, the input applied, the reply.
PER_TURN = 3


def _serde() -> EncryptedSerializer:
    return EncryptedSerializer.from_pycryptodome_aes(key=KEY)


def _app(saver: Any) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"{MARKER} answer {len(state['messages'])}")]}

    graph: Any = StateGraph(MessagesState)
    return graph.add_node("reply", reply).add_edge(START, "reply").compile(checkpointer=saver)


def _turns(app: Any, first: int, last: int) -> None:
    config: Any = {"configurable": {"thread_id": "t"}}
    for i in range(first, last):
        app.invoke({"messages": [HumanMessage(content=f"{MARKER} question {i}")]}, config, durability="sync")


def _talk(values: dict[str, Any]) -> list[tuple[str, Any]]:
    """A state's messages without their ids (each run draws its own)."""
    return [(m.type, m.content) for m in values["messages"]]


def _spied(saver: CkptSaver) -> list[tuple[bool, records_pb2.Step]]:
    """Every Step ``saver`` sends to its store from now on, and whether it is a MERGE (a step continuing
    the head) or the whole checkpoint."""
    sent: list[tuple[bool, records_pb2.Step]] = []
    backend: Any = saver._backend
    put = backend.put

    def spy(session_id: str, step: bytes, merge: bool, *rest: Any) -> Any:
        sent.append((merge, records_pb2.Step.FromString(step)))
        return put(session_id, step, merge, *rest)

    backend.put = spy
    return sent


@pytest.fixture(params=["embedded", "sidecar"])
def open_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], CkptSaver]]:
    savers: list[CkptSaver] = []
    if request.param == "embedded":

        def fresh() -> CkptSaver:  # one at a time: the embedded store is one process's
            for saver in savers:
                saver.close()
            savers.append(CkptSaver.embedded(tmp_path / "embedded", serde=_serde()))
            return savers[-1]
    else:
        sidecar: Sidecar = request.getfixturevalue("sidecar")

        def fresh() -> CkptSaver:
            savers.append(CkptSaver(sidecar.unix_target, serde=_serde()))
            return savers[-1]

    yield fresh
    for saver in savers:
        saver.close()


def test_an_encrypted_thread_stores_each_steps_messages_alone_and_reads_as_in_memory_saver(
    open_saver: Callable[[], CkptSaver],
) -> None:
    saver = open_saver()
    sent = _spied(saver)
    _turns(_app(saver), 0, TURNS)
    merged = [step for merge, step in sent if merge]
    assert len(merged) == PER_TURN * TURNS - 1  # the first is written whole
    for step in merged:  # a turn's checkpoints add its question, then its answer: one message each
        assert sum(len(entry.values) for entry in step.items) <= 1, step.items
    for _, step in sent:
        typed = [*step.channels.values(), step.checkpoint, step.metadata]
        typed += [value for entry in step.items for value in entry.values]
        assert all(t.type.endswith("+aes") or t.type in ("ckpt.items", "empty") for t in typed), typed
        assert MARKER.encode() not in step.SerializeToString()
    # Read by a saver that remembers nothing (a new process): what was stored, decrypted.
    reopened = open_saver()
    memory = InMemorySaver(serde=_serde())
    _turns(_app(memory), 0, TURNS)
    config: Any = {"configurable": {"thread_id": "t"}}
    expected = [_talk(s.values) for s in _app(memory).get_state_history(config)]
    assert len(expected) == PER_TURN * TURNS
    assert [_talk(s.values) for s in _app(reopened).get_state_history(config)] == expected
    # It goes on from the stored head: the digests of the elements it read are those of their plaintext.
    sent_after = _spied(reopened)
    _turns(_app(reopened), TURNS, TURNS + 2)
    assert [merge for merge, _ in sent_after] == [True] * 2 * PER_TURN
    assert all(sum(len(e.values) for e in step.items) <= 1 for _, step in sent_after)
    _turns(_app(memory), TURNS, TURNS + 2)
    assert _talk(_app(reopened).get_state(config).values) == _talk(_app(memory).get_state(config).values)


def test_every_stored_version_holds_ciphertext_only(tmp_path: Path) -> None:
    with CkptSaver.embedded(tmp_path / "data", serde=_serde()) as saver:
        _turns(_app(saver), 0, 4)
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        [session] = store.list_sessions()[0]
        versions = [v.version for v in store.list_versions(session.session_id, page_size=100)[0]]
        assert len(versions) == 4 * PER_TURN
        for version in versions:
            state = store.get(session.session_id, version).state
            assert MARKER.encode() not in state
            step = records_pb2.Step.FromString(state)
            stored = [step.checkpoint, step.metadata, *(v for e in step.items for v in e.values)]
            assert all(t.type.endswith("+aes") for t in stored), stored


def test_an_element_stored_encrypted_has_the_digest_of_its_plaintext() -> None:
    elements = Elements(_serde())
    pairs = elements.dumps([HumanMessage(content="hello"), b"raw", 7])
    sealed = elements.seal(pairs)
    assert [t for t, _ in sealed] == [f"{t}+aes" for t, _ in pairs]
    assert [d for _, d in sealed] != [d for _, d in elements.seal(pairs)]  # a new nonce each time
    plain = Elements(_serde().serde)
    assert [elements.stored_digest(t, d) for t, d in sealed] == [plain.stored_digest(t, d) for t, d in pairs]
    # One stored before the serializer encrypted matches none: the next step writes it again, encrypted.
    assert not {elements.stored_digest(t, d) for t, d in pairs} & {plain.stored_digest(t, d) for t, d in pairs}


def test_a_thread_stored_unencrypted_is_written_encrypted_from_its_first_encrypted_step(tmp_path: Path) -> None:
    config: Any = {"configurable": {"thread_id": "t"}}
    with CkptSaver.embedded(tmp_path / "data") as plain:
        _turns(_app(plain), 0, 3)
    with CkptSaver.embedded(tmp_path / "data", serde=_serde()) as encrypted:
        sent = _spied(encrypted)
        _turns(_app(encrypted), 3, 4)
        first = next(step for _, step in sent if step.items)  # the turn's question added
        assert [(e.start, len(e.values)) for e in first.items] == [(0, 7)]  # the six stored, and the new one
        assert all(v.type.endswith("+aes") for e in first.items for v in e.values)
        messages = _app(encrypted).get_state(config).values["messages"]
        assert [m.content for m in messages][-2:] == [f"{MARKER} question 3", f"{MARKER} answer 7"]
        assert len(messages) == 8


class _Compressing(EncryptedSerializer):
    """A serializer storing another format than EncryptedSerializer's: its own dumps_typed and loads_typed."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        return type_, zlib.compress(data)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return super().loads_typed((data[0], zlib.decompress(data[1])))


def test_a_subclass_of_encrypted_serializer_is_called_as_any_serializer(tmp_path: Path) -> None:
    serde = _Compressing(_serde().cipher)
    with CkptSaver.embedded(tmp_path / "data", serde=serde) as saver:
        _turns(_app(saver), 0, 3)
        config: Any = {"configurable": {"thread_id": "t"}}
        assert len(_app(saver).get_state(config).values["messages"]) == 6


def test_a_head_read_decrypts_each_element_once(tmp_path: Path) -> None:
    """Its digests are taken when a put continues it, not at every read."""
    serde = _serde()
    decrypt = serde.cipher.decrypt
    calls = []

    def counted(name: str, data: bytes) -> bytes:
        calls.append(name)
        return decrypt(name, data)

    serde.cipher.decrypt = counted  # type: ignore[method-assign,assignment]
    with CkptSaver.embedded(tmp_path / "data", serde=serde) as saver:
        _turns(_app(saver), 0, 3)
    config: Any = {"configurable": {"thread_id": "t"}}
    with CkptSaver.embedded(tmp_path / "data", serde=serde) as reader:
        calls.clear()
        found = reader.get_tuple(config)
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == 6
        # Six messages, the checkpoint and its metadata, each once.
        assert len(calls) == 8
