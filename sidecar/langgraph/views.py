"""A checkpoint's Step as a saver reads it (``View``), and the views of namespaces' heads a saver keeps.

A view holds what a read of the checkpoint decodes: its ids, its checkpoint and metadata, its channels'
serialized values and its lists' serialized elements, in the serializer's (type, bytes) pairs. It is made
from a Step read, or, without reading anything, from what the saver itself just wrote: a whole Step, or a
MERGE patch onto the view of the head it continued, merged as the store merges it (protobuf's rules:
a map entry and a set field replace the parent's, Items entries are applied in order after its).

A saver keeps the view of each namespace's head it last put or read (``HeadViews``), under the version and
the state's XXH3-64 the store gave for it: a read of the head that finds that same version and digest uses
the view rather than parsing the state again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ckpt.langgraph.v1 import records_pb2

from .calls import Call, Op
from .elements import Digest, Elements, Pair, msgpack_array_header
from .heads import Head
from .records import EMPTY, ITEMS, Encoded, StoredChannels, Where, decode_step

#: Bytes of serialized values the views kept by a saver hold at most (the least recently used go first).
VIEW_CACHE_BYTES = 64 << 20
#: What a view weighs beyond its values' bytes, per value.
_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class View:
    """A checkpoint's Step as a read decodes it: its values as the serializer wrote them."""

    checkpoint_id: str
    parent_checkpoint_id: str
    checkpoint: Pair
    metadata: Pair
    #: The Step's channels map: each channel's serialized value, EMPTY or ITEMS.
    channels: dict[str, Pair]
    #: The list channels' elements, as the Step's Items entries make them.
    lists: dict[str, list[Pair]]
    writes_after_seq: int
    #: What it holds in memory, about: its values' bytes and _OVERHEAD each (see _weigh).
    weight: int

    def digests(self, elements: Elements) -> dict[str, Sequence[Digest]]:
        """The digests of its list channels' elements (those whose channel holds ITEMS), as ``elements``
        digests them."""
        digests = elements.stored_digests
        return {k: digests(e) for k, e in self.lists.items() if self.channels.get(k, ("",))[0] == ITEMS}


def _pair(typed: records_pb2.Typed) -> Pair:
    return typed.type, typed.data


def _weigh(pairs: Iterable[Pair]) -> int:
    return sum(len(data) + _OVERHEAD for _, data in pairs)


def _made(patch: records_pb2.Step, channels: dict[str, Pair], lists: dict[str, list[Pair]], weight: int) -> View:
    checkpoint, metadata = _pair(patch.checkpoint), _pair(patch.metadata)
    return View(
        checkpoint_id=patch.checkpoint_id,
        parent_checkpoint_id=patch.parent_checkpoint_id,
        checkpoint=checkpoint,
        metadata=metadata,
        channels=channels,
        lists=lists,
        writes_after_seq=patch.writes_after_seq,
        weight=weight + _weigh((checkpoint, metadata)),
    )


def view_of(step: records_pb2.Step) -> View:
    """The view of a Step read."""
    lists: dict[str, list[Pair]] = {}
    _apply_items(lists, step.items, step.checkpoint_id)
    return _view_parsed(step, lists)


def _apply_items(lists: dict[str, list[Pair]], items: Iterable[records_pb2.Items], checkpoint_id: str) -> None:
    """Apply Items entries in order, as a read of the Step holding them after ``lists``' own does: each cuts
    its channel's list at its start and extends it. A list is copied before its first change, so that the
    lists ``lists`` began with, another view's, are left as they were."""
    copied: set[str] = set()
    for entry in items:
        k, start = entry.channel, entry.start
        if k not in copied:
            lists[k] = list(lists.get(k, ()))
            copied.add(k)
        elements = lists[k]
        if start != len(elements):
            if start > len(elements):
                raise ValueError(
                    f"checkpoint {checkpoint_id!r}: channel {k!r}'s items start at {start},"
                    f" past its {len(elements)} elements"
                )
            del elements[start:]
        elements += [(v.type, v.data) for v in entry.values]


def _view_parsed(step: records_pb2.Step, lists: dict[str, list[Pair]]) -> View:
    channels = {k: _pair(v) for k, v in step.channels.items()}
    return _made(step, channels, lists, _weigh(channels.values()) + sum(_weigh(e) for e in lists.values()))


