"""``LiveQueue.series()`` fetched from the owner (the live layer; :mod:`istos_nb.data.series` holds
the frame it fills): the owner's time series of its queue, every page of it, as the frame
:func:`istos_nb.data.series.series_frame` builds (the simulator's ``SimResult.series()``
gives the same shape)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from istos.client.pages import series_pages
from istos.errors import ConfigError

from ..data.series import series_frame
from .requests import OwnerRequests

RESOLUTIONS: dict[Any, str] = {"1s": "1s", "1min": "1min", 1: "1s", 60: "1min"}  # 1.0, 60.0 too


def series_args(since: Any, resolution: Any) -> tuple[float | None, str]:
    """``series()``'s arguments checked: ``since`` a datetime, Timestamp, epoch seconds or
    None; ``resolution`` "1s" or "1min" (or 1 / 60 seconds; None: "1s")."""
    res = RESOLUTIONS.get(resolution if resolution is not None else "1s")
    if res is None:
        raise ConfigError(f"resolution must be '1s' or '1min', got {resolution!r}")
    if since is None:
        return None, res
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        value = float(since)
    else:
        ts = pd.Timestamp(since)
        if ts.tzinfo is None:
            ts = ts.tz_localize("UTC")
        value = ts.timestamp()
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"since must be an instant after 1970, got {since!r}")
    return value, res


async def fetch_series(req: OwnerRequests, since: float | None, resolution: str
                       ) -> pd.DataFrame:
    """Every page of the owner's series from ``since`` (None: all it keeps)."""
    return series_frame(await series_pages(req.clients(req.queue), since, resolution))
