"""cached_call: a tool's result recorded in the session's Checkpoint.tool_cache before it is returned, so a
hit never calls the tool again, not even from an agent process killed and started again; through a real
sidecar, from both Python clients."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from ckpt.sidecar.client import AsyncCheckpointClient, CheckpointClient
from ckpt.sidecar.client.toolcache import canonical_json, tool_cache_key
from ckpt.v1 import checkpoint_pb2 as pb
from tests.support import AGENT_STATE, ROOT, Sidecar, agent_file, descriptor_set_of


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": [True, None, "x"]}, '{"a":[true,null,"x"],"b":1}'),
        ({"\U0001f600": 1, "\uffff": 2, "z": 3}, '{"z":3,"\U0001f600":1,"\uffff":2}'),  # UTF-16 order
        ((1.0, -0.0, 0.5, 1e21, 1e20, 1.5e-7, 1e-6, 123456789.125, -2.5e-10, 10**30), None),
        ('tab\t quote" back\\ nul\x00 del\x7f e\u2028 é', '"tab\\t quote\\" back\\\\ nul\\u0000 del\x7f e\u2028 é"'),
        ([], "[]"),
        ({}, "{}"),
    ],
)
def test_canonical_json_is_javascripts_with_sorted_keys(value: object, text: str | None) -> None:
    expected = (
        text or "[1,0,0.5,1e+21,100000000000000000000,1.5e-7,0.000001,123456789.125,-2.5e-10," + str(10**30) + "]"
    )
    assert canonical_json(value) == expected
    assert json.loads(expected) == json.loads(canonical_json(json.loads(expected)))


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (math.nan, ValueError, "nan has no JSON form"),
        ([math.inf], ValueError, "inf has no JSON form"),
        ({1: "a"}, TypeError, "an object's keys must be str, not int"),
        ({"a": {1, 2}}, TypeError, "set is not a JSON value"),
        ("\ud800", ValueError, "lone surrogate"),
    ],
)
def test_what_has_no_canonical_json_is_refused(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        canonical_json(value)


def test_the_key_is_the_xxh3_128_of_the_tool_a_nul_and_the_canonical_arguments() -> None:
    key, canonical = tool_cache_key("search", {"q": "ckpt", "limit": 10})
    assert canonical == '{"limit":10,"q":"ckpt"}'
    assert key == xxhash.xxh3_128_hexdigest(b'search\x00{"limit":10,"q":"ckpt"}') and len(key) == 32
    assert tool_cache_key("search", {"limit": 10, "q": "ckpt"})[0] == key  # argument order does not matter
    assert tool_cache_key("search", {"limit": 10.0, "q": "ckpt"})[0] == key  # nor 10 against 10.0
    with pytest.raises(ValueError, match="holds a NUL"):
        tool_cache_key("a\0b", {})


_FLOATS = (0.5, 0.1, 1e21, 1e20, 1.5e-7, -2.5e-10, 5e-324, 1.7976931348623157e308, 123456789.125, -0.0, 10.0)


def test_a_numpy_float_keys_as_the_float_it_is_and_other_numpy_scalars_are_refused() -> None:
    for x in _FLOATS:
        assert tool_cache_key("t", {"x": np.float64(x)}) == tool_cache_key("t", {"x": x}), x
    assert canonical_json([np.float64(0.5), np.float64(1e21)]) == "[0.5,1e+21]"
    # numpy's int64, float32 and bool_ subclass no int, float nor bool: refused, named, not guessed at.
    for value, name in ((np.int64(3), "numpy.int64"), (np.float32(0.5), "numpy.float32"), (np.bool_(1), "numpy.bool")):
        with pytest.raises(TypeError, match=rf"^{name} is not a JSON value .*: convert it first \(\.item\(\)"):
            tool_cache_key("t", {"x": [value]})


class _Tool:
    """A paid tool: counts its calls, returns a JSON value (or raises)."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self) -> Any:
        self.calls += 1
        if self.fail:
            raise RuntimeError("the tool failed")
        return {"hits": [{"title": "ckpt", "score": 0.5}], "total": 1, "page": (1, 2)}


_RESULT = {"hits": [{"title": "ckpt", "score": 0.5}], "total": 1, "page": [1, 2]}


