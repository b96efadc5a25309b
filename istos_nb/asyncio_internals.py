"""The one module of ``istos_nb`` that touches asyncio's private members.

Checked on CPython 3.11 (the interpreter the suite runs on); the code mirrors asyncio's
``BaseEventLoop`` of CPython 3.10 to 3.13 and takes 3.14's ``_swap_current_task`` where it
exists. Everything else in the package uses only public names (``tests/test_layout.py`` checks
that), so a new Python version is checked here and nowhere else. Two loops the notebook side
drives build on it:

**The virtual loop's hot path.** :class:`VirtualScheduling` is mixed into
:class:`~istos_nb.sim.vloop.VirtualEventLoop` in front of ``asyncio.SelectorEventLoop``. It
replaces ``call_soon``, ``call_later``, ``call_at`` and ``_run_once`` with versions that run the
*same callbacks in the same order* as ``BaseEventLoop`` at a fraction of the cost, because a
simulation is nothing but these four calls, hundreds of thousands of times:

* The timer heap holds ``(when, seq, handle)`` tuples, so the heap compares in C; ``seq`` (call
  order) breaks ties, so equal times fire in the order they were scheduled (asyncio's own heap
  of handles breaks ties arbitrarily). ``(when, seq)`` is a total order, so the order timers pop
  in does not depend on the heap's shape.
* Handles are built by setting their slots directly rather than through two ``__init__``
  levels and a ``get_debug()`` call. In debug mode everything goes through asyncio's own code
  (source tracebacks, thread and callback checks, slow-callback warnings).
* One iteration does what ``BaseEventLoop._run_once`` does (drop cancelled timers, wait for I/O
  or move the clock, move due timers to the ready queue, run what was ready when the iteration
  began) without the selector round trip: the real selector is polled only every
  :data:`POLL_EVERY` iterations, and when the loop is idle the virtual clock jumps to the next
  timer instead of waiting (the owner's ``_on_idle`` decides).

**A running loop driven from inside one of its callbacks** (``istos_nb.live.reenter``):
:func:`can_reenter`, :func:`ready_queue` and :func:`run_nested_once`, one iteration of
``BaseEventLoop._run_once`` run nested, the way ``nest_asyncio`` re-enters a loop, without
patching asyncio globally.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import heapq
import math
import sys
import threading
import time
from asyncio import format_helpers
from asyncio.base_events import _format_handle  # type: ignore[attr-defined]
from asyncio.log import logger
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# As BaseEventLoop: rebuild the heap when more than half of over 100 timers are cancelled.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
# On the hot path (callbacks ready) the real selector is only polled every this many iterations:
# threads put their callbacks straight into the ready queue, so the poll is only needed to
# drain the self-pipe and to notice `stop_event`. It is 1 µs of syscall per iteration otherwise.
POLL_EVERY = 64

_new = object.__new__
_copy_context = contextvars.copy_context
_heappush = heapq.heappush
_heappop = heapq.heappop
_Handle = asyncio.Handle
_TimerHandle = asyncio.TimerHandle

TimerEntry = tuple[float, int, asyncio.TimerHandle]
_INF = float("inf")


class TimerHandle(asyncio.TimerHandle):
    """asyncio's TimerHandle with a cheaper ``cancel()``: one call instead of three
    (``TimerHandle.cancel``, the loop's ``_timer_handle_cancelled``, ``Handle.cancel``), same
    effect. Every request's timeout timer is cancelled when its reply comes; outside debug mode
    only (the loop builds stock handles in debug mode)."""

    __slots__ = ()

    def cancel(self) -> None:
        if self._cancelled:
            return
        if self._scheduled:  # type: ignore[attr-defined]
            self._loop._timer_cancelled_count += 1  # type: ignore[attr-defined]
        self._cancelled = True
        self._callback = None
        self._args = None  # type: ignore[assignment]


class VirtualScheduling:
    """Mixin: the scheduling methods of a virtual-time loop (see the module docstring)."""

    if TYPE_CHECKING:
        # Provided by VirtualEventLoop / BaseEventLoop (asyncio internals absent from typeshed).
        _now: float
        _clock_resolution: float
        _next_seq: Callable[[], int]
        _countdown: int
        _ready: collections.deque[asyncio.Handle]
        _scheduled: list[TimerEntry]
        _timer_cancelled_count: int
        _stopping: bool
        _closed: bool
        _debug: bool
        _current_handle: asyncio.Handle | None
        slow_callback_duration: float
        _selector: Any
        _stop_event: threading.Event | None
        _limit: float | None
        _real_pending: int
        gate: Callable[[], Any] | None  # freezing: see VirtualEventLoop.gate

        def _gated(self, callback: Callable[..., object], *args: Any) -> None: ...

        def _check_closed(self) -> None: ...

        def _check_thread(self) -> None: ...

        def _check_callback(self, callback: object, method: str) -> None: ...

        def _check_stop(self) -> None: ...

        def _on_idle(self, when: float) -> list[Any]: ...

        def _process_events(self, event_list: list[Any]) -> None: ...

        def time(self) -> float: ...

    # -- scheduling -------------------------------------------------------------------------

    # The stubs type these with TypeVarTuple (callback and args checked together); the runtime
    # signatures are the same, so the overrides are sound.
    def call_soon(
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """As asyncio's ``call_soon``."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._debug:
            return super().call_soon(callback, *args, context=context)  # type: ignore[misc]
        handle: Any = _new(_Handle)  # Any: typeshed omits the slots set below
        handle._context = context if context is not None else _copy_context()
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """As asyncio's ``call_later``: ``call_at(time() + delay, ...)``."""
        if delay is None:
            raise TypeError("delay must not be None")
        return self._timer(self._now + delay, callback, args, context)

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """As asyncio's ``call_at``; equal ``when`` values fire in call order."""
        if when is None:
            raise TypeError("when cannot be None")
        return self._timer(when, callback, args, context)

    def _timer(self, when: float, callback: Callable[..., object], args: tuple[Any, ...],
               context: contextvars.Context | None) -> asyncio.TimerHandle:
        if when != when:
            raise ValueError("when cannot be NaN")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self.gate is not None:  # a freeze is possible: the callback asks the gate first
            callback, args = self._gated, (callback, *args)
        timer: Any  # typeshed omits the slots set below
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
            timer = _TimerHandle(when, callback, args, self, context)  # type: ignore[arg-type]
            if timer._source_traceback:
                del timer._source_traceback[-1]
        else:
            timer = _new(TimerHandle)
            timer._context = context if context is not None else _copy_context()
            timer._loop = self
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        _heappush(self._scheduled, (when, self._next_seq(), timer))
        timer._scheduled = True
        return timer

    # -- one iteration ----------------------------------------------------------------------

    def _run_once(self) -> None:  # noqa: C901, PLR0912 - the hot path, kept in one piece
        """One loop iteration, as ``BaseEventLoop._run_once`` (see the module docstring)."""
        heap = self._scheduled
        count = len(heap)
        if (count > _MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            heap = self._drop_cancelled()
        else:
            while heap and heap[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                _heappop(heap)[2]._scheduled = False  # type: ignore[attr-defined]
        ready = self._ready
        events = None
        self._countdown -= 1
        if self._countdown <= 0:
            events = self._poll_real()
        # asyncio waits for I/O for `timeout` seconds: 0 when callbacks are ready, the loop is
        # stopping or the first timer is due; otherwise the idle handler moves the clock.
        if not events and not ready and not self._stopping:
            when = heap[0][0] if heap else _INF
            if when > self._now:
                stop, limit = self._stop_event, self._limit
                if (when < _INF and not self._real_pending and (limit is None or when <= limit)
                        and (stop is None or not stop.is_set())):
                    # _on_idle's usual case, inlined (it runs once per virtual instant):
                    # nothing else to wait for, so jump the clock to the next timer.
                    self._now = float(when)
                    if when + self._clock_resolution == when:  # see VirtualEventLoop._advance
                        self._clock_resolution = math.ulp(when)
                else:
                    events = self._on_idle(when)
        if events:
            self._process_events(events)
        events = None  # as asyncio: break cycles when an exception occurs
        end_time = self._now + self._clock_resolution
        while heap and heap[0][0] < end_time:
            timer = _heappop(heap)[2]
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        # Only what is ready now runs in this iteration; callbacks it schedules wait for the next.
        if self._debug:
            self._run_ready_debug(len(ready))
        else:
            self._run_ready(len(ready))

    def _run_ready(self, ntodo: int) -> None:
        popleft = self._ready.popleft
        handle: Any = None
        for _ in range(ntodo):
            handle = popleft()
            if handle._cancelled:
                continue
            # Handle._run, inlined (one Python call less per callback)
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                _report_callback_error(handle, exc)
        handle = None  # as asyncio: break cycles when an exception occurs

    def _drop_cancelled(self) -> list[TimerEntry]:
        live = []
        for entry in self._scheduled:
            if entry[2]._cancelled:
                entry[2]._scheduled = False  # type: ignore[attr-defined]
            else:
                live.append(entry)
        heapq.heapify(live)
        self._scheduled = live
        self._timer_cancelled_count = 0
        return live

    def _poll_real(self) -> list[Any]:
        """Every ``POLL_EVERY`` iterations: let other threads in, honour the stop event, and
        collect real I/O (the self-pipe of ``call_soon_threadsafe``) without waiting."""
        self._countdown = POLL_EVERY
        # A virtual loop never blocks, so it would hold the GIL for as long as it runs; a
        # thread that must set the stop event or post a callback could starve for seconds.
        # Hand the GIL over briefly (a zero sleep releases it) when there is such a thread.
        if threading.active_count() > 1:
            time.sleep(0)
        self._check_stop()
        return self._selector.select(0)

    def _run_ready_debug(self, ntodo: int) -> None:
        """The ready queue run as asyncio's debug mode does: warn about slow callbacks."""
        for _ in range(ntodo):
            handle = self._ready.popleft()
            if handle._cancelled:
                continue
            try:
                self._current_handle = handle
                t0 = self.time()
                handle._run()
                dt = self.time() - t0
                if dt >= self.slow_callback_duration:
                    logger.warning("Executing %s took %.3f seconds", _format_handle(handle), dt)
            finally:
                self._current_handle = None


def _report_callback_error(handle: Any, exc: BaseException) -> None:
    """What ``Handle._run`` does when its callback raises (outside debug mode)."""
    source = format_helpers._format_callback_source(
        handle._callback, handle._args)
    context: dict[str, Any] = {"message": f"Exception in callback {source}", "exception": exc,
                               "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    handle._loop.call_exception_handler(context)


# -- a running loop, driven from inside one of its callbacks ----------------------------------

def can_reenter(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether :func:`run_nested_once` can drive ``loop`` (a stock asyncio selector loop)."""
    return isinstance(loop, asyncio.BaseEventLoop) and all(
        hasattr(loop, name) for name in ("_ready", "_scheduled", "_selector", "_process_events"))


def ready_queue(loop: asyncio.AbstractEventLoop) -> collections.deque[Any]:
    """The loop's ready queue (``BaseEventLoop._ready``): callbacks to run next, in order."""
    ready: collections.deque[Any] = loop._ready  # type: ignore[attr-defined]
    return ready


def run_nested_once(loop: Any, max_wait_s: float, deferred: list[Any]) -> None:
    """One iteration of ``BaseEventLoop._run_once``, nested: poll I/O, move due timers, run
    what is ready, each with the caller's task stepped aside. A handle whose context is
    entered already (the caller's own) cannot run here: it goes to ``deferred``."""
    ready, scheduled = loop._ready, loop._scheduled
    while scheduled and scheduled[0]._cancelled:
        loop._timer_cancelled_count -= 1
        heapq.heappop(scheduled)._scheduled = False
    timeout = 0.0 if ready else max_wait_s
    if scheduled:
        timeout = min(timeout, max(0.0, scheduled[0]._when - loop.time()))
    loop._process_events(loop._selector.select(timeout))
    end_time = loop.time() + loop._clock_resolution
    while scheduled and scheduled[0]._when < end_time:
        handle = heapq.heappop(scheduled)
        handle._scheduled = False
        ready.append(handle)
    for _ in range(len(ready)):
        handle = ready.popleft()
        if handle._cancelled:
            continue
        context = getattr(handle, "_context", None)
        if context is not None and _entered(context):
            deferred.append(handle)  # e.g. ipykernel >= 7 runs each cell in one shared context
            continue
        _without_current_task(loop, handle._run)


def _entered(context: Any) -> bool:
    try:
        context.run(int)
    except RuntimeError:
        return True
    return False


def _without_current_task(loop: asyncio.AbstractEventLoop, run: Callable[[], None]) -> None:
    # A task stepped while the caller's task counts as current would raise "Cannot enter into
    # task ... while another task ... is being executed": step the caller's task aside.
    if sys.version_info >= (3, 14):
        swap = asyncio.tasks._swap_current_task  # type: ignore[attr-defined]
        current = swap(loop, None)
        try:
            run()
        finally:
            swap(loop, current)
        return
    tasks: dict[Any, Any] = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    current = tasks.pop(loop, None)
    try:
        run()
    finally:
        if current is not None:
            tasks[loop] = current
