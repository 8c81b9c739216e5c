"""Seeded, reproducible checkpoint sequences for the benchmark harness.

A workload is a list of sessions; a session is a list of ``bench.trajectories.Step``,
one per agent step, each carrying both write forms of the same change:

- ``state``: the whole new ``ckpt.v1.Checkpoint`` (what a REPLACE write sends);
- ``patch``: only the changed fields (what a MERGE write sends), such that parsing
  ``previous_state + patch`` gives a message equal to ``state``. The first step's
  patch is the whole first state.

Everything is serialized with ``deterministic=True`` and drawn from a
``random.Random`` seeded by (workload, seed, session index), never from the global
generator or the clock, so the same arguments give byte-identical output.

Workloads (``WORKLOADS`` holds the one-line descriptions and the run sizes):

- ``trajectories``: the 60 real agent trajectories of the shared corpus (see
  ``bench.trajectories``), replayed one message per step into a richer state than
  ``bench.trajectories.replay`` builds: every tool call opens an IN_PROGRESS plan
  step (and becomes ``current_step_id``); its tool reply is cached in
  ``tool_cache`` under the xxh3-128 of (tool name, canonical arguments) and closes
  the plan step; the last step sets ``status`` DONE. The seed is ignored: the
  data is real.
- ``chat``: a chat assistant. Short user/assistant turns (50-400 chars) and a
  rolling ``conversation_summary`` rewritten every few turns; the state grows
  slowly, patches are a few hundred bytes.
- ``coding``: a coding agent. Every step edits a few lines of a 5-30 KB source
  file held in ``working_memory`` (its ``artifacts`` reference follows), calls a
  tool whose output is 2-20 KB (test log, file listing, grep, file view), caches
  read-only tool results and moves plan steps along. Edited map entries are
  replaced whole, so patches are tens of KB.
- ``factual``: a ~10 KB state of facts edited in place (working memory entries
  rewritten, plan statuses, handoff, summary, scalars): no growth at all, the
  case where merged patches pile up superseded bytes.
- ``large``: a state over 20 MiB built at the first step (a long history of
  messages, a big tool cache), then a few KB appended or rewritten per step.

Synthetic text is drawn from a fixed vocabulary with Zipf-like word frequencies,
code-like lines, log lines, test logs and file listings, so it compresses about
like real agent text (zstd -3: roughly 3-6x) rather than like random bytes or
repeated filler, both of which would flatter or punish compression unfairly.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from ckpt.v1 import checkpoint_pb2 as pb

from .. import trajectories
from ..trajectories import Step

__all__ = ["WORKLOADS", "WorkloadInfo", "generate"]


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """What a workload is and how big a run of it is."""

    name: str
    description: str
    full: tuple[int, int]
    quick: tuple[int, int]


WORKLOADS: dict[str, WorkloadInfo] = {
    info.name: info
    for info in (
        WorkloadInfo(
            "trajectories",
            "60 real agent trajectories (coding, tool use, web), one message per step: state ~1-530 KB"
            " (mean ~37 KB); each step appends a message, opens/closes plan steps, caches tool results",
            full=(60, 200),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "chat",
            "chat assistant: state ~2-30 KB (mean ~14 KB) growing slowly; each step appends one 50-400 char"
            " turn, the summary is rewritten every few turns",
            full=(128, 100),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "coding",
            "coding agent: state ~60-550 KB (mean ~270 KB); each step rewrites a 5-30 KB file entry with a"
            " few lines changed and appends 2-20 KB tool outputs",
            full=(64, 24),
            quick=(8, 8),
        ),
        WorkloadInfo(
            "factual",
            "facts edited in place: state ~9-10 KB that never grows; each step rewrites a few"
            " working-memory entries, a plan step and scalars",
            full=(128, 60),
            quick=(16, 8),
        ),
        WorkloadInfo(
            "large",
            "very large state: ~23 MB (22 MiB) built at step 1 (long history, big tool cache); each next"
            " step appends or rewrites a few KB",
            full=(2, 10),
            quick=(1, 3),
        ),
    )
}


def generate(
    name: str,
    *,
    sessions: int,
    steps: int,
    seed: int = 0,
    trajectories_dir: str | os.PathLike[str] | None = None,
) -> list[list[Step]]:
    """Return ``sessions`` sessions of at most ``steps`` steps of workload ``name``.

    Synthetic workloads give exactly ``steps`` steps per session; ``trajectories``
    stops a session early when its trajectory has fewer messages.
    Raises ValueError for an unknown workload or a size below 1, and
    FileNotFoundError when the trajectory corpus is needed but missing.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    for param, value in (("sessions", sessions), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"workload {name!r}: {param} must be an integer >= 1, got {value!r}")
    if name == "trajectories":
        return _trajectories(sessions, steps, trajectories_dir)
    build = _SYNTHETIC[name]
    # A string seed is hashed (SHA-512) by random.Random, so sessions of
    # different workloads and seeds never share a stream, unlike seed + index.
    return [build(random.Random(f"ckpt-bench/{name}/{seed}/{index}"), steps) for index in range(sessions)]


