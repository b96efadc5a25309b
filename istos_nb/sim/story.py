"""A counterexample's story: its faults and the involved jobs' events as sentences, in order.

Built from the fault schedule and the run's recorded rows only (events, side effects, the
checker's findings), so it tells what happened, not what the engine meant to do. Jobs are called
j1, j2... in the order they first appear, their ids given once.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from typing import Any

from .faultplan import Fault
from .result import SimResult

__all__ = ["involved_jobs", "story_lines", "violation_moment"]

MAX_JOBS = 3
_TWICE = {2: "twice", 3: "three times"}


def _node_of(worker: str | None) -> str:
    return (worker or "").rsplit(":", 1)[0]


def involved_jobs(result: SimResult, failed: list[tuple[str, str]]) -> list[str]:
    """The jobs the violation is about: those that ran more than once, those accepted and
    never run (lost or stranded), then those a failed invariant's detail names; at most
    three, in order of enqueueing."""
    ran = Counter(e["job_id"] for e in result.effects)
    order = [a["job_id"] for a in result.attempts if a["job_id"]]
    accepted = [a["job_id"] for a in result.attempts if a["status"] == "ok"]
    picked = [j for j in order if ran[j] > 1]
    picked += [j for j in accepted if ran[j] == 0 and j not in result.held]
    text = " ".join(detail for _, detail in failed)
    picked += [j for j in order if j in text]
    if not picked:  # a custom property: the jobs whose lease ran out, if any
        expired = {e["job_id"] for e in result.events_raw if e["kind"] == "lease_expired"}
        picked = [j for j in order if j in expired]
    return list(dict.fromkeys(picked))[:MAX_JOBS]


def violation_moment(result: SimResult, jobs: list[str]) -> float | None:
    """When a job first completed a second time, else the last event of an involved job."""
    seen: Counter[str] = Counter()
    for e in result.effects:
        seen[e["job_id"]] += 1
        if seen[e["job_id"]] == 2:
            return float(e["t"])
    times = [e["t"] for e in result.events_raw if e["job_id"] in jobs]
    return float(max(times)) if times else None


_START_EVENT = {"crash": "crashed", "restart": "crashed", "freeze": "frozen",
                "partition": "partitioned", "storage_outage": "storage_down",
                "clock_skew": "clock_stepped", "clock_drift": "clock_drifting"}
_END_EVENT = {"crash": "restarted", "freeze": "resumed", "partition": "healed",
              "storage_outage": "storage_up", "clock_drift": "clock_drift_over"}


def story_lines(result: SimResult, schedule: tuple[Fault, ...], jobs: list[str],
                failed: list[tuple[str, str]], prop_name: str) -> list[str]:
    """The numbered story's lines (without numbers), ending with the verdict. Lines are in
    the order things happened: a fault where the run recorded it, a job's events in stream
    order, a handler's completion just before the events of its instant."""
    alias = {j: f"j{i}" for i, j in enumerate(jobs, 1)}
    times = [float(e["t"]) for e in result.events_raw]
    items: list[tuple[float, float, str]] = []
    for fault in schedule:
        start, end = fault.describe()
        seq = _seq(result, times, fault.at, _START_EVENT.get(fault.kind), fault.node)
        holding = _holding(result, alias, fault, seq)
        items.append((fault.at, seq, start + holding))
        if end is not None:
            seq = _seq(result, times, fault.end, _END_EVENT.get(fault.kind), fault.node)
            items.append((fault.end, seq, end))
    items += _job_items(result, alias, times)
    items.sort(key=lambda item: (item[0], item[1]))
    lines = [f"t={t:.1f} {text}" for t, _, text in items]
    return lines + _verdict(result, alias, failed, prop_name)


def _seq(result: SimResult, times: list[float], t: float, kind: str | None,
         node: str) -> float:
    """Where in the event stream something at ``t`` belongs: at its recorded event (``kind``
    on ``node`` at ``t``) if there is one, else just before the events of that instant."""
    first = bisect_left(times, t)
    for i in range(first, len(times)):
        e = result.events_raw[i]
        if times[i] > t:
            break
        if e["kind"] == kind and (not node or node in e["node"].split(",")):
            return float(i)
    return first - 0.5


