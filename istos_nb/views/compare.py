"""Compare a recorded trace with its replays: one table side by side, and overlay charts.

``compare(trace, result, *others)`` measures each run the same way, from its events: per job
the wait (first claim minus when it became ready), per finished delivery the run time, how many
jobs ended done or dead, redeliveries (leases that ran out), duplicated runs (a job run to
completion more than once: from the side effects a simulation counts, from extra acks in a
recording, which cannot see a run whose ack was refused), the attempts histogram and the peak
depth (ready plus delayed). Times are seconds from each run's first arrival, so the recorded
run and its replays line up on one axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from istos.errors import ConfigError

from ..data.frames import depth_frame
from ..data.trace import Trace
from ..sim.replay import replay
from ..sim.result import SimResult
from ..sim.simulation import ScenarioError
from .chartkit import axes_for, done, label

__all__ = ["compare", "compare_chart", "predict", "run_metrics", "PREDICTED"]

Run = Trace | SimResult
_QUANTILES = (50, 95, 99)
# The figures predict() aggregates: every number of run_metrics (the histogram is a mapping).
PREDICTED = ("wait_p50", "wait_p95", "wait_p99", "run_p50", "done", "dead", "redeliveries",
             "duplicated_runs", "peak_depth")


def _as_trace(run: Run, queue: str | None) -> Trace:
    if isinstance(run, Trace):
        return run
    if isinstance(run, SimResult):
        return Trace.from_events(run.job_events(), queue=queue, source="simulation")
    raise TypeError(f"compare takes Trace and SimResult objects, got {type(run).__name__}")


def _duplicated_runs(run: Run, trace: Trace) -> int:
    """Completed runs beyond the first, per job, summed."""
    if isinstance(run, SimResult):
        ids = pd.Series([e["job_id"] for e in run.effects if e["queue"] == trace.queue],
                        dtype=object)
    else:
        ids = trace.attempts.loc[trace.attempts["outcome"] == "acked", "job_id"]
    counts = ids.value_counts()
    return int((counts - 1).clip(lower=0).sum())


def run_metrics(run: Run, queue: str | None = None) -> dict[str, Any]:
    """The figures :func:`compare` shows for one run (a dict; waits and runs in seconds)."""
    trace = _as_trace(run, queue)
    jobs, att = trace.jobs, trace.attempts
    first = att[att["attempt"] == 1].drop_duplicates("job_id").set_index("job_id")
    ready = (jobs["arrival"] + jobs["delay_s"]).set_axis(jobs["job_id"])
    waits = (first["claimed"] - ready.reindex(first.index)).dropna().to_numpy()
    runs = trace.run_times().to_numpy()
    last = _final_states(trace)
    attempts = att.groupby("job_id")["attempt"].max() if len(att) else pd.Series(dtype=int)
    depth = depth_frame(trace.frame)
    out: dict[str, Any] = {"jobs": len(jobs)}
    for q in _QUANTILES:
        out[f"wait_p{q}"] = float(np.percentile(waits, q)) if len(waits) else float("nan")
    out["run_p50"] = float(np.median(runs)) if len(runs) else float("nan")
    out["done"] = int((last == "done").sum())
    out["dead"] = int((last == "dead").sum())
    out["redeliveries"] = int((att["outcome"] == "expired").sum())
    out["duplicated_runs"] = _duplicated_runs(run, trace)
    out["attempts_hist"] = {int(k): int(v) for k, v in
                            attempts.value_counts().sort_index().items()}
    out["peak_depth"] = int((depth["ready"] + depth["delayed"]).max()) if len(depth) else 0
    return out


def _final_states(trace: Trace) -> pd.Series:
    from ..data.frames import jobs_frame

    df = jobs_frame(trace.frame)
    df = df[df["job_id"].isin(set(trace.jobs["job_id"]))]
    return df["state"]


def compare(trace: Run, result: Run, *others: Run,
            names: Sequence[str] | None = None) -> pd.DataFrame:
    """One column per run (the recording first), one row per figure of :func:`run_metrics`.

    ``names`` labels the columns (default: "recorded", "replay", "replay 2"...). The attempts
    histogram is shown as ``{attempts: jobs}``. Raises ``TypeError`` for a run that is neither
    a :class:`Trace` nor a :class:`SimResult`, and :class:`ConfigError` (a ``ValueError``)
    when ``names`` does not give one label per run.
    """
    runs = [trace, result, *others]
    queue = trace.queue if isinstance(trace, Trace) else None
    labels = list(names) if names is not None else \
        ["recorded", "replay", *(f"replay {i + 2}" for i in range(len(others)))]
    if len(labels) != len(runs):
        raise ConfigError(f"names: {len(labels)} labels for {len(runs)} runs")
    table = {name: run_metrics(run, queue) for name, run in zip(labels, runs, strict=True)}
    return pd.DataFrame(table)


def compare_chart(trace: Run, result: Run, *others: Run, names: Sequence[str] | None = None,
                  ax: Any = None, figsize: tuple[float, float] = (9.0, 3.2)) -> Figure:
    """Queue depth (ready plus delayed) of the recording and its replays, overlaid on one time
    axis (seconds from each run's first arrival). Draws on ``ax`` if given, else on a new
    figure of ``figsize``; returns the figure. Raises as :func:`compare` does."""
    runs = [trace, result, *others]
    queue = trace.queue if isinstance(trace, Trace) else None
    labels = list(names) if names is not None else \
        ["recorded", "replay", *(f"replay {i + 2}" for i in range(len(others)))]
    fig, axes, owned = axes_for(ax, figsize)
    for i, (name, run) in enumerate(zip(labels, runs, strict=True)):
        t = _as_trace(run, queue)
        depth = depth_frame(t.frame)
        if depth.empty:
            continue
        axes.step(depth["t"] - t.t0, depth["ready"] + depth["delayed"], where="post",
                  label=name, linewidth=2.0 if i == 0 else 1.2,
                  linestyle="-" if i == 0 else "--")
    label(axes, "waiting jobs: recorded vs replayed", "seconds from the first arrival",
          "ready + delayed")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return done(fig, axes, owned)


def predict(trace: Trace, *, seeds: int | Sequence[int] = 3, **options: Any) -> pd.DataFrame:
    """What replay predicts for ``trace`` under ``options``: the numbers of :func:`run_metrics`
    (:data:`PREDICTED`) over one replay per seed, one row per figure, columns ``mean``, ``sd``
    (over the seeds), ``min``, ``max`` and one per seed (``seed 0``...).

    ``seeds``: how many (seeds 0..n-1) or which seeds; ``options``: what :func:`replay` takes
    (policy and fleet overrides). Under the recorded policy one seed measures what was
    recorded; a what-if that makes attempts the trace lacks (a shorter lease) draws their
    outcomes and races late acks against new claims, and one seed is one draw of those: the
    mean is the prediction and sd/min/max say how far one draw strays. Raises ScenarioError for
    bad ``seeds`` (and what :func:`replay` raises for bad options).
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int | Sequence) or isinstance(seeds, str):
        raise ScenarioError(f"predict: seeds must be a count or a list of seeds, got {seeds!r}")
    chosen = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not chosen or any(isinstance(s, bool) or not isinstance(s, int) for s in chosen):
        raise ScenarioError(f"predict: seeds must be a count >= 1 or integers, got {seeds!r}")
    runs = {f"seed {s}": run_metrics(replay(trace, seed=s, **options), trace.queue)
            for s in chosen}
    per_seed = pd.DataFrame({name: [m[k] for k in PREDICTED] for name, m in runs.items()},
                            index=list(PREDICTED), dtype="float64")
    stats = pd.DataFrame({"mean": per_seed.mean(axis=1), "sd": per_seed.std(axis=1, ddof=0),
                          "min": per_seed.min(axis=1), "max": per_seed.max(axis=1)})
    return pd.concat([stats, per_seed], axis=1)
