"""istos_nb.views.charts: artists match the stream (the one described in test_frames)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (only to prove charts never touch its state)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from test_frames import EVENTS, W0, W1, W2, claim, e, enq, retry, scenario  # noqa: E402

from istos_nb.data.frames import depth_frame, throughput_frame  # noqa: E402
from istos_nb.views.charts import (
    attempts_histogram,
    backoff_band,
    backoff_curve,
    depth_chart,
    lease_gantt,
    retry_timeline,
    throughput_chart,
)

T_END = 13.5
# Leases in claim order: (job, worker, start, end, outcome), from test_frames' leases table.
LEASES = [
    ("A", W0, 1.0, 2.0, "acked"), ("B", W1, 1.5, 2.5, "nacked"), ("C", W2, 2.0, 7.0, "expired"),
    ("D", W0, 2.2, 2.4, "nacked"), ("B", W1, 4.0, 5.0, "acked"), ("D", W0, 4.5, 4.6, "nacked"),
    ("C", W0, 7.5, 8.0, "acked"), ("G", W1, 9.5, T_END, "open"),
    ("H", W2, 10.0, 12.0, "expired"), ("H", W0, 12.5, 13.5, "acked"),
]

CHARTS: dict[str, Callable[..., Figure]] = {
    "lease_gantt": lease_gantt,
    "retry_timeline": retry_timeline,
    "backoff_curve": lambda events, **kw: backoff_curve(events, 1.0, 8.0, 0.25, **kw),
    "depth_chart": depth_chart,
    "attempts_histogram": attempts_histogram,
    "throughput_chart": throughput_chart,
}


@pytest.fixture(autouse=True)
def _no_pyplot_figures() -> Any:
    before = plt.get_fignums()
    yield
    assert plt.get_fignums() == before, "charts must not create pyplot-managed figures"


def by_gid(ax: Axes, gid: str) -> Any:
    found = [a for a in ax.get_children() if a.get_gid() == gid]
    assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
    return found[0]


def bar_extents(coll: Any) -> list[tuple[float, float, float]]:
    """(x0, x1, y centre) of each rectangle path in a bar collection, in order."""
    out = []
    for path in coll.get_paths():
        xs, ys = path.vertices[:4, 0], path.vertices[:4, 1]
        out.append((float(xs.min()), float(xs.max()), float(ys.mean())))
    return out


# The fixed colour of each outcome, the same in every chart.
COLORS = {"acked": "tab:green", "nacked": "tab:orange", "expired": "tab:red", "open": "tab:gray",
          "cancelled": "tab:brown"}


def rgba(outcomes: list[str]) -> np.ndarray:
    return np.array([to_rgba(COLORS[o]) for o in outcomes])


def render(fig: Figure) -> None:
    fig.savefig(io.BytesIO(), format="png", dpi=40)


# --- lease Gantt ------------------------------------------------------------------------------

def test_gantt_one_bar_per_lease_coloured_by_outcome_on_its_lane() -> None:
    fig = lease_gantt(EVENTS)
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == [W0, W1, W2]  # one lane per worker slot, sorted
    bars = by_gid(ax, "leases")
    assert len(bars.get_paths()) == len(LEASES) == 10
    np.testing.assert_allclose(bars.get_facecolor(), rgba([o for *_, o in LEASES]))
    want = [(start, end, lanes.index(worker)) for _, worker, start, end, _ in LEASES]
    np.testing.assert_allclose(bar_extents(bars), want)  # the open lease runs to the last event
    render(fig)


def test_gantt_bars_are_outlined_so_back_to_back_leases_stay_apart() -> None:
    bars = by_gid(lease_gantt(EVENTS).axes[0], "leases")
    assert len(bars.get_edgecolor()) == 1 and bars.get_edgecolor()[0][3] == 1.0
    assert to_rgba(bars.get_edgecolor()[0]) != to_rgba("white")  # a gap would erase thin bars
    assert bars.get_linewidth()[0] > 0


def test_gantt_links_each_expired_lease_to_the_next_claim_of_its_job() -> None:
    ax = lease_gantt(EVENTS).axes[0]
    # C expired on W2 (lane 2) at 7.0 and was claimed by W0 (lane 0) at 7.5; H likewise.
    # each an arc from the expired lease's end to the next claim (arcs never stack)
    segments = [np.asarray(s) for s in by_gid(ax, "redelivery").get_segments()]
    np.testing.assert_allclose([(s[0], s[-1]) for s in segments],
                               [[(7.0, 2), (7.5, 0)], [(12.0, 2), (12.5, 0)]])
    assert "expired → next claim" in [t.get_text() for t in ax.get_legend().get_texts()]
    no_expiry = [x for x in EVENTS if x.kind != "lease_expired"]
    assert not [a for a in lease_gantt(no_expiry).axes[0].get_children()
                if a.get_gid() == "redelivery"]


def test_crash_and_restart_markers_are_ringed_to_show_on_any_colour() -> None:
    ax = lease_gantt(EVENTS).axes[0]
    crash, restart = by_gid(ax, "crash"), by_gid(ax, "restart")
    assert to_rgba(crash.get_facecolor()[0]) == to_rgba("black")
    assert to_rgba(crash.get_edgecolor()[0]) == to_rgba("white")
    assert to_rgba(restart.get_facecolor()[0]) == to_rgba("white")
    assert to_rgba(restart.get_edgecolor()[0]) == to_rgba("black")


def test_gantt_marks_crash_and_restart_on_the_lanes_of_that_node() -> None:
    ax = lease_gantt(EVENTS).axes[0]
    np.testing.assert_allclose(by_gid(ax, "crash").get_offsets(), [(3.0, 2)])  # n2 -> lane 2
    np.testing.assert_allclose(by_gid(ax, "restart").get_offsets(), [(8.5, 2)])
    two_slots = EVENTS + [claim(13.5, "Z", 1, "n1:work#1"), e(13.5, "crashed", node="n1")]
    ax = lease_gantt(two_slots).axes[0]
    np.testing.assert_allclose(by_gid(ax, "crash").get_offsets(),
                               [(3.0, 2), (13.5, 0), (13.5, 1)])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:4] == ["acked", "nacked (will retry)", "lease expired",
                          "still held at the end"] and "node crashed" in legend


def test_gantt_ticks_each_heartbeat_renewal_on_its_holders_lane() -> None:
    renewed = EVENTS + [e(9.8, "lease_extended", "G", 1, W1, deadline=39.8),
                        e(11.0, "lease_extended", "G", 1, W1, deadline=41.0)]
    ax = lease_gantt(renewed).axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    np.testing.assert_allclose(by_gid(ax, "renewal").get_offsets(),
                               [(9.8, lanes.index(W1)), (11.0, lanes.index(W1))])
    assert len(by_gid(ax, "leases").get_paths()) == len(LEASES)  # renewals are not new bars
    assert "lease renewed (heartbeat)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [a for a in lease_gantt(EVENTS).axes[0].get_children()
                if a.get_gid() == "renewal"]


def test_gantt_colours_a_cancelled_lease_as_cancelled() -> None:
    stream = [enq(0.0, "K"), claim(1.0, "K", 1, W0), e(2.0, "cancel_requested", "K", 1, W0),
              e(2.5, "nacked", "K", 1, W0, error="JobCancelled: cancelled"),
              e(2.5, "cancelled", "K", 1, W0)]
    bars = by_gid(lease_gantt(stream).axes[0], "leases")
    np.testing.assert_allclose(bars.get_facecolor(), rgba(["cancelled"]))


def test_gantt_time_is_relative_to_the_first_event() -> None:
    bars = by_gid(lease_gantt(scenario(offset=1_700_000_000.0)).axes[0], "leases")
    np.testing.assert_allclose(bar_extents(bars), bar_extents(
        by_gid(lease_gantt(EVENTS).axes[0], "leases")), atol=1e-6)


def test_chart_draws_into_a_given_axes_and_returns_its_figure() -> None:
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert lease_gantt(EVENTS, ax=right, title="mine") is fig
    assert right.get_title() == "mine" and not left.get_title()
    assert len(by_gid(right, "leases").get_paths()) == 10
    sub = Figure().subfigures(1, 2)[1]
    sub_ax = sub.subplots()
    assert depth_chart(EVENTS, ax=sub_ax) is sub_ax.figure.figure


# --- retry timeline ---------------------------------------------------------------------------

def test_retry_timeline_attempts_and_backoff_gaps() -> None:
    ax = retry_timeline(EVENTS).axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == ["A", "B", "C", "D", "G", "H"]  # jobs with deliveries, first-claim order
    attempts = by_gid(ax, "attempts")
    np.testing.assert_allclose(attempts.get_facecolor(), rgba([o for *_, o in LEASES]))
    np.testing.assert_allclose(bar_extents(attempts),
                               [(s, t, lanes.index(j)) for j, _, s, t, _ in LEASES])
    # The wait between a failed delivery and the next claim: B 2.5-4.0, D 2.4-4.5, C 7.0-7.5,
    # H 12.0-12.5, in claim order of the retried delivery.
    np.testing.assert_allclose(bar_extents(by_gid(ax, "backoff")),
                               [(2.5, 4.0, 1), (2.4, 4.5, 3), (7.0, 7.5, 2), (12.0, 12.5, 5)])
    np.testing.assert_allclose(by_gid(ax, "dead").get_offsets(), [(4.6, 3)])


def test_retry_timeline_job_selection() -> None:
    ax = retry_timeline(EVENTS, max_jobs=2).axes[0]
    # Most deliveries first (B, C, D, H have two); ties keep first-claim order.
    assert [t.get_text() for t in ax.get_yticklabels()] == ["B", "C"]
    ax = retry_timeline(EVENTS, job_ids=["H", "A"]).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["H", "A"]
    assert len(by_gid(ax, "attempts").get_paths()) == 3


def test_retry_timeline_lanes_take_caller_labels_and_cut_long_ids() -> None:
    ax = retry_timeline(EVENTS, job_ids=["B", "D"], labels={"B": "order 2"}).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["order 2", "D"]
    ax = retry_timeline(EVENTS, job_ids=["B", "D"], labels=lambda j: f"#{j}").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["#B", "#D"]
    long_a, long_b = "a1b2c3d4" + "0" * 16, "e5f6a7b8" + "0" * 16
    events = [claim(1.0, long_a, 1, W0), claim(1.0, long_b, 1, W1)]
    ax = retry_timeline(events).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a1b2c3d4…", "e5f6a7b8…"]
    same_prefix = [claim(1.0, "a1b2c3d4" + "0" * 16, 1, W0),
                   claim(1.0, "a1b2c3d4" + "1" * 16, 1, W1)]
    lanes = [t.get_text() for t in retry_timeline(same_prefix).axes[0].get_yticklabels()]
    assert all(len(t) == 24 for t in lanes)  # cutting would merge them: ids kept whole


# --- backoff curve ----------------------------------------------------------------------------

def test_backoff_band_numbers() -> None:
    nominal, low, high = backoff_band([1, 2, 3, 4, 5], 1.0, 8.0, 0.25)
    np.testing.assert_allclose(nominal, [1, 2, 4, 8, 8])
    np.testing.assert_allclose(low, [0.75, 1.5, 3, 6, 6])
    np.testing.assert_allclose(high, [1.25, 2.5, 5, 8, 8])  # 8 * 1.25 capped at the max
    nominal, low, high = backoff_band([1, 4], 0.5, 10.0, 0.5)
    np.testing.assert_allclose(nominal, [0.5, 4.0])
    np.testing.assert_allclose(low, [0.25, 2.0])
    np.testing.assert_allclose(high, [0.75, 6.0])
    with pytest.raises(ValueError):
        backoff_band([1], 1.0, 8.0, -0.1)


def test_backoff_curve_band_nominal_and_observed_points() -> None:
    ax = backoff_curve(EVENTS, 1.0, 8.0, 0.25).axes[0]
    band = {tuple(v) for v in np.round(by_gid(ax, "backoff_band").get_paths()[0].vertices, 9)}
    # base 1 s doubling, capped at 8 s, +-25 % jitter (the high edge capped too); the curve
    # runs one attempt past the cap, flat across each attempt's strip (n +- 0.35).
    lows = [(1, 0.75), (2, 1.5), (3, 3.0), (4, 6.0), (5, 6.0)]
    highs = [(1, 1.25), (2, 2.5), (3, 5.0), (4, 8.0), (5, 8.0)]
    assert band == {(round(n + d, 9), y) for n, y in lows + highs for d in (-0.35, 0.35)}
    nominal = by_gid(ax, "backoff_nominal")
    np.testing.assert_allclose(nominal.get_xdata()[::2] + 0.35, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(nominal.get_ydata()[::2], [1, 2, 4, 8, 8])
    # The dots of one attempt are spread sideways (a strip plot), in event order.
    np.testing.assert_allclose(by_gid(ax, "observed").get_offsets(), [(0.7, 1.2), (1.3, 1.0)])
    # Lease-expiry retries (delay 0) are drawn apart from the backoff-driven ones.
    np.testing.assert_allclose(by_gid(ax, "observed_immediate").get_offsets(),
                               [(0.7, 0), (1.3, 0)])


def test_backoff_band_stops_at_the_last_attempt_that_can_retry() -> None:
    ax = backoff_curve(EVENTS, 1.0, 60.0, 0.25, max_attempts=4).axes[0]
    np.testing.assert_allclose(by_gid(ax, "backoff_nominal").get_xdata()[::2] + 0.35, [1, 2, 3])
    events = [retry(float(i), "j", 1, 1.0 + i / 100, "x") for i in range(200)]
    xs = by_gid(backoff_curve(events, 1.0, 8.0, 0.5).axes[0], "observed").get_offsets()[:, 0]
    assert len(set(np.round(xs, 6))) == 200 and 0.69 < xs.min() and xs.max() < 1.31


def test_backoff_curve_extends_to_the_highest_observed_attempt() -> None:
    events = [retry(float(n), "j", n, 0.1, "x") for n in range(1, 10)]
    ax = backoff_curve(events, 1.0, 2.0, 0.0).axes[0]
    np.testing.assert_allclose(by_gid(ax, "backoff_nominal").get_xdata()[1::2] - 0.35,
                               list(range(1, 10)))


# --- depth, histogram, throughput -------------------------------------------------------------

def test_depth_chart_steps_follow_depth_frame_to_the_last_event() -> None:
    ax = depth_chart(EVENTS).axes[0]
    depth = depth_frame(EVENTS)
    for state in ("ready", "leased", "delayed", "dead"):
        line = by_gid(ax, f"depth_{state}")
        assert line.get_drawstyle() == "steps-post"
        np.testing.assert_allclose(line.get_xdata(), [*depth["t"], T_END])
        np.testing.assert_allclose(line.get_ydata(), [*depth[state], depth[state].iloc[-1]])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "ready", "leased", "delayed (backoff)", "dead-lettered"]


def test_depth_chart_leaves_out_counts_that_never_left_zero() -> None:
    no_dead = [x for x in EVENTS if x.kind != "dead_lettered"]
    ax = depth_chart(no_dead).axes[0]
    assert not [a for a in ax.get_children() if a.get_gid() == "depth_dead"]
    assert "dead-lettered" not in [t.get_text() for t in ax.get_legend().get_texts()]


def test_attempts_histogram_stacks_done_under_dead() -> None:
    ax = attempts_histogram(EVENTS).axes[0]
    done = [p for p in ax.patches if p.get_gid() == "done"]
    dead = [p for p in ax.patches if p.get_gid() == "dead"]
    # Finished: A (1 attempt, done); B, C, H (2, done); D (2, dead).
    assert [p.get_x() + p.get_width() / 2 for p in done] == [1, 2]
    assert [p.get_height() for p in done] == [1, 3]
    assert [p.get_height() for p in dead] == [0, 1]
    assert [p.get_y() for p in dead] == [1, 3]
    assert to_rgba(done[0].get_facecolor()) == to_rgba("tab:green")
    # dead letters are black in every chart; red is only ever an expired lease
    assert to_rgba(dead[0].get_facecolor()) == to_rgba("black")


@pytest.mark.parametrize("bin_s", [1.0, 0.5])
def test_throughput_chart_rates_per_second(bin_s: float) -> None:
    ax = throughput_chart(EVENTS, bin_s=bin_s).axes[0]
    tp = throughput_frame(EVENTS, bin_s=bin_s)
    for column in ("acked", "nacked", "expired", "dead_lettered", "enqueued"):
        values, edges, _baseline = by_gid(ax, f"rate_{column}").get_data()
        np.testing.assert_allclose(values, tp[column] / bin_s)
        np.testing.assert_allclose(edges, [*tp["t"], tp["t"].iloc[-1] + bin_s])
    assert ax.get_ylabel() == "events per second (1/s)"


# --- every chart ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CHARTS))
def test_every_chart_is_titled_labelled_and_renders(name: str) -> None:
    fig = CHARTS[name](EVENTS)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert "(s)" in ax.get_xlabel() or "(s)" in ax.get_ylabel() or "count" in ax.get_xlabel()
    assert ax.get_legend() is not None
    render(fig)


@pytest.mark.parametrize("name", list(CHARTS))
@pytest.mark.parametrize("events", [[], [e(1.0, "crashed", node="n1", queue="")],
                                    [enq(0.0, "solo")]], ids=["empty", "node-only", "no-claims"])
def test_every_chart_handles_streams_without_data(name: str, events: list[Any]) -> None:
    fig = CHARTS[name](events, title="custom")
    ax = fig.axes[0]
    assert ax.get_title() == "custom" and ax.get_xlabel() and ax.get_ylabel()
    notes = [t.get_text() for t in ax.texts]
    if name not in ("throughput_chart", "depth_chart") or not events:
        assert any("no events" in n for n in notes), notes
    render(fig)


def test_job_events_without_worker_or_priority_still_chart() -> None:
    events = [enq(0.0, "a"), claim(0.5, "a", 1, W0)]
    events.append(e(1.0, "claimed", "b", 1, None))  # a worker-less claim gets its own lane
    ax = lease_gantt(events).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["(unknown)", W0]
    np.testing.assert_allclose(by_gid(ax, "leases").get_facecolor(), rgba(["open", "open"]))


# --- long streams and layout ------------------------------------------------------------------

@pytest.fixture(scope="module")
def busy() -> list[Any]:
    """The simulator dashboard's default run: 200 jobs, crashes, retries, generated hex ids."""
    from istos_nb.views.scenario import scenario_from_params

    sim, until = scenario_from_params({"crashes_per_hour": 40.0, "fail_p": 0.3})
    return sim.run(until).job_events()


