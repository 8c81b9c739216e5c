"""The checks of the store's arguments that are ints, strs or buffers: InvalidArgument naming the argument
and its limit, never a bare TypeError (or struct.error) from deeper down, nor a wrong answer."""

from __future__ import annotations

from ..config.store import MAX_INT as MAX_INT
from ..errors import InvalidArgument
from ..limits import FILTER_TIME_RANGE, MAX_FILTER_TIME_NANOS, MIN_FILTER_TIME_NANOS

#: The largest value the store keeps in an unsigned 64-bit field (versions, times, hashes).
UINT64_MAX = 2**64 - 1


def check_time_filter_arg(name: str, nanos: object) -> None:
    """A time a read filters by (None: no filter), in nanoseconds since the epoch; earlier ones act as it."""
    check_int_arg(
        name,
        nanos,
        least=MIN_FILTER_TIME_NANOS,
        most=MAX_FILTER_TIME_NANOS,
        optional=True,
        means=f"nanoseconds of a time from {FILTER_TIME_RANGE}",
    )


def check_int_arg(
    name: str, value: object, *, least: int = 0, most: int = UINT64_MAX, optional: bool = False, means: str = ""
) -> None:
    """InvalidArgument naming ``name`` unless ``value`` is an int (not a bool) in ``least``..``most`` (None
    too if ``optional``). ``means``: what a value means, said in the message ("0 = latest")."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if optional else "an int"
        raise InvalidArgument(f"{name} must be {kind}{_said(means)}, not {type(value).__name__}")
    if not least <= value <= most:
        limit = "0..2**64-1 (a uint64)" if (least, most) == (0, UINT64_MAX) else f"{least}..{most}"
        raise InvalidArgument(f"{name} must be in {limit}{_said(means)}, got {value}")


def _said(means: str) -> str:
    return f" ({means})" if means else ""


def check_str_arg(name: str, value: object) -> None:
    """InvalidArgument naming ``name`` unless ``value`` is a str."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, not {type(value).__name__}")


def byte_size(buffer: bytes | bytearray | memoryview) -> int:
    """The bytes ``buffer`` holds: a memoryview's len() counts its items, which may be wider than a byte."""
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
