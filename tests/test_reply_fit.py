"""Every reply fits its frame whatever a job carried: the largest legal job history (a 1 MiB
body, 25 attempts, each with 100 x 1 KiB ``ctx.log`` lines, the longest error, traceback,
slot id, group and progress note) stays readable by ``why``, ``dead`` (at every offset) and,
line for line, by the ``logs`` op, over real Zenoh from a raw client."""

from __future__ import annotations

from typing import Any

from test_wire_trust import Raw, owner_and_raw

from istos import codec, protocol

ATTEMPTS = 25
BIG_BODY = codec.encode_body("b" * (protocol.MAX_BODY_BYTES - 16))
SLOT = "\U0001f41d" * (protocol.MAX_SLOT_ID_BYTES // 4)  # 256 bytes, 64 characters
ERROR = "\u00e9" * protocol.MAX_ERROR_BYTES  # cut to 1,024 bytes by the owner
TRACEBACK = "Traceback (most recent call last):\n" + "  File 'x'\n" * 2000
NOTE = "\U0001f41d" * 256  # the longest progress note, in 4-byte characters


def lines_of(job: int, attempt: int) -> list[str]:
    """100 lines of 1,024 UTF-8 bytes each (4-byte characters), told apart by their start."""
    return [f"{job:02d}/{attempt:02d}/{i:03d} " + "\U0001f41d" * 253 + "ab"
            for i in range(protocol.MAX_LOG_LINES)]


async def fail_every_attempt(raw: Raw, job_id: str, job: int) -> None:
    """Claim and nack ``job_id`` until it is dead, each attempt at every field's limit."""
    for attempt in range(1, ATTEMPTS + 1):
        claim = await raw.op("q", "work", "claim", workers=[SLOT], node="n")
        assert claim["ok"] and [j["job_id"] for j in claim["jobs"]] == [job_id], claim
        token = claim["jobs"][0]["token"]
        beat = await raw.op("q", "work", "extend", items=[
            {"job_id": job_id, "token": token, "progress": 0.5, "note": NOTE}])
        assert beat["statuses"] == ["ok"], beat
        lines = lines_of(job, attempt)
        assert all(len(line.encode()) == protocol.MAX_LOG_LINE_BYTES for line in lines)
        reply = await raw.op("q", "work", "settle", items=[{
            "op": "nack", "job_id": job_id, "token": token, "error": ERROR,
            "traceback": TRACEBACK, "retry_after": 0, "logs": lines, "logs_at": 0}])
        assert reply["statuses"] == ["ok"], reply


def kept_attempts() -> list[int]:
    return [1, *range(ATTEMPTS - 18, ATTEMPTS + 1)]  # the first and the latest 19


def check_fits(reply: dict[str, Any]) -> None:
    assert reply["ok"] is True, reply
    size = protocol.encoded_size(reply)
    assert size <= protocol.FRAME_CAP
    SIZES.append(size)


SIZES: list[int] = []


def omitted_of(history: list[dict[str, Any]]) -> int:
    return sum(entry.get("logs_omitted", 0) for entry in history)


def check_history(history: list[dict[str, Any]], job: int) -> None:
    """Shown lines are the attempts' own, newest attempts first, the rest counted."""
    assert [e["attempt"] for e in history] == kept_attempts()
    for entry in history:
        shown, want = entry["logs"], lines_of(job, entry["attempt"])
        assert shown == want[len(want) - len(shown):]  # a tail of the attempt's lines
        assert len(shown) + entry.get("logs_omitted", 0) == len(want)
    counts = [len(e["logs"]) for e in history]
    assert counts == sorted(counts)  # newest attempts keep theirs


async def test_the_largest_legal_job_history_is_readable_by_why_dead_and_logs():
    async with owner_and_raw("q", max_attempts=ATTEMPTS) as (owner, raw):
        big = ["big-0", "big-1", "big-2"]
        for i, job_id in enumerate(big):  # one at a time: each dies before the next comes
            reply = await raw.op("q", "produce", "enqueue", body=BIG_BODY, job_id=job_id,
                                 group="g" * protocol.MAX_GROUP_BYTES)
            assert reply["ok"], reply
            await fail_every_attempt(raw, job_id, i)
            if i == 1:  # a small dead letter between the big ones
                await raw.op("q", "produce", "enqueue", body=b"\x90", job_id="small")
                await fail_every_attempt(raw, "small", 9)

        for i, job_id in enumerate(big):
            why = await raw.op("q", "read", "why", job_id=job_id)
            check_fits(why)
            letter = why["why"]["dead_letter"]
            assert why["why"]["state"] == "dead" and letter["attempts"] == ATTEMPTS
            check_history(letter["history"], i)
            assert why["why"]["logs_omitted"] == omitted_of(letter["history"]) > 0
            assert letter["body"] == BIG_BODY or letter["body_size"] == len(BIG_BODY)

        seen: dict[str, dict[str, Any]] = {}
        for offset in range(4):  # every offset answers, with at least one letter
            page = await raw.op("q", "read", "dead", offset=offset, limit=1000)
            check_fits(page)
            assert page["total"] == 4 and page["dead"], page.keys()
            assert page["next_offset"] == offset + len(page["dead"])
            assert page["more"] == (page["next_offset"] < 4)
            for letter in page["dead"]:
                seen.setdefault(letter["job_id"], letter)
        end = await raw.op("q", "read", "dead", offset=4)
        assert end["dead"] == [] and end["more"] is False
        assert sorted(seen) == sorted([*big, "small"])
        for i, job_id in enumerate(big):
            letter = seen[job_id]
            assert letter["body"] == BIG_BODY  # a dead letter always carries its body
            check_history(letter["history"], i)
            assert letter["logs_omitted"] == omitted_of(letter["history"]) > 0
        check_history(seen["small"]["history"], 9)

        # The whole logs, page by page: every kept attempt's 100 lines, in order.
        for i, job_id in enumerate([*big, "small"]):
            job = 9 if job_id == "small" else i
            got, after, pages = [], 0, 0
            while True:
                reply = await raw.op("q", "read", "logs", job_id=job_id, after=after)
                check_fits(reply)
                assert reply["state"] == "dead"
                got.extend(reply["attempts"])
                pages += 1
                if not reply["more"]:
                    break
                after = reply["next_after"]
            assert pages > 1
            assert [a["attempt"] for a in got] == kept_attempts()
            assert all(a["logs"] == lines_of(job, a["attempt"]) and a["logs_dropped"] == 0
                       for a in got)
        assert len(await owner.job_logs("q", "big-2")) == len(kept_attempts())
        print(f"\nlargest reply {max(SIZES):,} bytes of {protocol.FRAME_CAP:,}")
        unknown = await raw.op("q", "read", "logs", job_id="nope")
        assert unknown["state"] == "unknown" and unknown["attempts"] == []


async def test_why_of_a_leased_job_with_a_long_history_fits():
    async with owner_and_raw("q", max_attempts=ATTEMPTS + 1) as (owner, raw):
        await raw.op("q", "produce", "enqueue", body=b"\xc4\x00", job_id="live")
        await fail_every_attempt(raw, "live", 5)
        claim = await raw.op("q", "work", "claim", workers=[SLOT], node="n")
        assert [j["job_id"] for j in claim["jobs"]] == ["live"]
        why = await raw.op("q", "read", "why", job_id="live")
        check_fits(why)
        job = why["why"]["job"]
        assert why["why"]["state"] == "leased"
        shown = [e["attempt"] for e in job["history"] if e.get("logs")]
        assert shown and shown[-1] == ATTEMPTS  # the newest lines are the ones shown
        assert why["why"]["logs_omitted"] == omitted_of(job["history"]) > 0
        assert job["history"][-1]["attempt"] == ATTEMPTS + 1


def test_istos_why_says_how_many_lines_a_reply_left_out():
    from istos.ops.render import logs_text

    why = {"job": {"history": [{"attempt": 1, "logs": [], "logs_dropped": 0,
                                "logs_omitted": 100},
                               {"attempt": 2, "logs": ["last"], "logs_dropped": 0}]}}
    text = "\n".join(logs_text(why))
    assert "log of attempt 1 (100 older line(s) not in this reply: app.job_logs" in text
    assert "log of attempt 2:" in text and "    last" in text


def test_a_why_still_over_the_frame_after_its_logs_leaves_the_body_out():
    from istos.owner.handlers.fit import fit_why

    entry = {"attempt": 1, "worker": SLOT, "claimed_at": 1.0, "finished_at": 2.0,
             "outcome": "nacked", "error": ERROR[:512], "backoff_s": 1.0,
             "traceback": "t" * protocol.MAX_TRACEBACK_BYTES, "logs": lines_of(0, 1),
             "logs_dropped": 0}
    job = {"job_id": "j", "body": BIG_BODY, "history": [dict(entry, attempt=i)
                                                        for i in range(1, 21)]}
    why = {"state": "leased", "job": job, "workflow": {"kind": "chain", "steps": [
        {"index": i, "queue": "q" * 50, "job_id": "wf:" + "a" * 40} for i in range(2000)]}}
    fit_why(why)
    assert protocol.encoded_size(why) <= protocol.PAGE_BUDGET
    assert job["body"] is None and job["body_size"] == len(BIG_BODY)
    assert why["logs_omitted"] == 20 * protocol.MAX_LOG_LINES
    assert all(e["logs"] == [] for e in job["history"])