def test_a_hit_returns_the_recorded_result_without_calling_the_tool(sidecar: Sidecar) -> None:
    tool = _Tool()
    with CheckpointClient(sidecar.unix_target) as client:
        assert client.cached_call("agent", "search", {"q": "ckpt"}, tool) == _RESULT  # a miss: a new session
        assert client.cached_call("agent", "search", {"q": "ckpt"}, tool) == _RESULT  # a hit
        assert tool.calls == 1
        assert client.cached_call("agent", "search", {"q": "other"}, tool) == _RESULT  # other arguments
        assert client.cached_call("agent", "fetch", {"q": "ckpt"}, tool) == _RESULT  # another tool
        assert tool.calls == 3
        got = client.get("agent")
        assert got.message_type == "ckpt.v1.Checkpoint" and got.version == 3
        key, canonical = tool_cache_key("search", {"q": "ckpt"})
        entry = pb.Checkpoint.FromString(got.state).tool_cache[key]
        assert (entry.tool, entry.canonical_args_json, entry.is_error) == ("search", canonical, False)
        assert json.loads(entry.result) == _RESULT and entry.created_at.seconds > 0
        # An exception from the tool is raised and not recorded: the next call tries again.
        tool.fail = True
        for _ in range(2):
            with pytest.raises(RuntimeError, match="the tool failed"):
                client.cached_call("agent", "search", {"q": "failing"}, tool)
        assert tool.calls == 5 and client.get("agent").version == 3


def test_a_result_holding_a_numpy_float_is_recorded_once_and_read_back_as_a_float(sidecar: Sidecar) -> None:
    calls = []

    def score() -> Any:
        calls.append(1)
        return {"score": np.float64(0.25), "big": np.float64(1e21)}

    with CheckpointClient(sidecar.unix_target) as client:
        for _ in range(2):
            got = client.cached_call("numpy", "score", {"q": np.float64(0.5)}, score)
            assert got == {"score": 0.25, "big": 1e21} and type(got["score"]) is float
        assert len(calls) == 1
        entry = pb.Checkpoint.FromString(client.get("numpy").state).tool_cache[tool_cache_key("score", {"q": 0.5})[0]]
        assert (entry.canonical_args_json, entry.result) == ('{"q":0.5}', b'{"big":1e+21,"score":0.25}')


def test_the_cache_lives_beside_the_agents_state(sidecar: Sidecar) -> None:
    tool = _Tool()
    with CheckpointClient(sidecar.unix_target) as client:
        # A Checkpoint session with a history: the record merges into it.
        client.put("typed", message=pb.Checkpoint(goal="g", messages=[pb.Message(content="m" * 1000)]))
        client.cached_call("typed", "search", [1, 2], tool)
        state = pb.Checkpoint.FromString(client.get("typed").state)
        assert state.goal == "g" and len(state.messages) == 1 and len(state.tool_cache) == 1
        # An untyped session holding a Checkpoint's bytes: read whole, and it stays untyped.
        client.put("opaque", pb.Checkpoint(goal="g").SerializeToString())
        assert client.cached_call("opaque", "search", [1, 2], tool) == _RESULT
        assert client.cached_call("opaque", "search", [1, 2], tool) == _RESULT
        assert tool.calls == 2 and client.get("opaque").message_type == ""
        # A session of another type has no tool cache to keep.
        client.register_type(descriptor_set_of(agent_file()))
        client.put("other", b"", message_type=AGENT_STATE)
        with pytest.raises(ValueError, match=r"session 'other' holds acme\.agent\.v1\.State"):
            client.cached_call("other", "search", [1, 2], tool)
        assert tool.calls == 2


def test_the_async_client_caches_sync_and_coroutine_tools(sidecar: Sidecar) -> None:
    tool = _Tool()

    async def paid() -> Any:
        return tool()

    async def run() -> None:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            assert await client.cached_call("async", "search", {"q": 1}, paid) == _RESULT
            assert await client.cached_call("async", "search", {"q": 1}, tool) == _RESULT
            assert await client.cached_call("async", "search", {"q": 2}, tool) == _RESULT
            tool.fail = True
            with pytest.raises(RuntimeError):
                await client.cached_call("async", "search", {"q": 3}, paid)

    asyncio.run(run())
    assert tool.calls == 3


