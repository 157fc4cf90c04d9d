"""Snapshots you can trust: crash-safe idempotent checkpoints, classified restore failures, bad input.

The boundary tests kill a real daemon (SIGKILL through DRUMS_FAULT_AT) at each step of the
checkpoint protocol, start a new one, retry the same snapshot id and restore the result.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from drums_core.client import Client
from drums_core.config import Instance
from drums_core.errors import FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable

from tests.support.wait import wait_until

XTERM = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "snapwin"]}],
         "expect_window": "snapwin"}

WINDOWS = ["checkpoint-before-staging", "checkpoint-mid-staging", "checkpoint-staged", "checkpoint-published",
           "checkpoint-committed", None]


@pytest.fixture(scope="module")
def fault_instance():
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, require_root, stop_instance

    require_root()
    inst = Instance(name=f"snapfault-{os.getpid()}", slot_base=SPARE_SLOTS[0], slot_count=8)
    yield inst
    stop_instance(inst)
    leaks = instance_leaks(inst)
    assert not any(leaks.values()), leaks


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    from drums_core.session.processes import is_alive

    wait_until(lambda: not is_alive(pid), timeout, f"daemon {pid} to die", every=0.01)


@pytest.mark.parametrize("window", WINDOWS, ids=[w or "control" for w in WINDOWS])
def test_checkpoint_interrupted_at_each_boundary_then_retried(fault_instance, window):
    for attempt in range(3):
        faulty = Client(fault_instance, daemon_env={"DRUMS_FAULT_AT": window or ""})
        s = faulty.create(XTERM)
        faulty_pid = faulty.ping()["pid"]
        print("create timings", s["timings"], "daemon", faulty_pid)
        snap_id = uuid.uuid4().hex
        if window is None:
            faulty.checkpoint(s["id"], snapshot_id=snap_id)
        else:
            with pytest.raises(Unavailable) as exc:
                faulty.checkpoint(s["id"], snapshot_id=snap_id)
            assert exc.value.reason in ("DAEMON_DIED",), exc.value
            _wait_gone(faulty_pid)
        healthy = Client(fault_instance, daemon_env={"DRUMS_FAULT_AT": ""})
        snap = healthy.checkpoint(s["id"], snapshot_id=snap_id)
        assert snap["id"] == snap_id and snap["state"] == "committed"
        (r,) = healthy.restore(snap_id, wait_live=True)
        try:
            assert any("snapwin" in w["title"] for w in healthy.windows(r["id"]) if w["mapped"])
        finally:
            healthy.destroy(r["id"])
        healthy.delete_snapshot(snap_id)
        assert healthy.list() == [], f"window {window} attempt {attempt}: sessions left {healthy.list()}"
        if window is not None:
            healthy.shutdown()


def test_client_timeout_mid_checkpoint_gets_the_one_snapshot(client, drums_instance):
    s = client.create(XTERM)
    before = client.stats()["counters"]["dumps"]
    snap_id = uuid.uuid4().hex
    impatient = Client(drums_instance, timeout=0.05)
    with pytest.raises(Unavailable) as exc:
        impatient.checkpoint(s["id"], snapshot_id=snap_id)
    assert exc.value.reason == "TIMEOUT"
    snap = client.checkpoint(s["id"], snapshot_id=snap_id)
    again = client.checkpoint(s["id"], snapshot_id=snap_id)
    assert snap["id"] == again["id"] == snap_id
    assert client.stats()["counters"]["dumps"] - before == 1
    with pytest.raises(FailedPrecondition):
        client.checkpoint(s["id"], snapshot_id=snap_id, name="other-params")
    client.delete_snapshot(snap_id)


def _no_session_resources(instance) -> None:
    from tests.support.leaks import instance_links

    mounts = [m for m in open("/proc/self/mountinfo").read().split("\n") if f"{instance.state_dir}/sessions" in m]
    assert not mounts, mounts
    assert not instance_links(instance)


@pytest.fixture
def xterm_snapshot(client):
    s = client.create(XTERM)
    snap = client.checkpoint(s["id"])
    yield snap
    client.delete_snapshot(snap["id"])


def test_restore_failures_are_unavailable_then_internal(client, drums_instance, xterm_snapshot):
    sid = xterm_snapshot["id"]
    for point in ("restore-resume", "restore-readiness"):
        client.call("inject", point=point, times=1)
        with pytest.raises(Unavailable) as exc:
            client.restore(sid)
        assert exc.value.reason == "INJECTED"
        _no_session_resources(drums_instance)
    client.call("inject", point="restore-reseed", times=1)
    with pytest.raises(Internal) as exc:
        client.restore(sid)
    assert exc.value.reason == "RETRIES_EXHAUSTED"
    _no_session_resources(drums_instance)
    # a success in between resets the streak
    client.call("inject", point="restore-resume", times=2)
    for _ in range(2):
        with pytest.raises(Unavailable):
            client.restore(sid)
    (ok,) = client.restore(sid)
    client.destroy(ok["id"])
    client.call("inject", point="restore-resume", times=2)
    for _ in range(2):
        with pytest.raises(Unavailable):
            client.restore(sid)
    # another snapshot keeps its own count
    s2 = client.create(XTERM)
    other = client.checkpoint(s2["id"])
    client.call("inject", point="restore-resume", times=1)
    with pytest.raises(Unavailable):
        client.restore(other["id"])
    client.call("inject", point="restore-resume", times=1)
    with pytest.raises(Internal):
        client.restore(sid)
    client.delete_snapshot(other["id"])
    _no_session_resources(drums_instance)


def test_restore_steps_are_named_in_errors_and_in_the_daemon_log(client, drums_instance, xterm_snapshot):
    """A restore runs as named steps: a failure injected in one names that step in the error's
    message and detail, and the daemon's log names each step of a restore, failed or done."""
    sid = xterm_snapshot["id"]
    log_path = drums_instance.state_root / f"{drums_instance.name}.log"
    for point, step in (("restore-resume", "criu"), ("restore-reseed", "reseed"),
                        ("restore-readiness", "readiness")):
        client.call("inject", point=point, times=1)
        with pytest.raises(Unavailable) as exc:
            client.restore(sid)
        assert exc.value.reason == "INJECTED"
        assert f"failed at step {step} and was rolled back" in exc.value.message, exc.value.message
        assert exc.value.detail == {"step": step}, exc.value.detail
        _no_session_resources(drums_instance)
        assert f"step {step} failed after" in log_path.read_text(errors="replace")
        if step == "reseed":  # a success resets the snapshot's streak of failures (3 in a row is Internal)
            (ok,) = client.restore(sid)
            client.destroy(ok["id"])
    (ok,) = client.restore(sid)
    try:
        assert set(ok["timings"]["steps"]) == {"prepare-root", "criu", "network", "reseed", "readiness"}
        assert ok["liveness"] in ("unchecked", "ok")
        done = [line for line in log_path.read_text(errors="replace").splitlines()
                if f"restored {ok['id']} from {sid}" in line]
        assert done and all(f"{name} " in done[-1] for name in ("prepare-root", "criu", "network", "reseed",
                                                                "readiness")), done
    finally:
        client.destroy(ok["id"])


