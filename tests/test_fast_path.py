"""One validation: the owner's fast paths (``protocol.FAST``: the hot ops' usual shape, checked
in one expression) accept only requests their schema accepts, so a request gets the same answer
whichever path it takes. Hypothesis feeds both the same generated requests (decoded from
msgpack, as the owner sees them); the wire tests check the named cases over real Zenoh, and
that ``extend`` checks its log fields as ``settle`` does."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_wire_trust import owner_and_raw, refused

from istos import protocol
from istos.errors import IstosError
from istos.schema import check_fields

ABSENT = object()
BEE = "\U0001f41d"

ints = st.one_of(st.integers(-(2 ** 63), 2 ** 64 - 1), st.sampled_from(
    [-1, 0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 64 - 1, -(2 ** 31)]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, protocol.MAX_DELAY_S, protocol.MAX_DELAY_S + 1]))
junk = st.one_of(st.none(), st.booleans(), ints, floats, st.binary(max_size=8),
                 st.just([]), st.just({}), st.just(["x"]))
short_text = st.text(max_size=12)
boundary_text = st.sampled_from(["", "a", "a" * 1024, "a" * 1025, "\u00e9" * 512, "\u00e9" * 513,
                                 BEE * 256, BEE * 257, "line\nbreak", "\x00", "\x7f", "t-1:x."])
texts = st.one_of(short_text, boundary_text)
lines = st.one_of(st.none(), st.lists(texts, max_size=4),
                  st.lists(st.sampled_from(["a", "\u00e9" * 512]), min_size=99, max_size=101),
                  st.lists(junk, max_size=2), junk)
ids = st.one_of(st.sampled_from(["j1", "a" * 200, "a" * 201, "\u00e9" * 100, "\u00e9" * 101]),
                texts, junk)
tokens = st.one_of(st.sampled_from(["0123abcdef", "t" * 64, "t" * 65, "a.b:c-d_e", "bad token"]),
                   texts, junk)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(ABSENT), strategy)


def usually(valid: Any, other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the usual value (so the fast path gets whole requests to judge), else ``other``."""
    common = st.just(valid)
    return st.one_of(common, common, common, other)


def mapping(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({k: maybe(v) for k, v in fields.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not ABSENT})


settle_fields: dict[str, st.SearchStrategy[Any]] = {
    "op": usually("ack", st.one_of(st.sampled_from(["nack", "frob"]), junk)),
    "job_id": usually("j1", ids), "token": usually("c0ffee", tokens),
    "result": usually(None, st.one_of(st.binary(max_size=4), junk)),
    "error": usually("e", st.one_of(texts, junk)),
    "traceback": usually(None, st.one_of(texts, junk)),
    "retry_after": usually(1.0, st.one_of(floats, ints, junk)),
    "logs": usually(["x"], lines), "logs_at": usually(0, st.one_of(ints, junk)),
    "logs_dropped": usually(0, st.one_of(ints, junk)),
    "progress": usually(0.5, floats), "note": usually("n", texts)}
settle_items = mapping(settle_fields)
enqueue_fields: dict[str, st.SearchStrategy[Any]] = {
    "body": usually(b"x", st.one_of(st.binary(max_size=4), junk)), "job_id": usually("j1", ids),
    "delay_s": st.one_of(floats, ints, junk), "priority": st.one_of(ints, junk),
    "dedup_s": st.one_of(floats, junk), "group": st.one_of(texts, st.just("g" * 129), junk)}
claim_fields: dict[str, st.SearchStrategy[Any]] = {
    "workers": usually(["s"], st.one_of(st.lists(ids, max_size=3), junk)),
    "node": st.one_of(texts, junk),
    "settle": st.one_of(st.lists(settle_items, max_size=2), junk),
    "park_s": st.one_of(floats, ints, junk), "park_key": usually("c0ffee", tokens)}
ack_fields: dict[str, st.SearchStrategy[Any]] = {
    "job_id": usually("j1", ids), "token": usually("c0ffee", tokens),
    "result": st.one_of(st.binary(max_size=4), junk)}
nack_fields: dict[str, st.SearchStrategy[Any]] = {
    "job_id": usually("j1", ids), "token": usually("c0ffee", tokens),
    "error": st.one_of(texts, junk), "traceback": st.one_of(texts, junk),
    "retry_after": st.one_of(floats, ints, junk)}
REQUESTS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "settle": mapping({"items": st.one_of(*[st.lists(settle_items, min_size=1, max_size=3)] * 3,
                                          junk)}),
    "claim": mapping({
        "workers": usually(["s"], st.one_of(st.lists(ids, max_size=3), junk)),
    "node": st.one_of(texts, junk),
        "settle": st.one_of(st.lists(settle_items, max_size=2), junk),
        "park_s": st.one_of(floats, ints, junk), "park_key": usually("c0ffee", tokens)}),
    "ack": mapping({"job_id": usually("j1", ids), "token": usually("c0ffee", tokens),
                    "result": st.one_of(st.binary(max_size=4), junk)}),
    "nack": mapping({"job_id": usually("j1", ids), "token": usually("c0ffee", tokens),
                     "error": st.one_of(texts, junk),
                     "traceback": st.one_of(texts, junk),
                     "retry_after": st.one_of(floats, ints, junk)}),
    "enqueue": mapping({**enqueue_fields, "meta": st.one_of(st.none(), junk)}),
    "enqueue_many": mapping({"items": st.one_of(
        st.lists(mapping(enqueue_fields), max_size=3), junk)}),
}


