"""istos_nb.data.frames: exact rows for a hand-written stream that covers every outcome.

The stream (queue "q", three worker slots on two nodes):
  A  acked on the first try
  B  nacked, retried after 1.0 s, acked
  C  lease expired (its node n2 crashed), redelivered at once, acked
  D  nacked twice -> dead-lettered (max attempts 2)
  E  enqueued with a 20 s delay: still delayed when the stream ends
  F  enqueued with a 0.5 s delay that ends inside the stream: ready
  G  claimed and never finished: an open lease
  H  lease expired although the worker finished (its ack was lost); redelivered and acked, and
     the first worker's re-sent ack arrives late too: acked twice
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from istos.events import JobEvent
from istos_nb.data.frames import (
    attempts_frame,
    depth_frame,
    events_frame,
    jobs_frame,
    leases_frame,
    node_events_frame,
    throughput_frame,
    worker_node,
)

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

W0, W1, W2 = "n1:work#0", "n1:work#1", "n2:work#0"
NAN = math.nan


def e(t: float, kind: str, job: str = "", attempt: int = 0, worker: str | None = None,
      node: str = "n0", queue: str = "q", **detail: Any) -> JobEvent:
    return JobEvent(t=t, node=node, queue=queue, job_id=job, kind=kind, attempt=attempt,
                    worker=worker, detail=detail)


def enq(t: float, job: str, priority: int = 0, delay_s: float = 0.0) -> JobEvent:
    return e(t, "enqueued", job, priority=priority, delay_s=delay_s, ready_at=t + delay_s)


def claim(t: float, job: str, attempt: int, worker: str, lease_s: float = 30.0) -> JobEvent:
    return e(t, "claimed", job, attempt, worker, deadline=t + lease_s, lease_s=lease_s)


def retry(t: float, job: str, attempt: int, delay_s: float, error: str | None) -> JobEvent:
    return e(t, "retry_scheduled", job, attempt, delay_s=delay_s, ready_at=t + delay_s,
             error=error)


def scenario(offset: float = 0.0) -> list[JobEvent]:
    """The stream described in the module docstring, every ``t`` shifted by ``offset``."""
    events = [
        e(0.0, "owner_up"),
        enq(0.0, "A"), enq(0.2, "D"), enq(0.5, "B", priority=5),
        claim(1.0, "A", 1, W0), enq(1.0, "C"),
        claim(1.5, "B", 1, W1),
        e(2.0, "acked", "A", 1, W0),
        claim(2.0, "C", 1, W2, lease_s=5.0),
        claim(2.2, "D", 1, W0),
        e(2.4, "nacked", "D", 1, W0, error="bad input"), retry(2.4, "D", 1, 1.2, "bad input"),
        e(2.5, "nacked", "B", 1, W1, error="boom"), retry(2.5, "B", 1, 1.0, "boom"),
        e(3.0, "crashed", node="n2", queue=""),
        enq(3.0, "E", delay_s=20.0),
        claim(4.0, "B", 2, W1), claim(4.5, "D", 2, W0),
        e(4.6, "nacked", "D", 2, W0, error="bad input again"),
        e(4.6, "dead_lettered", "D", 2, error="bad input again"),
        e(5.0, "acked", "B", 2, W1),
        enq(5.5, "F", priority=1, delay_s=0.5),
        e(7.0, "lease_expired", "C", 1, W2, deadline=7.0), retry(7.0, "C", 1, 0.0, None),
        claim(7.5, "C", 2, W0), e(8.0, "acked", "C", 2, W0),
        e(8.5, "restarted", node="n2", queue=""),
        enq(9.0, "G"), claim(9.5, "G", 1, W1),
        enq(10.0, "H"), claim(10.0, "H", 1, W2, lease_s=2.0),
        e(10.2, "duplicate_enqueue", "H"),
        e(12.0, "lease_expired", "H", 1, W2, deadline=12.0), retry(12.0, "H", 1, 0.0, None),
        claim(12.5, "H", 2, W0),
        e(13.0, "acked", "H", 1, W2), e(13.5, "acked", "H", 2, W0),
    ]
    if not offset:
        return events
    shifted = []
    for ev in events:
        detail = {k: (v + offset if k in ("ready_at", "deadline") else v)
                  for k, v in ev.detail.items()}
        shifted.append(JobEvent(ev.t + offset, ev.node, ev.queue, ev.job_id, ev.kind,
                                ev.attempt, ev.worker, detail))
    return shifted


EVENTS = scenario()

JOB_COLS = [("job_id", object), ("queue", object), ("state", object), ("attempts", "int64"),
            ("deliveries", "int64"), ("enqueued_at", "float64"), ("finished_at", "float64"),
            ("last_error", object), ("priority", "Int64"), ("acks", "int64"),
            ("duplicated", "bool"), ("progress", "float64"), ("progress_note", object)]
LEASE_COLS = [("job_id", object), ("queue", object), ("attempt", "int64"), ("worker", object),
              ("node", object), ("start", "float64"), ("end", "float64"),
              ("deadline", "float64"), ("outcome", object), ("error", object),
              ("renewals", "int64")]
ATTEMPT_COLS = [("job_id", object), ("attempt", "int64"), ("claimed_at", "float64"),
                ("finished_at", "float64"), ("outcome", object), ("error", object),
                ("backoff_s", "float64"), ("waited_s", "float64")]
DEPTH_COLS = [("t", "float64")] + [(c, "int64") for c in
                                   ("ready", "leased", "delayed", "dead", "done", "waiting")]
THROUGHPUT_COLS = [("t", "float64")] + [(c, "int64") for c in
                                        ("acked", "nacked", "expired", "dead_lettered",
                                         "enqueued")]
NODE_COLS = [("t", "float64"), ("node", object), ("kind", object)]
EVENT_COLUMNS = ["t", "node", "queue", "job_id", "kind", "attempt", "worker", "detail", "error",
                 "delay_s", "ready_at", "deadline", "priority"]


def no_waiting(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Depth rows of a stream without dependencies: its ``waiting`` count stays 0."""
    return [(*row, 0) for row in rows]


