"""The live Zenoh adapter of the Transport port, on real sessions over loopback.

Every mesh here is private (``isolated_configs``) except in the default-config tests, which use
keys under a unique prefix so other peers on the host cannot interfere.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zenoh
from zenoh_util import (
    close_all,
    isolated_configs,
    open_transports,
    query_when_served,
    unique_prefix,
    wait_until,
)

import istos.transport.zenoh as zmod
from istos.errors import ConfigError
from istos.transport.base import NoResponder, Transport, TransportError, TransportTimeout
from istos.transport.zenoh import ZenohTransport

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def pair() -> AsyncIterator[list[ZenohTransport]]:
    transports = await open_transports(2)
    yield transports
    await close_all(transports)


@pytest.fixture
async def trio() -> AsyncIterator[list[ZenohTransport]]:
    transports = await open_transports(3)
    yield transports
    await close_all(transports)


def test_implements_the_transport_protocol() -> None:
    assert isinstance(ZenohTransport(node_id="x"), Transport)


# ---------------------------------------------------------------------- query / reply
async def test_query_round_trip_runs_handler_on_the_loop(pair: list[ZenohTransport]) -> None:
    server, client = pair
    key = f"{unique_prefix()}/echo"
    seen: list[tuple[str, bytes, int]] = []

    async def handler(k: str, data: bytes) -> bytes:
        seen.append((k, data, threading.get_ident()))
        return b"echo:" + data

    await server.declare_queryable(key, handler)
    assert await query_when_served(client, key, b"hello") == b"echo:hello"
    assert await client.query(key, b"again", 2.0) == b"echo:again"
    assert [(k, d) for k, d, _ in seen][-1] == (key, b"again")
    assert {tid for _, _, tid in seen} == {threading.get_ident()}


async def test_200_concurrent_queries_are_all_in_flight_and_answered(
    pair: list[ZenohTransport],
) -> None:
    server, client = pair
    key = f"{unique_prefix()}/many"
    n = 200
    arrived = 0
    all_arrived = asyncio.Event()

    async def handler(_: str, data: bytes) -> bytes:
        nonlocal arrived
        if data == b"ping":
            return b"pong"
        # Hold every reply until all n requests are in the handler: this passes only if the
        # client really has n queries in flight at once (a thread per query would cap it).
        arrived += 1
        if arrived == n:
            all_arrived.set()
        await all_arrived.wait()
        return b"r:" + data

    await server.declare_queryable(key, handler)
    await query_when_served(client, key, b"ping")
    payloads = [f"q{i}".encode() for i in range(n)]
    replies = await asyncio.wait_for(
        asyncio.gather(*(client.query(key, p, 10.0) for p in payloads)), 15.0
    )
    assert replies == [b"r:" + p for p in payloads]


async def test_no_responder_is_reported_quickly(pair: list[ZenohTransport]) -> None:
    _, client = pair
    with pytest.raises(NoResponder):
        # A 10 s query timeout bounded at 5 s: NoResponder must not wait for the timeout.
        await asyncio.wait_for(client.query(f"{unique_prefix()}/nobody", b"x", 10.0), 5.0)


async def test_closed_queryable_stops_serving(pair: list[ZenohTransport]) -> None:
    server, client = pair
    key = f"{unique_prefix()}/closing"

    async def handler(_: str, data: bytes) -> bytes:
        return data

    handle = await server.declare_queryable(key, handler)
    assert await query_when_served(client, key, b"x") == b"x"
    handle.close()
    handle.close()

    async def unserved() -> bool:
        try:
            await client.query(key, b"x", 1.0)
        except NoResponder:
            return True
        return False

    await wait_until(unserved, what="queryable undeclared")


async def test_slow_handler_raises_transport_timeout(pair: list[ZenohTransport]) -> None:
    server, client = pair
    key = f"{unique_prefix()}/slow"
    never = asyncio.Event()
    started = asyncio.Event()

    async def handler(_: str, data: bytes) -> bytes:
        if data == b"ping":
            return b"pong"
        started.set()
        await never.wait()
        return b"too late"

    await server.declare_queryable(key, handler)
    assert await query_when_served(client, key, b"ping") == b"pong"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TransportTimeout):
        await asyncio.wait_for(client.query(key, b"slow", 0.3), 5.0)
    assert started.is_set()
    assert loop.time() - t0 >= 0.3


async def test_handler_exception_becomes_error_reply(pair: list[ZenohTransport]) -> None:
    server, client = pair
    key = f"{unique_prefix()}/fails"

    async def handler(_: str, data: bytes) -> bytes:
        if data == b"boom":
            raise ValueError("bad thing 42")
        return b"fine"

    await server.declare_queryable(key, handler)
    assert await query_when_served(client, key, b"ok") == b"fine"
    with pytest.raises(TransportError, match="bad thing 42") as info:
        await client.query(key, b"boom", 2.0)
    assert type(info.value) is TransportError
    assert await client.query(key, b"ok", 2.0) == b"fine"  # the queryable keeps serving


async def test_handler_returning_non_bytes_becomes_error_reply(
    pair: list[ZenohTransport],
) -> None:
    server, client = pair
    key = f"{unique_prefix()}/none"

    async def handler(_: str, data: bytes) -> bytes:
        return None if data == b"none" else data  # type: ignore[return-value]

    await server.declare_queryable(key, handler)
    assert await query_when_served(client, key, b"ok") == b"ok"
    with pytest.raises(TransportError, match="reply failed"):
        await client.query(key, b"none", 2.0)


# ---------------------------------------------------------------------- pub / sub
async def test_put_fans_out_to_two_subscribers_in_order(trio: list[ZenohTransport]) -> None:
    sub_a, publisher, sub_c = trio
    prefix = unique_prefix()
    got: dict[str, list[tuple[str, bytes, int]]] = {"a": [], "c": []}
    for name, transport in (("a", sub_a), ("c", sub_c)):
        sink = got[name]
        await transport.declare_subscriber(
            f"{prefix}/ps/*", lambda k, v, sink=sink: sink.append((k, v, threading.get_ident()))
        )

    async def both_hear_a_probe() -> bool:
        # Subscriptions reach the publisher asynchronously; probe until both routes exist.
        await publisher.put(f"{prefix}/ps/probe", b"probe")
        return all(any(k.endswith("/probe") for k, _, _ in sink) for sink in got.values())

    await wait_until(both_hear_a_probe, what="subscriptions routed")
    await publisher.put(f"{prefix}/other/data", b"not for them")
    sent = [str(i).encode() for i in range(50)]
    for payload in sent:
        await publisher.put(f"{prefix}/ps/data", payload)

    def data(sink: list[tuple[str, bytes, int]]) -> list[bytes]:
        return [v for k, v, _ in sink if k == f"{prefix}/ps/data"]

    await wait_until(lambda: all(len(data(s)) == len(sent) for s in got.values()))
    for sink in got.values():
        assert data(sink) == sent
        assert all(k.startswith(f"{prefix}/ps/") for k, _, _ in sink)
        assert {tid for _, _, tid in sink} == {threading.get_ident()}


async def test_closed_subscriber_is_not_called_again(pair: list[ZenohTransport]) -> None:
    subscriber, publisher = pair
    key = f"{unique_prefix()}/sub"
    first: list[bytes] = []
    second: list[bytes] = []
    handle = await subscriber.declare_subscriber(key, lambda _, v: first.append(v))
    await subscriber.declare_subscriber(key, lambda _, v: second.append(v))

    async def both_hear() -> bool:
        await publisher.put(key, b"probe")
        return bool(first) and bool(second)

    await wait_until(both_hear)
    handle.close()
    handle.close()
    assert handle.closed
    before = len(first)
    for _ in range(20):
        await publisher.put(key, b"after")
    await wait_until(lambda: second.count(b"after") == 20)
    assert len(first) == before


async def test_publisher_cache_eviction_keeps_delivering(
    pair: list[ZenohTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two cached publishers for five keys: puts go through first-use, promotion and eviction.
    monkeypatch.setattr(zmod, "_PUBLISHERS_MAX", 2)
    subscriber, publisher = pair
    prefix = unique_prefix()
    got: list[tuple[str, bytes]] = []
    await subscriber.declare_subscriber(f"{prefix}/**", lambda k, v: got.append((k, v)))

    async def routed() -> bool:
        await publisher.put(f"{prefix}/probe", b"")
        return bool(got)

    await wait_until(routed)
    expected = [(f"{prefix}/k{i}", str(r).encode()) for r in range(3) for i in range(5)]
    for key, payload in expected:
        await publisher.put(key, payload)
    await wait_until(lambda: len([g for g in got if "/k" in g[0]]) == len(expected))
    assert [g for g in got if "/k" in g[0]] == expected


async def test_querier_cache_answers_across_steps_eviction_and_absence(
    pair: list[ZenohTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys asked again go through declared queriers (one per timeout step, two kept here):
    every query gets its own answer whatever path it took, a timeout past the last step goes
    through Session.get, and a key nobody serves any more answers NoResponder quickly."""
    monkeypatch.setattr(zmod, "_QUERIERS_MAX", 2)
    server, client = pair
    prefix = unique_prefix()

    async def echo(key: str, data: bytes) -> bytes:
        return key.encode() + b"|" + data

    handle = await server.declare_queryable(f"{prefix}/**", echo)
    first = await query_when_served(client, f"{prefix}/k0", b"probe")
    assert first == f"{prefix}/k0|probe".encode()
    for r, timeout_s in enumerate((0.4, 4.0, 1000.0, 4.0)):
        for i in range(5):
            key = f"{prefix}/k{i}"
            payload = f"{r}-{i}".encode()
            assert await client.query(key, payload, timeout_s) == key.encode() + b"|" + payload
    assert 0 < len(client._queriers._queriers) <= 2  # declared, and the LRU bound held
    handle.close()

    async def unserved() -> bool:
        try:
            await asyncio.wait_for(client.query(f"{prefix}/k4", b"x", 10.0), 5.0)
        except NoResponder:
            return True
        return False

    await wait_until(unserved, what="a querier's query to an unserved key ends NoResponder")
    client.use_queriers = False  # the Session.get path of the same transport still works
    with pytest.raises(NoResponder):
        await asyncio.wait_for(client.query(f"{prefix}/k4", b"x", 10.0), 5.0)


