"""The quickstart in ``examples/`` works as its README says: the owner+worker script and each
producer run as separate OS processes on a private loopback mesh, the jobs run and their
results come back, and SIGTERM stops the owner cleanly.

Each test isolates its processes with a unique key prefix and fixed loopback endpoints with
scouting off (through the ``ISTOS_PREFIX`` and ``ISTOS_ZENOH`` variables the scripts read), so
tests running in parallel, or anything else on the host, never join its mesh.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from zenoh_util import free_port, peer_config, unique_prefix

from istos import OwnerUnavailable, SyncProducer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
QUEUE = "examples/squares"
RUN_TIMEOUT_S = 120  # the bound of one producer run (it waits up to 60 s per result itself)


class Mesh:
    """A private loopback mesh: the owner listens, every other process connects to it."""

    def __init__(self) -> None:
        self.prefix = unique_prefix()
        self.owner_endpoint = f"tcp/127.0.0.1:{free_port()}"

    def owner_config(self) -> dict[str, Any]:
        return peer_config(self.owner_endpoint, [])

    def client_config(self) -> dict[str, Any]:
        return peer_config(f"tcp/127.0.0.1:{free_port()}", [self.owner_endpoint])

    def env(self, config: dict[str, Any]) -> dict[str, str]:
        return {**os.environ, "ISTOS_PREFIX": self.prefix, "ISTOS_ZENOH": json.dumps(config)}


def run_script(name: str, mesh: Mesh, *args: str, alone: bool = False
               ) -> subprocess.CompletedProcess[str]:
    """Run example ``name`` to its end, connected to the mesh's owner (``alone``: to nobody)."""
    config = mesh.owner_config() if alone else mesh.client_config()
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT,
                          env=mesh.env(config), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def wait_until_served(mesh: Mesh, owner: subprocess.Popen[bytes], within_s: float = 60) -> None:
    """Return once the owner process answers a request for its queue (it serves it); fail
    at once if the process exited, or after ``within_s``."""
    with SyncProducer(mesh.client_config(), prefix=mesh.prefix,
                      request_timeout_s=2) as probe:
        for _ in range(int(within_s / 2)):
            assert owner.poll() is None, f"owner_worker.py exited with {owner.returncode}"
            try:
                # An id nobody enqueued: any answer at all means the owner serves the queue.
                assert probe.result(QUEUE, "probe")["state"] == "unknown"
                return
            except OwnerUnavailable:
                continue
    raise AssertionError(f"owner_worker.py did not serve {QUEUE!r} within {within_s} s")


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[Mesh, subprocess.Popen[bytes], Path]]:
    """owner_worker.py running on a private mesh; its output goes to a file (no pipe to fill)."""
    mesh = Mesh()
    out = tmp_path / "owner.out"
    with out.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, str(EXAMPLES / "owner_worker.py")], cwd=ROOT,
                                env=mesh.env(mesh.owner_config()), stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        wait_until_served(mesh, proc)
        yield mesh, proc, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def assert_squares(run: subprocess.CompletedProcess[str], n: int) -> None:
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"enqueued {n} jobs"
    assert lines[1:] == [f"{i} squared is {i * i}" for i in range(n)]


def test_both_producers_get_every_result_and_sigterm_stops_the_owner_cleanly(owner):
    mesh, proc, out = owner
    assert_squares(run_script("producer.py", mesh, "12"), 12)
    assert_squares(run_script("producer_sync.py", mesh, "7"), 7)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # app.run() shut down and returned
    text = out.read_text()
    worked = [line for line in text.splitlines() if line.startswith("job ")]
    # Every job ran once, on its first attempt: 12 from one producer, 7 from the other.
    assert len(worked) == 19 and all(line.endswith("attempt 1") for line in worked), text
    assert sorted(int(line.split(": ")[1].split()[0]) for line in worked) == \
        sorted([*range(12), *range(7)])
    assert text.splitlines()[-1] == "stopped cleanly", text


@pytest.mark.parametrize("script", ["producer.py", "producer_sync.py"])
def test_a_producer_with_no_owner_fails_with_owner_unavailable(script: str):
    run = run_script(script, Mesh(), "1", alone=True)  # a peer alone on its own mesh
    assert run.returncode != 0
    assert "OwnerUnavailable" in run.stderr, run.stderr
