"""A page of a session's versions with their states: each chain the page touches decoded once, forward.

A Get of an old version decodes its chain from the FULL frame that starts it,
so reading n versions by Gets decodes O(n x chain) frames. A page's versions
are consecutive: its frames (read by the listing's scan) and those of the
oldest one's chain before it are split at their FULL frames, and each chain
is decoded once, forward (codec.iter_versions), every state verified against
its frame's header. A PREFIX version (a folded run) takes its state from its
source, a newer version: from the page's states when the page holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ...codec import DecodeError, FrameKind, frame_kind, iter_versions
from ..errors import DataLoss
from ..storage import ReadTxn
from . import keys
from .layout import Tables
from .listings import version_page
from .prefixes import is_full_v2, is_prefix
from .reads import chain_back, read_prefixed
from .records import frame_of
from .types import GetResult, VersionInfo


def list_states(
    read: Callable[[], AbstractContextManager[ReadTxn]],
    tables: Tables,
    session_id: str,
    *,
    page_size: int,
    page_token: str,
    max_page_bytes: int,
    start_version: int = 0,
    target_page_bytes: int = 0,
) -> tuple[list[GetResult], str]:
    """A page of a session's versions with their states, newest first, and the next page's token
    (Store.list_versions with include_states)."""
    with read() as txn:
        page, token = version_page(
            txn,
            tables,
            session_id,
            page_size=page_size,
            page_token=page_token,
            max_page_bytes=max_page_bytes,
            start_version=start_version,
            with_states=True,
            target_page_bytes=target_page_bytes,
        )
        return page_states(txn, tables, session_id, page), token


def page_states(txn: ReadTxn, tables: Tables, session_id: str, page: list[tuple[VersionInfo, Any]]) -> list[GetResult]:
    """The states of ``page`` (consecutive versions, newest first, with their stored values), verified:
    DataLoss naming the version whose state cannot be read, as a Get of it would."""
    if not page:
        return []
    sid = keys.session_key(session_id)
    oldest = page[-1][0].version
    found = chain_back(txn, tables.frames, sid, session_id, oldest, consecutive=True)
    if found is None:
        raise DataLoss(f"session {session_id!r}: the frame of version {oldest} is missing")
    frames = found[2]  # the oldest version's chain, FULL frame first, through its own frame
    frames.extend(frame_of(value) for _, value in reversed(page[:-1]))
    states: dict[int, bytes] = {}
    prefixed: list[tuple[int, memoryview]] = []  # PREFIX versions of the page, oldest first
    version = oldest - (len(frames) - len(page))  # the first frame's
    for chain in _chains(frames):
        if is_prefix(chain[0]):  # a chain of its own: read from its (newer) source below
            prefixed.append((version, chain[0]))
            version += 1
            continue
        for decoded in _decoded(chain, session_id, version, oldest):
            if version >= oldest:
                states[version] = decoded
            version += 1
    # Newest first: a source in the page (a newer version) is known by the time a version of its run needs it.
    for version, frame in reversed(prefixed):
        states[version] = read_prefixed(txn, tables.frames, sid, session_id, version, frame, known=states).state
    return [GetResult(info.version, states[info.version], info) for info, _ in page]


def _decoded(chain: list[memoryview], session_id: str, first: int, oldest: int) -> Iterator[bytes]:
    """The states of one chain starting at version ``first``, in order; DataLoss naming the version of
    the page (``oldest`` and up) that damage keeps from being read."""
    version = first
    try:
        for decoded in iter_versions(chain):
            if decoded.version != version:  # a sound frame under another version's key
                raise DecodeError(f"the frame stored as version {version} is version {decoded.version}'s")
            yield decoded.state
            version += 1
    except DecodeError as exc:
        raise DataLoss(f"session {session_id!r} version {max(version, oldest)}: {exc}") from None


def _chains(frames: list[memoryview]) -> Iterator[list[memoryview]]:
    """``frames`` (consecutive versions, a FULL or PREFIX frame first) split into chains, each from a FULL
    frame; a PREFIX frame is one of its own."""
    chain: list[memoryview] = []
    for frame in frames:
        if chain and (_is_full(frame) or is_prefix(frame) or is_prefix(chain[0])):
            yield chain
            chain = []
        chain.append(frame)
    if chain:
        yield chain


def _is_full(frame: memoryview) -> bool:
    # As reads.chain_back tells a FULL frame: format 2 says so in two bytes. A frame damaged into looking
    # FULL starts a chain of its own, whose decode then names the damage; one that names no kind this
    # codec knows stays in its chain, for the same reason.
    if len(frame) > 3 and frame[2] == 2:
        return is_full_v2(frame)
    try:
        return frame_kind(frame) is FrameKind.FULL
    except DecodeError:
        return False