# ---------------------------------------------------------------------- liveliness
async def test_liveliness_tokens_appear_and_drop(trio: list[ZenohTransport]) -> None:
    node_a, watcher, node_c = trio
    prefix = unique_prefix()
    events: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()

    async def next_event() -> tuple[str, bool]:
        return await asyncio.wait_for(events.get(), 5.0)

    token_a = await node_a.declare_liveliness_token(f"{prefix}/lv/a")
    await watcher.watch_liveliness(
        f"{prefix}/lv/**", lambda k, alive: events.put_nowait((k, alive))
    )
    assert await next_event() == (f"{prefix}/lv/a", True)
    await node_c.declare_liveliness_token(f"{prefix}/lv/c")
    assert await next_event() == (f"{prefix}/lv/c", True)

    async def alive_is(expected: list[str]) -> None:
        async def check() -> bool:
            return await watcher.liveliness_alive(f"{prefix}/lv/**", 1.0) == expected

        await wait_until(check, what=f"alive == {expected}")

    await alive_is([f"{prefix}/lv/a", f"{prefix}/lv/c"])
    token_a.close()  # closing the handle drops the token
    token_a.close()
    assert await next_event() == (f"{prefix}/lv/a", False)
    await alive_is([f"{prefix}/lv/c"])
    await node_c.close()  # so does closing the session
    assert await next_event() == (f"{prefix}/lv/c", False)
    await alive_is([])
    assert events.empty()


