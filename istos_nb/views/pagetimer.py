"""Start a ``Play`` widget's timer in the page, also when the page shows it only later.

ipywidgets' ``Play`` starts its browser-side timer when the page sees ``playing`` change from
false to true; a Play that is already playing when the page first builds its view never
ticks. That is what a dashboard built and started in one cell gets under Voila (the page
connects after the cell ran): ``istos dashboard`` showed its first refresh and then no other.
:func:`start_play` sets ``playing`` and, until the first tick arrives, turns it off and on
again every little while, so the page sees a change once its view exists. It gives up after
``give_up_s`` (a page closed before it connected: its kernel must go quiet to be culled) and as
soon as someone else stops the timer.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ipywidgets as W

__all__ = ["start_play"]

GIVE_UP_S = 30.0


def start_play(play: W.Play, give_up_s: float = GIVE_UP_S) -> None:
    """``play.playing = True``, re-sent from a daemon thread until the page ticks (or
    ``give_up_s`` passed, or ``playing`` was set false by someone else)."""
    ticked = threading.Event()

    def seen(_change: Any) -> None:
        ticked.set()

    play.observe(seen, names="value")
    play.playing = True
    retry_s = max(1.0, 1.5 * play.interval / 1000)  # a tick is due within one interval

    def kick() -> None:
        deadline = time.monotonic() + give_up_s
        try:
            while not ticked.wait(retry_s) and time.monotonic() < deadline:
                if not play.playing:  # paused or closed meanwhile: not ours to restart
                    return
                play.playing = False  # the page sees false -> true: its timer starts
                play.playing = True
        finally:
            play.unobserve(seen, names="value")

    threading.Thread(target=kick, name="istos-page-timer", daemon=True).start()
