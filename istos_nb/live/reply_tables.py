"""DataFrames and dicts of a live queue, as :class:`istos_nb.live.attach.LiveQueue` returns them.

The owner speaks epoch seconds (floats); people read dates. Every instant in a live frame is a
timezone-aware pandas datetime in UTC (``datetime64[ns, UTC]``, ``NaT`` when absent) and every
duration a ``Timedelta``. Every frame has fixed columns and dtypes, also without rows.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from istos import codec
from istos.errors import PayloadCodecError
from istos.ops.render import duration, history_of, latest_traceback
from istos.payload import CodecChain, describe

from ..data.frames import events_frame

JOB_COLUMNS = {"job_id": object, "state": object, "priority": "int64", "attempts": "int64",
               "enqueued_at": "instant", "ready_at": "instant", "worker": object,
               "deadline": "instant", "last_error": object, "data": object,
               "progress": "float64", "progress_note": object}
LEASE_COLUMNS = {"job_id": object, "worker": object, "deadline": "instant", "attempt": "int64"}
DEAD_COLUMNS = {"job_id": object, "data": object, "attempts": "int64", "last_error": object,
                "history": object, "finished_at": "instant", "traceback": object}
ATTEMPT_COLUMNS = {"attempt": "int64", "worker": object, "claimed_at": "instant",
                   "finished_at": "instant", "outcome": object, "error": object,
                   "backoff": "duration", "traceback": object}
WORKER_COLUMNS = {"worker": object, "node": object, "slots": "Int64", "concurrency": "Int64",
                  "prefetch": "Int64", "heartbeat": "boolean", "held_count": "int64",
                  "held": object, "first_seen": "instant", "last_seen": "instant",
                  "claimed": "int64", "acked": "int64", "nacked": "int64", "expired": "int64",
                  "released": "int64"}
_EVENT_INSTANTS = ("t", "ready_at", "deadline")


def instant(value: Any) -> pd.Timestamp | Any:
    """Epoch seconds as a UTC Timestamp (``NaT`` for None/NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return pd.NaT
    return pd.Timestamp(float(value), unit="s", tz="UTC")


INSTANT = "datetime64[ns, UTC]"
DURATION = "timedelta64[ns]"


def instants(seconds: Any) -> pd.Series:
    """Epoch seconds (floats, NaN for none) as a ``datetime64[ns, UTC]`` Series."""
    return pd.to_datetime(pd.Series(seconds, dtype="float64"), unit="s", utc=True).astype(INSTANT)


def durations(seconds: Any) -> pd.Series:
    """Seconds (floats, NaN for none) as a ``timedelta64[ns]`` Series."""
    return pd.to_timedelta(pd.Series(seconds, dtype="float64"), unit="s").astype(DURATION)


def _column(values: list[Any], dtype: Any) -> pd.Series:
    if dtype == "instant":
        return instants(values)
    if dtype == "duration":
        return durations(values)
    return pd.Series(values, dtype=dtype)


def table(columns: dict[str, Any], rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A frame with fixed columns and dtypes from owner rows (epoch seconds become instants)."""
    return pd.DataFrame({name: _column([r.get(name) for r in rows], dtype)
                         for name, dtype in columns.items()}, columns=list(columns))


def decode(raw: Any, payload: CodecChain | None = None) -> Any:
    """A job body for display: decoded msgpack, or the raw bytes if it is not msgpack. A body
    encoded by payload codecs is decoded by ``payload`` when it can, else shown as what it is
    encoded with (``"<encoded: zlib, aes-gcm (312 bytes)>"``), never as bytes or a guess."""
    if not isinstance(raw, bytes):
        return raw
    encoded = describe(raw)
    if encoded is not None:
        try:
            return (payload or CodecChain()).decode_body(raw)
        except PayloadCodecError:
            return f"<{encoded}>"
    try:
        return codec.decode_body(raw)
    except Exception:  # msgpack raises several unrelated types; show the bytes instead
        return raw


def jobs_table(rows: list[dict[str, Any]], payload: CodecChain | None = None) -> pd.DataFrame:
    return table(JOB_COLUMNS, [{**r, "data": decode(r.get("body"), payload)} for r in rows])


def dead_table(rows: list[dict[str, Any]], payload: CodecChain | None = None) -> pd.DataFrame:
    """Dead letters; ``history`` holds one dict per attempt, its instants as Timestamps (the
    same attempts as a frame: :func:`attempts_table`, or ``LiveQueue.job(id)["attempts"]``)."""
    return table(DEAD_COLUMNS, [{**d, "data": decode(d.get("body"), payload),
                                 "traceback": latest_traceback(d.get("history") or []),
                                 "history": [_readable_attempt(a) for a in d.get("history") or []]}
                                for d in rows])


def _readable_attempt(a: dict[str, Any]) -> dict[str, Any]:
    return {**a, "claimed_at": instant(a.get("claimed_at")),
            "finished_at": instant(a.get("finished_at"))}


def workers_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The owner's workers table (``prefetch`` -1: automatic; unknown fields are NA)."""
    return table(WORKER_COLUMNS, rows)


def attempts_table(history: list[dict[str, Any]]) -> pd.DataFrame:
    """A job's attempt history (the owner's records): one row per delivery."""
    return table(ATTEMPT_COLUMNS, [{**a, "backoff": a.get("backoff_s")} for a in history])


def live_events(events: list[dict[str, Any]]) -> pd.DataFrame:
    """:func:`istos_nb.data.frames.events_frame` with ``t``/``ready_at``/``deadline`` as UTC
    instants and ``delay_s`` as a Timedelta (``frames`` and ``charts`` accept both forms)."""
    df = events_frame(events)
    for name in _EVENT_INSTANTS:
        df[name] = instants(df[name].to_numpy())
    df["delay_s"] = durations(df["delay_s"].to_numpy())
    return df


def ago(seconds: float) -> str:
    """A duration in words, coarse like a person says it: "2.0 s", "3 min", "1.5 h", "2 d"
    (the CLI's wording: :func:`istos.ops.render.duration`)."""
    return duration(seconds)


def _add_details(out: dict[str, Any], why: dict[str, Any]) -> None:
    """The latest ``traceback``, a done job's ``result`` decoded, the workflow's jobs as a
    frame (index, queue, job_id, state)."""
    flow = out.get("workflow")
    if isinstance(flow, dict) and "jobs" in flow:
        out["workflow"] = {**flow, "jobs": pd.DataFrame(
            flow["jobs"], columns=["index", "queue", "job_id", "state"])}
    tb = latest_traceback(history_of(why))
    if tb is not None:
        out["traceback"] = tb
    if out.get("state") == "done":
        out["result"] = decode(out.get("result"))


def readable_why(why: dict[str, Any], payload: CodecChain | None = None) -> dict[str, Any]:
    """The owner's ``why`` with instants as Timestamps, the dead letter's body decoded, and the
    reason in relative times ("leased by w1 for 2.0 s more", "dead since 3 min")."""
    out = dict(why)
    now = out.pop("now", None)
    job = out.pop("job", None)
    state, until = out.get("state"), out.get("until")
    if now is not None and until is not None:
        left = ago(float(until) - float(now))
        if state == "leased":
            out["reason"] = f"leased by {out.get('worker')} for {left} more"
        elif state == "delayed" and out.get("attempts") and out.get("last_error"):
            out["reason"] = (f"backing off after attempt {out['attempts']} failed with "
                             f"{out['last_error']!r}; eligible again in {left}")
        elif state == "delayed":
            out["reason"] = f"delayed by the producer; eligible in {left}"
        elif state == "done":
            out["reason"] = f"done; result kept for {left} more"
    _add_details(out, why)
    dead = out.get("dead_letter")
    if isinstance(dead, dict):
        dead = {k: v for k, v in dead.items() if k != "body"} \
            | {"data": decode(dead.get("body"), payload)}
        finished = dead.get("finished_at")
        if now is not None and finished is not None:
            out["reason"] = f"{out.get('reason')} (dead since {ago(float(now) - finished)})"
        dead["finished_at"] = instant(finished)
        dead["history"] = [_readable_attempt(a) for a in dead.get("history") or []]
        out["dead_letter"] = dead
    if until is not None:
        out["until"] = instant(until)
    if job is not None:
        out["_job"] = job  # for LiveQueue.job(); removed by why()
    return out