def _effect_seq(result: SimResult, times: list[float], fx: dict[str, Any]) -> float:
    """A completion goes just before its job's ack (or lost ack) of the same instant, else
    after every event of that instant."""
    t = float(fx["t"])
    end = bisect_right(times, t)
    for i in range(bisect_left(times, t), end):
        e = result.events_raw[i]
        if e["job_id"] == fx["job_id"] and e["kind"] in ("acked", "nacked", "ack_lost"):
            return i - 0.5
    return end - 0.5


def _holding(result: SimResult, alias: dict[str, str], fault: Fault, seq: float) -> str:
    """", holding j1" when an involved job's lease sits with ``fault.node`` at its start
    (the events before position ``seq`` of the stream)."""
    if fault.kind not in ("crash", "restart", "freeze", "partition", "lost_acks"):
        return ""
    open_leases: dict[str, str] = {}
    for i, e in enumerate(result.events_raw):
        if i >= seq:
            break
        if e["job_id"] not in alias:
            continue
        if e["kind"] == "claimed":
            open_leases[e["job_id"]] = _node_of(e["worker"])
        elif e["kind"] in ("acked", "nacked", "lease_expired", "cancelled"):
            open_leases.pop(e["job_id"], None)
    held = [alias[j] for j, node in open_leases.items() if node == fault.node]
    return f", holding job {', '.join(held)}" if held else ""


def _job_items(result: SimResult, alias: dict[str, str],
               times: list[float]) -> list[tuple[float, float, str]]:
    items: list[tuple[float, float, str]] = []
    named: set[str] = set()
    down: set[str] = set()  # nodes crashed and not yet back
    for i, e in enumerate(result.events_raw):
        job, kind = e["job_id"], e["kind"]
        if kind == "crashed":
            down.add(e["node"])
        elif kind == "restarted":
            down.discard(e["node"])
        if job not in alias:
            continue
        text = _event_text(e, alias[job], job not in named)
        if kind == "claimed" and _node_of(e["worker"]) in down:
            text = (f"{text}: a claim {_node_of(e['worker'])} sent before it crashed, "
                    "so nobody runs it")
        named.add(job)
        if text:
            items.append((float(e["t"]), float(i), text))
    count: Counter[str] = Counter()
    for fx in result.effects:
        job = fx["job_id"]
        if job in alias:
            count[job] += 1
            nth = "" if count[job] == 1 else \
                f" (its side effect runs a {_ordinal(count[job])} time)"
            items.append((float(fx["t"]), _effect_seq(result, times, fx),
                          f"the handler on {fx['node']} completes {alias[job]} "
                          f"(attempt {fx['attempt']}){nth}"))
    return items


def _event_text(e: dict[str, Any], name: str, first: bool) -> str | None:
    kind, detail = e["kind"], e.get("detail") or {}
    who = _node_of(e["worker"]) or e["node"]
    if kind == "enqueued":
        return f"job {name} (id {e['job_id']}) is enqueued on {e['queue']}" if first \
            else f"{name} is enqueued again"
    if kind == "claimed":
        deadline = detail.get("deadline")
        lease = f", lease {deadline - e['t_node']:.0f} s" if deadline is not None else ""
        return f"{who} claims {name} (attempt {e['attempt']}{lease})"
    texts = {
        "acked": f"the owner takes {name}'s ack: done",
        "nacked": f"{name} fails on {who} (nack)",
        "lease_expired": f"{name}'s lease runs out",
        "dead_lettered": f"{name} is dead-lettered",
        "cancelled": f"{name} is cancelled",
        "expired": f"{name} expires: nobody started it by its start deadline",
        "ack_lost": f"{name}'s ack from {e['node']} is lost",
        "delivery_crashed": f"{name}'s delivery dies mid-job on {e['node']}",
    }
    return texts.get(kind)


def _ordinal(n: int) -> str:
    return {2: "second", 3: "third"}.get(n, f"{n}th")


def _verdict(result: SimResult, alias: dict[str, str], failed: list[tuple[str, str]],
             prop_name: str) -> list[str]:
    ran = Counter(e["job_id"] for e in result.effects)
    out = [f"so {name} ran {_TWICE.get(ran[j], f'{ran[j]} times')}"
           for j, name in alias.items() if ran[j] > 1]
    out += [f"so {name} never ran: it is lost" for j, name in alias.items()
            if ran[j] == 0 and j not in result.held and j not in result.stored]
    out += [f"the check '{inv}' fails: {detail}" for inv, detail in failed]
    return out or [f"so '{prop_name}' does not hold"]