# ---------------------------------------------------------------------- configuration
def _config_form(form: str, cfg: dict, tmp_path: Path) -> object:
    if form == "dict":
        return cfg
    if form == "zenoh.Config":
        return zenoh.Config.from_json5(json.dumps(cfg))
    # A comment and a trailing comma: valid JSON5, invalid JSON.
    text = "// written by the test\n{" + json.dumps(cfg)[1:-1] + ",}\n"
    if form == "json5 text":
        return text
    path = tmp_path / "zenoh.json5"
    path.write_text(text)
    return str(path) if form == "path str" else path


@pytest.mark.parametrize("form", ["dict", "zenoh.Config", "json5 text", "path str", "Path"])
async def test_config_forms_are_accepted(form: str, tmp_path: Path) -> None:
    cfg_server, cfg_client = isolated_configs(2)
    server = ZenohTransport(_config_form(form, cfg_server, tmp_path), node_id="server")
    client = ZenohTransport(cfg_client, node_id="client")
    try:
        await server.start()
        await client.start()

        async def handler(_: str, data: bytes) -> bytes:
            return data[::-1]

        await server.declare_queryable("cfg/test", handler)
        assert await query_when_served(client, "cfg/test", b"abc") == b"cba"
    finally:
        await close_all([server, client])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mode": "banana"}, "banana"),
        ({"no_such_option": 1}, "no_such_option"),
        ({"mode": object()}, "JSON-serialisable"),
        (42, "not int"),
        ("/nonexistent/istos/zenoh.json5", "not found"),
        ("{ mode: ", "invalid zenoh config"),
    ],
)
def test_bad_config_raises_config_error(config: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        ZenohTransport(config, node_id="bad")
    assert isinstance(info.value, ValueError)


async def test_unparseable_config_file_raises_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json5"
    path.write_text("{ mode: 'peer', ")
    with pytest.raises(ConfigError, match="invalid zenoh config"):
        ZenohTransport(path, node_id="bad")


async def test_endpoint_rejected_at_open_raises_config_error() -> None:
    transport = ZenohTransport({"listen": {"endpoints": ["tcp/not-an-address"]}}, node_id="bad")
    with pytest.raises(ConfigError, match="could not open"):
        await transport.start()
    await transport.close()


async def test_client_with_no_router_to_reach_gets_mesh_unreachable() -> None:
    from services import free_port

    from istos import MeshUnreachable

    config = {"mode": "client", "connect": {"endpoints": [f"tcp/127.0.0.1:{free_port()}"]},
              "scouting": {"multicast": {"enabled": False}}}
    transport = ZenohTransport(config, node_id="lonely")
    with pytest.raises(MeshUnreachable, match="reached no Zenoh router") as info:
        await transport.start()
    assert isinstance(info.value, ConfigError)  # what callers caught before it had a name
    await transport.close()


async def test_default_config_opens_and_closes_idempotently() -> None:
    transport = ZenohTransport(None, node_id="default")
    with pytest.raises(TransportError, match="not started"):
        await transport.put("istos-test/x", b"")
    await transport.start()
    assert isinstance(transport.peer_ids(), list)
    await transport.close()
    await transport.close()
    with pytest.raises(TransportError, match="closed"):
        await transport.query("istos-test/x", b"", 0.1)
    with pytest.raises(TransportError, match="closed"):
        await transport.start()


async def test_close_fails_in_flight_queries_and_cancels_handlers(
    pair: list[ZenohTransport],
) -> None:
    server, client = pair
    key = f"{unique_prefix()}/hang"
    cancelled = asyncio.Event()

    async def handler(_: str, data: bytes) -> bytes:
        if data == b"ping":
            return b"pong"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    await server.declare_queryable(key, handler)
    await query_when_served(client, key, b"ping")
    stuck = asyncio.ensure_future(client.query(key, b"hang", 30.0))
    await wait_until(lambda: len(server._tasks) == 1, what="handler running")
    await client.close()
    with pytest.raises(TransportError, match="closed"):
        await asyncio.wait_for(stuck, 5.0)
    await server.close()
    assert cancelled.is_set()


# ---------------------------------------------------------------------- two processes
_CHILD = """
import asyncio, sys
from istos.transport.zenoh import ZenohTransport

async def main(key):
    transport = ZenohTransport(None, node_id="child")
    await transport.start()

    async def handler(_, data):
        return b"child:" + data

    await transport.declare_queryable(key, handler)
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await transport.close()

asyncio.run(main(sys.argv[1]))
"""


async def test_processes_with_default_config_find_each_other() -> None:
    key = f"{unique_prefix()}/child"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, key,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT, env=env,
    )  # fmt: skip
    parent = ZenohTransport(None, node_id="parent")
    try:
        assert child.stdout is not None and child.stdin is not None
        line = await asyncio.wait_for(child.stdout.readline(), 15.0)
        assert line.strip() == b"READY"
        await parent.start()
        # Multicast discovery plus route propagation: retry NoResponder for up to 5 s.
        reply = await query_when_served(parent, key, b"hi", timeout_s=1.0, within_s=5.0)
        assert reply == b"child:hi"
        child.stdin.close()
        assert await asyncio.wait_for(child.wait(), 10.0) == 0
    finally:
        await parent.close()
        if child.returncode is None:
            child.kill()
            await child.wait()


