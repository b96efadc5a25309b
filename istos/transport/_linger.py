"""Zenoh's TCP links linger on close; Istos turns that off so a vanished peer stalls nothing.

Zenoh 1.x sets ``SO_LINGER`` to 10 s on every TCP link, and drops a link whose lease expired
on one of the few worker threads of its receive runtime (two on a two-core machine). On Linux,
``close(2)`` of a lingering TCP socket waits until the peer acknowledged the FIN, non-blocking
socket or not. A peer that vanished (a pulled cable, a full partition) acknowledges nothing, so
each such close holds a receive thread for the whole 10 s, and with two links closing at once
nothing else on the session is read: a new HA leader answered no request for 8-10 s once the
old leader's side of a partition timed out (``bench/ha_partition_gap.py --load --far-side``;
py-spy and gdb showed both receive threads in ``close``). Without the option (the kernel's
default) ``close`` returns at once and the kernel finishes the orderly close, queued bytes
included, in the background.

So the transport turns the option off, every :data:`SWEEP_S`, on each TCP socket of this
process that lingers exactly as Zenoh sets it (on, 10 s): Zenoh opens links at any time
(reconnects, new peers) and offers no setting for it. Sockets set otherwise (a database
client's, or one the application chose to linger) are left alone. Linux only: elsewhere
:func:`relax_zenoh_linger` does nothing.
"""

from __future__ import annotations

import os
import socket
import struct

SWEEP_S = 0.5
"""How often the transport looks for new lingering links."""

ZENOH_LINGER = struct.pack("ii", 1, 10)
"""``struct linger`` as Zenoh sets it on a TCP link: on, 10 s."""
_OFF = struct.pack("ii", 0, 0)
_FD_DIR = "/proc/self/fd"


def relax_zenoh_linger() -> int:
    """Turn ``SO_LINGER`` off on this process's TCP sockets that carry Zenoh's setting;
    return how many were changed. Never raises: a descriptor that closes or changes while
    it is looked at is skipped (at worst a fresh socket gets the kernel's default)."""
    try:
        fds = os.listdir(_FD_DIR)
    except OSError:
        return 0  # no /proc: not Linux
    changed = 0
    for name in fds:
        try:
            if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                continue
            changed += _relax(int(name))
        except (OSError, ValueError):
            continue
    return changed


def _relax(fd: int) -> int:
    sock = socket.socket(fileno=fd)  # borrows the descriptor: detached below, never closed
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                  socket.AF_INET6):
            return 0
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8) != ZENOH_LINGER:
            return 0
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _OFF)
        return 1
    finally:
        sock.detach()
