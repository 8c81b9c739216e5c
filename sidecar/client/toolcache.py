"""The tool-result cache: a tool call's result recorded in its session's ``Checkpoint.tool_cache`` before it
is returned, so that an agent restarted after a paid call does not pay for it again (``cached_call``).

The key is the hex XXH3-128 of the UTF-8 bytes of the tool name, a NUL, and the
canonical JSON of the arguments; the Node.js client computes the same key
(clients/node/ckpt_client.js), so either client hits what the other recorded.
Canonical JSON is JSON text with no whitespace, object keys sorted by their
UTF-16 code units, strings escaped as JavaScript's JSON.stringify does (``"``,
``\\`` and U+0000-U+001F only), and numbers written as JavaScript's
Number::toString writes them (``1.0`` is ``1``, ``1e21`` is ``1e+21``):
JavaScript's own serialization of the same value, with sorted keys.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import xxhash

from ckpt.v1 import checkpoint_pb2, service_pb2

from .errors import InvalidArgumentError, NotFoundError


class _Client(Protocol):
    """What cached_call uses of CheckpointClient."""

    def get(self, session_id: str, version: int = 0, *, field_mask: Sequence[str] = ()) -> service_pb2.GetResponse: ...

    def merge(self, session_id: str, patch: bytes | None = None, *, message_type: str | None = None) -> object: ...


class _AsyncClient(Protocol):
    """What cached_call uses of AsyncCheckpointClient."""

    def get(
        self, session_id: str, version: int = 0, *, field_mask: Sequence[str] = ()
    ) -> Awaitable[service_pb2.GetResponse]: ...

    def merge(
        self, session_id: str, patch: bytes | None = None, *, message_type: str | None = None
    ) -> Awaitable[object]: ...


CHECKPOINT = "ckpt.v1.Checkpoint"
#: The mask a typed session's cache is read with: the tool results alone, not the history beside them.
_MASK = ("tool_cache",)


def canonical_json(value: object) -> str:
    """``value`` (None, bool, int, float, str, a list or tuple, a mapping with str keys, nested; a subclass
    of one as the value it is, so a numpy.float64 as its float) as canonical JSON. TypeError for anything
    else (numpy.int64 too, which subclasses no int); ValueError for NaN, an infinity or a lone surrogate."""
    out: list[str] = []
    _write(value, out)
    text = "".join(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"a string holds a lone surrogate {text[exc.start]!r}, which is not text: it has no canonical JSON"
        ) from None
    return text


def tool_cache_key(tool: str, args: object) -> tuple[str, str]:
    """The cache key of a call of ``tool`` with ``args``, and the arguments' canonical JSON."""
    if not isinstance(tool, str):
        raise TypeError(f"tool must be a str, not {type(tool).__name__}")
    if "\0" in tool:
        raise ValueError(f"tool {tool!r} holds a NUL, which separates it from the arguments in the key")
    canonical = canonical_json(args)
    try:
        key = xxhash.xxh3_128_hexdigest(f"{tool}\0{canonical}".encode())
    except UnicodeEncodeError as exc:
        raise ValueError(f"tool {tool!r} holds a lone surrogate at index {exc.start}") from None
    return key, canonical


def _write(value: object, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, int):  # a subclass (an IntEnum) as the int it is
        out.append(str(int(value)))
    elif isinstance(value, float):  # a subclass (numpy.float64) as the float it is
        out.append(_number(float(value)))
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"an object's keys must be str, not {type(key).__name__} ({key!r})")
        out.append("{")
        for n, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))):
            if n:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for n, item in enumerate(value):
            if n:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        name, hint = type(value).__name__, ""
        if type(value).__module__ == "numpy":  # its int64, float32, bool_ subclass no int, float nor bool
            name, hint = f"numpy.{name}", ": convert it first (.item(), .tolist())"
        raise TypeError(f"{name} is not a JSON value (None, bool, int, float, str, list, dict){hint}")


