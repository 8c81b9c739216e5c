"""One call's ceiling beside the sidecar's event log figures: its echo, carrying the same bytes as its calls.

The sidecar takes one gRPC call per event appended and one per page read, where SQLite works in this
process: no client making one call per event appends faster than the calls can be made, nor reads faster
than one call answers. So right after each of its phases, on the same sidecar and the client's own
channel, the phase is made again with each call replaced by an echo (``/ckpt.bench.Echo/Echo``, answered
by the gRPC process with the bytes it was sent) of the bytes that call carried: each append's
AppendEventsRequest, as the client builds it, with the writers of the append phase taking sessions from
one queue as they did; each cold read's ReadEventsResponse, in the order the sessions were read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..sidecar.client import event
from ..sidecar.client.events import append_events_request
from .events_replay import Event, SessionLog
from .events_systems import Appender, EchoCall

#: Echo calls made on the cold reader's channel before the timed echoes, as its reads had their warm-up.
ECHO_WARMUP_CALLS = 20


def append_requests(sessions: Sequence[SessionLog]) -> dict[tuple[str, int], bytes]:
    """Each event's AppendEventsRequest, serialized, by (session id, seq): what the client sends to append
    it alone (its generated request id included, so of the same size)."""
    return {
        (log.session_id, seq): append_events_request(
            log.session_id, [event(item.type, item.payload, attributes=item.attributes)], None, None
        ).SerializeToString()
        for log in sessions
        for seq, item in enumerate(log.events, start=1)
    }


class EchoAppender(Appender):
    """Appends nothing: echoes the request that would append the event (built before the run, untimed),
    and checks that the same bytes came back."""

    def __init__(self, echo: EchoCall, requests: Mapping[tuple[str, int], bytes]) -> None:
        self._echo = echo
        self._requests = requests

    def append(self, session_id: str, seq: int, item: Event) -> None:
        request = self._requests[(session_id, seq)]
        if self._echo(request) != request:
            raise AssertionError(f"the echo of {session_id} seq {seq}'s AppendEventsRequest came back changed")


def warm_up(echo: EchoCall, size_bytes: int) -> None:
    """A few echo calls of ``size_bytes``: the method's first calls on the channel are not a cold read's."""
    for _ in range(ECHO_WARMUP_CALLS):
        echo(bytes(size_bytes))
