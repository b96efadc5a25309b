"""HA takeover figures on real processes: the chaos tests run ``--runs`` times, figures collected.

    .venv/bin/python -m bench.takeover [--runs 3] [--only sigkill,sigstop,pg-stop,pg-cut]

The tests assert behaviour (the standby took over before the dead leader's lease ran out,
while a stuck leader was still stuck, 0 lost, 0 stranded); the seconds they print are
collected here, as docs/project/benchmarks.md's takeover table quotes them: min, median and
max per fault.
Needs the services the tests need (Redis at 127.0.0.1:6379; initdb/postgres for the private
PostgreSQL clusters).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# fault -> (pytest node id, regex for the printed takeover seconds)
FAULTS: dict[str, tuple[str, str]] = {
    "sigkill": ("tests/test_chaos.py::test_ha_leader_sigkilled_while_jobs_flow",
                r"standby took over ([0-9.]+) s after SIGKILL"),
    "sigstop": ("tests/test_chaos_ledger.py::test_frozen_ha_leader_is_harmless",
                r"SIGSTOP leader \(takeover ([0-9.]+) s\)"),
    "pg-stop": ("tests/test_chaos_pg_hold.py::"
                "test_pg_leader_stuck_right_after_its_lease_update_cannot_block_takeover[stop]",
                r"PG leader stop after its lease UPDATE \(takeover ([0-9.]+) s"),
    "pg-cut": ("tests/test_chaos_pg_hold.py::"
               "test_pg_leader_stuck_right_after_its_lease_update_cannot_block_takeover[cut]",
               r"PG leader cut after its lease UPDATE \(takeover ([0-9.]+) s"),
}


def one(fault: str) -> float | None:
    test, pattern = FAULTS[fault]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          test], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    found = re.search(pattern, out.stdout)
    if found is None:
        print(f"  {fault}: no figure (exit {out.returncode}): {out.stdout[-400:]}",
              file=sys.stderr)
        return None
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(FAULTS))
    args = parser.parse_args()
    print("fault      runs  min s  median s  max s")
    for fault in args.only.split(","):
        figures = [f for f in (one(fault) for _ in range(args.runs)) if f is not None]
        if not figures:
            print(f"{fault:<10} {0:>4}  n/a")
            continue
        print(f"{fault:<10} {len(figures):>4}  {min(figures):>5.2f}  "
              f"{statistics.median(figures):>8.2f}  {max(figures):>5.2f}", flush=True)


if __name__ == "__main__":
    main()
