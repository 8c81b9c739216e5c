"""Where a head stands in its chain, and what the next frame is: a delta on the head, a segment, or a new chain.

A version is read through its chain: the FULL frame, then each frame whose
base is the one before it. Most frames' base is the version just before
them; a **segment** frame (FORMAT.md §14) is a PATCH whose base is an older
version of the same run of MERGE writes, and it carries every patch since
that base. A MERGE chain with segments at the multiples of
``segment_fanout`` (its levels: every ``fanout``-th version a segment over
the last ``fanout`` versions, every ``fanout**2``-th one over the last
``fanout**2``, and so on) reads any version through at most ``fanout - 1``
frames a level, and stores each patch once a level: a growing state is not
rewritten whole to keep its reads short (LSM-style merging of patches).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ChainLinkError
from .frame import FrameHeader, FrameKind
from .policy import ChainPolicy


@dataclass(frozen=True, slots=True)
class Step:
    """One frame a version is read through: its version and state size, and what reading up to it
    materialises from the FULL frame on (its content, a DELTA's part)."""

    version: int
    state_size: int
    materialized_bytes: int
    delta_bytes: int


@dataclass(frozen=True, slots=True)
class ChainStats:
    """Where the head stands in its chain; all the policy needs to decide."""

    #: Version of the chain's FULL frame (0 before the first write).
    start_version: int = 0
    #: Frames after the FULL frame that the head is read through.
    depth: int = 0
    #: Bytes a decode of the head materialises (sum of the content sizes of the frames it is read through).
    materialized_bytes: int = 0
    #: The part of ``materialized_bytes`` that DELTA frames carry.
    delta_bytes: int = 0
    #: Payload / state size of the chain's FULL frame: estimates what a FULL
    #: frame of a later state would cost.
    full_ratio: float = 1.0
    #: The frames the head is read through, FULL frame first.
    path: tuple[Step, ...] = ()
    #: Version of the last frame on the path that is not a PATCH (the FULL frame, or a DELTA): every state
    #: from it on is the first bytes of the head's, so a segment may take any of them as its base.
    run_start_version: int = 0

    @classmethod
    def of(cls, chain: Sequence[FrameHeader]) -> ChainStats:
        """Stats of a stored chain, given headers from its FULL frame to the head: every version (as
        stored) or only those the head is read through (as read)."""
        if not chain:
            return cls()
        first = chain[0]
        if first.kind is not FrameKind.FULL:
            raise ValueError(f"a chain starts with a FULL frame, not {first.kind.name} (version {first.version})")
        read_through = _read_through(chain)
        path: list[Step] = []
        materialized = delta = 0
        run_start = first.version
        for h in read_through:
            materialized += h.content_size
            if h.kind is FrameKind.DELTA:
                delta += h.content_size
            if h.kind is not FrameKind.PATCH:
                run_start = h.version
            path.append(Step(h.version, h.state_size, materialized, delta))
        return cls(
            start_version=first.version,
            depth=len(path) - 1,
            materialized_bytes=materialized,
            delta_bytes=delta,
            full_ratio=full_ratio(first.payload_size, first.state_size),
            path=tuple(path),
            run_start_version=run_start,
        )

    def after(self, header: FrameHeader, base_index: int) -> ChainStats:
        """The stats once ``header``'s frame (not FULL), based on ``path[base_index]``, is the head."""
        base = self.path[base_index]
        content = header.content_size
        delta = base.delta_bytes + (content if header.kind is FrameKind.DELTA else 0)
        step = Step(header.version, header.state_size, base.materialized_bytes + content, delta)
        return ChainStats(  # direct construction: dataclasses.replace costs ~3 us per frame
            self.start_version,
            base_index + 1,
            step.materialized_bytes,
            delta,
            self.full_ratio,
            (*self.path[: base_index + 1], step),
            self.run_start_version if header.kind is FrameKind.PATCH else header.version,
        )

    def at(self, index: int) -> ChainStats:
        """The stats as they were when ``path[index]`` was the head (run start as now)."""
        step = self.path[index]
        return ChainStats(
            self.start_version,
            index,
            step.materialized_bytes,
            step.delta_bytes,
            self.full_ratio,
            self.path[: index + 1],
            self.run_start_version,
        )


def started(header: FrameHeader, payload_size: int) -> ChainStats:
    """The stats of a chain whose FULL frame ``header`` was just written."""
    size = header.state_size
    return ChainStats(
        header.version,
        0,
        size,
        0,
        full_ratio(payload_size, size),
        (Step(header.version, size, size, 0),),
        header.version,
    )


def segment_base(policy: ChainPolicy, chain: ChainStats, new_state_size: int) -> int | None:
    """Index in ``chain.path`` of the base of a MERGE's frame written as a segment, or None for a frame
    on the head. A segment is written at every multiple of ``policy.segment_fanout`` versions after the
    run's start (the FULL frame or the last DELTA), over the last ``fanout ** k`` versions for the
    largest such power, once the state is ``policy.segment_min_state_bytes`` or more. That base is
    always a frame the head is read through (the frames between cover no multiple of ``fanout ** k``).
    None too if the segment would repeat more than ``policy.segment_max_fraction`` of the state."""
    fanout = policy.segment_fanout
    if fanout < 2 or new_state_size < policy.segment_min_state_bytes or not chain.path:
        return None
    new_version = chain.path[-1].version + 1
    offset = new_version - chain.run_start_version
    if offset < fanout or offset % fanout:
        return None
    span = fanout
    while offset % (span * fanout) == 0:
        span *= fanout
    base = new_version - span
    path = chain.path
    lo = bisect_left(path, base, key=_version)  # versions along the path ascend
    if lo == len(path) or path[lo].version != base:
        return None  # a chain written under another fanout: a frame on the head instead
    if new_state_size - path[lo].state_size > policy.segment_max_fraction * new_state_size:
        return None  # it would repeat too much: a frame on the head, and the chain ends as without segments
    return lo


def chain_ends(policy: ChainPolicy, chain: ChainStats, new_state_size: int, content_size: int, *, delta: bool) -> bool:
    """Whether the frame after a chain standing at ``chain`` starts a new chain (a FULL frame) by ``policy``: a
    frame of a state of ``new_state_size`` bytes, materialising ``content_size`` (a DELTA's state, a PATCH's patch).
    """
    p, c = policy, chain
    materialized = c.materialized_bytes + content_size
    delta_bytes = c.delta_bytes + (content_size if delta else 0)
    depth = c.depth + 1
    # The chain's deltas are taken to be about the new state's size: a cache-resident one costs less.
    delta_cost = p.small_delta_byte_cost if new_state_size <= p.small_state_bytes else p.delta_byte_cost
    decode_cost = materialized - (1.0 - delta_cost) * delta_bytes + depth * p.frame_cost_bytes
    floor = p.decode_floor_bytes if delta else p.merge_decode_floor_bytes
    return (
        depth > p.max_depth
        or decode_cost > max(p.max_decode_cost_ratio * max(new_state_size, 1), floor)
        or materialized > p.max_materialized_bytes
    )


def merge_plan(policy: ChainPolicy, chain: ChainStats, patch_size: int) -> tuple[bool, int]:
    """What a MERGE of ``patch_size`` bytes onto a head standing at ``chain`` writes, before the checks that
    need its bytes (compaction, whether the delta is clearly smaller than a FULL frame): (whether a new
    chain starts, index in ``chain.path`` of the frame's base). The encoder decides by it, and a store
    that prepares a large MERGE's FULL frame ahead of the writer asks it the same question."""
    last = len(chain.path) - 1
    if last < 0:
        return True, 0
    # Retention removes whole chains: a chain holds at most max_chain_versions versions.
    if chain.path[-1].version + 1 - chain.start_version >= policy.max_chain_versions:
        return True, last
    new_size = chain.path[-1].state_size + patch_size
    base = segment_base(policy, chain, new_size)
    if base is None:
        return chain_ends(policy, chain, new_size, patch_size, delta=False), last
    content = new_size - chain.path[base].state_size
    return chain_ends(policy, chain.at(base), new_size, content, delta=False), base


def segment_link_base(prev: FrameHeader, h: FrameHeader, run: Sequence[FrameHeader]) -> FrameHeader:
    """The base of ``h``, a segment read after ``prev``, the version before it: one of ``run``, the frames
    since the last that is not a PATCH (the states of the versions between are its state and more)."""
    if h.kind is FrameKind.PATCH and h.version == prev.version + 1 and h.base_version < prev.version:
        for base in run:
            if base.version == h.base_version:
                return base
        first = run[0].version if run else prev.version
        raise ChainLinkError(
            f"frame of version {h.version} is a segment on version {h.base_version}, outside the run of"
            f" PATCH frames it follows (versions {first}..{prev.version})"
        )
    raise ChainLinkError(
        f"frame of version {h.version} is a delta against version {h.base_version}, but follows version {prev.version}"
    )


def _version(step: Step) -> int:
    return step.version


def full_ratio(payload_size: int, state_size: int) -> float:
    # An empty state says nothing about how well later states compress; a
    # ratio of 0 would make every later delta look "not smaller" than a FULL.
    return payload_size / state_size if state_size else 1.0


def _read_through(chain: Sequence[FrameHeader]) -> list[FrameHeader]:
    """The headers the last of ``chain`` is read through, FULL frame first (following each frame's base)."""
    last = chain[-1]
    if all(h.version == last.version - (len(chain) - 1) + i for i, h in enumerate(chain)) and not any(
        h.kind is FrameKind.PATCH and h.base_version != h.version - 1 for h in chain
    ):
        return list(chain)  # consecutive versions, each on the one before: the common case
    versions = [h.version for h in chain]
    out = [last]
    h = last
    while h.kind is not FrameKind.FULL:
        i = bisect_left(versions, h.base_version)
        if i == len(versions) or versions[i] != h.base_version:
            raise ValueError(f"the chain holds no version {h.base_version}, the base of version {h.version}")
        h = chain[i]
        out.append(h)
    out.reverse()
    return out
