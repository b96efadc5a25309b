"""Perf check (not a test): what each payload codec chain costs per job, on the producer
(encode a body) plus the worker (decode it), against no codecs.

Run: ``.venv/bin/python bench/payload_codecs.py [--n 20000]``. Bodies: a small JSON-like dict
(~100 bytes of msgpack) and a 16 KiB one with repetitive text. Prints microseconds per body for
encode + decode and the encoded size. Asserts nothing; CPU only (no mesh, no storage).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from istos.payload import AesGcmCodec, CodecChain, ZlibCodec  # noqa: E402

BODIES: dict[str, Any] = {
    "small": {"to": "someone@example.com", "template": "welcome", "user_id": 123456,
              "vars": {"name": "Ada", "plan": "pro", "trial_days": 14}, "tags": ["a", "b"]},
    "16KiB": {"to": "someone@example.com", "html": "<p>hello, world</p>" * 860},
}


def chains() -> dict[str, CodecChain]:
    key = os.urandom(32)
    return {
        "none": CodecChain(),
        "zlib": CodecChain([ZlibCodec()]),
        "aes-gcm": CodecChain([AesGcmCodec({"k": key}, "k")]),
        "zlib+aes-gcm": CodecChain([ZlibCodec(), AesGcmCodec({"k": key}, "k")]),
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
    print(f"{'body':8} {'codecs':14} {'us/body':>8} {'bytes':>7}")
    for body_name, body in BODIES.items():
        for name, chain in chains().items():
            per_body_us(chain, body, max(1, n // 10))  # warm up
            us = per_body_us(chain, body, n)
            size = len(chain.encode_body(body))
            print(f"{body_name:8} {name:14} {us:8.1f} {size:7d}")


if __name__ == "__main__":
    main()
