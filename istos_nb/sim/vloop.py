"""A deterministic virtual-time asyncio event loop.

:class:`VirtualEventLoop` runs ordinary asyncio code (``asyncio.sleep``, ``wait_for``,
``asyncio.timeout``, ``call_later``, Futures, Tasks, Events, Queues) on a clock that starts at
``start`` (default ``0.0``) and moves only when the loop has nothing else to do: it then jumps
straight to the next timer, so an hour of simulated waiting costs no wall time. This is trio's
``MockClock(autojump_threshold=0)`` and the ``looptime`` package's idea, done on the stock loop.

How it works. Where ``BaseEventLoop._run_once`` would ask its selector to wait ``timeout``
seconds for I/O (none when callbacks are ready; else the distance to the next timer, or forever
when nothing is scheduled), this loop never waits for real: it moves the virtual clock to the
next timer's ``when`` and runs that timer in the same iteration. The iteration itself, and
``call_soon`` / ``call_later`` / ``call_at``, live in :mod:`istos_nb.asyncio_internals` (the
one module that touches asyncio's private members), which mirrors asyncio's code on a cheaper
timer heap.

Guarantees:

* ``loop.time()`` never decreases; it only changes while the loop is idle.
* Timers with equal ``when`` fire in the order they were scheduled (simpy orders its events by
  ``(time, priority, sequence)``; asyncio's heap alone does not: its ties come out scrambled).
* Tasks get per-loop names ``Task-1``, ``Task-2``... (asyncio's counter is process-wide).
* So the same program yields the same callback order every run, in any process: nothing depends
  on ``id()``, hash seeds or wall time. Exception: callbacks posted from other threads land
  whenever the thread gets there.
* Quiescence (nothing ready, no timer, no executor job in flight) cannot end by itself. An
  unbounded run raises :class:`VirtualDeadlock` instead of blocking forever; a bounded run
  (:meth:`VirtualEventLoop.run_until`) jumps to its limit and returns.
* A ``threading.Event`` passed as ``stop_event`` interrupts a run from any thread with
  :class:`VirtualLoopInterrupted`, leaving tasks and state as they were; clear it to resume.

Threads. Work sent to ``run_in_executor`` / ``asyncio.to_thread`` is tracked: while any is in
flight, virtual time stands still and the loop waits in real time for it, so a thread's work
takes zero virtual seconds. Other threads may call ``call_soon_threadsafe`` at any time; if the
loop would otherwise be quiescent it waits up to ``allow_real_wait_s`` real seconds for them.

Jupyter. A thread that already runs a loop (a notebook cell) cannot run another; call
:func:`~istos_nb.sim.vrun.run_in_thread` (with :func:`~istos_nb.sim.vrun.run_virtual`, in
``vrun.py``, which builds on this module).
Nothing here touches the event loop policy or the thread's "current" loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
import selectors
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from istos.errors import IstosError

from ..asyncio_internals import POLL_EVERY, VirtualScheduling

__all__ = [
    "VirtualDeadlock",
    "VirtualEventLoop",
    "VirtualLoopError",
    "VirtualLoopInterrupted",
    "set_ambient_stop_event",
    "virtual_now",
]

T = TypeVar("T")

_INF = math.inf
# Timers due within this of "now" fire together, as in asyncio. Fixed rather than the platform's
# monotonic resolution (15.6 ms on Windows) so that the same program coalesces the same way
# everywhere.
_RESOLUTION = 1e-9
# Real-time waits are sliced so that `stop_event` is honoured while waiting.
_REAL_WAIT_SLICE_S = 0.05
# Virtual seconds cancelled tasks get to finish their cleanup in `shutdown()`.
_CLEANUP_BUDGET_S = 3600.0

# The stop event `run_in_thread` (vrun.py) hands to every VirtualEventLoop created in its thread.
_ambient = threading.local()


def set_ambient_stop_event(event: threading.Event | None) -> None:
    """Give ``event`` as ``stop_event`` to every VirtualEventLoop this thread creates without
    one (what ``vrun.run_in_thread`` does in its helper thread)."""
    _ambient.stop_event = event


class VirtualLoopError(IstosError, RuntimeError):
    """Root of the errors the virtual event loop raises."""


class VirtualDeadlock(VirtualLoopError):
    """The loop is quiescent: nothing is ready and no timer is scheduled, so no task can resume.

    Raised by an unbounded run (``run_until_complete``, ``run_forever``, ``run_virtual`` without
    ``until``). The message names the pending tasks. The loop stays usable.
    """


class VirtualLoopInterrupted(VirtualLoopError):
    """The loop's ``stop_event`` was set; the run stopped between two iterations.

    Tasks are left exactly as they were; clear the event and run again to resume.
    """


class VirtualEventLoop(VirtualScheduling, asyncio.SelectorEventLoop):  # type: ignore[misc]
    """An asyncio event loop on virtual time; see the module docstring for the guarantees.

    ``start`` is the initial ``time()``. ``stop_event`` (default: the one :func:`run_in_thread`
    provides, if any) interrupts a run when set. ``allow_real_wait_s`` is how long a quiescent
    loop waits in real time for another thread's ``call_soon_threadsafe`` before giving up.

    ``loop.stop()`` is not thread-safe (as in asyncio); from another thread set the stop event or
    use ``call_soon_threadsafe(loop.stop)``.
    """

    def __init__(
        self,
        *,
        start: float = 0.0,
        stop_event: threading.Event | None = None,
        allow_real_wait_s: float = 0.0,
    ) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        if not allow_real_wait_s >= 0:
            raise ValueError(f"allow_real_wait_s must be >= 0, got {allow_real_wait_s!r}")
        self._now = float(start)
        self._limit: float | None = None  # set by run_until: where a bounded run stops
        self._next_seq = itertools.count().__next__
        self._next_task_number = itertools.count(1).__next__
        # Tasks in creation order, so that shutdown and error messages are deterministic
        # (asyncio.all_tasks() is a set ordered by id()). Pruned when it doubles.
        self._created: list[weakref.ref[asyncio.Task[Any]]] = []
        self._prune_at = 1024
        self._real_pending = 0  # executor jobs in flight: virtual time waits for them
        if stop_event is None:
            stop_event = getattr(_ambient, "stop_event", None)
        self._stop_event = stop_event
        self._allow_real_wait_s = float(allow_real_wait_s)
        self._countdown = POLL_EVERY  # iterations until the real selector is polled
        super().__init__(selectors.DefaultSelector())
        self._clock_resolution = _RESOLUTION
        # Freezing (SIGSTOP-like): when set, every callback asks ``gate()`` in its own context
        # as it comes due; a list back means "frozen": it is parked there to run on resume.
        self.gate: Callable[[], list[tuple[Any, tuple[Any, ...], contextvars.Context]] | None
                            ] | None = None

    if TYPE_CHECKING:
        # BaseEventLoop internals this loop builds on, absent from typeshed's stubs (stable
        # across 3.10-3.13); the scheduling ones are declared in
        # asyncio_internals.VirtualScheduling.
        _selector: selectors.BaseSelector

    # -- the clock --------------------------------------------------------------------------

    def time(self) -> float:
        """Virtual seconds; never decreases."""
        return self._now

    def _advance(self, when: float) -> None:
        if when > self._now:
            self._now = float(when)
            # _run_once fires timers with when < now + resolution; far from zero a float has no
            # room for 1 ns (ulp(2e9) is 2.4e-7), so the due timer would never fire.
            if when + self._clock_resolution == when:
                self._clock_resolution = math.ulp(when)

    # -- tasks ------------------------------------------------------------------------------

    def call_soon(  # type: ignore[override]  # as call_at above
        self, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """As asyncio's (gated while a freeze is possible: see ``gate``)."""
        if self.gate is not None:
            callback, args = self._gated, (callback, *args)
        return super().call_soon(callback, *args, context=context)

    def _gated(self, callback: Callable[..., object], *args: Any) -> None:
        gate = self.gate
        parked = gate() if gate is not None else None
        if parked is None:
            callback(*args)
        else:
            parked.append((callback, args, contextvars.copy_context()))

    def create_task(
        self, coro: Coroutine[Any, Any, T] | Generator[Any, None, T], *, name: object = None,
        **kwargs: Any,
    ) -> asyncio.Task[T]:
        """As asyncio's ``create_task``; unnamed tasks are numbered per loop."""
        if name is None:
            name = f"Task-{self._next_task_number()}"
        task = super().create_task(coro, name=name, **kwargs)
        created = self._created
        created.append(weakref.ref(task))
        if len(created) >= self._prune_at:
            self._created = [r for r in created if (t := r()) is not None and not t.done()]
            self._prune_at = max(1024, 2 * len(self._created))
        return task

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """As asyncio's; virtual time stands still until the returned future is done."""
        fut = super().run_in_executor(executor, func, *args)
        self._real_pending += 1
        fut.add_done_callback(self._real_done)
        return fut

    def _real_done(self, _fut: object) -> None:
        self._real_pending -= 1

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        """As asyncio's; the helper thread it waits for freezes virtual time too."""
        self._real_pending += 1
        try:
            await super().shutdown_default_executor(*args, **kwargs)
        finally:
            self._real_pending -= 1

    # -- running ----------------------------------------------------------------------------

    def run_forever(self) -> None:
        """As asyncio's, but a set ``stop_event`` interrupts before the first iteration."""
        self._check_stop()
        super().run_forever()

    def run_until(self, t: float) -> None:
        """Run until virtual time ``t``, then return with whatever is still pending.

        Everything due at or before ``t`` runs, including callbacks those spawn at ``t``: the
        loop stops when its next step would be a timer later than ``t`` (or nothing at all) and
        ``time()`` is then exactly ``t``. Stepping is transparent: ``run_until(a)`` then
        ``run_until(b)`` runs the same callbacks in the same order as ``run_until(b)``.
        ``run_until(math.inf)`` runs until the loop is quiescent and leaves the clock there.

        Raises ValueError if ``t`` is NaN or in the past, RuntimeError if the loop is running,
        VirtualLoopInterrupted if ``stop_event`` is set.
        """
        if t != t or t < self._now:
            raise ValueError(f"cannot run until {t!r}: virtual time is already {self._now!r}")
        self.run_bounded(t)

    def run_bounded(self, limit: float | None) -> None:
        """Run until stopped, or until virtual time ``limit`` when given (as :meth:`run_until`,
        unchecked). Unbounded, quiescence raises :class:`VirtualDeadlock`; raises RuntimeError
        if the loop is running, VirtualLoopInterrupted if ``stop_event`` is set."""
        if self.is_running():
            raise RuntimeError("This event loop is already running")
        self._limit = limit
        try:
            self.run_forever()
        finally:
            self._limit = None

    def _check_stop(self) -> None:
        event = self._stop_event
        if event is not None and event.is_set():
            raise VirtualLoopInterrupted(
                f"stop_event was set: run interrupted at virtual time {self._now!r}; "
                "clear the event and run again to resume"
            )

    def _on_idle(self, when: float) -> list[tuple[selectors.SelectorKey, int]]:
        """Called where asyncio would block in select: nothing is ready and the first live
        timer is due at ``when`` (``inf``: no timer), later than now. Move the clock there, or
        decide the run is over; return real I/O events if the loop waited for a thread."""
        self._check_stop()
        if self._ready:  # another thread slipped a callback in: run it before time moves
            return []
        if self._real_pending:  # an executor job is in flight: time waits for it
            return self._wait_real(None)
        limit = self._limit
        if when == _INF:  # nothing will ever happen by itself
            events = self._wait_real(self._allow_real_wait_s)
            if events or self._ready:
                return events
            if limit is None:
                raise VirtualDeadlock(self._deadlock_message())
            return self._stop_at(limit)  # a bounded run just skips to its end
        if limit is not None and when > limit:
            return self._stop_at(limit)
        self._advance(when)
        return []

    def _stop_at(self, limit: float) -> list[tuple[selectors.SelectorKey, int]]:
        if limit != _INF:
            self._advance(limit)
        self.stop()  # run_forever returns after this iteration, which runs nothing new
        return []

    def _wait_real(self, limit_s: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        """Wait in real time (up to ``limit_s``; None: no limit) for a thread to wake us."""
        selector = self._selector
        events = selector.select(0)
        # Real time is the point here: it bounds how long we wait for another thread.
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while not events and not self._ready:
            self._check_stop()
            slice_s = _REAL_WAIT_SLICE_S
            if deadline is not None:
                slice_s = min(slice_s, deadline - time.monotonic())
                if slice_s <= 0:
                    break
            events = selector.select(slice_s)
        return events

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        """This loop's unfinished tasks, in creation order.

        Iterate these rather than a set of tasks, whose order follows ``id()`` and so changes
        from run to run. Tasks not made through ``create_task`` come last, ordered by name.
        """
        ordered = [t for r in self._created if (t := r()) is not None and not t.done()]
        known = set(ordered)
        others = [t for t in asyncio.all_tasks(self) if t not in known]
        return ordered + sorted(others, key=lambda t: t.get_name())

    def _deadlock_message(self) -> str:
        tasks = self.pending_tasks()
        shown = ", ".join(_describe_task(t) for t in tasks[:5])
        if len(tasks) > 5:
            shown += f", ... {len(tasks) - 5} more"
        return (
            f"virtual time {self._now!r}: nothing is ready and no timer is scheduled, so no task "
            f"can ever resume ({len(tasks)} pending: {shown or 'none'}). Something waits on an "
            "Event, Future or Queue that nothing will set. Bound the run with run_until(t) or "
            "run_virtual(..., until=t), or pass allow_real_wait_s if another thread will call "
            "call_soon_threadsafe()."
        )

    # -- teardown ---------------------------------------------------------------------------

    def shutdown(self, cleanup_budget_s: float = _CLEANUP_BUDGET_S) -> None:
        """Cancel every pending task (in creation order), let them finish, then close the loop.

        Tasks get ``cleanup_budget_s`` virtual seconds to handle their cancellation; any still
        pending after that are reported through the exception handler and abandoned. Async
        generators and the default executor are shut down. ``stop_event`` is ignored from here
        on, so an interrupted run can still clean up. Exceptions other than cancellation raised
        by the tasks are reported through the exception handler, as ``asyncio.run`` does.
        """
        if self.is_closed():
            return
        if self.is_running():
            raise RuntimeError("shutdown() cannot be called while the loop is running")
        self._stop_event = None
        try:
            tasks = self.pending_tasks()
            if tasks:
                for task in tasks:
                    task.cancel()
                gathered = asyncio.gather(*tasks, return_exceptions=True)
                gathered.add_done_callback(lambda _f: self.stop())
                self.run_bounded(self._now + cleanup_budget_s)
                _report_shutdown(self, tasks, cleanup_budget_s)
            self.run_until_complete(self.shutdown_asyncgens())
            self.run_until_complete(self.shutdown_default_executor())
        finally:
            self.close()

def _describe_task(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', repr(coro))})"


def _report_shutdown(
    loop: VirtualEventLoop,
    tasks: list[asyncio.Task[Any]],
    budget_s: float,
) -> None:
    stuck = [t for t in tasks if not t.done()]
    if stuck:
        names = ", ".join(_describe_task(t) for t in stuck[:5])
        loop.call_exception_handler(
            {
                "message": f"{len(stuck)} task(s) still pending {budget_s} virtual seconds "
                f"after being cancelled at shutdown: {names}",
            }
        )
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during VirtualEventLoop shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )



def virtual_now() -> float:
    """The running VirtualEventLoop's virtual time.

    Raises RuntimeError if no loop is running in this thread or it is not a VirtualEventLoop.
    """
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualEventLoop):
        raise RuntimeError(
            f"virtual_now() needs a running VirtualEventLoop, not {type(loop).__name__}"
        )
    return loop._now
