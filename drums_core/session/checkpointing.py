"""Checkpoint, the supervisor's half that dumps a session into a snapshot: stage (dump, move images,
freeze the upper), publish, commit; with ``leave_running`` the session goes on from the committed
snapshot. A mixin of :class:`drums_core.session.supervisor.Supervisor`, whose state it uses."""
from __future__ import annotations

import logging
import os
import uuid
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path

from . import cgroups, criu, display, faults, netns, netpolicy, watched_dirs
from ..config import ID_BASE, check_name
from ..errors import Busy, DrumsError, FailedPrecondition, Internal, NotFound, Unavailable
from ..reasons import Reason
from ..host import procs
from ..host.procs import boot_id, is_alive
from ..store.snapshots import Snapshot, copy_layer
from .model import Session, State

log = logging.getLogger("drums.supervisor")


class CheckpointFlight:
    """A checkpoint in progress: a retry with the same snapshot id waits for it instead of dumping again."""

    def __init__(self, params: dict) -> None:
        self.params = params
        self._event = threading.Event()
        self._result: Snapshot | None = None
        self._error: BaseException | None = None

    def done(self, snap: Snapshot) -> None:
        self._result = snap
        self._event.set()

    def fail(self, exc: BaseException) -> None:
        if not self._event.is_set():
            self._error = exc
            self._event.set()

    def wait(self) -> Snapshot:
        self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result



