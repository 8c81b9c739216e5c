"""How `ckpt serve` runs: ServeConfig, which holds the store's StoreConfig, and the options that set both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..limits import (
    DEFAULT_MAP_SIZE_BYTES,
    DEFAULT_MAX_MAP_SIZE_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_REPLY_CACHE_BYTES,
    MAX_MESSAGE_BYTES,
    MESSAGE_ENVELOPE_BYTES,
    check_duration,
)
from .addresses import check_listen, host_and_port, is_socket
from .option import option, option_values, options_of
from .store import Retention, StoreConfig

if TYPE_CHECKING:
    import grpc

#: The event loops `ckpt serve` can run on (ServeConfig.event_loop).
EVENT_LOOPS = ("uvloop", "asyncio")


def _store_defaults() -> StoreConfig:
    # Its data_dir and max_state_bytes are replaced by ServeConfig's own (see ServeConfig.store).
    return StoreConfig(data_dir=Path())


def _file(help_text: str) -> dict[str, Any]:
    return option(help_text, parse=Path, metavar="FILE", shown="off")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """How `ckpt serve` runs. Every field declared with ``option(...)`` is an option of the command, flag and
    CKPT_* environment variable alike (option.py); so are the store's (``store``)."""

    data_dir: Path = field(metadata=option("data directory", parse=Path, default=Path("data"), shown="./data"))
    #: "unix:/path" or "host:port"; default: a unix socket in the data directory.
    listen: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "unix:/path or host:port; repeatable", repeated=True, metavar="ADDR", shown="unix:DATA_DIR/ckpt.sock"
        ),
    )
    #: TLS on every host:port listener (tls.py): this PEM certificate chain
    #: and its key. Unix sockets stay plaintext (their file's permissions guard them).
    tls_cert_file: Path | None = field(
        default=None,
        metadata=_file(
            "serve TLS on every host:port address with this PEM certificate chain (unix sockets stay plaintext)"
        ),
    )
    tls_key_file: Path | None = field(default=None, metadata=_file("the private key of --tls-cert-file (PEM)"))
    #: With TLS: take only clients whose certificate this PEM CA signed (mutual TLS).
    tls_client_ca_file: Path | None = field(
        default=None,
        metadata=_file("with TLS, take only clients whose certificate this PEM CA signed (mutual TLS)"),
    )
    #: Serve Prometheus metrics on METRICS_ADDRESS:PORT (None = off).
    metrics_port: int | None = field(
        default=None, metadata=option("serve Prometheus metrics on METRICS_ADDRESS:PORT", parse=int, shown="off")
    )
    #: Where /metrics listens: 127.0.0.1 (this host only), or 0.0.0.0 / ::
    #: for a Prometheus outside the sidecar's container.
    metrics_address: str = field(
        default="127.0.0.1",
        metadata=option("where metrics listen: 0.0.0.0 or :: to be scraped from outside a container"),
    )
    #: Largest message received or sent, both directions. States may be up
    #: to this less MESSAGE_ENVELOPE_BYTES (64 KiB), so a Get can return any
    #: state a Put stored.
    max_message_bytes: int = field(
        default=DEFAULT_MAX_MESSAGE_BYTES, metadata=option("largest message in either direction", parse=int)
    )
    #: Serialized replies to latest-version Gets that the gRPC process keeps
    #: and answers again while LMDB's committed head is still their version
    #: (replycache.py), without the store process. 0 = off.
    reply_cache_bytes: int = field(
        default=DEFAULT_REPLY_CACHE_BYTES,
        metadata=option(
            "memory the gRPC process keeps replies to latest-version Gets in, to answer them again without the"
            " store process while they are still the committed head (0: off)",
            parse=int,
        ),
    )
    #: Threads for store calls that may block: reads the state cache misses,
    #: listings, forks, deletes. RPCs themselves run on one event loop, and
    #: writes wait for their group commit without holding a thread.
    threads: int = field(
        default=16,
        metadata=option(
            "threads for store calls that may block: cache-miss reads, listings, forks, deletes; RPCs run on one"
            " event loop",
            parse=int,
        ),
    )
    #: Sidecar processes serving the data directory on the same TCP ports
    #: (the kernel spreads connections over them); each has its own event
    #: loop, writer and caches. Needs TCP addresses: gRPC cannot share a unix
    #: socket between processes. See workers.py.
    workers: int = field(
        default=1,
        metadata=option(
            "sidecar processes serving the data directory on the same TCP ports (--listen host:port only); each"
            " has its own event loop and writer: more throughput from many client connections",
            parse=int,
        ),
    )
    #: The event loop every RPC runs on: "uvloop" (libuv's, in C; a separate
    #: package, installed with ckpt except on Windows) or "asyncio" (the
    #: standard library's). See EVENT_LOOPS.
    event_loop: str = field(
        default="uvloop",
        metadata=option(
            "the event loop RPCs run on: uvloop (libuv's, less CPU per RPC) or asyncio (the standard library's)",
            choices=EVENT_LOOPS,
        ),
    )
    #: Seconds in-flight RPCs get to finish on SIGTERM/SIGINT.
    grace_seconds: float = field(default=10.0, metadata=option("time in-flight RPCs get on shutdown", parse=float))
    #: Every this many seconds, if the sidecar served anything since the last
    #: time, return the C heap's free memory to the OS (glibc malloc_trim; see
    #: heap.py). 0 = never.
    heap_trim_interval_seconds: float = field(
        default=30.0,
        metadata=option(
            "this often, if anything was served since the last time, give the C heap's free memory back to the OS"
            " (glibc malloc_trim), which glibc otherwise keeps after a burst; while on, freed blocks up to 32 MiB"
            " are kept for reuse until the next trim rather than unmapped at once; 0 = never",
            parse=float,
        ),
    )
    #: The store the sidecar serves. Its data_dir and max_state_bytes are not
    #: its own: __post_init__ sets them to this config's data_dir and to
    #: max_message_bytes less the envelope, so any state it stores can be read back.
    store: StoreConfig = field(default_factory=_store_defaults, metadata=options_of(StoreConfig))

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
        check_listen(self.listen)
        if self.workers > 1:
            for address in self.addresses:
                if is_socket(address) or host_and_port(address)[1] == 0:
                    raise ValueError(
                        f"workers > 1 needs TCP listen addresses with a fixed port (host:port), got {address!r}:"
                        " gRPC cannot share a unix socket between processes, and every worker binds the same port"
                    )
        check_duration("grace_seconds", self.grace_seconds)
        check_duration("heap_trim_interval_seconds", self.heap_trim_interval_seconds)
        if not self.heap_trim_interval_seconds >= 0:
            raise ValueError(
                f"heap_trim_interval_seconds must be >= 0 (0 = never), got {self.heap_trim_interval_seconds}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        if self.metrics_port and self.metrics_port + self.workers - 1 > 65535:
            raise ValueError(
                f"metrics_port must be at most {65536 - self.workers} with workers {self.workers} (worker i serves"
                f" /metrics on metrics_port + i, at most 65535), got {self.metrics_port}"
            )
        if self.metrics_port:
            served = range(self.metrics_port, self.metrics_port + self.workers)
            for address in self.addresses:
                if not is_socket(address) and host_and_port(address)[1] in served:
                    ports = (
                        f" (with workers {self.workers}: {served.start}..{served.stop - 1})" if len(served) > 1 else ""
                    )
                    raise ValueError(
                        f"metrics_port {self.metrics_port}{ports} takes the port of listen address {address!r}:"
                        " give /metrics a port of its own"
                    )
        if self.metrics_address.startswith("[") and self.metrics_address.endswith("]"):  # as in --listen [::1]:N
            object.__setattr__(self, "metrics_address", self.metrics_address[1:-1])
        if not self.metrics_address or self.metrics_address != self.metrics_address.strip():
            raise ValueError(f"metrics_address must be an IP address or host name, got {self.metrics_address!r}")
        if not isinstance(self.store, StoreConfig):
            raise TypeError(f"store must be a StoreConfig, not {type(self.store).__name__}")
        self._check_tls()
        store = replace(self.store, data_dir=self.data_dir, max_state_bytes=self.max_state_bytes)
        object.__setattr__(self, "store", store)

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> ServeConfig:
        """The configuration its options give, by field name, as `ckpt serve` reads them: one flat namespace,
        the store's options beside the sidecar's. ``data_dir`` is needed; any other option absent or None keeps
        its field's default."""
        store_values = option_values(StoreConfig, values)
        store = StoreConfig(
            data_dir=values["data_dir"],
            # The initial map shrinks to a small cap rather than refusing it.
            map_size_bytes=min(
                DEFAULT_MAP_SIZE_BYTES, store_values.get("max_map_size_bytes", DEFAULT_MAX_MAP_SIZE_BYTES)
            ),
            retention=Retention(**option_values(Retention, values)),
            **store_values,
        )
        return cls(store=store, **option_values(cls, values))

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
        # Imported here: grpc (which tls imports) is not loaded before `ckpt serve` starts its store process.
        from .. import tls

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
