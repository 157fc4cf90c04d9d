"""Remove one instance from the host: what ``drums shutdown --purge`` does.

    plan = plan_purge(instance)          # what is there, changes nothing
    report = purge(instance, plan)       # stop, sweep, unmount, delete

In order: the daemon is stopped with its sessions destroyed (``Client.shutdown(destroy_sessions=True)``);
the instance's lock is taken, so that no daemon starts meanwhile; the sweep deletes whatever dead
runs of the instance still own (sessions of a daemon that died, or one stopped without
``--destroy``). If a session could not be stopped (a run still alive or swept with survivors or
errors, a mount under the state directory other than its own tmpfs), the purge refuses with
:class:`FailedPrecondition` (``PURGE_REFUSED``) and deletes nothing. Else it removes the snapshots the
store spilled to disk, unmounts the state tmpfs (which frees everything in it: sessions' directories,
snapshots, ledgers, the code layer) and deletes the emptied mount point and the instance's files in
the state root (lock, start lock, log, daemon stderr). The unmount and the removal of those files
are the steps :func:`drums_core.sweep.sweep_instance` takes too (:mod:`drums_core.sweep.instance`).

Nothing is followed: the state directory and the spill directory must be real directories (not
symbolic links) and are removed with :func:`shutil.rmtree`, which never follows a link inside the
tree; what is inside the state tmpfs goes with the unmount, without being walked at all.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import STATE_ROOT, Instance
from ..host import criu_cache, kernel_budget
from ..errors import DrumsError, FailedPrecondition
from ..reasons import Reason
from ..session.rootfs import mounts_under
from ..sweep.instance import real_dir, remove_files, unmount_state



def _state_files(instance: Instance) -> tuple[Path, ...]:
    """The instance's files beside its state directory: the daemon's locks and output, and its log."""
    return (*instance.daemon_files, instance.log_file)


@dataclass
class PurgePlan:
    """What a purge of ``instance`` will stop and delete (read from the daemon if it runs, else the disk)."""

    instance: str
    daemon_pid: int | None = None
    sessions: list[str] = field(default_factory=list)
    snapshots: list[dict] = field(default_factory=list)
    state_dir: str = ""
    state_mounted: bool = False
    mounts: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    spill_dir: str | None = None
    dead_runs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The plan for people: one line per thing that goes."""
        out = []
        if self.daemon_pid:
            out.append(f"stop drumsd (pid {self.daemon_pid})")
        if self.sessions:
            out.append(f"destroy {len(self.sessions)} session(s): {' '.join(self.sessions)}")
        if self.dead_runs:
            out.append(f"sweep {len(self.dead_runs)} run(s) of a daemon no longer running: {' '.join(self.dead_runs)}")
        if self.snapshots:
            names = " ".join(f"{s['id'][:12]}({s.get('name') or '-'})" for s in self.snapshots)
            out.append(f"delete {len(self.snapshots)} snapshot(s): {names}")
        if self.state_dir:
            how = " (its tmpfs unmounted)" if self.state_mounted else ""
            out.append(f"remove {self.state_dir}{how}")
        out += [f"remove {f}" for f in self.files]
        if self.spill_dir:
            out.append(f"remove {self.spill_dir} (snapshots spilled to disk)")
        return out or [f"nothing of instance {self.instance} is on this host"]


def _check_spill_dir(path: Path) -> None:
    """Refuse a spill directory whose removal could reach beyond Drums' own files."""
    p = Path(os.path.normpath(path))
    if not p.is_absolute() or len(p.parts) < 4 or os.path.realpath(p) != str(p):
        raise FailedPrecondition(f"will not remove spill directory {path}: it must be an absolute path at least three "
                                 "levels deep with no symbolic link in it", reason=Reason.PURGE_REFUSED)


def plan_purge(instance: Instance, spill_dir: Path | None = None) -> PurgePlan:
    """What :func:`purge` would do now. Asks the daemon when one runs (never starts one)."""
    from ..client import Client
    from ..sweep.ledger import Ledger
    from ..store.budget import BudgetConfig

    plan = PurgePlan(instance=instance.name, state_dir="")
    client = Client(instance, autostart=False, timeout=30.0)
    try:
        plan.daemon_pid = client.call("ping")["pid"]
    except DrumsError:
        plan.daemon_pid = None
    if plan.daemon_pid:
        try:
            plan.sessions = [s["id"] for s in client.list()]
            plan.snapshots = [{"id": s["id"], "name": s.get("name"), "size": s.get("size", 0)}
                              for s in client.snapshots()]
            store_spill = client.store().get("spill_dir")
            if spill_dir is None and store_spill:
                spill_dir = Path(store_spill)
        except DrumsError:
            pass
    elif real_dir(instance.snapshots_dir):
        plan.snapshots = [{"id": n, "name": None} for n in sorted(os.listdir(instance.snapshots_dir))
                          if not n.startswith(".")]
    if spill_dir is None:
        try:
            spill_dir = BudgetConfig.from_env(instance.state_dir, instance.name).spill_root
        except DrumsError:
            spill_dir = None
    if instance.ledger_root.is_dir():
        plan.dead_runs = [r for r in Ledger.runs(instance.ledger_root)
                          if Ledger(instance.ledger_root, r).owner_status() != "alive"]
    if os.path.lexists(instance.state_dir):
        plan.state_dir = str(instance.state_dir)
        plan.mounts = mounts_under(instance.state_dir)
        plan.state_mounted = os.path.realpath(instance.state_dir) in plan.mounts
    plan.files = [str(p) for p in _state_files(instance)
                  if os.path.lexists(p)]
    if spill_dir is not None and os.path.lexists(spill_dir):
        plan.spill_dir = str(spill_dir)
    return plan