def test_a_flickering_depth_series_is_resampled_into_mean_and_range(busy: list[Any]) -> None:
    depth = depth_frame(busy)
    assert len(depth) > 400  # the counts change hundreds of times: steps would be a block
    ax = depth_chart(busy).axes[0]
    ready = by_gid(ax, "depth_ready")
    assert len(ready.get_xdata()) == 201  # 200 bins, the last value held to the end
    band = by_gid(ax, "depth_ready_range").get_paths()[0].vertices
    assert band[:, 1].min() == 0 and band[:, 1].max() == depth["ready"].max()
    # the line is the time-weighted mean: its area equals the exact step function's
    t = np.append(depth["t"].to_numpy(), max(e["t"] for e in busy))
    exact = float(np.sum(depth["ready"].to_numpy() * np.diff(t)))
    xs, ys = ready.get_xdata(), ready.get_ydata()
    np.testing.assert_allclose(float(np.sum(ys[:-1] * np.diff(xs))), exact, rtol=1e-9)
    assert ax.get_ylim()[0] == 0


def _texts(fig: Figure, renderer: Any) -> list[tuple[str, Any]]:
    """(name, window bbox) of every text drawn outside the axes, and of the legend."""
    ax = fig.axes[0]
    found = [("title", ax.title), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)]
    for axis, (lo, hi) in (("x", ax.get_xlim()), ("y", ax.get_ylim())):
        ticks = getattr(ax, f"{axis}axis")
        lo, hi = min(lo, hi), max(lo, hi)
        slack = (hi - lo) * 1e-9  # a tick exactly on the limit is drawn
        found += [(f"{axis}tick {t.get_text()}", t)
                  for loc, t in zip(ticks.get_majorticklocs(), ticks.get_ticklabels())
                  if lo - slack <= loc <= hi + slack]  # ticks out of view are not drawn
    out = [(name, t.get_window_extent(renderer)) for name, t in found
           if t.get_visible() and t.get_text()]
    if ax.get_legend() is not None:
        out.append(("legend", ax.get_legend().get_window_extent(renderer)))
    return out


