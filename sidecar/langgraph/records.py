"""LangGraph checkpoints as ckpt records, both ways (proto/ckpt/langgraph/v1/records.proto). No I/O.

A thread's checkpoint namespace is one session; a checkpoint is one version holding a ``Step``; pending
writes are ``langgraph.writes`` events of the session's log after the seq their checkpoint's Step names.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ckpt.langgraph.v1 import records_pb2

from ..ids import (
    HAS_CONTROL,
    MAX_LABEL_VALUE_BYTES,
    MAX_SESSION_ID_BYTES,
    NOT_UTF8,
    has_control,
    has_lone_surrogate,
    quoted,
)
from .elements import Digest, Elements, Pair, digest, xxh3_128

STEP_TYPE = records_pb2.Step.DESCRIPTOR.full_name
#: The session label naming the thread, so that a thread's namespaces are found together.
THREAD_LABEL = "langgraph.thread"
#: The label of a session that holds a namespace's newest checkpoint while prune rewrites the namespace.
PRUNING_LABEL = "langgraph.pruning"
#: Version labels: the checkpoint a version holds, and its run.
ID_LABEL = "langgraph.id"
RUN_LABEL = "langgraph.run"
WRITES_EVENT = "langgraph.writes"
EMPTY = "empty"
ITEMS = "ckpt.items"

_PREFIX = "langgraph/"
#: A prune's stage: the namespace's session id with this prefix, or, when that would be too long, with
#: the shorter one (no longer than _PREFIX, so that every namespace a put takes can be pruned).
_PRUNING_PREFIX = "langgraph-pruning/"
_SHORT_PRUNING_PREFIX = "lgpruning/"


@dataclass(frozen=True, slots=True)
class Where:
    """A checkpoint namespace of a thread: the session holding it."""

    thread_id: str
    checkpoint_ns: str

    @property
    def session_id(self) -> str:
        return _session_id(self.thread_id, self.checkpoint_ns)

    @property
    def pruning_session_id(self) -> str:
        """The session a prune stages the namespace's newest checkpoint in."""
        check_where(self.thread_id, self.checkpoint_ns)
        staging = self._named(_PRUNING_PREFIX)
        return staging if len(staging.encode()) <= MAX_SESSION_ID_BYTES else self._named(_SHORT_PRUNING_PREFIX)

    def _named(self, prefix: str) -> str:
        return _name(prefix, self.thread_id, self.checkpoint_ns)

    def config(self, checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": self.thread_id,
                "checkpoint_ns": self.checkpoint_ns,
                "checkpoint_id": checkpoint_id,
            }
        }


def check_where(thread_id: str, checkpoint_ns: str) -> None:
    """Refuses a thread id and namespace a put would refuse, naming them and the limit that applies (a put
    and a read the same): the session id would be refused, but it is not what the caller named."""
    for field, value in (("thread_id", thread_id), ("checkpoint_ns", checkpoint_ns)):
        _check_text(field, value)
    _check_thread_size(thread_id)
    overhead = len(f"{_PREFIX}{len(thread_id)}//".encode())
    size = len(thread_id.encode()) + len(checkpoint_ns.encode())
    if size + overhead > MAX_SESSION_ID_BYTES:
        raise ValueError(
            f"thread_id and checkpoint_ns are {size} bytes of UTF-8 together; ckpt's savers take at most"
            f" {MAX_SESSION_ID_BYTES - overhead} ({MAX_SESSION_ID_BYTES}, a session id's limit, less the"
            f" {overhead} bytes they are stored with)"
        )


@functools.lru_cache(maxsize=4096)
def _session_id(thread_id: str, checkpoint_ns: str) -> str:
    # Every call of a step names its namespace several times: checked once (a refusal is not cached).
    check_where(thread_id, checkpoint_ns)
    return _name(_PREFIX, thread_id, checkpoint_ns)


def _name(prefix: str, thread_id: str, checkpoint_ns: str) -> str:
    # The thread id's length makes the name unambiguous whatever characters the id and namespace hold.
    return f"{prefix}{len(thread_id)}/{thread_id}/{checkpoint_ns}"


