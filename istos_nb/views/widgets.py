"""Notebook dashboards: a simulator playground and a live queue monitor.

One module at two layers: this implementation, and its public name :mod:`istos_nb.widgets`.

Built from ipywidgets, matplotlib and pandas only — no custom JavaScript — so the same code runs
in JupyterLab, Notebook 7, VS Code, Colab and Voila. Charts are PNG bytes in ``Image`` widgets
and tables are ``HTML`` widgets rather than ``Output`` + ``display``: an ``Output`` written while
Voila first executes a cell can hang the page (jupyter/nbclient#312), and a PNG is one message.

Stable DOM classes for tests and custom CSS: ``istos-dashboard`` (the top box), ``istos-run``
(Run button), ``istos-progress``, ``istos-status`` (says ``run finished: ...`` when a run
finished; "done" is only ever a job state),
``istos-scenario``, ``istos-param-<name>`` (each control), ``istos-chart`` (chart images),
``istos-table`` and ``istos-table-<tab>`` (table panes), ``istos-stats`` (the live stats line).

The live dashboard lives in ``live_dashboard.py`` (its tables in ``_livetables.py``). The
simulator's scenario is built in ``widgets_scenario.py`` (pure, no ipywidgets) and the charts,
tables and tabs both dashboards show are rendered in ``_panels.py``; the public names of both stay
importable from here.

Public as :mod:`istos_nb.widgets`, which re-exports this module's ``__all__`` (one module at
two layers: the public name, and this implementation).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape as _esc
from typing import Any

import ipywidgets as W
import pandas as pd

from istos_nb.sim.result import SimResult

from .live_dashboard import LiveDashboard as LiveDashboard

# TABLE_ROWS, figure_png and table_html stay importable from here (re-exports: `as` themselves).
from .panels import TABLE_ROWS as TABLE_ROWS
from .panels import Panels, Shown
from .panels import figure_png as figure_png
from .panels import table_html as table_html
from .scenario import (
    DEFAULT_PARAMS,
    auto_horizon,
    merged_params,
    run_horizon,
    scenario_from_params,
)
from .sim_report import check_html, invariants_frame, jobs_intro, jobs_view, status_text

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
    ("horizon_s", W.FloatSlider, 0, 3600, 10, "run for (virtual s)"),
    ("seed", W.IntText, 0, 0, 1, "seed"),
)
# 150 px of description, then a track of at least 200 px (the jobs slider's 100 steps had
# 50 px at the default width), then the readout.
_CONTROL_LAYOUT = {"width": "460px"}


# -- the simulator dashboard ------------------------------------------------------------------

_RUN_SHARE = 0.9  # of the progress bar: the simulated run; drawing the results is the rest


class SimDashboard(Shown):
    """Controls for a :func:`scenario_from_params` scenario, a Run button and its results.

    ``run()`` (what the button calls) builds the scenario from the controls, runs it with the
    progress bar following virtual time (to 90 %; drawing the tabs fills the rest), fills the
    tabs (leases, retries, backoff, depth, jobs, invariants), sets the status to ``run
    finished: <summary>`` in the words the tabs use (see ``sim_report``) and returns the
    ``SimResult``.
    The Jobs tab lists dead and unfinished jobs first; the invariants tab starts with a legend
    of the delivery check (ok / lost / duplicated / pending, one line each). A run
    blocks the calling thread (in a notebook the simulation runs in a helper thread and the
    kernel waits for it); the progress callback fires in that helper thread and only sets the
    bar's value, which ipykernel sends thread-safely while the kernel's own thread waits.
    Raises :class:`ConfigError` (a ``ValueError``) for an unknown parameter in ``params`` or
    a value out of range; ``run()`` shows a failure in the status line and raises it.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        p = merged_params(params)
        self.controls: dict[str, W.ValueWidget] = {}
        style = {"description_width": "150px"}
        for name, cls, lo, hi, step, desc in _CONTROLS:
            layout = W.Layout(**_CONTROL_LAYOUT)
            if cls is W.IntText:
                control = cls(value=p[name], description=desc, style=style, layout=layout)
            else:
                control = cls(value=p[name], min=lo, max=hi, step=step, description=desc,
                              style=style, continuous_update=False, layout=layout)
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
        self.panels = Panels(("jobs", "invariants"),
                             hint="Set the controls above, then press Run: this tab fills in.")
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
        return merged_params({**self._extra, **values})

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
        horizon = (f"runs to t={run_horizon(p):g} virtual s (set by 'run for')" if p["horizon_s"]
                   else f"runs to t={auto_horizon(p):g} virtual s (auto: time for the last "
                        "job to use its attempts; 'run for' > 0 overrides)")
        self.scenario.value = _esc(
            f"{p['jobs']} jobs at {p['rate']:g}/s into queue 'jobs' on node 'owner'; "
            f"{p['workers']} workers x {p['concurrency']} slots; {horizon}")

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
        self.panels.show_table("invariants", invariants_frame(report, result), "invariants checked",
                               intro=check_html(result))
        return report