def _number(x: float) -> str:
    """``x`` (a float, not a subclass: float's repr is read) as ECMAScript's Number::toString writes it (the
    shortest digits that read back as ``x``)."""
    if not math.isfinite(x):
        raise ValueError(f"{x} has no JSON form")
    if x == 0:
        return "0"  # -0 too
    sign = "-" if x < 0 else ""
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent or 0)  # x = 0.<digits> * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = f"{digits[0]}{'.' + digits[1:] if k > 1 else ''}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


class _Call:
    """One cached_call: its key, how it reads the session's cache and how it records a result."""

    def __init__(self, session_id: str, tool: str, args: object) -> None:
        self.session_id = session_id
        self.tool = tool
        self.key, self.canonical_args = tool_cache_key(tool, args)
        #: The message type the record is written with: "" keeps an untyped session untyped.
        self.message_type = CHECKPOINT

    def found(self, got: service_pb2.GetResponse | None) -> tuple[bool, Any]:
        """Whether the session's state ``got`` (None: no session yet) holds the result, and the result."""
        if got is None:
            return False, None
        if got.message_type not in ("", CHECKPOINT):
            raise ValueError(
                f"cached_call records tool results in a {CHECKPOINT}; session {self.session_id!r} holds"
                f" {got.message_type}"
            )
        self.message_type = got.message_type
        try:
            entry = checkpoint_pb2.Checkpoint.FromString(got.state).tool_cache.get(self.key)
        except Exception as exc:  # an untyped session's bytes
            raise ValueError(
                f"cached_call records tool results in a {CHECKPOINT}; session {self.session_id!r}'s state"
                f" does not parse as one ({exc})"
            ) from None
        if (
            entry is None
            or entry.is_error
            or entry.artifact_id  # a result kept in an artifact: the cache does not fetch it
            or (entry.tool, entry.canonical_args_json) != (self.tool, self.canonical_args)
        ):
            return False, None
        return _read_result(entry.result)

    def record(self, result: object) -> tuple[bytes, Any]:
        """The MERGE patch recording ``result``, and the value a hit would return (its JSON read back)."""
        encoded = canonical_json(result).encode()
        entry = checkpoint_pb2.ToolResult(tool=self.tool, canonical_args_json=self.canonical_args, result=encoded)
        entry.created_at.FromNanoseconds(time.time_ns())
        patch = checkpoint_pb2.Checkpoint()
        patch.tool_cache[self.key].CopyFrom(entry)
        return patch.SerializeToString(), json.loads(encoded)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_result(result: bytes) -> tuple[bool, Any]:
    """Whether ``result`` is JSON (UTF-8 text JavaScript's JSON.parse reads, so no NaN nor a BOM), and its
    value: a result that is not (empty, written by another writer) answers no call, so the call misses."""
    try:
        return True, json.loads(result.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False, None


def cached_call(client: _Client, session_id: str, tool: str, args: object, fn: Callable[[], Any]) -> Any:
    """CheckpointClient.cached_call."""
    call = _Call(session_id, tool, args)
    hit, value = call.found(_read(client, session_id))
    if hit:
        return value
    patch, value = call.record(fn())
    client.merge(session_id, patch, message_type=call.message_type or None)
    return value


async def async_cached_call(
    client: _AsyncClient, session_id: str, tool: str, args: object, fn: Callable[[], Any]
) -> Any:
    """AsyncCheckpointClient.cached_call: ``fn`` may be a coroutine function."""
    call = _Call(session_id, tool, args)
    hit, value = call.found(await _aread(client, session_id))
    if hit:
        return value
    result = fn()
    if inspect.isawaitable(result):
        result = await result
    patch, value = call.record(result)
    await client.merge(session_id, patch, message_type=call.message_type or None)
    return value


def _read(client: _Client, session_id: str) -> service_pb2.GetResponse | None:
    """The session's tool cache: masked when the session is typed, its whole state when it is not."""
    try:
        return client.get(session_id, field_mask=_MASK)
    except NotFoundError:
        return None
    except InvalidArgumentError:  # no message type to mask by, or another type than a Checkpoint
        return client.get(session_id)


async def _aread(client: _AsyncClient, session_id: str) -> service_pb2.GetResponse | None:
    try:
        return await client.get(session_id, field_mask=_MASK)
    except NotFoundError:
        return None
    except InvalidArgumentError:
        return await client.get(session_id)
