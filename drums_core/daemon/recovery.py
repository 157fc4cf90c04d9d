"""Daemon restart recovery: adopt what predecessors left complete and alive, sweep the rest.

For every run under the ledger root whose owner is dead:
  * a session recorded RUNNING whose init is alive (same pid and start time), whose root is still
    mounted, is adopted: its resources are recorded in the new run's ledger first, then forgotten
    in the old one (so at every instant some ledger owns them), and it joins the new supervisor;
  * everything else the old run recorded (a restore in flight, a half-staged checkpoint, a destroy
    half way) is swept: the sweep spares what a live ledger claims, so adopted sessions survive it.
Before the sweep, the snapshot store finishes dumped snapshots and drops half-made ones
(see SnapshotStore.recover).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..session import netns, rootfs
from ..config import X11_DIR
from ..errors import DrumsError
from ..sweep.ledger import Ledger
from ..host.procs import is_alive
from ..session.model import Liveness, Session, SessionSpec, State
from ..session.supervisor import Supervisor
from ..sweep.driver import sweep

log = logging.getLogger("drums.recovery")


def _adoptable(data: dict) -> bool:
    pid, start = data.get("init_pid"), data.get("starttime")
    return (data.get("state") in (State.RUNNING.value, State.CHECKPOINTING.value) and isinstance(pid, int) and pid > 0
            and is_alive(pid, start) and rootfs.is_mountpoint(Path(data["root"])))


def adopt_session(sup: Supervisor, old: Ledger, sid: str, data: dict) -> Session:
    spec = SessionSpec.from_dict(data.get("spec"))
    s = Session(id=sid, slot=int(data["slot"]), state=State.RUNNING, spec=spec, dir=data["dir"], root=data["root"],
                ifname=data["ifname"], host_address="", address=data["address"], display=int(data["display"]),
                hostname=data["hostname"], machine_id=data.get("machine_id", ""), created=0.0,
                init_pid=int(data["init_pid"]), init_start=int(data["starttime"]), snapshot=data.get("snapshot"),
                layers=list(data.get("layers") or []), image_hash=data.get("image_hash"))
    from ..config import slot_addresses

    s.host_address = slot_addresses(s.slot)[0]
    s.liveness = Liveness.OK
    with sup._lock:
        if s.slot in sup._slots_in_use:
            raise RuntimeError(f"slot {s.slot} of adopted session {sid} is taken")
        sup._slots_in_use.add(s.slot)
        sup.sessions[sid] = s
    sup._record_session(s)
    sup.ledger.record("dir", s.dir, session=sid)
    sup.ledger.record("mount", s.root, session=sid)
    sup.ledger.record("process", sid, pid=s.init_pid, starttime=s.init_start, tag=f"drums:{old.run}")
    sup.ledger.record("link", s.ifname, session=sid)
    policy = spec.network_policy()
    if not netns.link_exists(s.ifname):  # a checkpoint that died before its dump had removed it
        netns.create_veth(s.ifname, s.init_pid)
        netns.configure_host_side(s.ifname, s.host_address)
        netns.configure_guest_side(s.init_pid, s.address, s.host_address, default_route=policy.nat)
    if policy.nat:  # its rules move to this run's table, its hold on the upstream to this run's ledger
        sup.nat.attach(sid, s.ifname, s.address, policy)
    rw = str(Path(s.dir) / "rw")
    sup.ledger.record("mount", rw, session=sid)
    link = X11_DIR / f"X{s.display}"  # runs before the daemon routed X itself made a host link: it goes
    if old.get("x11link", str(link)) and link.is_symlink():
        link.unlink()
    for kind, key in (("x11link", str(link)), ("link", s.ifname), ("process", sid), ("mount", s.root),
                      ("mount", rw), ("dir", s.dir), ("session", sid)):
        old.forget(kind, key)
    from ..session import display

    display.register_session(s.display, s.init_pid)
    _adopt_cgroup(sup, old, s)
    log.info("adopted session %s (pid %d) from run %s", sid, s.init_pid, old.run)
    return s


def _adopt_cgroup(sup: Supervisor, old: Ledger, s: Session) -> None:
    """A group is named for its run: the adopted session's processes move to a group of the new run
    (recorded first), then the old group goes (its entry forgotten once it is gone)."""
    from ..session import cgroups

    sup._make_cgroup(s)
    for entry in old.entries("cgroup"):
        if entry.data.get("session") != s.id:
            continue
        old_cg = cgroups.SessionCgroup.from_record(entry.key, entry.data)
        for pid in old_cg.pids():
            s.cgroup.attach(pid)
        old_cg.remove()
        old.forget("cgroup", entry.key)


def recover(sup: Supervisor) -> dict:
    root = sup.instance.ledger_root
    report: dict = {"adopted": [], "swept": {}, "snapshots": {}}
    for run in Ledger.runs(root):
        if run == sup.run:
            continue
        old = Ledger.open(root, run)
        try:
            with old.locked(blocking=False):  # keeps a concurrent CLI sweep out while sessions move
                if old.owner_alive():
                    continue
                for entry in old.entries("session"):
                    if _adoptable(entry.data):
                        try:
                            adopt_session(sup, old, entry.key, entry.data)
                            report["adopted"].append(entry.key)
                        except (RuntimeError, KeyError, ValueError, OSError, DrumsError) as exc:
                            log.warning("cannot adopt %s from %s: %s", entry.key, run, exc)
        except DrumsError as exc:  # busy, gone, or corrupt: left to the sweep, which fails closed
            log.warning("cannot adopt from run %s: %s", run, exc)
    # Finish dumped snapshots before the sweep: their uppers still sit in dead sessions' directories.
    report["snapshots"] = sup.store.recover()
    result = sweep(root)
    report["swept"] = result.to_dict()
    return report
