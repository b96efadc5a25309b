"""Hostile input against a real owner over Zenoh (issue 11).

The owner is its own OS process (tests/procs/hostile_owner.py). This process sends it a seeded
stream of over 5,000 malformed requests as raw Zenoh queries on the rpc key -- every op, every
field, the envelope, undecodable and oversized frames -- plus the cases the issue names, while a
real worker runs a set of known jobs. Every reply must be a typed error map, the owner must
still answer ``ping``, every known job must run exactly once with its body intact, and the
owner's RSS may grow only a bounded amount (printed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import Istos, codec, keys, protocol

PROC = str(Path(__file__).parent / "procs" / "hostile_owner.py")
SEED = 1111
N_MESSAGES = 5200
MAX_RSS_GROWTH_KB = 96 << 10  # the first flood: allocator arenas for 1 MiB frames, caches
MAX_RSS_REPEAT_KB = 16 << 10  # the same flood again: no growth proportional to the traffic


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"k": value}
    return value


# -- the generator ---------------------------------------------------------------------------
def bad_ids(rng: random.Random) -> list[Any]:
    return [[], ["a"], {}, 1, 1.5, True, None, b"id", "", "a" * 201,
            "a" * rng.randint(202, 4000), "a\x00b", "line\nbreak", "\x7f", ["a", "b"]]


def bad_ints(lo: int, hi: int) -> list[Any]:
    return ["1", 1.0, True, None, lo - 1, hi + 1, 2 ** 63, -(2 ** 63), float("nan"),
            float("inf"), [], {}, b"1"]


def bad_numbers(lo: float, hi: float) -> list[Any]:
    return ["1", True, None, float("nan"), float("inf"), float("-inf"), lo - 1, hi * 2 + 1,
            [], {}, b"0"]


def bad_bins(max_bytes: int, nil: bool) -> list[Any]:
    out: list[Any] = ["text", 1, [], {}, True, 1.5]
    return out if nil else [*out, None]


def bad_settle_items() -> list[Any]:
    item = {"op": "ack", "job_id": "x", "token": "t"}
    return [None, {}, "x", 1, [1], ["x"], [{}], [{**item, "op": "frob"}], [{**item, "op": 1}],
            [{"op": "ack"}], [{**item, "job_id": [1]}], [{**item, "job_id": ""}],
            [{**item, "token": ["t"]}], [{**item, "token": "t" * 65}],
            [{**item, "token": "bad token"}], [{**item, "result": "str"}],
            [{**item, "op": "nack", "error": 5}], [item] * (protocol.MAX_SETTLE_ITEMS + 1)]


def bad_wheres() -> list[Any]:
    return ["x", 1, [], True, {"a" * 300: 1}, {".".join(["a"] * 50_000): 1},
            {str(i): 1 for i in range(protocol.MAX_WHERE_KEYS + 1)}, {"a": deep(20)},
            {1: 1}, {"": 1}, {"a": [deep(10)]}]


def bad_metas() -> list[Any]:
    forged = {"chord": {"id": "c9", "index": 0, "size": 1, "callback": "idle", "input": 1}}
    return ["x", 1, [], True, deep(1023), deep(protocol.MAX_META_DEPTH + 1), {"anything": 1},
            {"blob": "m" * (protocol.MAX_META_BYTES + 1)}, forged,
            {**forged, "batch": {"id": "wf:" + "0" * 32 + "@idle", "home": "idle",
                                 "key": "ab" * 16}},  # a chord with ends: both proven
            {"chain": {"id": "k"}}, {"chain": {"id": "k", "queues": ["q"], "step": 5,
                                               "priority": 0}},
            {"chain": {"id": "k", "queues": "q", "step": 0, "priority": 0}}]


def bad_texts(max_bytes: int, *, nil: bool, empty: bool = True) -> list[Any]:
    out: list[Any] = [1, [], {}, True, b"t", "t" * (max_bytes + 1)]
    if not empty:
        out.append("")
    return out if nil else [*out, None]


def bad_tokens(rng: random.Random) -> list[Any]:
    return [*bad_ids(rng), "t" * 65, "tok en", "\u00e9t\u00e9"]


def bad_lease_items(limit: int, extend: bool) -> list[Any]:
    item = {"job_id": "x", "token": "t"}
    out: list[Any] = [None, {}, "x", 1, [1], ["x"], [{}], [{"job_id": "x"}], [{"token": "t"}],
                      [{**item, "job_id": [1]}], [{**item, "job_id": ""}],
                      [{**item, "token": "bad token"}], [item] * (limit + 1)]
    if extend:
        out += [[{**item, "logs": True}], [{**item, "logs": ["x"] * 101}],
                [{**item, "logs": ["x" * 1025]}], [{**item, "logs_at": -1}],
                [{**item, "logs_dropped": 2 ** 64 - 1}], [{**item, "progress": 2}],
                [{**item, "note": "n" * 300}]]
    return out


def field_bad_values(rng: random.Random) -> dict[str, list[Any]]:
    ids = bad_ids(rng)
    return {
        "job_id": ids, "chord_id": ids,
        "token": bad_tokens(rng), "park_key": bad_tokens(rng),
        "body": [*bad_bins(protocol.MAX_BODY_BYTES, False), b"\x01" * (protocol.MAX_BODY_BYTES
                                                                       + 1)],
        "result": bad_bins(protocol.MAX_BODY_BYTES, True),
        "delay_s": bad_numbers(0, protocol.MAX_DELAY_S),
        "priority": bad_ints(-protocol.MAX_PRIORITY, protocol.MAX_PRIORITY),
        "meta": bad_metas(),
        "workers": [None, [], "s", [1], [["x"]], [""], ["a" * 257], ["\x00"], {},
                    ["s"] * (protocol.MAX_SLOTS + 1)],
        "node": [1, [], {}, True, "n" * 257, b"n"],
        "settle": bad_settle_items()[1:], "items": bad_settle_items(),
        "error": [1, [], {}, True, b"e"],
        "offset": bad_ints(0, protocol.MAX_OFFSET), "limit": bad_ints(1, 1 << 31),
        "size": bad_ints(1, 1 << 20),
        "callback": [1, [], None, "", "a" * 201, "bad*name", "a//b"],
        "member_queue": [1, [], None, "", "a" * 201, "bad*name", "a//b"],
        "key": [1, [], None, "", "k" * 65, True, "not hex"],
        "state": ["frob", 1, [], True, ""], "where": bad_wheres(),
        "ttl_s": bad_numbers(0, 1e9), "job_ids": ["x", 1, [1], [""], ["a"] * 4097, {}],
        # (nil is "none chosen" for these three: not a bad value)
        "retry_after": [v for v in bad_numbers(0, protocol.MAX_DELAY_S) if v is not None],
        "dedup_s": [v for v in bad_numbers(0, protocol.MAX_DELAY_S) if v is not None],
        "expires_s": [v for v in bad_numbers(0, protocol.MAX_DELAY_S) if v is not None],
        "start_by": [v for v in bad_numbers(0, protocol.MAX_TIME) if v is not None],
        "group": bad_texts(protocol.MAX_GROUP_BYTES, nil=True, empty=False),
        "reason": bad_texts(protocol.MAX_PAUSE_REASON_BYTES, nil=True),
        "by": bad_texts(protocol.MAX_PAUSE_BY_BYTES, nil=True),
        "traceback": [1, [], {}, True, b"t"],
        "park_s": bad_numbers(0, protocol.MAX_PARK_S),
        "worker": bad_texts(protocol.MAX_SEARCH_TEXT, nil=True, empty=False),
        **{f"{what}_{end}": bad_numbers(0, protocol.MAX_TIME)
           for what in ("enqueued", "finished") for end in ("after", "before")},
        "period_s": bad_numbers(0, 1e11),
        "prefix": [*ids, "short", "\x00" * 8],
        "since": bad_numbers(0, 1e11), "resolution": ["1h", 1, [], "", True],
        "epoch": bad_texts(64, nil=True), "after": bad_ints(0, 1 << 62),
        "older_than_s": bad_numbers(0, protocol.MAX_TIME),
        # unique keys and debounce bursts (istos/wire_lifecycle.py); nil is "none"
        "unique": ["k", 1, [], True, {}, {"key": ""}, {"key": "k" * 201}, {"key": 1},
                   {"key": "k", "scope": "forever"}, {"key": "k", "s": 5.0},
                   {"key": "k", "scope": "finished", "s": float("nan")},
                   {"key": "k", "scope": "finished", "s": -1}],
        "debounce": ["k", 1, [], True, {}, {"key": "k"}, {"key": "k", "s": -1.0},
                     {"key": "k", "s": float("inf")}, {"key": "k", "s": 2.0, "max_s": 1.0},
                     {"key": "k", "s": 1.0, "mode": "middle"}, {"key": "", "s": 1.0}],
        "run_at": [v for v in bad_numbers(0, protocol.MAX_TIME) if v is not None],
        "batch_id": ids, "member": ids, "parent": ids,
        "child_id": ids, "parent_id": ids,
        "child_queue": bad_texts(protocol.MAX_JOB_ID_BYTES, nil=False, empty=False),
        "parent_queue": bad_texts(protocol.MAX_JOB_ID_BYTES, nil=False, empty=False),
        "outcome": ["frob", 1, None, [], "", "pending"],
        "kinds": [None, [], ["frob"], "on_success", [1], ["on_success"] * 4],
        "callbacks": [None, [], "x", {"frob": ["q", b""]}, {"on_success": "q"},
                      {"on_success": ["q"]}, {"on_success": [1, b""]},
                      {"on_success": ["q", "s"]}, {"on_success": ["", b""]},
                      {"on_success": ["bad*name", b""]}],
        "description": [1, [], True, b"d", "d" * 1025],
        "parent_batch": ["p", 1, [], True, {}, {"id": "p", "home": "cb"},
                         {"id": "p", "home": "cb", "key": "ab" * 16, "x": 1},
                         {"id": "", "home": "cb", "key": "ab" * 16},
                         {"id": "p", "home": "", "key": "ab" * 16},
                         {"id": "p", "home": "cb", "key": ""},
                         {"id": "p", "home": "cb", "key": "k" * 65},
                         {"id": 1, "home": "cb", "key": "ab" * 16},
                         {"id": "p", "home": "bad*name", "key": "ab" * 16},
                         {"id": "p", "home": "cb", "key": "ab" * 16}],  # (no such parent)
    }


BAD_BY_OP: dict[tuple[str, str], Any] = {  # where an op's field has other bounds
    ("extend", "items"): lambda rng: bad_lease_items(protocol.MAX_EXTEND_ITEMS, True),
    ("release", "items"): lambda rng: bad_lease_items(protocol.MAX_RELEASES, False),
    ("chord_reserve", "size"): lambda rng: bad_ints(0, 1 << 20),
    ("enqueue_slot", "job_id"): lambda rng: [*bad_ids(rng), "plain", "sched:one-colon"],
    ("requeue_all_dead", "limit"): lambda rng: bad_ints(1, protocol.MAX_BULK),
    ("promote", "limit"): lambda rng: bad_ints(1, protocol.MAX_BULK),
    ("purge_dead_older", "limit"): lambda rng: bad_ints(1, protocol.MAX_BULK),
    ("requeue_all_dead", "error"): lambda rng: bad_texts(protocol.MAX_SEARCH_TEXT, nil=True,
                                                         empty=False),
    ("jobs", "error"): lambda rng: bad_texts(protocol.MAX_SEARCH_TEXT, nil=True, empty=False),
    ("logs", "after"): lambda rng: bad_ints(0, protocol.MAX_OFFSET),
    # an update's fields are each optional (nil: left as it is)
    ("update", "body"): lambda rng: [v for v in bad_bins(protocol.MAX_BODY_BYTES, True)],
    ("update", "delay_s"): lambda rng: [v for v in bad_numbers(0, protocol.MAX_DELAY_S)
                                        if v is not None],
}


def bad_values(rng: random.Random, op: str, field: str) -> list[Any]:
    """The hostile values of ``op``'s ``field``: each one alone makes the request refused."""
    special = BAD_BY_OP.get((op, field))
    return list(special(rng)) if special is not None else field_bad_values(rng)[field]


