"""Perf check (not a test): how long one ``istos metrics`` scrape takes when one of its queues
has no owner, against a scrape of live queues only.

Run: ``.venv/bin/python bench/metrics_scrape.py [--scrapes 20]``. An owner serves ``live`` on a
private loopback Zenoh mesh in this process; ``istos metrics`` runs as a subprocess asking for
``live`` and ``dead`` (nobody owns it), then for ``live`` alone. Prints median, p95 and max per
scrape and whether the max stays under the issue's 0.5 s. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import free_port, percentile, unique_prefix, zenoh_configs  # noqa: E402


def scrape_ms(queues: list[str], cfg: dict, prefix: str, scrapes: int) -> list[float]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "istos", "metrics", *queues, "--port",
                             str(port), "--zenoh", json.dumps(cfg), "--prefix", prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "serving metrics ..." once it listens
        url = f"http://127.0.0.1:{port}/metrics"
        urllib.request.urlopen(url, timeout=30).read()  # warm: discovery, first queries
        out = []
        for _ in range(scrapes):
            started = time.perf_counter()
            text = urllib.request.urlopen(url, timeout=30).read().decode()
            out.append((time.perf_counter() - started) * 1000)
            assert 'istos_owner_up{queue="live"} 1.0' in text, text
        return out
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    from istos import Istos

    owner_cfg, cli_cfg = zenoh_configs(2)
    prefix = unique_prefix()
    app = Istos(zenoh=owner_cfg, prefix=prefix, node_id="owner")
    app.queue("live")
    async with app.serving():
        for i in range(100):
            await app.enqueue("live", {"i": i})
        for queues in (["live", "dead"], ["live"]):
            ms = await asyncio.to_thread(scrape_ms, queues, cli_cfg, prefix, args.scrapes)
            verdict = "ok" if max(ms) < 500 else "NO (>= 0.5 s)"
            print(f"scrape of {'+'.join(queues):<10} median {statistics.median(ms):7.1f} ms  "
                  f"p95 {percentile(ms, 95):7.1f} ms  max {max(ms):7.1f} ms  {verdict}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