def _check_thread_size(thread_id: str) -> None:
    size = len(thread_id.encode())
    if size > MAX_LABEL_VALUE_BYTES:
        raise ValueError(f"thread_id is {size} bytes: ckpt's savers take at most {MAX_LABEL_VALUE_BYTES}")


def _check_text(field: str, value: str) -> None:
    if has_control(value):
        raise ValueError(f"{field} {quoted(value)} {HAS_CONTROL}: ckpt's savers cannot store it")
    if has_lone_surrogate(value):
        raise ValueError(f"{field} {quoted(value)} {NOT_UTF8}: ckpt's savers cannot store it")


def where_of(config: RunnableConfig) -> Where:
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise ValueError('config["configurable"]["thread_id"] is required')
    return Where(str(thread_id), str(configurable.get("checkpoint_ns") or ""))


def where_of_session(session_id: str) -> Where | None:
    """The namespace a session holds (None for a session that is not a saver's: any client may name one
    ``langgraph/...``)."""
    return _parse(_PREFIX, session_id)


def where_of_stage(session_id: str) -> Where | None:
    """The namespace a prune's stage (``Where.pruning_session_id``) holds, None for another session."""
    return _parse(_PRUNING_PREFIX, session_id) or _parse(_SHORT_PRUNING_PREFIX, session_id)


def _parse(prefix: str, session_id: str) -> Where | None:
    """The length is ASCII digits as the saver writes it (no leading zero): ``str.isdigit`` also takes '²'
    (which ``int`` refuses) and other scripts' digits (which it reads)."""
    if not session_id.startswith(prefix):
        return None
    rest = session_id[len(prefix) :]
    digits, _, rest = rest.partition("/")
    if not (digits.isascii() and digits.isdigit()) or (digits != "0" and digits.startswith("0")):
        return None
    length = int(digits)
    if len(rest) <= length or rest[length] != "/":
        return None
    return Where(rest[:length], rest[length + 1 :])


def thread_label(thread_id: str) -> dict[str, str]:
    _check_text("thread_id", thread_id)
    _check_thread_size(thread_id)
    return {THREAD_LABEL: thread_id}


def thread_prefix(thread_id: str) -> str:
    """What the session id of every namespace of a thread begins with."""
    return f"{_PREFIX}{len(thread_id)}/{thread_id}/"


def version_labels(checkpoint_id: str, metadata: Mapping[str, Any]) -> dict[str, str]:
    labels = {ID_LABEL: checkpoint_id}
    run_id = metadata.get("run_id")
    # A run id that cannot be a label is kept in the metadata only: delete_for_runs reads labels.
    if isinstance(run_id, str) and 0 < len(run_id.encode()) <= MAX_LABEL_VALUE_BYTES:
        labels[RUN_LABEL] = run_id
    return labels


def _dumps(serde: SerializerProtocol, value: Any) -> Pair:
    # JsonPlusSerializer gives a bytearray's own bytes as they are (("bytearray", the bytearray)): a Typed's
    # data takes bytes alone.
    type_, data = serde.dumps_typed(value)
    return type_, bytes(data)


def _typed(serde: SerializerProtocol, value: Any) -> records_pb2.Typed:
    type_, data = _dumps(serde, value)
    return records_pb2.Typed(type=type_, data=data)


def _untyped(serde: SerializerProtocol, typed: records_pb2.Typed) -> Any:
    return serde.loads_typed((typed.type, typed.data))


