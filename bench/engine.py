"""The engine benchmark: our queue against the reference package ``istos==0.3.4``, same run.

    .venv/bin/python -m bench.engine [--runs 5] [--jobs 2000] [--concurrency 8]
                                     [--only e2e,drain,twoproc,latency,owner,memory]
                                     [--no-ref] [--profile]

Each package runs in its own driver process (``bench/_driver_ours.py`` with this interpreter,
``bench/_driver_ref.py`` with ``bench/.ref-venv/bin/python``; both packages import as ``istos``,
so they cannot share a process). The drivers stay up for the whole invocation and take one run
at a time, alternating which package goes first, so both see the same machine state.
Prints a table (medians of ``--runs`` runs; ratios are ours / reference from this invocation)
and writes every run's figures to ``bench/results/engine-<date>.json``. See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REF_VENV = BENCH / ".ref-venv"
REF_VERSION = "0.3.4"
RESULT_TAG = "@@RESULT "
WORKLOADS = ("e2e", "drain", "twoproc", "latency", "owner", "memory")
OWNER_SIZES = (1_000, 100_000, 1_000_000)
OWNER_OPS = ("enqueue", "claim", "ack", "sweep_idle", "sweep_1pct")

# target checks: (figure, how ours must compare)
TARGETS = {
    "e2e": ("ratio", 10.0), "drain": ("ratio", 5.0), "twoproc": ("ratio", 7.0),
    "latency": ("p50_ms", 0.3), "owner": ("flatness", 2.0), "memory": ("bytes_per_job", 1024.0),
}


# -- the reference's virtualenv --------------------------------------------------------------
def ref_python() -> Path:
    return REF_VENV / "bin" / "python"


def ref_installed() -> bool:
    py = ref_python()
    if not py.exists():
        return False
    probe = subprocess.run(
        [str(py), "-c", "from importlib.metadata import version; print(version('istos'))"],
        capture_output=True, text=True, env=ref_env(), cwd="/")
    return probe.returncode == 0 and probe.stdout.strip() == REF_VERSION


def ensure_ref_venv() -> Path | None:
    """Create ``bench/.ref-venv`` with ``istos==0.3.4`` unless it is there; None if it can't be."""
    if ref_installed():
        return ref_python()
    print(f"setting up {REF_VENV} with istos=={REF_VERSION} (first use; about a minute)...",
          file=sys.stderr)
    try:
        if not ref_python().exists():
            subprocess.run([sys.executable, "-m", "venv", str(REF_VENV)], check=True)
        subprocess.run([str(ref_python()), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", f"istos=={REF_VERSION}"],
                       check=True, env=ref_env())
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"SKIPPING the reference: could not install istos=={REF_VERSION} into {REF_VENV} "
              f"({exc}). Only our figures will be reported; the ratios will read n/a.",
              file=sys.stderr)
        return None
    if not ref_installed():
        print(f"SKIPPING the reference: {REF_VENV} does not import istos {REF_VERSION} after "
              "the install.", file=sys.stderr)
        return None
    return ref_python()


def ref_env() -> dict[str, str]:
    """The environment for the reference: nothing that could put our package on its path."""
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(var, None)
    return env