TEMPLATES: dict[str, dict[str, Any]] = {
    "enqueue": {"body": b"x", "job_id": "hostile", "delay_s": 0, "priority": 0, "meta": None,
                "dedup_s": 1.0, "group": "g", "expires_s": 1.0, "start_by": None,
                "unique": {"key": "k", "scope": "active"}, "debounce": None},
    "update": {"job_id": "hostile", "body": b"y", "delay_s": 1.0, "run_at": None,
               "priority": 1},
    "enqueue_many": {"items": [{"body": b"x", "job_id": "hostile-m"}]},
    "enqueue_slot": {"body": b"x", "job_id": "sched:hostile:1", "period_s": 60.0},
    "chord_open": {"chord_id": "c", "size": 1, "callback": "idle", "key": "ab" * 16},
    "chord_reserve": {"chord_id": "c", "member_queue": "idle", "size": 1, "key": "ab" * 16},
    "claim": {"workers": ["s"], "node": "h", "park_s": 0, "park_key": "k"},
    "unpark": {"workers": ["s"], "node": "h", "park_key": "k"},
    "settle": {"items": [{"op": "ack", "job_id": "x", "token": "t"}]},
    "ack": {"job_id": "x", "token": "t", "result": None},
    "nack": {"job_id": "x", "token": "t", "error": "e", "traceback": None, "retry_after": 1.0},
    "extend": {"items": [{"job_id": "x", "token": "t"}]},
    "release": {"items": [{"job_id": "x", "token": "t"}]},
    "ping": {}, "stats": {},
    "result": {"job_id": "x"}, "why": {"job_id": "x"}, "logs": {"job_id": "x", "after": 0},
    "dead": {"offset": 0, "limit": 5}, "leases": {"offset": 0, "limit": 5},
    "jobs": {"state": "ready", "where": {"a": 1}, "offset": 0, "limit": 5, "error": "e",
             "worker": "w", "enqueued_after": 0, "enqueued_before": 1e9,
             "finished_after": 0, "finished_before": 1e9},
    "events": {"limit": 5}, "follow": {"ttl_s": 1},
    "workers": {"offset": 0, "limit": 5}, "states": {"job_ids": ["x"]},
    "chord_expects": {"chord_id": "c"}, "resolve": {"prefix": "hostile"},
    "series": {"since": 0, "resolution": "1s", "limit": 5},
    "events_since": {"epoch": None, "after": 0, "limit": 5},
    "requeue_dead": {"job_id": "x"}, "requeue": {"job_id": "x"},
    "purge_dead": {"job_ids": ["x"]}, "pause": {"reason": "r", "by": "b", "group": "g"},
    "resume": {"group": "g"}, "cancel": {"job_id": "x"},
    "requeue_all_dead": {"error": "e", "limit": 5}, "promote": {"job_ids": ["x"], "limit": 5},
    "purge_dead_older": {"older_than_s": 60.0, "limit": 5},
    "batch_open": {"batch_id": "b", "key": "ab" * 16, "description": "d",
                   "callbacks": {"on_success": ["idle", b"\xc0"]},
                   "parent_batch": {"id": "p", "home": "idle", "key": "ab" * 16}},
    "batch_reserve": {"batch_id": "b", "key": "ab" * 16, "kinds": ["on_success"]},
    "batch_add": {"batch_id": "b", "key": "ab" * 16, "member": "m", "member_queue": "idle",
                  "parent": "p"},
    "batch_close": {"batch_id": "b", "key": "ab" * 16},
    "batch_report": {"batch_id": "b", "key": "ab" * 16, "member": "m", "outcome": "done"},
    "batch_status": {"batch_id": "b"}, "batches": {"limit": 5},
    "batch_members": {"batch_id": "b", "state": "done", "limit": 5},
    "dep_watch": {"job_id": "p", "child_queue": "idle", "child_id": "c", "key": "ab" * 16},
    "dep_report": {"child_id": "c", "parent_queue": "idle", "parent_id": "p",
                   "outcome": "done", "key": "ab" * 16},
}
ADMIN_ONLY = ("requeue_dead", "requeue", "purge_dead", "pause", "resume", "cancel",
              "requeue_all_dead", "promote", "purge_dead_older")


