"""The `ckpt` command: `ckpt bench ...` goes to the benchmark harness, every other command to the sidecar's CLI.

It sits above both, so that neither package imports the other for it: the benchmarks build on the
sidecar, and the sidecar never reaches into the benchmarks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        # First, before the CLI's imports (~0.05 s, several times that on a loaded host): a stop signal
        # from now on stops the sidecar in order once it serves, rather than ending it at once.
        from ckpt.sidecar.server.stopsignals import record_early_stops

        record_early_stops()
    if args[:1] == ["bench"]:
        try:
            from ckpt.bench.harness.main import main as bench_main
        except ModuleNotFoundError as exc:  # an install without the bench extra's packages
            print(
                f"ckpt bench: the benchmark harness is not installed here ({exc});"
                " install ckpt-sidecar[bench] or run it from a source checkout",
                file=sys.stderr,
            )
            return 1
        return bench_main(args[1:])
    from ckpt.sidecar.cli.main import main as cli_main

    return cli_main(args)