# -- driver processes --------------------------------------------------------------------------
class Driver:
    """One package's driver: JSON commands in, one ``@@RESULT`` line out per command."""

    def __init__(self, name: str, python: str, script: Path, env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [python, "-u", str(script), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd="/")  # cwd: never the repo root on the reference's path
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.alive = True

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def call(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if not self.alive:
            return {"error": f"{self.name} driver is down"}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close(kill=True)
                return {"error": f"{self.name}: no answer to {cmd['cmd']} in {timeout_s:g} s"}
            if line is None:
                self.alive = False
                return {"error": f"{self.name} driver exited (code {self.proc.poll()})"}
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
            print(f"[{self.name}] {line.rstrip()}", file=sys.stderr)

    def close(self, kill: bool = False) -> None:
        if not self.alive:
            return
        self.alive = False
        try:
            if kill:
                self.proc.kill()
            else:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def start_drivers(with_ref: bool) -> tuple[Driver, Driver | None, dict[str, Any]]:
    ours = Driver("ours", sys.executable, BENCH / "_driver_ours.py", dict(os.environ))
    about = {"ours": ours.call({"cmd": "hello"}, 60)}
    if "error" in about["ours"] or not str(about["ours"]["file"]).startswith(str(ROOT / "istos")):
        sys.exit(f"our driver does not import this repository's istos: {about['ours']}")
    ref: Driver | None = None
    python = ensure_ref_venv() if with_ref else None
    if python is not None:
        ref = Driver("reference", str(python), BENCH / "_driver_ref.py", ref_env())
        about["reference"] = ref.call({"cmd": "hello"}, 120)
        where = str(about["reference"].get("file", ""))
        if "error" in about["reference"] or not where.startswith(str(REF_VENV)) \
                or about["reference"].get("version") != REF_VERSION:
            print(f"SKIPPING the reference: its driver imported {about['reference']}",
                  file=sys.stderr)
            ref.close(kill=True)
            ref = None
    return ours, ref, about


# -- running the workloads ---------------------------------------------------------------------
def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    return statistics.median(values) if values else None


def compare_runs(name: str, ours: Driver, ref: Driver | None, cmd: dict[str, Any], runs: int,
                 timeout_s: float) -> dict[str, Any]:
    """Alternate the packages run by run; keep every run's figures."""
    out: dict[str, Any] = {"ours": [], "reference": []}
    for i in range(runs):
        order = [("ours", ours), ("reference", ref)]
        if i % 2:
            order.reverse()
        for label, driver in order:
            if driver is None:
                continue
            result = driver.call(cmd, timeout_s)
            if "error" in result:
                print(f"  {name} run {i + 1} {label}: {result['error']}", file=sys.stderr)
            out[label].append(result)
        print(f"  {name} run {i + 1}/{runs}: " + ", ".join(
            f"{label} {brief(name, out[label][-1])}" for label in ("ours", "reference")
            if out[label]), file=sys.stderr)
    return out


def brief(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return "error"
    if name == "latency":
        return f"p50 {result['p50_ms']:.3f} ms"
    return f"{result['jobs_per_s']:,.0f} jobs/s"


def summarize_throughput(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    keys = ("jobs_per_s", "claims_per_job", "empty_claims_per_job")
    s: dict[str, Any] = {"runs": raw}
    for label in ("ours", "reference"):
        s[label] = {k: median_of(raw[label], k) for k in keys}
    per_run = [o["jobs_per_s"] / r["jobs_per_s"] for o, r in zip(raw["ours"], raw["reference"])
               if "error" not in o and "error" not in r]
    s["ratios_per_run"] = per_run
    s["ratio_median_per_run"] = statistics.median(per_run) if per_run else None
    o, r = s["ours"]["jobs_per_s"], s["reference"]["jobs_per_s"]
    s["ratio"] = o / r if o and r else None
    want = TARGETS[name][1]
    s["target"] = f">= {want:g}x"
    s["met"] = None if s["ratio"] is None else s["ratio"] >= want
    return s


def summarize_latency(raw: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"runs": raw}
    for label in ("ours", "reference"):
        s[label] = {k: median_of(raw[label], k) for k in ("p50_ms", "p99_ms", "mean_ms")}
    o, r = s["ours"]["p50_ms"], s["reference"]["p50_ms"]
    s["ratio"] = r / o if o and r else None  # how many times faster ours is
    s["target"] = "p50 <= 0.3 ms"
    s["met"] = None if o is None else o <= TARGETS["latency"][1]
    return s


# -- the report --------------------------------------------------------------------------------
def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "n/a" if value is None else format(value, spec)


def times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.1f}x"


def fewer(ours: float | None, ref: float | None) -> bool | None:
    return None if ours is None or ref is None else ours < ref


def yes_no(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "NO")


def print_report(results: dict[str, Any]) -> None:
    w = results["workloads"]
    rows: list[tuple[str, ...]] = []
    titles = {"e2e": "1 end to end, one process", "drain": "2 drain a full queue",
              "twoproc": "3 end to end, two processes"}
    for name in ("e2e", "drain", "twoproc"):
        if name not in w:
            continue
        s = w[name]
        spread = s["ratios_per_run"]
        span = f" ({min(spread):.1f}-{max(spread):.1f})" if spread else ""
        rows.append((f"{titles[name]} (jobs/s)", fmt(s["ours"]["jobs_per_s"]),
                     fmt(s["reference"]["jobs_per_s"]), times(s["ratio"]) + span,
                     s["target"], yes_no(s["met"])))
        rows.append(("    empty claims per job", fmt(s["ours"]["empty_claims_per_job"], ".4f"),
                     fmt(s["reference"]["empty_claims_per_job"], ".3f"), "", "fewer",
                     yes_no(fewer(s["ours"]["empty_claims_per_job"],
                                  s["reference"]["empty_claims_per_job"]))))
        rows.append(("    claims per job", fmt(s["ours"]["claims_per_job"], ".3f"),
                     fmt(s["reference"]["claims_per_job"], ".3f"), "", "", ""))
    if "latency" in w:
        s = w["latency"]
        rows.append(("4 enqueue latency p50 (ms)", fmt(s["ours"]["p50_ms"], ".4f"),
                     fmt(s["reference"]["p50_ms"], ".3f"),
                     times(s["ratio"]) + (" faster" if s["ratio"] else ""),
                     s["target"], yes_no(s["met"])))
        rows.append(("    enqueue latency p99 (ms)", fmt(s["ours"]["p99_ms"], ".4f"),
                     fmt(s["reference"]["p99_ms"], ".3f"), "", "", ""))
    if "memory" in w:
        s = w["memory"]
        rows.append(("6 owner memory per queued job (B)",
                     fmt(s.get("tracemalloc_bytes_per_job")) + " traced / "
                     + fmt(s.get("rss_bytes_per_job")) + " RSS", "-", "", "<= 1024 B",
                     yes_no(s.get("met"))))
    header = ("workload", "ours", "reference", "ratio (per-run range)", "target", "met?")
    print_table(header, rows)
    if "owner" in w and "error" not in w["owner"]:
        print_owner(w["owner"])


def print_owner(s: dict[str, Any]) -> None:
    sizes = [str(n) for n in s["sizes"]]
    print(f"\n5 owner cost, ours only (us per op; median of {s['runs']} batches of {s['batch']};"
          " sweep_1pct is per reclaimed lease)")
    header = ("level", "op", *(f"backlog {int(n):,}" for n in sizes),
              f"{int(sizes[-1]):,} / {int(sizes[0]):,}", "met? (<= 2x)")
    rows = []
    for level in ("state", "owner"):
        for op in OWNER_OPS:
            ratio = s["flatness"][level][op]
            rows.append((level, op, *(fmt(s[level][n][op], ".2f") for n in sizes),
                         f"{ratio:.2f}x", yes_no(ratio <= TARGETS["owner"][1])))
    print_table(header, rows)



def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(widths[i]) for i, h in enumerate(header))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))


