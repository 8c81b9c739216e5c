"""ckpt itself, as the harness measures it: the store embedded in the process, and a real ``ckpt serve``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import grpc

from ....sidecar import Store, StoreConfig, WriteMode
from ....sidecar.client import CheckpointClient
from ....sidecar.server import SidecarProcess, start_sidecar_process
from ...output import tree_cpu_seconds
from ...sockets import ScratchSocket
from ...trajectories import Step
from .base import MODES, System, dir_bytes, same_checkpoint

#: The type every workload's states hold (built in: no RegisterType needed). Named on every write, as a
#: client that registered its schema does, so the store validates each patch and compacts each chain.
MESSAGE_TYPE = "ckpt.v1.Checkpoint"


class _Ckpt(System):
    def __init__(self, mode: str = "merge") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._write_mode = WriteMode.MERGE if mode == "merge" else WriteMode.REPLACE
        self.durability = "sync: every LMDB commit fsynced (data + meta page), group commit"

    def prepare(self, step: Step) -> bytes:
        return step.patch if self.mode == "merge" else step.state

    def matches(self, got: Any, step: Step) -> bool:
        return isinstance(got, bytes) and same_checkpoint(got, step.state)


class CkptEmbedded(_Ckpt):
    """``sidecar.Store`` in the application's process.

    Thread-safe as is: the store hands every write to its one writer thread,
    which commits whatever is queued in one transaction (group commit).
    """

    name = "ckpt-embedded"

    def __init__(self, mode: str = "merge") -> None:
        super().__init__(mode)
        self.label = f"ckpt embedded ({mode.upper()})"
        self._config: StoreConfig | None = None
        self._store: Store | None = None

    def open(self, data_dir: Path) -> None:
        self._config = StoreConfig(data_dir=data_dir)
        self._store = Store(self._config)

    def _require(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"{self.name} is not open")
        return self._store

    def put(self, session_id: str, version: int, value: Any) -> None:
        self._require().put(
            session_id, value, mode=self._write_mode, expected_version=version - 1, message_type=MESSAGE_TYPE
        )

    def get(self, session_id: str, version: int | None = None) -> bytes:
        return self._require().get(session_id, version or 0).state

    def reopen(self) -> None:
        assert self._config is not None
        self._require().close()
        self._store = Store(self._config)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def disk_bytes(self) -> int:
        assert self._config is not None
        return dir_bytes(self._config.data_dir)

    def stored_bytes(self) -> int:
        store = self._require()
        total, token = 0, ""
        while True:
            page, token = store.list_sessions(page_size=1000, page_token=token)
            total += sum(s.stored_bytes for s in page)
            if not token:
                return total


class CkptSidecar(_Ckpt):
    """A real ``ckpt serve`` subprocess, driven over its unix socket by CheckpointClient.

    One client serves every thread: gRPC channels are thread-safe and the
    client keeps no per-call state (its docstring: "Thread-safe; one per
    process is enough"), which is also how an application would use it.
    """

    name = "ckpt-sidecar"
    _LOG = "sidecar.log"

    def __init__(self, mode: str = "merge") -> None:
        super().__init__(mode)
        self.label = f"ckpt sidecar ({mode.upper()})"
        self._dir: Path | None = None
        self._socket: ScratchSocket | None = None
        self._target = ""
        self._sidecar: SidecarProcess | None = None
        self._client: CheckpointClient | None = None
        self._stopped_cpu = 0.0

    def open(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        self._socket = ScratchSocket(data_dir)
        self._target = self._socket.target
        self._start()

    def _start(self) -> None:
        assert self._dir is not None
        # The sidecar's defaults are what is measured: no CKPT_* setting from
        # the caller's environment (durability, cache size, ...) leaks in.
        self._sidecar = start_sidecar_process(
            self._dir, listen=[self._target], log_path=self._dir / self._LOG, inherit_ckpt_env=False
        )
        self._client = CheckpointClient(self._target)
        # gRPC connects on a channel's first call: connect now, so that the first read after a
        # reopen times a read, as every system's does, and not the connection's setup.
        grpc.channel_ready_future(self._client._channel).result(timeout=60)

    def _stop(self) -> None:
        """SIGTERM the sidecar, wait for exit 0, and bank the CPU it used: its store process's included."""
        if self._client is not None:
            self._client.close()
            self._client = None
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is None:
            return
        process = sidecar.process
        process.send_signal(signal.SIGTERM)
        # Wait for the exit without reaping it (WNOWAIT): a zombie's /proc
        # stat still holds its final CPU times, including the shutdown's, and
        # those of the store process it reaped on the way out.
        deadline = time.monotonic() + 60
        while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                process.kill()
                break
            time.sleep(0.01)
        self._stopped_cpu += tree_cpu_seconds(process.pid)
        code = process.wait()
        if code != 0:
            raise RuntimeError(f"ckpt serve exited with {code} on SIGTERM:\n{sidecar.log(tail_chars=4000)}")

    def _require(self) -> CheckpointClient:
        if self._client is None:
            raise RuntimeError(f"{self.name} is not open")
        return self._client

    def put(self, session_id: str, version: int, value: Any) -> None:
        client = self._require()
        if self.mode == "merge":
            client.merge(session_id, value, expected_version=version - 1, message_type=MESSAGE_TYPE)
        else:
            client.put(session_id, value, expected_version=version - 1, message_type=MESSAGE_TYPE)

    def get(self, session_id: str, version: int | None = None) -> bytes:
        return bytes(self._require().get(session_id, version or 0).state)

    def reopen(self) -> None:
        self._stop()
        self._start()

    def close(self) -> None:
        try:
            self._stop()
        finally:
            if self._socket is not None:
                self._socket.remove()

    def disk_bytes(self) -> int:
        assert self._dir is not None
        return dir_bytes(self._dir, exclude=frozenset({self._LOG}))

    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self._require().sessions(page_size=1000))

    def server_cpu_seconds(self) -> float:
        """CPU seconds of every process of the sidecar (gRPC process and store process), since ``open``."""
        live = tree_cpu_seconds(self._sidecar.pid) if self._sidecar is not None else 0.0
        return self._stopped_cpu + live
