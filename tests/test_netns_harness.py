"""The partition harness (``bench/_netns.py``) keeps every packet on this machine: while a
namespace is cut the host has no route to it at all (not the default route), the namespace has
no default route either, and on exit the namespace, its veth and its route are gone. Needs root
and iproute2; skipped otherwise."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._netns import NetnsError, Veth, second_link, veth_namespace  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 for a network namespace")

UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH}


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def udp_send_error(dest: str) -> int | None:
    """The errno a UDP connect + send to ``dest`` fails with, or None if the kernel took it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((dest, 9))  # discard; nothing listens, and nothing may be sent
            sock.send(b"x")
        except OSError as exc:
            return exc.errno
    return None


def test_a_cut_namespace_is_unreachable_and_nothing_goes_by_the_default_route():
    with veth_namespace("harness") as veth:
        assert f"dev {veth.host_if}" in ip("route", "get", veth.ns_ip)
        assert "default" not in ip("-n", veth.ns, "route", "show")
        veth.cut()
        said = ip("route", "get", veth.ns_ip)
        assert "No route to host" in said and " via " not in said, said
        assert udp_send_error(veth.ns_ip) in UNREACHABLE
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            with pytest.raises(OSError) as refused:
                sock.connect((veth.ns_ip, 9))
            assert refused.value.errno in UNREACHABLE
        veth.heal()
        assert f"dev {veth.host_if}" in ip("route", "get", veth.ns_ip)
    assert veth.ns not in ip("netns", "list")
    assert veth.host_if not in ip("link", "show")
    assert ip("route", "show", "root", veth.subnet).strip() == ""


def test_two_namespaces_at_once_get_distinct_subnets_and_names():
    with veth_namespace("harness") as one, veth_namespace("harness") as two:
        assert one.subnet != two.subnet and one.ns != two.ns and one.host_if != two.host_if
        one.cut()  # cutting one leaves the other reachable
        assert f"dev {two.host_if}" in ip("route", "get", two.ns_ip)


def test_a_second_link_stays_up_while_the_first_is_cut_and_both_are_removed():
    with veth_namespace("harness") as first, second_link(first) as second:
        assert second.ns == first.ns and second.subnet != first.subnet
        assert "default" not in ip("-n", first.ns, "route", "show")
        first.cut()
        assert f"dev {second.host_if}" in ip("route", "get", second.ns_ip)
        assert udp_send_error(first.ns_ip) in UNREACHABLE
    assert ip("route", "show", "root", second.subnet).strip() == ""
    assert second.host_if not in ip("link", "show")


def test_cut_raises_when_the_host_would_route_the_namespace_elsewhere():
    with veth_namespace("harness") as veth:
        ip("route", "del", "unreachable", veth.subnet, "metric", "1000")
        try:
            # A route towards loopback stands in for a default route: the check must refuse
            # any answer other than "no route", and nothing here may leave the machine.
            subprocess.run(["ip", "route", "add", veth.subnet, "dev", "lo", "metric", "2000"],
                           check=True)
            with pytest.raises(NetnsError, match="could leave the machine"):
                veth.cut()
        finally:
            ip("route", "del", veth.subnet, "dev", "lo", "metric", "2000")
            ip("route", "add", "unreachable", veth.subnet, "metric", "1000")
    assert isinstance(veth, Veth)
