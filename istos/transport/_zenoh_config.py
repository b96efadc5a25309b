"""Turning what ``ZenohTransport(config=...)`` accepts into a ``zenoh.Config``.

Accepted forms (:data:`~istos.transport.zenoh.ZenohConfigLike`): None (Zenoh's defaults), a
``zenoh.Config`` (used as is), a dict (Zenoh's JSON5 schema as Python data), a string holding a
``{`` (a JSON5 document), or any other string or ``os.PathLike`` (a path to a JSON5 file).
Everything else, and anything Zenoh rejects while parsing, raises
:class:`~istos.errors.ConfigError` (a ``ValueError``) naming the problem. Parsing catches only
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
A ``zenoh.Config`` object is used exactly as given.
"""

from __future__ import annotations

import json
import os

import zenoh

from ..errors import ConfigError


def to_zenoh_config(config: object) -> zenoh.Config:
    """Turn the accepted config forms into a ``zenoh.Config``; raise ConfigError otherwise."""
    if config is None:
        # Peer mode with multicast scouting: processes on one host find each other unaided.
        return _istos_defaults(zenoh.Config())
    if isinstance(config, zenoh.Config):
        return config
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


def _istos_defaults(config: zenoh.Config, text: str = "") -> zenoh.Config:
    """Shared memory off and a 1 s BLOCK wait, each unless the config's text names it (see
    the module docstring for why)."""
    if "shared_memory" not in text:
        config.insert_json5("transport/shared_memory/enabled", "false")
    if "wait_before_close" not in text:
        config.insert_json5("transport/link/tx/queue/congestion_control/block/wait_before_close",
                            str(WAIT_BEFORE_CLOSE_US))
    return config
