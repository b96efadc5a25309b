"""The invariant report of a simulated run, in words a newcomer can read (``make demo``).

Every line says what it checked in one phrase, so ``duplicated 27`` beside ten ``[ok]`` lines
reads as what it is (at-least-once allows it) and "stranded" is never left unexplained. A check
whose situation never arose in the run (no heart-beating worker, no chord, nothing cancelled,
nothing dead-lettered) says ``[n/a]`` and why, instead of an ``[ok]`` it did not earn.
Pure (no printing): :func:`report_lines` returns the lines.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from istos_nb.sim.result import SimResult

__all__ = ["DELIVERY_WORDS", "INVARIANT_MEANING", "applies", "report_lines"]

# The delivery counts of SimResult.summary(), each in one phrase.
DELIVERY_WORDS: tuple[tuple[str, str], ...] = (
    ("ok", "accepted jobs whose handler ran to completion at least once"),
    ("duplicated", "of those, ran to completion more than once (a lost ack, an expired "
                   "lease): allowed by at-least-once delivery, so handlers must be idempotent"),
    ("lost", "accepted, never completed, and no owner holds it: a broken promise"),
    ("stranded", "accepted and still in storage, but no owner serves it, so no worker will "
                 "ever get it: a broken promise"),
    ("pending", "accepted, not completed, still held by the owner (dead-lettered, or not run "
                "yet when the run ended)"),
)

# Invariant name (as the checker reports it) -> what holding it means, in one phrase.
INVARIANT_MEANING: dict[str, str] = {
    "no accepted job lost": "every job the owner accepted is done, dead-lettered or still held",
    "no accepted job stranded (in storage, served by nobody)":
        "no job sits in storage with no owner left to hand it out",
    "one live lease per job (by the owner's clock)":
        "two workers never held the same job at once, whatever their own clocks said",
    "attempts <= max_attempts": "no job was tried more often than its queue allows",
    "retry delays respect the backoff policy":
        "each retry waited what the backoff policy allows: base, cap and jitter",
    "dead only after max_attempts": "a job is dead-lettered only once its attempts ran out",
    "priority, then FIFO among ready jobs":
        "claims took the highest priority first, oldest first among equals",
    "chord callback fires exactly once":
        "a chord's callback job was created once, however often its parts ran",
    "no lease expired while its heart-beating holder was alive and connected":
        "heartbeats kept every lease of a live, reachable worker alive",
    "a cancelled job never runs again": "after a cancel, no new attempt of that job started",
    "no second job for an id inside its dedup window":
        "a resend of a finished job's id within its dedup_s made no second job",
    "claims within the rate limit": "no window of per_s seconds handed out more than n claims",
    "group limits held": "no group held more leases at once, or claims per window, than allowed",
    "job logs kept as their attempts wrote them":
        "every kept ctx.log line was written by its attempt, in order, at most 100 lines of "
        "1 KiB; a settled attempt lost none, an expired one at most its last lines",
    "an expired job never ran":
        "a job that ended expired was never run, and not before its start deadline",
    "no job handed out unstarted past its start deadline":
        "a job with a start deadline was never handed out late for its first start",
    "no job claimed while its queue or group is paused":
        "while a pause held (stored: across restarts and failovers), no claim got its jobs",
    "never two jobs holding one unique key within its scope":
        "an enqueue whose unique key another job held within its scope added no job",
    "no child ran before its parents were done":
        "a job enqueued with after= was first claimed only after each parent's first ack (with "
        "on_parent_failure='run': after each parent ended), unless an operator promoted it",
    "a child whose parents all finished done is not left waiting":
        "a waiting job whose parents were all acked (long enough before the end for their "
        "reports' retries) was released or ended",
    "batch callbacks: at most once each, exactly once when due by the end":
        "each batch callback job was created at most once, and once its batch was closed and "
        "its condition held (all ended, all done, one dead), it was created",
    "no batch count lost across owner restarts and failovers":
        "each batch's home kept as many done, dead and cancelled members as the members' own "
        "events say, whatever crashed or failed over",
    "a chord's callback fires only after every member succeeded":
        "no chord callback job was created before each member's handler had returned",
    "a chord whose members were all acked fired its callback":
        "every chord whose members all ended acked created its callback job",
    "a chord stalled by a dead or cancelled member says so":
        "a chord member that died or was cancelled before the callback went out was named in "
        "a chord 'stalled' event, so the stall never goes unseen",
    "a chain's step is created only after the step before it succeeded":
        "no chain step job was created before the previous step's handler had returned",
    "a chain step that was acked has its next step":
        "every acked chain step (but the last) had created its successor",
}


def _has_dedup(result: SimResult) -> bool:
    return any(e["kind"] == "enqueued" and (e.get("detail") or {}).get("dedup_s")
               for e in result.events_raw)


def _has_unique_key(result: SimResult) -> bool:
    return any(e["kind"] == "enqueued" and (e.get("detail") or {}).get("unique_key") is not None
               for e in result.events_raw)


def _has_deadline(result: SimResult) -> bool:
    return any(e["kind"] == "enqueued" and (e.get("detail") or {}).get("start_by") is not None
               for e in result.events_raw)


def _kinds(result: SimResult) -> set[str]:
    return set(result.events["kind"]) if len(result.events) else set()


def _has_chord(result: SimResult) -> bool:
    ev = result.events
    return bool(len(ev)) and bool(((ev["kind"] == "enqueued")
                                   & ev["job_id"].astype(str).str.endswith(".callback")).any())


def _absent_when(prefix: str) -> tuple[Callable[[SimResult, str], bool], str]:
    """The rule of an invariant whose detail starts with ``prefix`` ("no chord", say) when
    the run had none of what it judges."""
    return (lambda r, d: not d.startswith(prefix), f"{prefix} in this run")


# Invariant -> (does the run contain the situation it is about?, what is missing when not).
_APPLIES: dict[str, tuple[Callable[[SimResult, str], bool], str]] = {
    "chord callback fires exactly once": (lambda r, d: _has_chord(r), "no chord in this run"),
    "a cancelled job never runs again": (lambda r, d: "cancelled" in _kinds(r),
                                         "nothing was cancelled"),
    "dead only after max_attempts": (lambda r, d: "dead_lettered" in _kinds(r),
                                     "no job was dead-lettered"),
    "retry delays respect the backoff policy": (lambda r, d: "retry_scheduled" in _kinds(r),
                                                "no job was retried"),
    "no second job for an id inside its dedup window": (lambda r, d: _has_dedup(r),
                                                        "no job was enqueued with dedup_s"),
    "claims within the rate limit": (lambda r, d: not d.startswith("no rate-limited"), ""),
    "group limits held": (lambda r, d: not d.startswith("no queue with group"), ""),
    "an expired job never ran": (lambda r, d: "expired" in _kinds(r), "no job expired"),
    "no job handed out unstarted past its start deadline": (
        lambda r, d: _has_deadline(r), "no job was enqueued with a start deadline"),
    "no job claimed while its queue or group is paused": (lambda r, d: "paused" in _kinds(r),
                                                          "nothing was paused"),
    "never two jobs holding one unique key within its scope": (
        lambda r, d: _has_unique_key(r), "no job was enqueued with a unique key"),
    "no child ran before its parents were done": (
        lambda r, d: d != "no job was enqueued with after=", "no job was enqueued with after="),
    "a child whose parents all finished done is not left waiting": (
        lambda r, d: d != "no job was enqueued with after=", "no job was enqueued with after="),
    "job logs kept as their attempts wrote them": (
        lambda r, d: not d.startswith(("no handler logged", "no log kept")), ""),
    "batch callbacks: at most once each, exactly once when due by the end":
        _absent_when("no batch"),
    "no batch count lost across owner restarts and failovers": _absent_when("no batch"),
    "a chord's callback fires only after every member succeeded": _absent_when("no chord"),
    "a chord whose members were all acked fired its callback": _absent_when("no chord"),
    "a chord stalled by a dead or cancelled member says so": _absent_when("no chord"),
    "a chain's step is created only after the step before it succeeded": _absent_when("no chain"),
    "a chain step that was acked has its next step": _absent_when("no chain"),
    "no lease expired while its heart-beating holder was alive and connected": (
        lambda r, d: not d.startswith(("no heart-beating", "not checked")), ""),
}


def applies(result: SimResult, invariant: str, detail: str) -> tuple[bool, str]:
    """(whether the check had anything to check in this run, why not when it did not)."""
    rule = _APPLIES.get(invariant)
    if rule is None:
        return True, ""
    test, why = rule
    return (True, "") if test(result, detail) else (False, why or detail)


def report_lines(result: SimResult, report: pd.DataFrame | None = None) -> list[str]:
    """The delivery counts, then one line per invariant: ``[ok]``, ``[FAIL]`` or ``[n/a]``,
    what was found, and what the check means."""
    report = result.check() if report is None else report
    counts = result.counts
    width = max(len(w) for w, _ in DELIVERY_WORDS) + 6
    lines = ["delivery (at-least-once: every accepted job completes at least once):"]
    lines += [f"  {f'{word} {counts[word]}':<{width}} {meaning}"
              for word, meaning in DELIVERY_WORDS]
    lines.append("invariants (replayed from the owner's events):")
    for row in report.itertuples():
        meaning = INVARIANT_MEANING.get(row.invariant, "")
        applicable, why = applies(result, row.invariant, row.detail)
        if not applicable:
            lines.append(f"  [n/a]  {row.invariant}: {why} (nothing to check)")
            continue
        verdict = "[ok]  " if row.ok else "[FAIL]"
        lines.append(f"  {verdict} {row.invariant}: {row.detail}"
                     + (f" ({meaning})" if meaning else ""))
    return lines
