"""The ``coding`` workload: a few lines of a source file edited per step, large tool outputs, a plan moving on."""

from __future__ import annotations

import hashlib
import json
import random

from ckpt.v1 import checkpoint_pb2 as pb

from ...trajectories import Step
from .record import Clock, Recorder, cache_key, message, start_session, tool_result
from .text import Text, log_uniform


def _artifact(path: str, content: str, at: int) -> pb.ArtifactRef:
    data = content.encode()
    ref = pb.ArtifactRef(
        uri=f"workspace://{path}",
        content_hash="sha256:" + hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        media_type="text/x-python",
        digest="\n".join(content.split("\n", 3)[:3]),
    )
    ref.created_at.seconds = at
    return ref


def _cat_n(lines: list[str], start: int, min_chars: int) -> str:
    """``cat -n`` of lines from ``start`` until ``min_chars`` (or the file's end)."""
    start = max(0, min(start, len(lines) - 1))
    out: list[str] = []
    size = 0
    for number in range(start, len(lines)):
        if size >= min_chars:
            break
        row = f"{number + 1:>6}\t{lines[number]}"
        out.append(row)
        size += len(row) + 1
    return "\n".join(out)


def _edit_lines(text: Text, lines: list[str]) -> tuple[int, list[str], list[str]]:
    """Change a few lines in place; returns (first line, old lines, new lines)."""
    rng = text.rng
    at = rng.randrange(len(lines))
    n = rng.randint(1, 4)
    old = lines[at : at + n]
    size = sum(map(len, lines))
    kind = rng.random()
    # Keep files within 5-30 KB: grow small files, shrink big ones.
    if size > 28_000 or (kind < 0.15 and size > 6_000):
        new: list[str] = []
    elif size < 6_000 or kind < 0.35:
        new = old + text.code_lines(n)
    else:
        new = text.code_lines(len(old))
    lines[at : at + len(old)] = new
    return at, old, new