#: The digests of a list channel's elements, by channel: what a step continuing it compares against.
Lists = Mapping[str, Sequence[Digest]]
#: A stored checkpoint's channels, by channel: its serialized value, and a list's elements (plaintext) or None.
StoredChannels = Mapping[str, tuple[Pair, Sequence[Pair] | None]]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A checkpoint ready to write: the patch of what changed (MERGE), what the whole Step (REPLACE) is
    made of, and the digests of its list channels' elements.

    A put continuing the head leaves the channels it did not change (``unchanged``) unserialized: their
    digests are the head's, and only a whole Step (:meth:`full`, :meth:`whole`) needs their values."""

    checkpoint_id: str
    patch: records_pb2.Step
    labels: dict[str, str]
    lists: dict[str, list[Digest]]
    channels: dict[str, records_pb2.Typed]
    #: The list channels' elements as Elements.dumps gives them (unencrypted): sealed when written.
    elements: dict[str, list[Pair]]
    codec: Elements
    values: Mapping[str, Any]
    unchanged: tuple[str, ...] = ()

    def whole(self, stored: StoredChannels | None = None) -> tuple[dict[str, records_pb2.Typed], dict[str, list[Pair]]]:
        """Every channel's value and every list's elements. The unchanged ones are made once: copied from the
        head's channels as ``stored``, else serialized now (a list changed in place then written as it is
        now); their digests are made those of what is written."""
        channels, elements = self.channels, self.elements
        for k in self.unchanged:
            if k not in channels:
                if stored is not None and k in stored:
                    pairs = _copy_stored(stored[k], k, channels, elements)
                else:
                    pairs = _encode_channel(self.codec, k, self.values[k], channels, elements)
                if pairs is not None:
                    self.lists[k] = [digest(t, d) for t, d in pairs]
        return channels, elements

    def full(self, stored: StoredChannels | None = None) -> records_pb2.Step:
        """The whole Step: every channel of the checkpoint (made only for a write that does not continue
        the head, since it holds every element of every list); ``stored``: as whole's."""
        patch = self.patch
        channels, elements = self.whole(stored)
        return records_pb2.Step(
            checkpoint_id=patch.checkpoint_id,
            parent_checkpoint_id=patch.parent_checkpoint_id,
            checkpoint=patch.checkpoint,
            metadata=patch.metadata,
            writes_after_seq=patch.writes_after_seq,
            channels=channels,
            items=[records_pb2.Items(channel=k, values=_typed_all(self.codec.seal(e))) for k, e in elements.items()],
        )


def _encode_channel(
    codec: Elements,
    k: str,
    v: Any,
    channels: dict[str, records_pb2.Typed],
    elements: dict[str, list[Pair]],
    known: Sequence[Pair] | None = None,
) -> list[Pair] | None:
    """Serialize channel ``k``'s value into ``channels`` (and a list's elements into ``elements``); the
    elements of a list, else None. ``known``: the elements of the list it continues, if the saver holds them."""
    # Element by element, so that a step sends and stores the messages it added, not the conversation.
    if type(v) is list:
        pairs = codec.dumps_after(v, known) if known is not None else None
        elements[k] = pairs = codec.dumps(v) if pairs is None else pairs
        channels[k] = records_pb2.Typed(type=ITEMS)
        return pairs
    channels[k] = _typed(codec.serde, v)
    return None


def _digests(pairs: list[Pair], head_pairs: Sequence[Pair] | None, head: Sequence[Digest] | None) -> list[Digest]:
    """The digests of a list's ``pairs``: for those dumps_after took from the head's (``head_pairs``, the very
    pairs, whose digests are ``head``), the head's; the others hashed (digest's, inlined: a step may hash
    every element)."""
    if head_pairs and head is not None and len(head) == len(head_pairs) <= len(pairs):
        start = len(head_pairs)
        if pairs[start - 1] is head_pairs[-1]:
            return [*head, *((t, xxh3_128(d)) for t, d in pairs[start:])]
    return [(t, xxh3_128(d)) for t, d in pairs]


def _copy_stored(
    stored: tuple[Pair, Sequence[Pair] | None],
    k: str,
    channels: dict[str, records_pb2.Typed],
    elements: dict[str, list[Pair]],
) -> list[Pair] | None:
    """Channel ``k`` as stored, into ``channels`` (and a list's elements into ``elements``); as _encode_channel."""
    (type_, data), plain = stored
    channels[k] = records_pb2.Typed(type=type_, data=data)
    if plain is None:
        return None
    elements[k] = pairs = list(plain)
    return pairs


