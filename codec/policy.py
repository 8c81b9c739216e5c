"""When a chain ends and the next frame starts a new one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainPolicy:
    """Bounds on a delta chain, trading stored bytes against decode time.

    A chain is a FULL frame followed by DELTA/PATCH frames. Decoding a version
    costs one zstd pass over everything its chain materialises: the FULL
    state, every whole state a DELTA carries, and every PATCH's patch. The
    encoder starts a new chain (a FULL frame) as soon as any bound would be
    exceeded. The defaults come from the trajectory benchmark
    (``bench/test_codec_bench.py``; numbers in the README).
    """

    #: Most frames after the FULL frame in one chain.
    max_depth: int = 32
    #: Most bytes a decode of the chain's latest version may materialise, as a
    #: multiple of that version's state size. MERGE chains materialise exactly
    #: the state (ratio 1); each REPLACE delta adds a whole state.
    max_materialized_ratio: float = 6.0
    #: Absolute cap on bytes materialised by one chain decode.
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
        if self.max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {self.max_depth}")
        if self.max_materialized_ratio < 1.0:
            raise ValueError(f"max_materialized_ratio must be >= 1.0, got {self.max_materialized_ratio}")
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


DEFAULT_POLICY = ChainPolicy()
