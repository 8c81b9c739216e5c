"""The sidecar's gRPC process: the gRPC server on every address, health, reflection, and the link to its store.

Every CheckpointService call is forwarded to the store process (storelink.py),
which owns the store; this process answers health checks, reflection, the
Gets its reply cache holds or reads, and the small ReadEvents it reads.
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..config import ServeConfig
from ..store import Store
from .blobstreams import BlobStreams
from .extension import ServerExtension
from .forwarding import add_extension, add_forwarded_service
from .heap import HeapTrimmer
from .listening import UnixSocket, bind, reachable_from_other_hosts, remove_unix_socket
from .methods import SERVICE_NAME
from .replycache import ReplyCache
from .storelink import StoreLink

log = logging.getLogger("ckpt")

# Starts the line logged once the server serves, which ends " pid=N" (process.py waits for it).
SERVING_LOG = "ckpt serving:"


class SidecarServer:
    """The gRPC server on every address, health and reflection, forwarding to the store process at ``link``.

    Create and use it inside a running event loop (see :func:`serving.serve_async`).
    """

    def __init__(
        self,
        config: ServeConfig,
        link: StoreLink,
        *,
        worker: int | None = None,
        extension: ServerExtension | None = None,
    ) -> None:
        """``worker``: this process is worker ``worker`` of ``config.workers`` (workers.py): its
        parent holds the data directory's lock and claimed the ports, which every worker binds.
        ``extension``: served beside the CheckpointService (extension.py)."""
        self.config = config
        self.worker = worker
        self.link = link
        #: Set when the store stopped taking writes (a failed commit) or its process died: the sidecar
        #: then stops, exit 1.
        self.writes_stopped = asyncio.Event()
        link.on_failed = self.writes_stopped.set
        #: Where the store process serves /metrics (None: off).
        self.metrics_address = link.metrics_address
        #: The Get replies this process answers itself (None: off).
        self.replies: ReplyCache | None = None
        # Read-only, beside the store process, which created the directory's LMDB before it said READY:
        # for the reply cache and the blobs' records (one LMDB environment per process).
        self.reader = Store(config.store, readonly=True)
        if config.reply_cache_bytes:
            self.replies = ReplyCache(self.reader, config.reply_cache_bytes)
        # gRPC's own memory (received messages) is this process's.
        self.heap_trimmer = (
            HeapTrimmer(config.heap_trim_interval_seconds, lambda: link.calls.started)
            if config.heap_trim_interval_seconds
            else None
        )
        #: Each unix socket this server bound, with its (st_dev, st_ino): what stop() may remove.
        self._unix_sockets: list[UnixSocket] = []
        try:
            self.health = health.aio.HealthServicer()
            self.server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", config.max_message_bytes),
                    ("grpc.max_send_message_length", config.max_message_bytes),
                    # Without this, a second server binds the same TCP port silently.
                    # Workers share their ports; their parent checked that no one else listens there.
                    ("grpc.so_reuseport", 0 if worker is None else 1),
                    # BDP probing widens a stream's receive window while its handler reads slower than
                    # the client sends: a PutBlob bound by the disk then held 6-17 MiB of what arrived
                    # ahead, where without it 2-4 (bench/HISTORY.md, "A PutBlob's window"). The window
                    # still takes in a whole message before the handler reads it, so a large Put is not
                    # slowed; a long stream over a long round trip gets a message or so per round trip.
                    ("grpc.http2.bdp_probe", 0),
                ],
            )
            blobs = BlobStreams(
                self.reader,
                link,
                max_blob_bytes=config.store.max_blob_bytes,
                max_message_bytes=config.max_message_bytes,
            )
            # A ReadEvents' pages end where the store process's would (storeside.py): the same envelope clear.
            add_forwarded_service(
                link,
                self.server,
                self.replies,
                blobs.handlers(),
                reader=self.reader,
                max_page_bytes=config.max_state_bytes,
            )
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
                self.server,
            )
            if extension is not None:
                add_extension(extension, link, self.server)
            #: The addresses served, a TCP port 0 replaced by the port bound (what the log names).
            self.listening: list[str] = []
            self._tls = config.server_credentials()
            for address in config.addresses:
                served, sock = bind(self.server, address, self._tls, shared_port=worker is not None)
                self.listening.append(served)
                if sock is not None:
                    self._unix_sockets.append(sock)
        except BaseException:
            # A later address failed: the unix sockets bound so far would be left behind.
            for sock in self._unix_sockets:
                remove_unix_socket(sock)
            self.reader.close()
            raise

    @property
    def failed(self) -> bool:
        """Whether the store stopped taking writes (or its process died): exit 1."""
        return self.link.failed

    async def start(self) -> None:
        await self.server.start()
        if self._tls is None and (exposed := [a for a in self.listening if reachable_from_other_hosts(a)]):
            log.warning(
                "serving plaintext on %s, which other hosts may reach: whoever connects can read, overwrite and"
                " delete every session; serve TLS there (--tls-cert-file, --tls-key-file, and --tls-client-ca-file"
                " to admit only your agents), or keep the port off any network you do not trust",
                ",".join(exposed),
            )
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        if self.heap_trimmer is not None:
            self.heap_trimmer.start()
        log.info(
            (SERVING_LOG if self.worker is None else f"ckpt worker {self.worker} serving:")
            + " listen=%s data_dir=%s durability=%s tls=%s metrics=%s pid=%d",
            ",".join(self.listening),
            self.config.data_dir.resolve(),
            self.config.store.durability.value,
            self.config.tls_mode,
            self.metrics_address or "off",
            os.getpid(),
        )

    async def stop(self) -> None:
        """Stop accepting, let in-flight RPCs finish, then have the store process commit and exit."""
        # Before anything yields: the calls that reach the store from here on are those counted already,
        # exactly what the wait for idle below waits for; one gRPC took before its stop and whose handler
        # starts later is refused UNAVAILABLE unsent, not committed and then cancelled by stop(None).
        self.link.stop_calls()
        log.info("ckpt stopping: listen=%s data_dir=%s", ",".join(self.listening), self.config.data_dir.resolve())
        await self.health.enter_graceful_shutdown()
        self.link.stop_streams()
        stopping = asyncio.ensure_future(self.server.stop(self.config.grace_seconds))
        idle = asyncio.ensure_future(self.link.calls.idle.wait())
        await asyncio.wait((stopping, idle), return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            # The service's own calls are done; what is left is health Watch or
            # reflection streams, which stay open for as long as their clients
            # like and would hold the exit (and a restart) for the whole grace.
            await self.server.stop(None)
        await stopping
        idle.cancel()
        if self.heap_trimmer is not None:
            self.heap_trimmer.stop()
        if self.replies is not None:
            self.replies.close()
        self.reader.close()
        await self.link.close()
        for sock in self._unix_sockets:
            remove_unix_socket(sock)
        log.info("ckpt stopped: data_dir=%s", self.config.data_dir.resolve())
