"""Helpers for tests that run real Zenoh sessions.

With multicast scouting every Zenoh peer on the host joins one mesh, other test runs included.
Tests therefore build private meshes on loopback (:func:`isolated_configs`) and put their keys
under a :func:`unique_prefix`.
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from services import free_port

from istos.transport.base import NoResponder
from istos.transport.zenoh import ZenohTransport

__all__ = ["free_port", "isolated_configs", "peer_config", "unique_prefix", "wait_until",
           "open_transports", "close_all", "query_when_served"]


def isolated_configs(n: int) -> list[dict[str, Any]]:
    """Configs for ``n`` peers forming a private full mesh on loopback.

    Scouting is off (multicast would let any peer on the host in, and gossip is not needed),
    so node ``i`` listens on its own port and connects to every earlier node: the mesh is
    complete without relying on discovery and nothing outside it can join.
    """
    endpoints = [f"tcp/127.0.0.1:{free_port()}" for _ in range(n)]
    return [peer_config(endpoints[i], endpoints[:i]) for i in range(n)]


def peer_config(listen: str, connect: list[str]) -> dict[str, Any]:
    """A peer that listens on ``listen``, connects to ``connect`` and scouts for nothing else."""
    return {
        "mode": "peer",
        "scouting": {
            "multicast": {"enabled": False},
            "gossip": {"enabled": False},
            # Opening waits up to this long for "start conditions" that, on a private mesh,
            # are sometimes never signalled although the connect succeeded (0.5 s by default).
            "delay": 20,
        },
        "listen": {"endpoints": [listen]},
        "connect": {"endpoints": list(connect)},
    }


def unique_prefix() -> str:
    """A key prefix no other test (or test run) uses: ``istos-test/<hex>``."""
    return f"istos-test/{secrets.token_hex(6)}"


async def wait_until(
    pred: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0, what: str = ""
) -> None:
    """Poll ``pred`` (sync or async) every 5 ms until true; AssertionError after ``timeout_s``.

    Only for conditions with no event to await, such as Zenoh route propagation.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = pred()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s} s: {what or pred!r}")
        await asyncio.sleep(0.005)


async def open_transports(n: int, prefix_nodes: str = "n") -> list[ZenohTransport]:
    """Start ``n`` transports on a private loopback mesh, node ids ``<prefix_nodes>0..n-1``.

    Returns once every node sees all others as connected peers (bounded at 5 s).
    Callers close them (``await t.close()`` for each).
    """
    configs = isolated_configs(n)
    transports = [ZenohTransport(c, node_id=f"{prefix_nodes}{i}") for i, c in enumerate(configs)]
    try:
        # In order: node i connects to earlier nodes, which are already listening.
        for transport in transports:
            await transport.start()
        await wait_until(
            lambda: all(len(t.peer_ids()) == n - 1 for t in transports),
            what=f"{n} peers connected",
        )
    except BaseException:
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
        raise
    return transports


async def close_all(transports: list[ZenohTransport]) -> None:
    """Close every transport (each close is idempotent)."""
    await asyncio.gather(*(t.close() for t in transports))


async def query_when_served(
    transport: ZenohTransport,
    key: str,
    payload: bytes,
    timeout_s: float = 1.0,
    within_s: float = 5.0,
) -> bytes:
    """``transport.query`` retried on NoResponder until a freshly declared queryable is routed.

    A declaration reaches other peers asynchronously, so a query sent right after it may find
    nobody. Raises the last NoResponder after ``within_s``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            return await transport.query(key, payload, timeout_s)
        except NoResponder:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.005)


def router_configs(n_clients: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A router config on a free loopback port and ``n_clients`` client configs connected to it:
    the production shape (apps in client mode, routed by ``zenohd``), with a zenoh-python
    session in router mode standing in for ``zenohd``. Scouting is off, so nothing else joins.
    """
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    quiet = {"multicast": {"enabled": False}, "gossip": {"enabled": False}}
    router = {"mode": "router", "listen": {"endpoints": [endpoint]}, "scouting": quiet}
    clients = [{"mode": "client", "connect": {"endpoints": [endpoint]},
                "scouting": {"multicast": {"enabled": False}}} for _ in range(n_clients)]
    return router, clients