def test_shared_memory_is_off_unless_the_config_mentions_it(tmp_path):
    """Zenoh's shared-memory transport kept a 16 MiB pool mapped per same-host peer session
    that had closed (an owner grew with producer churn): Istos turns it off by default, and a
    config that says anything about ``shared_memory`` keeps what it says."""
    from istos.transport._zenoh_config import to_zenoh_config

    def shm(config) -> bool:
        return json.loads(to_zenoh_config(config).get_json("transport/shared_memory/enabled"))

    assert shm(None) is False and shm({"mode": "peer"}) is False and shm("{mode: 'peer'}") is False
    assert shm({"transport": {"shared_memory": {"enabled": True}}}) is True
    path = tmp_path / "z.json5"
    path.write_text("{transport: {shared_memory: {enabled: true}}}")
    assert shm(str(path)) is True
    plain = tmp_path / "plain.json5"
    plain.write_text("{mode: 'peer'}")
    assert shm(plain) is False
    given = zenoh.Config()  # a zenoh.Config object is used exactly as given
    assert to_zenoh_config(given) is given


def test_block_messages_wait_one_second_for_a_silent_peer_unless_configured():
    """Zenoh's 5 s BLOCK wait toward a peer that went silent stalled the sender (a new HA leader
    answered nothing for seconds): Istos waits 1 s, and a config that names the option wins."""
    from istos.transport._zenoh_config import WAIT_BEFORE_CLOSE_US, to_zenoh_config

    def wait_us(config) -> int:
        return json.loads(to_zenoh_config(config).get_json(
            "transport/link/tx/queue/congestion_control/block/wait_before_close"))

    assert wait_us(None) == wait_us({"mode": "peer"}) == WAIT_BEFORE_CLOSE_US == 1_000_000
    mine = {"transport": {"link": {"tx": {"queue": {"congestion_control": {
        "block": {"wait_before_close": 250_000}}}}}}}
    assert wait_us(mine) == 250_000


def test_lost_links_are_dialled_again_at_least_every_second_unless_configured():
    """Zenoh's reconnect back-off grows to 4 s, so a healed partition stayed silent that long:
    Istos retries at least every second, and a config that names ``retry`` wins."""
    from istos.transport._zenoh_config import to_zenoh_config

    def retry(config) -> dict:
        return json.loads(to_zenoh_config(config).get_json("connect/retry"))

    assert retry(None)["period_max_ms"] == retry({"mode": "peer"})["period_max_ms"] == 1000
    assert retry({"mode": "peer"})["period_init_ms"] == 250
    mine = {"connect": {"endpoints": [], "retry": {"period_max_ms": 8000}}}
    assert retry(mine)["period_max_ms"] == 8000
