"""Workflows as an operator reads them: ``why`` of a chain step or chord member names its
workflow, and the ``states`` op (read role) says what state each of a list of jobs is in.

The owner answering ``why`` knows only its own queue, so it describes the workflow from the
job's ``meta`` (every step's queue and job id, which the workflow code derives from the chain or
chord id); the client then asks each queue's owner for the states (``states``, one bounded
request per queue: ids and states only, never bodies). A chord callback's meta is only its
proof (``callback``), so its ``why`` shows no workflow (ask a member's). A chord member's
``why`` also says when a dead member stalls the chord: the owner answering holds the chord's
barrier (``core/chord_barrier.py``), which lists the members dead-lettered while it waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import protocol
from ...core.chord_barrier import Barrier
from ...core.records import CANCELLED, DEAD
from ...errors import IstosError
from ..extension import Handler, OwnerExtension, not_wrapped
from ..handle import OwnerHandle
from ..handlers.fit import fit_why

MAX_MEMBERS_SHOWN = 100  # chord members a workflow entry lists (``size`` says how many)
MAX_STALLING_SHOWN = 20  # dead members a chord's ``stalled`` entry lists (``count``: how many)


class WorkflowView(OwnerExtension):
    """Serves ``states`` and adds a job's workflow to its ``why`` (which it wraps)."""

    name = "workflow_view"
    serves = ("states",)
    wraps = ("why",)

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self._why: Handler = not_wrapped

    def ops(self) -> Mapping[str, Handler]:
        return {"states": self.op_states}

    def wrap(self, op: str, inner: Handler) -> Handler:
        self._why = inner
        return self._op_why

    async def _op_why(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply = await self._why(msg)
        rec = self.owner.state.jobs.get(msg["job_id"])
        if rec is not None and rec.meta:
            flow = describe(self.owner.name, rec.meta)
            if flow is not None:
                if flow["kind"] == "chord":
                    stalled = await self._stalled(flow["id"])
                    if stalled is not None:
                        flow["stalled"] = stalled
                reply["why"]["workflow"] = flow
                fit_why(reply["why"])  # the description takes room too
        return reply

    async def _stalled(self, chord_id: str) -> dict[str, Any] | None:
        """``{"by": [{"index", "job_id", "state", "since"}], "count", "note"}``: the dead
        and cancelled members chord ``chord_id``'s barrier (held here) waits for, or None when
        none does. A member listed is ``dead``, ``cancelled`` (nothing resumes the chord), or
        ``unknown`` once its record was purged or expired (nor then); one no longer dead
        (revived meanwhile) is left out."""
        raw = await self.owner.storage.get(f"wf:{self.owner.name}", chord_id)
        barrier = None if raw is None else Barrier.decode(raw)
        if barrier is None or barrier.fired:
            return None
        by = []
        for index in barrier.stalled_by():
            job_id = f"{chord_id}.{index}"
            held = self.owner.state.jobs.get(job_id)
            if held is None or held.state in (DEAD, CANCELLED):
                by.append({"index": index, "job_id": job_id,
                           "state": "unknown" if held is None else held.state,
                           "since": barrier.ended_at(index)})
        if not by:
            return None
        # A cancelled member is named first: revive cannot bring it back, whatever else does.
        first = next((b for b in by if b["index"] in barrier.cancelled), by[0])
        if first["state"] == DEAD:
            note = (f"chord {chord_id} is stalled by member {first['index']} "
                    f"({first['job_id']}), dead: its callback waits until revive brings that "
                    f"member back (app.revive({self.owner.name!r}, {first['job_id']!r}), or "
                    "istos redrive-dead)")
        elif first["index"] in barrier.cancelled:
            note = (f"chord {chord_id} is stalled by member {first['index']} "
                    f"({first['job_id']}), cancelled: a cancelled job never runs again, so "
                    "nothing can resume the chord and its callback will not fire")
        else:
            note = (f"chord {chord_id} is stalled by member {first['index']} "
                    f"({first['job_id']}), which died and whose dead letter was purged: "
                    "nothing can resume the chord, its callback will not fire")
        return {"by": by[:MAX_STALLING_SHOWN], "count": len(by), "note": note}

    async def op_states(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The state of each of ``job_ids`` ("unknown": this queue holds no such job)."""
        jobs = self.owner.state.jobs
        states = {}
        for job_id in msg["job_ids"]:
            rec = jobs.get(job_id)
            states[job_id] = "unknown" if rec is None else rec.state
        return {"states": states}


def describe(queue: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The workflow a job's ``meta`` puts it in: ``{"kind": "chain", "id", "step", "steps":
    [{"index", "queue", "job_id"}]}`` or ``{"kind": "chord", "id", "index", "size",
    "members": [...], "callback": {"queue", "job_id"}, "batch"?}`` (``batch``: the id of the
    batch counting a chord's ends, when it has some); None for a meta of no workflow."""
    chain, chord, batch = meta.get("chain"), meta.get("chord"), meta.get("batch")
    try:
        if isinstance(chain, dict):
            chain_id, queues = str(chain["id"]), list(chain["queues"])
            return {"kind": "chain", "id": chain_id, "step": int(chain["step"]),
                    "steps": [{"index": i, "queue": str(q), "job_id": f"{chain_id}.{i}"}
                              for i, q in enumerate(queues)]}
        if isinstance(chord, dict):
            chord_id, size = str(chord["id"]), int(chord["size"])
            return {"kind": "chord", "id": chord_id, "index": int(chord["index"]), "size": size,
                    "members": [{"index": i, "queue": queue, "job_id": f"{chord_id}.{i}"}
                                for i in range(min(size, MAX_MEMBERS_SHOWN))],
                    "callback": {"queue": str(chord["callback"]),
                                 "job_id": f"{chord_id}.callback"},
                    # a chord with ends: the batch whose home counts them (istos batch ID)
                    **({"batch": str(batch["id"])} if isinstance(batch, dict) else {})}
    except (KeyError, TypeError, ValueError):  # meta the workflow code checked: not expected
        return None
    return None


def steps_of(flow: dict[str, Any]) -> list[dict[str, Any]]:
    """Every job of a workflow entry, in order (a chord's callback last)."""
    if flow.get("kind") == "chain":
        return list(flow.get("steps") or [])
    return [*(flow.get("members") or []), {**flow.get("callback", {}), "index": "callback"}]



async def fill_states(flow: dict[str, Any], call: Any) -> list[dict[str, Any]]:
    """Every job of ``flow`` with its ``state``, asking each queue's owner once through
    ``call(queue, op, **fields)`` (an owner that does not answer: state None). A chain step
    before the current one that its owner no longer holds finished and was not kept
    ("finished"); one after it has not started ("not started")."""
    steps = steps_of(flow)
    by_queue: dict[str, list[str]] = {}
    for step in steps:
        by_queue.setdefault(str(step.get("queue")), []).append(str(step.get("job_id")))
    states: dict[str, str | None] = {}
    for queue, ids in by_queue.items():
        try:
            reply = await call(queue, "states", job_ids=ids[:protocol.MAX_PAGE])
            states.update(reply.get("states") or {})
        except IstosError:
            states.update(dict.fromkeys(ids))
    current = flow.get("step", flow.get("index"))
    out = []
    for step in steps:
        state = states.get(str(step.get("job_id")))
        if state == "unknown" and flow.get("kind") == "chain" and isinstance(current, int):
            state = "finished" if step["index"] < current else "not started"
        out.append({**step, "state": state})
    return out
