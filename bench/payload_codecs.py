"""Perf check (not a test): what each payload codec chain costs per job, on the producer
(encode a body) plus the worker (decode it), against no codecs.

Run: ``.venv/bin/python bench/payload_codecs.py [--n 20000]``. Bodies: a small JSON-like dict
(~100 bytes of msgpack), a 16 KiB one with repetitive text, and a 4 MiB one of random bytes,
which only a chain ending in the offload codec (``istos.offload``, a directory on local disk)
takes. Prints microseconds per body for encode + decode and the encoded size. Asserts
nothing; CPU only for the first two (no mesh, no storage).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from istos.errors import InvalidJob  # noqa: E402
from istos.offload import DirectoryStore, OffloadCodec  # noqa: E402
from istos.payload import AesGcmCodec, CodecChain, ZlibCodec  # noqa: E402

BODIES: dict[str, Any] = {
    "small": {"to": "someone@example.com", "template": "welcome", "user_id": 123456,
              "vars": {"name": "Ada", "plan": "pro", "trial_days": 14}, "tags": ["a", "b"]},
    "16KiB": {"to": "someone@example.com", "html": "<p>hello, world</p>" * 860},
    "4MiB": {"file": os.urandom(4 << 20)},
}


def chains(store_dir: str) -> dict[str, CodecChain]:
    key = os.urandom(32)
    store = DirectoryStore(store_dir)
    return {
        "none": CodecChain(),
        "zlib": CodecChain([ZlibCodec()]),
        "aes-gcm": CodecChain([AesGcmCodec({"k": key}, "k")]),
        "zlib+aes-gcm": CodecChain([ZlibCodec(), AesGcmCodec({"k": key}, "k")]),
        "aes-gcm+offload": CodecChain([AesGcmCodec({"k": key}, "k"), OffloadCodec(store)]),
    }


def per_body_us(chain: CodecChain, body: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        chain.decode_body(chain.encode_body(body))
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    print(f"{'body':8} {'codecs':16} {'us/body':>9} {'bytes':>7}")
    with tempfile.TemporaryDirectory() as store_dir:
        for body_name, body in BODIES.items():
            for name, chain in chains(store_dir).items():
                try:
                    size = len(chain.encode_body(body))
                except InvalidJob:
                    continue  # over the 1 MiB wire limit without the offload codec
                runs = n if size < 64 << 10 and body_name != "4MiB" else max(1, n // 200)
                per_body_us(chain, body, max(1, runs // 10))  # warm up
                us = per_body_us(chain, body, runs)
                print(f"{body_name:8} {name:16} {us:9.1f} {size:7d}")
                for leftover in os.listdir(store_dir):  # (no janitor here)
                    os.unlink(os.path.join(store_dir, leftover))


if __name__ == "__main__":
    main()
