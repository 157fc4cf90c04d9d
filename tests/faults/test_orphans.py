"""Orphans after a daemon's death, with real sessions and real CRIU.

(a) One cold and two restored sessions live, the daemon SIGKILLed: the sweep reaps exactly what
    those sessions held (their processes, mounts, links, X11 links, and the run's nft table) and
    spares a process tagged with another run and a tmpfs no ledger recorded.
(b) Restart recovery: the daemon holding two idle sessions is killed while restoring a third
    (``restore-after-criu``: CRIU returned, veth not yet made); a new daemon adopts the two idle
    ones (same inits; they answer ``exec``, show in ``drums ls`` and can be checkpointed) and
    sweeps the third.

Each test runs on its own instance (own state dir, slots, nft table) and stops it in a finalizer,
whatever happened (``tests.support.suite.stop_instance``, then anything left is removed by force and
the test fails on it).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from drums_core.session import cgroups

from drums_core.host import mounttable, procs
from drums_core.client import Client
from drums_core.config import X11_DIR, Instance, nft_table_name
from drums_core.errors import Unavailable
from drums_core.sweep.ledger import Ledger
from tests.support.slots import my_block
from tests.support.wait import wait_until
from tests.faults.harness import (REPO, XTERM, Decoys, _links, _nft_names, daemon_env, force_clean,
                                  instance_footprint, sweep_cli, sweep_counts)
from tests.support.suite import instance_env

# the orphans part of this process's slot block (tests/support/slots.py) unless DRUMS_ORPHANS_SLOT_BASE says
SLOT_BASE = int(os.environ.get("DRUMS_ORPHANS_SLOT_BASE") or my_block().orphans.start)


@pytest.fixture
def instance(request):
    """A fresh instance per test, stopped and removed unconditionally."""
    from tests.support.suite import require_root, stop_instance

    require_root()
    index = {"test_orphans_of_a_killed_daemon_are_reaped_exactly": 0}.get(request.node.name, 1)
    inst = Instance(name=f"orph{os.getpid()}-{index}", slot_base=SLOT_BASE + 8 * index, slot_count=8)
    decoys = Decoys()
    holder = {"decoys": decoys}
    yield inst, holder
    decoys.close()
    try:
        stop_instance(inst)
    finally:
        forced = force_clean(inst)
        for path in inst.daemon_files:
            path.unlink(missing_ok=True)
        try:
            inst.state_dir.rmdir()
        except OSError:
            pass
    assert not forced, f"the test left resources of {inst.name} behind: {forced}"


def _snapshot_of_xterm(inst: Instance) -> tuple[str, str]:
    """A healthy daemon checkpoints an xterm session and stops: (snapshot id, that daemon's run)."""
    c = Client(inst, daemon_env=daemon_env(None))
    info = c.ping()
    s = c.create(XTERM)
    snap = c.checkpoint(s["id"])
    c.shutdown(destroy_sessions=True)
    wait_until(lambda: not procs.is_alive(info["pid"]), 30, "the stopped daemon to exit")
    assert Ledger.runs(inst.ledger_root) == [], "a cleanly stopped daemon leaves no ledger"
    return snap["id"], info["run"]


def _holdings(inst: Instance, sessions: list[dict]) -> dict:
    """What the live sessions hold on the host: process keys, mounts under their dirs, links, X11 links."""
    mounts = mounttable.read_mountinfo()
    out = {"processes": set(), "mounts": set(), "links": set(), "x11links": set(), "cgroups": set()}
    for s in sessions:
        ns = procs.readlink(f"/proc/{s['init_pid']}/ns/pid")
        assert ns and ns != procs.readlink("/proc/self/ns/pid")
        for p in procs.scan_processes().values():
            if not p.zombie and procs.readlink(f"/proc/{p.pid}/ns/pid") == ns:
                out["processes"].add(p.key)
        out["mounts"] |= {m.mountpoint for m in mounttable.mounts_within(mounts, [s["dir"]])}
        assert os.path.exists(f"/sys/class/net/{s['ifname']}")
        out["links"].add(s["ifname"])
        link = str(X11_DIR / f"X{s['display']}")
        assert not os.path.lexists(link)  # the daemon routes X through the session root: no host link
        out["cgroups"] |= {p for paths in cgroups.list_run_groups().values() for p in paths if p.endswith(s["id"])}
    return out


def test_orphans_of_a_killed_daemon_are_reaped_exactly(instance):
    inst, holder = instance
    snap, _ = _snapshot_of_xterm(inst)

    c = Client(inst, daemon_env=daemon_env(None))
    info = c.ping()
    run = info["run"]
    restored = c.restore(snap, count=2, wait_live=True)
    cold = c.create({})
    sessions = [c.wait_live(s["id"]) for s in (*restored, cold)]
    assert all(s["state"] == "RUNNING" for s in sessions)
    # A cold session is handed back once its X server draws; its init goes on to start the session
    # bus after that. Every process the sweep must reap is there once the bus's socket is.
    # (the check runs inside the session: its /run/user is its own mount)
    wait_until(lambda: c.exec(cold["id"], ["test", "-S", "/run/user/1000/bus"])["returncode"] == 0, 20,
               "the cold session's D-Bus", every=0.2)
    held = _holdings(inst, sessions)
    table = nft_table_name(run)
    assert table in _nft_names()
    decoys = holder["decoys"]
    decoys.make(f"{run}0", inst.sessions_dir / f"{cold['id']}0")
    held = _holdings(inst, sessions)  # again, right before the kill: the process set is settled

    os.kill(info["pid"], signal.SIGKILL)
    wait_until(lambda: not procs.is_alive(info["pid"]), 15, "the killed daemon to die")
    assert all(procs.is_alive(*k) for k in held["processes"]), "sessions must outlive their daemon"

    res = sweep_cli(inst.ledger_root)
    counts = sweep_counts(res["report"])
    print("sessions held:", json.dumps({k: len(v) for k, v in held.items()}), "+ nft table", table)
    print("sweep:", json.dumps(counts))
    assert res["rc"] == 0, res["stderr"]
    assert counts["status"] == {run: "swept"}
    assert counts["processes_killed"] == len(held["processes"]), (counts, sorted(held["processes"]))
    assert counts["mounts_unmounted"] == len(held["mounts"]), (counts, sorted(held["mounts"]))
    assert counts["x11links_removed"] == len(held["x11links"]) == 0
    assert len(held["cgroups"]) >= 3 and counts["cgroups_removed"] >= 3, (counts, sorted(held["cgroups"]))
    assert counts["nft_deleted"] == 1
    assert counts["links_deleted"] <= len(held["links"]) == 3  # a link may go with its netns first
    assert counts["ledgers_removed"] == 1 and counts["survivors"] == 0 and counts["errors"] == 0

    assert [k for k in held["processes"] if procs.is_alive(*k)] == []
    assert mounttable.mounts_within(mounttable.read_mountinfo(), sorted(held["mounts"])) == []
    assert held["links"] & _links() == set()
    assert [x for x in held["x11links"] if os.path.lexists(x)] == []
    assert [c for c in held["cgroups"] if os.path.exists(c)] == []
    assert table not in _nft_names()
    assert not (inst.ledger_root / run).exists()
    assert not any(os.path.exists(s["dir"]) for s in sessions)
    assert decoys.problems() == []
    again = sweep_cli(inst.ledger_root)
    assert again["rc"] == 0 and again["report"] is not None
    assert all(v == 0 for k, v in sweep_counts(again["report"]).items() if k != "status"), again["report"]
    assert decoys.problems() == []


def test_restart_recovery_adopts_idle_sessions_and_sweeps_the_restore_in_flight(instance):
    inst, holder = instance
    snap, _ = _snapshot_of_xterm(inst)

    # The faulty daemon holds two idle sessions, then dies restoring a third.
    faulty = Client(inst, daemon_env=daemon_env("restore-after-criu"))
    info = faulty.ping()
    idle = [faulty.create({}), faulty.create(XTERM)]
    for s in idle:
        assert faulty.exec(s["id"], ["true"])["returncode"] == 0
    with pytest.raises(Unavailable) as exc:
        faulty.restore(snap)
    assert exc.value.reason == "DAEMON_DIED"
    wait_until(lambda: not procs.is_alive(info["pid"]), 15, "the killed daemon to die")
    old = Ledger(inst.ledger_root, info["run"])
    in_flight = [e for e in old.entries("session") if e.data["state"] == "RESTORING"]
    assert len(in_flight) == 1, [(e.key, e.data["state"]) for e in old.entries("session")]
    third = in_flight[0]
    rec = old.get("process", third.key)
    assert rec is not None, "CRIU returned: the restored init is recorded"
    third_init = (rec.data["pid"], rec.data["starttime"])
    assert procs.is_alive(*third_init)
    idle_inits = {s["id"]: (s["init_pid"], s["init_start"]) for s in idle}
    assert all(procs.is_alive(*k) for k in idle_inits.values())
    third_link = f"dvh{third.data['slot']}"
    assert third_link not in _links(), "restore-after-criu: the veth is not made yet"
    decoys = holder["decoys"]
    decoys.make(f"{info['run']}0", inst.sessions_dir / f"{third.key}0")

    # A new daemon: adopts the idle two, sweeps the third.
    healthy = Client(inst, daemon_env=daemon_env(None))
    new = healthy.ping()
    assert new["run"] != info["run"]
    listed = {s["id"]: s for s in healthy.list()}
    print("after restart:", {sid: (s["state"], s["init_pid"]) for sid, s in listed.items()})
    assert set(listed) == set(idle_inits), listed.keys()
    for sid, key in idle_inits.items():
        assert (listed[sid]["init_pid"], listed[sid]["init_start"]) == key, "adopted, not restarted"
        assert listed[sid]["state"] == "RUNNING"
    assert not procs.is_alive(*third_init), "the half-restored session survived the restart"
    assert not os.path.exists(third.data["dir"])
    assert mounttable.mounts_within(mounttable.read_mountinfo(), [third.data["dir"]]) == []
    assert third_link not in _links()
    assert not old.path.exists(), f"the dead run's ledger is left: {os.listdir(old.path)}"
    assert nft_table_name(info['run']) not in _nft_names()
    assert decoys.problems() == []
    log = inst.log_file.read_text()
    assert all(f"adopted session {sid}" in log for sid in idle_inits), "adoption is logged"

    env = instance_env(inst)
    ls = subprocess.run([sys.executable, "-m", "drums_core.cli", "--json", "ls"], capture_output=True, text=True,
                        env=env, timeout=60, cwd=str(REPO))
    assert ls.returncode == 0, ls.stderr
    assert {s["id"] for s in json.loads(ls.stdout)} == set(idle_inits), "adopted sessions show in drums ls"

    # They still answer, and can be checkpointed (one torn down, one left running).
    first, second = idle
    for s in idle:
        out = healthy.exec(s["id"], ["sh", "-c", "echo alive-$(hostname)"])
        assert out["returncode"] == 0 and out["stdout"].strip() == f"alive-drums-{s['id']}", out
    snap1 = healthy.checkpoint(first["id"])
    assert snap1["state"] == "committed"
    snap2 = healthy.checkpoint(second["id"], leave_running=True)
    assert snap2["state"] == "committed"
    assert healthy.exec(second["id"], ["true"])["returncode"] == 0
    assert any("fwin" in w["title"] for w in healthy.windows(second["id"]) if w["mapped"])
    assert [s["id"] for s in healthy.list()] == [second["id"]]
    healthy.destroy(second["id"])
    (back,) = healthy.restore(snap1["id"])
    assert healthy.exec(back["id"], ["true"])["returncode"] == 0
    healthy.destroy(back["id"])
    footprint = instance_footprint(inst, exclude_pids=decoys.pids)
    assert footprint["processes"] == [] and footprint["links"] == [] and footprint["x11links"] == []
