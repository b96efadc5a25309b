"""PURE: capped exponential backoff with jitter, from an injected rng.

``retry_backoff_s`` after the first failure, doubling after each further one, capped at
``retry_backoff_max_s``; the jitter multiplies by a factor drawn uniformly from
``[1 - jitter, 1 + jitter]`` and the result is capped again, so the cap is never exceeded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    base_s: float = 1.0
    max_s: float = 600.0
    jitter: float = 0.1


def nominal_delay(failed_attempt: int, policy: BackoffPolicy) -> float:
    """The delay before retrying after attempt ``failed_attempt`` (1-based) failed, unjittered."""
    exponent = min(max(failed_attempt - 1, 0), 1023)  # beyond this 2**n overflows a float
    return min(policy.max_s, policy.base_s * (2.0**exponent))


def delay_bounds(failed_attempt: int, policy: BackoffPolicy) -> tuple[float, float]:
    """The interval every jittered delay for this attempt falls in."""
    nominal = nominal_delay(failed_attempt, policy)
    lo = nominal * (1.0 - policy.jitter)
    hi = min(policy.max_s, nominal * (1.0 + policy.jitter))
    return min(lo, hi), hi


def backoff(failed_attempt: int, policy: BackoffPolicy, rng: random.Random) -> float:
    """A jittered delay for the retry after ``failed_attempt`` failed."""
    nominal = nominal_delay(failed_attempt, policy)
    if policy.jitter <= 0:
        return nominal
    factor = 1.0 + rng.uniform(-policy.jitter, policy.jitter)
    return min(policy.max_s, nominal * factor)
