"""Partitions of the HA leader, on real processes in a network namespace. A full partition:
the host side keeps an owner answering (no stretch longer than ``ha_lease_s`` + 1 s, through
the takeover, the expiry of the cut peers' Zenoh link leases and 7 s after), loses no job, and
once the partition heals the cut-off side reaches an owner within 2 s. A cut of the mesh only: the
leader keeps leading and is reached within 2 s of the heal.

Runs ``bench/ha_partition_gap.py --load --far-side --heal-at``: replica A, a worker and a probe
inside the namespace; replica B, a loaded worker (8 at a time, 50 ms jobs) and a probe (stats
every 100 ms, 70 enqueues a second) on the host; a private redis-server. The bench sets up and
removes its own namespace (``bench/_netns.py``: every packet stays on this machine). Needs root,
iproute2 and redis-server.

Why these bounds hold on a loaded machine: B takes over one renewal interval (0.25 s) after A's
lease ran out, and the probe's 100 ms cadence adds at most 0.1 s, so the takeover stretch is
about ``ha_lease_s`` + 0.35 s; the second, once the cut links' leases expire, was 8-10 s before
the links stopped lingering on close and is absent now (several runs at load 9-12: longest
``ha_lease_s`` + 0.2 s). After the heal, Zenoh dials the lost link again at least every second
(``connect.retry``), and the probe's timeout is 1 s: measured 0.03-0.9 s.

Not ``solo``: the margins hold under more load than the suite makes (its own 1-min load is
about 3.5). Both tests of this module run side by side, at a 1-min load of 9-13 from other
work, four times: longest stretch with no owner 2.02-2.22 s (bound 3.0 s), the far side back
within 0.00-0.09 s and the mesh-only side within 0.02-0.09 s (bound 2.0 s), nothing lost. The
runs are mostly waits (about 9 s of CPU each), so they run beside other tests rather than hold
the other workers idle. Each run claims a free subnet (``bench/_netns.py``): two runs, of this
suite or of another on the machine, never share one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from services import redis_server_binary

ROOT = Path(__file__).resolve().parents[1]
HA_LEASE_S = 2.0  # smaller than the 5 s default to keep the run short; the bound scales with it
LINK_LEASE_S = 10.0  # Zenoh's default transport.link.tx.lease: when the cut links expire
CUT_AT = 3.0
# A stretch still open at the heal counts up to the last probe, so a gap that opens when the cut
# links expire (it lasted 8-10 s while links lingered on close) exceeds the bound (ha_lease_s +
# 1 s = 3 s) within 7 s of the expiry: watching longer proves nothing more.
HEAL_AT = CUT_AT + LINK_LEASE_S + 7.0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_full_partition_of_the_leader_keeps_an_owner_answering_and_heals_within_2_s():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    redis_server_binary()  # skips (or fails in CI) without redis-server
    out = subprocess.run(
        [sys.executable, "-m", "bench.ha_partition_gap", "--load", "--far-side", "--json",
         "--ha-lease", str(HA_LEASE_S), "--cut-at", str(CUT_AT), "--heal-at", str(HEAL_AT),
         "--seconds", str(HEAL_AT + 4.0)],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["took"], "the standby never took over"
    assert got["P"]["longest"] <= HA_LEASE_S + 1.0, out.stdout
    assert got["lost"] == 0, out.stdout
    assert got["FP"]["back"] is not None and got["FP"]["back"] <= 2.0, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_leader_cut_from_the_mesh_only_keeps_leading_and_is_reached_within_2_s_of_the_heal():
    """A keeps its store by a second link: it keeps leading (no takeover, no split brain), the
    host side gets no owner while cut, and reaches A within 2 s once the mesh heals, after the
    cut links' leases expired (Zenoh dials them again at least every second)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    redis_server_binary()
    heal_at = CUT_AT + LINK_LEASE_S + 5.0  # Zenoh's own back-off would be at 4 s by then
    out = subprocess.run(
        [sys.executable, "-m", "bench.ha_partition_gap", "--load", "--mesh-only", "--json",
         "--ha-lease", str(HA_LEASE_S), "--cut-at", str(CUT_AT), "--heal-at", str(heal_at),
         "--seconds", str(heal_at + 4.0)],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["took"] == [] and got["stood"] == [], out.stdout  # A led throughout
    assert got["lost"] == 0, out.stdout
    assert got["P"]["back"] is not None and got["P"]["back"] <= 2.0, out.stdout
