"""Fixtures shared by several test modules (helpers that are not fixtures live in helpers.py),
and the rules that let the suite run in parallel under pytest-xdist.

A module that defines a fixture of the same name keeps its own: pytest prefers the closer one.

Running in parallel (``make test`` runs ``pytest -n 6 --dist loadgroup``):

* Every test gets its own ports (``services.free_port``), key prefixes and table names (random),
  and temporary directories (``tmp_path``), so tests on different workers never share state.
* ``@pytest.mark.solo``: the test needs the machine to itself within this run (a timing bound
  or a statistic that load shifts). It runs while no other test of the run does; the other
  workers wait (see :class:`RunLock`). The solo tests are handed out first and run as the
  run's first phase: no other test starts before they all ended. Outside xdist it changes
  nothing.
* ``@pytest.mark.resource("name")``: the test holds something the whole machine has only one of
  (a fixed port, a fixed subnet, a shared install): it runs under an exclusive lock on
  ``name``, across workers and across concurrent test runs on the machine.
* ``@pytest.mark.xdist_group("name")``: tests that should share one worker (sequentially), e.g.
  the real-browser tests, so that only one Chromium and Voila run at a time.
* ``@pytest.mark.fast`` (usually ``pytestmark`` on a module): the test belongs to ``make check``
  (``pytest -m fast``): no real process, browser, kernel, server or Zenoh session. A fast test
  that starts a process or opens a Zenoh session or a TCP connection fails (see
  :func:`_fast_guard`); ``@pytest.mark.fast(False)`` takes one test of a fast module out.
  Unmarked tests run only in the full suite: a new module is not in ``make check`` until it
  says so.

The locks are taken in ``pytest_runtest_protocol``, outside the test's own timeout and outside
its reported duration.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from istos.transport.local import LocalMesh

# Machine-wide named locks (``resource`` marker): shared by every test run on this machine.
RESOURCE_LOCK_DIR = Path(tempfile.gettempdir()) / "istos-test-locks"


@pytest.fixture
def mesh() -> LocalMesh:
    """A fresh in-process mesh: reliable, next-loop-turn delivery, nothing shared with others."""
    return LocalMesh()


# -- parallel runs: the run-wide solo lock and machine-wide resource locks ---------------------


def _run_lock_dir() -> Path | None:
    """The directory this xdist run's workers share (None when not under xdist)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return None
    return Path(tempfile.gettempdir()) / f"istos-pytest-{uid}"


class RunLock:
    """A fair readers-writer lock over ``flock`` shared by the workers of one run.

    Every test holds ``rw`` shared; a ``solo`` test holds it exclusively. To keep a solo test
    from starving while the other workers keep starting tests, everyone passes a turnstile
    (``gate``, exclusive) first: a solo test keeps the gate until it has ``rw``, so no new
    test starts meanwhile and the running ones drain.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._gate = open(directory / "gate.lock", "a+b")  # noqa: SIM115 - held for the run
        self._rw = open(directory / "rw.lock", "a+b")  # noqa: SIM115

    def acquire(self, solo: bool) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._rw, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def release(self) -> None:
        fcntl.flock(self._rw, fcntl.LOCK_UN)


_run_lock: RunLock | None = None


def _resource_locks(item: pytest.Item) -> list[IO[bytes]]:
    """Take the item's ``resource`` locks (sorted by name: one order for everyone)."""
    names = sorted({str(arg) for mark in item.iter_markers("resource") for arg in mark.args})
    if names:
        RESOURCE_LOCK_DIR.mkdir(parents=True, exist_ok=True)
        with_mode = RESOURCE_LOCK_DIR.stat().st_mode | 0o1777
        try:  # other users' runs take these locks too
            RESOURCE_LOCK_DIR.chmod(with_mode)
        except OSError:
            pass
    held = []
    for name in names:
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise pytest.UsageError(f"resource name {name!r}: letters, digits, '-', '_', '.'")
        handle = open(RESOURCE_LOCK_DIR / f"{name}.lock", "a+b")  # noqa: SIM115
        fcntl.flock(handle, fcntl.LOCK_EX)
        held.append(handle)
    return held


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _run_lock
    solo = item.get_closest_marker("solo") is not None
    directory = _run_lock_dir()
    if directory is not None and not solo:
        _wait_for_the_solo_phase(item.session, directory)
    held = _resource_locks(item)
    if directory is not None and _run_lock is None:
        _run_lock = RunLock(directory)
    if _run_lock is not None:
        _run_lock.acquire(solo=solo)
    try:
        yield
    finally:
        if _run_lock is not None:
            _run_lock.release()
        for handle in held:
            handle.close()  # closing the last descriptor releases the flock
        if directory is not None and solo:
            _solo_done(directory, item.nodeid).touch()


# -- the solo phase: every solo test of the run before any other test -------------------------

SOLO_PHASE_BOUND_S = 600.0  # a worker that died inside a solo test never says it is done
_solo_nodeids: list[str] | None = None


def _solo_done(directory: Path, nodeid: str) -> Path:
    return directory / f"solo-{hashlib.sha1(nodeid.encode()).hexdigest()[:16]}.done"


