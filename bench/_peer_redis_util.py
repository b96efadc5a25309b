"""Deleting only what one peer round created on the shared Redis (keys containing its tag)."""

from __future__ import annotations

REDIS_URL = "redis://127.0.0.1:6379/0"


def delete_tagged(tag: str) -> int:
    """Delete every key whose name contains ``tag`` (a unique hex string); SCAN, not KEYS."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"*{tag}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
        return len(keys)
    finally:
        client.close()
