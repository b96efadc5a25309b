"""The live queue monitor: charts, a filtered Jobs tab, dead letters, one job in detail and,
only where the owner reports ``admin=True``, admin actions each behind a confirmation.

Stable DOM classes (besides ``istos_nb.views.widgets``): ``istos-jobs-state`` (state filter),
``istos-jobs-search`` (payload search, ``key=value``), ``istos-job-id`` / ``istos-job-show``
(pick a job), ``istos-job-detail``, ``istos-admin`` (the admin row, hidden unless admin=True),
``istos-admin-<action>``, ``istos-confirm`` with ``istos-confirm-yes`` / ``istos-confirm-no``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from html import escape as _esc
from typing import Any

import ipywidgets as W
import pandas as pd

from istos.errors import IstosError
from istos.ops.cli import parse_where
from istos_nb.views import charts

from . import livetables as lt
from . import opviews as ov
from .panels import TABLE_ROWS, Panels, Shown, figure_png
from .replay_panel import ReplayPanel
from .series_charts import series_depth_chart

SERIES_WINDOW = pd.Timedelta(minutes=10)

__all__ = ["LiveDashboard", "parse_search"]

_LIVE_BACKOFF = (1.0, 600.0, 0.1)  # Istos' queue defaults, used when stats() does not say
_NOT_DONE = ("ready", "delayed", "leased", "dead")
STATE_FILTERS: dict[str, list[str | None]] = {
    "not done": list(_NOT_DONE), "ready": ["ready"], "delayed": ["delayed"],
    "leased": ["leased"], "dead": ["dead"], "done": ["done"], "cancelled": ["cancelled"],
    "all": [None]}


def parse_search(text: str) -> dict[str, Any]:
    """``"to=a@b.com, user.id=7"`` as a ``where`` dict; values parsed as JSON when they are
    (7, true, "x"), else kept as text. Raises ValueError for a term without ``=``."""
    terms = filter(None, (t.strip() for t in text.replace(",", " ").split()))
    return parse_where(terms, bad=lambda term: ValueError(
        f"search term {term!r}: write key=value (dotted keys: user.id=7)"))


class LiveDashboard(Shown):
    """Charts and tables of a live queue, refreshed every ``refresh_s`` seconds.

    ``live_queue`` is duck-typed on :class:`istos_nb.live.attach.LiveQueue`: ``stats()``,
    ``jobs(state=..., where=..., limit=...)``, ``dead_letters()``, ``events(limit=...)`` and,
    when present, ``raw_events``, ``job``, ``pause``/``resume``/``requeue``/``purge_dead``.
    The dashboard never closes it: whoever opened it does.

    With ``page_timer=True`` a timer in the page (a hidden ``Play`` widget) asks for each
    refresh instead: a page nobody shows any more refreshes nothing (``istos dashboard``).
    Otherwise periodic refreshes run on one daemon thread (plain LiveQueue calls work from
    any thread); it stops on ``pause()`` (or the Pause toggle) and on ``close()``;
    ``refresh()`` does one refresh in the caller's thread. Refreshes never overlap (a lock).
    A failing refresh shows ``error: ...`` in the status and the timer keeps going (the owner
    may come back). The backoff chart draws the queue's own policy from
    ``stats()["policy"]``.
    """

    def __init__(self, live_queue: Any, refresh_s: float = 2.0, *, paused: bool = False,
                 event_limit: int = 1000,
                 backoff: tuple[float, float, float] | None = None,
                 page_timer: bool = False) -> None:
        self.live_queue = live_queue
        self.event_limit = event_limit
        self._backoff = backoff
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pending: tuple[str, Callable[[], Any]] | None = None
        self.refreshes = 0
        self.admin = False
        # page_timer: the page's own timer (a hidden Play widget) asks for each refresh, so a
        # closed page costs its kernel nothing and lets Voila cull it (istos dashboard).
        self._pulse = W.Play(interval=max(100, int(refresh_s * 1000)), max=1 << 30,
                             repeat=True, layout=W.Layout(display="none")) if page_timer \
            else None
        self._build_controls(refresh_s, paused)
        self._build_layout()
        if not paused:
            self._start()

    def _build_controls(self, refresh_s: float, paused: bool) -> None:
        """Every widget, each with its stable DOM class."""
        self.interval = W.BoundedFloatText(value=refresh_s, min=0.1, max=3600, step=0.5,
                                           description="refresh (s)")
        self.pause_toggle = W.ToggleButton(value=paused, description="Pause", icon="pause")
        self.button = W.Button(description="Refresh", icon="refresh")
        self.stats_line = W.HTML()
        self.status = W.HTML(_esc("paused" if paused else "starting…"))
        self.state_filter = W.Dropdown(options=list(STATE_FILTERS), value="not done",
                                       description="state")
        self.search = W.Text(placeholder="payload search: key=value", continuous_update=False)
        self.job_id = W.Combobox(placeholder="job id", ensure_option=False)
        self.show_job = W.Button(description="Show job")
        self.detail = W.HTML()
        self.timeline = W.Image(format="png", layout=W.Layout(display="none", max_width="640px",
                                                              height="auto"))
        self.admin_buttons = {name: W.Button(description=label) for name, label in (
            ("pause", "Pause queue"), ("resume", "Resume queue"), ("requeue", "Requeue job"),
            ("purge", "Purge dead job"), ("purge-all", "Purge all dead"),
            ("cancel-job", "Cancel job"), ("requeue-all", "Requeue all dead"),
            ("promote", "Promote delayed"), ("purge-old", "Purge dead > 1 h"))}
        self.admin_row = W.HBox(list(self.admin_buttons.values()),
                                layout=W.Layout(display="none"))
        self.confirm_text = W.HTML()
        self.confirm_yes = W.Button(description="Confirm", button_style="danger")
        self.confirm_no = W.Button(description="Cancel")
        self.confirm_box = W.HBox([self.confirm_text, self.confirm_yes, self.confirm_no],
                                  layout=W.Layout(display="none"))
        for widget, cls in ((self.interval, "istos-refresh-s"), (self.pause_toggle, "istos-pause"),
                            (self.button, "istos-refresh"), (self.stats_line, "istos-stats"),
                            (self.status, "istos-status"), (self.state_filter, "istos-jobs-state"),
                            (self.search, "istos-jobs-search"), (self.job_id, "istos-job-id"),
                            (self.show_job, "istos-job-show"), (self.detail, "istos-job-detail"),
                            (self.admin_row, "istos-admin"), (self.confirm_box, "istos-confirm"),
                            (self.confirm_yes, "istos-confirm-yes"),
                            (self.confirm_no, "istos-confirm-no"), (self.timeline, "istos-chart")):
            widget.add_class(cls)
        for name, b in self.admin_buttons.items():
            b.add_class(f"istos-admin-{name}")
            b.on_click(lambda _b, name=name: self.ask(name))

    def _build_layout(self) -> None:
        """The tab set (charts, jobs with its filters, dead letters, one job) and the handlers."""
        self.panels = Panels(("jobs", "dead letters", "workers", "latency"),
                             hint="Waiting for the first refresh (press Refresh).")
        jobs_pane = W.VBox([W.HBox([self.state_filter, self.search]), self.panels.tables["jobs"]])
        job_pane = W.VBox([W.HBox([self.job_id, self.show_job]), self.detail, self.timeline])
        tab, panes = self.panels.tab, self.panels.panes
        self.replay = ReplayPanel(self.live_queue)  # record the last minutes, run what-ifs
        tab.children = [*(panes[n] for n in self.panels.images), jobs_pane,
                        panes["dead letters"], job_pane, panes["workers"], panes["latency"],
                        self.replay.widget]
        tab.titles = [*self.panels.images, "jobs", "dead letters", "job", "workers", "latency",
                      "replay"]
        self.widget = W.VBox([W.HBox([self.interval, self.pause_toggle, self.button,
                                      self.status]), self.stats_line, self.admin_row,
                              self.confirm_box, tab,
                              *([] if self._pulse is None else [self._pulse])])
        if self._pulse is not None:
            self._pulse.observe(lambda _c: None if self._closed else self._refresh_quietly(),
                                names="value")
        self.widget.add_class("istos-dashboard")
        self.button.on_click(lambda _b: self._quietly(self.refresh))
        self.show_job.on_click(lambda _b: self._quietly(self.show_selected_job))
        self.confirm_yes.on_click(lambda _b: self._quietly(self.confirm))
        self.confirm_no.on_click(lambda _b: self.cancel())
        self.state_filter.observe(lambda _c: self._quietly(self.refresh), names="value")
        self.search.observe(lambda _c: self._quietly(self.refresh), names="value")
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
            jobs = self._fetch_jobs()
            dead = lq.dead_letters()
            series = self._fetch_series(now)
            self.panels.show_charts(
                events, self._policy_backoff(stats),
                depth=None if series is None else lambda: series_depth_chart(series))
            self.panels.tables["jobs"].value = lt.jobs_html(
                _oldest_first(jobs), now, jobs.attrs.get("total", len(jobs)))
            self.panels.tables["dead letters"].value = lt.dead_html(dead, now)
            self.panels.hide_hint("dead letters")
            self.job_id.options = tuple(dict.fromkeys([*jobs["job_id"], *dead["job_id"]]))
            if hasattr(lq, "workers"):  # the owner's workers table and its distributions
                self.panels.tables["workers"].value = ov.workers_html(lq.workers(), now)
                self.panels.hide_hint("workers")
            self.panels.tables["latency"].value = ov.latency_html(stats)
            self.panels.hide_hint("latency")
            self.admin = bool(stats.get("admin"))
            self.admin_row.layout.display = None if self.admin else "none"
            self.stats_line.value = _esc(_stats_text(stats))
            if self.job_id.value and hasattr(lq, "job"):
                self._show_job(self.job_id.value, events)
            self.refreshes += 1
            self.status.value = _esc(
                f"refreshed {time.strftime('%H:%M:%S')} ({len(events)} events)")

    def _fetch_series(self, now: pd.Timestamp) -> pd.DataFrame | None:
        """The owner's series of the last :data:`SERIES_WINDOW` (the depth chart draws the
        owner's counts, not a reconstruction from the event window); None when the live queue
        or its owner has none."""
        fetch = getattr(self.live_queue, "series", None)
        if fetch is None:
            return None
        try:
            return fetch(since=now - SERIES_WINDOW)
        except IstosError:  # an owner without the series op: the events' depth, as before
            return None

    def _fetch_jobs(self) -> pd.DataFrame:
        states = STATE_FILTERS[self.state_filter.value]
        where = parse_search(self.search.value)
        kwargs: dict[str, Any] = {"limit": TABLE_ROWS}
        if where:
            kwargs["where"] = where
        return self.live_queue.jobs(state=states if len(states) > 1 else states[0], **kwargs)

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
        what ``?job=ID`` in the dashboard's URL does."""
        self.job_id.value = str(job_id)
        self.panels.tab.selected_index = list(self.panels.tab.titles).index("job")
        self._quietly(self.show_selected_job)

    # -- admin, behind a confirmation ----------------------------------------------------------
    def ask(self, action: str) -> None:
        """Show the confirmation for admin ``action`` (pause, resume, requeue, purge,
        purge-all, cancel-job); nothing is sent before :meth:`confirm`. Only when the owner
        said admin."""
        if not self.admin:
            raise PermissionError("this queue was not declared with admin=True")
        job = self.job_id.value.strip()
        lq = self.live_queue
        actions: dict[str, tuple[str, Callable[[], Any]]] = {
            "pause": ("Pause claiming on this queue?", lq.pause),
            "resume": ("Resume claiming on this queue?", lq.resume),
            "requeue": (f"Requeue dead job {job} under a new id?", lambda: lq.requeue(job)),
            "purge": (f"Delete dead job {job} for good?", lambda: lq.purge_dead([job])),
            "purge-all": ("Delete ALL dead letters for good?", lambda: lq.purge_dead()),
            "cancel-job": (f"Cancel job {job}? (a running job is stopped by its worker)",
                           lambda: lq.cancel(job)),
            "requeue-all": ("Requeue EVERY dead letter (under its own id, afresh)?",
                            lambda: lq.requeue_dead()),
            "promote": ("Make every delayed job ready now?", lambda: lq.promote()),
            "purge-old": ("Delete every dead letter older than 1 h for good?",
                          lambda: lq.purge_dead(older_than_s=3600.0)),
        }
        if action == "cancel-job" and not job:
            self.status.value = _esc("pick a job in the job tab first")
            return
        if action in ("requeue", "purge") and not job:
            self.status.value = _esc("pick a dead job in the job tab first")
            return
        self._pending = actions[action]
        self.confirm_text.value = _esc(self._pending[0])
        self.confirm_box.layout.display = None

    def confirm(self) -> Any:
        """Run the action awaiting confirmation; returns its result (then refreshes)."""
        pending, self._pending = self._pending, None
        self.confirm_box.layout.display = "none"
        if pending is None:
            return None
        result = pending[1]()
        self.status.value = _esc(f"done: {pending[0].rstrip('?')}"
                                 + ("" if result is None else f" → {result}"))
        self.refresh()
        return result

    def cancel(self) -> None:
        """Drop the action awaiting confirmation."""
        self._pending = None
        self.confirm_box.layout.display = "none"
        self.status.value = _esc("cancelled")

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

    def _start(self) -> None:
        if self._pulse is not None:
            self._pulse.interval = max(100, int(float(self.interval.value) * 1000))
            self._pulse.playing = True
            self._refresh_quietly()  # the first at once; then one per tick of the page
            return
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


def _oldest_first(jobs: pd.DataFrame) -> pd.DataFrame:
    if "enqueued_at" not in jobs or jobs.empty:
        return jobs
    return jobs.sort_values("enqueued_at", kind="stable", ignore_index=True)


def _stats_text(stats: Mapping[str, Any]) -> str:
    """One line: queue and node, job counts by state, rates, oldest ready age, paused."""
    parts = [f"queue {stats.get('queue', '?')} on {stats.get('node', '?')}"]
    parts += [f"{state} {n}" for state, n in (stats.get("counts") or {}).items()]
    for key, label in (("enqueue_rate", "enqueued"), ("ack_rate", "acked")):
        if stats.get(key) is not None:
            parts.append(f"{label} {float(stats[key]):.1f}/s")
    if stats.get("oldest_ready_age_s") is not None:
        parts.append(f"oldest ready {lt.ago(float(stats['oldest_ready_age_s']))}")
    if stats.get("paused"):
        parts.append("PAUSED")
    if stats.get("admin"):
        parts.append("admin")
    return " · ".join(parts)
