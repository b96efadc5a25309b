"""Notebook dashboards: a simulator playground and a live queue monitor.

Built from ipywidgets, matplotlib and pandas only — no custom JavaScript — so the same code runs
in JupyterLab, Notebook 7, VS Code, Colab and Voila. Charts are PNG bytes in ``Image`` widgets
and tables are ``HTML`` widgets rather than ``Output`` + ``display``: an ``Output`` written while
Voila first executes a cell can hang the page (jupyter/nbclient#312), and a PNG is one message.

Stable DOM classes for tests and custom CSS: ``istos-dashboard`` (the top box), ``istos-run``
(Run button), ``istos-progress``, ``istos-status`` (says ``done: ...`` when a run finished),
``istos-scenario``, ``istos-param-<name>`` (each control), ``istos-chart`` (chart images),
``istos-table`` and ``istos-table-<tab>`` (table panes), ``istos-stats`` (the live stats line).

The simulator's scenario is built in ``widgets_scenario.py`` (pure, no ipywidgets) and the charts,
tables and tabs both dashboards show are rendered in ``_panels.py``; the public names of both stay
importable from here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from html import escape as _esc
from typing import Any

import ipywidgets as W
import pandas as pd

from istos_nb.sim.result import SimResult

# TABLE_ROWS, figure_png and table_html stay importable from here (re-exports: `as` themselves).
from ._panels import TABLE_ROWS as TABLE_ROWS
from ._panels import Panels, Shown
from ._panels import figure_png as figure_png
from ._panels import table_html as table_html
from ._sim_report import check_html, invariants_frame, jobs_intro, jobs_view, status_text
from .widgets_scenario import DEFAULT_PARAMS, _horizon, _merged, scenario_from_params

__all__ = ["DEFAULT_PARAMS", "LiveDashboard", "SimDashboard", "scenario_from_params"]

# (param, widget class, min, max, step, description with its unit)
_CONTROLS: tuple[tuple[str, type, float, float, float, str], ...] = (
    ("lease_s", W.FloatSlider, 1, 60, 1, "lease (s)"),
    ("max_attempts", W.IntSlider, 1, 10, 1, "max attempts"),
    ("retry_backoff_s", W.FloatSlider, 0, 10, 0.5, "backoff base (s)"),
    ("retry_backoff_max_s", W.FloatSlider, 1, 120, 1, "backoff max (s)"),
    ("retry_jitter", W.FloatSlider, 0, 1, 0.05, "jitter (±fraction)"),
    ("fail_p", W.FloatSlider, 0, 1, 0.05, "failure (prob./try)"),
    ("crash_p", W.FloatSlider, 0, 0.5, 0.01, "mid-job crash (prob.)"),
    ("service_s", W.FloatSlider, 0.1, 10, 0.1, "mean service (s)"),
    ("workers", W.IntSlider, 1, 8, 1, "workers (nodes)"),
    ("concurrency", W.IntSlider, 1, 8, 1, "slots per worker"),
    ("crashes_per_hour", W.FloatSlider, 0, 60, 1, "node crashes (/h each)"),
    ("clock_skew_s", W.FloatSlider, 0, 120, 1, "worker skew (±s)"),
    ("jobs", W.IntSlider, 10, 1000, 10, "jobs"),
    ("rate", W.FloatSlider, 0.5, 20, 0.5, "arrival rate (jobs/s)"),
    ("seed", W.IntText, 0, 0, 1, "seed"),
)


# -- the simulator dashboard ------------------------------------------------------------------

_RUN_SHARE = 0.9  # of the progress bar: the simulated run; drawing the results is the rest


class SimDashboard(Shown):
    """Controls for a :func:`scenario_from_params` scenario, a Run button and its results.

    ``run()`` (what the button calls) builds the scenario from the controls, runs it with the
    progress bar following virtual time (to 90 %; drawing the tabs fills the rest), fills the
    tabs (leases, retries, backoff, depth, jobs, invariants), sets the status to ``done:
    <summary>`` in the words the tabs use (see ``_sim_report``) and returns the ``SimResult``.
    The Jobs tab lists dead and unfinished jobs first; the invariants tab starts with a legend
    of the delivery check (ok / lost / duplicated / pending, one line each). A run
    blocks the calling thread (in a notebook the simulation runs in a helper thread and the
    kernel waits for it); the progress callback fires in that helper thread and only sets the
    bar's value, which ipykernel sends thread-safely while the kernel's own thread waits.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        p = _merged(params)
        self.controls: dict[str, W.ValueWidget] = {}
        style = {"description_width": "150px"}
        for name, cls, lo, hi, step, desc in _CONTROLS:
            if cls is W.IntText:
                control = cls(value=p[name], description=desc, style=style)
            else:
                control = cls(value=p[name], min=lo, max=hi, step=step, description=desc,
                              style=style, continuous_update=False)
            control.add_class(f"istos-param-{name}")
            control.observe(self._describe, names="value")
            self.controls[name] = control
        self._extra = {k: v for k, v in p.items() if k not in self.controls}
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.button.add_class("istos-run")
        self.button.on_click(self._clicked)
        self.progress = W.IntProgress(value=0, min=0, max=100, description="virtual time")
        self.progress.add_class("istos-progress")
        self.status = W.HTML(_esc("ready: press Run"))
        self.status.add_class("istos-status")
        self.scenario = W.HTML()
        self.scenario.add_class("istos-scenario")
        self.panels = Panels(("jobs", "invariants"))
        self.result: SimResult | None = None
        half = (len(_CONTROLS) + 1) // 2
        columns = [W.VBox(list(self.controls.values())[:half]),
                   W.VBox(list(self.controls.values())[half:])]
        self.widget = W.VBox([W.HBox(columns), self.scenario,
                              W.HBox([self.button, self.progress, self.status]),
                              self.panels.tab])
        self.widget.add_class("istos-dashboard")
        self._describe()

    @property
    def params(self) -> dict[str, Any]:
        """The scenario parameters the controls show now (plus defaults for the rest)."""
        values = {name: control.value for name, control in self.controls.items()}
        return _merged({**self._extra, **values})

    def run(self) -> SimResult:
        """Run the scenario the controls describe; fill the tabs; return the result.

        Raises whatever building or running the scenario raises, after showing it in the status.
        """
        params = self.params
        self.button.disabled = True
        self.progress.value = 0
        self.status.value = _esc("running…")
        try:
            sim, until = scenario_from_params(params)
            result = sim.run(until, progress=self._on_progress)
            self.status.value = _esc("drawing charts…")
            report = self._show(result, params)
        except Exception as exc:
            self.status.value = _esc(f"error: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.button.disabled = False
        self.result = result
        self.progress.value = self.progress.max  # full only once everything is shown
        self.status.value = _esc(status_text(result, params, report))
        return result

    def _clicked(self, _button: W.Button) -> None:
        try:
            self.run()
        except Exception:  # noqa: BLE001 - already in the status; a handler must not raise
            pass

    def _on_progress(self, t: float, until: float) -> None:
        # Called from the simulation thread ~100 times; send only real changes. The run fills
        # the bar to _RUN_SHARE; drawing the charts and tables fills the rest.
        value = min(int(self.progress.max * _RUN_SHARE),
                    int(self.progress.max * _RUN_SHARE * t / until))
        if value != self.progress.value:
            self.progress.value = value

    def _describe(self, _change: Any = None) -> None:
        try:
            p = self.params
        except ValueError as exc:
            self.scenario.value = _esc(f"invalid: {exc}")
            return
        self.scenario.value = _esc(
            f"{p['jobs']} jobs at {p['rate']:g}/s into queue 'jobs' on node 'owner'; "
            f"{p['workers']} workers x {p['concurrency']} slots; "
            f"runs to t={_horizon(p):g} virtual s")

    def _show(self, result: SimResult, params: Mapping[str, Any]) -> pd.DataFrame:
        """Fill the tabs; return the invariant report."""
        def drawn(n: int) -> None:  # 4 charts, then the tables: the last share of the bar
            share = _RUN_SHARE + (1 - _RUN_SHARE) * n / 5
            self.progress.value = max(self.progress.value, int(self.progress.max * share))

        self.panels.show_charts(result.job_events(), (
            params["retry_backoff_s"], params["retry_backoff_max_s"], params["retry_jitter"]),
            max_attempts=params["max_attempts"], after_each=drawn)
        self.panels.show_table("jobs", jobs_view(result), "jobs", intro=jobs_intro(result))
        report = result.check()
        self.panels.show_table("invariants", invariants_frame(report), "invariants checked",
                               intro=check_html(result))
        return report


# -- the live dashboard -----------------------------------------------------------------------

_LIVE_BACKOFF = (1.0, 600.0, 0.1)  # Istos' queue defaults, used when stats() does not say


class LiveDashboard(Shown):
    """Charts and tables of a live queue, refreshed every ``refresh_s`` seconds.

    ``live_queue`` is duck-typed: ``stats() -> dict``, ``jobs() -> DataFrame``,
    ``dead_letters() -> DataFrame`` and ``events(limit=...) -> DataFrame`` (see
    ``istos_nb.attach.LiveQueue``). The dashboard never closes it: whoever opened it does.

    Periodic refreshes run on one daemon thread, not an asyncio task: the client's methods
    block on the network (up to a request timeout), which on the kernel's event loop would
    freeze the notebook, and a thread behaves the same with or without a running loop. The
    thread stops on ``pause()`` (or the Pause toggle) and on ``close()``; ``refresh()`` does
    one refresh in the caller's thread. Refreshes never overlap (a lock). A failing refresh
    shows ``error: ...`` in the status and the timer keeps going (the owner may come back).
    """

    def __init__(self, live_queue: Any, refresh_s: float = 2.0, *, paused: bool = False,
                 event_limit: int = 1000,
                 backoff: tuple[float, float, float] | None = None) -> None:
        self.live_queue = live_queue
        self.event_limit = event_limit
        self._backoff = backoff
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.refreshes = 0
        self.interval = W.BoundedFloatText(value=refresh_s, min=0.1, max=3600, step=0.5,
                                           description="refresh (s)")
        self.pause_toggle = W.ToggleButton(value=paused, description="Pause", icon="pause")
        self.button = W.Button(description="Refresh", icon="refresh")
        self.stats_line = W.HTML()
        self.status = W.HTML(_esc("paused" if paused else "starting…"))
        for widget, cls in ((self.interval, "istos-refresh-s"), (self.pause_toggle, "istos-pause"),
                            (self.button, "istos-refresh"), (self.stats_line, "istos-stats"),
                            (self.status, "istos-status")):
            widget.add_class(cls)
        self.panels = Panels(("jobs", "dead letters"))
        self.widget = W.VBox([W.HBox([self.interval, self.pause_toggle, self.button,
                                      self.status]), self.stats_line, self.panels.tab])
        self.widget.add_class("istos-dashboard")
        self.button.on_click(lambda _b: self._refresh_quietly())
        self.pause_toggle.observe(self._on_pause, names="value")
        self.interval.observe(self._on_interval, names="value")
        if not paused:
            self._start()

    @property
    def ticking(self) -> bool:
        """Whether the periodic refresh thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def refresh(self) -> None:
        """Fetch stats, events, jobs and dead letters once and redraw; raises what they raise."""
        with self._lock:
            if self._closed:
                return
            stats = self.live_queue.stats()
            events = self.live_queue.events(limit=self.event_limit)
            jobs = self.live_queue.jobs(limit=TABLE_ROWS)
            dead = self.live_queue.dead_letters()
            backoff = self._backoff or tuple(  # type: ignore[assignment]
                stats.get(k, d) for k, d in zip(("retry_backoff_s", "retry_backoff_max_s",
                                                 "retry_jitter"), _LIVE_BACKOFF))
            self.panels.show_charts(events, backoff)
            self.panels.show_table("jobs", jobs, f"jobs (the owner's first {TABLE_ROWS} asked)")
            self.panels.show_table("dead letters", dead, "dead letters")
            self.stats_line.value = _esc(_stats_text(stats))
            self.refreshes += 1
            self.status.value = _esc(
                f"refreshed {time.strftime('%H:%M:%S')} ({len(events)} events)")

    def pause(self) -> None:
        """Stop periodic refreshes (the Pause toggle shows it)."""
        self.pause_toggle.value = True

    def resume(self) -> None:
        """Restart periodic refreshes at the current interval."""
        self.pause_toggle.value = False

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the refresh thread (waiting up to ``timeout_s`` for one in flight) and close
        every widget. Idempotent; the live queue stays open."""
        self._stop_thread(timeout_s)
        with self._lock:
            closed, self._closed = self._closed, True
        if not closed:
            super().close()

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - shown to the user; the next tick retries
            if not self._closed:
                self.status.value = _esc(f"error: {type(exc).__name__}: {exc}")

    def _start(self) -> None:
        stop = threading.Event()
        interval = float(self.interval.value)

        def tick() -> None:
            self._refresh_quietly()  # first refresh at once, then every interval
            while not stop.wait(interval):
                self._refresh_quietly()

        self._stop = stop
        self._thread = threading.Thread(target=tick, name="istos-live-dashboard", daemon=True)
        self._thread.start()

    def _stop_thread(self, timeout_s: float = 5.0) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._stop = self._thread = None

    def _on_pause(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self._stop_thread()
            self.status.value = _esc("paused")
        elif not self._closed:
            self._start()

    def _on_interval(self, _change: dict[str, Any]) -> None:
        # Restart so a new interval applies now, not after the old one runs out.
        if self.ticking:
            self._stop_thread()
            self._start()


def _stats_text(stats: Mapping[str, Any]) -> str:
    """One line: queue and node, job counts by state, rates, paused."""
    parts = [f"queue {stats.get('queue', '?')} on {stats.get('node', '?')}"]
    parts += [f"{state} {n}" for state, n in (stats.get("counts") or {}).items()]
    for key, label in (("enqueue_rate", "enqueued"), ("ack_rate", "acked")):
        if stats.get(key) is not None:
            parts.append(f"{label} {float(stats[key]):.1f}/s")
    if stats.get("paused"):
        parts.append("PAUSED")
    return " · ".join(parts)
