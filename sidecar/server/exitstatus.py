"""How a child process ended, in words for a log line: its exit code, or the signal that killed it."""

from __future__ import annotations

import signal


def exit_status(returncode: int) -> str:
    """``subprocess``'s returncode said: "exited with code 1", "was killed by SIGKILL" (not "-9")."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"