def test_two_callers_missing_the_same_key_both_call_the_tool_and_the_cache_stays_whole(sidecar: Sidecar) -> None:
    both_in = threading.Barrier(2)
    results: list[Any] = []

    def tool(n: int) -> Any:
        both_in.wait(timeout=30)  # each missed before either recorded
        return {"caller": n}

    with CheckpointClient(sidecar.unix_target) as client:
        threads = [
            threading.Thread(target=lambda n=n: results.append(client.cached_call("race", "t", {}, lambda: tool(n))))
            for n in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(r["caller"] for r in results) == [0, 1]
        cache = pb.Checkpoint.FromString(client.get("race").state).tool_cache
        assert len(cache) == 1
        kept = json.loads(next(iter(cache.values())).result)
        assert kept in results
        assert client.cached_call("race", "t", {}, lambda: pytest.fail("a hit calls no tool")) == kept


# An agent step: one paid tool call through cached_call (each run of the tool appends a line to a file),
# then "recorded" on stdout, then the next step, which never comes: the test kills it there.
_AGENT = """
import sys, time
from ckpt.sidecar.client import CheckpointClient
target, counter = sys.argv[1:]

def paid_call():
    with open(counter, "a") as f:
        f.write("called\\n")
    return {"answer": 42}

with CheckpointClient(target) as client:
    result = client.cached_call("agent-run", "solve", {"problem": "life"}, paid_call)
print("recorded", result["answer"], flush=True)
time.sleep(600)
"""


def test_an_agent_killed_after_a_paid_call_does_not_pay_for_it_again(sidecar: Sidecar, tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    for run in range(3):
        agent = subprocess.Popen(
            [sys.executable, "-c", _AGENT, sidecar.unix_target, str(counter)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert agent.stdout is not None
            line = agent.stdout.readline()  # the call recorded: the next step is under way
        finally:
            agent.send_signal(signal.SIGKILL)
            _, err = agent.communicate(timeout=30)
        assert line == "recorded 42\n", (run, line, err)
        assert agent.returncode == -signal.SIGKILL
        assert counter.read_text() == "called\n", run  # once, whichever run


# ToolResults of the right tool and arguments that hold no result the cache can return: each call of one
# misses, and its record replaces the entry whole. Node's cachedCall is held to the same cases.
UNANSWERABLE: dict[str, dict[str, Any]] = {
    "an error": {"is_error": True, "result": b'{"error":"timed out"}'},
    "in an artifact": {"artifact_id": "page"},  # the proto's "large outputs go to artifact_id instead"
    "in an artifact, a preview beside it": {"artifact_id": "page", "result": b'"the first lines"'},
    "empty": {},
    "not JSON": {"result": b"<html>"},
    "NaN, which JSON.parse does not read": {"result": b"NaN"},
    "not UTF-8": {"result": b'"\xff"'},
    "behind a byte order mark": {"result": b'\xef\xbb\xbf{"a":1}'},
}


def unanswerable_checkpoint() -> pb.Checkpoint:
    """A Checkpoint holding an artifact and a ``fetch`` entry of arguments ``{"case": case}`` per case."""
    checkpoint = pb.Checkpoint(goal="g")
    checkpoint.artifacts["page"].uri = "ckpt-blob:sha256:" + "ab" * 32
    for case, fields in UNANSWERABLE.items():
        key, canonical = tool_cache_key("fetch", {"case": case})
        checkpoint.tool_cache[key].CopyFrom(pb.ToolResult(tool="fetch", canonical_args_json=canonical, **fields))
    return checkpoint


def assert_each_entry_replaced(state: bytes) -> None:
    """Each case's entry in ``state`` is the record of the tool's result ``{"fresh": case}``, whole."""
    checkpoint = pb.Checkpoint.FromString(state)
    for case in UNANSWERABLE:
        entry = checkpoint.tool_cache[tool_cache_key("fetch", {"case": case})[0]]
        fresh = canonical_json({"fresh": case}).encode()
        assert (entry.is_error, entry.artifact_id, entry.result) == (False, "", fresh), case
    assert checkpoint.goal == "g" and "page" in checkpoint.artifacts  # the artifact is left where it was


def test_an_entry_holding_no_readable_result_is_a_miss_whose_record_replaces_it(sidecar: Sidecar) -> None:
    calls: list[str] = []

    def fetch(case: str) -> Any:
        calls.append(case)
        return {"fresh": case}

    with CheckpointClient(sidecar.unix_target) as client:
        client.put("sync", message=unanswerable_checkpoint())
        for case in UNANSWERABLE:
            for _ in range(2):  # a miss, then a hit of its record
                assert client.cached_call("sync", "fetch", {"case": case}, partial(fetch, case)) == {"fresh": case}
        assert calls == list(UNANSWERABLE)
        assert_each_entry_replaced(client.get("sync").state)


def test_the_async_client_misses_an_entry_holding_no_readable_result_and_replaces_it(sidecar: Sidecar) -> None:
    calls: list[str] = []

    async def fetch(case: str) -> Any:
        calls.append(case)
        return {"fresh": case}

    async def run() -> bytes:
        async with AsyncCheckpointClient(sidecar.unix_target) as client:
            await client.put("async", message=unanswerable_checkpoint())
            for case in UNANSWERABLE:
                for _ in range(2):
                    got = await client.cached_call("async", "fetch", {"case": case}, partial(fetch, case))
                    assert got == {"fresh": case}
            return (await client.get("async")).state

    assert_each_entry_replaced(asyncio.run(run()))
    assert calls == list(UNANSWERABLE)
