"""Zenoh's TCP links do not linger on close in an Istos process (``istos/transport/_linger.py``):
a link to a vanished peer closes at once instead of holding one of Zenoh's receive threads for
10 s. Linux only (it reads ``/proc/self/fd``)."""

from __future__ import annotations

import os
import socket
import struct

import pytest
from zenoh_util import close_all, isolated_configs, wait_until

from istos.transport._linger import ZENOH_LINGER, relax_zenoh_linger
from istos.transport.zenoh import ZenohTransport

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")


def linger(sock: socket.socket) -> tuple[int, int]:
    on, seconds = struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))
    return on, seconds


def test_only_sockets_lingering_as_zenoh_sets_them_are_changed() -> None:
    zenoh_like, chosen, udp = (socket.socket(), socket.socket(),
                               socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        zenoh_like.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ZENOH_LINGER)
        chosen.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 5))
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ZENOH_LINGER)
        assert relax_zenoh_linger() >= 1
        assert linger(zenoh_like)[0] == 0  # off (Linux keeps the old seconds)
        assert linger(chosen) == (1, 5)  # the application's own choice stays
        assert linger(udp) == (1, 10)  # not a TCP link
        zenoh_like.getsockname()  # the descriptor was borrowed, not closed
    finally:
        for sock in (zenoh_like, chosen, udp):
            sock.close()


def zenoh_links(ports: set[int]) -> list[tuple[int, int]]:
    """SO_LINGER of this process's connected TCP sockets with an end on one of ``ports``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue
        try:
            if (sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
                    and {sock.getpeername()[1], sock.getsockname()[1]} & ports):
                found.append(linger(sock))
        except OSError:
            pass
        finally:
            sock.detach()
    return found


async def test_links_of_a_running_transport_stop_lingering() -> None:
    configs = isolated_configs(2)
    ports = {int(c["listen"]["endpoints"][0].rsplit(":", 1)[1]) for c in configs}
    transports = [ZenohTransport(c, node_id=f"linger{i}") for i, c in enumerate(configs)]
    try:
        for transport in transports:
            await transport.start()
        await wait_until(lambda: len(zenoh_links(ports)) >= 2, what="both ends of the link")
        await wait_until(lambda: all(on == 0 for on, _ in zenoh_links(ports)),
                         what="no Zenoh link lingers")
    finally:
        await close_all(transports)