def expected(cols: list[tuple[str, Any]], rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """Build the expected frame column by column so None stays None in object columns."""
    return pd.DataFrame({
        name: pd.Series([row[i] for row in rows], dtype=dtype)
        for i, (name, dtype) in enumerate(cols)
    })


# --- events_frame -----------------------------------------------------------------------------

def test_events_frame_columns_and_flattened_detail() -> None:
    df = events_frame(EVENTS)
    assert list(df.columns) == EVENT_COLUMNS
    assert len(df) == len(EVENTS)
    retry_d = df[(df["job_id"] == "D") & (df["kind"] == "retry_scheduled")].iloc[0]
    assert (retry_d["t"], retry_d["attempt"], retry_d["error"]) == (2.4, 1, "bad input")
    assert retry_d["delay_s"] == pytest.approx(1.2)
    assert retry_d["ready_at"] == pytest.approx(3.6)
    assert retry_d["detail"] == {"delay_s": 1.2, "ready_at": 2.4 + 1.2, "error": "bad input"}
    enq_b = df[(df["job_id"] == "B") & (df["kind"] == "enqueued")].iloc[0]
    assert enq_b["priority"] == 5
    claim_c = df[(df["job_id"] == "C") & (df["kind"] == "claimed")].iloc[0]
    assert (claim_c["worker"], claim_c["deadline"]) == (W2, 7.0)
    assert pd.isna(claim_c["priority"]) and claim_c["error"] is None
    crash = df[df["kind"] == "crashed"].iloc[0]
    assert (crash["node"], crash["queue"], crash["job_id"]) == ("n2", "", "")


def test_events_frame_sorts_by_t_keeping_input_order_for_ties() -> None:
    shuffled = [e(2.0, "acked", "x"), e(1.0, "enqueued", "a"), e(1.0, "enqueued", "b"),
                e(0.5, "owner_up"), e(1.0, "enqueued", "c")]
    df = events_frame(shuffled)
    assert df["t"].tolist() == [0.5, 1.0, 1.0, 1.0, 2.0]
    assert df["job_id"].tolist() == ["", "a", "b", "c", "x"]
    assert df.index.tolist() == [0, 1, 2, 3, 4]


def test_every_input_form_gives_the_same_frames() -> None:
    reference = events_frame(EVENTS)
    dicts = [ev.to_dict() for ev in EVENTS]
    with_detail = pd.DataFrame(dicts)
    flattened = reference.drop(columns=["detail"])  # detail fields only as flat columns
    cols = [c for c in EVENT_COLUMNS if c != "detail"]
    forms = {"dicts": lambda: dicts, "generator": lambda: (ev for ev in EVENTS),
             "frame with detail": lambda: with_detail, "normalised": lambda: reference,
             "flattened": lambda: flattened}
    for name, form in forms.items():
        pd.testing.assert_frame_equal(events_frame(form())[cols], reference[cols], obj=name)
        pd.testing.assert_frame_equal(jobs_frame(form()), jobs_frame(EVENTS), obj=name)
        pd.testing.assert_frame_equal(leases_frame(form()), leases_frame(EVENTS), obj=name)
        pd.testing.assert_frame_equal(depth_frame(form()), depth_frame(EVENTS), obj=name)
    pd.testing.assert_frame_equal(events_frame(with_detail), reference)


def test_events_frame_rejects_what_it_cannot_read() -> None:
    with pytest.raises(TypeError):
        events_frame([1, 2])
    with pytest.raises(ValueError, match="kind"):
        events_frame([{"t": 1.0, "job_id": "a"}])
    with pytest.raises(ValueError, match="kind"):
        events_frame(pd.DataFrame({"t": [1.0]}))


# --- per-job frames ---------------------------------------------------------------------------

def test_jobs_frame_exact() -> None:
    want = expected(JOB_COLS, [
        ("A", "q", "done", 1, 1, 0.0, 2.0, None, 0, 1, False, NAN, None),
        ("D", "q", "dead", 2, 2, 0.2, 4.6, "bad input again", 0, 0, False, NAN, None),
        ("B", "q", "done", 2, 2, 0.5, 5.0, "boom", 5, 1, False, NAN, None),
        ("C", "q", "done", 2, 2, 1.0, 8.0, None, 0, 1, False, NAN, None),
        ("E", "q", "delayed", 0, 0, 3.0, NAN, None, 0, 0, False, NAN, None),
        ("F", "q", "ready", 0, 0, 5.5, NAN, None, 1, 0, False, NAN, None),
        ("G", "q", "leased", 1, 1, 9.0, NAN, None, 0, 0, False, NAN, None),
        ("H", "q", "done", 2, 2, 10.0, 13.0, None, 0, 2, True, NAN, None),
    ])
    pd.testing.assert_frame_equal(jobs_frame(EVENTS), want)


def test_leases_frame_exact() -> None:
    want = expected(LEASE_COLS, [
        ("A", "q", 1, W0, "n1", 1.0, 2.0, 31.0, "acked", None, 0),
        ("B", "q", 1, W1, "n1", 1.5, 2.5, 31.5, "nacked", "boom", 0),
        ("C", "q", 1, W2, "n2", 2.0, 7.0, 7.0, "expired", None, 0),
        ("D", "q", 1, W0, "n1", 2.2, 2.4, 32.2, "nacked", "bad input", 0),
        ("B", "q", 2, W1, "n1", 4.0, 5.0, 34.0, "acked", None, 0),
        ("D", "q", 2, W0, "n1", 4.5, 4.6, 34.5, "nacked", "bad input again", 0),
        ("C", "q", 2, W0, "n1", 7.5, 8.0, 37.5, "acked", None, 0),
        ("G", "q", 1, W1, "n1", 9.5, NAN, 39.5, "open", None, 0),
        # H's first lease stays "expired": the late ack at 13.0 does not rewrite it.
        ("H", "q", 1, W2, "n2", 10.0, 12.0, 12.0, "expired", None, 0),
        ("H", "q", 2, W0, "n1", 12.5, 13.5, 42.5, "acked", None, 0),
    ])
    pd.testing.assert_frame_equal(leases_frame(EVENTS), want)


def test_attempts_frame_exact() -> None:
    want = expected(ATTEMPT_COLS, [
        ("A", 1, 1.0, 2.0, "acked", None, NAN, NAN),
        ("B", 1, 1.5, 2.5, "nacked", "boom", NAN, NAN),
        ("C", 1, 2.0, 7.0, "expired", None, NAN, NAN),
        ("D", 1, 2.2, 2.4, "nacked", "bad input", NAN, NAN),
        ("B", 2, 4.0, 5.0, "acked", None, 1.0, 1.5),
        ("D", 2, 4.5, 4.6, "nacked", "bad input again", 1.2, 2.1),
        ("C", 2, 7.5, 8.0, "acked", None, 0.0, 0.5),
        ("G", 1, 9.5, NAN, "open", None, NAN, NAN),
        ("H", 1, 10.0, 12.0, "expired", None, NAN, NAN),
        ("H", 2, 12.5, 13.5, "acked", None, 0.0, 0.5),
    ])
    pd.testing.assert_frame_equal(attempts_frame(EVENTS), want)


def test_frames_keep_epoch_times_as_given() -> None:
    base = 1_700_000_000.0
    live = scenario(offset=base)
    jobs = jobs_frame(live)
    assert jobs["enqueued_at"].tolist()[:3] == [base + 0.0, base + 0.2, base + 0.5]
    assert jobs["state"].tolist() == jobs_frame(EVENTS)["state"].tolist()
    att = attempts_frame(live)
    assert att["waited_s"].fillna(-1).tolist() == pytest.approx(
        attempts_frame(EVENTS)["waited_s"].fillna(-1).tolist(), abs=1e-6)


# --- queue-level frames -----------------------------------------------------------------------

def test_depth_frame_exact() -> None:
    want = expected(DEPTH_COLS, no_waiting([
        (0.0, 1, 0, 0, 0, 0), (0.2, 2, 0, 0, 0, 0), (0.5, 3, 0, 0, 0, 0),
        (1.0, 3, 1, 0, 0, 0), (1.5, 2, 2, 0, 0, 0), (2.0, 1, 2, 0, 0, 1),
        (2.2, 0, 3, 0, 0, 1), (2.4, 0, 2, 1, 0, 1), (2.5, 0, 1, 2, 0, 1),
        (3.0, 0, 1, 3, 0, 1),
        (3.5, 1, 1, 2, 0, 1),  # B's retry delay ends: an implicit transition, no event
        (3.6, 2, 1, 1, 0, 1),  # D's retry delay ends
        (4.0, 1, 2, 1, 0, 1), (4.5, 0, 3, 1, 0, 1), (4.6, 0, 2, 1, 1, 1),
        (5.0, 0, 1, 1, 1, 2), (5.5, 0, 1, 2, 1, 2),
        (6.0, 1, 1, 1, 1, 2),  # F's enqueue delay ends
        (7.0, 2, 0, 1, 1, 2), (7.5, 1, 1, 1, 1, 2), (8.0, 1, 0, 1, 1, 3),
        (9.0, 2, 0, 1, 1, 3), (9.5, 1, 1, 1, 1, 3), (10.0, 1, 2, 1, 1, 3),
        (12.0, 2, 1, 1, 1, 3), (12.5, 1, 2, 1, 1, 3), (13.0, 1, 1, 1, 1, 4),
    ]))
    pd.testing.assert_frame_equal(depth_frame(EVENTS), want)


def test_depth_final_row_matches_job_states() -> None:
    last = depth_frame(EVENTS).iloc[-1]
    states = jobs_frame(EVENTS)["state"].value_counts()
    for state in ("ready", "leased", "delayed", "dead", "done"):
        assert last[state] == states.get(state, 0), state


def test_depth_counts_jobs_waiting_for_their_parents() -> None:
    events = [
        e(0.0, "waiting", "C"), e(0.0, "waiting", "D"), enq(0.5, "P"),
        claim(1.0, "P", 1, W0), e(2.0, "acked", "P", 1, W0),
        e(2.5, "unblocked", "C", delay_s=0.0, ready_at=2.5),  # its parent is done
        e(3.0, "cancelled", "D"),  # cancelled while it waited
        claim(4.0, "C", 1, W1),
    ]
    want = expected(DEPTH_COLS, [
        (0.0, 0, 0, 0, 0, 0, 2), (0.5, 1, 0, 0, 0, 0, 2), (1.0, 0, 1, 0, 0, 0, 2),
        (2.0, 0, 0, 0, 0, 1, 2), (2.5, 1, 0, 0, 0, 1, 1), (3.0, 1, 0, 0, 0, 1, 0),
        (4.0, 0, 1, 0, 0, 1, 0),
    ])
    pd.testing.assert_frame_equal(depth_frame(events), want)
    waiting_now = depth_frame(events[:3]).iloc[-1]["waiting"]
    assert waiting_now == (jobs_frame(events[:3])["state"] == "waiting").sum() == 2


def test_purged_and_expired_jobs_leave_dead_and_done() -> None:
    events = [
        enq(0.0, "J"), claim(1.0, "J", 1, W0), e(2.0, "nacked", "J", 1, W0, error="x"),
        e(2.0, "dead_lettered", "J", 1, error="x"), e(3.0, "purged", "J", 1),
        enq(4.0, "K"), claim(5.0, "K", 1, W1), e(6.0, "acked", "K", 1, W1),
        e(7.0, "result_expired", "K", 1),
    ]
    assert jobs_frame(events)["state"].tolist() == ["purged", "expired"]
    assert jobs_frame(events)["finished_at"].tolist() == [2.0, 6.0]
    want = expected(DEPTH_COLS, no_waiting([
        (0.0, 1, 0, 0, 0, 0), (1.0, 0, 1, 0, 0, 0), (2.0, 0, 0, 0, 1, 0),
        (3.0, 0, 0, 0, 0, 0), (4.0, 1, 0, 0, 0, 0), (5.0, 0, 1, 0, 0, 0),
        (6.0, 0, 0, 0, 0, 1), (7.0, 0, 0, 0, 0, 0),
    ]))
    pd.testing.assert_frame_equal(depth_frame(events), want)


def test_delay_ending_exactly_at_the_last_event_counts_as_ready() -> None:
    events = [enq(0.0, "late", delay_s=6.0), enq(1.0, "due", delay_s=4.0), e(5.0, "owner_down")]
    assert jobs_frame(events)["state"].tolist() == ["delayed", "ready"]
    want = expected(DEPTH_COLS, no_waiting([(0.0, 0, 0, 1, 0, 0), (1.0, 0, 0, 2, 0, 0),
                                 (5.0, 1, 0, 1, 0, 0)]))
    pd.testing.assert_frame_equal(depth_frame(events), want)


def test_claim_before_ready_at_cancels_the_pending_transition() -> None:
    # A worker on a skewed clock may claim a job the owner still thinks is delayed; the stale
    # heap entry must not turn the leased job back into a ready one.
    events = [enq(0.0, "j", delay_s=5.0), claim(1.0, "j", 1, W0), e(9.0, "owner_down")]
    want = expected(DEPTH_COLS, no_waiting([(0.0, 0, 0, 1, 0, 0), (1.0, 0, 1, 0, 0, 0)]))
    pd.testing.assert_frame_equal(depth_frame(events), want)
    assert jobs_frame(events)["state"].tolist() == ["leased"]


def test_a_superseded_delay_does_not_end_the_new_one() -> None:
    # Delayed until 10, claimed early, failed, re-delayed until 22: at 10 nothing happens.
    events = [enq(0.0, "j", delay_s=10.0), claim(1.0, "j", 1, W0),
              e(2.0, "nacked", "j", 1, W0, error="x"), retry(2.0, "j", 1, 20.0, "x"),
              e(12.0, "owner_down")]
    want = expected(DEPTH_COLS, no_waiting([(0.0, 0, 0, 1, 0, 0), (1.0, 0, 1, 0, 0, 0),
                                 (2.0, 0, 0, 1, 0, 0)]))
    pd.testing.assert_frame_equal(depth_frame(events), want)
    assert jobs_frame(events)["state"].tolist() == ["delayed"]


def test_duplicate_enqueue_changes_nothing_for_a_known_job() -> None:
    events = [enq(0.0, "j"), claim(1.0, "j", 1, W0), e(2.0, "duplicate_enqueue", "j"),
              e(3.0, "duplicate_enqueue", "seen-late")]
    jobs = jobs_frame(events)
    assert jobs["state"].tolist() == ["leased", "ready"]  # an unseen job is assumed ready
    assert depth_frame(events)[["ready", "leased"]].values.tolist()[-2:] == [[0, 1], [1, 1]]


def test_throughput_frame_exact() -> None:
    rows = list(zip(
        [float(t) for t in range(14)],
        [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 2],  # acked (H twice in bin 13)
        [0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # nacked
        [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],  # expired
        [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # dead_lettered
        [3, 1, 0, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0],  # enqueued (not duplicate_enqueue)
        strict=True))
    pd.testing.assert_frame_equal(throughput_frame(EVENTS), expected(THROUGHPUT_COLS, rows))


def test_throughput_bins_are_multiples_of_bin_s() -> None:
    tp = throughput_frame(EVENTS, bin_s=5.0)
    assert tp["t"].tolist() == [0.0, 5.0, 10.0]
    assert tp["acked"].tolist() == [1, 2, 2]
    assert tp["enqueued"].tolist() == [5, 2, 1]
    # 0.3 / 0.1 is 2.9999... in floating point; it still belongs to the bin starting at 0.3.
    tp = throughput_frame([enq(0.3, "a"), enq(0.45, "b")], bin_s=0.1)
    assert tp["t"].tolist() == pytest.approx([0.3, 0.4])
    assert tp["enqueued"].tolist() == [1, 1]
    with pytest.raises(ValueError):
        throughput_frame(EVENTS, bin_s=0)


def test_node_events_frame_exact() -> None:
    want = expected(NODE_COLS, [(3.0, "n2", "crashed"), (8.5, "n2", "restarted")])
    pd.testing.assert_frame_equal(node_events_frame(EVENTS), want)


# --- empty input and helpers ------------------------------------------------------------------

EVENT_COLS = [("t", "float64"), ("node", object), ("queue", object), ("job_id", object),
              ("kind", object), ("attempt", "int64"), ("worker", object), ("detail", object),
              ("error", object), ("delay_s", "float64"), ("ready_at", "float64"),
              ("deadline", "float64"), ("priority", "Int64")]


@pytest.mark.parametrize("empty", [[], None, pd.DataFrame(), pd.DataFrame(columns=["t", "kind"])],
                         ids=["list", "None", "bare-frame", "frame"])
def test_every_frame_has_fixed_columns_and_dtypes_when_empty(empty: Any) -> None:
    cases = [
        (events_frame, EVENT_COLS), (jobs_frame, JOB_COLS), (leases_frame, LEASE_COLS),
        (attempts_frame, ATTEMPT_COLS), (depth_frame, DEPTH_COLS),
        (throughput_frame, THROUGHPUT_COLS), (node_events_frame, NODE_COLS),
    ]
    for fn, cols in cases:
        pd.testing.assert_frame_equal(fn(empty), expected(cols, []), obj=fn.__name__)


def test_nonempty_frames_have_the_same_dtypes_as_empty_ones() -> None:
    for fn, cols in ((events_frame, EVENT_COLS), (jobs_frame, JOB_COLS),
                     (leases_frame, LEASE_COLS), (attempts_frame, ATTEMPT_COLS),
                     (depth_frame, DEPTH_COLS), (throughput_frame, THROUGHPUT_COLS),
                     (node_events_frame, NODE_COLS)):
        assert fn(EVENTS).dtypes.to_dict() == expected(cols, []).dtypes.to_dict(), fn.__name__


def test_frames_of_node_events_only_have_no_job_rows() -> None:
    events = [e(1.0, "crashed", node="n3", queue=""), e(2.0, "owner_up")]
    assert jobs_frame(events).empty and leases_frame(events).empty
    assert depth_frame(events).empty
    assert node_events_frame(events)["node"].tolist() == ["n3"]


def test_worker_node() -> None:
    assert worker_node("n1:send_email#3") == "n1"
    assert worker_node("host:a:b#0") == "host"
    assert worker_node(None) is None
