"""A full partition of the HA leader (its veth down in a network namespace: no FIN, no RST):
probes every 100 ms; the longest stretch with no owner answering is at most one ha_lease_s
plus one Zenoh link lease (issue 24, item 2). Runs ``bench/ha_partition_gap.py``, which sets up
and removes its own namespace; needs root and ``ip``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from services import redis_server_binary

ROOT = Path(__file__).resolve().parents[1]
HA_LEASE_S = 1.5
LINK_LEASE_S = 10.0  # Zenoh's default transport.link.tx.lease


@pytest.mark.slow
@pytest.mark.resource("netns-10.224")  # the bench's veth pair is on a fixed 10.224.x subnet
@pytest.mark.timeout(180)
def test_full_partition_of_the_leader_leaves_no_gap_beyond_one_ha_and_one_link_lease():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    redis_server_binary()  # skips (or fails in CI) without redis-server
    out = subprocess.run(
        [sys.executable, "-m", "bench.ha_partition_gap", "--seconds", "20", "--cut-at", "3",
         "--ha-lease", str(HA_LEASE_S), "--load"],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    print(out.stdout)
    found = re.search(r"longest stretch with no owner answering: ([0-9.]+) s", out.stdout)
    assert found, out.stdout + out.stderr[-2000:]
    assert "B leading at never" not in out.stdout  # the standby took over
    assert float(found.group(1)) <= HA_LEASE_S + LINK_LEASE_S
