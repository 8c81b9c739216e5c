"""The shared trajectories replayed as agents' event logs: one event per message.

An agent logs each message as it goes: its type is the message's kind
(``system``, ``user``, ``assistant``, ``tool_call`` for an assistant message
calling tools, ``tool_result`` for a tool's answer), its payload the message
as compact JSON (the same bytes for every system measured), its attributes
``{"tool": name}`` when the message names a tool.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .trajectories import Trajectory

#: Attribute values follow the rules of labels (at most 128 bytes); tool names are far shorter.
_MAX_TOOL_NAME_CHARS = 64
#: Quick runs: this many trajectories, each cut to this many events (past the 50 read back).
QUICK_TRAJECTORIES = 6
QUICK_EVENTS = 60


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    payload: bytes
    attributes: dict[str, str]


@dataclass(frozen=True, slots=True)
class SessionLog:
    """One session's events, in the order its agent appends them."""

    session_id: str
    events: tuple[Event, ...]


def event_of(message: dict[str, Any]) -> Event:
    calls = message.get("tool_calls") or ()
    role = str(message.get("role") or "message")
    if calls:
        kind, tool = "tool_call", str(calls[0].get("function", {}).get("name") or "")
    elif role == "tool":
        kind, tool = "tool_result", str(message.get("name") or "")
    else:
        kind, tool = role, ""
    payload = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    return Event(kind, payload, {"tool": tool[:_MAX_TOOL_NAME_CHARS]} if tool else {})


def corpus_logs(corpus: list[Trajectory], *, quick: bool) -> list[tuple[Event, ...]]:
    """Each trajectory's events (quick: a few trajectories, each cut short)."""
    if quick:
        corpus = corpus[:QUICK_TRAJECTORIES]
    logs = [tuple(event_of(m) for m in t.messages) for t in corpus]
    return [log[:QUICK_EVENTS] for log in logs] if quick else logs


def single_writer_sessions(logs: list[tuple[Event, ...]], prefix: str) -> list[SessionLog]:
    """One session per trajectory, in corpus order."""
    return [SessionLog(f"{prefix}-t{i:03d}", log) for i, log in enumerate(logs)]


def many_writer_sessions(logs: list[tuple[Event, ...]], writers: int, prefix: str) -> list[SessionLog]:
    """The corpus repeated until every writer has two sessions to write, each copy under new session ids,
    longest first: the writers take them from one queue, so all stay busy until the queue runs dry and
    the run ends on a short session, not on a long one begun last."""
    copies = max(1, math.ceil(2 * writers / len(logs)))
    sessions = [SessionLog(f"{prefix}-c{c}-t{i:03d}", log) for c in range(copies) for i, log in enumerate(logs)]
    return sorted(sessions, key=lambda s: -len(s.events))


def describe(logs: list[tuple[Event, ...]]) -> dict[str, Any]:
    """The workload's sizes: events, payload bytes per event, events per type."""
    events = [e for log in logs for e in log]
    types: dict[str, int] = {}
    for e in events:
        types[e.type] = types.get(e.type, 0) + 1
    return {
        "trajectories": len(logs),
        "events": len(events),
        "payload_bytes_per_event": sum(len(e.payload) for e in events) / max(len(events), 1),
        "longest_session_events": max((len(log) for log in logs), default=0),
        "sessions_over_50_events": sum(len(log) > 50 for log in logs),
        "events_by_type": dict(sorted(types.items())),
    }
