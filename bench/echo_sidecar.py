"""A sidecar that also serves the benchmarks' echo methods (bench/echo.py): `ckpt serve` with two more.

    python -m ckpt.bench.echo_sidecar [ckpt serve's options]

The benchmarks judge the sidecar's calls against an echo served by the same
processes, so that a ratio isolates what a call adds to gRPC itself. The echo
is served through the server's extension point (sidecar/server/extension.py),
so production code holds no benchmark method.
"""

from __future__ import annotations

import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ..sidecar.cli.main import main as ckpt_main
from ..sidecar.server import SidecarProcess, extended_serving, start_sidecar_process
from .echo import EchoExtension

#: What this launcher runs: ``python -m`` this module, with ``ckpt serve``'s arguments.
MODULE = "ckpt.bench.echo_sidecar"


def start_echo_sidecar(
    base: Path,
    name: str,
    *,
    source: Path | None = None,
    extra: tuple[str, ...] = (),
    listen: str | None = None,
    keep_data: bool = False,
) -> SidecarProcess:
    """An echo sidecar on its defaults (no CKPT_* variable reaches it) and ``extra`` options: its data
    directory ``base/name`` (emptied first), its log ``base/name.log``, listening on ``listen``
    (default: the unix socket ``base/name.sock``). ``keep_data``: serve the directory as it is (a restart).

    ``source``: run that checkout's build. A checkout from before this launcher (the
    baseline of ``bench.sidecar_ab`` for builds of that time) serves the same echo methods
    when ``ckpt serve`` is given its ``--bench-echo`` option.
    """
    base = base.resolve()  # the sidecar may run in another directory
    data_dir = base / name
    if not keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    module: str | None = MODULE
    if source is not None and not (source / "bench" / "echo_sidecar.py").exists():
        module, extra = None, ("--bench-echo", *extra)
    return start_sidecar_process(
        data_dir,
        *extra,
        listen=[listen or f"unix:{base / f'{name}.sock'}"],
        log_path=base / f"{name}.log",
        inherit_ckpt_env=False,
        cwd=source,
        module=module,
    )


def restart_echo_sidecar(sidecar: SidecarProcess) -> SidecarProcess:
    """Stop ``sidecar`` (SIGTERM; RuntimeError if it exits non-zero), then start the launcher again on its
    data directory, socket and log, as :func:`start_echo_sidecar` started it without ``extra``."""
    code = sidecar.stop()
    if code != 0:
        raise RuntimeError(f"sidecar exited with {code} on SIGTERM:\n{sidecar.log(tail_chars=2000)}")
    return start_echo_sidecar(sidecar.data_dir.parent, sidecar.data_dir.name, keep_data=True)


def stop_echo_sidecar(sidecar: SidecarProcess, *, ok: bool) -> None:
    """SIGTERM; after a clean stop of a good run, remove its data and log; else keep the log, and say so."""
    code = sidecar.stop()
    if ok and code == 0:
        shutil.rmtree(sidecar.data_dir, ignore_errors=True)
        sidecar.log_path.unlink(missing_ok=True)
    elif code != 0:
        print(f"sidecar exited with {code}; log kept at {sidecar.log_path}", file=sys.stderr)
        sidecar.stop(signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """``ckpt serve`` with ``argv`` (default: this process's arguments), serving the echo methods too."""
    args = list(sys.argv[1:] if argv is None else argv)
    with extended_serving(EchoExtension()):
        return ckpt_main(["serve", *args])


if __name__ == "__main__":
    sys.exit(main())
