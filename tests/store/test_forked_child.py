"""A Store belongs to the process that opened it: forked children are refused, and let go of the lock."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.sidecar.config import StoreConfig
from ckpt.sidecar.errors import Unavailable
from ckpt.sidecar.store import PutRequest, Store
from tests.store.support import writer_held

STATE = b"\x0a\x01x"
FORKED = "a forked child cannot use it (LMDB forbids it)"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as s:
        s.put("a", STATE)
        yield s


def in_child(
    body: Callable[[], object], *, timeout: float = 10.0, first: Callable[[], object] | None = None
) -> tuple[str, str]:
    """Run ``body`` in a forked child: (the name of what it raised or returned, its message or value).

    With ``first``, the parent runs it after the fork, and the child begins only once it has.
    """
    read_fd, write_fd = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.read(go_read, 1)
            try:
                value = body()
                answer = ("returned", "" if value is None else str(value))
            except BaseException as exc:
                answer = (type(exc).__name__, str(exc))
            os.write(write_fd, pickle.dumps(answer))
        finally:
            os._exit(0)
    os.close(write_fd)
    os.close(go_read)
    try:
        if first is not None:
            first()
        os.write(go_write, b"x")
        ready, _, _ = select.select([read_fd], [], [], timeout)
        if not ready:
            os.kill(pid, 9)
            pytest.fail(f"the child did not answer within {timeout} s")
        with os.fdopen(read_fd, "rb", closefd=False) as pipe:
            answer = pickle.loads(pipe.read())
    finally:
        os.close(read_fd)
        os.close(go_write)
        os.waitpid(pid, 0)
    return answer  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.put("a", STATE), id="put"),
        pytest.param(lambda s: s.get("a"), id="get-cached"),
        pytest.param(lambda s: s.get("a", use_cache=False), id="get-cold"),
        pytest.param(lambda s: s.list_sessions(), id="list_sessions"),
        pytest.param(lambda s: s.put_many([PutRequest("a", STATE)]), id="put_many"),
        pytest.param(lambda s: s.delete_session("a"), id="delete_session"),
    ],
)
def test_a_forked_child_is_refused_the_parents_store_at_once(store: Store, call: Callable[[Store], Any]) -> None:
    name, message = in_child(lambda: _raise_first(call(store)))
    assert name == "Unavailable", message
    assert f"this Store was opened in process {os.getpid()}; {FORKED}" in message
    assert "'spawn' or 'forkserver'" in message
    assert store.put("a", STATE).version == 2  # the parent's store goes on
    assert store.get("a", use_cache=False).version == 2


def _raise_first(results: object) -> None:
    for result in results if isinstance(results, list) else []:  # put_many answers errors in its list
        if isinstance(result, BaseException):
            raise result


def test_a_forked_child_is_refused_asyncio_writes(store: Store) -> None:
    async def write() -> None:
        await store.asubmit(PutRequest("a", STATE))

    name, message = in_child(lambda: asyncio.run(write()))
    assert (name, FORKED in message) == ("Unavailable", True), message


def test_closing_the_store_in_a_forked_child_leaves_the_parents_open(store: Store) -> None:
    assert in_child(store.close) == ("returned", "")
    assert store.put("a", STATE).version == 2


def _open_and_put(data_dir: Path) -> str:
    with Store(StoreConfig(data_dir=data_dir)) as own:
        return f"{own.get('a').version} {own.put('a', b'child').version}"


def _open_read_only(data_dir: Path) -> int:
    with Store(StoreConfig(data_dir=data_dir), readonly=True) as own:
        return own.get("a", use_cache=False).version


def test_a_forked_child_opens_its_own_store_once_the_parent_closed_its_own(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = Store(StoreConfig(data_dir=data_dir))
    store.put("a", STATE)

    def in_the_child() -> str:
        store.close()  # does nothing in the child
        return _open_and_put(data_dir)

    assert in_child(in_the_child, first=store.close) == ("returned", "1 2")
    with Store(StoreConfig(data_dir=data_dir)) as reopened:
        assert reopened.get("a").version == 2
        assert reopened.get("a").state == b"child"


def test_a_forked_child_opens_the_directory_read_only_beside_the_parents_store(store: Store) -> None:
    data_dir = store.config.data_dir
    assert in_child(lambda: _open_read_only(data_dir)) == ("returned", "1")
    assert store.put("a", STATE).version == 2  # the parent's store goes on
    assert store.get("a", use_cache=False).version == 2
    assert in_child(lambda: _open_read_only(data_dir)) == ("returned", "2")


def _open_in_worker(data_dir: Path, readonly: bool) -> int:
    with Store(StoreConfig(data_dir=data_dir), readonly=readonly) as own:
        return own.get("a", use_cache=False).version


def test_a_fork_pool_worker_opens_the_directory_read_only_then_writable(store: Store) -> None:
    data_dir = store.config.data_dir
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_open_in_worker, (data_dir, True)) == 1  # beside the parent's store
        store.close()
        assert pool.apply(_open_in_worker, (data_dir, False)) == 1  # the same worker, the parent's closed


@pytest.mark.parametrize("under_way", ["read", "commit"])
def test_a_child_forked_during_a_read_or_commit_says_it_cannot_open_the_directory(store: Store, under_way: str) -> None:
    data_dir = store.config.data_dir
    if under_way == "read":
        with store._read():  # a read transaction of the parent's as it forks
            name, message = in_child(lambda: _open_read_only(data_dir))
            assert store.get("a", use_cache=False).version == 1  # the parent reads on
    else:
        with writer_held(store):  # the writer thread inside its write transaction as the parent forks
            name, message = in_child(lambda: _open_read_only(data_dir))
    assert name == "Unavailable", message
    assert f"data directory {data_dir} cannot be opened in this process: it was forked while" in message
    assert "'spawn' or 'forkserver'" in message
    assert store.put("a", STATE).version == 2
    assert store.get("a", use_cache=False).version == 2


def _open_elsewhere(data_dir: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from pathlib import Path; from ckpt.sidecar.config import StoreConfig;"
        " from ckpt.sidecar.store import Store; Store(StoreConfig(data_dir=Path(sys.argv[1]))).close()"
    )
    return subprocess.run([sys.executable, "-c", code, str(data_dir)], capture_output=True, text=True, timeout=60)


def test_a_live_forked_child_does_not_keep_the_directory_locked(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = Store(StoreConfig(data_dir=data_dir))
    store.put("a", STATE)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # an idle child (a pool's worker): lives until the parent says
        os.close(write_fd)
        os.read(read_fd, 1)
        os._exit(0)
    os.close(read_fd)
    try:
        # The child's copy of the lock is gone, but the parent's still holds it.
        refused = _open_elsewhere(data_dir)
        assert refused.returncode != 0
        assert f"in use by pid {os.getpid()}" in refused.stderr
        store.close()
        with Store(StoreConfig(data_dir=data_dir)) as again:  # in the parent, the child still alive
            assert again.get("a").version == 1
        opened = _open_elsewhere(data_dir)  # and in another process
        assert opened.returncode == 0, opened.stderr
    finally:
        os.close(write_fd)
        os.waitpid(pid, 0)


def _length(items: list[Any]) -> int:
    return len(items)


def test_a_store_cannot_be_pickled_or_sent_to_a_pool(store: Store) -> None:
    with pytest.raises(TypeError, match="a Store cannot be sent to another process: open a Store there"):
        pickle.dumps(store)
    fails = pytest.raises(TypeError, match="a Store cannot be sent to another process")
    with multiprocessing.get_context("fork").Pool(1) as pool, fails:
        pool.apply_async(_length, ([store],)).get(30)
    assert store.get("a", use_cache=False).version == 1


def test_a_closed_store_still_says_it_is_closed(store: Store) -> None:
    store.close()
    with pytest.raises(Unavailable, match=r"^the store is closed$"):
        store.get("a")
