"""Find the external services some tests need, or skip (locally) / fail (in CI) with the fix.

Locally a missing service is a skip whose message says how to start it; with ``CI=true`` it is a
failure, because CI is where those tests must actually run.
"""

from __future__ import annotations

import fcntl
import functools
import os
import random
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

import pytest

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
POSTGRES_HOST, POSTGRES_PORT = "127.0.0.1", 5432

# The local cluster trusts TCP connections from 127.0.0.1, and the `postgres` superuser exists
# on any stock install (`root` works here too, but not on CI images).
POSTGRES_URL = f"postgresql+asyncpg://postgres@{POSTGRES_HOST}:{POSTGRES_PORT}/test"


def reachable(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if a TCP connection to ``host:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _missing(name: str, where: str, how: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is required in CI but {where} is unreachable")
    pytest.skip(f"{name} not reachable on {where}; start it with: {how}")


def redis_url() -> str:
    """URL of the local Redis; skips or fails the calling test if it is down."""
    if not reachable(REDIS_HOST, REDIS_PORT):
        _missing(
            "Redis",
            f"{REDIS_HOST}:{REDIS_PORT}",
            f"redis-server --daemonize yes --port {REDIS_PORT}",
        )
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


def postgres_url() -> str:
    """SQLAlchemy URL of the local PostgreSQL ``test`` database; skips or fails if it is down."""
    if not reachable(POSTGRES_HOST, POSTGRES_PORT):
        _missing(
            "PostgreSQL",
            f"{POSTGRES_HOST}:{POSTGRES_PORT}",
            "pg_ctlcluster <version> main start (database `test`, trust auth for 127.0.0.1, "
            f"url {POSTGRES_URL})",
        )
    return POSTGRES_URL


# Ports this process holds (each with its lock file open): see free_port.
_HELD: dict[int, IO[str]] = {}
_PORT_LOCKS = Path(tempfile.gettempdir()) / "istos-test-ports"


@functools.cache
def _below_ephemeral() -> tuple[int, int]:
    """The ports below the OS's ephemeral range (from 10000): the OS never gives one of them
    to an outgoing connection."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10000, max(low, 10001)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free, that no other test process on the machine holds,
    and that no outgoing connection can take.

    It lies below the OS's ephemeral range, so a test that kills a listener and starts it
    again on the same port (the chaos tests' fixed-port meshes) never finds the port taken by
    some connection's local end in between; and it stays this process's for its life (a lock
    file in the temporary directory), so no other xdist worker or concurrent run hands it out.
    """
    low, high = _below_ephemeral()
    _PORT_LOCKS.mkdir(exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(low, high)
        if port in _HELD:
            continue
        lock = open(_PORT_LOCKS / str(port), "a")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # bound by something else on the machine
                fcntl.flock(lock, fcntl.LOCK_UN)
                lock.close()
                continue
        _HELD[port] = lock
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {low}-{high - 1} in 1000 tries")


def redis_server_binary() -> str:
    """Path of redis-server for throwaway servers; skips locally / fails in CI when absent."""
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("redis-server binary is required in CI")
        pytest.skip("redis-server binary not on PATH")
    return binary


def redis_answers(port: int, timeout_s: float = 0.2) -> bool:
    """True if a redis-server on ``port`` answers PING with PONG: it listens *and* has
    loaded its data (while it loads an append-only file it already accepts connections, but
    answers -LOADING, and a file it cannot load ends it after that)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_throwaway_redis(port: int, data_dir: str | None = None) -> subprocess.Popen[bytes]:
    """Start a private redis-server on ``port`` and wait until it answers (data loaded).

    No persistence, unless ``data_dir`` is given: then it keeps an append-only file there with
    ``appendfsync always``, so a SIGKILLed server restarted on the same dir has every write,
    and its log (``redis.log``, appended to by each start).
    """
    persist = ["--appendonly", "no"] if data_dir is None else [
        "--appendonly", "yes", "--appendfsync", "always", "--dir", data_dir,
        "--logfile", os.path.join(data_dir, "redis.log")]
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         *persist, "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10.0
    while not redis_answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            log = "" if data_dir is None else "; its log ends:\n" + redis_log_tail(data_dir)
            pytest.fail(f"throwaway redis-server did not start on port {port} (exit "
                        f"{proc.returncode}){log}")
        time.sleep(0.02)  # polling a TCP port: there is no event to wait on
    return proc


def redis_log_tail(data_dir: str, lines: int = 40) -> str:
    """The end of the log a data-keeping :func:`start_throwaway_redis` server writes in
    ``data_dir`` (every start appends to it); empty if there is none."""
    try:
        with open(os.path.join(data_dir, "redis.log"), encoding="utf-8",
                  errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


async def drop_postgres_table(url: str, table: str) -> None:
    """Drop a test's table through the plugin (its own engine, opened and disposed here)."""
    from istos import SQLAlchemyStoragePlugin

    storage = SQLAlchemyStoragePlugin(url, table=table)
    try:
        await storage.drop_table()
    finally:
        await storage.close()


_PG_TEMPLATE: dict[str, str] = {}  # this process's initdb result, copied for each cluster


def _pg_template(initdb: str, user: str | None) -> str:
    """A data directory made by ``initdb`` once per process (an xdist worker), never started:
    each :class:`PrivatePostgres` starts from a copy of it, which takes a tenth of an initdb."""
    if "data" not in _PG_TEMPLATE:
        import atexit
        import shutil
        import tempfile

        base = tempfile.mkdtemp(prefix="istos-pg-template-", dir="/tmp")
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        data = os.path.join(base, "data")
        subprocess.run([initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
                       check=True, user=user, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
        _PG_TEMPLATE["data"] = data
    return _PG_TEMPLATE["data"]


class PrivatePostgres:
    """A PostgreSQL cluster of this test's own (a fresh copy of an initdb'd data directory in a
    temp dir, a free port, fsync on), run as the ``postgres`` OS user when the test runs as
    root. ``kill()`` SIGKILLs the postmaster's whole process group (only what this object
    started); ``start()`` again runs crash recovery on the same data directory."""

    def __init__(self) -> None:
        import shutil
        import tempfile

        self.initdb = shutil.which("initdb") or "/usr/local/bin/initdb"
        self.postgres = shutil.which("postgres") or "/usr/local/bin/postgres"
        if not os.path.exists(self.initdb) or not os.path.exists(self.postgres):
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail("initdb/postgres binaries are required in CI")
            pytest.skip("initdb/postgres binaries not found")
        self.dir = tempfile.mkdtemp(prefix="istos-pg-", dir="/tmp")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            import pwd

            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._user = "postgres"
        # cp -a keeps the owner and the 0700 mode postgres insists on.
        subprocess.run(["cp", "-a", _pg_template(self.initdb, self._user), self.data],
                       check=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.postgres, "-D", self.data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "max_connections=50"],
            user=self._user, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        isready = os.path.join(os.path.dirname(os.path.realpath(self.postgres)), "pg_isready")
        deadline = time.monotonic() + 60.0
        while subprocess.run([isready, "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                             check=False).returncode != 0:  # accepting, recovery done
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"private postgres did not start on port {self.port}")
            time.sleep(0.05)  # polling the server: there is no event to wait on

    def kill(self) -> None:
        import signal

        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only ours
            except ProcessLookupError:
                pass
            self.proc.wait(10)
            self.proc = None

    def remove(self) -> None:
        import shutil

        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
