"""The store's configuration: StoreConfig, its durability and retention, and the options `ckpt serve` sets them by."""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...codec import ChainPolicy
from ..limits import (
    DEFAULT_CACHE_SIZE_BYTES,
    DEFAULT_ENCODER_CACHE_BYTES,
    DEFAULT_MAP_SIZE_BYTES,
    DEFAULT_MAX_BLOB_BYTES,
    DEFAULT_MAX_COMMIT_DELAY_SECONDS,
    DEFAULT_MAX_MAP_SIZE_BYTES,
    DEFAULT_MAX_QUEUED_WRITE_BYTES,
    DEFAULT_REQUEST_ID_TTL_SECONDS,
    DEFAULT_SWEEP_INTERVAL_SECONDS,
    check_duration,
)
from .option import option, options_of


class Durability(enum.Enum):
    """When a commit is acknowledged relative to the disk.

    SYNC (default): every commit is fsynced (data and LMDB meta page) before
    the write is acknowledged. Nothing acknowledged is ever lost.

    NO_META_SYNC: data pages are fsynced, the meta page that makes a commit
    visible is not (LMDB's MDB_NOMETASYNC). A process crash loses nothing; an
    OS crash or power failure may undo the last committed transaction(s), but
    never corrupts the database. About one fsync per commit instead of two.
    """

    SYNC = "sync"
    NO_META_SYNC = "no-meta-sync"


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """What the background sweeper removes. The head version is always kept.

    Versions are removed a whole chain at a time (never a delta without the
    FULL frame it needs), so a session keeps *at least* what is asked: up to
    one chain more.
    """

    #: Drop versions beyond the newest N of each session (None = keep all). With max_version_age_seconds
    #: too, a version goes when either limit says so.
    keep_last_versions: int | None = field(
        default=None,
        metadata=option(
            "retention: drop versions beyond the newest N (with --max-version-age-seconds, when either says so)",
            parse=int,
        ),
    )
    #: Drop versions older than this many seconds (None = never).
    max_version_age_seconds: float | None = field(
        default=None, metadata=option("retention: drop versions older than this", parse=float)
    )

    #: Keep at most the newest N events of each session's event log (0 = all).
    keep_last_events: int = field(
        default=0, metadata=option("retention: keep only the newest N events of each session (0 = all)", parse=int)
    )
    #: Drop the events older than this many seconds at the front of each log (0 = never).
    max_event_age_seconds: float = field(
        default=0.0,
        metadata=option("retention: drop events older than this, oldest first (0 = never)", parse=float),
    )

    def __post_init__(self) -> None:
        check_int("keep_last_events", self.keep_last_events)
        if self.keep_last_events < 0:
            raise ValueError(f"keep_last_events must be >= 0 (0 = keep all), got {self.keep_last_events}")
        check_duration("max_event_age_seconds", self.max_event_age_seconds)
        if not self.max_event_age_seconds >= 0:
            raise ValueError(f"max_event_age_seconds must be >= 0 (0 = never), got {self.max_event_age_seconds}")
        if self.keep_last_versions is not None:
            check_int("keep_last_versions", self.keep_last_versions)
            if self.keep_last_versions < 1:
                raise ValueError(f"keep_last_versions must be >= 1 or None, got {self.keep_last_versions}")
        check_duration("max_version_age_seconds", self.max_version_age_seconds)
        if self.max_version_age_seconds is not None and self.max_version_age_seconds <= 0:
            raise ValueError(f"max_version_age_seconds must be > 0 or None, got {self.max_version_age_seconds}")

    @property
    def enabled(self) -> bool:
        return self.keep_last_versions is not None or self.max_version_age_seconds is not None

    @property
    def events_enabled(self) -> bool:
        """Whether the sweeper removes events (retention of versions is :attr:`enabled`)."""
        return bool(self.keep_last_events or self.max_event_age_seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Everything the store needs; the defaults suit a laptop.

    The fields declared with ``option(...)`` are options of ``ckpt serve`` too (option.py).
    """

    #: Directory holding the LMDB environment (created if missing).
    data_dir: Path
    #: Initial LMDB map size. The map doubles when full, up to the cap.
    map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES
    #: The map never grows past this; a write that needs more fails with
    #: StoreFull (RESOURCE_EXHAUSTED) and changes nothing. Writes other than
    #: deletes stop short of it by limits.map_reserve_bytes, kept for deletes.
    max_map_size_bytes: int = field(
        default=DEFAULT_MAX_MAP_SIZE_BYTES, metadata=option("cap on the LMDB map", parse=int)
    )
    durability: Durability = field(
        default=Durability.SYNC,
        metadata=option(
            "sync: fsync every commit; no-meta-sync: one fsync a commit instead of two, an OS crash may undo the"
            " last commits",
            choices=tuple(mode.value for mode in Durability),
            convert=Durability,
        ),
    )
    #: Memory for latest states of recently used sessions (the hot path when
    #: an agent restarts but the sidecar did not). Each entry counts its state
    #: and ~0.7 KB besides (id, metadata, labels), so tiny states fit fewer
    #: entries than the bytes of their states alone would suggest.
    cache_size_bytes: int = field(
        default=DEFAULT_CACHE_SIZE_BYTES, metadata=option("memory for latest states", parse=int)
    )
    #: Sessions whose encoder (head state and live zstd stream) is kept
    #: between writes, so the next write continues the chain's stream instead
    #: of reading the chain back from LMDB.
    encoder_cache_entries: int = 1024
    #: Memory for those encoders, by ChainEncoder.memory_bytes (an estimate,
    #: 0.99-1.75x their RSS: ~0.2 MiB for a 6 KB state, ~3.5 MiB for a 300 KB
    #: one, ~5 MiB for 1 MB). Without it, 1,024 encoders of 300 KB states would hold ~2.8 GiB.
    #: A group commit keeps at most this much again (and as many entries) of
    #: its writes' encoders until it commits; it drops the others then, as if
    #: evicted, so one batch of large writes cannot hold an encoder per write.
    encoder_cache_bytes: int = field(
        default=DEFAULT_ENCODER_CACHE_BYTES,
        metadata=option(
            "memory for recently written sessions' encoders (head state and zstd stream), so their next write"
            " needs no LMDB read",
            parse=int,
        ),
    )
    chain_policy: ChainPolicy = field(default_factory=ChainPolicy)
    retention: Retention = field(default_factory=Retention, metadata=options_of(Retention))
    #: Once a session has written nothing for this many seconds, the sweeper
    #: rewrites its head's frame, if a DELTA (or a PATCH while folding is off:
    #: fold_after_quiet_seconds folds a PATCH head, for fewer bytes), as a FULL
    #: frame of the same state (same version, same bytes), so the cold read
    #: that resumes it decodes one frame instead of a chain, and its next
    #: write starts a new chain. Costs a FULL frame less a delta per quiet
    #: period on disk, and the sweeping thread a decode and a compress per
    #: session going quiet. None: off.
    keyframe_after_quiet_seconds: float | None = field(
        default=None,
        metadata=option(
            "once a session has written nothing this long, rewrite its head as a FULL frame (same state), so the"
            " cold read that resumes it decodes one frame; a head that --fold-after-quiet-seconds folds is folded"
            " instead",
            parse=float,
            shown="off",
        ),
    )
    #: Once a session has written nothing for this many seconds, the sweeper
    #: folds its head run, if the head is a PATCH frame (MERGE writes): the
    #: head becomes a FULL frame and every version of its run, from the FULL
    #: or DELTA frame that starts it, a header-only PREFIX frame (its state is
    #: the first bytes of the head's). Fewer bytes stored, and a cold read of
    #: the head decodes one frame. A MERGE write's keyframe at the head (a
    #: FULL frame whose stream is left open) is sealed (store/folds.py,
    #: SEAL_BELOW_BYTES). A head of chain_policy.segment_min_state_bytes
    #: or more that a fold already sealed is folded again only once its run
    #: is worth it (store/folds.py, FOLD_MIN_GAIN_FRACTION). None or 0: off.
    fold_after_quiet_seconds: float | None = field(
        default=60.0,
        metadata=option(
            "once a session has written nothing this long, fold its head run of MERGE patches: the head becomes"
            " a FULL frame and the versions before it header-only PREFIX frames (fewer bytes, and the cold read"
            " that resumes it decodes one frame; a MERGE keyframe at the head is sealed); 0 = off",
            parse=float,
        ),
    )
    #: Store.close() folds the head runs of the sessions written since the
    #: last sweep (as a sweep would once they are quiet) for at most this
    #: many seconds; what it has no time for stays a chain (read as before).
    #: Only the store that sweeps (one worker's with --workers). 0: off.
    fold_on_close_seconds: float = field(
        default=5.0,
        metadata=option(
            "at a clean stop, fold the head runs of the sessions written since the last sweep for at most this"
            " long (what is left stays a chain, read as before); 0 = off",
            parse=float,
        ),
    )
    #: How long a request id deduplicates retries: a retry later than this
    #: after the first write is a new write. Checked on every write against
    #: the wall clock (the sweeper only frees the records' space), so it is
    #: exact while the clock runs true. A clock stepped back keeps the
    #: records longer by the step. One stepped forward shortens their time
    #: by the step, and a sweep while it is ahead removes those it expired:
    #: a retry after the clock comes back then writes again. Keep it above
    #: the clients' retry window plus any step the host's clock may take.
    request_id_ttl_seconds: float = field(
        default=DEFAULT_REQUEST_ID_TTL_SECONDS,
        metadata=option(
            "how long a write's request id answers its retries with the first result; a retry later than this"
            " writes again, so make it longer than any client keeps retrying",
            parse=float,
            shown=f"{DEFAULT_REQUEST_ID_TTL_SECONDS:g}, a day",
        ),
    )
    #: How often the sweeper runs: retention, request-id expiry, quiet folds and keyframes.
    sweep_interval_seconds: float = field(
        default=DEFAULT_SWEEP_INTERVAL_SECONDS,
        metadata=option(
            "how often the background sweeper applies retention, frees expired request ids, folds quiet heads and"
            " writes quiet keyframes",
            parse=float,
        ),
    )
    #: Largest state (REPLACE) or resulting state (MERGE) accepted.
    max_state_bytes: int = 64 * 1024 * 1024
    #: Largest blob (PutBlob: an artifact stored by reference, a file under data_dir/blobs) accepted;
    #: a larger one is refused (RESOURCE_EXHAUSTED) as its bytes arrive, and nothing of it is kept.
    max_blob_bytes: int = field(
        default=DEFAULT_MAX_BLOB_BYTES,
        metadata=option(
            "largest blob (PutBlob) stored; a larger one is refused as it arrives and nothing of it is kept",
            parse=int,
            shown="4294967296, 4 GiB",
        ),
    )
    #: Most writes committed in one LMDB transaction.
    max_batch_writes: int = 512
    #: Longest a batch waits before its commit for the writers it expects:
    #: as many as the last commit let go on (a put_many counts once; a
    #: PutStream batch counts as its writes) plus the writes queued while
    #: it ran. Writers a commit answers usually write again at once, and a
    #: commit's flush costs about the same for 60 writes as for 30; without
    #: the wait, 64 writer threads settle into two half-size batches taking
    #: turns, two flushes where one would do. The wait ends as soon as they
    #: are queued, and at the latest three of the last commit's durations
    #: after the last batch went to commit (gather.close_in; plus the OS's
    #: timer slack, ~0.1-0.3 ms on a busy VM), so a write waits at most
    #: about twice as long again as its commit takes; there is none while
    #: writers wait for room under max_queued_write_bytes (they could not
    #: queue). A lone writer waits only once, on its first write after a
    #: burst of others ends. 0: commit whatever is queued at once.
    max_commit_delay_seconds: float = field(
        default=DEFAULT_MAX_COMMIT_DELAY_SECONDS,
        metadata=option(
            "longest a commit waits for the writers the last one answered (at most three of that commit's"
            " durations after it began), so more writes share one flush; 0 = commit what is queued at once, for"
            " the lowest latency",
            parse=float,
        ),
    )
    #: Most bytes of states queued for the writer and not yet answered (the
    #: write backlog's memory). Past it, blocking writes (put, put_many)
    #: wait for room and asyncio writes (asubmit, so the sidecar's
    #: unary Puts) fail at once with Overloaded (UNAVAILABLE: retry with the
    #: same request_id). A write is always taken when nothing is queued, so
    #: one larger than this still goes, alone.
    max_queued_write_bytes: int = field(
        default=DEFAULT_MAX_QUEUED_WRITE_BYTES,
        metadata=option(
            "most bytes of states waiting for the writer; past it a unary Put fails UNAVAILABLE at once (clients"
            " retry) and a PutStream waits",
            parse=int,
        ),
    )
    #: LMDB reader slots: concurrent read transactions across threads.
    max_readers: int = 512
    #: The message type a MERGE that names none gives an untyped session: a
    #: built-in type's full name ("ckpt.v1.Checkpoint"). The session, if its
    #: head state parses as the type (a new one's does), is then typed, as if
    #: the write had named it (PutRequest.message_type): the FULL frame
    #: starting each chain holds its state compacted, parsed and
    #: re-serialized, so fields later patches overwrote are dropped (when that
    #: saves >= 10%), and its MERGE patches and REPLACE states must parse as
    #: the type. A client's own registered types are named on its puts.
    #: None (default): such a MERGE leaves the session untyped, its state all
    #: its patches concatenated, growing by every patch that rewrites a field.
    merge_message_type: str | None = field(
        default=None,
        metadata=option(
            "the type a MERGE naming none gives an untyped session whose state parses as it (a built-in type:"
            " ckpt.v1.Checkpoint): its states"
            " are then compacted at each chain start, so fields that later patches overwrite do not pile up, and"
            " must parse as TYPE",
            metavar="TYPE",
            shown="off: a MERGE state is every patch concatenated",
        ),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        for name, most in _INT_FIELDS.items():
            check_int(name, getattr(self, name), most)
        for name in _DURATION_FIELDS:
            check_duration(name, getattr(self, name))
        if self.max_map_size_bytes < 1024 * 1024:
            raise ValueError(f"max_map_size_bytes must be >= 1 MiB, got {self.max_map_size_bytes}")
        if self.map_size_bytes < 1024 * 1024:
            raise ValueError(f"map_size_bytes must be >= 1 MiB, got {self.map_size_bytes}")
        if self.max_map_size_bytes < self.map_size_bytes:
            raise ValueError(
                f"max_map_size_bytes ({self.max_map_size_bytes}) must be >= map_size_bytes, the initial map size"
                f" ({self.map_size_bytes})"
            )
        if not isinstance(self.durability, Durability):
            raise TypeError(f"durability must be a Durability, not {type(self.durability).__name__}")
        if not isinstance(self.chain_policy, ChainPolicy):
            raise TypeError(f"chain_policy must be a ChainPolicy, not {type(self.chain_policy).__name__}")
        if not isinstance(self.retention, Retention):
            raise TypeError(f"retention must be a Retention, not {type(self.retention).__name__}")
        if self.max_readers < 1:
            raise ValueError(f"max_readers must be >= 1, got {self.max_readers}")
        for name in ("cache_size_bytes", "encoder_cache_entries", "encoder_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("request_id_ttl_seconds", "sweep_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.max_state_bytes <= 0xFFFF_FFFF:
            raise ValueError(f"max_state_bytes must be in 1..{0xFFFF_FFFF}, got {self.max_state_bytes}")
        if self.max_blob_bytes < 0:
            raise ValueError(f"max_blob_bytes must be >= 0, got {self.max_blob_bytes}")
        if self.max_batch_writes < 1:
            raise ValueError(f"max_batch_writes must be >= 1, got {self.max_batch_writes}")
        if not 0 <= self.max_commit_delay_seconds <= 1:
            raise ValueError(f"max_commit_delay_seconds must be in 0..1, got {self.max_commit_delay_seconds}")
        if self.keyframe_after_quiet_seconds is not None and not self.keyframe_after_quiet_seconds > 0:
            raise ValueError(
                f"keyframe_after_quiet_seconds must be > 0 or None, got {self.keyframe_after_quiet_seconds}"
            )
        if self.fold_after_quiet_seconds is not None and not self.fold_after_quiet_seconds >= 0:
            raise ValueError(
                f"fold_after_quiet_seconds must be >= 0 (0 = off) or None, got {self.fold_after_quiet_seconds}"
            )
        if self.fold_after_quiet_seconds == 0:
            object.__setattr__(self, "fold_after_quiet_seconds", None)  # 0 and None both turn it off
        if not self.fold_on_close_seconds >= 0:
            raise ValueError(f"fold_on_close_seconds must be >= 0 (0 = off), got {self.fold_on_close_seconds}")
        if self.max_queued_write_bytes < 1:
            raise ValueError(f"max_queued_write_bytes must be >= 1, got {self.max_queued_write_bytes}")
        # Checked now, naming the field, not at the first MERGE. Only built-in types: a registered one
        # is the store's to know, and a default that might not resolve would refuse writes later.
        if self.merge_message_type is not None and not _is_built_in_type(self.merge_message_type):
            raise ValueError(
                f"merge_message_type {self.merge_message_type!r} is not a protobuf message type built into ckpt"
                " (ckpt.v1.Checkpoint, google.protobuf's well-known types); a client's own types are registered"
                " (RegisterType) and named on each put (message_type)"
            )


#: The most any integer setting may be: a size or count the machine can address (a C ssize_t; LMDB takes
#: its map sizes as size_t).
MAX_INT = sys.maxsize
#: The most LMDB reader slots: py-lmdb takes max_readers as a C int.
MAX_READERS = 2**31 - 1
#: StoreConfig's integer fields and the most each may be.
_INT_FIELDS = {
    "map_size_bytes": MAX_INT,
    "max_map_size_bytes": MAX_INT,
    "cache_size_bytes": MAX_INT,
    "encoder_cache_entries": MAX_INT,
    "encoder_cache_bytes": MAX_INT,
    "max_state_bytes": MAX_INT,
    "max_blob_bytes": MAX_INT,
    "max_batch_writes": MAX_INT,
    "max_queued_write_bytes": MAX_INT,
    "max_readers": MAX_READERS,
}
#: StoreConfig's durations (None allowed where the field is optional).
_DURATION_FIELDS = (
    "request_id_ttl_seconds",
    "sweep_interval_seconds",
    "max_commit_delay_seconds",
    "keyframe_after_quiet_seconds",
    "fold_after_quiet_seconds",
    "fold_on_close_seconds",
)


def check_int(name: str, value: object, most: int = MAX_INT) -> None:
    """TypeError naming ``name`` unless ``value`` is an int (not a bool, nor a float); ValueError if past ``most``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value > most:
        raise ValueError(f"{name} must be at most {most}, got {value}")


def _is_built_in_type(name: str) -> bool:
    # Imported here: protobuf is not loaded before `ckpt serve` starts its store process.
    from ..descriptors import is_built_in_type

    return is_built_in_type(name)
