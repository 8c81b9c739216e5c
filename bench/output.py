"""What every benchmark script does once it has its report: print it, save it, exit by its checks."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any


def finish(report: Any, text: str, json_path: str | None) -> int:
    """Print ``text``, write the report (a dataclass) as JSON if asked; 0 if every check passed, else 1."""
    print(text)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(asdict(report), fh, indent=1)
    return 0 if all(c["ok"] for c in report.checks.values()) else 1


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from /proc ([] without it)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


def process_and_children(pid: int) -> list[int]:
    """``pid`` and every process under it: a sidecar's workers and store processes, whose CPU is the server's."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += child_pids(current)
    return out


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after comm (a zombie's too); None if it has none (gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (or zombie) from /proc/<pid>/stat; None if it has none (gone, or not Linux)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every process under it, those that exited included.

    Each process counts its own utime + stime and its cutime + cstime: the
    times of the children it has reaped (the kernel adds them on wait), which
    ``process_and_children`` no longer lists. A child that exited unreaped is
    a zombie, still listed with its times. So a sidecar's store process counts
    while it runs and after it exits; read ``pid`` as a zombie (``os.waitid``
    with ``WNOWAIT``) to count its shutdown. 0.0 once ``pid`` is gone.
    """
    total = 0
    for current in process_and_children(pid):
        fields = _stat_fields(current)
        if fields is not None:
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")