def as_received(op: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The request as the owner decodes it off the wire (None: it cannot be encoded)."""
    try:
        raw = msgpack.packb({"v": 1, "op": op, **fields}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return None
    msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    assert isinstance(msg, dict)
    return msg


def schema_accepts(msg: dict[str, Any]) -> bool:
    try:
        check_fields(msg, protocol.SCHEMAS[msg["op"]])
    except IstosError:
        return False
    return True


def same_answer(op: str, fields: dict[str, Any]) -> None:
    msg = as_received(op, fields)
    if msg is None:
        return
    fast = protocol.FAST[op](msg)
    schema = schema_accepts(msg)
    assert schema or not fast, f"the fast path accepts what the schema refuses: {msg!r}"[:600]
    try:
        protocol.check_request(msg, lambda _: True)
        whole = True
    except IstosError:
        whole = False
    assert whole == schema


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(REQUESTS)).flatmap(
    lambda op: st.tuples(st.just(op), REQUESTS[op])))
def test_every_fast_path_accepts_only_what_its_schema_accepts(case: tuple[str, dict[str, Any]]):
    same_answer(*case)


BASES: dict[str, dict[str, Any]] = {  # a usual, valid request of each op with a fast path
    "settle": {"items": [{"op": "ack", "job_id": "j1", "token": "c0ffee"}]},
    "claim": {"workers": ["s"], "node": "n", "park_s": 1.0,
              "settle": [{"op": "nack", "job_id": "j1", "token": "c0ffee"}]},
    "ack": {"job_id": "j1", "token": "c0ffee", "result": b"r"},
    "nack": {"job_id": "j1", "token": "c0ffee", "error": "e"},
    "enqueue": {"body": b"x", "job_id": "j1"},
    "enqueue_many": {"items": [{"body": b"x", "job_id": "j1"}]},
}
NESTED = {"settle": "items", "claim": "settle", "enqueue_many": "items"}
ITEM_FIELDS = {"settle": settle_fields, "claim": settle_fields, "enqueue_many": enqueue_fields}
TOP_FIELDS = {"claim": claim_fields, "ack": ack_fields, "nack": nack_fields,
              "enqueue": {**enqueue_fields, "meta": st.one_of(st.none(), junk)}}


@st.composite
def one_field_off(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A usual request with one field (of the request or of its first item) set to a drawn
    value: the divergences hide there, where everything else is on the fast path."""
    op = draw(st.sampled_from(sorted(BASES)))
    fields = {k: (list(v) if isinstance(v, list) else v) for k, v in BASES[op].items()}
    nested = NESTED.get(op)
    choices = [("item", name) for name in ITEM_FIELDS.get(op, {})] + \
        [("top", name) for name in TOP_FIELDS.get(op, {})]
    where, name = draw(st.sampled_from(choices))
    if where == "item":
        assert nested is not None
        item = dict(fields[nested][0])
        item[name] = draw(ITEM_FIELDS[op][name])
        fields[nested] = [item]
    else:
        fields[name] = draw(TOP_FIELDS[op][name])
    return op, fields


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_field_off())
def test_a_request_one_field_off_the_usual_gets_one_answer(case: tuple[str, dict[str, Any]]):
    same_answer(*case)