def _wait_for_the_solo_phase(session: pytest.Session, directory: Path) -> None:
    """Hold a test that is not solo until every solo test of the run has ended (each leaves a
    file in the run's directory). The schedule hands solo tests out first, but with fewer
    solo tests than workers a worker's first test would start beside them, and each solo test
    would wait for it to end (and the other workers with it): a long first test, such as the
    Binder build, kept three workers idle for a minute."""
    global _solo_nodeids
    if _solo_nodeids is None:
        _solo_nodeids = [i.nodeid for i in session.items if i.get_closest_marker("solo")]
    deadline = time.monotonic() + SOLO_PHASE_BOUND_S
    while _solo_nodeids:
        if time.monotonic() > deadline or all(
                _solo_done(directory, nodeid).exists() for nodeid in _solo_nodeids):
            _solo_nodeids = []  # over (or given up on): no test waits again
            return
        time.sleep(0.1)  # files other workers write: there is no event to wait on


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers `xdist_group` only when it is loaded: without it (`-p no:xdist`,
    # `make test PYTEST_WORKERS=0`) --strict-markers would reject the browser tests' group.
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker, in turn")
    config.pluginmanager.register(_GroupCheck(), "istos-xdist-group-check")
    # xdist would hand out groups by size, largest first; the order of _run_order is the plan.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # The controller names the run (xdist hands the name to its workers as
    # PYTEST_XDIST_TESTRUNUID), so that it can remove the run's lock directory at the end.
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", 0) is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The controller (not a worker) removes the run's lock directory once the workers are done.
    uid = getattr(session.config.option, "testrunuid", None)
    if uid and not hasattr(session.config, "workerinput"):
        shutil.rmtree(Path(tempfile.gettempdir()) / f"istos-pytest-{uid}", ignore_errors=True)


# -- the fast selection: no processes, sessions or connections ----------------------------------


def is_fast(item: pytest.Item) -> bool:
    """Marked ``fast`` (on the test, its class or its module) and not ``fast(False)`` closer."""
    mark = item.get_closest_marker("fast")
    return mark is not None and mark.args[:1] != (False,)


# Tests that use one of these fixtures share an xdist group (one worker, one after another).
GROUPED_FIXTURES = {"browser": "browser"}  # Chromium and Voila: one at a time is plenty


def _run_order(item: pytest.Item) -> int:
    """Solo tests first, then slow ones and groups, then the rest (a stable sort keeps each
    kind in collection order). xdist hands tests out in this order (pytest_configure turns off
    its own reordering by group size):

    * a solo test waits until every running test has ended, and the other workers idle
      meanwhile. When every worker's first tests are solo ones, nothing else is running yet,
      so the solo tests run back to back at the start and that wait costs nothing; in the
      middle of the run it lasts as long as the longest test running beside it.
    * a long test (or a group, which one worker runs whole) handed out last is the run's
      tail, with the other workers idle: started early, it runs beside the many short tests.
    """
    if item.get_closest_marker("solo") is not None:
        return 0
    long = item.get_closest_marker("slow") or item.get_closest_marker("xdist_group")
    return 1 if long is not None else 2


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in GROUPED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_run_order)  # stable: modules and their fixtures stay together
    # `-m fast` selects by the marker's presence; a test marked `fast(False)` inside a fast
    # module or class (it starts a process, say) is left out here.
    if (config.option.markexpr or "").strip() != "fast":
        return
    out = [item for item in items if item.get_closest_marker("fast") and not is_fast(item)]
    if out:
        config.hook.pytest_deselected(items=out)
        dropped = set(out)
        items[:] = [item for item in items if item not in dropped]


class _GroupCheck:
    """Under ``--dist loadgroup`` xdist appends ``@group`` to the node id of each test marked
    ``xdist_group``, and that suffix is all its scheduler reads. A pytest that keeps node ids
    where xdist does not write them (pytest 9.2 with xdist 3.8) leaves the groups silently
    ignored: the browser tests would run side by side. Those tests fail instead, saying why."""

    def __init__(self) -> None:
        self.lost: set[pytest.Item] = set()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if getattr(config.option, "loadgroup", False):
            self.lost = {item for item in items
                         if item.get_closest_marker("xdist_group") and "@" not in item.nodeid}

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item in self.lost:
            pytest.fail("pytest-xdist ignored this test's xdist_group (it runs beside the "
                        "rest of its group): this pytest and pytest-xdist do not work "
                        "together; install the dev extra (pyproject.toml pins pytest)",
                        pytrace=False)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m fast`` (``make check``), a test module that never says ``mark.fast`` holds
    no fast test: skip importing it (most of the collection's time is the imports of the
    modules that start processes, browsers and kernels)."""
    if (config.option.markexpr or "").strip() != "fast":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if "mark.fast" not in collection_path.read_text(encoding="utf-8", errors="replace"):
            return True
    return None


class FastTestLeak(AssertionError):
    """A test marked ``fast`` reached for a real process, Zenoh session or TCP connection."""


@pytest.fixture(autouse=True)
def _fast_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a ``fast`` test, make starting a process, opening a Zenoh session or connecting a
    TCP socket fail loudly, so the ``make check`` selection stays what it claims to be."""
    if not is_fast(request.node):
        return
    name = request.node.nodeid

    def refuse(what: str) -> Any:
        def _refused(*args: Any, **kwargs: Any) -> Any:
            raise FastTestLeak(f"{name} is marked fast but {what}; drop its `fast` mark")
        return _refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("opens a TCP connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("opens a TCP connection"))
    try:
        import zenoh
    except ImportError:  # pragma: no cover - zenoh is a dependency of the engine
        return
    monkeypatch.setattr(zenoh, "open", refuse("opens a Zenoh session"))