def views_of(states: Sequence[bytes]) -> list[View]:
    """``view_of`` each of ``states``, a namespace's states oldest first. One that begins with the state
    before it (a MERGE chain's states each extend the one before) is that state's message merged with the
    message in the bytes after it (protobuf's parse of concatenated messages is their merge): only those
    bytes are parsed, their Items applied onto the view before, their other fields merged by protobuf
    onto the one before's. A version's elements are parsed once, not once per later version, and shared
    by the views."""
    out: list[View] = []
    before: tuple[bytes, records_pb2.Step, View] | None = None
    for state in states:
        if before is not None and len(state) > len(before[0]) and state.startswith(before[0]):
            older, rest, parent = before
            suffix = records_pb2.Step.FromString(state[len(older) :])
            items = list(suffix.items)
            suffix.ClearField("items")
            step = records_pb2.Step()
            step.CopyFrom(rest)
            step.MergeFrom(suffix)
            lists = dict(parent.lists)
            _apply_items(lists, items, step.checkpoint_id)
        else:
            step = records_pb2.Step.FromString(state)
            lists = {}
            _apply_items(lists, step.items, step.checkpoint_id)
            step.ClearField("items")
        view = _view_parsed(step, lists)
        out.append(view)
        before = (state, step, view)
    return out


def stored_channels(elements: Elements, view: View) -> StoredChannels:
    """What ``view`` stores of each channel, for a put writing them as they are: the serialized value, and a
    list's elements as ``elements.dumps`` gives them (None for any other channel)."""
    lists = view.lists
    return {k: (v, elements.unseal(lists.get(k, [])) if v[0] == ITEMS else None) for k, v in view.channels.items()}


def head_channels(views: HeadViews, elements: Elements, session_id: str, head: Head, unchanged: Sequence[str]) -> Op:
    """The channels of ``head`` as stored (stored_channels), if a step leaves ``unchanged`` some: from its view
    if this saver holds it, else read; None without a head, or once its version is gone."""
    if head.version == 0 or not unchanged:
        return None
    view = views.get(session_id, head.version, head.state_xxh3)
    if view is None:
        got = yield Call("get", (session_id, head.version, ()))
        if got is None:
            return None
        view = view_of(decode_step(got[1]))
    return stored_channels(elements, view)


def view_written(encoded: Encoded, parent: View | None, step: records_pb2.Step) -> View | None:
    """The view of what the saver wrote of ``encoded``, ``step``: its patch merged onto ``parent`` (the head
    it continued), or, with no parent, its whole Step. None for a patch a read of the state would refuse (an
    entry past its list's end): that read is left to tell."""
    patch = encoded.patch
    if parent is None and encoded.codec.encrypts:
        return view_of(step)  # its elements as sealed: encoded's are not
    if parent is None:
        whole_channels, whole_lists = encoded.whole()
        channels = {k: _pair(v) for k, v in whole_channels.items()}
        lists = {k: list(e) for k, e in whole_lists.items()}
        return _made(patch, channels, lists, _weigh(channels.values()) + sum(_weigh(e) for e in lists.values()))
    # Weighed by what changed: a step costs what it added, not the conversation.
    sealed = encoded.codec.encrypts
    weight = parent.weight - _weigh((parent.checkpoint, parent.metadata))
    changed = {k: _pair(v) for k, v in patch.channels.items()}
    weight += _weigh(changed.values()) - _weigh(parent.channels[k] for k in changed if k in parent.channels)
    channels = {**parent.channels, **changed}
    lists = dict(parent.lists)
    for entry in patch.items:
        k, start = entry.channel, entry.start
        old = lists.get(k, [])
        if start > len(old):
            return None
        # As written: encoded's elements from the entry's start on, or, sealed, the entry's.
        added = [(v.type, v.data) for v in entry.values] if sealed else encoded.elements[k][start:]
        weight += _weigh(added) - _weigh(old[start:])
        lists[k] = old[:start] + added
    return _made(patch, channels, lists, weight)


def with_writes_after(view: View, seq: int) -> View:
    return replace(view, writes_after_seq=seq)


def loads_all(serde: SerializerProtocol, pairs: Sequence[Pair]) -> list[Any]:
    """``serde.loads_typed`` of each pair. JsonPlusSerializer's msgpack values are read in one call, as a
    msgpack array of them (what it reads of a whole list serialized at once), each value as if alone."""
    if type(serde).loads_typed is not JsonPlusSerializer.loads_typed:
        return [serde.loads_typed(p) for p in pairs]
    packed = [data for type_, data in pairs if type_ == "msgpack"]
    if len(packed) < 2:
        return [serde.loads_typed(p) for p in pairs]
    count = len(packed)
    # Joined with the header in one join: the elements' bytes (the whole list's) copied once, not twice.
    loaded: list[Any] = serde.loads_typed(("msgpack", b"".join([msgpack_array_header(count), *packed])))
    if count == len(pairs):
        return loaded
    values = iter(loaded)
    return [next(values) if type_ == "msgpack" else serde.loads_typed((type_, data)) for type_, data in pairs]


#: A list's elements read so far in one listing of a session, by channel and place in the list: each
#: the pair it was read from and what the serializer made of it.
LoadedElements = dict[tuple[str, int], tuple[Pair, Any]]


