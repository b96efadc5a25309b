"""Istos against its peers, same workload, same machine, one table.

    .venv/bin/python -m bench.peers [--rounds 5] [--jobs 2000] [--concurrency 8]
                                    [--pickups 100] [--producers 8] [--width 64]
                                    [--only istos-local,istos-remote,...] [--no-limits]
                                    [--settle 0.8] [--smoke]

Workload (every system): ``--jobs`` jobs of about 100 bytes, a no-op handler, one worker
process with ``--concurrency`` slots, a producer that awaits each enqueue. Figures: drain jobs/s
(a full queue, worker started afterwards), e2e jobs/s (worker idle and ready, producer
enqueues), enqueue p50/p99 ms (each call of the e2e phase), pickup p50/p99 ms (an idle
worker: enqueue returned -> handler started, ``--pickups`` jobs one at a time), e2e jobs/s with
``--producers`` producer processes each enqueuing sequentially, and with one process enqueuing
from ``--width`` concurrent coroutines (threads for the sync clients). The last two are not run
for the Istos variants whose owner lives in the producer. Pipelined e2e jobs/s: one producer
process hands over every job without waiting one round trip each (Istos: ``app.pipeline``;
peers without such a path show n/a, and its ratio is taken to the best peer's best figure from
one producer process: e2e or W coroutines). See ``_peer_harness.py``.

Every figure is also shown as a ratio to the best peer (a system not named ``istos-*``) in the
same run: throughput over the best peer's (higher is better), latency over the best peer's
(lower is better), medians of at least 3 interleaved rounds (``--smoke`` allows fewer, for
checking the harness only). Each round also runs the raw limits (``_raw_limits.py``, one round
of it) as a block of the rotation, so pickup is also shown over the raw Zenoh query round trip
of the same round: spaced 5 ms apart as the pickups are (each query wakes idle threads, as a
pickup does: the fair baseline), and back to back (threads already awake). The 1-min load
average is printed at the start of every block and kept in the JSON: figures from blocks that
started at a load of 1 or more are flagged as not quiet; ``--settle 0.8`` waits before each
block (at most ``--settle-max-s``) until the previous block's load has decayed below 0.8.
``istos-remote-uvloop`` is ``istos-remote`` with uvloop in every process (needs
``pip install 'istos-nb[uvloop]'``; skipped otherwise): an A/B in the same run.

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
import importlib.util
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
LIMITS = "raw-limits"  # the raw limits' block in each round's rotation

# name -> (row label, driver script, pip requirements or None for this interpreter, spec)
SYSTEMS: dict[str, tuple[str, str, list[str] | None, dict[str, Any]]] = {
    "istos-local": ("Istos, owner in the producer's process", "_peer_istos.py", None,
                    {"variant": "local"}),
    "istos-remote": ("Istos, owner in its own process (remote producer)", "_peer_istos.py",
                     None, {"variant": "remote"}),
    "istos-remote-uvloop": ("Istos, owner in its own process, uvloop everywhere",
                            "_peer_istos.py", None, {"variant": "remote", "uvloop": True}),
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
    _, _, reqs, extra = SYSTEMS[name]
    if reqs is None:
        if extra.get("uvloop") and importlib.util.find_spec("uvloop") is None:
            print(f"SKIPPING {name}: uvloop is not installed (pip install 'istos-nb[uvloop]')",
                  file=sys.stderr)
            return None
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
    values = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


# column key -> (header, format, higher is better)
COLUMNS: list[tuple[str, str, str, bool]] = [
    ("drain_jobs_s", "drain jobs/s", ",.0f", True),
    ("e2e_jobs_s", "e2e jobs/s (1 producer, awaits each)", ",.0f", True),
    ("pipe_e2e_jobs_s", "pipelined e2e jobs/s (1 producer)", ",.0f", True),
    ("enqueue_p50_ms", "enqueue p50 ms", ".3f", False),
    ("enqueue_p99_ms", "enqueue p99 ms", ".2f", False),
    ("pickup_p50_ms", "pickup p50 ms", ".3f", False),
    ("pickup_p99_ms", "pickup p99 ms", ".2f", False),
    ("procs_e2e_jobs_s", "e2e, N producer procs", ",.0f", True),
    ("conc_e2e_jobs_s", "e2e, W coroutines", ",.0f", True),
]


def is_peer(name: str) -> bool:
    return not name.startswith("istos")


def best_peer(names: list[str], raw: dict[str, list[dict[str, Any]]], key: str,
              higher: bool) -> tuple[float, str] | None:
    """The best peer's median of ``key`` (and its name); for the pipelined column, a peer
    without one counts with its best figure from one producer process."""
    got: list[tuple[float, str]] = []
    for name in names:
        if not is_peer(name):
            continue
        value = median_of(raw[name], key)
        if key == "pipe_e2e_jobs_s" and value is None:
            alts = [median_of(raw[name], k) for k in ("e2e_jobs_s", "conc_e2e_jobs_s")]
            value = max((a for a in alts if a is not None), default=None)
        if value is not None:
            got.append((value, name))
    if not got:
        return None
    return max(got) if higher else min(got)


def pickup_over_raw(runs: list[dict[str, Any]], raw_rounds: list[dict[str, Any]],
                    key: str = "spaced_p50_ms") -> float | None:
    """The median over rounds of pickup p50 / the same round's raw Zenoh query p50 (``key``:
    spaced 5 ms apart as the pickups are, by default; ``seq_p50_ms``: back to back)."""
    query = {q["round"]: q[key] for q in raw_rounds if q.get(key)}
    ratios = [r["pickup_p50_ms"] / query[r["round"]] for r in runs
              if "error" not in r and r.get("pickup_p50_ms") and r.get("round") in query]
    return statistics.median(ratios) if ratios else None


def print_table(names: list[str], raw: dict[str, list[dict[str, Any]]],
                limits: list[dict[str, Any]], rounds: int) -> None:
    print("\nMedians over rounds (absolute figures: for comparing within this run only)\n")
    print("| system | " + " | ".join(c[1] for c in COLUMNS) + " | rounds ok |")
    print("|---|" + "---|" * len(COLUMNS) + "---|")
    for name in names:
        runs = raw[name]
        ok = sum("error" not in r for r in runs)
        cells = [fmt(median_of(runs, key), spec) for key, _, spec, _ in COLUMNS]
        print(f"| {SYSTEMS[name][0]} | " + " | ".join(cells) + f" | {ok}/{rounds} |")
    bests = {key: best_peer(names, raw, key, higher) for key, _, _, higher in COLUMNS}
    print("\nEach figure over the best peer's in this run (throughput: higher is better; "
          "latency: lower is better)\n")
    print("| system | " + " | ".join(c[1] for c in COLUMNS)
          + " | pickup p50 / raw query 5 ms apart | pickup p50 / raw query back to back |")
    print("|---|" + "---|" * len(COLUMNS) + "---|---|")
    for name in names:
        cells = []
        for key, _, _, _ in COLUMNS:
            value, best = median_of(raw[name], key), bests[key]
            cells.append("n/a" if value is None or best is None or not best[0]
                         else f"{value / best[0]:.2f}x")
        spaced = pickup_over_raw(raw[name], limits)
        warm = pickup_over_raw(raw[name], limits, "seq_p50_ms")
        print(f"| {SYSTEMS[name][0]} | " + " | ".join(cells)
              + f" | {fmt(spaced, '.2f')}{'x' if spaced is not None else ''}"
              + f" | {fmt(warm, '.2f')}{'x' if warm is not None else ''} |")
    print("\n| column | best peer (median) |")
    print("|---|---|")
    for key, header, spec, _ in COLUMNS:
        best = bests[key]
        print(f"| {header} | " + ("n/a" if best is None else
                                  f"{SYSTEMS[best[1]][0]}: {format(best[0], spec)}") + " |")
    if limits:
        print("\n| raw limit (two processes, loopback), median of the rounds | figure |")
        print("|---|---|")
        med = {k: statistics.median(r[k] for r in limits if k in r) for k in limits[0]}
        for key, label, spec in RAW_LABELS:
            if key in med:
                print(f"| {label} | {format(med[key], spec)} |")


RAW_LABELS = [
    ("seq_p50_ms", "Zenoh query round trip, sequential, p50 ms", ".3f"),
    ("seq_p99_ms", "Zenoh query round trip, sequential, p99 ms", ".2f"),
    ("seq_per_s", "Zenoh sequential queries/s", ",.0f"),
    ("spaced_p50_ms", "Zenoh query round trip, one every 5 ms (as pickups), p50 ms", ".3f"),
    ("inflight64_per_s", "Zenoh queries/s, 64 in flight", ",.0f"),
    ("put_sub_per_s", "Zenoh put -> subscriber, 100-byte messages/s", ",.0f"),
    ("lpush_p50_ms", "Redis LPUSH round trip (redis-py), p50 ms", ".3f"),
    ("lpush_per_s", "Redis sequential LPUSH/s", ",.0f"),
]


def run_limits_block(n: int) -> dict[str, Any]:
    """One round of the raw limits (``_raw_limits.py --rounds 1 --row``): its numeric figures,
    or ``{"error": ...}``."""
    cmd = [sys.executable, "-u", str(BENCH / "_raw_limits.py"), "--rounds", "1", "--n", str(n),
           "--row"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "raw limits: no result within 600 s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            out: dict[str, Any] = json.loads(line[len(RESULT_TAG):])
            return out
    sys.stderr.write(proc.stderr[-3000:])
    return {"error": f"raw limits exited {proc.returncode} without a result"}


def settle(below: float | None, max_s: float) -> float:
    """The 1-min load average once it is below ``below`` (None: at once), waiting at most
    ``max_s`` seconds for it: a block then starts on a machine its predecessor no longer
    loads (the average decays with a one-minute time constant)."""
    load = os.getloadavg()[0]
    deadline = time.monotonic() + max_s
    while below is not None and load >= below and time.monotonic() < deadline:
        time.sleep(2.0)  # (a benchmark's pacing: nothing to wait on but the average)
        load = os.getloadavg()[0]
    return load


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
    p.add_argument("--limit-n", type=int, default=2000,
                   help="sequential queries/LPUSHes of each round's raw-limits block")
    p.add_argument("--settle", type=float, default=None, metavar="LOAD",
                   help="before each block, wait until the 1-min load is below LOAD "
                        "(e.g. 0.8), at most --settle-max-s")
    p.add_argument("--settle-max-s", type=float, default=180.0)
    p.add_argument("--smoke", action="store_true",
                   help="allow fewer than 3 rounds (to check the harness, not for figures)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/peers-<date>)")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    if args.rounds < 1 or args.jobs < 1:
        p.error("--rounds and --jobs must be >= 1")
    if args.rounds < 3 and not args.smoke:
        p.error("the figures are medians of at least 3 interleaved rounds: --rounds 3 or more "
                "(or --smoke to check the harness)")
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
    limits: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    blocks = names + ([] if args.no_limits else [LIMITS])
    for r in range(args.rounds):
        shift = r % max(1, len(blocks))
        for name in blocks[shift:] + blocks[:shift]:  # rotate, so no block is always first
            load = settle(args.settle, args.settle_max_s)
            loads.append({"round": r + 1, "block": name, "load1": load})
            if name == LIMITS:
                result = run_limits_block(args.limit_n)
                result.update(load1_at_start=load, round=r + 1)
                limits.append(result)
                brief = result.get("error") or (
                    f"query p50 {result['seq_p50_ms']:.3f} ms, LPUSH p50 "
                    f"{result['lpush_p50_ms']:.3f} ms")
            else:
                result = run_one(name, *envs[name], args)
                result.update(load1_at_start=load, round=r + 1)
                raw[name].append(result)
                brief = result.get("error") or (
                    f"drain {result['drain_jobs_s']:,.0f}, e2e {result['e2e_jobs_s']:,.0f} "
                    f"jobs/s, p50 {result['enqueue_p50_ms']:.3f} ms, pickup p50 "
                    f"{result.get('pickup_p50_ms', float('nan')):.3f} ms")
            print(f"  round {r + 1}/{args.rounds} {name} (1-min load at start {load:.2f}): "
                  f"{brief}", file=sys.stderr)
    print_table(names, raw, [x for x in limits if "error" not in x], args.rounds)
    noisy = [x for x in loads if x["load1"] >= 1.0]
    print(f"\n1-min load at block starts: min {min(x['load1'] for x in loads):.2f}, max "
          f"{max(x['load1'] for x in loads):.2f}" + (
              f"; NOT QUIET: {len(noisy)} of {len(loads)} blocks started at load >= 1, "
              "so read the ratios only" if noisy else " (every block started below 1)"))
    out = Path(args.out) if args.out else \
        BENCH / "results" / f"peers-{dt.datetime.now():%Y-%m-%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "raw": raw, "limits": limits,
                               "block_loads": loads,
                               "loadavg_before": load_before,
                               "loadavg_after": os.getloadavg()}, indent=1) + "\n")
    print(f"\n{time.monotonic() - started:.0f} s; 1-min load {load_before[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; every round's figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
