"""`python -m ckpt.sidecar.cli`: the `ckpt` command."""

import sys

if sys.argv[1:2] == ["serve"]:  # first, as the `ckpt` command does (ckpt/command.py)
    from ..server.stopsignals import record_early_stops

    record_early_stops()

from .main import main  # after the stop signals are recorded

sys.exit(main())
