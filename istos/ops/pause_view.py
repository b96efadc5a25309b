"""How a queue's stored pauses read in text: ``istos stats``, ``istos pause``, the notebook's
stats line. The fields come from an owner's ``stats`` (hostile bytes: every value is checked
for its type and printed as one line without control characters)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_pause_metrics", "pause_families", "pause_lines", "pause_phrase"]


def _clean(value: Any, limit: int = 120) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    line = "".join(c if c.isprintable() else " " for c in value)
    line = " ".join(line.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def pause_phrase(pause: Any) -> str:
    """``by NAME: REASON`` (either part left out when unknown), or "" for no pause map."""
    if not isinstance(pause, dict):
        return ""
    by, reason = _clean(pause.get("by"), 60), _clean(pause.get("reason"))
    parts = [f"by {by}" if by else "", f'"{reason}"' if reason else ""]
    return " ".join(p for p in parts if p)


def pause_lines(stats: dict[str, Any], groups_shown: int = 5) -> list[str]:
    """Lines under the queue's headline: the queue's pause (who, why) and its paused groups."""
    lines: list[str] = []
    phrase = pause_phrase(stats.get("pause"))
    if stats.get("paused"):
        lines.append("  paused  " + (phrase or "(no reason given)"))
    paused_groups = stats.get("paused_groups")
    if isinstance(paused_groups, dict):
        rows = [g for g in paused_groups.get("groups") or [] if isinstance(g, dict)]
        count = paused_groups.get("count")
        shown = "  ".join(f"{_clean(g.get('group'), 40) or '?'}"
                          + (f" ({p})" if (p := pause_phrase(g)) else "")
                          for g in rows[:groups_shown])
        total = count if isinstance(count, int) and not isinstance(count, bool) else len(rows)
        lines.append(f"  paused groups {total:,}: {shown or '-'}")
    return lines


def pause_families(gauge: Any) -> tuple[Any, Any]:
    """The pause metrics' families, built with prometheus-client's ``GaugeMetricFamily``."""
    return (gauge("istos_pause_info", "1 while the queue is paused, labelled with who paused "
                  "it and why", labels=["queue", "by", "reason"]),
            gauge("istos_paused_groups", "Fairness groups of the queue paused",
                  labels=["queue"]))


def add_pause_metrics(queue: str, stats: dict[str, Any], info: Any, groups: Any) -> None:
    """One scrape's samples of a queue's pauses (from its ``stats``)."""
    pause = stats.get("pause")
    if stats.get("paused"):
        pause = pause if isinstance(pause, dict) else {}
        info.add_metric([queue, _clean(pause.get("by"), 200) or "",
                         _clean(pause.get("reason"), 500) or ""], 1.0)
    paused_groups = stats.get("paused_groups")
    count = paused_groups.get("count") if isinstance(paused_groups, dict) else 0
    groups.add_metric([queue], float(count) if isinstance(count, int) else 0.0)
