"""Running async tests on the simulator's virtual loop instead of pytest-asyncio's real one."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from istos_nb.sim.vrun import run_virtual

C = TypeVar("C", bound=type)

#: virtual seconds a test may take before it counts as hung (costs no wall time)
VIRTUAL_BOUND_S = 3600.0


def on_virtual_loop(cls: C) -> C:
    """Class decorator: every async ``test*`` method (inherited ones too) runs on a fresh
    :class:`~istos_nb.sim.vloop.VirtualEventLoop`, so timeouts and delays are exact virtual time.

    Fixtures must be synchronous (pytest-asyncio's loop is not the one the test runs on).
    """
    for name in dir(cls):
        fn = getattr(cls, name)
        if name.startswith("test") and inspect.iscoroutinefunction(fn):
            setattr(cls, name, _virtual(fn))
    return cls


def _virtual(fn: Callable[..., Any]) -> Callable[..., None]:
    done = object()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        async def main() -> object:
            await fn(*args, **kwargs)
            return done

        result = run_virtual(main, until=VIRTUAL_BOUND_S)
        assert result is done, f"{fn.__name__} still running at virtual {VIRTUAL_BOUND_S} s"

    return run
