"""The chart contract: what every chart function in istos_nb.views.charts promises a reader.

Run over every chart function (the registry below must name each one; a new chart that is not
registered fails ``test_every_chart_function_is_under_contract``) with simulated streams and a
live frame:

- the legend names only what is drawn (each entry's colour is on the axes);
- no two text artists overlap (matplotlib window extents, after a real draw);
- bars and markers are at least 2 px at the chart's default size (or the chart says how many of
  how many it shows);
- a live stream (epoch seconds, as an owner's wall clock stamps them) gets a wall-clock axis;
- each glyph has one meaning across all charts, from the one vocabulary in views/glyphs.py.

The live frame is the simulated run moved to an epoch start, as a DataFrame with pandas
Timestamps (the form a LiveQueue's frames take): frames and charts never learn which world a
stream came from, only what its clock says.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from itertools import combinations
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection, PolyCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from test_frames import EVENTS  # noqa: E402

from istos_nb.views import charts  # noqa: E402

# One worker draws every chart once (``drawn``, ~15 s of CPU) and runs the module's tests; spread
# over the workers, each would draw them all again.
pytestmark = pytest.mark.xdist_group("chart_contract")

MIN_PX = 2.0
LIVE_T0 = 1_764_600_000.0  # 2025-12-01 14:40 UTC
TIME_CHARTS = ("lease_gantt", "retry_timeline", "depth_chart", "throughput_chart")

CHARTS: dict[str, Callable[..., Figure]] = {
    "lease_gantt": charts.lease_gantt,
    "retry_timeline": charts.retry_timeline,
    "backoff_curve": lambda events: charts.backoff_curve(events, 1.0, 60.0, 0.5,
                                                         max_attempts=8),
    "depth_chart": charts.depth_chart,
    "attempts_histogram": charts.attempts_histogram,
    "throughput_chart": charts.throughput_chart,
    # The replay overlays draw a stream against its replay under the recorded policy (seconds
    # from each run's first arrival, so no wall-clock axis: not in TIME_CHARTS).
    "replay_gantt": lambda events: charts.replay_gantt(events, replayed(events)),
    "replay_depth": lambda events: charts.replay_depth(events, replayed(events)),
}
_REPLAYS: dict[tuple[str, ...], Any] = {}


def replayed(events: Any) -> Any:
    """The replay of a stream, once per set of jobs: both overlays draw it, and a live frame's
    replay is its simulated twin's (replay runs on virtual time from the arrivals)."""
    from istos_nb.data.trace import Trace
    from istos_nb.sim.replay import replay

    trace = Trace.from_events(events)
    key = tuple(trace.jobs["job_id"])
    if key not in _REPLAYS:  # as a Trace: the charts take one as it is
        _REPLAYS[key] = Trace.from_events(replay(trace).job_events(), source="simulation")
    return _REPLAYS[key]


def chart_functions() -> set[str]:
    """Every public function of the charts module that returns a Figure (resize excepted)."""
    found = set()
    for name in charts.__all__:
        obj = getattr(charts, name)
        if inspect.isfunction(obj) and name != "resize":
            ret = inspect.signature(obj).return_annotation
            if ret in (Figure, "Figure"):
                found.add(name)
    return found


def quickstart_run() -> list[dict[str, Any]]:
    """Notebook 01's simulated run (worker-b dies mid-job and comes back)."""
    from test_readme_figure import readme_figure

    return readme_figure().crash_run().job_events()


def dashboard_run() -> list[dict[str, Any]]:
    """The simulator dashboard's default run at its largest: 1,000 jobs, crashes, retries,
    mid-job deaths, generated hex ids (what the issue saw with sub-pixel bars)."""
    from istos_nb.views.scenario import scenario_from_params

    sim, until = scenario_from_params({"jobs": 1000, "rate": 4.0, "crashes_per_hour": 40.0})
    return sim.run(until).job_events()


def live_frame(events: list[dict[str, Any]]) -> pd.DataFrame:
    """``events`` as a live owner would stamp them: epoch instants, as pandas Timestamps."""
    df = pd.DataFrame(events)
    df["t"] = pd.to_datetime(df["t"] + LIVE_T0, unit="s", utc=True)
    return df


@pytest.fixture(scope="module")
def streams() -> dict[str, Any]:
    quick, busy = quickstart_run(), dashboard_run()
    return {"frames-fixture": EVENTS, "quickstart": quick, "dashboard-1000": busy,
            "live-quickstart": live_frame(quick), "live-dashboard-1000": live_frame(busy)}


STREAMS = ("frames-fixture", "quickstart", "dashboard-1000", "live-quickstart",
           "live-dashboard-1000")