def envelope_mutations(rng: random.Random, op: str) -> list[Any]:
    base = {"v": 1, "op": op, **TEMPLATES[op]}
    out: list[Any] = []
    for v in (0, 2, 1.0, True, "1", [1], 2 ** 40, -1, None):
        out.append({**base, "v": v})
    out.append({k: x for k, x in base.items() if k != "v"})
    for bad_op in (1, None, [], "frob", "", op.upper(), "o" * 1000, {"op": op}):
        out.append({**base, "op": bad_op})
    out.append({k: x for k, x in base.items() if k != "op"})
    return out


def raw_frames(rng: random.Random) -> list[bytes]:
    good = codec.encode_message({"v": 1, "op": "enqueue", **TEMPLATES["enqueue"]})
    return [b"", b"\xc1", good[:len(good) // 2], bytes(rng.getrandbits(8) for _ in range(64)),
            msgpack.packb([1, 2, 3]), msgpack.packb("str"), msgpack.packb(None),
            msgpack.packb(7), b"\x00" * (protocol.FRAME_CAP + 1)]


def generate(seed: int, n: int) -> list[bytes]:
    """Every (op, field) bad value, every envelope mutation and raw frame once, then random
    picks among them (with fresh random strings) until ``n`` messages."""
    rng = random.Random(seed)
    out: list[bytes] = []

    def one(op: str, field: str | None, value: Any, drop: bool = False) -> bytes:
        msg = {"v": 1, "op": op, **TEMPLATES[op], "node": f"h{rng.randrange(50)}"}
        if field is not None:
            if drop:
                del msg[field]
            else:
                msg[field] = value
        return codec.encode_message(msg)

    cases: list[tuple[str, str | None, Any, bool]] = []
    for op, template in TEMPLATES.items():
        fields = [f for f in (*template, "node") if op in ("claim", "unpark") or f != "node"]
        if op == "claim":
            fields.append("settle")
        for field in dict.fromkeys(fields):
            for value in bad_values(rng, op, field):
                cases.append((op, field, value, False))
        for field in protocol.SCHEMAS[op]:
            if field.required:
                cases.append((op, field.name, None, True))
    for op, field, value, drop in cases:
        out.append(one(op, field, value, drop))
    for op in TEMPLATES:
        out.extend(codec.encode_message(m) for m in envelope_mutations(rng, op))
    out.extend(raw_frames(rng))
    while len(out) < n:
        pick = rng.random()
        if pick < 0.8:
            op, field, _, drop = rng.choice(cases)
            assert field is not None
            out.append(one(op, field, rng.choice(bad_values(rng, op, field)), drop))
        elif pick < 0.95:
            out.append(codec.encode_message(rng.choice(envelope_mutations(rng,
                                                                          rng.choice(
                                                                              list(TEMPLATES))))))
        else:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200))))
    return out


