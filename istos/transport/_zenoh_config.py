"""Turning what ``ZenohTransport(config=...)`` accepts into a ``zenoh.Config``.

Accepted forms (:data:`~istos.transport.zenoh.ZenohConfigLike`): None (Zenoh's defaults), a
``zenoh.Config`` (used as is), a dict (Zenoh's JSON5 schema as Python data), a string holding a
``{`` (a JSON5 document), or any other string or ``os.PathLike`` (a path to a JSON5 file).
Everything else, and anything Zenoh rejects while parsing, raises
:class:`~istos.errors.ConfigError` (a ``ValueError``) naming the problem. Every config built
here carries Zenoh's receive limit :data:`RX_MAX_MESSAGE_BYTES` unless its document set one, so
a message larger than any Istos frame is dropped by Zenoh before it is reassembled in memory
(Zenoh's own default is 1 GiB). A ``zenoh.Config`` object is used as given; :func:`rx_limit`
reads what it allows (an owner warns once when that is more). Parsing catches only
what Zenoh checks when it builds the config; a bad or busy endpoint shows up when the session
opens, in :meth:`~istos.transport.zenoh.ZenohTransport.start`.

Zenoh's shared-memory transport is turned off unless the config names ``shared_memory``: with
it on (Zenoh 1.x's default), every peer on the same host that sends a message of 3 KiB or more
makes a 16 MiB pool, and the receiving side keeps the peer's pool mapped after that peer's
session has closed, so a long-lived owner grew 16 MiB per producer session that came and went
(``bench/zenoh_session_churn.py`` reproduces it with raw Zenoh; off, it stays flat).

A message sent with congestion control BLOCK waits for room in the queue toward each peer for
up to ``transport.link.tx.queue.congestion_control.block.wait_before_close`` (Zenoh's default:
5 s) before Zenoh gives up on that link. Toward a peer that went silent (a pulled cable: no FIN,
no RST) the queue fills within a second of traffic, and the sending thread then stalls for the
whole wait: a new HA leader answered nothing for seconds after a full partition of the old one.
Istos sets it to 1 s unless the config names ``wait_before_close`` (``bench/
zenoh_partition_gap.py`` reproduces it with raw Zenoh: a 5.1 s gap by default, 0.5 s at 0.5 s).

A lost link is dialled again with Zenoh's ``connect.retry`` back-off, which by default grows to
4 s between attempts: after a partition healed, a side that had been cut off for a while
reached the owner only 1.2-4 s later. Istos retries every 250 ms at first and at least every
second (``connect.retry``: ``period_init_ms`` 250, ``period_max_ms`` 1000, factor 2) unless the
config names ``retry``; an attempt toward a peer that is gone costs one connection attempt,
refused at once or dropped (``bench/ha_partition_gap.py --mesh-only --heal-at S``: 1.2-1.3 s
with Zenoh's back-off, 0.02-0.07 s with this one).
A ``zenoh.Config`` object is used exactly as given.
"""

from __future__ import annotations

import json
import os

import zenoh

from ..codec import MAX_MESSAGE_BYTES
from ..errors import ConfigError

RX_KEY = "transport/link/rx/max_message_size"
RX_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES + (64 << 10)
"""The receive limit Istos sets: its frame cap plus room for Zenoh's own headers (the key
expression, attachments). A larger message never lands; its sender gets no reply."""
_ZENOH_DEFAULT_RX = 1 << 30


def rx_limit(config: zenoh.Config) -> int | None:
    """The largest message a session with ``config`` reassembles (None: unreadable)."""
    try:
        value = json.loads(config.get_json(RX_KEY))
    except (zenoh.ZError, ValueError):
        return None
    return value if type(value) is int else None


def to_zenoh_config(config: object) -> zenoh.Config:
    """Turn the accepted config forms into a ``zenoh.Config``; raise ConfigError otherwise."""
    if config is None:
        # Peer mode with multicast scouting: processes on one host find each other unaided.
        return _with_rx_limit(_istos_defaults(zenoh.Config()))
    if isinstance(config, zenoh.Config):
        return config  # the caller's object, untouched (an owner warns if it lacks the limit)
    return _with_rx_limit(_parse(config))


def _with_rx_limit(config: zenoh.Config) -> zenoh.Config:
    """Set the receive limit unless the document chose one itself (Zenoh's default, 1 GiB,
    reads the same as an absent one: both let a 200 MiB request land whole)."""
    if rx_limit(config) == _ZENOH_DEFAULT_RX:
        config.insert_json5(RX_KEY, str(RX_MAX_MESSAGE_BYTES))
    return config


def _parse(config: object) -> zenoh.Config:
    try:
        if isinstance(config, dict):
            try:
                text = json.dumps(config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"zenoh config dict is not JSON-serialisable: {exc}") from exc
            return _istos_defaults(zenoh.Config.from_json5(text), text)
        if isinstance(config, str) and "{" in config:
            # A JSON5 document always holds an object; a file path practically never a brace.
            return _istos_defaults(zenoh.Config.from_json5(config), config)
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if not os.path.isfile(path):
                raise ConfigError(f"zenoh config file not found: {path!r}")
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            return _istos_defaults(zenoh.Config.from_file(path), text)
    except zenoh.ZError as exc:
        raise ConfigError(f"invalid zenoh config: {exc}") from exc
    raise ConfigError(
        "zenoh config must be None, a zenoh.Config, a dict, a JSON5 string or a path to a "
        f"JSON5 file, not {type(config).__name__}"
    )


#: How long a BLOCK message waits for room toward one peer before Zenoh closes that link.
WAIT_BEFORE_CLOSE_US = 1_000_000
#: The back-off between attempts to dial a configured endpoint again (see the module docstring).
CONNECT_RETRY = '{"period_init_ms": 250, "period_max_ms": 1000, "period_increase_factor": 2}'


def _istos_defaults(config: zenoh.Config, text: str = "") -> zenoh.Config:
    """Shared memory off, a 1 s BLOCK wait and a reconnect at least every second, each unless
    the config's text names it (see the module docstring for why)."""
    if "shared_memory" not in text:
        config.insert_json5("transport/shared_memory/enabled", "false")
    if "wait_before_close" not in text:
        config.insert_json5("transport/link/tx/queue/congestion_control/block/wait_before_close",
                            str(WAIT_BEFORE_CLOSE_US))
    if "retry" not in text:
        config.insert_json5("connect/retry", CONNECT_RETRY)
    return config