def _typed_all(pairs: Sequence[Pair]) -> list[records_pb2.Typed]:
    return [records_pb2.Typed(type=t, data=d) for t, d in pairs]


def _common_prefix(old: Sequence[Digest], new: Sequence[Digest]) -> int:
    n = min(len(old), len(new))
    if old[:n] == new[:n]:  # a step that appended: one comparison in C, not one per element
        return n
    i = 0
    while i < n and old[i] == new[i]:
        i += 1
    return i


def encode_put(
    codec: Elements,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
    parent_lists: Lists,
    writes_after_seq: int,
    *,
    continues_head: bool = False,
    stored: StoredChannels | None = None,
    head_elements: Mapping[str, Sequence[Pair]] | None = None,
) -> Encoded:
    """What ``put`` writes. The patch holds the channels ``new_versions`` names: their new values, "empty"
    for one without a value now, and for a list only the elements after those it shares with the parent's
    (``parent_lists``). The full Step holds every channel of the checkpoint. Both say the checkpoint's
    pending writes are in the log after ``writes_after_seq``. ``codec``: the saver's serializer, and how it
    serializes a list's elements.

    ``continues_head``: the parent is the head ``parent_lists`` are the digests of, so a channel
    ``new_versions`` does not name holds the head's value (LangGraph's contract): it is not serialized
    unless a whole Step is asked for, and a list's digests are the head's. ``stored``: the parent's channels
    as stored, which a channel ``new_versions`` does not name is written as (else as its value now).
    ``head_elements``: the elements of the head's lists as ``codec.dumps`` gives them, whose digests are
    ``parent_lists``': a list continuing them serializes at once (``Elements.dumps_after``)."""
    values = checkpoint["channel_values"]
    rest = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    metadata = get_checkpoint_metadata(config, metadata)
    checkpoint_id, parent_id = checkpoint["id"], get_checkpoint_id(config) or ""
    serde = codec.serde
    checkpoint_typed, metadata_typed = _typed(serde, rest), _typed(serde, metadata)
    channels: dict[str, records_pb2.Typed] = {}
    elements: dict[str, list[Pair]] = {}
    lists: dict[str, list[Digest]] = {}
    unchanged: list[str] = []
    # The channels written, in new_versions' order (a set's varies from process to process, the patch's bytes too).
    written = dict.fromkeys(new_versions)
    for k, v in values.items():
        if continues_head and k not in new_versions:
            # A list's digests are needed by the next put: the head's, which are those of what the store
            # holds for it. A list changed in place (a node's append, not returned) is not a change
            # LangGraph saw or names: it keeps the head's value, as PostgresSaver and InMemorySaver keep
            # the value of the channel's last version (the next put then compares against what is stored).
            if type(v) is not list:
                unchanged.append(k)
                continue
            if (known := parent_lists.get(k)) is not None:
                lists[k] = list(known)
                unchanged.append(k)
                continue
            # A list whose head digests the saver lacks (the head held no list there): written, so that
            # the digests kept are those of what is stored.
            written[k] = None
        head_pairs = head_elements.get(k) if head_elements else None
        if stored is not None and k not in new_versions and k in stored:
            pairs = _copy_stored(stored[k], k, channels, elements)
        else:
            pairs = _encode_channel(codec, k, v, channels, elements, head_pairs)
        if pairs is not None:
            lists[k] = _digests(pairs, head_pairs, parent_lists.get(k))
    changed: dict[str, records_pb2.Typed] = {}
    items: list[records_pb2.Items] = []
    for k in written:
        if k not in values:
            changed[k] = records_pb2.Typed(type=EMPTY)
            continue
        changed[k] = channels[k]
        if k in elements:
            # Entries of a list the parent did not hold (cut, emptied, replaced by another type) are still
            # stored: a list that is not the parent's starts over at 0.
            old = parent_lists.get(k)
            start = 0 if old is None else _common_prefix(old, lists[k])
            if old is None or start < len(old) or start < len(lists[k]):
                added = _typed_all(codec.seal(elements[k][start:]))
                items.append(records_pb2.Items(channel=k, start=start, values=added))
    patch = records_pb2.Step(
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent_id,
        checkpoint=checkpoint_typed,
        metadata=metadata_typed,
        writes_after_seq=writes_after_seq,
        channels=changed,
        items=items,
    )
    return Encoded(
        checkpoint_id=checkpoint_id,
        patch=patch,
        labels=version_labels(checkpoint_id, metadata),
        lists=lists,
        channels=channels,
        elements=elements,
        codec=codec,
        values=values,
        unchanged=tuple(unchanged),
    )


