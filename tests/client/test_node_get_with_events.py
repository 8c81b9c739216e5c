"""The Node.js client's get(..., { events }) against a real sidecar: the page is what events() reads, a cut
page continues from its token, and a bad filter is refused before anything is sent."""

from __future__ import annotations

from ckpt.sidecar.client import CheckpointClient, EventFilter, event
from ckpt.v1 import service_pb2
from tests.client.test_node_events_and_blobs import _run_node
from tests.support import Sidecar

_GET_WITH_EVENTS = """
run(async () => {
  const out = {};
  const filters = [{}, { types: ['tool'] }, { afterSeq: 40, newestFirst: true, pageSize: 5 }, { pageSize: 7 }];
  out.pages = [];
  for (const filter of filters) {
    const reply = await client.get('s', 0, { events: filter });
    const rest = reply.events.next_page_token
      ? await seqs(client.events('s', { ...filter, pageToken: reply.events.next_page_token })) : [];
    out.pages.push({ state: [...reply.state], version: reply.version, page: reply.events.events.map((e) => e.seq),
                     rest, all: await seqs(client.events('s', filter)) });
  }
  const plain = await client.get('s');
  out.plainEvents = plain.events;
  const quiet = await client.get('quiet', 0, { events: {} });
  out.quiet = [quiet.events.events.length, quiet.events.next_page_token];
  out.badSize = await failure(() => client.get('s', 0, { events: { pageSize: 1001 } }));
  out.badType = await failure(() => client.get('s', 0, { events: { types: ['bad\\u0001'] } }));
  return out;
});
"""


def test_node_get_with_events_reads_what_events_reads(sidecar: Sidecar) -> None:
    with CheckpointClient(sidecar.unix_target) as client:
        steps = [event("tool" if i % 2 else "msg", b"%d" % i) for i in range(60)]
        client.append_events("s", steps, put=service_pb2.PutRequest(state=b"\x08\x01"))
        client.put("quiet", b"\x08\x02")
        from_python = client.get("s", events=EventFilter(page_size=7))
    out = _run_node(_GET_WITH_EVENTS, sidecar.unix_target)
    for got in out["pages"]:
        assert got["state"] == [8, 1] and got["version"] == 1
        assert got["page"] + got["rest"] == got["all"] and got["page"]
    assert out["pages"][1]["all"] == list(range(2, 61, 2))
    assert out["pages"][2]["page"] == [60, 59, 58, 57, 56]
    assert out["pages"][3]["page"] == [e.seq for e in from_python.events.events] == list(range(1, 8))
    assert out["plainEvents"] is None
    assert out["quiet"] == [0, ""]
    assert out["badSize"]["name"] == "RangeError" and "pageSize must be in 0..1000" in out["badSize"]["message"]
    assert out["badType"]["code"] == 3 and "events.types[0]" in out["badType"]["message"]