# --- shared plumbing --------------------------------------------------------

# A fixed start (2026-01-01T00:00:00Z) so timestamps never depend on when the
# generator runs.
_EPOCH = 1_767_225_600


class _Recorder:
    """Keeps the live state and records one Step per committed patch.

    Merging each patch into a live message costs O(patch); only the
    serialization of the state (which the Step needs anyway) is O(state).
    """

    def __init__(self) -> None:
        self.state = pb.Checkpoint()
        self.steps: list[Step] = []

    def commit(self, patch: pb.Checkpoint) -> None:
        self.state.MergeFrom(patch)
        state = self.state.SerializeToString(deterministic=True)
        # The first patch is the whole state: share the bytes rather than
        # encode (and hold) a 20 MB state twice.
        encoded = state if not self.steps else patch.SerializeToString(deterministic=True)
        self.steps.append(Step(state=state, patch=encoded))


class _Clock:
    """Seconds since _EPOCH for one session, moving forward by a few seconds a step."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.now = _EPOCH + rng.randrange(30 * 86_400)

    def tick(self, lo: int = 2, hi: int = 90) -> int:
        self.now += self._rng.randint(lo, hi)
        return self.now


def _canonical_json(arguments_json: str) -> str:
    """Sorted keys, no spaces; text that is not JSON is kept as it is (it still keys the cache)."""
    if not arguments_json.strip():
        return "{}"
    try:
        value = json.loads(arguments_json)
    except ValueError:
        return arguments_json
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _cache_key(tool: str, canonical_args_json: str) -> str:
    # NUL cannot occur in a tool name, so (tool, args) pairs never collide by concatenation.
    return xxhash.xxh3_128_hexdigest(f"{tool}\0{canonical_args_json}".encode())


def _tool_result(tool: str, arguments_json: str, output: str, at: int, is_error: bool = False) -> pb.ToolResult:
    result = pb.ToolResult(
        tool=tool, canonical_args_json=_canonical_json(arguments_json), result=output.encode(), is_error=is_error
    )
    result.created_at.seconds = at
    return result


def _message(role: pb.Role, content: str, at: int, tool_call_id: str = "") -> pb.Message:
    msg = pb.Message(role=role, content=content, tool_call_id=tool_call_id)
    msg.created_at.seconds = at
    return msg


def _model(rng: random.Random) -> pb.ModelParams:
    return pb.ModelParams(
        model_id=rng.choice(_MODELS),
        temperature=rng.choice((0.0, 0.2, 0.7, 1.0)),
        top_p=rng.choice((0.9, 0.95, 1.0)),
        seed=rng.randrange(2**31),
        max_output_tokens=rng.choice((1024, 4096, 8192)),
    )


def _start(patch: pb.Checkpoint, rng: random.Random, goal: str) -> None:
    patch.schema_version = 1
    patch.status = pb.STATUS_RUNNING
    patch.goal = goal
    patch.model.CopyFrom(_model(rng))


_MODELS = ("gpt-4o-2024-08-06", "claude-sonnet-4-20250514", "gemini-2.5-pro", "llama-3.3-70b-instruct")


# --- text -------------------------------------------------------------------

# Word lists read better as text than as list literals.
_COMMON = """
the of and to a in is it that for on with as was this be are by at from or an have not but can all which one
will there their more if when so what about up out some them into would time only other then its also after
two first how new any these may use because each way where most over such need we you they he she i my our
your has had were been being do does did done should could must might here now just than very still again
never always often before while since until under between through during without within against around make
made see seen look find found give take know think want like get got keep let put say said show tell try
call come go work seem feel leave mean help turn start stop begin end move live hold bring happen write read
provide sit stand lose pay meet include continue set learn lead understand watch follow change create speak
allow add spend grow open walk win offer remember consider appear buy wait serve die send expect build stay
fall cut reach kill remain suggest raise pass sell require report decide pull good great small large long
little own old right big high different same next early young important few public bad able last late hard
major better best sure free full special clear whole certain real left possible likely recent strong true
""".split()  # noqa: SIM905
_TECH = """
file test value error cache state step check run update return function module class method request response
server client version session store frame chain patch delta merge replace data result output input token
model agent tool plan task user message summary config option default path line build commit branch review
retry timeout limit size count index key list map string number buffer stream queue worker thread process
memory disk network log level warning info debug trace failure success pending parse format schema field
record entry table query row column handler context event payload header status code reader writer offset
length flag mode node graph edge batch job lock mutex channel socket port host address route proxy backend
auth user account order flight booking price date name email address item cart invoice
""".split()  # noqa: SIM905


def _zipf_cumulative(n: int) -> list[float]:
    # Rank-frequency ~ 1/(rank + 3): a few words dominate, as in real text,
    # which is what puts zstd's ratio on this text near real prose (~3x).
    return list(itertools.accumulate(1.0 / (rank + 3) for rank in range(n)))


def _build_vocab() -> tuple[list[str], list[str]]:
    # A fixed RNG: the vocabulary is part of the workload definition.
    rng = random.Random("ckpt-bench/vocab")
    syllables = ["ka", "lo", "mi", "ne", "tor", "sen", "rat", "vel", "ion", "ex", "pro", "dis"]
    syllables += ["con", "mar", "lin", "gen", "per", "tra", "pol", "ver", "sta", "mon", "ric", "del"]
    rare = sorted({"".join(rng.choices(syllables, k=rng.randint(2, 4))) for _ in range(2500)})
    rng.shuffle(rare)
    words = list(dict.fromkeys(_COMMON + _TECH + rare))
    tech = list(dict.fromkeys(_TECH))
    idents = sorted({"_".join(rng.sample(tech, rng.randint(1, 3))) for _ in range(900)})
    rng.shuffle(idents)
    return words, idents


_WORDS, _IDENTS = _build_vocab()
_WORDS_CUM = _zipf_cumulative(len(_WORDS))
_IDENTS_CUM = _zipf_cumulative(len(_IDENTS))
_REUSE = 0.3
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARNING", "ERROR")


class _Text:
    """Realistic-ish text from one session's RNG.

    Words are drawn in bulk (one ``choices`` call per paragraph) because 20 MB of
    text must build in a couple of seconds.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._log_ms = rng.randrange(86_400_000)
        # Sentences this session already said: agents repeat themselves ("let me
        # run the tests again"), which is much of why real transcripts compress.
        self._stock: list[str] = []

    def words(self, n: int) -> list[str]:
        return self.rng.choices(_WORDS, cum_weights=_WORDS_CUM, k=n)

    def idents(self, n: int) -> list[str]:
        return self.rng.choices(_IDENTS, cum_weights=_IDENTS_CUM, k=n)

    def sentence(self, lo: int = 6, hi: int = 18) -> str:
        text = " ".join(self.words(self.rng.randint(lo, hi)))
        return text[:1].upper() + text[1:] + "."

    def prose(self, chars: int) -> str:
        """About ``chars`` characters (never more) of sentences."""
        rng, stock = self.rng, self._stock
        words = self.words(chars // 5 + 8)
        sentences = []
        i = 0
        while i < len(words):
            if len(stock) >= 32 and rng.random() < _REUSE:
                sentences.append(rng.choice(stock))
                i += 10
                continue
            k = rng.randint(6, 18)
            text = " ".join(words[i : i + k])
            sentence = text[:1].upper() + text[1:] + "."
            sentences.append(sentence)
            if len(stock) < 512:
                stock.append(sentence)
            i += k
        text = " ".join(sentences)
        while len(text) < chars:  # short words: top up
            text += " " + self.sentence()
        cut = text.rfind(" ", 0, chars + 1)
        return text[: cut if cut > 0 else chars]

    def code_lines(self, n: int) -> list[str]:
        rng = self.rng
        names = self.idents(4 * n + 4)
        lines: list[str] = []
        depth = 1
        for i in range(n):
            a, b, c, d = names[4 * i : 4 * i + 4]
            pad = "    " * depth
            kind = rng.random()
            if kind < 0.06 or depth == 0:
                lines.extend(("", "", f"def {a}({b}, {c}: int = {rng.randrange(100)}) -> {d.title()}:"))
                depth = 1
                continue
            if kind < 0.30:
                lines.append(f"{pad}{a} = {b}.{c}({d}, {rng.randrange(1000)})")
            elif kind < 0.42:
                lines.append(f"{pad}if {a} is None or {b} > {rng.randrange(64)}:")
                depth = min(depth + 1, 4)
                continue
            elif kind < 0.52:
                lines.append(f"{pad}for {a} in {b}.{c}():")
                depth = min(depth + 1, 4)
                continue
            elif kind < 0.62:
                lines.append(f"{pad}# {' '.join(self.words(rng.randint(4, 12)))}")
            elif kind < 0.72:
                lines.append(f"{pad}self.{a}[{b}] = {c}")
            elif kind < 0.80:
                lines.append(f'{pad}raise {d.title().replace("_", "")}Error(f"{a} {{{b}}} is not {c}")')
            elif kind < 0.88:
                lines.append(f"{pad}{a}.append({b}[{c}])")
            else:
                lines.append(f"{pad}return {a}")
            if depth > 1 and rng.random() < 0.3:
                depth -= 1
        return lines

    def code(self, chars: int) -> str:
        names = self.idents(3 * 6)
        lines = [f"from {a} import {b}, {c}" for a, b, c in zip(names[0::3], names[1::3], names[2::3], strict=True)]
        size = sum(map(len, lines))
        while size < chars:
            more = self.code_lines(64)
            lines.extend(more)
            size += sum(map(len, more)) + len(more)
        return "\n".join(lines)[:chars]

    def log(self, chars: int) -> str:
        rng = self.rng
        out: list[str] = []
        size = 0
        while size < chars:
            self._log_ms += rng.randint(1, 4000)
            ms = self._log_ms % 86_400_000
            stamp = f"2026-01-01T{ms // 3_600_000:02}:{ms // 60_000 % 60:02}:{ms // 1000 % 60:02}.{ms % 1000:03}Z"
            a, b = self.idents(2)
            line = f"{stamp} {rng.choice(_LEVELS):<7} {a}.{b}: {' '.join(self.words(rng.randint(4, 14)))}"
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def test_log(self, chars: int) -> str:
        rng = self.rng
        out = ["============================= test session starts =============================="]
        size = len(out[0])
        passed = failed = 0
        while size < chars:
            a, b, c = self.idents(3)
            if rng.random() < 0.06:
                failed += 1
                block = [
                    f"tests/test_{a}.py::test_{b} FAILED",
                    f"____________________________ test_{b} ____________________________",
                    *self.code_lines(rng.randint(3, 8)),
                    f">       assert {c} == {rng.randrange(100)}",
                    f"E       AssertionError: assert {rng.randrange(100)} == {rng.randrange(100)}",
                    f"tests/test_{a}.py:{rng.randint(10, 900)}: AssertionError",
                ]
            else:
                passed += 1
                block = [f"tests/test_{a}.py::test_{b}_{c} PASSED{'':>20}[{rng.randrange(100):>3}%]"]
            out.extend(block)
            size += sum(map(len, block)) + len(block)
        out.append(f"===== {failed} failed, {passed} passed in {rng.uniform(0.5, 90):.2f}s =====")
        return "\n".join(out)[-chars:]

    def listing(self, chars: int) -> str:
        rng = self.rng
        out = [f"total {rng.randrange(10_000)}"]
        size = len(out[0])
        while size < chars:
            a, b = self.idents(2)
            ms = rng.randrange(86_400_000)
            line = (
                f"-rw-r--r--  1 agent agent {rng.randrange(100, 90_000):>7} Jan {rng.randint(1, 28):>2}"
                f" {ms // 3_600_000:02}:{ms // 60_000 % 60:02} src/{a}/{b}.py"
            )
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def grep(self, chars: int, pattern: str) -> str:
        rng = self.rng
        out: list[str] = []
        size = 0
        while size < chars:
            a, b = self.idents(2)
            line = f"src/{a}/{b}.py:{rng.randint(1, 900)}:{self.code_lines(1)[0].rstrip()} {pattern}"
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)[:chars]

    def tool_output(self, chars: int) -> str:
        kind = self.rng.random()
        if kind < 0.3:
            return self.test_log(chars)
        if kind < 0.5:
            return self.log(chars)
        if kind < 0.65:
            return self.listing(chars)
        return self.code(chars)


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    # Tool outputs are mostly small with a long tail, not uniform in size.
    return int(lo * (hi / lo) ** rng.random())


