"""Suite-wide fixtures: a real drumsd on a test instance, and the leak checks.

Each test process (the process of a plain run, or each pytest-xdist worker) runs the suite's daemon
on an instance of its own, ``pytest-<pid>``, on its own block of slots (tests/support/suite.py and
slots.py). After each test that used it, no session may remain. When a process has run its tests,
its daemon is stopped, its dead ledgers swept, its state tmpfs unmounted and its instance checked
for leftovers (the ``drums_instance`` fixture); then, once per run (the xdist controller, or the
one process), the host is searched for anything any process of the run left: a leak fails the run.
Helpers live in tests/support and are imported as ``tests.support.<module>``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(REPO)]:  # this checkout, not an installed drums
    sys.path.insert(0, str(REPO))

from drums_core.config import STATE_ROOT  # noqa: E402
from drums_core.host.hoststate import instance_leaks  # noqa: E402
from tests.support.leaks import instance_links, no_leaks, run_leaks, state_files  # noqa: E402
from tests.support import cpuprofile, schedule  # noqa: E402
from tests.support.suite import BLOCK, INSTANCE, SUITE_DAEMON_ENV, require_root, stop_instance  # noqa: E402

# Whichever test first starts the suite's daemon (a Client fixture, the gym env, the OSWorld provider,
# the CLI in a subprocess) starts it with this env: the test hooks must not depend on test order.
os.environ.update(SUITE_DAEMON_ENV)


@pytest.fixture(scope="session")
def drums_instance():
    """This process's suite daemon (one per xdist worker), stopped and checked after its last test."""
    require_root()
    from drums_core.client import Client

    client = Client(INSTANCE, daemon_env=SUITE_DAEMON_ENV)
    client.ping()
    yield INSTANCE
    stop_instance(INSTANCE)
    leaked = instance_leaks(INSTANCE)
    assert no_leaks(leaked), f"Drums left resources on the host after the suite: {leaked}"


@pytest.fixture
def client(drums_instance):
    """A client of the suite's daemon; the test must leave no session behind (checked after it)."""
    from drums_core.client import Client

    c = Client(drums_instance, daemon_env=SUITE_DAEMON_ENV)
    yield c
    leftover = c.list()
    for s in leftover:
        try:
            c.destroy(s["id"])
        except Exception:  # noqa: BLE001 - cleanup of a failed test; the assertion below reports it
            pass
    assert not leftover, f"test left sessions behind: {[s['id'] for s in leftover]}"
    links = instance_links(drums_instance)
    assert not links, f"test left links behind: {links}"


def pytest_configure(config):
    cpuprofile.register(config)  # CPU-seconds per test, only with DRUMS_TEST_CPU set


# markers by where a test lives (see pyproject.toml); the unit lane needs neither root nor sessions
_MARKS_BY_DIR = {"bench": ("root", "slow"), "faults": ("root", "slow", "alone"), "osworld": ("root", "osworld"),
                 "ray": ("root", "ray")}


def pytest_collection_modifyitems(session, config, items):
    """Mark each test by its folder, and run the fast unit lane first (``pytest -m 'not root'`` runs
    it alone); the rest follow by file, the longest files first (:mod:`tests.support.schedule`: the
    desktop lane's workers then end together), each file's tests in their order; the tests of a file
    that the desktop lane hands out one by one (``schedule.SPLIT``) are ordered by their share."""
    tests_dir = Path(__file__).resolve().parent
    unit, rest = [], []
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(tests_dir)
        top = rel.parts[0] if len(rel.parts) > 1 else ""
        if top == "unit":
            unit.append(item)
            continue
        for name in _MARKS_BY_DIR.get(top, ("root",)):
            item.add_marker(name)
        rest.append(item)
    paths = [_relpath(item, tests_dir) for item in rest]
    units = [schedule.unit_of(f"{p}::{item.nodeid.split('::', 1)[-1]}") for p, item in zip(paths, rest, strict=True)]
    weights = dict(zip(units, schedule.unit_weights(paths), strict=True))
    first_seen: dict[str, int] = {}
    for i, u in enumerate(units):
        first_seen.setdefault(u, i)
    order = sorted(range(len(rest)), key=lambda i: (-weights[units[i]], first_seen[units[i]], i))
    items[:] = unit + [rest[i] for i in order]


def _relpath(item, tests_dir: Path) -> str:
    return "tests/" + Path(str(item.path)).resolve().relative_to(tests_dir).as_posix()


# The processes of this run (pid, slot block): this one, and each xdist worker as it finishes.
_RUN_PROCESSES: list[tuple[int, int]] = [(os.getpid(), BLOCK.index)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist controller: hand out whole files, or single tests of the files in ``schedule.SPLIT``."""
    return schedule.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: note which process and slots a finished worker used, for the run's check."""
    out = getattr(node, "workeroutput", None) or {}
    if "drums_process" in out:
        _RUN_PROCESSES.append(tuple(out["drums_process"]))


def pytest_sessionfinish(session, exitstatus):
    """Leave no trace of the run. A worker hands its pid and slot block to the controller; the
    controller (or the one process of a run without xdist) then searches the host once for anything
    of any process of the run (its instances' processes, mounts, tables and state-root files, the
    links and X11 links of its slots): a leftover fails the run. The state root itself goes when
    nothing else uses it."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller checks, after every worker
        workeroutput["drums_process"] = (os.getpid(), BLOCK.index)
        return
    from tests.support.slots import Block

    pids = [pid for pid, _ in _RUN_PROCESSES]
    slots = [s for _, index in _RUN_PROCESSES for s in Block(index).slots]
    # the host scan needs root (nftables, other users' processes); without root nothing ran that could leak
    leaked = run_leaks(pids, slots) if os.geteuid() == 0 else {"state_files": state_files(pids)}
    if not no_leaks(leaked):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nDrums left resources of this run's instances on the host: {leaked}", file=sys.stderr)
    try:
        STATE_ROOT.rmdir()
    except OSError:  # not empty (another instance, a leftover reported above) or already gone
        pass

