"""The public surface is curated: pin it so that changing it is deliberate (trio test_exports)."""

from __future__ import annotations

import pytest

import istos

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

EXPECTED = {
    "Istos", "SyncProducer", "JobContext", "Depends",
    "MemoryStorage", "RedisStoragePlugin", "SQLAlchemyStoragePlugin", "outbox",
    "Clock", "SystemClock", "JobEvent", "Enqueued",
    "IstosError", "ConfigError", "CronError", "HAConfigError", "InvalidJob", "QueueNotFound",
    "OwnerUnavailable", "StorageUnavailable", "ProtocolError", "AdminDisabled", "RemoteError",
    "InvalidProgress", "JobTimeout", "JobCancelled", "MeshUnreachable", "Retry",
    "OwnerConflict", "JobNotFound", "CapacityExceeded", "NotAccepted",
    "UnsupportedOption",
}


def test_all_is_pinned():
    assert set(istos.__all__) == EXPECTED


def test_every_exported_name_resolves():
    for name in istos.__all__:
        assert getattr(istos, name) is not None


def test_errors_share_one_root():
    for name in istos.__all__:
        obj = getattr(istos, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, istos.IstosError), name
    assert issubclass(istos.ConfigError, ValueError) and issubclass(istos.InvalidJob, ValueError)
    assert issubclass(istos.OwnerConflict, istos.ConfigError)


NOTEBOOK_SIDE = {"attach", "aattach", "LiveQueue", "LiveDashboard", "SimDashboard", "queues",
                 "aqueues", "compare", "compare_chart", "predict"}
CHARTS = {"DEPTH_COLORS", "FINISH_COLORS", "OUTCOME_COLORS", "attempts_histogram",
          "backoff_band", "backoff_curve", "depth_chart", "lease_gantt", "replay_depth",
          "replay_gantt", "resize", "retry_timeline", "throughput_chart"}


def test_the_notebook_sides_faces_are_pinned():
    import istos_nb
    import istos_nb.charts

    assert set(istos_nb.__all__) == NOTEBOOK_SIDE
    assert set(istos_nb.charts.__all__) == CHARTS
    for name in istos_nb.__all__:
        assert getattr(istos_nb, name) is not None
    for name in istos_nb.charts.__all__:
        assert getattr(istos_nb.charts, name) is not None
