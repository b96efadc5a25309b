"""Istos against its peers, same workload, same machine, one table.

    .venv/bin/python -m bench.peers [--rounds 5] [--jobs 2000] [--concurrency 8]
                                    [--pickups 100] [--producers 8] [--width 64]
                                    [--only istos-local,istos-remote,...] [--no-limits]

Workload (every system): ``--jobs`` jobs of about 100 bytes, a no-op handler, one worker
process with ``--concurrency`` slots, a producer that awaits each enqueue. Figures: drain jobs/s
(a full queue, worker started afterwards), e2e jobs/s (worker idle and ready, producer
enqueues), enqueue p50/p99 ms (each call of the e2e phase), pickup p50/p99 ms (an idle
worker: enqueue returned -> handler started, ``--pickups`` jobs one at a time), e2e jobs/s with
``--producers`` producer processes each enqueuing sequentially, and with one process enqueuing
from ``--width`` concurrent coroutines (threads for the sync clients). The last two are not run
for the Istos variants whose owner lives in the producer. See ``_peer_harness.py``.

Each peer runs in its own virtualenv under ``bench/.peer-venvs/<name>`` (gitignored), created
on first use with pip (pinned versions below); Istos runs with this interpreter and this
repository's package. Rounds are interleaved (every system once per round, the order rotated
each round) and the table shows medians. Services: Redis 127.0.0.1:6379, RabbitMQ
127.0.0.1:5672 (guest/guest), PostgreSQL 127.0.0.1:5432 (database ``test``); every round uses
names of its own and deletes only those. Then the raw limits (``_raw_limits.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".peer-venvs"
RESULT_TAG = "@@RESULT "

# name -> (row label, driver script, pip requirements or None for this interpreter, spec)
SYSTEMS: dict[str, tuple[str, str, list[str] | None, dict[str, Any]]] = {
    "istos-local": ("Istos, owner in the producer's process", "_peer_istos.py", None,
                    {"variant": "local"}),
    "istos-remote": ("Istos, owner in its own process (remote producer)", "_peer_istos.py",
                     None, {"variant": "remote"}),
    "istos-redis": ("Istos, Redis storage, owner in the producer's process", "_peer_istos.py",
                    None, {"variant": "redis"}),
    "dramatiq": ("Dramatiq + Redis (threads 8)", "_peer_dramatiq.py",
                 ["dramatiq[redis]==2.2.1"], {}),
    "taskiq": ("taskiq + Redis streams", "_peer_taskiq.py",
               ["taskiq==0.13.0", "taskiq-redis==1.2.4"], {}),
    "celery": ("Celery + RabbitMQ (threads 8)", "_peer_celery.py", ["celery==5.7.0"], {}),
    "arq": ("arq (poll 10 ms)", "_peer_arq.py", ["arq==0.28.0"], {}),
    "procrastinate": ("procrastinate (PostgreSQL)", "_peer_procrastinate.py",
                      ["procrastinate==3.10.0", "psycopg[binary]==3.3.9"], {}),
}


# -- virtualenvs ------------------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(var, None)
    return env


def python_for(name: str) -> tuple[str, dict[str, str]] | None:
    """The interpreter and environment a system runs with; None if its venv cannot be made."""
    _, _, reqs, _ = SYSTEMS[name]
    if reqs is None:
        return sys.executable, dict(os.environ, PYTHONPATH=str(ROOT))
    venv = VENVS / name
    py = venv / "bin" / "python"
    stamp = venv / "requirements.txt"
    want = "\n".join(reqs) + "\n"
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return str(py), clean_env()
    print(f"setting up {venv} with {' '.join(reqs)} (first use)...", file=sys.stderr)
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *reqs], check=True, env=clean_env())
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"SKIPPING {name}: could not install {reqs} ({exc})", file=sys.stderr)
        return None
    stamp.write_text(want)
    return str(py), clean_env()


# -- rounds -----------------------------------------------------------------------------------
def run_one(name: str, python: str, env: dict[str, str], args: argparse.Namespace
            ) -> dict[str, Any]:
    _, script, _, extra = SYSTEMS[name]
    spec = {"jobs": args.jobs, "concurrency": args.concurrency, "pickups": args.pickups,
            "producers": args.producers, "width": args.width, **extra}
    timeout = 240.0 + args.jobs / 4.0
    try:
        proc = subprocess.run([python, "-u", str(BENCH / script), "run", json.dumps(spec)],
                              capture_output=True, text=True, env=env, cwd="/",
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:g} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result: dict[str, Any] = json.loads(line[len(RESULT_TAG):])
            if "error" in result:
                sys.stderr.write(proc.stderr[-3000:])
            return result
    sys.stderr.write(proc.stderr[-3000:])
    return {"error": f"driver exited {proc.returncode} without a result"}


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if "error" not in r and key in r]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(names: list[str], raw: dict[str, list[dict[str, Any]]],
                limits: dict[str, Any] | None, rounds: int) -> None:
    print("\n| system | drain jobs/s | e2e jobs/s | enqueue p50 / p99 ms | pickup p50 / p99 ms "
          "| e2e, N producer procs | e2e, W coroutines | rounds ok |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        runs = raw[name]
        ok = sum("error" not in r for r in runs)
        print(f"| {SYSTEMS[name][0]} | {fmt(median_of(runs, 'drain_jobs_s'), ',.0f')} | "
              f"{fmt(median_of(runs, 'e2e_jobs_s'), ',.0f')} | "
              f"{fmt(median_of(runs, 'enqueue_p50_ms'), '.3f')} / "
              f"{fmt(median_of(runs, 'enqueue_p99_ms'), '.2f')} | "
              f"{fmt(median_of(runs, 'pickup_p50_ms'), '.3f')} / "
              f"{fmt(median_of(runs, 'pickup_p99_ms'), '.2f')} | "
              f"{fmt(median_of(runs, 'procs_e2e_jobs_s'), ',.0f')} | "
              f"{fmt(median_of(runs, 'conc_e2e_jobs_s'), ',.0f')} | {ok}/{rounds} |")
    if limits:
        print("\n| raw limit (two processes, loopback) | figure |")
        print("|---|---|")
        for label, value in limits.items():
            print(f"| {label} | {value} |")


def run_limits(rounds: int) -> dict[str, Any] | None:
    cmd = [sys.executable, "-u", str(BENCH / "_raw_limits.py"), "--rounds", str(rounds),
           "--table"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            out: dict[str, Any] = json.loads(line[len(RESULT_TAG):])
            return out
    sys.stderr.write(proc.stderr[-3000:])
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians shown)")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--pickups", type=int, default=100, help="jobs of the pickup phase")
    p.add_argument("--producers", type=int, default=8, help="producer processes")
    p.add_argument("--width", type=int, default=64, help="concurrent coroutines")
    p.add_argument("--only", default=",".join(SYSTEMS),
                   help="comma-separated subset of " + ",".join(SYSTEMS))
    p.add_argument("--no-limits", action="store_true", help="skip the raw Zenoh/Redis limits")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/peers-<date>)")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    if args.rounds < 1 or args.jobs < 1:
        p.error("--rounds and --jobs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()
    envs: dict[str, tuple[str, dict[str, str]]] = {}
    for name in args.only:
        got = python_for(name)
        if got is not None:
            envs[name] = got
    names = [n for n in args.only if n in envs]
    raw: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        shift = r % max(1, len(names))
        for name in names[shift:] + names[:shift]:  # rotate, so no system is always first
            result = run_one(name, *envs[name], args)
            raw[name].append(result)
            brief = result.get("error") or (
                f"drain {result['drain_jobs_s']:,.0f}, e2e {result['e2e_jobs_s']:,.0f} jobs/s, "
                f"p50 {result['enqueue_p50_ms']:.3f} ms")
            print(f"  round {r + 1}/{args.rounds} {name}: {brief}", file=sys.stderr)
    limits = None if args.no_limits else run_limits(args.rounds)
    print_table(names, raw, limits, args.rounds)
    out = Path(args.out) if args.out else \
        BENCH / "results" / f"peers-{dt.datetime.now():%Y-%m-%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "raw": raw, "limits": limits,
                               "loadavg_before": load_before,
                               "loadavg_after": os.getloadavg()}, indent=1) + "\n")
    print(f"\n{time.monotonic() - started:.0f} s; 1-min load {load_before[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; every round's figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