@pytest.fixture(scope="module")
def drawn(streams: dict[str, Any]) -> dict[tuple[str, str], Figure]:
    out = {}
    for chart, draw in CHARTS.items():
        for stream in STREAMS:
            fig = draw(streams[stream])
            FigureCanvasAgg(fig).draw()  # extents, text and ticks as a reader sees them
            out[chart, stream] = fig
    return out


# -- what is drawn -------------------------------------------------------------------------------

def _key(color: Any) -> tuple[float, ...] | None:
    """A colour's RGB (a translucent dot is still that colour); None when invisible."""
    rgba = to_rgba(color)
    return tuple(round(c, 3) for c in rgba[:3]) if rgba[3] > 0 else None


def _colours(rgba: Any) -> set[tuple[float, ...] | None]:
    arr = np.atleast_2d(np.asarray(rgba, dtype=float))
    return {_key(tuple(row)) for row in arr if row.size == 4}


def drawn_colours(ax: Axes) -> set[tuple[float, ...] | None]:
    """Face and edge colours of every artist on ``ax`` that has something to show."""
    found: set[tuple[float, ...] | None] = set()
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection) and len(coll.get_offsets()) == 0:
            continue
        if isinstance(coll, (PolyCollection, LineCollection)) and not coll.get_paths():
            continue
        found |= _colours(coll.get_facecolor()) | _colours(coll.get_edgecolor())
    for line in ax.lines:
        if line.get_visible() and len(line.get_xdata()):
            found |= {_key(line.get_color()), _key(line.get_markerfacecolor()),
                      _key(line.get_markeredgecolor())}
    for patch in ax.patches:
        if not patch.get_visible():
            continue
        if isinstance(patch, Rectangle) and patch.get_height() == 0:
            continue
        found |= {_key(patch.get_facecolor()), _key(patch.get_edgecolor())}
    return found - {None}


def handle_colour(handle: Any) -> tuple[float, ...] | None:
    if isinstance(handle, Patch):
        return _key(handle.get_facecolor())
    assert isinstance(handle, Line2D), handle
    if handle.get_linestyle() in ("None", "none", "", " "):
        face = handle.get_markerfacecolor()
        return _key(handle.get_markeredgecolor() if face in ("none", "None") else face)
    return _key(handle.get_color())


def legend_entries(ax: Axes) -> list[tuple[str, Any]]:
    legend = ax.get_legend()
    if legend is None:
        return []
    return [(t.get_text(), h) for t, h in zip(legend.get_texts(), legend.legend_handles,
                                              strict=True)]


def undrawn_legend_entries(ax: Axes) -> list[str]:
    colours = drawn_colours(ax)
    return [text for text, handle in legend_entries(ax) if handle_colour(handle) not in colours]


# -- text --------------------------------------------------------------------------------------

def visible_texts(fig: Figure) -> list[tuple[str, Any]]:
    """(text, window extent) of every text a reader sees: titles, labels, ticks in view, notes,
    legend entries and title."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    out = []
    for ax in fig.axes:
        texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                 *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            slack = (hi - lo) * 1e-9
            texts += [t for loc, t in zip(axis.get_majorticklocs(), axis.get_ticklabels())
                      if lo - slack <= loc <= hi + slack]
        legend = ax.get_legend()
        if legend is not None:
            texts += [*legend.get_texts(), legend.get_title()]
        out += [(t.get_text(), t.get_window_extent(renderer)) for t in texts
                if t.get_visible() and t.get_text().strip()]
    return out


def overlapping_texts(fig: Figure) -> list[str]:
    return [f"{a!r} overlaps {b!r}" for (a, box_a), (b, box_b)
            in combinations(visible_texts(fig), 2)
            if box_a.padded(-0.5).overlaps(box_b.padded(-0.5))]


# -- sizes -------------------------------------------------------------------------------------

def too_small(fig: Figure) -> list[str]:
    """Bars and markers under MIN_PX at the figure's own size and dpi."""
    problems = []
    ax = fig.axes[0]
    to_px = ax.transData
    for coll in ax.collections:
        if isinstance(coll, PolyCollection) and coll.get_gid() in ("leases", "attempts",
                                                                  "backoff"):
            widths = [np.ptp(to_px.transform(p.vertices)[:, 0]) for p in coll.get_paths()]
            thin = sum(w < MIN_PX - 1e-6 for w in widths)
            if thin:
                problems.append(f"{thin} of {len(widths)} {coll.get_gid()} bars under 2 px")
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            px = np.sqrt(np.asarray(coll.get_sizes(), dtype=float)) * fig.dpi / 72
            if px.size and px.min() < MIN_PX:
                problems.append(f"{coll.get_gid()} markers {px.min():.1f} px")
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_height() > 0:
            box = patch.get_window_extent()
            if box.width < MIN_PX:
                problems.append(f"{patch.get_gid()} bar {box.width:.1f} px wide")
    for line in ax.lines:
        if line.get_linewidth() * fig.dpi / 72 < 1.5 and line.get_gid():
            problems.append(f"{line.get_gid()} line {line.get_linewidth()} pt")
    return problems


