"""Configuration: the store's and the sidecar's, frozen dataclasses with units in field names."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from ckpt.v1 import checkpoint_pb2  # noqa: F401  # registers ckpt.v1.Checkpoint for merge_message_type

from ..codec import ChainPolicy
from . import tls

if TYPE_CHECKING:
    import grpc

#: Largest gRPC message, both directions, on the server and the clients alike.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: The most max_message_bytes may be: gRPC takes its message size options as C ints.
MAX_MESSAGE_BYTES = 2**31 - 1
#: What a gRPC message may carry besides its state: a PutRequest's session id
#: (256 B), request id (128 B) and labels (64 x ~330 B), or a GetResponse's
#: VersionInfo and labels. ~22 KiB at most; the sidecar keeps this much of
#: every message for them, so any state it accepts can be read back.
MESSAGE_ENVELOPE_BYTES = 64 * 1024
#: The most writes one PutStreamRequest may hold (service.proto). Each write costs the sidecar
#: ~2-4 KB while it is under way, whatever its size, and its result may outweigh it: a 400 KB
#: message of 200,000 empty writes took 770 MB and was answered with 12 MB, so one of the 64 MiB
#: a message may be would have taken ~120 GB.
MAX_STREAM_BATCH_PUTS = 1000
#: The memory budgets and the map cap ``ckpt serve`` shares with StoreConfig.
DEFAULT_CACHE_SIZE_BYTES = 256 * 1024 * 1024
DEFAULT_ENCODER_CACHE_BYTES = 512 * 1024 * 1024
#: ``ckpt serve`` only: Get replies its gRPC process keeps (replycache.py).
DEFAULT_REPLY_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MAP_SIZE_BYTES = 64 * 1024**3
DEFAULT_MAP_SIZE_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_QUEUED_WRITE_BYTES = 256 * 1024 * 1024
DEFAULT_REQUEST_ID_TTL_SECONDS = 24 * 3600.0
DEFAULT_SWEEP_INTERVAL_SECONDS = 60.0
DEFAULT_MAX_COMMIT_DELAY_SECONDS = 0.010
#: Longest duration a *_seconds setting takes: 100 years. Durations become
#: nanosecond times (now + duration); inf, NaN and anything far longer
#: cannot be one, and made every write or sweep that used them fail.
MAX_DURATION_SECONDS = 100 * 365 * 24 * 3600


def check_duration(name: str, seconds: float | None) -> None:
    """ValueError naming ``name`` unless ``seconds`` is None or at most MAX_DURATION_SECONDS (NaN is not)."""
    if seconds is not None and not seconds <= MAX_DURATION_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_DURATION_SECONDS} seconds (100 years), got {seconds}")


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

    #: Keep at least the newest N versions of each session (None = all).
    keep_last_versions: int | None = None
    #: Drop versions older than this many seconds (None = never).
    max_version_age_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.keep_last_versions is not None and self.keep_last_versions < 1:
            raise ValueError(f"keep_last_versions must be >= 1 or None, got {self.keep_last_versions}")
        if self.max_version_age_seconds is not None and self.max_version_age_seconds <= 0:
            raise ValueError(f"max_version_age_seconds must be > 0 or None, got {self.max_version_age_seconds}")
        check_duration("max_version_age_seconds", self.max_version_age_seconds)

    @property
    def enabled(self) -> bool:
        return self.keep_last_versions is not None or self.max_version_age_seconds is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Everything the store needs; the defaults suit a laptop."""

    #: Directory holding the LMDB environment (created if missing).
    data_dir: Path
    #: Initial LMDB map size. The map doubles when full, up to the cap.
    map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES
    #: The map never grows past this; a write that needs more fails with
    #: StoreFull (RESOURCE_EXHAUSTED) and changes nothing.
    max_map_size_bytes: int = DEFAULT_MAX_MAP_SIZE_BYTES
    durability: Durability = Durability.SYNC
    #: Memory for latest states of recently used sessions (the hot path when
    #: an agent restarts but the sidecar did not). Each entry counts its state
    #: and ~0.7 KB besides (id, metadata, labels), so tiny states fit fewer
    #: entries than the bytes of their states alone would suggest.
    cache_size_bytes: int = DEFAULT_CACHE_SIZE_BYTES
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
    encoder_cache_bytes: int = DEFAULT_ENCODER_CACHE_BYTES
    chain_policy: ChainPolicy = field(default_factory=ChainPolicy)
    retention: Retention = field(default_factory=Retention)
    #: Once a session has written nothing for this many seconds, the sweeper
    #: rewrites its head's frame, if a DELTA or PATCH, as a FULL frame of the
    #: same state (same version, same bytes), so the cold read that resumes it
    #: decodes one frame instead of a chain, and its next write starts a new
    #: chain. Costs a FULL frame less a delta per quiet period on disk, and
    #: the writer a decode and a compress per session going quiet. None: off.
    keyframe_after_quiet_seconds: float | None = None
    #: How long a request id deduplicates retries: a retry later than this
    #: after the first write is a new write. Exact (checked on every put);
    #: the sweeper only frees the records' space.
    request_id_ttl_seconds: float = DEFAULT_REQUEST_ID_TTL_SECONDS
    #: How often the sweeper runs: retention, request-id expiry, quiet keyframes.
    sweep_interval_seconds: float = DEFAULT_SWEEP_INTERVAL_SECONDS
    #: Largest state (REPLACE) or resulting state (MERGE) accepted.
    max_state_bytes: int = 64 * 1024 * 1024
    #: Most writes committed in one LMDB transaction.
    max_batch_writes: int = 512
    #: Longest the writer waits before a commit for the writers it expects:
    #: as many as the last commit let go on (a put_many counts once; a
    #: PutStream batch or a thread pipelining submit() counts as its writes)
    #: plus the writes queued while it ran. Writers a commit answers usually
    #: write again at once, and a commit's flush costs about the same for 60
    #: writes as for 30; without the wait, 64 writer threads settle into two
    #: half-size batches taking turns, two flushes where one would do. The
    #: wait ends as soon as they are queued, and is at most the last
    #: commit's duration (plus the OS's timer slack, ~0.1-0.3 ms on a busy
    #: VM), so a write waits at most about as long again as its commit takes;
    #: there is none while writers wait for room under
    #: max_queued_write_bytes (they could not queue). A lone writer waits
    #: only once, on its first write after a burst of others ends. 0: commit
    #: whatever is queued at once.
    max_commit_delay_seconds: float = DEFAULT_MAX_COMMIT_DELAY_SECONDS
    #: Most bytes of states queued for the writer and not yet answered (the
    #: write backlog's memory). Past it, blocking writes (put, submit,
    #: put_many) wait for room and asyncio writes (asubmit, so the sidecar's
    #: unary Puts) fail at once with Overloaded (UNAVAILABLE: retry with the
    #: same request_id). A write is always taken when nothing is queued, so
    #: one larger than this still goes, alone.
    max_queued_write_bytes: int = DEFAULT_MAX_QUEUED_WRITE_BYTES
    #: LMDB reader slots: concurrent read transactions across threads.
    max_readers: int = 512
    #: Full name of the protobuf message type that MERGE states hold (e.g.
    #: "ckpt.v1.Checkpoint"; its _pb2 module must be imported). Set, the FULL
    #: frame starting each chain of a MERGE session holds the state compacted:
    #: parsed and re-serialized, so fields later patches overwrote are dropped
    #: (when that saves >= 10%); and every MERGE patch must parse as that type.
    #: None (default): a MERGE state is all its patches concatenated, so a
    #: session that rewrites the same fields grows by every patch, without bound.
    merge_message_type: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
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
        if isinstance(self.max_readers, bool) or not isinstance(self.max_readers, int):
            raise TypeError(f"max_readers must be an int, not {type(self.max_readers).__name__}")
        if self.max_readers < 1:
            raise ValueError(f"max_readers must be >= 1, got {self.max_readers}")
        for name in ("cache_size_bytes", "encoder_cache_entries", "encoder_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("request_id_ttl_seconds", "sweep_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
            check_duration(name, getattr(self, name))
        if not 1 <= self.max_state_bytes <= 0xFFFF_FFFF:
            raise ValueError(f"max_state_bytes must be in 1..{0xFFFF_FFFF}, got {self.max_state_bytes}")
        if self.max_batch_writes < 1:
            raise ValueError(f"max_batch_writes must be >= 1, got {self.max_batch_writes}")
        if not 0 <= self.max_commit_delay_seconds <= 1:
            raise ValueError(f"max_commit_delay_seconds must be in 0..1, got {self.max_commit_delay_seconds}")
        if self.keyframe_after_quiet_seconds is not None and not self.keyframe_after_quiet_seconds > 0:
            raise ValueError(
                f"keyframe_after_quiet_seconds must be > 0 or None, got {self.keyframe_after_quiet_seconds}"
            )
        check_duration("keyframe_after_quiet_seconds", self.keyframe_after_quiet_seconds)
        if self.max_queued_write_bytes < 1:
            raise ValueError(f"max_queued_write_bytes must be >= 1, got {self.max_queued_write_bytes}")
        self.merge_message_class()  # fails now, naming the field, not at the first MERGE

    def merge_message_class(self) -> type[Message] | None:
        """The class named by ``merge_message_type`` (None if unset)."""
        if self.merge_message_type is None:
            return None
        try:
            descriptor = descriptor_pool.Default().FindMessageTypeByName(self.merge_message_type)
        except KeyError:
            raise ValueError(
                f"merge_message_type {self.merge_message_type!r} is not a protobuf message type known to this"
                " process (import its _pb2 module first; ckpt.v1.Checkpoint is always known)"
            ) from None
        return message_factory.GetMessageClass(descriptor)


#: The event loops `ckpt serve` can run on (ServeConfig.event_loop).
EVENT_LOOPS = ("uvloop", "asyncio")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """How `ckpt serve` runs. Every field has a CKPT_* environment variable (see cli.py)."""

    data_dir: Path
    #: "unix:/path" or "host:port"; default: a unix socket in the data directory.
    listen: tuple[str, ...] = ()
    #: Largest message received or sent, both directions. States may be up
    #: to this less MESSAGE_ENVELOPE_BYTES (64 KiB), so a Get can return any
    #: state a Put stored.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Threads for store calls that may block: reads the state cache misses,
    #: listings, forks, deletes. RPCs themselves run on one event loop, and
    #: writes wait for their group commit without holding a thread.
    threads: int = 16
    #: Seconds in-flight RPCs get to finish on SIGTERM/SIGINT.
    grace_seconds: float = 10.0
    #: The event loop every RPC runs on: "uvloop" (libuv's, in C; a separate
    #: package, installed with ckpt except on Windows) or "asyncio" (the
    #: standard library's). See EVENT_LOOPS.
    event_loop: str = "uvloop"
    #: Sidecar processes serving the data directory on the same TCP ports
    #: (the kernel spreads connections over them); each has its own event
    #: loop, writer and caches. Needs TCP addresses: gRPC cannot share a unix
    #: socket between processes. See workers.py.
    workers: int = 1
    #: TLS on every host:port listener (tls.py): this PEM certificate chain
    #: and its key. Unix sockets stay plaintext (their file's permissions guard them).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: With TLS: take only clients whose certificate this PEM CA signed (mutual TLS).
    tls_client_ca_file: Path | None = None
    #: Serve Prometheus metrics on METRICS_ADDRESS:PORT (None = off).
    metrics_port: int | None = None
    #: Where /metrics listens: 127.0.0.1 (this host only), or 0.0.0.0 / ::
    #: for a Prometheus outside the sidecar's container.
    metrics_address: str = "127.0.0.1"
    durability: Durability = Durability.SYNC
    cache_size_bytes: int = DEFAULT_CACHE_SIZE_BYTES
    encoder_cache_bytes: int = DEFAULT_ENCODER_CACHE_BYTES
    #: With store_process: serialized replies to latest-version Gets that the
    #: gRPC process keeps and answers again while LMDB's committed head is
    #: still their version (replycache.py), without the store process. 0 = off.
    reply_cache_bytes: int = DEFAULT_REPLY_CACHE_BYTES
    max_map_size_bytes: int = DEFAULT_MAX_MAP_SIZE_BYTES
    #: Most bytes of states waiting for the writer (StoreConfig.max_queued_write_bytes).
    max_queued_write_bytes: int = DEFAULT_MAX_QUEUED_WRITE_BYTES
    #: Longest a commit waits for the writers it expects (StoreConfig.max_commit_delay_seconds).
    max_commit_delay_seconds: float = DEFAULT_MAX_COMMIT_DELAY_SECONDS
    retention: Retention = field(default_factory=Retention)
    #: Every this many seconds, if the sidecar served anything since the last
    #: time, return the C heap's free memory to the OS (glibc malloc_trim; see
    #: heap.py). 0 = never.
    heap_trim_interval_seconds: float = 30.0
    #: Rewrite a quiet session's head as a FULL frame (StoreConfig.keyframe_after_quiet_seconds).
    keyframe_after_quiet_seconds: float | None = None
    #: How long a request id deduplicates retries (StoreConfig.request_id_ttl_seconds).
    request_id_ttl_seconds: float = DEFAULT_REQUEST_ID_TTL_SECONDS
    #: How often the sweeper runs (StoreConfig.sweep_interval_seconds).
    sweep_interval_seconds: float = DEFAULT_SWEEP_INTERVAL_SECONDS
    chain_policy: ChainPolicy = field(default_factory=ChainPolicy)
    #: Compact MERGE states as this protobuf message type (see StoreConfig).
    merge_message_type: str | None = None
    #: Also serve the benchmark echo method (bench/ only).
    bench_echo: bool = False
    #: Run the store (and the CheckpointService on it) in a process of its own,
    #: this one forwarding each call's bytes (storehost.py): the store's writer
    #: then has a GIL of its own, not the one gRPC's event loop turns on.
    #: False: everything in this one process.
    store_process: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.max_message_bytes < 2 * MESSAGE_ENVELOPE_BYTES:
            raise ValueError(
                f"max_message_bytes must be >= {2 * MESSAGE_ENVELOPE_BYTES} (twice the {MESSAGE_ENVELOPE_BYTES}-byte"
                f" envelope kept for ids and labels), got {self.max_message_bytes}"
            )
        if self.max_message_bytes > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"max_message_bytes must be <= {MAX_MESSAGE_BYTES} (2 GiB - 1, gRPC's limit),"
                f" got {self.max_message_bytes}"
            )
        if self.max_map_size_bytes < 1024 * 1024:
            raise ValueError(f"max_map_size_bytes must be >= 1 MiB, got {self.max_map_size_bytes}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.reply_cache_bytes < 0:
            raise ValueError(f"reply_cache_bytes must be >= 0 (0 = off), got {self.reply_cache_bytes}")
        if self.grace_seconds < 0:
            raise ValueError(f"grace_seconds must be >= 0, got {self.grace_seconds}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        if self.workers > 1:
            for address in self.addresses:
                _, sep, port = address.rpartition(":")
                if address.startswith("unix:") or not sep or not port.isdigit() or int(port) == 0:
                    raise ValueError(
                        f"workers > 1 needs TCP listen addresses with a fixed port (host:port), got {address!r}:"
                        " gRPC cannot share a unix socket between processes, and every worker binds the same port"
                    )
        if not self.heap_trim_interval_seconds >= 0:
            raise ValueError(
                f"heap_trim_interval_seconds must be >= 0 (0 = never), got {self.heap_trim_interval_seconds}"
            )
        check_duration("grace_seconds", self.grace_seconds)
        check_duration("heap_trim_interval_seconds", self.heap_trim_interval_seconds)
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        if self.metrics_address.startswith("[") and self.metrics_address.endswith("]"):  # as in --listen [::1]:N
            object.__setattr__(self, "metrics_address", self.metrics_address[1:-1])
        if not self.metrics_address or self.metrics_address != self.metrics_address.strip():
            raise ValueError(f"metrics_address must be an IP address or host name, got {self.metrics_address!r}")
        self._check_tls()
        self.store_config()  # its checks fail now, before anything is bound

    def _check_tls(self) -> None:
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.tls_cert_file is None and self.tls_key_file is None:
            if self.tls_client_ca_file is not None:
                raise ValueError(
                    "tls_client_ca_file needs tls_cert_file and tls_key_file (the sidecar's own certificate)"
                )
            return
        if self.tls_cert_file is None or self.tls_key_file is None:
            raise ValueError("tls_cert_file and tls_key_file go together: give both or neither")
        if all(address.startswith("unix:") for address in self.addresses):
            raise ValueError(
                "tls_cert_file is set, but every listen address is a unix socket, which is served without TLS:"
                " add a host:port address"
            )
        self.server_credentials()  # a bad file fails now, naming its field

    @property
    def tls_mode(self) -> str:
        """What the start-up log says of the host:port listeners: off, on, or mutual (client certificates)."""
        if self.tls_cert_file is None:
            return "off"
        return "on" if self.tls_client_ca_file is None else "mutual"

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials for the host:port listeners (None: plaintext)."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return tls.server_credentials(
            cert_file=self.tls_cert_file, key_file=self.tls_key_file, client_ca_file=self.tls_client_ca_file
        )

    @property
    def max_state_bytes(self) -> int:
        """Largest state a Put may store or a MERGE may grow to."""
        return self.max_message_bytes - MESSAGE_ENVELOPE_BYTES

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.listen or (f"unix:{self.data_dir.resolve() / 'ckpt.sock'}",)

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            data_dir=self.data_dir,
            durability=self.durability,
            cache_size_bytes=self.cache_size_bytes,
            encoder_cache_bytes=self.encoder_cache_bytes,
            # The initial map shrinks to a small cap rather than refusing it.
            map_size_bytes=min(DEFAULT_MAP_SIZE_BYTES, self.max_map_size_bytes),
            max_map_size_bytes=self.max_map_size_bytes,
            max_queued_write_bytes=self.max_queued_write_bytes,
            max_commit_delay_seconds=self.max_commit_delay_seconds,
            max_state_bytes=self.max_state_bytes,
            retention=self.retention,
            keyframe_after_quiet_seconds=self.keyframe_after_quiet_seconds,
            request_id_ttl_seconds=self.request_id_ttl_seconds,
            sweep_interval_seconds=self.sweep_interval_seconds,
            chain_policy=self.chain_policy,
            merge_message_type=self.merge_message_type,
        )