# -- main --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per workload (medians are reported)")
    p.add_argument("--jobs", type=int, default=2000, help="jobs per throughput/latency run")
    p.add_argument("--concurrency", type=int, default=8, help="the worker's concurrency")
    p.add_argument("--prefetch", type=int, default=None,
                   help="our worker's prefetch (jobs claimed beyond free slots; default: the "
                        "engine's automatic prefetch); the reference has no such option")
    p.add_argument("--only", default=",".join(WORKLOADS),
                   help="comma-separated subset of " + ",".join(WORKLOADS))
    p.add_argument("--no-ref", action="store_true", help="skip the reference package")
    p.add_argument("--owner-sizes", default=",".join(str(n) for n in OWNER_SIZES),
                   help="backlogs for the owner-cost workload")
    p.add_argument("--owner-batch", type=int, default=2000, help="ops timed per owner-cost run")
    p.add_argument("--memory-jobs", type=int, default=100_000, help="jobs for the memory figure")
    p.add_argument("--profile", action="store_true",
                   help="instead: cProfile our e2e, drain and twoproc once each "
                        "(bench/results/profile-ours-*.txt)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/engine-<date>)")
    args = p.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(args.only) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workload(s) {sorted(unknown)}; choose from {','.join(WORKLOADS)}")
    if args.runs < 1 or args.jobs < 1:
        p.error("--runs and --jobs must be >= 1")
    return args


