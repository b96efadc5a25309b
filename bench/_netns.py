"""A network namespace joined to the host by a veth pair, for partition benchmarks (root only).

``veth_namespace(tag)`` creates ``istos-<tag>-<pid>`` with the veth's far end inside it and
yields (namespace, host interface, host address, namespace address); on exit it deletes only
what it created. ``ip link set <host interface> down`` is a full partition: no FIN, no RST.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True)


@contextmanager
def veth_namespace(tag: str, subnet: int) -> Iterator[tuple[str, str, str, str]]:
    pid = os.getpid() % 100000
    ns, host_if, ns_if = f"istos-{tag}-{os.getpid()}", f"v{tag[:2]}{pid}h", f"v{tag[:2]}{pid}n"
    host_ip, ns_ip = f"10.224.{subnet}.1", f"10.224.{subnet}.2"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/24", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/24", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def gaps(ok: list[float], got: list[tuple[float, str]], over_s: float = 0.5
         ) -> tuple[float, list[str]]:
    """The longest stretch between ok answers (sorted send times), and a line for each one
    over ``over_s`` saying what the requests sent meanwhile got."""
    from collections import Counter

    longest, out = 0.0, []
    for prev, nxt in zip(ok, ok[1:]):
        if nxt - prev > over_s:
            errors = Counter(w for t, w in got if prev < t < nxt)
            out.append(f"  no answer from {prev:.1f} to {nxt:.1f} s ({nxt - prev:.1f} s): "
                       f"{dict(errors.most_common(3)) or 'nothing'}")
        longest = max(longest, nxt - prev)
    return longest, out