def wait_init_dead(s: Session, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until the session's init, pinned by its start time, is gone."""
    handle = procs.open_handle(s.init_pid, s.init_start)
    if handle is not None:
        try:
            procs.wait_dead([handle], timeout)
        finally:
            handle.close()


def _mapped_windows(s: Session) -> list[tuple[int, str]]:
    """The X ids and titles of the session's mapped windows (a readiness hint for its restores; []
    if unknown)."""
    try:
        with display.opened(s.display) as d:  # closed once the server let go of its end: see display
            return [(w.id, w.title) for w in display.windows(d) if w.mapped and w.title]
    except Exception:  # noqa: BLE001 - window titles are a readiness hint only
        return []


class CheckpointOps:
    """``Supervisor.checkpoint`` and its steps."""

    def checkpoint(self, sid: str, name: str | None = None, snapshot_id: str | None = None,
                   leave_running: bool = False, scope: str | None = None, cache: bool = False) -> Snapshot:
        """CRIU-dump the session and freeze its upper into a layer; idempotent on (session, snapshot id).

        ``cache``: the caller can make this state again, so the store may evict it when nothing uses
        it (see :mod:`drums_core.store.budget`); otherwise it is pinned (never evicted, maybe spilled).
        The snapshot's ``store_report`` lists what was evicted or spilled to make room for it."""
        if name is not None:
            check_name(name, "snapshot name")
        if snapshot_id is not None:
            check_name(snapshot_id, "snapshot id")
        params = {"session": sid, "name": name, "leave_running": bool(leave_running), "scope": scope or sid}
        if cache:
            params["retention"] = "cache"
        snap_id = snapshot_id or uuid.uuid4().hex
        existing = self._existing_checkpoint(snap_id, params)
        if existing is not None:
            return existing
        with self._lock:
            flight = self._checkpoints.get(snap_id)
            mine = flight is None
            if mine:
                flight = self._checkpoints[snap_id] = CheckpointFlight(params)
        if not mine:
            if flight.params != params:
                raise FailedPrecondition(f"snapshot id {snap_id} is being made with other parameters",
                                         reason=Reason.SNAPSHOT_ID_CONFLICT)
            return flight.wait()
        try:
            s = self._usable(sid)
            if not s.lock.acquire(blocking=False):
                raise Busy(f"session {sid} is busy", reason=Reason.SESSION_BUSY)
            try:
                existing = self._existing_checkpoint(snap_id, params)
                if existing is not None:
                    snap = existing
                else:
                    with self.keeper.hold(snap_id, must_exist=False):
                        try:
                            snap = self._checkpoint_locked(s, snap_id, name, params, leave_running)
                        finally:
                            moved = self.keeper.release(snap_id)
                        moved += self.keeper.settle(snap_id, session=s.id)
                    snap.store_report = {"actions": moved, "budget": self.keeper.config.budget}
            finally:
                s.lock.release()
            flight.done(snap)
            return snap
        except BaseException as exc:
            flight.fail(exc)
            raise
        finally:
            with self._lock:
                self._checkpoints.pop(snap_id, None)

    @staticmethod
    def _warm_watched_dirs(s: Session) -> None:
        """Before each dump attempt: the directories the session's inotify watches point at are back
        in the dentry cache, so CRIU finds their handles (:mod:`.watched_dirs`)."""
        report = watched_dirs.warm(s.init_pid)
        if report["missing"]:
            log.info("session %s: %d watched directories looked up again before the dump (%s)", s.id,
                     report["found"], report)

    def _check_store_room(self, s: Session, snap_id: str) -> None:
        """Make room in the instance's store for a checkpoint's images and layer (its session's anonymous
        and shared memory plus what its writable layer occupies: blocks and inodes, as the kernel counts
        them, never file sizes), evicting or spilling what nothing uses; else Unavailable STORE_FULL, or
        SNAPSHOT_TOO_LARGE over the per-checkpoint cap, with nothing touched (:mod:`drums_core.store.budget`)."""
        from ..store.budget import MARGIN
        from ..store.usage import fs_usage

        upper = fs_usage(Path(s.dir) / "rw")
        memory = self._dump_estimate(s)
        # the upper's pages a session wrote are charged to its cgroup as shmem too: count them once
        shmem = max(0, memory["shmem"] - upper.blocks)
        need = upper.charge + memory["anon"] + shmem
        parts = {"upper_blocks": upper.blocks, "upper_inodes": upper.inodes, "anon": memory["anon"],
                 "shmem": memory["shmem"], "shmem_counted": shmem}
        log.debug("checkpoint %s of %s may add %d MiB: %s", snap_id, s.id, need >> 20, parts)
        self.keeper.make_room(need, snap_id, parts, session=s.id)
        st = os.statvfs(self.instance.state_dir)
        free = st.f_bavail * st.f_frsize
        if need + MARGIN > free:
            raise Unavailable(f"the state store has {free >> 20} MiB free; a checkpoint of {s.id} may need "
                              f"{need >> 20} MiB", reason=Reason.STORE_FULL, detail={"free": free, "need": need})

    @staticmethod
    def _dump_estimate(s: Session) -> dict:
        """What CRIU will write for the session: its anonymous and shared (tmpfs, shm) memory."""
        if s.cgroup is None:
            return {"anon": 0, "shmem": 0}
        try:
            stat = cgroups.parse_keyed(Path(s.cgroup._dir("memory"), "memory.stat").read_text())
        except (OSError, DrumsError):
            return {"anon": s.cgroup.memory_current(), "shmem": 0}
        if s.cgroup.driver == "v2":
            return {"anon": stat.get("anon", 0), "shmem": stat.get("shmem", 0)}
        return {"anon": stat.get("total_rss", 0), "shmem": stat.get("total_shmem", 0)}

    def _existing_checkpoint(self, snap_id: str, params: dict) -> Snapshot | None:
        try:
            snap = self.store.get(snap_id, committed_only=False)
        except NotFound:
            return None
        if snap.params != params:
            raise FailedPrecondition(f"snapshot id {snap_id} exists with other parameters {snap.params}",
                                     reason=Reason.SNAPSHOT_ID_CONFLICT)
        if snap.boot_id != boot_id():
            raise FailedPrecondition(f"snapshot {snap_id} is from another boot", reason=Reason.SNAPSHOT_OTHER_BOOT)
        if snap.state == "published":
            snap = self.store.commit(snap_id)
        return snap

    def _checkpoint_locked(self, s: Session, snap_id: str, name: str | None, params: dict,
                           leave_running: bool) -> Snapshot:
        """stage (dump, move images, freeze the upper) -> publish (rename) -> commit (record).

        Without ``leave_running`` CRIU ends the tasks and the session's upper becomes the snapshot's
        layer. With it the desktop never stops: CRIU leaves the tasks running, and at its post-dump
        point (images written, tasks still frozen) the upper is copied into the snapshot's layer, so
        files and memory are of the same instant; the session goes on on its own upper and layers."""
        t0 = time.monotonic()
        self._check_store_room(s, snap_id)
        self._set_state(s, State.CHECKPOINTING)
        staging = self.store.staging(snap_id)
        self.ledger.record("op", f"checkpoint/{snap_id}", session=s.id, snapshot=snap_id, staging=str(staging))
        # swept unless it holds a manifest (then the next daemon publishes it)
        self.ledger.record("snapshot", snap_id, dir=str(staging), session=s.id)
        faults.hit("checkpoint-before-staging")
        (staging / "dump").mkdir(parents=True, exist_ok=True)
        procs = self._process_ages(s)
        mapped = _mapped_windows(s)
        policy = s.spec.network_policy()
        with self.nat.pinned(policy if leave_running else netpolicy.NetworkPolicy()):
            if leave_running and policy.nat:
                self.nat.detach(s.id, s.ifname, s.address, policy)  # they come back with the link
            # The veth leaves before the dump: CRIU cannot re-create a veth from inside a user namespace
            # (EOPNOTSUPP), and every restore gets a fresh pair anyway.
            netns.delete_link(s.ifname)
            netns.wait_link_gone(s.ifname)
            post_dump = (lambda: self._copy_upper(s, staging)) if leave_running else None
            try:
                res = criu.dump(s.init_pid, staging / "dump", staging, leave_running=leave_running,
                                post_dump=post_dump, before_attempt=lambda: self._warm_watched_dirs(s),
                                # CPU only: memory would charge the images' tmpfs pages to the session
                                cgroup_paths=[s.cgroup.dirs["cpu"]] if s.cgroup and "cpu" in s.cgroup.dirs else None)
            except Unavailable as exc:
                err = self._dump_failed(s, snap_id, staging, exc)
                if err is exc:
                    raise
                raise err from exc
            with self._lock:
                self.counters["dumps"] += 1
            layers = [str(self.store.path(snap_id) / "layer")] + list(s.layers)
            snap = Snapshot(id=snap_id, name=name, scope=params["scope"], session=s.id, image=s.spec.image,
                            layers=layers, parent=s.snapshot, created=time.time(), boot_id=boot_id(), size=0,
                            params=params, processes=procs, windows=[t for _, t in mapped],
                            window_ids=[i for i, _ in mapped], spec=asdict(s.spec),
                            dump_seconds=res.seconds, image_hash=s.image_hash, id_base=ID_BASE,
                            retention=params.get("retention", "pinned"))
            # leave-running: the layer is in the staging directory already; finish() keeps the root
            self.store.mark_dumped(snap, upper=str(Path(s.dir) / "rw/upper"), root=s.root)
            faults.hit("checkpoint-after-dump")
            rewired: Exception | None = None
            if leave_running:
                try:
                    faults.fail("checkpoint-rewire")
                    self._wire_network(s, create=True)
                except Exception as wire:  # noqa: BLE001 - the snapshot is still committed below
                    rewired = wire
            else:
                wait_init_dead(s, timeout=10)
            snap = self.store.finish(snap_id)
            self.ledger.forget("snapshot", snap_id)
            if not leave_running:
                self.ledger.forget("mount", s.root)
            self.ledger.forget("op", f"checkpoint/{snap_id}")
            faults.hit("checkpoint-committed")
            log.info("checkpoint %s of %s: dump %.3fs, %d MiB%s", snap_id, s.id, res.seconds, snap.size >> 20,
                     ", the desktop runs on" if leave_running else "")
            if not leave_running:
                self._teardown(s)
            elif rewired is not None:
                self._mark_broken(s, f"checkpoint {snap.id} is committed, but the session's network could not "
                                     f"be put back: {rewired}")
                raise Internal(f"checkpoint {snap.id} of {s.id} is committed, but the session's network could "
                               f"not be put back: {rewired}", reason=Reason.CHECKPOINT_REWIRE_FAILED,
                               detail={"snapshot": snap.id, "network": str(rewired)}) from rewired
            else:
                self._set_state(s, State.RUNNING)
                s.timings["checkpoint"] = time.monotonic() - t0
        return snap

    def _copy_upper(self, s: Session, staging: Path) -> None:
        """The session's writable layer as it is now (its tasks are frozen) into ``staging/layer``."""
        faults.hit("checkpoint-mid-copy")
        tmp = staging / "layer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        copy_layer(Path(s.dir) / "rw/upper", tmp)
        os.rename(tmp, staging / "layer")

    def _dump_failed(self, s: Session, snap_id: str, staging: Path, exc: Unavailable) -> DrumsError:
        """A dump failed: nothing of the snapshot stays; a session still alive gets its link back."""
        shutil.rmtree(staging, ignore_errors=True)
        self.ledger.forget("snapshot", snap_id)
        self.ledger.forget("op", f"checkpoint/{snap_id}")
        log.warning("checkpoint %s of %s failed: %s", snap_id, s.id, exc)
        if is_alive(s.init_pid, s.init_start):
            try:
                faults.fail("checkpoint-rewire")
                self._wire_network(s, create=True)
            except Exception as wire:  # noqa: BLE001 - the session cannot be used without its link
                self._mark_broken(s, f"checkpoint failed ({exc.message}) and its network could not be "
                                     f"put back: {wire}")
                return Internal(f"checkpoint of {s.id} failed and its network could not be put back: "
                                f"{exc.message}; {wire}", reason=Reason.CHECKPOINT_FAILED,
                                detail={"dump": exc.detail, "network": str(wire)})
            self._set_state(s, State.RUNNING)
            return exc
        self._mark_broken(s, f"checkpoint failed and the session died: {exc.message}")
        return Internal(f"checkpoint of {s.id} failed and the session is gone: {exc.message}",
                        reason=Reason.CHECKPOINT_FAILED, detail=exc.detail)
