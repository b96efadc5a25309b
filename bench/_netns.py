"""A network namespace joined to the host by a veth pair, for partition benchmarks (root only).

``veth_namespace(tag)`` yields a :class:`Veth`: a namespace ``istos-<tag>-<pid>-<n>`` with the
veth's far end inside it, on a subnet ``10.224.<n>.0/24`` that no other process holds. Its
``cut()`` is a full partition (the host end goes down: no FIN, no RST) and ``heal()`` undoes it.
``second_link(veth)`` adds another veth pair into the same namespace on a subnet of its own,
so a process there can lose one path (the mesh) and keep the other (its store).

Every packet stays on this machine. Setting the host end down removes the host's connected
route to the subnet, and without more the host would send what it addresses to the namespace
(a peer's reconnect attempts, a client's retries) to the default gateway. So for as long as the
namespace exists the host holds ``unreachable 10.224.<n>.0/24 metric 1000``: while the link is
up the connected route (metric 0) wins; while it is cut the unreachable route catches
everything, and ``cut()`` checks that ``ip route get`` says so before it returns. The namespace
side has no default route at all (checked at setup). The unreachable route is also the claim
on the subnet: the kernel refuses a second identical route, so two processes (parallel test
workers) never share one. On exit only what was added is removed, the claim last.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

FIRST_SUBNET, LAST_SUBNET = 100, 254  # 10.224.<n>.0/24 for n in this range (below: older harnesses)


class NetnsError(RuntimeError):
    """The harness could not set up, cut or heal a namespace as it promised."""


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True)


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    """``ip ARGS`` with its output captured; never raises on a non-zero exit."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class Veth:
    """One namespace and its veth pair; ``exec`` prefixes a command to run inside it."""

    ns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    subnet: str

    @property
    def exec(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def route_to_ns(self) -> str:
        """What the host's routing says about the namespace's address (stdout + stderr)."""
        got = ip("route", "get", self.ns_ip)
        return (got.stdout + got.stderr).strip()

    def cut(self) -> None:
        """Set the host end down (a full partition); raises NetnsError unless the host now
        has no route to the namespace, i.e. nothing it sends there can leave the machine."""
        sh("ip", "link", "set", self.host_if, "down")
        self.assert_unreachable()

    def heal(self) -> None:
        """Set the host end up again; raises NetnsError unless the host routes the
        namespace's address over the veth again."""
        sh("ip", "link", "set", self.host_if, "up")
        said = self.route_to_ns()
        if f"dev {self.host_if}" not in said:
            raise NetnsError(f"after heal, ip route get {self.ns_ip} says {said!r}")

    def assert_unreachable(self) -> None:
        said = self.route_to_ns()
        if "No route to host" not in said and not said.startswith("unreachable"):
            raise NetnsError(f"while cut, ip route get {self.ns_ip} says {said!r}: packets "
                             f"to the namespace could leave the machine")


def _claim_subnet() -> int:
    """Add the unreachable route of a free subnet and return its number; the kernel's
    'File exists' makes the claim atomic across processes."""
    start = os.getpid() % (LAST_SUBNET - FIRST_SUBNET + 1)
    for k in range(LAST_SUBNET - FIRST_SUBNET + 1):
        n = FIRST_SUBNET + (start + k) % (LAST_SUBNET - FIRST_SUBNET + 1)
        if ip("route", "show", "root", f"10.224.{n}.0/24").stdout.strip():
            continue  # some route in this subnet already (ours from another process, or not)
        if ip("route", "add", "unreachable", f"10.224.{n}.0/24", "metric", "1000").returncode == 0:
            return n
    raise NetnsError("no free subnet in 10.224.100-254.0/24")


def _check_ns_routes(veth: Veth) -> None:
    routes = ip("-n", veth.ns, "route", "show").stdout.strip().splitlines()
    if any(not r.startswith("10.224.") or r.startswith("default") for r in routes):
        raise NetnsError(f"namespace {veth.ns} routes beyond its subnet: {routes}")


@contextmanager
def veth_namespace(tag: str) -> Iterator[Veth]:
    """Create the namespace, a veth pair into it and the subnet's unreachable route; remove
    them on exit. Raises NetnsError (or CalledProcessError) when setup fails; needs root."""
    n = _claim_subnet()
    ns = f"istos-{tag}-{os.getpid()}-{n}"
    try:
        sh("ip", "netns", "add", ns)
        try:
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            with _link(ns, n) as veth:
                yield veth
        finally:
            ip("netns", "del", ns)
    finally:
        _release_subnet(n)


@contextmanager
def second_link(first: Veth) -> Iterator[Veth]:
    """Another veth pair into ``first``'s namespace, on a subnet of its own (so one of the
    two can be cut while the other stays up); removed on exit."""
    n = _claim_subnet()
    try:
        with _link(first.ns, n) as veth:
            yield veth
    finally:
        _release_subnet(n)


@contextmanager
def _link(ns: str, n: int) -> Iterator[Veth]:
    veth = Veth(ns=ns, host_if=f"istv{n}h", ns_if=f"istv{n}n", host_ip=f"10.224.{n}.1",
                ns_ip=f"10.224.{n}.2", subnet=f"10.224.{n}.0/24")
    try:
        sh("ip", "link", "add", veth.host_if, "type", "veth", "peer", "name", veth.ns_if,
           "netns", ns)
        sh("ip", "addr", "add", f"{veth.host_ip}/24", "dev", veth.host_if)
        sh("ip", "link", "set", veth.host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{veth.ns_ip}/24", "dev", veth.ns_if)
        sh("ip", "-n", ns, "link", "set", veth.ns_if, "up")
        _check_ns_routes(veth)
        yield veth
    finally:
        ip("link", "del", veth.host_if)  # takes its peer with it


def _release_subnet(n: int) -> None:
    ip("route", "del", "unreachable", f"10.224.{n}.0/24", "metric", "1000")


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
