"""``serve()``: what ``ckpt serve`` runs, one serving process or the parent of ``--workers``."""

from __future__ import annotations

import asyncio
import logging

from ..config import ServeConfig
from ..errors import Unavailable
from .extension import ServerExtension, current_extension
from .loops import event_loop_factory
from .serving import serve_async
from .storespawn import StoreProcess
from .workers import serve_workers

log = logging.getLogger("ckpt")


def serve(config: ServeConfig, *, extension: ServerExtension | None = None, started: StoreProcess | None = None) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP (exit code 0; SIGINT and SIGHUP unless ignored at start:
    stopsignals.py), or until the store stops taking writes (1).

    ``extension``: methods served beside the CheckpointService (extension.py); by default, the one
    an enclosing ``extended_serving`` names, if any. ``started``: the store process
    ``storespawn.start_serving_store`` started for ``config`` and ``extension``, taken over (the
    caller discards it after, in case it was not).
    """
    if extension is None:
        extension = current_extension()
    if config.workers > 1:
        return serve_workers(config, extension=extension)
    try:
        loop_factory = event_loop_factory(config.event_loop)
    except Unavailable as exc:
        log.error("ckpt cannot start: %s", exc)
        return 1
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve_async(config, extension=extension, started=started))
