"""The simulator playground's scenario: one queue, a pool of workers, faults, all from parameters.

:func:`scenario_from_params` is pure (it builds a :class:`~istos_nb.sim.Simulation`, never runs
it) and needs no ipywidgets, so scripts and tests can build the dashboard's scenario directly.
:class:`istos_nb.views.widgets.SimDashboard` drives it from its controls; ``istos_nb.views.widgets``
re-exports both public names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from istos_nb.sim import Simulation

__all__ = ["DEFAULT_PARAMS", "scenario_from_params"]

DEFAULT_PARAMS: dict[str, Any] = {
    "lease_s": 10.0, "max_attempts": 4, "retry_backoff_s": 1.0, "retry_backoff_max_s": 30.0,
    "retry_jitter": 0.2, "workers": 3, "concurrency": 2, "crashes_per_hour": 12.0,
    "clock_skew_s": 5.0, "jobs": 200, "rate": 2.0, "service_s": 1.0, "fail_p": 0.2,
    "crash_p": 0.02, "restart_after_s": 10.0, "seed": 1, "horizon_s": 0.0,
}
_INT_PARAMS = ("max_attempts", "workers", "concurrency", "jobs", "seed")
_MAX_DRAIN_S = 600.0  # idle virtual time is not free (worker polls), so cap the tail


def scenario_from_params(params: Mapping[str, Any] | None = None) -> tuple[Simulation, float]:
    """Build (simulation, until) from ``params`` merged over :data:`DEFAULT_PARAMS`.

    One node ``owner`` holds the queue ``"jobs"``; ``workers`` nodes ``worker-1..n`` each run
    ``concurrency`` slots of a handler with exponential service times (mean ``service_s``) that
    fails with ``fail_p`` and dies mid-job with ``crash_p``. Worker clocks are skewed evenly
    across ``[-clock_skew_s, +clock_skew_s]`` (one worker: ``+clock_skew_s``). Each worker node
    crashes at random, ``crashes_per_hour`` on average (0: never), and restarts after
    ``restart_after_s``; the owner never crashes, so no job is lost to volatile storage.
    ``jobs`` jobs arrive every ``1/rate`` s from t=0. ``until`` leaves time after the last
    arrival for a failing job to use up its attempts (capped at 600 virtual s), unless
    ``horizon_s`` > 0 sets it (jobs still running then are reported unfinished).
    Pure: builds, never runs. Raises ValueError for an unknown key or an invalid value.
    """
    p = merged_params(params)
    sim = Simulation(seed=p["seed"])
    owner = sim.node("owner")
    owner.queue("jobs", lease_s=p["lease_s"], max_attempts=p["max_attempts"],
                retry_backoff_s=p["retry_backoff_s"],
                retry_backoff_max_s=p["retry_backoff_max_s"], retry_jitter=p["retry_jitter"])
    handler = sim.handler(service_s=("exp", p["service_s"]), fail_p=p["fail_p"],
                          crash_p=p["crash_p"])
    n = p["workers"]
    names = [f"worker-{i + 1}" for i in range(n)]
    for i, name in enumerate(names):
        spread = 1.0 if n == 1 else 2.0 * i / (n - 1) - 1.0
        node = sim.node(name, clock_skew_s=p["clock_skew_s"] * spread)
        node.worker("jobs", concurrency=p["concurrency"])(handler)
    if p["crashes_per_hour"] > 0:
        sim.crash_randomly(names, mtbf_s=3600.0 / p["crashes_per_hour"],
                           restart_after=p["restart_after_s"])
    sim.enqueue_jobs("owner", "jobs", p["jobs"], rate=p["rate"])
    return sim, run_horizon(p)


def merged_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` over :data:`DEFAULT_PARAMS`, checked; raises ValueError for an unknown or
    out-of-range parameter."""
    unknown = set(params or {}) - set(DEFAULT_PARAMS)
    if unknown:
        raise ValueError(f"unknown scenario parameter(s) {sorted(unknown)}; "
                         f"known: {sorted(DEFAULT_PARAMS)}")
    p = {**DEFAULT_PARAMS, **(params or {})}
    for key in _INT_PARAMS:
        p[key] = int(p[key])
    for keys, bound, ok in ((("workers", "concurrency", "jobs", "max_attempts"), ">= 1",
                             lambda v: v >= 1), (("rate", "service_s"), "> 0", lambda v: v > 0),
                            (("crashes_per_hour", "horizon_s"), ">= 0", lambda v: v >= 0)):
        for key in keys:
            if not ok(p[key]):
                raise ValueError(f"{key} must be {bound}, got {p[key]}")
    return p


def run_horizon(p: Mapping[str, Any]) -> float:
    """Virtual seconds the run lasts: ``horizon_s`` when set, else :func:`auto_horizon`."""
    return float(p["horizon_s"]) if p.get("horizon_s", 0) > 0 else auto_horizon(p)


def auto_horizon(p: Mapping[str, Any]) -> float:
    # The last arrival may fail every attempt: each try costs a service time or, when it dies
    # mid-job, a whole lease; each retry waits its backoff; a crashed worker adds a restart.
    tries = p["max_attempts"]
    backoff = sum(min(p["retry_backoff_s"] * 2 ** k, p["retry_backoff_max_s"])
                  for k in range(tries - 1)) * (1 + p["retry_jitter"])
    drain = 10 + p["restart_after_s"] + tries * max(3 * p["service_s"], p["lease_s"]) + backoff
    return float(math.ceil((p["jobs"] - 1) / p["rate"] + min(drain, _MAX_DRAIN_S)))
