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
    "ParentFailed",
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


RENAMED = (  # (class, old name, new name): the old one kept one release, warning when used
    ("istos:Istos", "requeue_dead", "revive"),
    ("istos.features.workflow:Workflows", "requeue_dead", "revive"),
    ("istos_nb:LiveQueue", "requeue", "resubmit"),
    ("istos_nb:LiveQueue", "arequeue", "aresubmit"),
    ("istos_nb:LiveQueue", "requeue_dead", "redrive_dead"),
    ("istos_nb:LiveQueue", "arequeue_dead", "aredrive_dead"),
)


def test_renamed_methods_keep_their_old_names_as_deprecated_aliases():
    import importlib

    for where, old, new in RENAMED:
        module, _, name = where.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert callable(getattr(cls, new)), (name, new)
        doc = getattr(cls, old).__doc__ or ""
        assert "Deprecated alias of" in doc and new in doc, (name, old)


def test_an_old_name_warns_at_the_call_and_is_the_new_call():
    from istos.transport.local import LocalMesh

    app = istos.Istos(node_id="n", transport=LocalMesh().transport("n"))
    with pytest.warns(DeprecationWarning, match="use revive"):
        call = app.requeue_dead("q", "j")  # the coroutine of app.revive, not yet run
    assert call.cr_code is istos.Istos.revive.__code__  # type: ignore[attr-defined]
    call.close()


def test_renamed_cli_commands_keep_their_old_names_unlisted():
    from istos.ops.cli import OLD_COMMANDS, parser

    p = parser()
    for old, new in OLD_COMMANDS.items():
        assert p.parse_args([old, "q", "--all"] if new == "redrive-dead"
                            else [old, "q", "j"]).command == new
        assert old not in p.format_help() and new in p.format_help()