def run_profiles(args: argparse.Namespace) -> None:
    out_dir = BENCH / "results"
    env = dict(os.environ, BENCH_JOBS=str(args.jobs), BENCH_CONCURRENCY=str(args.concurrency))
    for workload in ("e2e", "drain", "twoproc"):
        subprocess.run([sys.executable, "-u", str(BENCH / "_driver_ours.py"), "profile", workload,
                        str(out_dir)], check=True, env=env, cwd="/")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        run_profiles(args)
        return 0
    started = time.monotonic()
    load_before = os.getloadavg()
    if load_before[0] > 1.0:
        print(f"note: the machine is busy (1-min load {load_before[0]:.1f} on {os.cpu_count()} "
              "CPUs); absolute figures will be low and noisy, ratios less so (the packages "
              "alternate run by run)", file=sys.stderr)
    want_ref = not args.no_ref and any(w in args.only for w in ("e2e", "drain", "twoproc",
                                                                  "latency"))
    ours, ref, about = start_drivers(want_ref)
    results: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "loadavg_before": load_before},
        "args": {k: v for k, v in vars(args).items() if k != "profile"},
        "packages": about, "workloads": {},
    }
    work = results["workloads"]
    throughput_cmd = {"jobs": args.jobs, "concurrency": args.concurrency,
                      "prefetch": args.prefetch}
    timeout = 60.0 + args.jobs / 20.0
    try:
        for name in ("e2e", "drain", "twoproc"):
            if name in args.only:
                print(f"{name}: {args.runs} runs of {args.jobs} jobs...", file=sys.stderr)
                raw = compare_runs(name, ours, ref, {"cmd": name, **throughput_cmd}, args.runs,
                                   timeout)
                work[name] = summarize_throughput(name, raw)
        if "latency" in args.only:
            print(f"latency: {args.runs} runs of {args.jobs} enqueues...", file=sys.stderr)
            raw = compare_runs("latency", ours, ref, {"cmd": "latency", "jobs": args.jobs},
                               args.runs, timeout)
            work["latency"] = summarize_latency(raw)
        if "owner" in args.only:
            sizes = [int(s) for s in args.owner_sizes.split(",")]
            print(f"owner: backlogs {sizes}, {args.runs} runs...", file=sys.stderr)
            s = ours.call({"cmd": "owner", "sizes": sizes, "batch": args.owner_batch,
                           "runs": args.runs}, 900)
            if "error" not in s:
                s["met"] = all(r <= TARGETS["owner"][1]
                               for level in s["flatness"].values() for r in level.values())
            work["owner"] = s
        if "memory" in args.only:
            print(f"memory: {args.memory_jobs:,} jobs...", file=sys.stderr)
            s = ours.call({"cmd": "memory", "jobs": args.memory_jobs}, 600)
            if "error" not in s:
                s["met"] = s["tracemalloc_bytes_per_job"] <= TARGETS["memory"][1]
            work["memory"] = s
    finally:
        ours.close()
        if ref is not None:
            ref.close()
    results["elapsed_s"] = time.monotonic() - started
    results["machine"]["loadavg_after"] = os.getloadavg()
    print()
    print_report(results)
    out = Path(args.out) if args.out else \
        BENCH / "results" / f"engine-{dt.datetime.now():%Y-%m-%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{results['elapsed_s']:.0f} s; 1-min load {load_before[0]:.1f} before, "
          f"{results['machine']['loadavg_after'][0]:.1f} after; every run's figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