def build(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = Text(rng), Clock(rng), Recorder()
    names = text.idents(2 * rng.randint(3, 5))
    paths = sorted({f"src/{a}/{b}.py" for a, b in zip(names[0::2], names[1::2], strict=True)})
    files = {path: text.code(rng.randint(5_000, 28_000)).split("\n") for path in paths}
    plan_ids = [f"p{k}" for k in range(1, rng.randint(6, 10) + 1)]

    patch = pb.Checkpoint(step=1)
    start_session(patch, rng, text.prose(rng.randint(100, 400)))
    patch.messages.append(message(pb.ROLE_SYSTEM, text.prose(rng.randint(3_000, 6_000)), clock.now))
    patch.messages.append(message(pb.ROLE_USER, text.prose(rng.randint(200, 800)), clock.tick()))
    for order, step_id in enumerate(plan_ids, start=1):
        patch.plan[step_id].CopyFrom(
            pb.PlanStep(
                id=step_id,
                title=text.sentence(4, 10),
                status=pb.STEP_STATUS_IN_PROGRESS if order == 1 else pb.STEP_STATUS_PENDING,
                depends_on=plan_ids[order - 2 : order - 1],
                order=order,
            )
        )
    patch.current_step_id = plan_ids[0]
    for path, lines in files.items():
        content = "\n".join(lines)
        patch.working_memory[f"file:{path}"] = content
        patch.artifacts[f"file:{path}"].CopyFrom(_artifact(path, content, clock.now))
    current = 0
    for i in range(1, steps + 1):
        if i > 1:
            patch = pb.Checkpoint(step=i)
        _coding_step(text, clock, rec, patch, files, i)
        # Move the plan on every few steps; the last step closes the current one.
        if current < len(plan_ids) and (rng.random() < 0.2 or i == steps):
            _finish_plan_step(text, clock, rec, patch, plan_ids[current])
            current += 1
            if current < len(plan_ids) and i < steps:
                nxt = pb.PlanStep()
                nxt.CopyFrom(rec.state.plan[plan_ids[current]])
                nxt.status = pb.STEP_STATUS_IN_PROGRESS
                patch.plan[nxt.id].CopyFrom(nxt)
                patch.current_step_id = nxt.id
            else:
                patch.current_step_id = ""
        if i == steps:
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


def _finish_plan_step(text: Text, clock: Clock, rec: Recorder, patch: pb.Checkpoint, step_id: str) -> None:
    step = pb.PlanStep()
    # patch.plan may already hold a newer copy if the step was touched this step.
    step.CopyFrom(patch.plan[step_id] if step_id in patch.plan else rec.state.plan[step_id])
    step.status = pb.STEP_STATUS_DONE
    step.notes = text.sentence()
    patch.plan[step_id].CopyFrom(step)
    result = pb.StepResult(step_id=step_id, ok=True, output=text.prose(text.rng.randint(80, 400)))
    result.started_at.seconds = clock.now - text.rng.randint(30, 600)
    result.finished_at.seconds = clock.now
    patch.step_results.append(result)


def _coding_step(
    text: Text, clock: Clock, rec: Recorder, patch: pb.Checkpoint, files: dict[str, list[str]], i: int
) -> None:
    """One agent turn: an edit plus one inspecting tool call, both answered."""
    rng = text.rng
    path = rng.choice(sorted(files))
    lines = files[path]
    at, old, new = _edit_lines(text, lines)
    content = "\n".join(lines)
    patch.working_memory[f"file:{path}"] = content
    patch.artifacts[f"file:{path}"].CopyFrom(_artifact(path, content, clock.tick()))

    edit_args = json.dumps(
        {"command": "str_replace", "path": path, "old_str": "\n".join(old), "new_str": "\n".join(new)}
    )
    tool, args, output, cacheable = _inspect(text, files, path)
    assistant = message(pb.ROLE_ASSISTANT, text.prose(rng.randint(60, 400)), clock.tick(5, 60))
    edit_call = assistant.tool_calls.add(id=f"call_{i}_edit", name="str_replace_editor", arguments_json=edit_args)
    look_call = assistant.tool_calls.add(id=f"call_{i}_{tool}", name=tool, arguments_json=args)
    patch.messages.append(assistant)
    snippet = _cat_n(lines, at - 8, rng.randint(2_048, 4_096))
    edit_reply = (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
        f"{snippet}\nReview the changes and make sure they are as expected. Edit the file again if necessary."
    )
    patch.messages.append(message(pb.ROLE_TOOL, edit_reply, clock.tick(1, 3), tool_call_id=edit_call.id))
    patch.messages.append(message(pb.ROLE_TOOL, output, clock.tick(1, 30), tool_call_id=look_call.id))
    if cacheable:
        result = tool_result(tool, args, output, clock.now)
        patch.tool_cache[cache_key(tool, result.canonical_args_json)].CopyFrom(result)


def _inspect(text: Text, files: dict[str, list[str]], edited: str) -> tuple[str, str, str, bool]:
    """(tool, arguments JSON, output of 2-20 KB, side-effect free?)"""
    rng = text.rng
    size = log_uniform(rng, 2_048, 20_480)
    kind = rng.random()
    if kind < 0.35:
        test = f"tests/test_{edited.rsplit('/', 1)[1]}"
        return "execute_bash", json.dumps({"command": f"python -m pytest -q {test}"}), text.test_log(size), False
    if kind < 0.55:
        return "execute_bash", json.dumps({"command": "ls -lR src"}), text.listing(size), True
    if kind < 0.75:
        pattern = text.idents(1)[0]
        return "grep", json.dumps({"pattern": pattern, "path": "src"}), text.grep(size, pattern), True
    path = rng.choice(sorted(files))
    lines = files[path]
    view = _cat_n(lines, 0, size)
    return "str_replace_editor", json.dumps({"command": "view", "path": path}), view, True
