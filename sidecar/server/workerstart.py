"""A worker of ``ckpt serve --workers``: ``python -m ckpt.sidecar.server.workerstart``, its spec on stdin.

Its stop signals are recorded first thing (stopsignals.py), before workers.main imports grpc, the
server and the store: a worker its parent stops while it starts stops in order once it serves (exit 0,
its store process stopped) instead of dying of the signal's default action.
"""

from __future__ import annotations

import sys

from .stopsignals import record_early_stops

if __name__ == "__main__":
    record_early_stops()
    from .workers import main

    sys.exit(main())