# --- trajectories -----------------------------------------------------------


def _trajectories(sessions: int, steps: int, directory: str | os.PathLike[str] | None) -> list[list[Step]]:
    corpus = trajectories.load(directory)
    return [
        _replay(corpus[index % len(corpus)], steps, cycle=index // len(corpus), session=index)
        for index in range(sessions)
    ]


def _replay(traj: trajectories.Trajectory, steps: int, cycle: int, session: int) -> list[Step]:
    rec = _Recorder()
    raws = traj.messages[:steps]
    now = _EPOCH + 3_600 * session
    # tool call id -> (plan step id, call); a later call reusing an id wins, as
    # the next tool reply answers the latest call.
    open_calls: dict[str, tuple[str, pb.ToolCall]] = {}
    in_progress: list[str] = []
    for i, raw in enumerate(raws, start=1):
        now += 15
        patch = pb.Checkpoint(step=i)
        if i == 1:
            patch.schema_version = 1
            patch.status = pb.STATUS_RUNNING
            # Cycled sessions get a distinct goal so their states differ.
            patch.goal = traj.id if cycle == 0 else f"{traj.id}#{cycle}"
            patch.model.model_id = "replayed"
            patch.model.temperature = 0.0
        msg = trajectories.to_message(raw)
        msg.created_at.seconds = now
        patch.messages.append(msg)
        for n, call in enumerate(msg.tool_calls):
            step_id = f"step-{len(rec.state.plan) + len(patch.plan) + 1}"
            title = f"{call.name} {call.arguments_json}"
            patch.plan[step_id].CopyFrom(
                pb.PlanStep(
                    id=step_id,
                    title=title[:120],
                    status=pb.STEP_STATUS_IN_PROGRESS,
                    order=len(rec.state.plan) + len(patch.plan) + 1,
                )
            )
            if n == 0:  # the agent works on the first call of its turn first
                patch.current_step_id = step_id
            in_progress.append(step_id)
            open_calls[call.id] = (step_id, call)
        if msg.role == pb.ROLE_TOOL and msg.tool_call_id in open_calls:
            step_id, call = open_calls.pop(msg.tool_call_id)
            result = _tool_result(call.name, call.arguments_json, msg.content, now, _looks_like_error(msg.content))
            patch.tool_cache[_cache_key(call.name, result.canonical_args_json)].CopyFrom(result)
            done = pb.PlanStep()
            done.CopyFrom(rec.state.plan[step_id])
            done.status = pb.STEP_STATUS_DONE
            patch.plan[step_id].CopyFrom(done)
            at = in_progress.index(step_id)
            del in_progress[at]
            if rec.state.current_step_id == step_id:
                # On to the next call of the same turn; calls of older turns that
                # never got a reply are abandoned. "" (explicitly present) = none.
                patch.current_step_id = in_progress[at] if at < len(in_progress) else ""
        if i == len(raws):
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


def _looks_like_error(output: str) -> bool:
    head = output.lstrip()[:200].lower()
    return head.startswith(("error", "traceback")) or "command not found" in head


# --- chat -------------------------------------------------------------------


def _chat(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = _Text(rng), _Clock(rng), _Recorder()
    patch = pb.Checkpoint(step=1)
    _start(patch, rng, text.prose(rng.randint(60, 200)))
    patch.messages.append(_message(pb.ROLE_SYSTEM, text.prose(rng.randint(400, 1500)), clock.now))
    patch.messages.append(_message(pb.ROLE_USER, text.prose(rng.randint(50, 400)), clock.tick()))
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        patch = pb.Checkpoint(step=i)
        # Turns alternate, starting with the assistant's reply to the first user message.
        role = pb.ROLE_ASSISTANT if i % 2 == 0 else pb.ROLE_USER
        patch.messages.append(_message(role, text.prose(rng.randint(50, 400)), clock.tick()))
        if rng.random() < 0.12:
            patch.conversation_summary = text.prose(rng.randint(300, 1200))
        if rng.random() < 0.05:
            patch.working_memory[f"user.{text.idents(1)[0]}"] = text.prose(rng.randint(20, 120))
        if i == steps:
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


# --- coding -----------------------------------------------------------------


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


def _edit_lines(text: _Text, lines: list[str]) -> tuple[int, list[str], list[str]]:
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


def _coding(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = _Text(rng), _Clock(rng), _Recorder()
    names = text.idents(2 * rng.randint(3, 5))
    paths = sorted({f"src/{a}/{b}.py" for a, b in zip(names[0::2], names[1::2], strict=True)})
    files = {path: text.code(rng.randint(5_000, 28_000)).split("\n") for path in paths}
    plan_ids = [f"p{k}" for k in range(1, rng.randint(6, 10) + 1)]

    patch = pb.Checkpoint(step=1)
    _start(patch, rng, text.prose(rng.randint(100, 400)))
    patch.messages.append(_message(pb.ROLE_SYSTEM, text.prose(rng.randint(3_000, 6_000)), clock.now))
    patch.messages.append(_message(pb.ROLE_USER, text.prose(rng.randint(200, 800)), clock.tick()))
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


def _finish_plan_step(text: _Text, clock: _Clock, rec: _Recorder, patch: pb.Checkpoint, step_id: str) -> None:
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
    text: _Text, clock: _Clock, rec: _Recorder, patch: pb.Checkpoint, files: dict[str, list[str]], i: int
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
    assistant = _message(pb.ROLE_ASSISTANT, text.prose(rng.randint(60, 400)), clock.tick(5, 60))
    edit_call = assistant.tool_calls.add(id=f"call_{i}_edit", name="str_replace_editor", arguments_json=edit_args)
    look_call = assistant.tool_calls.add(id=f"call_{i}_{tool}", name=tool, arguments_json=args)
    patch.messages.append(assistant)
    snippet = _cat_n(lines, at - 8, rng.randint(2_048, 4_096))
    edit_reply = (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
        f"{snippet}\nReview the changes and make sure they are as expected. Edit the file again if necessary."
    )
    patch.messages.append(_message(pb.ROLE_TOOL, edit_reply, clock.tick(1, 3), tool_call_id=edit_call.id))
    patch.messages.append(_message(pb.ROLE_TOOL, output, clock.tick(1, 30), tool_call_id=look_call.id))
    if cacheable:
        result = _tool_result(tool, args, output, clock.now)
        patch.tool_cache[_cache_key(tool, result.canonical_args_json)].CopyFrom(result)


def _inspect(text: _Text, files: dict[str, list[str]], edited: str) -> tuple[str, str, str, bool]:
    """(tool, arguments JSON, output of 2-20 KB, side-effect free?)"""
    rng = text.rng
    size = _log_uniform(rng, 2_048, 20_480)
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


# --- factual ----------------------------------------------------------------

_FACT_KEYS = 16
_PLAN_STEPS = 8


def _fact(text: _Text) -> str:
    return text.prose(text.rng.randint(250, 450))


def _factual(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = _Text(rng), _Clock(rng), _Recorder()
    keys = [f"fact.{k}.{name}" for k, name in enumerate(text.idents(_FACT_KEYS))]
    plan_ids = [f"s{k}" for k in range(_PLAN_STEPS)]
    handoff_fields = ("in_progress", "decided", "next", "can_wait", "waiting_on")

    patch = pb.Checkpoint(step=1, current_step_id=plan_ids[0])
    _start(patch, rng, text.prose(rng.randint(150, 300)))
    patch.conversation_summary = text.prose(rng.randint(800, 1200))
    for field in handoff_fields:
        setattr(patch.handoff, field, text.prose(rng.randint(80, 200)))
    for order, step_id in enumerate(plan_ids):
        patch.plan[step_id].CopyFrom(
            pb.PlanStep(
                id=step_id,
                title=text.sentence(4, 9),
                status=pb.STEP_STATUS_PENDING,
                order=order,
                notes=text.prose(rng.randint(60, 160)),
            )
        )
    for key in keys:
        patch.working_memory[key] = _fact(text)
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        clock.tick()
        patch = pb.Checkpoint(step=i)
        for key in rng.sample(keys, rng.randint(1, 3)):
            patch.working_memory[key] = _fact(text)
        step = pb.PlanStep()
        step.CopyFrom(rec.state.plan[rng.choice(plan_ids)])
        step.status = rng.choice((pb.STEP_STATUS_IN_PROGRESS, pb.STEP_STATUS_DONE, pb.STEP_STATUS_PENDING))
        step.notes = text.prose(rng.randint(60, 160))
        patch.plan[step.id].CopyFrom(step)
        patch.current_step_id = step.id
        if rng.random() < 0.3:
            setattr(patch.handoff, rng.choice(handoff_fields), text.prose(rng.randint(80, 200)))
        if rng.random() < 0.1:
            patch.conversation_summary = text.prose(rng.randint(800, 1200))
        if i == steps:
            patch.status = pb.STATUS_DONE
        elif rec.state.status != pb.STATUS_RUNNING:
            patch.status = pb.STATUS_RUNNING
        elif rng.random() < 0.1:
            # Pauses for a human now and then; resumes on the next step.
            patch.status = pb.STATUS_WAITING_FOR_APPROVAL
        rec.commit(patch)
    return rec.steps


# --- large ------------------------------------------------------------------

# Over 20 MB however counted (20 MiB = 20,971,520 bytes), with margin.
_LARGE_TARGET = 22 * 1024 * 1024


def _large(rng: random.Random, steps: int) -> list[Step]:
    text, clock, rec = _Text(rng), _Clock(rng), _Recorder()
    plan_ids = [f"p{k}" for k in range(40)]
    keys = [f"note.{k}" for k in range(64)]

    patch = pb.Checkpoint(step=1, current_step_id=plan_ids[25])
    _start(patch, rng, text.prose(rng.randint(200, 500)))
    patch.conversation_summary = text.prose(4_000)
    for order, step_id in enumerate(plan_ids):
        status = (
            pb.STEP_STATUS_DONE if order < 25 else pb.STEP_STATUS_IN_PROGRESS if order == 25 else pb.STEP_STATUS_PENDING
        )
        patch.plan[step_id].CopyFrom(pb.PlanStep(id=step_id, title=text.sentence(4, 10), status=status, order=order))
    for key in keys:
        patch.working_memory[key] = text.prose(rng.randint(200, 600))
    for k in range(150):
        decision = patch.decisions.add(id=f"d{k}", step_id=rng.choice(plan_ids[:26]), choice=text.sentence(4, 10))
        decision.reasoning = text.prose(rng.randint(200, 800))
        decision.alternatives.extend(text.sentence(3, 8) for _ in range(rng.randint(1, 3)))
        decision.decided_at.seconds = clock.tick(1, 30)
    for _ in range(300):
        found = patch.discoveries.add(fact=text.sentence(), source=f"src/{'/'.join(text.idents(2))}.py")
        found.observed_at.seconds = clock.tick(1, 30)
        found.confidence = round(rng.uniform(0.4, 1.0), 2)
    patch.messages.append(_message(pb.ROLE_SYSTEM, text.prose(6_000), clock.now))
    patch.messages.append(_message(pb.ROLE_USER, text.prose(rng.randint(300, 1500)), clock.tick()))
    size = patch.ByteSize()
    turn = 0
    while size < _LARGE_TARGET:
        turn += 1
        size += _large_turn(text, clock, patch, turn, _log_uniform(rng, 1_024, 64_000))
    if steps == 1:
        patch.status = pb.STATUS_DONE
    rec.commit(patch)
    for i in range(2, steps + 1):
        patch = pb.Checkpoint(step=i)
        _large_turn(text, clock, patch, turn + i, _log_uniform(rng, 1_024, 4_096))
        patch.working_memory[rng.choice(keys)] = text.prose(rng.randint(200, 600))
        if rng.random() < 0.3:
            step = pb.PlanStep()
            step.CopyFrom(rec.state.plan[rng.choice(plan_ids[25:])])
            step.status = rng.choice((pb.STEP_STATUS_IN_PROGRESS, pb.STEP_STATUS_DONE))
            patch.plan[step.id].CopyFrom(step)
            patch.current_step_id = step.id
        if i == steps:
            patch.status = pb.STATUS_DONE
        rec.commit(patch)
    return rec.steps


def _large_turn(text: _Text, clock: _Clock, patch: pb.Checkpoint, turn: int, output_chars: int) -> int:
    """Append one tool call and its reply (cached when side-effect free); returns the bytes added, roughly."""
    rng = text.rng
    tool = rng.choice(("execute_bash", "read_file", "search", "run_tests"))
    args = json.dumps({"target": "/".join(text.idents(2)), "limit": rng.randrange(10, 500)})
    assistant = _message(pb.ROLE_ASSISTANT, text.prose(rng.randint(100, 800)), clock.tick(5, 60))
    call = assistant.tool_calls.add(id=f"call_{turn}", name=tool, arguments_json=args)
    output = text.tool_output(output_chars)
    patch.messages.append(assistant)
    patch.messages.append(_message(pb.ROLE_TOOL, output, clock.tick(1, 30), tool_call_id=call.id))
    added = len(assistant.content) + len(args) + len(output) + 64
    if tool != "run_tests" and rng.random() < 0.5:
        result = _tool_result(tool, args, output, clock.now)
        patch.tool_cache[_cache_key(tool, result.canonical_args_json)].CopyFrom(result)
        added += len(output) + len(args) + 64
    return added


_SYNTHETIC: dict[str, Callable[[random.Random, int], list[Step]]] = {
    "chat": _chat,
    "coding": _coding,
    "factual": _factual,
    "large": _large,
}
