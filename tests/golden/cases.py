"""Golden frame vectors: write sequences whose exact frame bytes are pinned, in every format.

    python -m tests.golden.cases --write   # rewrite the golden files (a format change!)

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
#: Format 2's segment frames (FORMAT.md §14), which format 1 cannot write.
SEGMENT_FILE = Path(__file__).with_name("frames_segments.json")
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
    max_chain_versions=1024,
    segment_fanout=0,  # segments have their own vectors (SEGMENT_CASE): format 1 writes none
    segment_min_state_bytes=128 * 1024,
    segment_max_fraction=0.25,
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


#: A MERGE chain with segments of two levels (fanout 2: versions 3, 5, 7 over two versions, 5 over four),
#: an empty patch among them, then a rollback of a segment and a resume: the segment written again.
SEGMENT_CASE = Case(
    "merge-segments",
    [
        ("merge", _cp(1, "start", goal="fix the bug")),
        ("merge", _patch(2, "ls\nREADME.md")),
        ("merge", _patch(3, "cat README.md")),
        ("merge", b""),
        ("merge", _patch(5, "pytest -x")),
        ("merge", _patch(6, "1 failed")),
        ("merge", _patch(9, "lost")),
        ("rollback", b""),
        ("resume", b""),
        ("merge", _patch(7, "edit a.py")),
        ("merge", _patch(8, "2 passed")),
    ],
    {
        "segment_fanout": 2,
        "segment_min_state_bytes": 0,
        "segment_max_fraction": 1,
        "frame_cost_bytes": 0,
        "max_delta_to_full_ratio": 1,
    },
)


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
    return {case.name: render_case(case, format_version) for case in CASES}


def render_case(case: Case, format_version: int) -> list[dict[str, str]]:
    return [{"frame": f.hex(), "state": s.hex()} for f, s in run(case, format_version=format_version)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the golden files")
    args = parser.parse_args()
    files = [(path, render(fmt)) for fmt, path in GOLDEN_FILES.items()]
    files.append((SEGMENT_FILE, {SEGMENT_CASE.name: render_case(SEGMENT_CASE, 2)}))
    for path, vectors in files:
        text = json.dumps(vectors, indent=1) + "\n"
        if args.write:
            path.write_text(text)
        else:
            print(f"{path.name}:\n{text}")


if __name__ == "__main__":
    main()
