"""An open dashboard where nothing moves does (almost) nothing (issue 25, point 4: an open idle
page costs <= 3% of a core; measured in tests/test_dashboard_cost.py and
bench/dashboard_cost.py): a timer refresh fetches only the stats while they say nothing moved,
and a full one comes every so often."""

from __future__ import annotations

import pytest
from test_widgets import RecordedQueue, recorded, wait_for  # noqa: F401 - recorded: fixture

from istos_nb.views.idle import IdleCheck
from istos_nb.views.widgets import LiveDashboard

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def test_a_timer_refresh_fetches_only_the_stats_while_nothing_moved(recorded):  # noqa: F811
    fake = RecordedQueue(recorded, upto=40)
    dash = LiveDashboard(fake, refresh_s=0.1, paused=True)
    dash.panels.show_charts = lambda *args, **kw: None  # fetching is under test, not drawing
    try:
        dash.resume()
        wait_for(lambda: fake.calls.get("stats", 0) >= 5, what="five timed refreshes")
        assert fake.calls["events"] == 1  # the first refresh only: the stats did not move
        assert "nothing new" in dash.status.value
        fake.advance(40)  # more happens: the stats move, the next tick fetches everything
        wait_for(lambda: fake.calls["events"] >= 2, what="a full refresh once stats moved")
        dash.state_filter.value = "dead"  # a user's change always refreshes in full
        assert fake.calls["events"] >= 3
    finally:
        dash.close()


def test_idle_check_ignores_ages_and_asks_for_a_full_refresh_after_a_while():
    check = IdleCheck(full_every_s=3600)
    stats = {"counts": {"ready": 3}, "totals": {"enqueued": 3}, "oldest_ready_age_s": 1.0}
    assert not check.quiet(stats)  # never refreshed
    check.refreshed(stats)
    assert check.quiet({**stats, "oldest_ready_age_s": 9.5})
    assert not check.quiet({**stats, "totals": {"enqueued": 4}})
    check.full_every_s = 0.0
    assert not check.quiet(stats)
