"""make demo's invariant report explains every line (istos_nb.views.run_report)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from istos_nb.sim import Simulation
from istos_nb.views.run_report import INVARIANT_MEANING, report_lines

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


@pytest.fixture(scope="module")
def result() -> Any:
    """A small run with lost acks (duplicates) and no chord, cancel, heartbeat or dead letter."""
    sim = Simulation(seed=3)
    sim.node("owner").queue("q", lease_s=5, max_attempts=5)
    sim.node("w").worker("q", concurrency=2)(sim.handler(service_s=0.5))
    sim.enqueue_jobs("owner", "q", 30, rate=5.0)
    sim.lose_acks(0.3)
    return sim.run(until=60.0, progress=None)


def test_every_invariant_the_checker_reports_has_a_meaning(result: Any) -> None:
    assert set(result.check()["invariant"]) <= set(INVARIANT_MEANING)


def test_duplicates_and_stranded_are_explained(result: Any) -> None:
    assert result.counts["duplicated"] > 0
    lines = report_lines(result)
    dup = next(line for line in lines if line.strip().startswith("duplicated "))
    assert f"duplicated {result.counts['duplicated']}" in dup and "at-least-once" in dup
    stranded = next(line for line in lines if line.strip().startswith("stranded "))
    assert "no owner serves it" in stranded


def test_checks_that_did_not_apply_say_n_a_not_ok(result: Any) -> None:
    lines = report_lines(result)
    na = [line for line in lines if "[n/a]" in line]
    for name in ("chord callback", "heart-beating holder", "cancelled job",
                 "dead only after max_attempts", "job logs kept", "batch callbacks",
                 "no batch count lost"):
        assert any(name in line for line in na), (name, lines)
        assert not any(name in line and "[ok]" in line for line in lines)
    assert any("[ok]" in line and "one live lease per job" in line for line in lines)
    # every applicable line carries its one-phrase meaning
    for line in lines:
        if "[ok]" in line:
            assert line.rstrip().endswith(")"), line


def test_a_violation_reads_fail(result: Any) -> None:
    report = result.check().copy()
    report.loc[0, ["ok", "detail"]] = [False, "1 lost"]
    lines = report_lines(result, pd.DataFrame(report))
    assert any(line.strip().startswith("[FAIL] no accepted job lost: 1 lost") for line in lines)


def test_a_run_with_dedup_windows_reports_that_check_as_applied() -> None:
    sim = Simulation(seed=4)
    owner = sim.node("owner")
    owner.queue("q", lease_s=5.0)
    sim.node("w").worker("q")(sim.handler(service_s=0.1))
    for t in (1.0, 5.0):  # sent, then resent after it finished: one job
        sim.at(t, owner.enqueue, "q", {"order": 1}, job_id="order-1", dedup_s=600.0)
    lines = report_lines(sim.run(until=30.0, progress=None))
    line = next(x for x in lines if "dedup window" in x)
    assert line.startswith("  [ok]") and "resend" in line