@dataclass
class PurgeReport:
    instance: str
    daemon_stopped: bool = False
    sweep: dict | None = None
    unmounted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    host_limits: list[dict] = field(default_factory=list)  # put back: the host's last instance went

    def to_dict(self) -> dict:
        return asdict(self)


def purge(instance: Instance, plan: PurgePlan, wait: float = 60.0) -> PurgeReport:
    """Stop the instance's daemon and sessions and delete its state (see the module docstring).

    Raises FailedPrecondition (``PURGE_REFUSED``, nothing deleted) when a session or a daemon of the
    instance could not be stopped, or a path is not what Drums made (a symbolic link)."""
    from ..client import Client
    from ..sweep.ledger import Ledger
    from ..sweep.driver import sweep

    report = PurgeReport(instance=instance.name)
    if plan.spill_dir:
        _check_spill_dir(Path(plan.spill_dir))
    for p in (instance.state_root, instance.state_dir):
        if os.path.lexists(p) and not real_dir(p):
            raise FailedPrecondition(f"will not purge: {p} is not a directory (a symbolic link?)",
                                     reason=Reason.PURGE_REFUSED)
    Client(instance, autostart=False, timeout=wait).shutdown(destroy_sessions=True, wait=wait)
    report.daemon_stopped = bool(plan.daemon_pid)
    if not instance.state_root.is_dir() or not (os.path.lexists(instance.state_dir) or plan.files or plan.spill_dir):
        return report  # nothing of the instance here (and no lock file made just to take it)
    lock_path = instance.run_lock
    lock = os.open(lock_path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(f"drumsd of instance {instance.name} is still running (it holds {lock_path}): "
                                     f"it did not stop within {wait:.0f}s of being asked (still destroying "
                                     "sessions?); nothing was deleted, run the purge again",
                                     reason=Reason.PURGE_REFUSED) from None
        if instance.ledger_root.is_dir():
            result = sweep(instance.ledger_root)
            report.sweep = result.to_dict()
            left = {r: Ledger(instance.ledger_root, r).owner_status() for r in Ledger.runs(instance.ledger_root)}
            if left or result.errors or result.survivors:
                why = "; ".join(f"run {r} ({'alive' if s == 'alive' else 'kept by the sweep'})"
                                for r, s in left.items()) or "the sweep met errors"
                raise FailedPrecondition(
                    f"sessions of instance {instance.name} could not be stopped: {why}; nothing was deleted "
                    f"(see `drums --instance {instance.name} sweep` for what is left)",
                    reason=Reason.PURGE_REFUSED, detail=report.sweep)
        state_point = os.path.realpath(instance.state_dir)
        extra = [m for m in mounts_under(instance.state_dir) if m != state_point]
        if extra:
            raise FailedPrecondition(f"sessions of instance {instance.name} could not be stopped: mounts remain "
                                     f"under {instance.state_dir}: {' '.join(extra)}; nothing was deleted",
                                     reason=Reason.PURGE_REFUSED, detail={"mounts": extra})
        if plan.spill_dir and real_dir(Path(plan.spill_dir)):
            shutil.rmtree(plan.spill_dir)
            report.removed.append(plan.spill_dir)
        if unmount_state(instance):
            report.unmounted.append(state_point)
        if real_dir(instance.state_dir):
            shutil.rmtree(instance.state_dir)  # empty once unmounted; rmtree never follows a link in it
            report.removed.append(str(instance.state_dir))
        report.removed += remove_files(_state_files(instance))
        if _last_instance_on_host(instance):
            report.host_limits = kernel_budget.restore()
            if criu_cache.remove():  # CRIU's kernel-feature cache, if Drums made it (host/criu_cache.py)
                report.removed.append(str(criu_cache.KDAT))
    finally:
        os.close(lock)
    return report


def _last_instance_on_host(instance: Instance) -> bool:
    """Whether ``instance`` was the host's last: it lives in the host's state root (an instance with
    a state root of its own, a test's, says nothing of the host), no other instance has a state
    directory there, and this is host root (only it changed the host's limits)."""
    if os.geteuid() != 0 or os.path.realpath(instance.state_root) != os.path.realpath(STATE_ROOT):
        return False
    try:
        entries = os.scandir(instance.state_root)
    except FileNotFoundError:
        return True
    with entries:
        return not [e.name for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
                    and e.name != instance.name]
