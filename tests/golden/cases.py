"""Golden frame vectors: write sequences whose exact frame bytes are pinned, in every format.

    python -m tests.golden.cases --write   # rewrite frames.json and frames_v2.json (a format change!)

frames.json holds format 1 (written with ``format_version=1``), frames_v2.json
format 2 (what the encoder writes). A change to either means the bytes on
disk changed: old data must still decode (tests/codec/test_golden.py decodes
the committed frames), and a format change needs a new FORMAT_VERSION.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ckpt.codec import FORMAT_VERSION, READABLE_FORMATS, ChainEncoder, ChainPolicy, FrameHeader, FrameKind
from ckpt.v1 import checkpoint_pb2 as pb

GOLDEN_FILES = {1: Path(__file__).with_name("frames.json"), 2: Path(__file__).with_name("frames_v2.json")}
assert tuple(GOLDEN_FILES) == READABLE_FORMATS


# A realistic system prompt: deltas only beat full frames once a state has some bulk.
SYSTEM = (
    "You are a coding agent. Work in small steps: read the failing test, find the cause, "
    "change the smallest amount of code that fixes it, run the tests, and report what you changed and why. "
    "Never edit files outside the repository; ask before running commands that touch the network. "
)


def _cp(step: int, *texts: str, **fields: object) -> bytes:
    cp = pb.Checkpoint(schema_version=1, step=step, **fields)  # type: ignore[arg-type]
    cp.messages.add(role=pb.ROLE_SYSTEM, content=SYSTEM)
    for text in texts:
        cp.messages.add(role=pb.ROLE_ASSISTANT, content=text)
    return cp.SerializeToString(deterministic=True)


def _patch(step: int, text: str) -> bytes:
    cp = pb.Checkpoint(step=step)
    cp.messages.add(role=pb.ROLE_TOOL, content=text)
    return cp.SerializeToString(deterministic=True)


# Pinned in full, so that tuning the default policy never changes golden bytes.
GOLDEN_POLICY = ChainPolicy(
    max_depth=32,
    max_decode_cost_ratio=6.0,
    decode_floor_bytes=0,
    delta_byte_cost=1.0,
    frame_cost_bytes=0,
    max_materialized_bytes=256 * 1024 * 1024,
    max_delta_to_full_ratio=0.5,
    patch_window_bytes=64 * 1024,
    level=3,
    min_window_log=16,
)


@dataclass(frozen=True)
class Case:
    name: str
    ops: list[tuple[str, bytes]]  # ("replace"|"merge", data) or ("rollback"|"resume", b"")
    policy: dict[str, int] = field(default_factory=dict)


CASES = [
    Case("empty-state", [("replace", b"")]),
    Case(
        "replace-then-deltas",
        [
            ("replace", _cp(1, "plan the fix")),
            ("replace", _cp(2, "plan the fix", "open a.py")),
            ("replace", _cp(3, "plan the fix", "open a.py", "édit → ünïcode ✓")),
        ],
    ),
    Case(
        "merge-patches",
        [
            ("merge", _cp(1, "start", goal="fix the bug")),
            ("merge", _patch(2, "ls\nREADME.md")),
            ("merge", _patch(3, "\x00binary\xff")),
            ("merge", b""),
        ],
    ),
    Case(
        "patch-starting-a-stream-after-resume",
        [("merge", _cp(1, "a" * 40)), ("resume", b""), ("merge", _patch(2, "a" * 30 + "b"))],
    ),
    Case(
        "delta-starting-a-stream-after-rollback",
        [
            ("replace", _cp(1, "run pytest")),
            ("replace", _cp(9, "lost")),
            ("rollback", b""),
            ("replace", _cp(2, "run pytest", "1 failed")),
        ],
    ),
    Case(
        "chain-restart",
        [("replace", _cp(1, "one")), ("replace", _cp(2, "one", "two")), ("replace", _cp(3, "one", "two", "three"))],
        {"max_depth": 1},
    ),
]


def run(case: Case, *, format_version: int = FORMAT_VERSION) -> list[tuple[bytes, bytes]]:
    """(frame bytes, state) of every stored write of the case, in order."""
    policy = replace(GOLDEN_POLICY, **case.policy)
    enc = ChainEncoder(policy=policy, format_version=format_version)
    stored: list[tuple[bytes, bytes]] = []
    chain: list[FrameHeader] = []
    for op, data in case.ops:
        if op == "rollback":
            enc.rollback()
            stored.pop()
            chain.pop()
        elif op == "resume":
            enc = ChainEncoder.resume(enc.state, chain, policy=policy, format_version=format_version)
        else:
            frame = enc.replace(data) if op == "replace" else enc.merge(data)
            chain = [frame.header] if frame.kind is FrameKind.FULL else [*chain, frame.header]
            stored.append((frame.data, enc.state))
    return stored


def render(format_version: int) -> dict[str, list[dict[str, str]]]:
    return {
        case.name: [{"frame": f.hex(), "state": s.hex()} for f, s in run(case, format_version=format_version)]
        for case in CASES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite frames.json and frames_v2.json")
    args = parser.parse_args()
    for fmt, path in GOLDEN_FILES.items():
        text = json.dumps(render(fmt), indent=1) + "\n"
        if args.write:
            path.write_text(text)
        else:
            print(f"{path.name}:\n{text}")


if __name__ == "__main__":
    main()
