"""Fixtures for the OSWorld provider and snapshot-bridge tests.

The real ``desktop-env==1.0.2`` runs in its own venv (``tests/support/osworld_harness.py``), so every test
drives ``DesktopEnv`` in a subprocess of that venv, with this repository importable and the suite's
daemon instance in its environment (``DRUMS_INSTANCE`` and its slot range). Nothing of Drums or
OSWorld is mocked: real daemon, real CRIU, real guest server, OSWorld's own controllers and
evaluators. The helpers live in tests/support/osworldlib.py.

After each test: no session left (the suite's ``client`` fixture), no lease file or watchdog left,
and every snapshot the test made deleted (``init_state`` of each image is kept for the suite: it is
shared by design).
"""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


from tests.support.osworldlib import OSWorld, _venv, watchdog_pids
from tests.support.wait import WaitTimeout, wait_until


@pytest.fixture(scope="session")
def osworld_venv() -> Path:
    return _venv()


@pytest.fixture
def osworld(osworld_venv, drums_instance, client) -> Iterator[OSWorld]:
    """An OSWorld runner; afterwards nothing of the test may remain (sessions, leases, watchdogs,
    snapshots other than the shared ``init_state``)."""
    before = {s["id"] for s in client.snapshots()}
    ow = OSWorld(osworld_venv, drums_instance)
    yield ow
    with contextlib.suppress(WaitTimeout):  # reported below, after the clean-up
        wait_until(lambda: not watchdog_pids(drums_instance), 15, "the lease watchdogs to exit", every=0.2)
    leftover_watchdogs = watchdog_pids(drums_instance)
    leftover_leases = ow.lease_files()
    made = [s for s in client.snapshots() if s["id"] not in before and s.get("name") != "init_state"]
    for s in sorted(made, key=lambda s: -s["created"]):  # children before parents
        try:
            client.delete_snapshot(s["id"])
        except Exception:  # noqa: BLE001 - reported below
            pass
    private = [s for s in made if ":env:" in str(s.get("scope"))]
    shutil.rmtree(ow.workdir, ignore_errors=True)
    assert not leftover_watchdogs, f"lease watchdogs still running: {leftover_watchdogs}"
    assert not leftover_leases, f"lease files left behind: {leftover_leases}"
    assert not private, f"private (per-env) snapshots left behind: {[(s['name'], s['id']) for s in private]}"
