"""What the store process serves: the store, its metrics, the blocking pool, the CheckpointService, the heap trimmer."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..config import MESSAGE_ENVELOPE_BYTES, ServeConfig
from ..errors import Unavailable
from ..store import Store
from .heap import HeapTrimmer
from .metrics import Metrics
from .service import CheckpointService


class StoreSide:
    """The store and what serves it: its metrics, the blocking pool, the CheckpointService, the heap trimmer.

    In the store process (storehost.py). With ``worker`` (one of ``--workers``), its caches are checked
    against LMDB before use, as other processes write there too (``Store(shared=True)``).
    """

    def __init__(
        self,
        config: ServeConfig,
        *,
        worker: int | None,
        on_writes_stopped: Callable[[str], object],
        lock_holder: str | None = None,
    ) -> None:
        """``lock_holder``: who a second server on the data directory is told holds it (Store's)."""
        self.config = config
        self.store = Store(
            config.store,
            on_writes_stopped=on_writes_stopped,
            shared=worker is not None,
            sweeper=not worker,  # one sweeper for all: worker 0's
            lock_holder=lock_holder,
        )
        self.metrics = Metrics()
        try:
            self.metrics.watch(self.store)
            #: Where /metrics is served (None: off); bound first, so a port in use fails before anything serves.
            self.metrics_address: str | None = None
            if config.metrics_port is not None:
                host = config.metrics_address
                host = f"[{host}]" if ":" in host else host  # an IPv6 address
                # Each worker counts its own RPCs: worker i on METRICS_PORT + i.
                wanted = config.metrics_port + (worker or 0) if config.metrics_port else 0
                try:
                    port = self.metrics.serve(wanted, config.metrics_address)
                except OSError as exc:
                    raise Unavailable(
                        f"cannot serve metrics on {host}:{wanted} (--metrics-address,"
                        f" --metrics-port{', plus the worker index' if worker else ''}): {exc.strerror or exc}"
                    ) from None
                self.metrics_address = f"{host}:{port}"
            self._blocking = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ckpt-blocking")
            # A listing reply keeps the same envelope clear as a Get's state does.
            self.service = CheckpointService(
                self.store,
                self.metrics,
                self._blocking,
                max_page_bytes=config.max_state_bytes,
                max_message_bytes=config.max_message_bytes,
                state_limit_origin=(
                    f"max_state_bytes is the sidecar's --max-message-bytes ({config.max_message_bytes})"
                    f" less {MESSAGE_ENVELOPE_BYTES} bytes kept for the rest of a message"
                ),
            )
            self.heap_trimmer = (
                HeapTrimmer(config.heap_trim_interval_seconds, self._activity)
                if config.heap_trim_interval_seconds
                else None
            )
        except BaseException:
            self.metrics.close()
            self.store.close()
            raise

    def _activity(self) -> int:
        # Every RPC (reads too), and the sweeper's writes, which make no RPC.
        return self.store.counters.commits + self.service.calls.started

    def start(self) -> None:
        if self.heap_trimmer is not None:
            self.heap_trimmer.start()

    def close(self) -> None:
        """After the service's calls are done: commit queued writes, close LMDB, stop serving metrics."""
        self._blocking.shutdown(wait=True)
        if self.heap_trimmer is not None:
            self.heap_trimmer.stop()
        self.store.close()
        self.metrics.close()
