"""Turning what ``ZenohTransport(config=...)`` accepts into a ``zenoh.Config``.

Accepted forms (:data:`~istos.transport.zenoh.ZenohConfigLike`): None (Zenoh's defaults), a
``zenoh.Config`` (used as is), a dict (Zenoh's JSON5 schema as Python data), a string holding a
``{`` (a JSON5 document), or any other string or ``os.PathLike`` (a path to a JSON5 file).
Everything else, and anything Zenoh rejects while parsing, raises
:class:`~istos.errors.ConfigError` (a ``ValueError``) naming the problem. Parsing catches only
what Zenoh checks when it builds the config; a bad or busy endpoint shows up when the session
opens, in :meth:`~istos.transport.zenoh.ZenohTransport.start`.
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
        return zenoh.Config()
    if isinstance(config, zenoh.Config):
        return config
    try:
        if isinstance(config, dict):
            try:
                text = json.dumps(config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"zenoh config dict is not JSON-serialisable: {exc}") from exc
            return zenoh.Config.from_json5(text)
        if isinstance(config, str) and "{" in config:
            # A JSON5 document always holds an object; a file path practically never a brace.
            return zenoh.Config.from_json5(config)
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if not os.path.isfile(path):
                raise ConfigError(f"zenoh config file not found: {path!r}")
            return zenoh.Config.from_file(path)
    except zenoh.ZError as exc:
        raise ConfigError(f"invalid zenoh config: {exc}") from exc
    raise ConfigError(
        "zenoh config must be None, a zenoh.Config, a dict, a JSON5 string or a path to a "
        f"JSON5 file, not {type(config).__name__}"
    )