def layout_problems(fig: Figure, dpi: int = 100) -> list[str]:
    """Texts cut off by the figure edge, drawn over the axes, or over each other."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    # x tick labels hang below the axes and y tick labels left of it: shrink the axes box by
    # a pixel so a label touching its own axis line does not count.
    inner = ax.get_window_extent(renderer).expanded(1, 1).padded(-1)
    texts = _texts(fig, renderer)
    problems = []
    for name, box in texts:
        if not fig.bbox.padded(1).contains(box.x0, box.y0) or \
                not fig.bbox.padded(1).contains(box.x1, box.y1):
            problems.append(f"{name} is cut off by the figure edge")
        if box.overlaps(inner):
            problems.append(f"{name} overlaps the axes")
    for i, (name, box) in enumerate(texts):
        for other, obox in texts[i + 1:]:
            if box.padded(-0.5).overlaps(obox.padded(-0.5)):
                problems.append(f"{name} overlaps {other}")
    return problems


@pytest.mark.parametrize("name", list(CHARTS))
@pytest.mark.parametrize("stream", ["small", "busy", "empty"])
@pytest.mark.parametrize("width", [None, 12.0], ids=["own-size", "dashboard-width"])
def test_every_chart_renders_to_png_with_no_text_cut_off_or_overlapping(
        name: str, stream: str, width: float | None, busy: list[Any]) -> None:
    from istos_nb.views.charts import resize

    events = {"small": EVENTS, "busy": busy, "empty": []}[stream]
    fig = CHARTS[name](events)
    if width is not None:
        resize(fig, width)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    if stream != "empty":  # an empty chart says "no events" instead of a legend
        assert ax.get_legend() is not None and ax.get_legend().get_texts()
    assert layout_problems(fig) == []
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"