def test_corrupt_images_are_internal_and_leave_nothing(client, drums_instance, xterm_snapshot):
    images = drums_instance.snapshots_dir / xterm_snapshot["id"] / "images"
    pages = sorted(images.glob("pages-*.img"), key=lambda p: p.stat().st_size)[-1]
    with open(pages, "r+b") as f:
        f.truncate(pages.stat().st_size // 2)
    with pytest.raises(Internal) as exc:
        client.restore(xterm_snapshot["id"])
    assert exc.value.reason == "IMAGES_CORRUPT"
    assert "pages" in exc.value.detail["verify"]
    _no_session_resources(drums_instance)
    with pytest.raises(Internal):
        client.restore(xterm_snapshot["id"])


def _tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p).encode())
        if p.is_file() and not p.is_symlink():
            h.update(str(p.stat().st_size).encode())
            if p.name.endswith(".json") or p.name in ("COMMITTED", "BROKEN"):
                h.update(p.read_bytes())
    return h.hexdigest()


def test_bad_snapshot_input_changes_nothing(client, drums_instance, xterm_snapshot):
    store = drums_instance.snapshots_dir
    before = _tree_digest(store)
    with pytest.raises(NotFound) as exc:
        client.restore(uuid.uuid4().hex)
    assert exc.value.reason == "SNAPSHOT_NOT_FOUND"
    with pytest.raises(NotFound):
        client.restore("no-such-name")
    for bad in ("a/b", "../x", "..", "x/../../etc"):
        with pytest.raises(InvalidArgument):
            client.restore(bad)
    s = client.create({})
    try:
        for bad in ("a/b", "..", "../evil"):
            with pytest.raises(InvalidArgument):
                client.checkpoint(s["id"], name=bad)
            with pytest.raises(InvalidArgument):
                client.checkpoint(s["id"], snapshot_id=bad)
    finally:
        client.destroy(s["id"])
    for bad in (1.0, 1.5, -0.1, "0.5", True, None):
        with pytest.raises(InvalidArgument) as exc:
            client.restore(xterm_snapshot["id"], min_nonblank=bad)
        assert exc.value.reason == "BAD_NONBLANK"
    for bad in (0, -1, 10**6):
        with pytest.raises(InvalidArgument) as exc:
            client.restore(xterm_snapshot["id"], count=bad)
        assert exc.value.reason == "BAD_COUNT"
    with pytest.raises(InvalidArgument) as exc:
        client.restore(xterm_snapshot["id"], expect_window=["not", "a", "title"])
    assert exc.value.reason == "BAD_WINDOW"
    assert client.list() == []
    assert _tree_digest(store) == before
    # a snapshot from another boot
    manifest = store / xterm_snapshot["id"] / "manifest.json"
    data = json.loads(manifest.read_text())
    data["boot_id"] = "00000000-0000-0000-0000-000000000000"
    manifest.write_text(json.dumps(data))
    before = _tree_digest(store)
    with pytest.raises(FailedPrecondition) as exc:
        client.restore(xterm_snapshot["id"])
    assert exc.value.reason == "SNAPSHOT_OTHER_BOOT"
    assert _tree_digest(store) == before
    assert client.list() == []


def test_delete_refused_while_used_and_listing(client, xterm_snapshot):
    (r,) = client.restore(xterm_snapshot["id"])
    try:
        with pytest.raises(FailedPrecondition) as exc:
            client.delete_snapshot(xterm_snapshot["id"])
        assert exc.value.reason == "SNAPSHOT_IN_USE"
        child = client.checkpoint(r["id"], leave_running=True)
        with pytest.raises(FailedPrecondition):
            client.delete_snapshot(xterm_snapshot["id"])
        listing = {s["id"]: s for s in client.snapshots()}
        assert listing[child["id"]]["size"] > 1 << 20 and len(listing[child["id"]]["layers"]) == 2
    finally:
        client.destroy(r["id"])
    client.delete_snapshot(child["id"])
    time.sleep(0)