# -- the contract ------------------------------------------------------------------------------

def test_every_chart_function_is_under_contract() -> None:
    assert chart_functions() == set(CHARTS), "register every chart function in CHARTS"


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("chart", list(CHARTS))
def test_legend_names_only_what_is_drawn(drawn: Any, chart: str, stream: str) -> None:
    ax = drawn[chart, stream].axes[0]
    assert legend_entries(ax), "a chart with data has a legend"
    assert undrawn_legend_entries(ax) == []


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("chart", list(CHARTS))
def test_no_two_texts_overlap(drawn: Any, chart: str, stream: str) -> None:
    assert overlapping_texts(drawn[chart, stream]) == []


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("chart", list(CHARTS))
def test_bars_and_markers_are_at_least_two_pixels(drawn: Any, chart: str, stream: str) -> None:
    assert too_small(drawn[chart, stream]) == []


@pytest.mark.parametrize("chart", list(CHARTS))
def test_the_plot_is_not_squeezed_by_its_margins(drawn: Any, chart: str) -> None:
    """At its own size the axes take most of the figure's width (the legend used to take more
    than half of the backoff curve's)."""
    for stream in STREAMS:
        fig = drawn[chart, stream]
        assert fig.axes[0].get_position().width >= 0.5, (chart, stream)


_CLOCK = re.compile(r"^\d\d:\d\d:\d\d(\.\d)?$")


@pytest.mark.parametrize("stream", ["live-quickstart", "live-dashboard-1000"])
@pytest.mark.parametrize("chart", TIME_CHARTS)
def test_live_streams_get_a_wall_clock_axis(drawn: Any, chart: str, stream: str) -> None:
    ax = drawn[chart, stream].axes[0]
    assert "wall-clock" in ax.get_xlabel()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) >= 3 and all(_CLOCK.match(t) for t in ticks), ticks
    simulated = drawn[chart, stream.removeprefix("live-")].axes[0]
    assert "wall-clock" not in simulated.get_xlabel()  # virtual time stays relative seconds


def test_each_glyph_has_one_meaning_across_all_charts(drawn: Any) -> None:
    from istos_nb.views.glyphs import GLYPHS

    vocabulary = {g.label for g in GLYPHS.values()}
    meaning: dict[tuple[Any, ...], set[str]] = {}
    for (chart, stream), fig in drawn.items():
        for text, handle in legend_entries(fig.axes[0]):
            assert text in vocabulary, f"{chart}/{stream}: {text!r} is not in glyphs.py"
            if isinstance(handle, Patch):
                sig: tuple[Any, ...] = ("bar", handle_colour(handle), handle.get_hatch())
            else:
                sig = ("mark" if handle.get_linestyle() in ("None", "none") else "line",
                       handle_colour(handle), str(handle.get_marker()),
                       str(handle.get_linestyle()))
            meaning.setdefault(sig, set()).add(text)
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}
    crash = {t for s, m in meaning.items() for t in m if s[0] == "mark" and s[2] == "X"}
    assert crash <= {"node crashed"}  # the ✕ of the lease charts is never a dead letter


def test_the_retry_timeline_says_how_many_jobs_it_shows(drawn: Any) -> None:
    ax = drawn["retry_timeline", "dashboard-1000"].axes[0]
    assert len(ax.get_yticklabels()) == 20
    assert "20 of 1,000 jobs shown" in ax.get_legend().get_title().get_text()
    small = drawn["retry_timeline", "frames-fixture"].axes[0]
    assert " of " not in small.get_legend().get_title().get_text()  # all shown: no note


def test_redelivery_arcs_never_stack(drawn: Any) -> None:
    """Leases that expired together used to draw their dashed links as one vertical line."""
    for stream in STREAMS:
        ax = drawn["lease_gantt", stream].axes[0]
        arcs = [a for a in ax.collections if a.get_gid() == "redelivery"]
        if not arcs:
            continue
        mids = [tuple(np.round(ax.transData.transform(seg[len(seg) // 2]), 0))
                for seg in arcs[0].get_segments()]
        ends = [tuple(np.round(seg[0], 6)) + tuple(np.round(seg[-1], 6))
                for seg in arcs[0].get_segments()]
        assert len(set(mids)) == len(set(ends)), stream  # distinct links, distinct curves


def test_a_mid_job_death_is_marked_where_its_red_bar_starts(drawn: Any) -> None:
    ax = drawn["lease_gantt", "dashboard-1000"].axes[0]
    deaths = [a for a in ax.collections if a.get_gid() == "delivery_crashed"]
    assert deaths and len(deaths[0].get_offsets()) > 0
    assert "delivery died mid-job" in [t for t, _ in legend_entries(ax)]