# -- the test ---------------------------------------------------------------------------------
class OwnerProc:
    def __init__(self, config: dict[str, Any], prefix: str) -> None:
        self.proc = subprocess.Popen([sys.executable, PROC, json.dumps(config), prefix],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ))

    async def line(self) -> str:
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 20)).strip()

    async def rss_kb(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("rss\n")
        self.proc.stdin.flush()
        return int((await self.line()).split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def role_key(base: str, payload: bytes, rng: random.Random | None) -> str:
    """Where a client sends ``payload``: its op's role key under ``base`` (``.../rpc``); with
    ``rng`` (the flood), 1 message in 20 goes to a random role's key instead (refused there
    unless it is the right one), as does one with no readable op (``read`` without ``rng``)."""
    try:
        msg = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:
        msg = None
    op = msg.get("op") if isinstance(msg, dict) else None
    if rng is not None and (not isinstance(op, str) or rng.random() < 0.05):
        return f"{base}/{rng.choice(protocol.ROLES)}"
    return keys.op_key(base, op) if isinstance(op, str) else f"{base}/read"


def check_typed_error(raw: bytes, expected: tuple[str, ...] | None = None) -> str:
    assert len(raw) <= protocol.FRAME_CAP
    reply = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    assert isinstance(reply, dict) and type(reply.get("v")) is int and reply["v"] == 1, reply
    assert reply.get("ok") is False, reply
    assert reply["error"] in protocol.ERROR_CLASSES and isinstance(reply["message"], str), reply
    if expected is not None:
        assert reply["error"] in expected, reply
    return str(reply["error"])


@pytest.mark.slow
async def test_hostile_messages_get_typed_errors_and_known_jobs_survive():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = OwnerProc(configs[0], prefix)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="producer")
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="worker")
    runs: Counter[int] = Counter()
    bodies: dict[int, str] = {}
    release, held = asyncio.Event(), asyncio.Event()

    @worker.worker("q", concurrency=8)
    async def work(job: dict[str, Any]) -> dict[str, Any]:
        if job.get("hold"):
            held.set()
            await release.wait()
            return {"by": "worker"}
        runs[job["i"]] += 1
        bodies[job["i"]] = hashlib.sha256(job["pad"].encode()).hexdigest()
        return {"i": job["i"]}

    @worker.worker("deadq", concurrency=4)
    async def fail(job: dict[str, Any]) -> None:
        raise RuntimeError("dead on purpose")

    rng = random.Random(SEED)
    known = {i: "".join(rng.choice("abcdef") for _ in range(rng.randrange(0, 3000)))
             for i in range(100)}
    known[100] = known[101] = "p" * 700_000  # the named case: two 700 KB jobs, co-claimed
    try:
        assert await owner.line() == "READY"
        async with producer.serving():
            transport = producer.node.transport
            assert transport is not None
            rpc = f"{prefix}/q/q/rpc"
            key_rng = random.Random(SEED + 1)

            async def send(payload: bytes, base: str = rpc, stray: bool = False) -> bytes:
                key = role_key(base, payload, key_rng if stray else None)
                return await transport.query(key, payload, 15.0)

            await wait_until(lambda: _answers(producer), timeout_s=15, what="owner reachable")
            # The 700 KB jobs first, so the worker's first claim of 8 slots meets both.
            for i, pad in sorted(known.items(), key=lambda item: -len(item[1])):
                await producer.enqueue("q", {"i": i, "pad": pad}, job_id=f"known-{i}")
            for n in range(12):  # the named case: twelve 600 KB dead letters
                await producer.enqueue("deadq", {"n": n, "pad": "d" * 600_000})
            rss_before = await owner.rss_kb()
            messages = generate(SEED, N_MESSAGES)
            assert len(messages) >= 5000
            names: Counter[str] = Counter()

            async def flood() -> None:
                for start in range(0, len(messages), 64):
                    replies = await asyncio.gather(
                        *(send(m, stray=True) for m in messages[start:start + 64]))
                    names.update(check_typed_error(r) for r in replies)

            async with worker.serving():  # the known jobs run while the flood goes on
                await asyncio.gather(flood(), wait_for(lambda: len(runs) == len(known), 60,
                                                       "known jobs ran"))
                await named_cases(producer, send, prefix, held, release)
                rss_mid = await owner.rss_kb()
                await flood()  # again: a steady state grows no further
                for i in range(2000):  # fake empty claims from many node ids
                    await send(codec.encode_message({"v": 1, "op": "claim", "workers": ["s"],
                                                     "node": f"fake-{i}"}),
                               f"{prefix}/q/idle/rpc")  # (its role key: rpc/work)
                rss_after = await owner.rss_kb()
                ping = codec.decode_message(await send(codec.encode_message(
                    {"v": 1, "op": "ping"})))
                assert ping["ok"] is True and ping["queue"] == "q"
                dead = await producer.dead_letters("deadq")
                assert sorted(d["data"]["n"] for d in dead) == list(range(12))
        growth, again = rss_after - rss_before, rss_after - rss_mid
        print(f"\nhostile: 2 x {len(messages)} malformed messages -> {dict(names)}; owner RSS "
              f"{rss_before / 1024:.0f} MiB -> {rss_mid / 1024:.0f} MiB after the first flood "
              f"-> {rss_after / 1024:.0f} MiB after the second and 2,000 fake claims "
              f"(+{growth / 1024:.1f} MiB in all, +{again / 1024:.1f} MiB the second time)")
        assert growth < MAX_RSS_GROWTH_KB and again < MAX_RSS_REPEAT_KB
        assert dict(runs) == dict.fromkeys(known, 1)  # every known job ran exactly once
        assert bodies == {i: hashlib.sha256(pad.encode()).hexdigest()
                          for i, pad in known.items()}
    finally:
        owner.stop()


