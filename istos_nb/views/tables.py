"""Display helpers for the tables the notebook side returns.

The owner's API speaks epoch seconds (floats: exact, cheap to compare, any clock's), which is
right for computing and unreadable in a table. :func:`times_of_day` turns those columns into
times of day for showing, so a notebook needs no helper of its own.

Public as :mod:`istos_nb.tables`, which re-exports this module's ``__all__`` (one module at
two layers: the public name, and this implementation).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

__all__ = ["TIME_COLUMNS", "times_of_day"]

# Columns that hold epoch seconds in LiveQueue.jobs()/leases()/dead_letters() and histories.
TIME_COLUMNS = ("enqueued_at", "ready_at", "deadline", "claimed_at", "finished_at", "t")


def times_of_day(df: pd.DataFrame, columns: Iterable[str] | None = None,
                 fmt: str = "%H:%M:%S.%f") -> pd.DataFrame:
    """A copy of ``df`` with epoch-second or datetime ``columns`` (default: those of
    :data:`TIME_COLUMNS` present) shown as UTC times of day, to the millisecond; missing times
    become "".

    Raises KeyError naming a requested column that ``df`` lacks. ``df`` itself is unchanged.
    """
    wanted = list(columns) if columns is not None else [c for c in TIME_COLUMNS if c in df]
    missing = [c for c in wanted if c not in df]
    if missing:
        raise KeyError(f"no such column(s) {missing}; the frame has {list(df.columns)}")
    out = df.copy()
    for column in wanted:
        col = out[column]
        if pd.api.types.is_datetime64_any_dtype(col):  # live frames: tz-aware UTC already
            stamps = col.dt.tz_convert("UTC") if col.dt.tz is not None else col
        else:  # epoch seconds (simulation frames, raw replies)
            stamps = pd.to_datetime(pd.to_numeric(col, errors="coerce"), unit="s")
        text = stamps.dt.strftime(fmt)
        if fmt.endswith("%f"):
            text = text.str[:-3]  # microseconds -> milliseconds
        out[column] = text.fillna("")
    return out
