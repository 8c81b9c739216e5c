"""When a chain ends and the next frame starts a new one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainPolicy:
    """Bounds on a delta chain, trading stored bytes against decode time.

    A chain is a FULL frame followed by DELTA/PATCH frames. Decoding a version
    costs one zstd pass over everything its chain materialises (the FULL
    state, every whole state a DELTA carries, every PATCH's patch) plus a fixed
    cost per frame. The encoder starts a new chain (a FULL frame) as soon as
    any bound would be exceeded. The defaults come from a sweep on the trajectory
    workload (``python -m ckpt.bench.codec_report``; the trade-off table is in docs/performance.md).
    """

    #: Most frames after the FULL frame that one version is read through.
    max_depth: int = 64
    #: Most versions one chain holds, segments or not: retention removes a
    #: session's old versions a whole chain at a time, so this bounds what it
    #: keeps past the versions asked for.
    max_chain_versions: int = 1024
    #: MERGE chains of states of segment_min_state_bytes or more write a
    #: segment frame (FORMAT.md §14) every segment_fanout versions, over the
    #: last fanout**k versions (the largest such power): a version is read
    #: through at most fanout - 1 frames a level and each patch is stored once
    #: a level, so a large growing state is rewritten whole once per
    #: max_chain_versions writes, not once per max_depth. 0 or 1: no segments.
    segment_fanout: int = 8
    #: The state size from which MERGE chains write segments. Below it a
    #: chain's whole decode costs little, and chains end by the decode-cost
    #: bounds before max_depth does.
    segment_min_state_bytes: int = 128 * 1024
    #: Most a segment may repeat (the patches since its base), as a fraction
    #: of the state: each patch is stored once a level, which pays only while
    #: the patches are small beside the state that a FULL frame would rewrite.
    segment_max_fraction: float = 0.25
    #: Estimated cost of decoding the chain's latest version, as a multiple of
    #: decoding one FULL frame of that state. The estimate counts, in bytes of
    #: FULL-frame decoding: the FULL frame's state, each PATCH's patch, each
    #: DELTA's state times ``delta_byte_cost``, and ``frame_cost_bytes`` per
    #: frame after the FULL one.
    max_decode_cost_ratio: float = 4.0
    #: Estimated decode cost (in the same bytes of FULL-frame decoding) below
    #: which ``max_decode_cost_ratio`` does not end a chain: decoding a few KB
    #: takes microseconds whatever the ratio, so chains of small states may
    #: run on (to ``max_depth``) until their cost reaches this floor.
    decode_floor_bytes: int = 32 * 1024
    #: decode_floor_bytes for a PATCH frame (a MERGE write). A store folds a
    #: quiet MERGE head into one frame (``fold_after_quiet_seconds``), so a
    #: MERGE chain's decode is paid only by cold reads of a session still
    #: being written, or not yet folded after a crash; while a FULL frame
    #: every few versions costs a small state's chain 2-3x the ideal bytes for
    #: good (chat: 2.48x at 32 KiB, 1.11x at 256 KiB, ~100 us of decoding).
    #: REPLACE heads are not folded, so DELTA frames keep decode_floor_bytes.
    merge_decode_floor_bytes: int = 256 * 1024
    #: For an encoder that knows the state's message type (compact_message_type):
    #: the fraction of a MERGE state's bytes that may be superseded (fields a
    #: later patch overwrote) before the chain restarts with the state compacted.
    #: Superseded bytes are decoded, sent and parsed by every read, and the
    #: decode-cost bounds cannot see them (a patch grows the state it costs).
    #: Measured when the state has grown to 1 / (1 - fraction) times its size
    #: last measured, so compaction runs about once per such growth, not per
    #: write. 1.0: never.
    max_superseded_fraction: float = 0.67
    #: What decoding one byte of a DELTA's state costs relative to one byte of
    #: a FULL frame. A delta decodes to long copies from the previous state,
    #: but every delta of a chain materialises a whole state: measured 0.1-0.2
    #: for states of ~20 KB (cache-resident) and ~0.85 at 300 KB.
    delta_byte_cost: float = 0.5
    #: delta_byte_cost for states of at most small_state_bytes: a delta of a
    #: state that stays in the CPU cache decodes to copies at memory speed
    #: (trajectory REPLACE chains, 4-36 KB states: the head decoded in 1.89x
    #: a snapshot's time at 0.1 as at 0.5, with 2.65x the ideal bytes, not 3.51x).
    small_delta_byte_cost: float = 0.1
    #: The state size up to which small_delta_byte_cost applies.
    small_state_bytes: int = 64 * 1024
    #: Fixed decode cost of one frame after the FULL frame, in bytes of FULL
    #: decoding it is worth. Measured for decode() of format 2 chains: 1.8-2.0
    #: us per frame (trajectory MERGE chains), while FULL frames decode at
    #: 2.4-2.7 KB/us (4.3-5.2 KB); a fit of whole chain decode times gives
    #: 3.5 KB. This keeps the chains of small states short and lets those of
    #: large states run to ``max_depth``.
    frame_cost_bytes: int = 4096
    #: Absolute cap on the bytes one chain decode materialises.
    max_materialized_bytes: int = 256 * 1024 * 1024
    #: A DELTA/PATCH frame is kept only if its payload is at most this
    #: fraction of an estimated FULL frame of the same state.
    max_delta_to_full_ratio: float = 0.5
    #: When a PATCH starts a new zstd stream, it references this many bytes
    #: at the end of the previous state (where recent messages live).
    patch_window_bytes: int = 64 * 1024
    #: zstd compression level for every frame.
    level: int = 3
    #: Smallest zstd window (log2 bytes) a stream uses, so that streams of
    #: tiny states still reach back over a useful amount of history.
    min_window_log: int = 16

    def __post_init__(self) -> None:
        # Types first: a str would fail the range checks below with a bare
        # comparison TypeError, and a float depth or bool level would pass them.
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if self.max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {self.max_depth}")
        if self.max_chain_versions < 1:
            raise ValueError(f"max_chain_versions must be >= 1, got {self.max_chain_versions}")
        if self.segment_fanout < 0:
            raise ValueError(f"segment_fanout must be >= 0, got {self.segment_fanout}")
        if self.segment_min_state_bytes < 0:
            raise ValueError(f"segment_min_state_bytes must be >= 0, got {self.segment_min_state_bytes}")
        if not 0.0 <= self.segment_max_fraction <= 1.0:
            raise ValueError(f"segment_max_fraction must be in [0, 1], got {self.segment_max_fraction}")
        if not self.max_decode_cost_ratio >= 1.0:  # NaN too
            raise ValueError(f"max_decode_cost_ratio must be >= 1.0, got {self.max_decode_cost_ratio}")
        if not 0.0 <= self.small_delta_byte_cost <= 1.0:
            raise ValueError(f"small_delta_byte_cost must be in [0, 1], got {self.small_delta_byte_cost}")
        if self.small_state_bytes < 0:
            raise ValueError(f"small_state_bytes must be >= 0, got {self.small_state_bytes}")
        if not 0.0 <= self.delta_byte_cost <= 1.0:
            raise ValueError(f"delta_byte_cost must be in [0, 1], got {self.delta_byte_cost}")
        if self.decode_floor_bytes < 0:
            raise ValueError(f"decode_floor_bytes must be >= 0, got {self.decode_floor_bytes}")
        if self.merge_decode_floor_bytes < 0:
            raise ValueError(f"merge_decode_floor_bytes must be >= 0, got {self.merge_decode_floor_bytes}")
        if not 0.0 < self.max_superseded_fraction <= 1.0:
            raise ValueError(f"max_superseded_fraction must be in (0, 1], got {self.max_superseded_fraction}")
        if self.frame_cost_bytes < 0:
            raise ValueError(f"frame_cost_bytes must be >= 0, got {self.frame_cost_bytes}")
        if self.max_materialized_bytes < 1:
            raise ValueError(f"max_materialized_bytes must be >= 1, got {self.max_materialized_bytes}")
        if not 0.0 < self.max_delta_to_full_ratio <= 1.0:
            raise ValueError(f"max_delta_to_full_ratio must be in (0, 1], got {self.max_delta_to_full_ratio}")
        if self.patch_window_bytes < 0:
            raise ValueError(f"patch_window_bytes must be >= 0, got {self.patch_window_bytes}")
        if not -7 <= self.level <= 22:
            raise ValueError(f"level must be in -7..22, got {self.level}")
        if not 10 <= self.min_window_log <= 27:
            raise ValueError(f"min_window_log must be in 10..27, got {self.min_window_log}")


_INT_FIELDS = (
    "max_depth",
    "max_chain_versions",
    "segment_fanout",
    "segment_min_state_bytes",
    "decode_floor_bytes",
    "merge_decode_floor_bytes",
    "frame_cost_bytes",
    "max_materialized_bytes",
    "patch_window_bytes",
    "level",
    "min_window_log",
    "small_state_bytes",
)
_FLOAT_FIELDS = (
    "segment_max_fraction",
    "max_decode_cost_ratio",
    "delta_byte_cost",
    "max_delta_to_full_ratio",
    "max_superseded_fraction",
    "small_delta_byte_cost",
)

DEFAULT_POLICY = ChainPolicy()
