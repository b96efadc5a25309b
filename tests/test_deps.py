"""Dependencies on the in-process mesh: a child waits for parents on other owners, each
on_parent_failure mode, restarts, bad input and forged reports; the pure rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, count, wait_events

from istos import ConfigError, InvalidJob, Istos, JobNotFound, MemoryStorage, ParentFailed
from istos.core import deps

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


class Ledger:
    """The order in which jobs ran, outside every app."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, Any]] = []
        self.changed = asyncio.Event()

    def note(self, queue: str, data: Any) -> None:
        self.runs.append((queue, data))
        self.changed.set()

    async def until(self, pred: Any, timeout_s: float = 5.0) -> None:
        async def wait() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), timeout_s)


def serve(app: Istos, queue: str, ledger: Ledger, gate: asyncio.Event | None = None,
          fail: set[Any] | None = None, **options: Any) -> None:
    app.queue(queue, admin=True, **options)

    @app.worker(queue)
    async def handler(data: Any) -> None:
        if gate is not None:
            await gate.wait()
        ledger.note(queue, data)
        if fail and data in fail:
            raise RuntimeError(f"{data} fails")


async def why(app: Istos, queue: str, job_id: str) -> dict[str, Any]:
    return (await app.client(queue).call("why", job_id=job_id))["why"]  # type: ignore


async def test_a_child_with_two_parents_on_two_owners_runs_after_both(mesh):
    ledger, gate = Ledger(), asyncio.Event()
    pa, pb, pc = app_on(mesh, "pa"), app_on(mesh, "pb"), app_on(mesh, "pc")
    serve(pa, "a", ledger, gate)
    serve(pb, "b", ledger, gate)
    serve(pc, "c", ledger)
    async with pa.serving(), pb.serving(), pc.serving():
        first = await pc.enqueue("a", "p1")
        second = await pc.enqueue("b", "p2")
        assert first.queue == "a"  # the Enqueued names its queue: a ref as it is
        child = await pc.enqueue("c", "child", after=[first, ("b", second)])
        seen = await why(pc, "c", child)
        assert seen["state"] == "waiting" and "2 of 2 parent(s)" in seen["reason"]
        assert [p["state"] for p in seen["waits_for"]["parents"]] == ["pending", "pending"]
        listed = (await pc.client("c").call("jobs", state="waiting"))["jobs"]
        assert [j["job_id"] for j in listed] == [child]
        assert "key" not in str(listed) and "key" not in str(seen)  # the capability: never
        stats = (await pc.client("c").call("stats"))["stats"]
        assert stats["counts"]["waiting"] == 1
        late = await pc.enqueue("c", "late", after=[second])  # a parent gains a child
        gate.set()
        await ledger.until(lambda: len(ledger.runs) == 4)
        events = await wait_events(pc, lambda evs: count(evs, "acked", child) == 1)
    order = [data for _, data in ledger.runs]
    assert order.index("child") > max(order.index("p1"), order.index("p2"))
    assert order.index("late") > order.index("p2")
    assert count(events, "waiting", child) == 1 and count(events, "unblocked", child) == 1
    assert count(events, "enqueued", child) == 0 and count(events, "claimed", late) == 1


@pytest.mark.parametrize("mode", ["cancel", "run", "wait"])
async def test_a_parent_dying_while_the_child_waits_in_each_mode(mesh, mode):
    ledger, go, fixed = Ledger(), asyncio.Event(), set()
    parent_app, child_app = app_on(mesh, "parents"), app_on(mesh, "children")
    parent_app.queue("p", admin=True, max_attempts=1)
    other = asyncio.Event()

    @parent_app.worker("p")
    async def parent(data: str) -> None:
        await (other if data == "ok" else go).wait()
        ledger.note("p", data)
        if data == "bad" and data not in fixed:
            raise RuntimeError("parent fails")

    serve(child_app, "c", ledger)
    async with parent_app.serving(), child_app.serving():
        bad = await child_app.enqueue("p", "bad")
        ok = await child_app.enqueue("p", "ok")
        child = await child_app.enqueue("c", "child", after=[bad, ok], on_parent_failure=mode)
        go.set()
        await wait_events(parent_app, lambda evs: count(evs, "dead_lettered", bad) == 1)
        if mode == "cancel":  # at once, without waiting for the other parent
            await wait_events(child_app, lambda evs: count(evs, "cancelled", child) == 1)
            result = await child_app.result("c", child)
            assert result["state"] == "cancelled"
            assert (await why(child_app, "c", child))["last_error"].startswith(f"parent {bad}")
            other.set()  # (lets the other parent finish before the apps stop)
        elif mode == "run":  # once every parent ended, whatever their outcomes
            assert (await why(child_app, "c", child))["state"] == "waiting"
            other.set()
            await ledger.until(lambda: ("c", "child") in ledger.runs)
        else:  # waits for an operator: the dead parent requeued, then done
            other.set()
            await ledger.until(lambda: ("p", "ok") in ledger.runs)
            await wait_events(parent_app, lambda evs: count(evs, "acked", ok) == 1)
            seen = await why(child_app, "c", child)
            assert seen["state"] == "waiting" and seen["waits_for"]["needs_operator"]
            assert "waiting for an operator" in seen["reason"]
            fixed.add("bad")
            await parent_app.revive("p", bad)
            await ledger.until(lambda: ("c", "child") in ledger.runs)
    assert ledger.runs.count(("c", "child")) == (0 if mode == "cancel" else 1)


