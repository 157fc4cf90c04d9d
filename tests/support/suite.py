"""The suite's daemon instance and what tests need around it.

Each test process (a plain ``pytest`` run, or each pytest-xdist worker) has its own daemon instance,
``pytest-<pid>`` (own state tmpfs, socket, nftables table), on the first slots of its own slot block
(:mod:`tests.support.slots`); tests that start another daemon for a while take slots from
:data:`SPARE_SLOTS`, the rest of the block serves the orphans test, the benchmark smoke runs and the
fault windows.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys

import pytest

from drums_core.config import Instance

from . import REPO
from .slots import my_block

BLOCK = my_block()
INSTANCE = Instance(name=f"pytest-{os.getpid()}", slot_base=BLOCK.suite.start, slot_count=len(BLOCK.suite))
SPARE_SLOTS = BLOCK.spare
SUITE_DAEMON_ENV = {"DRUMS_LIVENESS_DELAY": "3", "DRUMS_TEST_HOOKS": "1"}

# `drums` in a subprocess, with drums_osworld imported first so that it registers what it adds to the
# CLI (`drums up`'s desktop, `bench`, `rollouts`: drums_core.cli_registry). An installed drums finds
# them through its entry-point group `drums.cli`; this checkout may run against older installed metadata.
DRUMS_CLI = [sys.executable, "-c", "import sys, drums_osworld; from drums_core.cli import main; sys.exit(main())"]


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (real namespaces, mounts, CRIU)")


def instance_env(instance: Instance) -> dict[str, str]:
    """The environment of ``drums`` (or a client) run in a subprocess against ``instance``, from this
    checkout: ``os.environ`` plus the instance, its slots and ``PYTHONPATH``."""
    return {**os.environ, "DRUMS_INSTANCE": instance.name, "DRUMS_SLOT_BASE": str(instance.slot_base),
            "DRUMS_SLOT_COUNT": str(instance.slot_count), "PYTHONPATH": str(REPO)}


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
