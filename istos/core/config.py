"""Declared options of a queue and a worker, validated once at declaration."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..protocol import MAX_DELAY_S, MAX_PRIORITY
from .backoff import BackoffPolicy
from .groups import MAX_GROUP_BYTES
from .ratelimit import check_rate_limit
from .state import QueuePolicy

_FORBIDDEN_IN_NAMES = set("*$?#[]{} \t\n")


def check_queue_name(name: object) -> str:
    """Queue names become Zenoh key expressions: ``/``-separated, no wildcards, no empty chunk."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue name must be a non-empty string, got {name!r}")
    bad = _FORBIDDEN_IN_NAMES.intersection(name)
    if bad:
        raise ConfigError(f"queue name {name!r} contains {''.join(sorted(bad))!r}; "
                          "use letters, digits, '-', '_', '.' and '/' separators")
    chunks = name.split("/")
    if any(chunk == "" for chunk in chunks):
        raise ConfigError(f"queue name {name!r} has an empty '/' chunk")
    if "rpc" in chunks:
        # An owner serves {prefix}/q/{queue}/rpc/** (a malformed key gets a rejection, not
        # silence), so the first "rpc" chunk must end the queue name.
        raise ConfigError(f"queue name {name!r} has the reserved chunk 'rpc'")
    return name


def _positive(option: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or math.isinf(value):
        raise ConfigError(f"{option} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{option} must be {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    policy: QueuePolicy
    sweep_interval_s: float = 1.0
    ha: bool = False
    admin: bool = False
    ha_lease_s: float = 5.0

    @classmethod
    def build(
        cls, name: str, *, lease_s: float = 30.0, max_attempts: int = 5,
        retry_backoff_s: float = 1.0, retry_backoff_max_s: float = 600.0,
        retry_jitter: float = 0.1, keep_results: bool = False, result_ttl_s: float = 3600.0,
        sweep_interval_s: float | None = None, ha: bool = False, admin: bool = False,
        ha_lease_s: float = 5.0, rate_limit: tuple[int, float] | None = None,
        group_concurrency: int | None = None,
        group_rate_limit: tuple[int, float] | None = None,
    ) -> QueueConfig:
        check_queue_name(name)
        lease = _positive("lease_s", lease_s)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        base = _positive("retry_backoff_s", retry_backoff_s, allow_zero=True)
        cap = _positive("retry_backoff_max_s", retry_backoff_max_s, allow_zero=True)
        if cap < base:
            raise ConfigError(f"retry_backoff_max_s ({cap}) must be >= retry_backoff_s ({base})")
        jitter = _positive("retry_jitter", retry_jitter, allow_zero=True)
        if jitter > 1:
            raise ConfigError(f"retry_jitter must be between 0 and 1, got {retry_jitter!r}")
        ttl = _positive("result_ttl_s", result_ttl_s)
        # Sweeping at a quarter of the lease bounds how late an expired lease is noticed.
        sweep = min(1.0, lease / 4) if sweep_interval_s is None else \
            _positive("sweep_interval_s", sweep_interval_s)
        try:
            limit = check_rate_limit("rate_limit", rate_limit)
            group_limit = check_rate_limit("group_rate_limit", group_rate_limit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if group_concurrency is not None and (
                isinstance(group_concurrency, bool) or not isinstance(group_concurrency, int)
                or group_concurrency < 1):
            raise ConfigError(f"group_concurrency must be None or an integer >= 1, got "
                              f"{group_concurrency!r}")
        policy = QueuePolicy(lease_s=lease, max_attempts=max_attempts,
                             backoff=BackoffPolicy(base, cap, jitter),
                             keep_results=bool(keep_results), result_ttl_s=ttl,
                             rate_limit=limit, group_concurrency=group_concurrency,
                             group_rate_limit=group_limit)
        ha_lease = _positive("ha_lease_s", ha_lease_s)
        return cls(name=name, policy=policy, sweep_interval_s=sweep, ha=bool(ha),
                   admin=bool(admin), ha_lease_s=ha_lease)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    queue: str
    concurrency: int = 1
    poll_interval_s: float = 1.0
    prefetch: int | None = None  # None: automatic (see WorkerRunner)
    heartbeat: bool = False  # renew held leases every lease_s / 3 (see heartbeat.py)
    timeout_s: float | None = None  # hard limit on one run
    park: bool = True  # idle claims wait at a remote owner for a job (worker/parking.py)

    @classmethod
    def build(cls, queue: str, *, concurrency: int = 1, poll_interval_s: float = 1.0,
              prefetch: int | None = None, heartbeat: bool = False,
              timeout_s: float | None = None, park: bool = True) -> WorkerConfig:
        check_queue_name(queue)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if prefetch is not None and (isinstance(prefetch, bool)
                                     or not isinstance(prefetch, int) or prefetch < 0):
            raise ConfigError(f"prefetch must be None (automatic) or an integer >= 0, got "
                              f"{prefetch!r}")
        poll = _positive("poll_interval_s", poll_interval_s)
        if not isinstance(heartbeat, bool):
            raise ConfigError(f"heartbeat must be True or False, got {heartbeat!r}")
        timeout = None if timeout_s is None else _positive("timeout_s", timeout_s)
        if not isinstance(park, bool):
            raise ConfigError(f"park must be True or False, got {park!r}")
        return cls(queue=queue, concurrency=concurrency, poll_interval_s=poll,
                   prefetch=prefetch, heartbeat=heartbeat, timeout_s=timeout, park=park)


def check_delay(delay_s: object) -> float:
    delay = _positive("delay_s", delay_s, allow_zero=True)
    if delay > MAX_DELAY_S:
        raise ConfigError(f"delay_s must be at most {MAX_DELAY_S:g} (ten years), got {delay_s!r}")
    return delay


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"priority must be an integer, got {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigError(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, got "
                          f"{priority!r}")
    return priority


def check_dedup(dedup_s: object, has_id: bool) -> float | None:
    """A dedup window (``enqueue(..., dedup_s=...)``): None, or seconds in [0, ten years];
    it needs producer-chosen ids (a generated id is never sent twice)."""
    if dedup_s is None:
        return None
    window = _positive("dedup_s", dedup_s, allow_zero=True)
    if window > MAX_DELAY_S:
        raise ConfigError(f"dedup_s must be at most {MAX_DELAY_S:g} (ten years), got "
                          f"{dedup_s!r}")
    if not has_id:
        raise ConfigError("dedup_s needs a job_id (job_ids for enqueue_many): the id is what "
                          "a resend repeats")
    return window or None


def check_group(group: object) -> str | None:
    """A job's group: None, or a non-empty string of at most 128 UTF-8 bytes."""
    if group is None:
        return None
    if not isinstance(group, str) or not group:
        raise ConfigError(f"group must be None or a non-empty string, got {group!r}")
    if len(group.encode("utf-8", "surrogatepass")) > MAX_GROUP_BYTES:
        raise ConfigError(f"group {group[:40]!r}... is longer than {MAX_GROUP_BYTES} bytes")
    return group
