"""The live queue monitor: charts, a paged Jobs tab, dead letters with per-row actions, one job
in detail and, only where the owner reports ``admin=True``, admin actions each behind a
confirmation (:mod:`istos_nb.views.admin_panel`), their outcome kept in a message line that
refreshes do not touch.

Every time chart (leases, retries, and depth and throughput from the owner's series) shows one
x span, :func:`chart_window`, ending at the refresh instant, on a UTC wall-clock axis. Only
the selected tab's chart is drawn at a refresh; another one is drawn when its tab is selected
(``Panels.show_charts(lazy=True)``): a page costs one chart per refresh, not five.

Stable DOM classes (besides ``istos_nb.views.widgets``): ``istos-jobs-state`` (state filter),
``istos-jobs-search`` (payload search, ``key=value``), ``istos-jobs-pager`` with
``istos-jobs-prev`` / ``istos-jobs-next`` (the Jobs tab's pages), ``istos-job-id`` /
``istos-job-show`` (pick a job), ``istos-job-detail``, ``istos-chart-window`` (the span the
time charts show, "… – HH:MM:SS UTC (now)"), ``istos-depth-caption`` (under the depth chart:
the owner's exact counts in its newest series bucket), the admin row's ``istos-admin``,
``istos-admin-<action>``, ``istos-confirm`` with ``istos-confirm-text`` / ``istos-confirm-yes``
/ ``istos-confirm-no`` and ``istos-message`` (see :mod:`istos_nb.views.admin_panel`), and the
dead letters' ``istos-dead``, ``istos-dead-row``, ``istos-dead-show`` / ``-resubmit`` /
``-purge`` (see :mod:`istos_nb.views.deadrows`), the batches tab's ``istos-batches-pane``
and ``istos-batch-members-pane`` (see :mod:`istos_nb.views.batchview`) and the dependencies
tab's ``istos-deps-pane`` (see :mod:`istos_nb.views.depview`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from html import escape as _esc
from typing import Any

import ipywidgets as W
import pandas as pd
from matplotlib.figure import Figure

from istos.errors import IstosError, JobNotFound
from istos.ops.cli import parse_where
from istos_nb.views import charts

from ..data.frames import events_frame
from . import batchview as bv
from . import depview as dv
from . import livetables as lt
from . import opviews as ov
from .admin_panel import AdminPanel
from .chartkit import is_wall_clock
from .deadrows import DEAD_ROWS, DeadRows
from .idle import IdleCheck
from .pager import Pager
from .pagetimer import start_play
from .panels import TABLE_ROWS, Panels, Shown, figure_png
from .replay_panel import ReplayPanel
from .series_charts import depth_caption, series_depth_chart, series_throughput_chart

SERIES_WINDOW = pd.Timedelta(minutes=10)
MIN_SPAN_S = 60.0  # the time charts show at least the last minute

__all__ = ["LiveDashboard", "chart_window", "parse_search"]

_LIVE_BACKOFF = (1.0, 600.0, 0.1)  # Istos' queue defaults, used when stats() does not say
_NOT_DONE = ("ready", "delayed", "leased", "dead")
STATE_FILTERS: dict[str, list[str | None]] = {
    "not done": list(_NOT_DONE), "ready": ["ready"], "delayed": ["delayed"],
    "leased": ["leased"], "dead": ["dead"], "done": ["done"], "cancelled": ["cancelled"],
    "expired": ["expired"], "all": [None]}


def parse_search(text: str) -> dict[str, Any]:
    """``"to=a@b.com, user.id=7"`` as a ``where`` dict; values parsed as JSON when they are
    (7, true, "x"), else kept as text. Raises ValueError for a term without ``=``."""
    terms = filter(None, (t.strip() for t in text.replace(",", " ").split()))
    return parse_where(terms, bad=lambda term: ValueError(
        f"search term {term!r}: write key=value (dotted keys: user.id=7)"))


def chart_window(events: pd.DataFrame, now_s: float) -> tuple[float, float] | None:
    """The one x span (epoch seconds) of every live time chart: from the first event of the
    window (at least :data:`MIN_SPAN_S` back, at most :data:`SERIES_WINDOW`) to ``now_s``, the
    refresh instant, so the leases, retries, depth and throughput line up and end at now.
    None for events not stamped by a wall clock (a recorded simulation): their own span."""
    earliest = now_s - SERIES_WINDOW.total_seconds()
    first = float(events["t"].min()) if len(events) else now_s
    if not is_wall_clock(first):
        return None
    return max(earliest, min(first, now_s - MIN_SPAN_S)), now_s


def _utc(epoch_s: float) -> str:
    return pd.Timestamp(epoch_s, unit="s", tz="UTC").strftime("%H:%M:%S")


class LiveDashboard(Shown):
    """Charts and tables of a live queue, refreshed every ``refresh_s`` seconds.

    ``live_queue`` is duck-typed on :class:`istos_nb.live.attach.LiveQueue`: ``stats()``,
    ``jobs(state=..., where=..., limit=..., offset=...)``, ``dead_letters()``,
    ``events(limit=...)`` and, when present, ``series``, ``raw_events``, ``job``,
    ``workers`` and the admin calls. The dashboard never closes it: whoever opened it does.

    With ``page_timer=True`` a timer in the page (a hidden ``Play`` widget) asks for each
    refresh instead: a page nobody shows any more refreshes nothing (``istos dashboard``).
    Otherwise periodic refreshes run on one daemon thread (plain LiveQueue calls work from
    any thread); it stops on ``pause()`` (or the Pause toggle) and on ``close()``;
    ``refresh()`` does one refresh in the caller's thread. Refreshes never overlap (a lock).
    A failing refresh shows ``error: ...`` in the status and the timer keeps going (the owner
    may come back). The backoff chart draws the queue's own policy from ``stats()["policy"]``
    and stops at its ``max_attempts``. The Jobs tab shows ``page_rows`` jobs a page, the dead
    letters tab ``dead_rows``. Building it raises nothing about the queue: a failure to reach
    the owner, also in the first refresh, shows in the status line instead.
    """

    def __init__(self, live_queue: Any, refresh_s: float = 2.0, *, paused: bool = False,
                 event_limit: int = 1000,
                 backoff: tuple[float, float, float] | None = None,
                 page_timer: bool = False, page_rows: int = TABLE_ROWS,
                 dead_rows: int = DEAD_ROWS) -> None:
        self.live_queue = live_queue
        self.event_limit = event_limit
        self._backoff = backoff
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.refreshes = 0
        self._idle = IdleCheck()  # a timer's refresh after which nothing moved draws nothing
        self._done_at = -float("inf")  # monotonic end of the last refresh
        self.window: tuple[float, float] | None = None  # the time charts' span, last refresh
        # page_timer: the page's own timer (a hidden Play widget) asks for each refresh, so a
        # closed page costs its kernel nothing and lets Voila cull it (istos dashboard).
        self._pulse = W.Play(interval=max(100, int(refresh_s * 1000)), max=1 << 30,
                             repeat=True, layout=W.Layout(display="none")) if page_timer \
            else None
        self._build_controls(refresh_s, paused, page_rows, dead_rows)
        self._build_layout()
        if not paused:
            self._start()

    def _build_controls(self, refresh_s: float, paused: bool, page_rows: int,
                        dead_rows: int) -> None:
        """Every widget, each with its stable DOM class."""
        self.interval = W.BoundedFloatText(value=refresh_s, min=0.1, max=3600, step=0.5,
                                           description="refresh (s)")
        self.pause_toggle = W.ToggleButton(value=paused, description="Pause", icon="pause")
        self.button = W.Button(description="Refresh", icon="refresh")
        self.stats_line = W.HTML()
        self.status = W.HTML(_esc("paused" if paused else "starting…"))
        self.window_line = W.HTML()
        self.depth_caption = W.HTML()  # the owner's exact counts under the depth chart
        self.state_filter = W.Dropdown(options=list(STATE_FILTERS), value="not done",
                                       description="state")
        self.search = W.Text(placeholder="payload search: key=value", continuous_update=False)
        self.jobs_pager = Pager("jobs", page_rows, self._refresh_quietly)
        self.job_id = W.Combobox(placeholder="job id", ensure_option=False)
        self.show_job = W.Button(description="Show job")
        self.detail = W.HTML()
        self.timeline = W.Image(format="png", layout=W.Layout(display="none", max_width="640px",
                                                              height="auto"))
        self.batch_id = W.Combobox(placeholder="batch id (this queue's)", ensure_option=False)
        self.batches_table = W.HTML(_esc("Waiting for the first refresh (press Refresh)."))
        self.members_table = W.HTML()
        self.deps_table = W.HTML(_esc("Waiting for the first refresh (press Refresh)."))
        self.admin_panel = AdminPanel(self.live_queue, lambda: self.job_id.value,
                                      self.refresh)
        self.dead_rows = DeadRows(self.open_job, self._ask_quietly, self._refresh_quietly,
                                  rows=dead_rows,
                                  hint="Waiting for the first refresh (press Refresh).")
        for widget, cls in ((self.interval, "istos-refresh-s"), (self.pause_toggle, "istos-pause"),
                            (self.button, "istos-refresh"), (self.stats_line, "istos-stats"),
                            (self.status, "istos-status"), (self.state_filter, "istos-jobs-state"),
                            (self.search, "istos-jobs-search"), (self.job_id, "istos-job-id"),
                            (self.show_job, "istos-job-show"), (self.detail, "istos-job-detail"),
                            (self.window_line, "istos-chart-window"),
                            (self.depth_caption, "istos-depth-caption"),
                            (self.timeline, "istos-chart"), (self.batch_id, "istos-batch-id"),
                            (self.batches_table, "istos-batches-pane"),
                            (self.members_table, "istos-batch-members-pane"),
                            (self.deps_table, "istos-deps-pane")):
            widget.add_class(cls)

    @property
    def admin(self) -> bool:
        """Whether the owner said this queue is admin (its buttons shown)."""
        return self.admin_panel.admin

    @property
    def message(self) -> W.HTML:
        """The outcome of the last admin action (refreshes leave it alone)."""
        return self.admin_panel.message

    def _build_layout(self) -> None:
        """The tab set (charts, jobs with its filters, dead letters, one job) and the handlers."""
        self.panels = Panels(("jobs", "workers", "latency"),
                             hint="Waiting for the first refresh (press Refresh).",
                             extra_charts=("throughput",))
        jobs_pane = W.VBox([W.HBox([self.state_filter, self.search, self.jobs_pager.widget]),
                            self.panels.tables["jobs"]])
        job_pane = W.VBox([W.HBox([self.job_id, self.show_job]), self.detail, self.timeline])
        tab, panes = self.panels.tab, self.panels.panes
        panes["depth"].children = (*panes["depth"].children, self.depth_caption)
        self.replay = ReplayPanel(self.live_queue)  # record the last minutes, run what-ifs
        batches_pane = W.VBox([self.batches_table, self.batch_id, self.members_table])
        tab.children = [*(panes[n] for n in self.panels.images), jobs_pane,
                        self.dead_rows.widget, job_pane, panes["workers"], panes["latency"],
                        batches_pane, self.deps_table, self.replay.widget]
        tab.titles = [*self.panels.images, "jobs", "dead letters", "job", "workers", "latency",
                      "batches", "dependencies", "replay"]
        self.widget = W.VBox([W.HBox([self.interval, self.pause_toggle, self.button,
                                      self.status]), self.stats_line, self.admin_panel.widget,
                              self.window_line, tab,
                              *([] if self._pulse is None else [self._pulse])])
        if self._pulse is not None:
            self._pulse.observe(self._on_tick, names="value")
        self.widget.add_class("istos-dashboard")
        self.button.on_click(lambda _b: self._quietly(self.refresh))
        self.show_job.on_click(lambda _b: self._quietly(self.show_selected_job))
        self.state_filter.observe(self._on_filter, names="value")
        self.search.observe(self._on_filter, names="value")
        self.pause_toggle.observe(self._on_pause, names="value")
        self.interval.observe(self._on_interval, names="value")

    @property
    def ticking(self) -> bool:
        """Whether periodic refreshes run (the thread, or the page's timer)."""
        if self._pulse is not None:
            return bool(self._pulse.playing)
        return self._thread is not None and self._thread.is_alive()

    def refresh(self) -> None:
        """Fetch stats, events, jobs and dead letters once and redraw; raises what they raise."""
        with self._lock:
            if self._closed:
                return
            lq, now = self.live_queue, pd.Timestamp.now(tz="UTC")
            stats = lq.stats()
            raw = getattr(lq, "raw_events", None)
            events = raw(limit=self.event_limit) if raw else lq.events(limit=self.event_limit)
            frame = events_frame(events)
            self.window = window = chart_window(frame, now.timestamp())
            jobs = self._fetch_jobs()
            dead = lq.dead_letters()
            series = self._fetch_series(
                window[0] if window else now.timestamp() - SERIES_WINDOW.total_seconds())
            policy = stats.get("policy") or {}
            self.panels.show_charts(frame, self._policy_backoff(stats),
                                    max_attempts=policy.get("max_attempts"),
                                    drawn_by=self._series_draws(frame, series, window),
                                    window=window, lazy=True)
            self.depth_caption.value = _esc(depth_caption(series))
            self.window_line.value = "" if window is None else _esc(
                f"time charts: {_utc(window[0])} – {_utc(window[1])} UTC (now)")
            total = jobs.attrs.get("total", len(jobs) if self.jobs_pager.offset == 0 else None)
            self.panels.tables["jobs"].value = lt.jobs_html(
                lt.oldest_first(jobs), now, total, offset=self.jobs_pager.offset)
            self.jobs_pager.shown(len(jobs), total)
            self.admin_panel.set_admin(bool(stats.get("admin")))
            self.admin_panel.expire()
            self.dead_rows.show(dead, now, self.admin)
            self.job_id.options = tuple(dict.fromkeys([*jobs["job_id"], *dead["job_id"]]))
            if hasattr(lq, "workers"):  # the owner's workers table and its distributions
                self.panels.tables["workers"].value = ov.workers_html(lq.workers(), now)
                self.panels.hide_hint("workers")
            self.panels.tables["latency"].value = ov.latency_html(stats)
            self.panels.hide_hint("latency")
            if hasattr(lq, "batches"):
                self._show_batches(lq, now)
            if hasattr(lq, "why"):
                self._show_deps(lq, now)
            self.stats_line.value = _esc(lt.stats_text(stats))
            if self.job_id.value and hasattr(lq, "job"):
                self._show_job(self.job_id.value, events)
            self.refreshes += 1
            self._done_at = time.monotonic()
            self.status.value = _esc(
                f"refreshed {_utc(now.timestamp())} UTC ({len(frame)} events)")
            self._idle.refreshed(stats)

    def _show_batches(self, lq: Any, now: pd.Timestamp) -> None:
        """The Batches tab: this queue's batches, and the chosen one's members (an owner that
        cannot list batches says so in the tab; the rest of the refresh goes on)."""
        try:
            frame = lq.batches(limit=200)
        except IstosError as exc:
            self.batches_table.value = _esc(f"batches: {type(exc).__name__}: {exc}")
            return
        self.batches_table.value = bv.batches_html(frame, now, frame.attrs.get("total"))
        self.batch_id.options = tuple(frame["batch_id"])
        chosen = self.batch_id.value or (frame["batch_id"].iloc[0] if len(frame) else "")
        if not chosen:
            self.members_table.value = ""
            return
        try:
            members = lq.batch_members(chosen)
        except JobNotFound:
            self.members_table.value = _esc(f"this queue holds no batch {chosen}")
            return
        self.members_table.value = bv.members_html(members, chosen, members.attrs.get("more"))

    def _show_deps(self, lq: Any, now: pd.Timestamp) -> None:
        """The Dependencies tab: the oldest waiting jobs, each with its owner's ``why`` (its
        parents' outcomes as reported). A read that fails says so in the tab, and shows no
        table that the owner did not just confirm; the rest of the refresh goes on."""
        try:
            jobs = lq.jobs(state="waiting", limit=dv.DEP_ROWS)
            whys = {str(j): lq.why(str(j)) for j in jobs["job_id"]}
        except IstosError as exc:
            self.deps_table.value = _esc(f"dependencies: {type(exc).__name__}: {exc}")
            return
        self.deps_table.value = dv.deps_html(lt.oldest_first(jobs), whys, now,
                                             jobs.attrs.get("total"))

    def _series_draws(self, frame: pd.DataFrame, series: pd.DataFrame | None,
                      window: tuple[float, float] | None) -> dict[str, Callable[[], Figure]]:
        """Depth and throughput from the owner's series (its counts, not the event window's);
        from the events only for an owner that keeps no series."""
        if series is None:
            return {"throughput": lambda: charts.throughput_chart(frame, window=window)}
        return {"depth": lambda: series_depth_chart(series, window=window),
                "throughput": lambda: series_throughput_chart(series, window=window)}

    def _fetch_series(self, since_s: float) -> pd.DataFrame | None:
        """The owner's series since ``since_s`` (the charts' window); None when the live
        queue or its owner has none."""
        fetch = getattr(self.live_queue, "series", None)
        if fetch is None:
            return None
        try:
            return fetch(since=since_s)
        except IstosError:  # an owner without the series op: the events' depth, as before
            return None

    def _fetch_jobs(self) -> pd.DataFrame:
        """The page of jobs the pager points at (back to the last page that has rows when the
        queue shrank under it)."""
        states = STATE_FILTERS[self.state_filter.value]
        where = parse_search(self.search.value)
        kwargs: dict[str, Any] = {"limit": self.jobs_pager.size}
        if where:
            kwargs["where"] = where
        state = states if len(states) > 1 else states[0]
        jobs = self.live_queue.jobs(state=state, offset=self.jobs_pager.offset, **kwargs)
        if jobs.empty and self.jobs_pager.clamp(jobs.attrs.get("total")):
            jobs = self.live_queue.jobs(state=state, offset=self.jobs_pager.offset, **kwargs)
        return jobs

    def _on_filter(self, _change: dict[str, Any]) -> None:
        self.jobs_pager.reset()  # a new filter or search starts at its first page
        self._quietly(self.refresh)

    def _policy_backoff(self, stats: Mapping[str, Any]) -> tuple[float, float, float]:
        if self._backoff is not None:
            return self._backoff
        policy = stats.get("policy") or stats
        return tuple(float(policy.get(k, d)) for k, d in zip(  # type: ignore[return-value]
            ("retry_backoff_s", "retry_backoff_max_s", "retry_jitter"), _LIVE_BACKOFF))

    # -- one job -----------------------------------------------------------------------------
    def show_selected_job(self) -> None:
        """Show the job named in the job id box (detail, attempts, retry timeline)."""
        with self._lock:
            raw = getattr(self.live_queue, "raw_events", None)
            self._show_job(self.job_id.value.strip(), raw(limit=self.event_limit) if raw else [])

    def _show_job(self, job_id: str, events: Any) -> None:
        if not job_id:
            return
        try:
            detail = self.live_queue.job(job_id)
        except LookupError as exc:
            self.detail.value = _esc(str(exc))
            self.timeline.layout.display = "none"
            return
        self.detail.value = lt.detail_html(detail, pd.Timestamp.now(tz="UTC")) \
            + ov.detail_extras_html(detail)
        mine = [e for e in events if isinstance(e, Mapping) and e.get("job_id") == job_id]
        if mine:
            self.timeline.value = figure_png(charts.retry_timeline(mine, job_ids=[job_id]))
            self.timeline.layout.display = None
        else:
            self.timeline.layout.display = "none"

    def open_job(self, job_id: str) -> None:
        """Select the job tab with ``job_id`` in it (shown at once and at every refresh):
        what ``?job=ID`` in the dashboard's URL and a dead letter's Show button do."""
        self.job_id.value = str(job_id)
        self.panels.tab.selected_index = list(self.panels.tab.titles).index("job")
        self._quietly(self.show_selected_job)

    # -- admin, behind a confirmation (istos_nb.views.admin_panel) -----------------------------
    def ask(self, action: str, job_id: str | None = None) -> None:
        """Show the confirmation for admin ``action`` (pause, resume, resubmit, purge,
        purge-all, cancel-job, redrive-all, promote, purge-old) on ``job_id`` (default: the
        job tab's); nothing is sent before :meth:`confirm`. Only when the owner said admin
        (else PermissionError)."""
        self.admin_panel.ask(action, job_id)

    def confirm(self) -> Any:
        """Run the action awaiting confirmation; returns its result (then refreshes). Its
        outcome stays in :attr:`message`."""
        return self.admin_panel.confirm()

    def cancel(self) -> None:
        """Drop the action awaiting confirmation (nothing is sent)."""
        self.admin_panel.cancel()

    def _ask_quietly(self, action: str, job_id: str) -> None:
        try:
            self.ask(action, job_id)
        except Exception as exc:  # noqa: BLE001 - a row's button: said in the message line
            self.admin_panel.say(f"error: {type(exc).__name__}: {exc}")

    # -- timer and lifecycle -------------------------------------------------------------------
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

    def _quietly(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - shown to the user; the next tick retries
            if not self._closed:
                self.status.value = _esc(f"error: {type(exc).__name__}: {exc}")

    def _refresh_quietly(self) -> None:
        self._quietly(self.refresh)

    def _on_tick(self, _change: dict[str, Any]) -> None:
        # The page's timer ticks on whether or not the kernel kept up: a tick queued behind a
        # slow refresh (five charts on a loaded machine) is dropped, so ticks never pile up
        # and a click waits for one refresh at most.
        if self._closed or time.monotonic() - self._done_at < 0.5 * float(self.interval.value):
            return
        self._quietly(self._tick)

    def _tick(self) -> None:
        """A timer's refresh: only the stats line while the owner's stats say nothing moved
        since the last full refresh (see :mod:`istos_nb.views.idle`), else :meth:`refresh`."""
        with self._lock:
            if self._closed:
                return
            stats = self.live_queue.stats()
            if self._idle.quiet(stats):
                self.stats_line.value = _esc(lt.stats_text(stats))
                self.refreshes += 1
                self._done_at = time.monotonic()
                self.status.value = _esc(f"refreshed {_utc(time.time())} UTC (nothing new)")
                return
        self.refresh()

    def _start(self) -> None:
        if self._pulse is not None:
            self._pulse.interval = max(100, int(float(self.interval.value) * 1000))
            start_play(self._pulse)  # (also when the page builds its view later)
            self._refresh_quietly()  # the first at once; then one per tick of the page
            return
        stop = threading.Event()
        interval = float(self.interval.value)

        def tick() -> None:
            self._refresh_quietly()  # first refresh at once, then every interval
            while not stop.wait(interval):
                self._quietly(self._tick)

        self._stop = stop
        self._thread = threading.Thread(target=tick, name="istos-live-dashboard", daemon=True)
        self._thread.start()

    def _stop_thread(self, timeout_s: float = 5.0) -> None:
        if self._pulse is not None:
            self._pulse.playing = False
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