def _loads_lists(
    serde: SerializerProtocol, pairs: list[Pair], shape: list[tuple[str, int]], loaded: LoadedElements
) -> list[Any]:
    """``loads_all(serde, pairs)``, but a list's element found in ``loaded`` at its channel and place, from
    the same pair, is the object read there; the others are read (in one call) and added to ``loaded``."""
    out: list[Any] = [None] * len(pairs)
    missed: list[int] = []
    keys: list[tuple[str, int] | None] = []
    i = 0
    for k, count in shape:
        if count < 0:
            missed.append(i)
            keys.append(None)
            i += 1
            continue
        for place in range(count):
            pair = pairs[i]
            hit = loaded.get((k, place))
            if hit is not None and hit[0] == pair:
                out[i] = hit[1]
            else:
                missed.append(i)
                keys.append((k, place))
            i += 1
    for i, key, value in zip(missed, keys, loads_all(serde, [pairs[i] for i in missed]), strict=True):
        out[i] = value
        if key is not None:
            loaded[key] = (pairs[i], value)
    return out


def view_tuple(
    serde: SerializerProtocol,
    where: Where,
    view: View,
    pending_writes: list[tuple[str, str, Any]],
    *,
    loaded_elements: LoadedElements | None = None,
) -> CheckpointTuple:
    """The CheckpointTuple a view holds. Its channels are those its checkpoint's channel_versions name.

    ``loaded_elements``: the elements of its session's lists a listing has read so far. A list's element
    stored the same at the same place as one read for another checkpoint is that same object, not read
    again: a thread's history reads each message once, not once per later checkpoint (the listing's
    deserialization O(messages), not O(messages x checkpoints)). Checkpoints listed together so share
    the elements they have in common, as a running graph's consecutive states do.
    """
    checkpoint_data, metadata_data = view.checkpoint, view.metadata
    checkpoint, metadata = loads_all(serde, [checkpoint_data, metadata_data])
    versions = checkpoint.get("channel_versions") or {}
    pairs: list[Pair] = []
    shape: list[tuple[str, int]] = []  # per channel: its name and its elements (-1: a single value)
    for k in versions:
        pair = view.channels.get(k)
        if pair is None or pair[0] == EMPTY:
            continue
        if pair[0] == ITEMS:
            elements = view.lists.get(k, ())
            pairs += elements
            shape.append((k, len(elements)))
        else:
            pairs.append(pair)
            shape.append((k, -1))
    loaded = loads_all(serde, pairs) if loaded_elements is None else _loads_lists(serde, pairs, shape, loaded_elements)
    values: dict[str, Any] = {}
    i = 0
    for k, count in shape:
        if count < 0:
            values[k] = loaded[i]
            i += 1
        else:
            values[k] = loaded[i : i + count]
            i += count
    checkpoint["channel_values"] = values
    parent = view.parent_checkpoint_id
    return CheckpointTuple(
        config=where.config(view.checkpoint_id),
        checkpoint=checkpoint,
        metadata=metadata,
        parent_config=where.config(parent) if parent else None,
        pending_writes=pending_writes,
    )


@dataclass(frozen=True, slots=True)
class Kept:
    version: int
    state_xxh3: int
    view: View
    weight: int


class HeadViews:
    """The views of namespaces' heads, by session id, with the version and XXH3-64 each was stored as;
    ``max_bytes`` of values at most. A view is kept only with a digest (0: a sidecar that gives none)."""

    def __init__(self, max_bytes: int = VIEW_CACHE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def get(self, session_id: str, version: int, state_xxh3: int) -> View | None:
        """The view of ``session_id``'s head if it is at ``version`` with ``state_xxh3``."""
        with self._lock:
            kept = self._kept.get(session_id)
            if kept is None or not state_xxh3 or (kept.version, kept.state_xxh3) != (version, state_xxh3):
                return None
            self._kept.move_to_end(session_id)
            return kept.view

    def elements(self, session_id: str, head: Head, codec: Elements) -> dict[str, list[Pair]] | None:
        """The elements of ``head``'s lists as ``codec.dumps`` gave them, if its view is held and they are
        stored so (not encrypted): what a put continuing it serializes after (encode_put's head_elements)."""
        view = None if codec.encrypts else self.get(session_id, head.version, head.state_xxh3)
        if view is None:
            return None
        return {k: e for k, e in view.lists.items() if view.channels.get(k, ("",))[0] == ITEMS}

    def put(self, session_id: str, version: int, state_xxh3: int, view: View) -> None:
        weight = view.weight
        with self._lock:
            self._drop(session_id)
            if not state_xxh3 or weight > self._max_bytes:
                return
            self._kept[session_id] = Kept(version, state_xxh3, view, weight)
            self._bytes += weight
            while self._bytes > self._max_bytes:
                _, oldest = self._kept.popitem(last=False)
                self._bytes -= oldest.weight

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        kept = self._kept.pop(session_id, None)
        if kept is not None:
            self._bytes -= kept.weight