def test_the_generators_reach_both_answers_on_every_fast_path():
    assert set(REQUESTS) == set(protocol.FAST)
    accepted = {"settle": {"items": [{"op": "ack", "job_id": "j", "token": "t"}]},
                "claim": {"workers": ["s"]}, "ack": {"job_id": "j", "token": "t"},
                "nack": {"job_id": "j", "token": "t"}, "enqueue": {"body": b"x"},
                "enqueue_many": {"items": [{"body": b"x", "job_id": "j"}]}}
    for op, fields in accepted.items():
        msg = as_received(op, fields)
        assert msg is not None and protocol.FAST[op](msg) and schema_accepts(msg)


def test_the_named_cases_get_one_answer():
    item = {"op": "ack", "job_id": "j", "token": "t"}
    for extra in ({"logs_at": -1}, {"logs_dropped": 2 ** 64 - 1}, {"logs_at": 2 ** 31},
                  {"logs": ["x"], "logs_at": -1}, {"logs": ["\u00e9"], "logs_at": -1}):
        msg = as_received("settle", {"items": [{**item, **extra}]})
        assert msg is not None and not protocol.FAST["settle"](msg) and not schema_accepts(msg)
    for nil in ({"retry_after": None}, ):  # nil is "none chosen" on both paths
        for op, fields in (("settle", {"items": [{**item, "op": "nack", **nil}]}),
                           ("nack", {"job_id": "j", "token": "t", **nil})):
            msg = as_received(op, fields)
            assert msg is not None and protocol.FAST[op](msg) and schema_accepts(msg)
    for nil in ({"dedup_s": None}, {"group": None}):
        msg = as_received("enqueue", {"body": b"x", "job_id": "j", **nil})
        assert msg is not None and protocol.FAST["enqueue"](msg) and schema_accepts(msg)


# -- over the wire ------------------------------------------------------------------------------
async def test_settle_refuses_bad_log_counts_whatever_its_lines_and_extend_checks_its_logs():
    async with owner_and_raw("q") as (owner, raw):
        await raw.op("q", "produce", "enqueue", body=b"\x90", job_id="j")
        claim = await raw.op("q", "work", "claim", workers=["s"], node="n")
        token = claim["jobs"][0]["token"]
        lease = {"job_id": "j", "token": token}
        for line in ("ascii", "\u00e9t\u00e9"):  # the fast path's shape and the schema's
            for bad in ({"logs_at": -1}, {"logs_dropped": 2 ** 64 - 1}):
                reply = await raw.op("q", "work", "settle", items=[
                    {"op": "ack", **lease, "logs": [line], **bad}])
                refused(reply, "ProtocolError", "between 0 and 2147483647")
        bad_logs: list[dict[str, Any]] = [
            {"logs": True}, {"logs": float("nan")}, {"logs": "x" * 100_000},
            {"logs": ["x"] * 10_000}, {"logs": [[[["x"]]]]}, {"logs": ["x" * 1025]},
            {"logs": [1]}, {"logs_at": -1}, {"logs_at": True}, {"logs_at": 2 ** 31},
            {"logs_dropped": -1}, {"logs_dropped": 2 ** 64 - 1}, {"logs_dropped": 1.5},
            {"logs_at": None}]
        for bad in bad_logs:
            reply = await raw.op("q", "work", "extend", items=[{**lease, **bad}])
            refused(reply, "ProtocolError", "items[0].logs")
        why = await raw.op("q", "read", "why", job_id="j")
        assert why["why"]["state"] == "leased" and "logs" not in why["why"]["job"]["history"][-1]
        ok = await raw.op("q", "work", "extend", items=[
            {**lease, "logs": ["one", "\u00e9"], "logs_at": 0, "logs_dropped": 0}])
        assert ok["statuses"] == ["ok"]
        done = await raw.op("q", "work", "settle", items=[
            {"op": "nack", **lease, "retry_after": None, "logs": ["two"], "logs_at": 2}])
        assert done["statuses"] == ["ok"]
        logs = await raw.op("q", "read", "logs", job_id="j")
        assert logs["attempts"][0]["logs"] == ["one", "\u00e9", "two"]
