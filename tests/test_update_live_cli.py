"""Editing a waiting job from a notebook (``LiveQueue.update``/``aupdate``) and from the
command line (``istos update QUEUE JOB_ID [--data JSON] [--delay-s S] [--priority P]``), over
real Zenoh against an owner without ``admin=True`` (the produce role may edit)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from typing import Any

import msgpack
import pytest
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos, MemoryStorage
from istos.core.state import DELAYED, READY
from istos.ops import cli, update_cmd


def _cli(configs: dict[str, Any], prefix: str, *argv: str) -> tuple[int, dict[str, Any]]:
    """``istos ARGV --json`` through the console script's entry point: (exit status, JSON)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([*argv, "--zenoh", json.dumps(configs), "--prefix", prefix, "--json"])
    return code, dict(json.loads(out.getvalue()))


@pytest.mark.fast
def test_cli_update_checks_its_arguments_before_sending():
    for argv, field in ((["--data", "{not json"], "--data"), ([], "update needs"),
                        (["--delay-s", "-1"], "delay_s"), (["--delay-s", "nan"], "delay_s")):
        args = cli.parser().parse_args(["update", "q", "job-1", *argv])
        with pytest.raises(ConfigError, match=field):
            update_cmd.update_fields(args)
    with pytest.raises(ConfigError, match="priority"):
        cli.parser().parse_args(["update", "q", "job-1", "--priority", "high"])
    args = cli.parser().parse_args(["update", "q", "job-1", "--data", '{"a": [1]}',
                                    "--delay-s", "5", "--priority", "-3"])
    fields = update_cmd.update_fields(args)
    assert msgpack.unpackb(fields["body"]) == {"a": [1]}
    assert fields["delay_s"] == 5.0 and fields["priority"] == -3


async def test_livequeue_and_cli_update_a_waiting_job_over_zenoh():
    from istos_nb import attach

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner",
                  storage=MemoryStorage(durable=True, shared=True))
    owner.queue("q")  # no admin: editing is the producer's business
    async with owner.serving():
        jid = await owner.enqueue("q", {"v": 1}, job_id="edit-me-1", delay_s=3600)
        await owner.enqueue("q", 0, job_id="busy")
        state = owner.owners["q"].state
        lq = await asyncio.to_thread(attach, "q", zenoh=configs[1], prefix=prefix)
        try:
            assert await asyncio.to_thread(lq.update, jid, data={"v": 2}, priority=5) \
                == "updated"
            rec = state.jobs[jid]
            assert msgpack.unpackb(rec.body) == {"v": 2} and rec.priority == 5
            assert rec.state == DELAYED
            assert await lq.aupdate(jid, delay_s=0) == "updated"
            assert state.jobs[jid].state == READY
            assert await lq.aupdate("nobody-here", priority=1) == "unknown"
            with pytest.raises(ConfigError, match="delay_s or run_at"):
                await lq.aupdate(jid, delay_s=1, run_at=1e9)
            claim = await owner.client("q").call("claim", workers=["t/0"], node="t")
            assert [j["job_id"] for j in claim["jobs"]] == [jid]  # priority 5 goes first
            assert await asyncio.to_thread(lq.update, jid, priority=1) == "too_late"
        finally:
            await asyncio.to_thread(lq.close)

        code, reply = await asyncio.to_thread(
            _cli, configs[2], prefix, "update", "q", "busy", "--data", '{"v": 3}',
            "--delay-s", "600", "--priority", "2")
        assert code == cli.EXIT_OK and reply == {"job_id": "busy", "status": "updated"}
        rec = state.jobs["busy"]
        assert msgpack.unpackb(rec.body) == {"v": 3} and rec.priority == 2
        assert rec.state == DELAYED
        code, reply = await asyncio.to_thread(_cli, configs[2], prefix, "update", "q", jid,
                                              "--priority", "9")
        assert code == cli.EXIT_OK and reply["status"] == "too_late"
        code, reply = await asyncio.to_thread(_cli, configs[2], prefix, "update", "q", "gone",
                                              "--priority", "9")
        assert code == cli.EXIT_REFUSED and reply["error"] == "UnknownJob"
        kinds = [e.kind for e in owner.events.recent() if e.job_id == "busy"]
        assert kinds.count("updated") == 1, kinds
        code, reply = await asyncio.to_thread(_cli, configs[2], prefix, "update", "q", "busy",
                                              "--delay-s", "-2")
        assert code == cli.EXIT_USAGE and "delay_s" in reply["message"]
        assert state.jobs["busy"].priority == 2  # nothing changed
