"""istos_nb.views.tables: epoch-second columns shown as times of day."""

from __future__ import annotations

import pandas as pd
import pytest

from istos_nb.views.tables import times_of_day

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def test_times_of_day_shows_epoch_columns_as_clock_times() -> None:
    df = pd.DataFrame({"job_id": ["a", "b"], "enqueued_at": [1_767_225_600.25, 1_767_229_200.0],
                       "finished_at": [float("nan"), 1_767_229_201.5]})
    shown = times_of_day(df)
    assert shown["enqueued_at"].tolist() == ["00:00:00.250", "01:00:00.000"]
    assert shown["finished_at"].tolist() == ["", "01:00:01.500"]
    assert df["enqueued_at"].dtype == float  # the input is left alone
    assert times_of_day(df, ["enqueued_at"])["finished_at"].isna().tolist() == [True, False]
    with pytest.raises(KeyError, match="deadline"):
        times_of_day(df, ["deadline"])