def _answers(app: Istos) -> Any:
    async def probe() -> bool:
        try:
            await app.client("q").call("ping", timeout_s=0.5)
        except Exception:
            return False
        return True
    return probe()


async def wait_for(pred: Any, timeout_s: float, what: str) -> None:
    await wait_until(pred, timeout_s=timeout_s, what=what)


async def named_cases(producer: Istos, send: Any, prefix: str, held: asyncio.Event,
                      release: asyncio.Event) -> None:
    """The cases of the issue, one by one, with the error each must get."""
    def msg(**fields: Any) -> bytes:
        return codec.encode_message({"v": 1, **fields})

    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        ({"op": "enqueue", "body": b"x", "job_id": ["list"]}, ("InvalidJob",)),
        ({"op": "enqueue", "body": b"x", "job_id": ""}, ("InvalidJob",)),
        ({"op": "enqueue", "body": b"x", "job_id": "i" * 1_000_000}, ("InvalidJob",)),
        ({"op": "enqueue", "body": b"x", "job_id": "p", "priority": 2 ** 63}, ("InvalidJob",)),
        ({"op": "enqueue", "body": b"x", "job_id": "m", "meta": deep(1023)}, ("InvalidJob",)),
        ({"op": "enqueue", "body": b"x", "job_id": "c.0", "meta": {"chord": {
            "id": "c", "index": 0, "size": 1, "callback": "idle", "input": 1}}}, ("InvalidJob",)),
        ({"op": "settle", "items": [{"op": "frob", "job_id": "known-0", "token": "t"}]},
         ("ProtocolError",)),
        ({"op": "requeue_dead", "job_id": "x"}, ("AdminDisabled",)),
        ({"op": "jobs", "where": {".".join(["a"] * 50_000): 1}}, ("ProtocolError",)),
    ]
    for fields, expected in cases:
        check_typed_error(await send(msg(**fields)), expected)
    for v in (1.0, True):
        raw = codec.encode_message({"v": v, "op": "ping"})
        check_typed_error(await send(raw), ("ProtocolError",))
    # A forged ack: the lease is listed, its token is not, and guesses are stale.
    jid = await producer.enqueue("q", {"hold": True}, job_id="held")
    await asyncio.wait_for(held.wait(), 10)
    leases = codec.decode_message(await send(msg(op="leases")))["leases"]
    lease = next(item for item in leases if item["job_id"] == jid)
    assert "token" not in lease
    for guess in (f"{jid}.{lease['attempt']}", f"{jid}.1"):
        forged = codec.decode_message(await send(msg(
            op="ack", job_id=jid, token=guess, result=codec.encode_body({"by": "mallory"}))))
        assert forged["status"] == "stale"
        for _ in range(3):
            nack = codec.decode_message(await send(msg(op="nack", job_id=jid, token=guess,
                                                       error="forged")))
            assert nack["status"] == "stale"
    release.set()
    await wait_until(lambda: _result_is(producer, jid), timeout_s=10, what="held job acked")


