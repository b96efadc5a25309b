"""What a simulation run produced: event and job tables, invariant checks, Jepsen counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from istos.core.config import QueueConfig
from istos.errors import ConfigError, IstosError

from .checker import RunRecord, check, delivery_counts

EVENT_COLUMNS = ["t", "t_node", "node", "queue", "job_id", "kind", "attempt", "worker",
                 "error", "delay_s", "ready_at", "deadline", "priority"]
DETAIL_FIELDS = ("error", "delay_s", "ready_at", "deadline", "priority")


class InvariantViolation(IstosError, AssertionError):
    """``check(strict=True)`` found an invariant that does not hold; the message names each
    failed invariant and its detail. An ``AssertionError`` too, so a test fails with it."""


@dataclass
class SimResult:
    """What one :meth:`Simulation.run` produced: every event, each enqueue attempt, each
    handler side effect, and what the owners and storage held at the end.

    Tables (``events``, ``jobs``, :meth:`series`) are built on first use and cached;
    :meth:`check` and :attr:`counts` judge the run against the delivery guarantees.
    ``virtual_s`` and ``wall_s`` are the run's length on each clock; ``interrupted`` is True
    when it was stopped early (Ctrl-C), with what happened so far.
    """

    events_raw: list[dict[str, Any]] = field(repr=False)
    attempts: list[dict[str, Any]] = field(repr=False)
    effects: list[dict[str, Any]] = field(repr=False)
    queues: dict[str, QueueConfig] = field(repr=False)
    held: set[str] = field(repr=False)
    stored: set[str] = field(repr=False)
    volatile: bool
    owner_crashes: list[tuple[float, str]] = field(repr=False)
    heartbeat: set[tuple[str, str]] = field(repr=False)
    lossy: bool = field(repr=False)
    logs: list[dict[str, Any]] = field(repr=False)  # the job-log ledger (logledger.py)
    kept_logs: list[dict[str, Any]] = field(repr=False)  # the logs owners kept at the end
    until: float
    virtual_s: float
    wall_s: float
    interrupted: bool
    seed: int

    def __init__(self, *, events: list[dict[str, Any]], **kw: Any) -> None:
        self.events_raw = events
        for name, value in kw.items():
            setattr(self, name, value)

    @property
    def speedup(self) -> float:
        """Virtual seconds per wall second: how much faster than real time the run went
        (infinite for a run that took no measurable wall time)."""
        return self.virtual_s / self.wall_s if self.wall_s > 0 else float("inf")

    @cached_property
    def events(self) -> pd.DataFrame:
        """One row per event: owner JobEvents plus node events (crashed, restarted...).

        ``t`` is true virtual seconds; ``t_node`` what the emitting node's clock read."""
        rows = []
        for e in self.events_raw:
            detail = e.get("detail") or {}
            row = {k: e.get(k) for k in EVENT_COLUMNS[:8]}
            row.update({k: detail.get(k) for k in DETAIL_FIELDS})
            rows.append(row)
        df = pd.DataFrame(rows, columns=EVENT_COLUMNS)
        return df.astype({"attempt": "int64"}) if len(df) else df

    @cached_property
    def jobs(self) -> pd.DataFrame:
        """One row per job the owners saw (plus how many times its side effect ran)."""
        from istos_nb.data.frames import jobs_frame

        df = jobs_frame(self.job_events())
        effects = pd.Series([e["job_id"] for e in self.effects], dtype="object")
        counts = effects.value_counts() if len(effects) else pd.Series(dtype="int64")
        df["effects"] = df["job_id"].map(counts).fillna(0).astype("int64")
        return df

    def job_events(self) -> list[dict[str, Any]]:
        """The raw events in the form ``istos_nb.frames`` and ``istos_nb.charts`` take."""
        return [{k: e.get(k) for k in ("t", "node", "queue", "job_id", "kind", "attempt",
                                       "worker", "detail")} for e in self.events_raw]

    def series(self, queue: str | None = None, resolution: str = "1s") -> pd.DataFrame:
        """The frame ``LiveQueue.series()`` gives for a live owner, from this run's events
        (one ``queue``, or all of them), at "1s" or "1min" buckets up to the run's end.
        Raises :class:`ConfigError` for another ``resolution``."""
        from istos_nb.data.series import series_from_events

        if resolution not in ("1s", "1min"):
            raise ConfigError(f"resolution must be '1s' or '1min', got {resolution!r}")
        return series_from_events(self.job_events(), queue,
                                  1.0 if resolution == "1s" else 60.0, until=self.until)

    @cached_property
    def counts(self) -> dict[str, int]:
        """Jepsen total-queue style counts: ok, lost, duplicated, unexpected, recovered..."""
        return delivery_counts(self._record())

    def check(self, strict: bool = False) -> pd.DataFrame:
        """The invariant report, one row per invariant: invariant, ok, detail. With
        ``strict=True``, raises :class:`InvariantViolation` naming every invariant that does
        not hold (an ``AssertionError`` too, so a test fails with it)."""
        findings = check(self._record())
        df = pd.DataFrame([f.__dict__ for f in findings], columns=["invariant", "ok", "detail"])
        if strict and not df["ok"].all():
            bad = df[~df["ok"]]
            raise InvariantViolation("; ".join(f"{r.invariant}: {r.detail}"
                                               for r in bad.itertuples()))
        return df

    def _record(self) -> RunRecord:
        return RunRecord(events=self.events_raw, attempts=self.attempts, effects=self.effects,
                         queues=self.queues, held=self.held, volatile=self.volatile,
                         owner_crashes=self.owner_crashes, stored=self.stored,
                         heartbeat=getattr(self, "heartbeat", set()),
                         lossy=getattr(self, "lossy", False),
                         logs=getattr(self, "logs", []),
                         kept_logs=getattr(self, "kept_logs", []),
                         outbox=getattr(self, "outbox", []),
                         end_t=float(getattr(self, "virtual_s", 0.0)),
                         outbox_waiting=getattr(self, "outbox_waiting", set()),
                         batches=getattr(self, "batches", []),
                         batch_headers=getattr(self, "batch_headers", {}),
                         chords=getattr(self, "chords", []),
                         chains=getattr(self, "chains", []))

    def summary(self) -> str:
        """One line for a human: seed, virtual and wall time, events, and the delivery counts
        (ok, lost, stranded, duplicated, pending). Never raises."""
        c = self.counts
        return (f"seed {self.seed}: {self.virtual_s:.0f} virtual s in {self.wall_s:.2f} wall s "
                f"(x{self.speedup:,.0f}); {len(self.events_raw)} events; ok {c['ok']}, "
                f"lost {c['lost']}, stranded {c['stranded']}, duplicated {c['duplicated']}, "
                f"pending {c['pending']}"
                + (" [interrupted]" if self.interrupted else ""))