async def test_bad_input_gets_typed_errors_and_nothing_is_enqueued(mesh):
    ledger = Ledger()
    app = app_on(mesh, "solo")
    serve(app, "q", ledger, fail={"dies"}, max_attempts=1)
    async with app.serving():
        dead = await app.enqueue("q", "dies")
        await wait_events(app, lambda evs: count(evs, "dead_lettered", dead) == 1)
        with pytest.raises(JobNotFound, match="holds no job 'nope'"):
            await app.enqueue("q", 1, after=[("q", "nope")])
        with pytest.raises(ParentFailed) as failed:
            await app.enqueue("q", 1, after=[("q", dead)])
        assert failed.value.parent == ("q", dead) and failed.value.state == "dead"
        assert isinstance(failed.value, InvalidJob)
        with pytest.raises(ConfigError, match="itself"):
            await app.enqueue("q", 1, job_id="me", after=[("q", "me")])
        with pytest.raises(ConfigError, match="at most 64"):
            await app.enqueue("q", 1, after=[("q", f"j{i}") for i in range(65)])
        for bad in ([], "q", ["q"], [("q",)], [("q", "")], [("bad*name", "x")], None.__class__):
            with pytest.raises(ConfigError):
                await app.enqueue("q", 1, after=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="on_parent_failure"):
            await app.enqueue("q", 1, after=[("q", dead)], on_parent_failure="ignore")
        with pytest.raises(ConfigError, match="does not combine"):
            await app.enqueue("q", 1, after=[("q", dead)], unique_key="k")
        # run and wait accept a dead parent: run is ready at once, wait waits
        runs = await app.enqueue("q", "runs", after=[("q", dead)], on_parent_failure="run")
        waits = await app.enqueue("q", "waits", after=[("q", dead)], on_parent_failure="wait")
        await ledger.until(lambda: ("q", "runs") in ledger.runs)
        assert (await why(app, "q", waits))["state"] == "waiting"
        assert (await app.client("q").call("promote", job_ids=[waits]))["promoted"] == 1
        await ledger.until(lambda: ("q", "waits") in ledger.runs)
        events = await wait_events(app, lambda evs: count(evs, "unblocked", waits) == 1)
    forced = [e for e in events if e.kind == "unblocked" and e.job_id == waits]
    assert forced[0].detail.get("forced") is True
    assert count(events, "waiting", runs) == 0  # decided at enqueue: never waited
    assert len([r for r in ledger.runs if r[1] == 1]) == 0


async def test_a_parent_already_done_and_kept_resolves_at_once(mesh):
    ledger = Ledger()
    app = app_on(mesh, "solo")
    serve(app, "kept", ledger, keep_results=True)
    serve(app, "c", ledger)
    async with app.serving():
        parent = await app.enqueue("kept", "p")
        await wait_events(app, lambda evs: count(evs, "acked", parent) == 1)
        child = await app.enqueue("c", "child", after=[parent])
        await ledger.until(lambda: ("c", "child") in ledger.runs)
        events = await wait_events(app, lambda evs: count(evs, "acked", child) == 1)
    assert count(events, "waiting", child) == 0 and count(events, "enqueued", child) == 1