def _result_is(app: Istos, jid: str) -> Any:
    async def probe() -> bool:
        got = await app.result("q", jid)
        return bool(got["state"] == "done" and got["result"] == {"by": "worker"})
    return probe()


# -- coverage: every op of the protocol has hostile cases ---------------------------------------
def documented_ops() -> set[str]:
    """Every op named in docs/protocol.md's tables (the role table lists each one)."""
    from test_protocol_doc import op_tables, role_table  # (parses the doc; no mesh needed)

    return set(role_table()) | set(op_tables())


def test_every_documented_op_has_hostile_cases_for_every_field():
    ops = documented_ops()
    assert ops >= set(protocol.SCHEMAS), "an op the owner validates is missing from the doc"
    missing = sorted(ops - set(TEMPLATES))
    assert not missing, f"ops without hostile cases (add a TEMPLATES entry): {missing}"
    rng = random.Random(SEED)
    for op in sorted(ops):
        fields = {f.name for f in protocol.SCHEMAS.get(op, ())}
        covered = set(TEMPLATES[op]) | ({"node", "settle"} if op == "claim" else set())
        assert fields <= covered, f"{op}: fields without hostile values: {fields - covered}"
        for field in fields:
            assert bad_values(rng, op, field), (op, field)
    generated = {msg.get("op") for msg in map(_decoded, generate(SEED, 0))
                 if isinstance(msg, dict) and isinstance(msg.get("op"), str)}
    assert ops <= generated, sorted(ops - generated)  # the flood sends each op's cases


def _decoded(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return None
