"""The Grafana dashboard and the KEDA ScaledObject in ``deploy/`` query only metrics that
``istos metrics`` serves.

The served names come from the exporter itself: its collector scrapes a real owner (with a
worker that settled jobs, so every family has samples) over a private Zenoh mesh, and the
scrape is parsed with prometheus-client's own text parser. Every PromQL expression in the
files (and in the how-to page's ``promql`` blocks) is parsed with a real PromQL parser, and
each selector's metric name, less ``_bucket``/``_sum``/``_count`` for a histogram, must be
among them.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import Istos
from istos.ops.metrics import QueueCollector
from istos.ops.operator import Operator

promql_parser = pytest.importorskip("promql_parser")

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "istos-dashboard.json"
SCALED_OBJECT = ROOT / "deploy" / "keda" / "scaledobject.yaml"
HOWTO = ROOT / "docs" / "autoscaling-and-dashboards.md"
WAIT_S = 60.0
HIST_SUFFIXES = ("_bucket", "_sum", "_count")
# Grafana's interval variables stand where PromQL wants a duration; a parser needs one.
GRAFANA_DURATIONS = re.compile(r"\$\{?__(rate_interval|interval|range)\}?")
LABEL_VALUES = re.compile(r"^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*\w+\s*\)$")


async def served_names() -> tuple[set[str], set[str]]:
    """(every sample name a scrape holds, the histogram families' names) from the exporter's
    collector over a real owner whose worker acked one job and failed another."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("a", max_attempts=1, rate_limit=(1000, 1.0))
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk")

    @worker.worker("a", concurrency=1)
    async def work(job: dict[str, Any]) -> None:
        if job["fail"]:
            raise RuntimeError("no")

    async with owner.serving(), worker.serving():
        for fail in (False, True):
            await owner.enqueue("a", {"fail": fail})
        counts = owner.owners["a"].state.counts
        await wait_until(lambda: counts["dead"] == 1 and counts["ready"] == 0
                         and counts["leased"] == 0, WAIT_S)
        async with Operator(configs[2], prefix=prefix, timeout_s=20) as op:
            registry = CollectorRegistry()
            registry.register(QueueCollector(op, ["a"], asyncio.get_running_loop(), 20.0))
            # The collector hands its work to this loop and waits: scrape from another thread.
            text = (await asyncio.to_thread(generate_latest, registry)).decode()
    families = list(text_string_to_metric_families(text))
    samples = {s.name for f in families for s in f.samples}
    assert "istos_owner_up" in samples and "istos_worker_acked_total" in samples, text
    return samples, {f.name for f in families if f.type == "histogram"}


def base_name(name: str, histograms: set[str]) -> str:
    """A histogram's series name as its family's (``istos_run_seconds_bucket`` ->
    ``istos_run_seconds``); any other name unchanged."""
    for suffix in HIST_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return name[: -len(suffix)]
    return name


def metric_names(expr: str) -> list[str]:
    """The metric names every selector of the PromQL ``expr`` names (parse errors raise)."""
    tree = promql_parser.parse(GRAFANA_DURATIONS.sub("5m", expr))
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.append(node.name)

    promql_parser.walk(tree, visit)
    assert names, f"no metric in {expr!r}"
    return names


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = LABEL_VALUES.match(var["query"]["query"])
            assert m, f"variable {var['name']}: not label_values(metric, label)"
            yield f"variable {var['name']}", m[1]


def keda_exprs() -> Iterator[tuple[str, str]]:
    doc = yaml.safe_load(SCALED_OBJECT.read_text(encoding="utf-8"))
    assert doc["kind"] == "ScaledObject"
    for i, trigger in enumerate(doc["spec"]["triggers"]):
        assert trigger["type"] == "prometheus"
        yield f"trigger {i}", trigger["metadata"]["query"]


def howto_exprs() -> Iterator[tuple[str, str]]:
    text = HOWTO.read_text(encoding="utf-8")
    for i, block in enumerate(re.findall(r"^```promql\n(.*?)^```$", text, re.M | re.S)):
        yield f"docs block {i}", block


@pytest.fixture(scope="module")
def served() -> tuple[set[str], set[str]]:
    return asyncio.run(served_names())


def test_every_query_names_a_metric_the_exporter_serves(served):
    samples, histograms = served
    known = {base_name(n, histograms) for n in samples} | histograms
    found: dict[str, set[str]] = {}
    for where, expr in [*dashboard_exprs(), *keda_exprs(), *howto_exprs()]:
        for name in metric_names(expr):
            if name.endswith(HIST_SUFFIXES):
                assert base_name(name, histograms) in histograms, f"{where}: {name}"
            assert base_name(name, histograms) in known, f"{where}: {name} is not served"
            found.setdefault(base_name(name, histograms), set()).add(where)
    # The dashboard covers depth, rates, both histograms, workers, throttling and owner up.
    for needed in ("istos_jobs", "istos_enqueued_total", "istos_acked_total",
                   "istos_wait_seconds", "istos_run_seconds", "istos_workers",
                   "istos_throttled_total", "istos_owner_up", "istos_oldest_ready_age_seconds"):
        assert needed in found, needed


def test_the_keda_triggers_scale_on_ready_jobs_and_the_oldest_ready_age():
    queries = dict(keda_exprs())
    assert {n for q in queries.values() for n in metric_names(q)} == {
        "istos_jobs", "istos_oldest_ready_age_seconds"}
    assert any('state="ready"' in q for q in queries.values())


def test_a_misspelt_or_unparsable_query_is_caught(served):
    samples, histograms = served
    assert base_name("istos_run_seconds_bucket", histograms) == "istos_run_seconds"
    assert base_name("istos_enqueued_count", histograms) == "istos_enqueued_count"
    assert "istos_jobs_ready" not in samples  # a name that looks right but is not served
    with pytest.raises(ValueError):
        metric_names("sum(rate(istos_acked_total[5m])")
