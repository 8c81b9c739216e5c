"""Every write carries a request id, the caller's or one the client makes, so that a resent write replays."""

from __future__ import annotations

import re
import time

import pytest

from tests.client.support import FLAVOURS, PATCH, CountCalls, LoseFirstReply, open_client, versions
from tests.support import Sidecar


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_generated_request_ids_are_fresh_uuid7_hex_and_labels_still_go(sidecar: Sidecar, flavour: str) -> None:
    """The client makes the id of a write that brings none as a UUIDv7 by hand (uuid4 cost ~4.5 us a
    write): 32 hex digits, the time in ms first, so the store keeps the records of writes made together
    side by side; a new one each write. A request without labels leaves the map out (it was ~2 us)."""
    began_ms = time.time_ns() // 1_000_000
    count = CountCalls()
    with open_client(flavour, sidecar.unix_target, interceptor=count) as c:
        for _ in range(3):
            c.merge("fresh-ids", PATCH)
        c.merge("fresh-ids", PATCH, labels={"team": "a"})
        c.put("fresh-ids", PATCH, request_id="mine")
    ids = [m.request_id for m in count.sent]
    assert all(re.fullmatch("[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in ids[:4]), ids
    assert len(set(ids[:4])) == 4 and ids[4] == "mine"
    times = [int(i[:12], 16) for i in ids[:4]]
    assert began_ms <= times[0] and times == sorted(times) and times[-1] <= time.time_ns() // 1_000_000, ids
    assert [dict(m.labels) for m in count.sent] == [{}, {}, {}, {"team": "a"}, {}]
    assert versions(sidecar.unix_target, "fresh-ids") == [5, 4, 3, 2, 1]  # newest first


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_empty_request_id_gets_one_generated_so_a_retry_still_replays(sidecar: Sidecar, flavour: str) -> None:
    """request_id='' is no id to the sidecar: the client used to send it so, and a retry after a lost
    reply wrote a second version. Now '' means "generate one", as it does for put_stream and Node."""
    lose = LoseFirstReply()
    with open_client(flavour, sidecar.unix_target, interceptor=lose) as c:
        r = c.merge("empty-rid", PATCH, request_id="")
    assert (r.version, r.replayed) == (1, True)
    assert lose.sent[0].request_id and lose.sent[0] == lose.sent[1]
    assert versions(sidecar.unix_target, "empty-rid") == [1]