async def test_a_forged_or_repeated_report_changes_nothing(mesh):
    ledger, gate = Ledger(), asyncio.Event()
    app = app_on(mesh, "solo")
    serve(app, "p", ledger, gate)
    serve(app, "c", ledger)
    async with app.serving():
        parent = await app.enqueue("p", "p")
        child = await app.enqueue("c", "child", after=[parent])
        forged = {"child_id": child, "parent_queue": "p", "parent_id": parent,
                  "outcome": "done"}
        with pytest.raises(InvalidJob, match="wrong key"):
            await app.client("c").call("dep_report", key="0" * 32, **forged)
        assert (await app.client("c").call("dep_report", key="0" * 32, child_id="nobody",
                                           parent_queue="p", parent_id=parent,
                                           outcome="done"))["status"] == "unknown"
        assert (await why(app, "c", child))["state"] == "waiting"
        gate.set()
        await ledger.until(lambda: ("c", "child") in ledger.runs)
        events = await wait_events(app, lambda evs: count(evs, "acked", child) == 1)
    assert count(events, "unblocked", child) == 1 and ledger.runs.count(("c", "child")) == 1


async def test_the_child_owner_down_when_the_parent_ends_releases_it_once_back(mesh):
    storage, ledger, gate = MemoryStorage(durable=True), Ledger(), asyncio.Event()
    parents = app_on(mesh, "parents", request_timeout_s=0.3)
    serve(parents, "p", ledger, gate)
    children = app_on(mesh, "children", storage=storage)
    children.queue("c")
    async with parents.serving():
        async with children.serving():
            parent = await children.enqueue("p", "p")
            child = await children.enqueue("c", "child", after=[parent])
        gate.set()  # the parent ends while the child's owner is down: its report is retried
        await ledger.until(lambda: ("p", "p") in ledger.runs)
        again = app_on(mesh, "children2", storage=storage)
        serve(again, "c", ledger)
        async with again.serving():
            await ledger.until(lambda: ("c", "child") in ledger.runs, timeout_s=15)
            events = await wait_events(again, lambda evs: count(evs, "acked", child) == 1)
    assert ledger.runs.count(("c", "child")) == 1 and count(events, "unblocked", child) == 1


async def test_the_parent_owner_restarted_still_reports_to_a_waiting_child(mesh):
    storage, ledger = MemoryStorage(durable=True), Ledger()
    parents = app_on(mesh, "parents", storage=storage)
    parents.queue("p")  # no worker yet: the parent stays pending across the restart
    children = app_on(mesh, "children")
    serve(children, "c", ledger)
    async with children.serving():
        async with parents.serving():
            parent = await children.enqueue("p", "p")
            child = await children.enqueue("c", "child", after=[parent])
        again = app_on(mesh, "parents2", storage=storage)
        serve(again, "p", ledger)
        async with again.serving():
            await ledger.until(lambda: ("c", "child") in ledger.runs)
        events = await wait_events(children, lambda evs: count(evs, "acked", child) == 1)
    assert ledger.runs == [("p", "p"), ("c", "child")]
    assert count(events, "unblocked", child) == 1


async def test_a_chain_of_waiting_jobs_cancels_down_the_line(mesh):
    ledger, go = Ledger(), asyncio.Event()
    app = app_on(mesh, "solo")
    serve(app, "q", ledger, go, fail={"root"}, max_attempts=1)
    async with app.serving():
        root = await app.enqueue("q", "root")
        mid = await app.enqueue("q", "mid", after=[root])
        leaf = await app.enqueue("q", "leaf", after=[mid])  # a waiting parent may have children
        go.set()
        await wait_events(app, lambda evs: count(evs, "cancelled", leaf) == 1)
        assert (await app.result("q", mid))["state"] == "cancelled"
    assert ledger.runs == [("q", "root")]


# -- the pure rules --------------------------------------------------------------------------
def entry(*outcomes: str, mode: str = "cancel") -> dict[str, Any]:
    return {"after": [["q", f"p{i}"] for i in range(len(outcomes))], "o": list(outcomes),
            "mode": mode, "key": "k" * 32}


@pytest.mark.parametrize(("outcomes", "mode", "expected"), [
    (("done", "done"), "cancel", "release"),
    (("done", "pending"), "cancel", "wait"),
    (("dead", "pending"), "cancel", "cancel"),
    (("cancelled",), "cancel", "cancel"),
    (("dead", "pending"), "run", "wait"),
    (("dead", "done"), "run", "release"),
    (("dead", "done"), "wait", "wait"),
    (("done", "done"), "wait", "release"),
])
def test_verdicts(outcomes, mode, expected):
    assert deps.verdict(entry(*outcomes, mode=mode)) == expected


