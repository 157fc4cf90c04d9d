"""Every fault window, on a real daemon with real CRIU: kill, sweep, check P1..P6 and O1.

The driver is ``tests/faults/harness.py`` (see its docstring for the protocol and the criteria).
Rows go to ``results/fault-windows.jsonl`` (``DRUMS_FW_RESULTS``); ``DRUMS_FW_WINDOWS=a,b`` runs
a subset. Standalone, three consecutive runs: ``python -m tests.faults.harness --runs 3``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.faults import harness
from tests.faults.harness import TIMED_RE, WINDOW_NAMES, WINDOWS
from tests.support.wait import wait_until

# The list: restore before overlay; after overlay, CRIU not started; 30/80/150/250 ms after
# CRIU started, the same with CRIU's top process killed first; CRIU returned, veth not addressed;
# registered, readiness not checked; mid-reseed; checkpoint after dump; mid-freeze of the layer;
# destroy after kill; after root unmount; teardown of a failed restore; the sweep itself.
REQUIRED = {
    "restore-before-overlay", "restore-after-overlay",
    *(f"criu+{ms}ms" for ms in (30, 80, 150, 250)), *(f"criu-top+{ms}ms" for ms in (30, 80, 150, 250)),
    "restore-after-criu", "restore-after-register", "restore-mid-reseed", "checkpoint-after-dump",
    "checkpoint-mid-freeze", "destroy-after-kill", "destroy-after-unmount", "restore-teardown-done",
    "sweep-after-kill", "sweep-after-unmount", "sweep-after-links",
}


def test_window_list_matches_the_engine():
    """Every named window the engine has is driven here, and every one driven here exists there."""
    engine = harness.engine_windows()
    named = {w.name for w in WINDOWS if not TIMED_RE.match(w.name)}
    assert sorted(engine - named) == [], "windows in the engine that the harness does not drive"
    assert sorted(named - engine) == [], "harness windows that the engine does not have"
    assert sorted(REQUIRED - set(WINDOW_NAMES)) == []
    src = (harness.REPO / "drums_core" / "session" / "restoring.py").read_text()
    assert "faults.arm_criu_timer()" in src and "faults.disarm_criu_timer()" in src, "timed windows not armed"
    assert len(set(WINDOW_NAMES)) == len(WINDOW_NAMES)


def test_unclean_host_makes_a_window_invalid_not_failed(tmp_path):
    """A leftover of this harness (here: a process with a harness run's tag) makes the window
    INVALID: no daemon is started, nothing of the window is made, and the row says why."""
    if os.geteuid() != 0:
        pytest.fail("needs root (it probes mounts and nftables like the harness does)")
    tag = f"drums:fw{os.getpid()}-99-0123456789ab"
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--tag", tag],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: tag in harness.procs.tags_of(harness.procs.read_cmdline(stray.pid)), 10, "the stray's tag")
        results = tmp_path / "rows.jsonl"
        window = WINDOWS[0]
        rows = harness.run_windows([window], results=results, echo=None)
        (row,) = [json.loads(line) for line in results.read_text().splitlines()]
        assert row == rows[0]
        assert row["status"] == "INVALID" and row["pass"] is False, row
        assert any(tag in why for why in row["invalid"]), row["invalid"]
        inst = f"fw{os.getpid()}-{WINDOW_NAMES.index(window.name):02d}"
        assert not (harness.STATE_ROOT / inst).exists(), "an INVALID window must not start anything"
    finally:
        stray.kill()
        stray.wait()
    assert harness.harness_footprint(harness._slot_base(), harness._slot_base() + 4 * len(WINDOWS)) == []


def test_every_fault_window_passes():
    if os.geteuid() != 0:
        pytest.fail("the fault windows need root (namespaces, mounts, CRIU)")
    windows = harness.selected_windows()
    results = harness.results_path()
    rows = harness.run_windows(windows, results=results)
    summary = harness.summarize(rows)
    print(json.dumps(summary, indent=1))
    print(f"rows appended to {results}")
    bad = {r["window"]: {"status": r["status"], "invalid": r.get("invalid"), "notes": r.get("notes"),
                         "failed": {c: v.get("detail") for c, v in r.get("criteria", {}).items() if not v["pass"]}}
           for r in rows if r["status"] != "PASS"}
    assert not bad, json.dumps(bad, indent=1, default=str)[:20000]


def test_a_criu_mount_that_stays_is_a_leftover_and_one_that_goes_is_not(tmp_path):
    """Every CRIU run here mounts a probe tmpfs under /tmp/.criu.* in the host's table for a few
    milliseconds (this host's /run is no tmpfs, so CRIU keeps no kerndat cache): a window running
    beside another sees the other's probes. One that goes within the wait is not a leftover; one
    that stays is (a killed CRIU's)."""
    if os.geteuid() != 0:
        pytest.fail("needs root (it mounts tmpfs under /tmp)")
    stays, goes = (Path(tempfile.mkdtemp(prefix=f".criu.fwtest-{name}.", dir="/tmp")) for name in ("stays", "goes"))
    mounted = []
    try:
        for d in (stays, goes):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "drums-fw-test", str(d)], check=True)
            mounted.append(d)
        unmount = threading.Timer(0.3, lambda: subprocess.run(["umount", str(goes)], check=True))
        unmount.start()
        try:
            left = harness.lasting_criu_mounts([str(stays), str(goes)], timeout=2.0)
        finally:
            unmount.join()
        mounted.remove(goes)
        assert left == [str(stays)], left
        assert f"mount {stays} (left by CRIU)" in harness.harness_footprint(0, 0)
    finally:
        for d in mounted:
            subprocess.run(["umount", str(d)], check=False)
        for d in (stays, goes):
            d.rmdir()
    assert not [p for p in harness.lasting_criu_mounts([str(stays), str(goes)], timeout=0.1)]
