"""Suite-wide fixtures: a real drumsd on a test instance, and the leak checks.

The suite's daemon runs on its own instance (``pytest-<pid>``: own state tmpfs, socket, slot range
and nftables table). After each test that used it, no session may remain; at the end of the run the
daemon is stopped, its dead ledgers swept, its state tmpfs unmounted, and the host is checked for
anything of Drums left behind: a leak fails the run.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from drums_core.config import STATE_ROOT, X11_DIR, Instance  # noqa: E402
from drums_core.host.hoststate import instance_leaks  # noqa: E402 - the suite's own leak check below

# Slot ranges of concurrent test runs (and of other daemons on this host) must not overlap.
# The suite's own daemon gets the first 32 slots of this run's range; tests that need another
# daemon (fault windows) take slots from SPARE_SLOTS.
_RANGE = 1000 + (os.getpid() % 300) * 48
INSTANCE = Instance(name=f"pytest-{os.getpid()}", slot_base=_RANGE, slot_count=32)
SPARE_SLOTS = range(_RANGE + 32, _RANGE + 48)
SUITE_DAEMON_ENV = {"DRUMS_LIVENESS_DELAY": "3", "DRUMS_TEST_HOOKS": "1"}
# Whichever test first starts the suite's daemon (a Client fixture, the gym env, the OSWorld provider,
# the CLI in a subprocess) starts it with this env: the test hooks must not depend on test order.
os.environ.update(SUITE_DAEMON_ENV)


# `drums` in a subprocess, with drums_osworld imported first so that it registers what it adds to the
# CLI (`drums up`'s desktop, `bench`, `rollouts`: drums_core.cli_registry). An installed drums finds
# them through its entry-point group `drums.cli`; this checkout may run against older installed metadata.
DRUMS_CLI = [sys.executable, "-c", "import sys, drums_osworld; from drums_core.cli import main; sys.exit(main())"]


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (real namespaces, mounts, CRIU)")


def host_leaks(state_dir: Path | None = None) -> dict:
    """What Drums could have left on this host: tagged processes, mounts, links, tables, X links."""
    from drums_core.host.procs import scan_processes

    procs = [(p.pid, tag) for p in scan_processes().values() if not p.zombie
             for tag in p.tags if tag.startswith("drums:")]
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point.startswith(str(STATE_ROOT) + "/") or point.startswith("/tmp/.criu."):
                if state_dir is None or point.startswith(str(state_dir)):
                    mounts.append(point)
    links = [ln.split(":")[1].strip().split("@")[0] for ln in
             subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
             if ln.split(":")[1].strip().startswith("dvh") and not ln.split(":")[1].strip().startswith("dvhdoc")]
    tables = [ln for ln in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.splitlines()
              if " drums" in ln]
    xlinks = [p.name for p in X11_DIR.glob("X*") if p.is_symlink()] if X11_DIR.exists() else []
    return {"processes": procs, "mounts": mounts, "links": links, "nft": tables, "x11links": xlinks}


def _no_leaks(report: dict) -> bool:
    return not any(report.values())


@pytest.fixture(scope="session")
def drums_instance():
    require_root()
    from drums_core.client import Client

    client = Client(INSTANCE, daemon_env=SUITE_DAEMON_ENV)
    client.ping()
    yield INSTANCE
    stop_instance(INSTANCE)
    leaked = instance_leaks(INSTANCE)
    assert _no_leaks(leaked), f"Drums left resources on the host after the suite: {leaked}"


def stop_instance(instance: Instance) -> dict:
    """Stop the instance's daemon (destroying its sessions), sweep dead ledgers, unmount its state."""
    from drums_core.client import Client
    from drums_core.store.budget import DEFAULT_SPILL_ROOT
    from drums_core.sweep import sweep_instance

    Client(instance, autostart=False).shutdown(destroy_sessions=True)
    report = sweep_instance(instance)["sweep"]
    # snapshots the store spilled to disk belonged to the tmpfs just unmounted (drums_core.store.budget)
    shutil.rmtree(DEFAULT_SPILL_ROOT / instance.name, ignore_errors=True)
    instance.log_file.unlink(missing_ok=True)
    return report


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


def instance_links(instance: Instance) -> list[str]:
    """The session links of this instance's slot range that exist on the host."""
    mine = {f"dvh{s}" for s in range(instance.slot_base, instance.slot_base + instance.slot_count)}
    return [ln for ln in host_leaks()["links"] if ln in mine]


# markers by where a test lives (see pyproject.toml); the unit lane needs neither root nor sessions
_MARKS_BY_DIR = {"bench": ("root", "slow"), "faults": ("root", "slow"), "osworld": ("root", "osworld"),
                 "ray": ("root", "ray")}


def pytest_collection_modifyitems(session, config, items):
    """Mark each test by its folder, and run the fast unit lane first (``pytest -m 'not root'`` runs
    it alone); the rest keep their order."""
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
    items[:] = unit + rest


def pytest_sessionfinish(session, exitstatus):
    """Leave no trace of the run's instances in the state root: the files the suite's own instances
    (``pytest-<pid>*``, ``benchtest-<pid>*``) would leave must already be gone (a leftover fails the
    run), and the state root itself goes when nothing else uses it."""
    pid = os.getpid()
    left = sorted(p.name for p in STATE_ROOT.glob(f"*-{pid}*")) if STATE_ROOT.is_dir() else []
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nDrums left files of this run's instances in {STATE_ROOT}: {left}", file=sys.stderr)
    try:
        STATE_ROOT.rmdir()
    except OSError:  # not empty (another instance, a leftover reported above) or already gone
        pass


@contextlib.contextmanager
def module_client(instance, what: str, timeout: float = 120.0):
    """A client of the suite's daemon shared by one module's tests (the function-scoped ``client``
    fixture insists that no session outlives a test). Afterwards, every session and snapshot the
    module made is removed, and the module fails if it left any (``what`` names it)."""
    from drums_core.client import Client
    from drums_core.errors import DrumsError

    c = Client(instance, daemon_env=SUITE_DAEMON_ENV, timeout=timeout)
    before = {s["id"] for s in c.list()}
    snaps_before = {s["id"] for s in c.snapshots()}
    yield c
    left = [s["id"] for s in c.list() if s["id"] not in before]
    for sid in left:
        with contextlib.suppress(DrumsError):
            c.destroy(sid)
    snaps_left = [s["id"] for s in c.snapshots() if s["id"] not in snaps_before]
    for snap in snaps_left:
        with contextlib.suppress(DrumsError):
            c.delete_snapshot(snap)
    assert not left and not snaps_left, f"the {what} left sessions {left} and snapshots {snaps_left}"
