"""The one legend vocabulary of every chart: each glyph (a colour with a shape) has one meaning.

A reader who learned "red bar = the lease expired" in one chart must never meet a red bar that
means something else in the next, nor a black cross that is a node crash here and a dead letter
there. So every chart draws its bars, lines and markers from :data:`GLYPHS` and builds its legend
from the glyphs it actually drew (:class:`Drawn`), never from a fixed list: a legend names only
what is on the chart. ``tests/test_chart_contract.py`` checks both across every chart function.

Private to the notebook side; :mod:`istos_nb.views.charts` re-exports the colour tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

__all__ = ["GLYPHS", "Drawn", "Glyph", "glyph"]

Kind = Literal["bar", "line", "marker"]
_EDGE = "0.1"
_UNFILLED = frozenset("|_+x")  # the dark outline of every bar (see chartkit.BAR_EDGE)


@dataclass(frozen=True)
class Glyph:
    """A legend entry: what it looks like (``kind``, colours, shape) and what it means."""

    label: str
    kind: Kind
    color: str
    edge: str = _EDGE
    marker: str = ""
    linestyle: Any = "-"
    hatch: str = ""
    size: float = 9.0  # marker size in points (legend); scatter area is size**2 * 1.5

    def handle(self) -> Any:
        """A legend proxy drawn exactly like the chart's artist."""
        if self.kind == "bar":
            return Patch(facecolor=self.color, edgecolor=self.edge, hatch=self.hatch,
                         linewidth=0.6, label=self.label)
        if self.kind == "line":
            return Line2D([], [], color=self.color, linestyle=self.linestyle, linewidth=1.8,
                          label=self.label)
        return Line2D([], [], marker=self.marker, color=self.color, markerfacecolor=self.color,
                      markeredgecolor=self.edge, linestyle="none", markersize=self.size,
                      label=self.label)

    def scatter_style(self) -> dict[str, Any]:
        """Keyword arguments for ``Axes.scatter`` drawing this marker glyph."""
        style = {"marker": self.marker, "color": self.color, "linewidths": 1.2,
                 "s": self.size ** 2 * 1.5}
        if self.marker not in _UNFILLED:  # a line marker has no edge to colour
            style["edgecolors"] = self.edge
        return style


# Keys are what the charts ask for; labels are what the reader sees. Dead letters are black
# everywhere (bars, lines and markers); red is only ever an expired lease.
GLYPHS: dict[str, Glyph] = {g_key: g for g_key, g in (
    ("acked", Glyph("acked", "bar", "tab:green")),
    ("nacked", Glyph("nacked (will retry)", "bar", "tab:orange")),
    ("expired", Glyph("lease expired", "bar", "tab:red")),
    ("open", Glyph("still held at the end", "bar", "tab:gray")),
    ("cancelled", Glyph("cancelled", "bar", "tab:brown")),
    ("wait", Glyph("wait before retry", "bar", "0.92", edge="0.55", hatch="///")),
    ("dead", Glyph("dead-lettered", "bar", "black")),
    ("redelivery", Glyph("expired → next claim", "line", "0.25", linestyle=(0, (3, 2)))),
    ("renewal", Glyph("lease renewed (heartbeat)", "marker", "black", edge="black",
                      marker="|")),
    ("crashed", Glyph("node crashed", "marker", "black", edge="white", marker="X")),
    ("restarted", Glyph("node restarted", "marker", "white", edge="black", marker=">",
                        size=8.0)),
    ("delivery_crashed", Glyph("delivery died mid-job", "marker", "tab:red",
                               edge="black", marker="v", size=8.0)),
    ("dead_lettered", Glyph("dead-lettered", "marker", "black", edge="white", marker="s",
                            size=8.0)),
    ("recorded_lease", Glyph("recorded lease (grey)", "bar", "0.8", edge="0.35")),
    ("depth_ready", Glyph("ready", "line", "tab:blue")),
    ("depth_ready_replayed", Glyph("ready, replayed", "line", "tab:blue",
                                   linestyle=(0, (4, 2)))),
    ("depth_leased_replayed", Glyph("leased, replayed", "line", "tab:purple",
                                    linestyle=(0, (4, 2)))),
    ("depth_leased", Glyph("leased", "line", "tab:purple")),
    ("depth_delayed", Glyph("delayed (backoff)", "line", "tab:olive")),
    ("depth_dead", Glyph("dead-lettered", "line", "black")),
    ("rate_enqueued", Glyph("enqueued", "line", "tab:gray", linestyle="--")),
    ("rate_acked", Glyph("acked", "line", "tab:green")),
    ("rate_nacked", Glyph("nacked (will retry)", "line", "tab:orange")),
    ("rate_expired", Glyph("lease expired", "line", "tab:red")),
    ("rate_dead_lettered", Glyph("dead-lettered", "line", "black")),
    ("policy_band", Glyph("policy: nominal ± jitter", "bar", "#9ecae1", edge="#9ecae1")),
    ("policy_nominal", Glyph("policy: nominal delay", "line", "teal")),
    ("observed", Glyph("observed retry delay", "marker", "black", edge="black", marker="o",
                       size=4.0)),
    ("observed_immediate", Glyph("immediate retry (delay 0)", "marker", "none",
                                 edge="tab:red", marker="o", size=6.0)),
)}


def glyph(key: str) -> Glyph:
    """The glyph for ``key``; a KeyError names the known keys (a chart asked for a new one)."""
    try:
        return GLYPHS[key]
    except KeyError:
        raise KeyError(f"no glyph {key!r}; known: {sorted(GLYPHS)}") from None


@dataclass
class Drawn:
    """The glyphs a chart drew, in drawing order: its legend and nothing more."""

    keys: list[str] = field(default_factory=list)

    def add(self, key: str) -> Glyph:
        g = glyph(key)
        if key not in self.keys:
            self.keys.append(key)
        return g

    def handles(self) -> list[Any]:
        return [GLYPHS[k].handle() for k in self.keys]
