"""Event pages are packed as the owner walks them and spliced into the reply as bytes
(``istos/owner/views/slicing.py``): over the mesh they read exactly as the events themselves, an
in-process caller gets the same values, a read repeated (whose entries the owner kept packed)
or made after new events is still exact, and a page is cut by bytes as before."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from istos import Istos, codec, protocol
from istos.transport.local import LocalMesh
from tests.helpers import app_on

pytestmark = pytest.mark.fast

WORKER = "t:w"


def queue_events(app: Istos) -> list[dict[str, Any]]:
    """The owner's events of queue ``q``, oldest first, as the wire carries them."""
    plain = [e.to_dict() for e in app.events.recent() if e.queue == "q"]
    return msgpack.unpackb(msgpack.packb(plain, use_bin_type=True), raw=False)


async def nack_all(owner: Istos, n: int, error: str) -> None:
    """Claim ``n`` jobs and nack each with ``error`` (three events each, one carrying it)."""
    client = owner.client("q")
    leased: list[dict[str, Any]] = []
    while len(leased) < n:
        slots = [f"{WORKER}#{i}" for i in range(min(protocol.MAX_SLOTS, n - len(leased)))]
        leased += (await client.call("claim", workers=slots, node="t"))["jobs"]
    statuses = (await client.call("settle", items=[
        {"op": "nack", "job_id": j["job_id"], "token": j["token"], "error": error}
        for j in leased]))["statuses"]
    assert statuses == ["ok"] * n


async def test_event_pages_over_the_mesh_read_as_the_events_themselves(mesh: LocalMesh):
    owner, reader = app_on(mesh, "owner"), app_on(mesh, "reader")
    owner.queue("q", max_attempts=100)
    async with owner.serving(), reader.serving():
        await owner.enqueue_many("q", [{"i": i} for i in range(20)])
        await nack_all(owner, 7, "boom \u2603")
        remote, local = reader.client("q"), owner.client("q")
        # Renewals: the log keeps them in a ring of their own, merged into a page by number.
        held = (await local.call("claim", workers=[f"{WORKER}#r"], node="t"))["jobs"][0]
        for _ in range(3):
            assert (await remote.call("extend", items=[
                {"job_id": held["job_id"], "token": held["token"]}]))["statuses"] == ["ok"]
        await owner.enqueue("q", {"after": "renewals"})
        assert not remote.owner_is_local() and local.owner_is_local()
        want = queue_events(owner)
        assert [e["kind"] for e in want[-5:]] == ["claimed"] + ["lease_extended"] * 3 + [
            "enqueued"]
        for _ in range(2):  # the second read finds its entries packed already
            over_mesh = await remote.call("events", limit=5000)
            assert over_mesh["events"] == want and over_mesh["more"] is False
            assert (await local.call("events", limit=5000))["events"] == want
        assert (await remote.call("events", limit=5))["events"] == want[-5:]

        since = await remote.call("events_since", epoch=None, after=0, limit=5000)
        assert since["events"] == want and since["seqs"] == list(range(1, len(want) + 1))
        assert since["last"] == len(want) and since["more"] is False
        epoch = since["epoch"]
        part = await remote.call("events_since", epoch=epoch, after=10, limit=4)
        assert part["events"] == want[10:14] and part["seqs"] == [11, 12, 13, 14]
        assert part["more"] is True
        assert await local.call("events_since", epoch=epoch, after=10, limit=4) == part

        await owner.enqueue_many("q", [{"i": i} for i in range(20, 23)])  # three more
        want = queue_events(owner)
        assert (await remote.call("events", limit=5000))["events"] == want
        tail = await remote.call("events_since", epoch=epoch, after=len(want) - 5, limit=5000)
        assert tail["events"] == want[-5:] and tail["more"] is False
        assert tail["seqs"] == list(range(len(want) - 4, len(want) + 1))


async def test_an_event_page_is_cut_by_bytes_and_continues_from_its_cursor(mesh: LocalMesh):
    """1,200 nacks carrying a 1,000-byte error each are more than a frame: the page stops
    short of the count limit, fits the frame, and ``events_since`` continues where it ended."""
    owner, reader = app_on(mesh, "owner"), app_on(mesh, "reader")
    owner.queue("q", max_attempts=100)
    async with owner.serving(), reader.serving():
        await owner.enqueue_many("q", [{"i": i} for i in range(1200)])
        await nack_all(owner, 1200, "x" * 1000)
        want = queue_events(owner)
        remote = reader.client("q")
        newest = await remote.call("events", limit=5000)
        n = len(newest["events"])
        assert newest["more"] is True and 0 < n < len(want)
        assert newest["events"] == want[-n:]

        got: list[dict[str, Any]] = []
        seqs: list[int] = []
        after, epoch, pages = 0, None, 0
        while True:
            page = await remote.call("events_since", epoch=epoch, after=after, limit=5000)
            pages += 1
            got += page["events"]
            seqs += page["seqs"]
            epoch, after = page["epoch"], page["seqs"][-1]
            if not page["more"]:
                break
        assert pages >= 2 and got == want and seqs == list(range(1, len(want) + 1))


def test_a_spliced_message_encodes_as_its_plain_form():
    """Packed values are written in place: the bytes are those of the plain message, for
    lists of every header size msgpack has (up to 15 items, up to 65,535, more)."""
    for n in (0, 1, 15, 16, 65_535, 65_536):
        items = [codec.encode_message({"i": i, "s": "\u00e9" * (i % 3)}) for i in range(n)]
        spliced = codec.Spliced(v=1, events=codec.Packed(items), more=n > 3, seqs=[1, 2])
        plain = spliced.plain()
        assert plain["events"] == [{"i": i, "s": "\u00e9" * (i % 3)} for i in range(n)]
        raw = codec.encode_spliced(spliced)
        assert raw == codec.encode_message(plain)
        assert protocol.encode_reply(spliced) == raw or len(raw) > protocol.FRAME_CAP
