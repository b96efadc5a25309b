"""PURE: a queue's rate limit, ``app.queue(name, rate_limit=(n, per_s))``.

A token bucket of ``n`` tokens in which each spent token comes back ``per_s`` seconds after it
was spent (not a drip of ``n / per_s`` a second): so the owner hands out at most ``n`` claims in
*any* window of ``per_s`` seconds, never the ``2n`` a full bucket plus a window of refill would
allow. That is the promise a downstream that answers 429 beyond "10 per second" needs, and the
one the simulator's checker proves (``istos_nb/sim/checker.py``). Celery's ``rate_limit`` is a
drip bucket, BullMQ's limiter a fixed window; this is the sliding window both approximate.

Time is passed in (the owner's clock), never read. Memory: one entry per claim instant within
the last ``per_s`` (at most ``n``). A clock that steps back only delays tokens (never more
claims). The bucket is the owner's RAM: a restarted or failed-over owner starts full.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

__all__ = ["MAX_RATE_N", "TokenBucket", "check_rate_limit"]

MAX_RATE_N = 1_000_000
"""The largest ``n`` of a rate limit (memory is O(n) at worst)."""


def check_rate_limit(option: str, value: object) -> tuple[int, float] | None:
    """``None`` or ``(n, per_s)``: ``n`` an integer in [1, 1,000,000], ``per_s`` a finite
    number > 0 (at most a day); raises ValueError naming ``option`` otherwise (the caller
    retypes it)."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{option} must be None or a pair (n, per_s), got {value!r}")
    n, per_s = value
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RATE_N:
        raise ValueError(f"{option}: n must be an integer in [1, {MAX_RATE_N}], got {n!r}")
    if isinstance(per_s, bool) or not isinstance(per_s, (int, float)) \
            or not math.isfinite(per_s) or not 0 < per_s <= 86_400:
        raise ValueError(f"{option}: per_s must be a number of seconds in (0, 86400], got "
                         f"{per_s!r}")
    return n, float(per_s)


class TokenBucket:
    """At most ``n`` grants in any window of ``per_s`` seconds (see the module doc)."""

    __slots__ = ("n", "per_s", "_spent", "_out", "throttled")

    def __init__(self, n: int, per_s: float) -> None:
        self.n = n
        self.per_s = per_s
        self._spent: deque[list[float]] = deque()  # [time, tokens] per grant instant
        self._out = 0  # tokens spent and not yet back
        self.throttled = 0  # slots refused because the bucket was empty while jobs waited

    def available(self, now: float) -> int:
        """Tokens that may be spent at ``now``."""
        spent, horizon = self._spent, now - self.per_s
        while spent and spent[0][0] <= horizon:
            self._out -= int(spent.popleft()[1])
        return self.n - self._out

    def spend(self, k: int, now: float) -> None:
        """Spend ``k`` tokens at ``now`` (the caller asked :meth:`available` first)."""
        if k <= 0:
            return
        spent = self._spent
        if spent and spent[-1][0] == now:
            spent[-1][1] += k
        else:
            spent.append([now, float(k)])
        self._out += k

    def next_token_at(self, now: float) -> float:
        """When a token is next available (``now`` if one is)."""
        if self.available(now) > 0 or not self._spent:
            return now
        return max(now, self._spent[0][0] + self.per_s)

    def describe(self, now: float) -> dict[str, Any]:
        """What ``stats`` shows: the limit, tokens now, and throttled slots so far."""
        return {"n": self.n, "per_s": self.per_s, "tokens": self.available(now),
                "throttled": self.throttled}
