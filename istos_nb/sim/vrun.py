"""Running a simulation: :func:`run_virtual` on a fresh virtual loop, :func:`run_in_thread` beside
a running one.

Both build on :mod:`istos_nb.sim.vloop`, which defines the loop they run
(:class:`~istos_nb.sim.vloop.VirtualEventLoop`) and the per-thread stop event they share with it.

Jupyter. A thread that already runs a loop (a notebook cell) cannot run another; call
:func:`run_in_thread`, which runs the simulation in a fresh thread and turns a KeyboardInterrupt
into a clean stop. Nothing here touches the event loop policy or the thread's "current" loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from . import vloop
from .vloop import VirtualEventLoop

__all__ = ["fewer_gc_pauses", "run_in_thread", "run_virtual"]

# Allocations between two young-generation collections while a simulation runs (CPython's
# default is 700). A run allocates and frees millions of short-lived objects (tasks, futures,
# handles, messages); collecting every 700 of them, and now and then walking every object in
# the process, costs 5-10% of a 10k-job run.
GC_GEN0_THRESHOLD = 50_000

# Real seconds `run_in_thread` waits for an interrupted simulation to stop (read at each call,
# so setting it on this module takes effect).
INTERRUPT_GRACE_S = 5.0

T = TypeVar("T")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _as_coroutine(main: Any) -> Coroutine[Any, Any, Any]:
    if asyncio.iscoroutine(main):
        return main
    if callable(main):

        async def call() -> Any:
            return await main()

        return call()
    raise TypeError(f"expected a coroutine or a callable returning an awaitable, got {main!r}")


@contextlib.contextmanager
def fewer_gc_pauses() -> Iterator[None]:
    """Collect cyclic garbage less often inside the block; restore the thresholds after.

    Only the young generation's threshold is raised (to :data:`GC_GEN0_THRESHOLD`), so cycles
    are still collected, just in larger batches; reference counting frees everything else at
    once, as always. A collector the process disabled (threshold 0) stays disabled. The
    setting is process-wide for the duration of the block.
    """
    before = gc.get_threshold()
    if before[0] > 0:
        gc.set_threshold(max(before[0], GC_GEN0_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def run_virtual(
    main: Coroutine[Any, Any, T] | Callable[[], Awaitable[T]],
    *,
    until: float | None = None,
    start: float = 0.0,
    stop_event: threading.Event | None = None,
    allow_real_wait_s: float = 0.0,
) -> T | None:
    """Run ``main`` on a fresh :class:`VirtualEventLoop`, then shut the loop down cleanly.

    ``main`` is a coroutine, or a callable returning an awaitable (called inside the loop).
    Returns main's result, or ``None`` if virtual time reached ``until`` first (main is then
    cancelled with every other task). Raises main's exception, :class:`VirtualDeadlock` if an
    unbounded run goes quiescent, :class:`VirtualLoopInterrupted` if ``stop_event`` is set.
    Leftover tasks are cancelled and allowed to finish (see :meth:`VirtualEventLoop.shutdown`).

    Raises RuntimeError when this thread already runs an event loop (a notebook cell): use
    ``run_in_thread(run_virtual, main)`` there. The thread's event loop policy is never touched.
    """
    if _running_loop() is not None:
        if asyncio.iscoroutine(main):
            main.close()  # it will never run; don't warn that it was never awaited
        raise RuntimeError(
            "run_virtual() cannot run inside a running event loop (e.g. a Jupyter cell); "
            "use run_in_thread(run_virtual, main) to run the simulation in its own thread"
        )
    if until is not None and not until >= start:
        raise ValueError(f"until={until!r} is before start={start!r}")
    loop = VirtualEventLoop(start=start, stop_event=stop_event, allow_real_wait_s=allow_real_wait_s)
    try:
        task = loop.create_task(_as_coroutine(main))
        task.add_done_callback(lambda _t: loop.stop())
        loop.run_bounded(until)
        return task.result() if task.done() else None
    finally:
        loop.shutdown()


def _finished_within(finished: queue.SimpleQueue[bool], seconds: float) -> bool:
    try:
        finished.get(timeout=seconds)
    except queue.Empty:
        return False
    return True


def run_in_thread(fn: Callable[..., T], *args: Any, stop_event: threading.Event | None = None) -> T:
    """Call ``fn(*args)`` in a fresh thread and return its result or re-raise its exception.

    Use it where the calling thread already runs an event loop (Jupyter): the call blocks the
    caller until ``fn`` returns. Every VirtualEventLoop created in that thread without an
    explicit ``stop_event`` gets ``stop_event`` (a new Event if None). If the caller is
    interrupted (KeyboardInterrupt), the event is set, the thread gets a few seconds to stop
    (its virtual loop raises VirtualLoopInterrupted between two iterations, state intact), and
    the interrupt is re-raised. The thread runs in a copy of the caller's contextvars.
    """
    event = stop_event if stop_event is not None else threading.Event()
    outcome: dict[str, Any] = {}
    # The thread says it finished on a SimpleQueue, not a threading.Event: a KeyboardInterrupt
    # landing inside Event.wait() can leave the Event's (non-reentrant) lock held by this
    # thread, so the next wait (the grace period below) and the other thread's set() would
    # both block forever. SimpleQueue is C code with no Python-level lock to leave behind.
    finished: queue.SimpleQueue[bool] = queue.SimpleQueue()
    context = contextvars.copy_context()

    def target() -> None:
        vloop.set_ambient_stop_event(event)
        try:
            outcome["value"] = context.run(fn, *args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc
        finally:
            finished.put(True)

    thread = threading.Thread(target=target, name="istos-virtual-loop", daemon=True)
    thread.start()
    # Wait in slices: a plain join() is not interruptible everywhere, and a KeyboardInterrupt
    # landing inside Thread.join() can mark a live thread as stopped (CPython 3.11's bpo-45274
    # handling), after which join() no longer waits.
    try:
        while not _finished_within(finished, 0.1):
            pass
    except BaseException:
        event.set()
        _finished_within(finished, INTERRUPT_GRACE_S)
        raise
    thread.join()
    if "error" in outcome:
        error = outcome.pop("error")
        try:
            raise error
        finally:
            del error  # break the frame <-> traceback cycle
    return outcome["value"]  # type: ignore[no-any-return]
