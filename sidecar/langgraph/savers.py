"""CkptSaver and AsyncCkptSaver: LangGraph checkpointers (``BaseCheckpointSaver``) on ckpt.

Both run the operations of operations.py, blocking or awaiting, against a sidecar (a client) or an
in-process Store (``embedded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Generator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..client import AsyncCheckpointClient, CheckpointClient
from .backends import AsyncClientBackend, ClientBackend
from .calls import Call, Op, Out
from .operations import Operations

if TYPE_CHECKING:
    from .storebackend import StoreBackend


def _drive(backend: Any, op: Op) -> Generator[CheckpointTuple, None, Any]:
    """Run ``op`` against a blocking backend: yield what it outputs, return what it returns."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = error = None
        if isinstance(step, Out):
            yield step.item
            continue
        try:
            answer = getattr(backend, step.method)(*step.args)
        except BaseException as exc:  # the operation decides: it catches what it expects, the rest propagates
            error = exc


def _run(backend: Any, op: Op) -> Any:
    steps = _drive(backend, op)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


async def _acall(backend: Any, call: Call) -> Any:
    return await getattr(backend, call.method)(*call.args)


async def _aiterate(backend: Any, op: Op) -> AsyncIterator[CheckpointTuple]:
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(answer)
        except StopIteration:
            return
        answer = error = None
        if isinstance(step, Out):
            yield step.item
            continue
        try:
            answer = await _acall(backend, step)
        except BaseException as exc:  # a cancellation too, so that the operation sees its call end
            error = exc


async def _arun(backend: Any, op: Op) -> Any:
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = error = None
        if isinstance(step, Out):  # only list outputs items, through _aiterate
            raise TypeError(f"an operation run for its result output {step!r}")
        try:
            answer = await _acall(backend, step)
        except BaseException as exc:  # a cancellation too, so that the operation sees its call end
            error = exc


def _with_allowlist(saver: Any, clone: Any) -> Any:
    """``clone`` (BaseCheckpointSaver.with_allowlist's copy of ``saver``, with a serializer of its own) running
    its operations with that serializer. They share the rest with ``saver``'s: the store, and what it
    remembers of it (the heads, ids and seqs seen), as both write the same threads."""
    if clone is not saver:
        clone._ops = saver._ops.with_serde(clone.serde)
    return clone


def _next_version(current: str | int | None) -> str:
    # InMemorySaver's and PostgresSaver's versions: a counter, then a random tie-breaker for
    # concurrent branches.
    number = 0 if current is None else current if isinstance(current, int) else int(current.split(".")[0])
    return f"{number + 1:032}.{random.random():016}"


class CkptSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a ckpt sidecar: ``CkptSaver("unix:data/ckpt.sock")``, or
    ``CkptSaver(client=...)`` with a ``CheckpointClient`` the caller owns; ``CkptSaver.embedded("data")``
    on a data directory this process alone opens. A context manager; ``close()`` closes what it opened.

    Each step stores what changed (the channels LangGraph reports as new), each pending write durably
    with its checkpoint. A put that continues a head another writer moved since raises
    ``CheckpointConflictError`` (see docs/langgraph.md). ``client_options`` are ``CheckpointClient``'s
    (``timeout_seconds``, ``tls``...). The async methods run the sync ones on a thread.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        serde: SerializerProtocol | None = None,
        client: CheckpointClient | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__(serde=serde)
        if (target is None) == (client is None):
            raise TypeError("CkptSaver takes a target (the sidecar's address) or a client, one of them")
        if client is None:
            assert target is not None  # checked above
            client = CheckpointClient(target, **client_options)
            self._setup(ClientBackend(client), client.close)
        else:
            self._setup(ClientBackend(client), lambda: None)

    def _setup(self, backend: Any, close: Callable[[], None]) -> None:
        self._backend = backend
        self._close = close
        self._ops = Operations(self.serde)
        self._registered = False
        self._registering = threading.Lock()

    def _ready(self) -> Any:
        """The backend, once the Step type is registered: by the first call, so that the saver can be made
        before its sidecar serves (as AsyncCkptSaver's); a failed registration is tried again by the next."""
        if not self._registered:
            with self._registering:
                if not self._registered:
                    self._backend.register()
                    self._registered = True
        return self._backend

    @classmethod
    def embedded(cls, data_dir: str | Path, *, serde: SerializerProtocol | None = None) -> Self:
        """A saver on an in-process store in ``data_dir`` (created if missing; one process at a time)."""
        from .storebackend import StoreBackend  # the store engine: not for a saver on a sidecar

        backend = StoreBackend.open(data_dir)
        saver = cls.__new__(cls)
        BaseCheckpointSaver.__init__(saver, serde=serde)
        saver._setup(backend, backend.store.close)
        return saver

    @classmethod
    @contextmanager
    def from_conn_string(cls, target: str, **options: Any) -> Iterator[Self]:
        """A saver on the sidecar at ``target``, closed on leaving the block."""
        with cls(target, **options) as saver:
            yield saver

    def close(self) -> None:
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_next_version(self, current: str | None, channel: None) -> str:
        return _next_version(current)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> BaseCheckpointSaver[str]:
        # What compile() calls under LANGGRAPH_STRICT_MSGPACK: the graph's types are read back with the copy.
        clone: BaseCheckpointSaver[str] = _with_allowlist(self, super().with_allowlist(extra_allowlist))
        return clone

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = _run(self._ready(), self._ops.get_tuple(config))
        return result

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from _drive(self._ready(), self._ops.list(config, filter, before, limit))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = _run(self._ready(), self._ops.put(config, checkpoint, metadata, new_versions))
        return result

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        _run(self._ready(), self._ops.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        _run(self._ready(), self._ops.delete_thread(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        _run(self._ready(), self._ops.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        _run(self._ready(), self._ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        _run(self._ready(), self._ops.prune(thread_ids, strategy))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = self.list(config, filter=filter, before=before, limit=limit)
        done = object()
        while (item := await asyncio.to_thread(next, items, done)) is not done:
            yield item  # type: ignore[misc]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


class _ThreadedStore:
    """A StoreBackend for asyncio: each call on a worker thread, the loop never blocked on storage."""

    def __init__(self, backend: StoreBackend) -> None:
        self._backend = backend

    def __getattr__(self, method: str) -> Callable[..., Any]:
        call = getattr(self._backend, method)

        async def threaded(*args: Any) -> Any:
            return await asyncio.to_thread(call, *args)

        return threaded


class AsyncCkptSaver(BaseCheckpointSaver[str]):
    """:class:`CkptSaver` for asyncio: ``AsyncCkptSaver("unix:data/ckpt.sock")`` (grpc.aio), or
    ``client=`` an ``AsyncCheckpointClient``; ``AsyncCkptSaver.embedded("data")``. An async context
    manager; ``aclose()``. The sync methods may be called from other threads while the saver's loop runs
    (as LangGraph's sync APIs do), never from that loop."""

    def __init__(
        self,
        target: str | None = None,
        *,
        serde: SerializerProtocol | None = None,
        client: AsyncCheckpointClient | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__(serde=serde)
        if (target is None) == (client is None):
            raise TypeError("AsyncCkptSaver takes a target (the sidecar's address) or a client, one of them")
        if client is None:
            assert target is not None  # checked above
            client = AsyncCheckpointClient(target, **client_options)
            self._setup(AsyncClientBackend(client), client.close)
        else:
            self._setup(AsyncClientBackend(client), None)

    def _setup(self, backend: Any, aclose: Callable[[], Awaitable[None]] | None) -> None:
        self._backend = backend
        self._aclose = aclose
        self._ops = Operations(self.serde)
        self._registered: asyncio.Future[None] | None = None
        # The loop the sync methods hand their calls to: the one the saver is made on, entered on (async
        # with) or last used on; a worker thread's call before any async one then finds it.
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    @classmethod
    def embedded(cls, data_dir: str | Path, *, serde: SerializerProtocol | None = None) -> Self:
        """A saver on an in-process store in ``data_dir`` (one process at a time); storage calls run on
        worker threads."""
        from .storebackend import StoreBackend  # the store engine: not for a saver on a sidecar

        backend = StoreBackend.open(data_dir)

        async def close() -> None:
            await asyncio.to_thread(backend.store.close)

        saver = cls.__new__(cls)
        BaseCheckpointSaver.__init__(saver, serde=serde)
        saver._setup(_ThreadedStore(backend), close)
        return saver

    @classmethod
    @asynccontextmanager
    async def from_conn_string(cls, target: str, **options: Any) -> AsyncIterator[Self]:
        """A saver on the sidecar at ``target``, closed on leaving the block."""
        async with cls(target, **options) as saver:
            yield saver

    async def aclose(self) -> None:
        if self._aclose is not None:
            await self._aclose()

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def get_next_version(self, current: str | None, channel: None) -> str:
        return _next_version(current)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> BaseCheckpointSaver[str]:
        # What compile() calls under LANGGRAPH_STRICT_MSGPACK: the graph's types are read back with the copy.
        clone: BaseCheckpointSaver[str] = _with_allowlist(self, super().with_allowlist(extra_allowlist))
        return clone

    async def _ready(self) -> None:
        # The Step type is registered once, by the first call; concurrent first calls share it. The sync
        # methods hand their calls to the loop the saver was last used on (a program may asyncio.run twice);
        # a registration left unfinished on an earlier loop is made again on this one.
        loop = self._loop = asyncio.get_running_loop()
        if self._registered is None or (not self._registered.done() and self._registered.get_loop() is not loop):
            self._registered = asyncio.ensure_future(self._backend.register())
        try:
            await asyncio.shield(self._registered)
        except BaseException:
            if self._registered.done():
                self._registered = None  # a failed registration is tried again by the next call
            raise

    async def _arun(self, op: Op) -> Any:
        await self._ready()
        return await _arun(self._backend, op)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = await self._arun(self._ops.get_tuple(config))
        return result

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        await self._ready()
        async for item in _aiterate(self._backend, self._ops.list(config, filter, before, limit)):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = await self._arun(self._ops.put(config, checkpoint, metadata, new_versions))
        return result

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._arun(self._ops.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._ops.delete_thread(str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._ops.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._ops.prune(thread_ids, strategy))

    # The sync methods, for LangGraph's sync APIs called from another thread while the loop runs.

    def _on_loop(self, coro: Any) -> Any:
        loop = self._loop
        if loop is None or not loop.is_running():
            coro.close()
            raise RuntimeError(
                "AsyncCkptSaver's sync methods need its event loop running: make the saver on that loop, enter it"
                " there (async with), or use the async methods"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError(
                "AsyncCkptSaver's sync methods cannot be called from its own event loop (they would block it):"
                " use the async ones (ainvoke, aget_state...) or CkptSaver"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = self._on_loop(self.aget_tuple(config))
        return result

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._on_loop(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = self._on_loop(self.aput(config, checkpoint, metadata, new_versions))
        return result

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._on_loop(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._on_loop(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._on_loop(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._on_loop(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._on_loop(self.aprune(thread_ids, strategy=strategy))