def decode_step(state: bytes) -> records_pb2.Step:
    return records_pb2.Step.FromString(state)


def stored_elements(step: records_pb2.Step) -> int:
    """List elements a step's state holds, those later entries cut off included (a rewrite drops them)."""
    return sum(len(entry.values) for entry in step.items)


def metadata_of(serde: SerializerProtocol, step: records_pb2.Step) -> dict[str, Any]:
    metadata: dict[str, Any] = _untyped(serde, step.metadata)
    return metadata


#: Metadata keys of a checkpoint a DeltaChannel of which is not a snapshot there (LangGraph's loop counts
#: the updates since the channel's last snapshot; the second key is an older form): its value is rebuilt
#: from older checkpoints and their writes. PostgresSaver's prune looks for the same keys.
_DELTA_KEYS = ("counters_since_delta_snapshot", "delta_writes_versioned")


def delta_channels_rebuilt(serde: SerializerProtocol, step: records_pb2.Step) -> bool:
    """Whether a DeltaChannel of ``step``'s checkpoint is rebuilt from its ancestors (read from its metadata)."""
    if not step.metadata.data:
        return False
    metadata = metadata_of(serde, step)
    return isinstance(metadata, Mapping) and any(k in metadata for k in _DELTA_KEYS)


def encode_writes(
    serde: SerializerProtocol, checkpoint_id: str, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
) -> bytes:
    return records_pb2.Writes(
        checkpoint_id=checkpoint_id,
        task_id=task_id,
        task_path=task_path,
        writes=[
            records_pb2.Write(idx=WRITES_IDX_MAP.get(channel, idx), channel=channel, value=_typed(serde, value))
            for idx, (channel, value) in enumerate(writes)
        ],
    ).SerializeToString()


class WriteFold:
    """A checkpoint's pending writes from its ``Writes`` events, fed in log order, as InMemorySaver keeps
    them: a write of an index >= 0 is kept once (a retried task's repeat is ignored), a special channel's
    (negative index) is replaced by a later one."""

    def __init__(self) -> None:
        self._writes: dict[tuple[str, int], tuple[str, records_pb2.Write]] = {}

    def add(self, writes: records_pb2.Writes) -> None:
        for write in writes.writes:
            key = (writes.task_id, write.idx)
            if write.idx >= 0 and key in self._writes:
                continue
            self._writes[key] = (writes.task_path, write)

    def pending(self, serde: SerializerProtocol) -> list[tuple[str, str, Any]]:
        ordered = sorted(self._writes.items(), key=lambda kv: writes_sort_key(kv[1][0], *kv[0]))
        return [(task_id, write.channel, _untyped(serde, write.value)) for (task_id, _), (_, write) in ordered]


def writes_by_checkpoint(payloads: Iterable[bytes]) -> dict[str, WriteFold]:
    """Every checkpoint's pending writes, from ``langgraph.writes`` payloads in log order."""
    folds: dict[str, WriteFold] = {}
    for payload in payloads:
        writes = records_pb2.Writes.FromString(payload)
        folds.setdefault(writes.checkpoint_id, WriteFold()).add(writes)
    return folds


def matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    return not filter or all(metadata.get(k) == v for k, v in filter.items())