def test_outcome_moves_are_the_batch_members_moves():
    e = entry("pending", "pending")
    done = deps.with_outcome(e, ("q", "p0"), "done")
    assert done is not None and done["o"] == ["done", "pending"] and e["o"][0] == "pending"
    assert deps.with_outcome(done, ("q", "p0"), "done") is None  # a repeat
    assert deps.with_outcome(e, ("q", "other"), "done") is None  # not a parent
    dead = deps.with_outcome(e, ("q", "p1"), "dead")
    assert dead is not None and deps.with_outcome(dead, ("q", "p1"), "done") is not None
    assert deps.with_outcome(e, ("q", "p0"), "pending") is None


@pytest.mark.parametrize("bad", [
    None, [], {}, {"after": [["q", "p"]], "o": ["pending"], "mode": "cancel"},
    {**entry("pending"), "extra": 1}, {**entry("pending"), "o": []},
    {**entry("pending"), "o": ["frob"]}, {**entry("pending"), "mode": "never"},
    {**entry("pending"), "key": "short"}, {**entry("pending"), "key": "k" * 65},
    {**entry("pending"), "key": "not a key at all!"}, {**entry("pending"), "after": [["q"]]},
    {**entry("pending"), "after": [["bad*q", "p"]]}, {**entry("pending"), "after": [["q", ""]]},
    {**entry("pending", "pending"), "after": [["q", "p"], ["q", "p"]]},
    {"after": [["q", f"p{i}"] for i in range(65)], "o": ["pending"] * 65, "mode": "run",
     "key": "k" * 32},
])
def test_malformed_deps_meta_is_refused(bad):
    with pytest.raises(InvalidJob):
        deps.check_entry("j", bad)


def test_frames_show_waiting_jobs():
    from istos_nb.data.frames import jobs_frame

    def event(t: float, job: str, kind: str, **detail: Any) -> dict[str, Any]:
        return {"t": t, "node": "n", "queue": "q", "job_id": job, "kind": kind,
                "attempt": 0, "worker": None, "detail": detail}

    frame = jobs_frame([
        event(1.0, "child", "waiting", priority=3, ready_at=1.0, parents=2),
        event(1.0, "still", "waiting", priority=0, ready_at=1.0, parents=1),
        event(2.0, "child", "unblocked", delay_s=0.0, ready_at=2.0, priority=3)])
    states = dict(zip(frame["job_id"], frame["state"]))
    assert states == {"child": "ready", "still": "waiting"}
    assert frame.set_index("job_id").loc["child", "priority"] == 3
    assert frame.set_index("job_id").loc["child", "enqueued_at"] == 1.0


def test_the_cli_why_lists_the_parents():
    from istos.ops.render import why_text

    text = why_text("child", {
        "state": "waiting", "reason": "waiting for 1 of 2 parent(s)", "now": 10.0,
        "waits_for": {"parents": [{"queue": "a", "job_id": "p1", "state": "done"},
                                  {"queue": "b", "job_id": "p2", "state": "pending"}],
                      "on_parent_failure": "cancel", "pending": 1, "needs_operator": False}})
    assert "parents (on_parent_failure=cancel, 1 pending):" in text
    assert any("p2" in line and "pending" in line for line in text.splitlines())


async def test_the_owner_refuses_malformed_deps_meta_from_the_wire(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    good = {"after": [["q", "p"]], "o": ["pending"], "mode": "cancel", "key": "k" * 32}
    async with app.serving():
        call = app.client("q").call
        await call("enqueue", body=b"\xc0", job_id="p")
        for bad in ({**good, "o": ["dead"]}, {**good, "key": "x"}, {**good, "mode": 1},
                    {**good, "after": []}, {**good, "extra": True}):
            with pytest.raises(InvalidJob):
                await call("enqueue", body=b"\xc0", job_id="c", meta={"deps": bad})
        with pytest.raises(InvalidJob, match="reserved"):
            await call("enqueue", body=b"\xc0", job_id="wf:" + "0" * 32 + ".1",
                       meta={"deps": good})
        with pytest.raises(InvalidJob, match="alone"):
            await call("enqueue", body=b"\xc0", job_id="c",
                       meta={"deps": good, "chain": {"id": "x"}})
        with pytest.raises(InvalidJob, match="does not combine"):
            await call("enqueue", body=b"\xc0", job_id="c", meta={"deps": good},
                       unique={"key": "u"})
        assert (await call("states", job_ids=["c"]))["states"]["c"] == "unknown"
        assert (await call("enqueue", body=b"\xc0", job_id="c", meta={"deps": good})
                )["created"] is True
        assert (await call("states", job_ids=["c"]))["states"]["c"] == "waiting"
