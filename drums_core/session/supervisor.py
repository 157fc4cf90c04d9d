"""The Supervisor: makes sessions, checkpoints, restores and branches them, destroys them.

One per host (per instance), living inside ``drumsd``. It owns every host-global resource: slots,
display numbers, veth names and addresses, the nftables table. Every resource is recorded in the
run's ledger before it is created and forgotten only after it is gone (plan, then apply), so the
sweep can always finish what a crash left.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path


from . import cgroups, display, faults, launch, netns, netpolicy, rootfs
from ..host import bounded, criu_cache, images, linux, safepath
from ..config import (GUEST_CODE, GUEST_PYTHON, ID_BASE, ID_COUNT, SESSION_PATH, SESSION_UID,
                     SESSION_USER, X11_DIR, Instance, check_name, display_number, host_ifname, nft_table_name,
                     slot_addresses)
from ..errors import Busy, DrumsError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
from ..reasons import Reason
from .checkpointing import CheckpointOps, CheckpointFlight, wait_init_dead
from .model import Liveness, Session, SessionSpec, State, init_start_time
from .restoring import RestoreOps
from ..sweep.ledger import Ledger
from .nat import NatManager
from ..host.mounttable import mount_key
from ..host.procs import is_alive
from .processes import ProcessInfo, kill_tree_under, session_processes
from ..store.snapshots import Snapshot, SnapshotStore
from ..store.budget import BudgetConfig, StoreKeeper


EXEC_OUTPUT_LIMIT = 16 << 20  # stdout and stderr of one exec together


def _text(data: bytes) -> str:
    """Output bytes as text, as ``subprocess.run(text=True)`` gave it (universal newlines), never failing."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")

log = logging.getLogger("drums.supervisor")


class _Marks:
    """Phase timings, cumulative seconds since the operation began."""

    def __init__(self, timings: dict, t0: float) -> None:
        self.timings, self.t0 = timings, t0

    def __call__(self, phase: str) -> None:
        self.timings[phase] = round(time.monotonic() - self.t0, 4)


def _hex_id() -> str:
    return uuid.uuid4().hex[:12]


def _exists_in(root_fd: int, rel: str) -> bool:
    """Whether ``rel`` names something inside the root of ``root_fd`` (symlinks resolved within it)."""
    try:
        os.close(safepath.openat2(root_fd, rel.lstrip("/"), os.O_PATH, resolve=safepath.RESOLVE_IN_ROOT))
        return True
    except OSError:
        return False

class Supervisor(CheckpointOps, RestoreOps):
    """One per instance: owns every host-global resource; see the module's docstring."""

    def __init__(self, instance: Instance, run: str | None = None, liveness_delay: float = 3.0) -> None:
        self.instance = instance
        self.run = run or f"{instance.name}-{_hex_id()}"
        self.tag = f"drums:{self.run}"
        self.liveness_delay = liveness_delay
        self._lock = threading.RLock()
        self.sessions: dict[str, Session] = {}
        self._slots_in_use: set[int] = set()
        self._retry_streak: dict[str, int] = {}
        self._checkpoints: dict[str, CheckpointFlight] = {}
        self.counters = {"dumps": 0, "restores": 0}
        self.init_pids_seen: set[int] = set()  # the reaper reaps these at once (orphaned to us)
        self._code_layer: Path | None = None
        instance.state_dir.mkdir(parents=True, exist_ok=True)
        self.mounted_state = rootfs.ensure_tmpfs(instance.state_dir)
        for d in (instance.sessions_dir, instance.snapshots_dir, instance.images_dir, instance.ledger_root):
            d.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger.create(instance.ledger_root, self.run)
        self.layer_aliases = instance.state_dir / "L"  # short names of checkpoint layers (rootfs.layer_alias)
        rootfs.prune_aliases(self.layer_aliases)
        budget = BudgetConfig.from_env(instance.state_dir, instance.name)
        self.store = SnapshotStore(instance.snapshots_dir, spill_root=budget.spill_root)
        self.keeper = StoreKeeper(self.store, budget, self._stacked_on, instance.state_dir / "store-journal.jsonl")
        self.cgroups = cgroups.detect()
        # CRIU's kernel-feature cache of this boot, before any CRIU call (host/criu_cache.py): also
        # for a supervisor in a benchmark's process, and after a reboot that kept a disk /run's file
        self.criu_cache = criu_cache.ensure()
        log.info("criu kdat cache: %s", self.criu_cache)
        threading.Thread(target=self._watch_oom, name="oom-watch", daemon=True).start()
        self.nft_table = nft_table_name(self.run)
        self.ledger.record("nft", f"inet/{self.nft_table}", family="inet", name=self.nft_table)
        netns.create_nft_table(self.nft_table, [host_ifname(slot) for slot in
                                                range(instance.slot_base, instance.slot_base + instance.slot_count)])
        self.nat = NatManager(self.ledger, self.nft_table)

    # ----------------------------------------------------------------- helpers
    def _alloc_slot(self) -> int:
        with self._lock:
            for slot in range(self.instance.slot_base, self.instance.slot_base + self.instance.slot_count):
                if slot not in self._slots_in_use:
                    self._slots_in_use.add(slot)
                    return slot
        raise Unavailable(f"all {self.instance.slot_count} session slots are in use", reason=Reason.NO_SLOT)

    def _free_slot(self, slot: int) -> None:
        with self._lock:
            self._slots_in_use.discard(slot)

    def image_lowers(self, image: str) -> tuple[list[Path], str]:
        """The lowest layers of a session of ``image`` (the Drums code layer over the image's root
        filesystem) and the image's content hash. NotFound/FailedPrecondition say how to build it."""
        check_name(image, "image")
        manifest = images.check_usable(image)
        with self._lock:
            if self._code_layer is None:
                self._code_layer = rootfs.build_code_layer(self.instance.images_dir, ID_BASE)
        return [self._code_layer, images.rootfs_path(image)], manifest.content_hash

    def check_snapshot_image(self, snap: Snapshot) -> None:
        """A snapshot restores only over the image version (and id base) it was made on."""
        if snap.image_hash is None:
            raise FailedPrecondition(f"snapshot {snap.id} was made over the host's root filesystem, before Drums "
                                     "built its own desktop images; it cannot be restored: re-create it",
                                     reason=Reason.SNAPSHOT_PREDATES_IMAGES)
        manifest = images.get(snap.image)
        if manifest.content_hash != snap.image_hash:
            raise FailedPrecondition(
                f"snapshot {snap.id} was made on image {snap.image!r} {snap.image_hash[:12]}, but this host has "
                f"{snap.image!r} {manifest.content_hash[:12]}: build that version here (`drums image build "
                f"{snap.image}` with the spec it was made from) or re-create the snapshot",
                reason=Reason.IMAGE_MISMATCH,
                detail={"image": snap.image, "want": snap.image_hash, "have": manifest.content_hash})
        if snap.id_base != ID_BASE:
            raise FailedPrecondition(f"snapshot {snap.id} was made with id base {snap.id_base}, this host uses "
                                     f"{ID_BASE} (DRUMS_ID_BASE)", reason=Reason.ID_BASE_MISMATCH)

    def _stacked_on(self) -> tuple[set, set]:
        """What live sessions stack on: their layers' paths, and the snapshots they were restored from."""
        sessions = list(self.sessions.values())
        return {layer for s in sessions for layer in s.layers}, {s.snapshot for s in sessions if s.snapshot}

    def get(self, sid: str) -> Session:
        if not isinstance(sid, str):
            raise InvalidArgument(f"invalid session id {sid!r}", reason=Reason.INVALID_NAME)
        s = self.sessions.get(sid)
        if s is None:
            raise NotFound(f"no session {sid!r}", reason=Reason.SESSION_NOT_FOUND)
        return s

    def _usable(self, sid: str) -> Session:
        s = self.get(sid)
        if s.state == State.BROKEN:
            raise Internal(f"session {sid} is broken: {s.broken}", reason=Reason.SESSION_BROKEN, detail=s.broken)
        return s

    def _new_session(self, spec: SessionSpec, slot: int, sid: str | None = None) -> Session:
        sid = sid or _hex_id()
        host_addr, guest_addr = slot_addresses(slot)
        sdir = self.instance.sessions_dir / sid
        return Session(id=sid, slot=slot, state=State.STARTING, spec=spec, dir=str(sdir), root=str(sdir / "root"),
                       ifname=host_ifname(slot), host_address=host_addr, address=guest_addr,
                       display=display_number(slot), hostname=f"drums-{sid}", machine_id=uuid.uuid4().hex,
                       created=time.time())

    def _record_session(self, s: Session) -> None:
        self.ledger.record("session", s.id, dir=s.dir, root=s.root, slot=s.slot, ifname=s.ifname,
                           init_pid=s.init_pid, starttime=s.init_start, state=s.state.value,
                           snapshot=s.snapshot, spec=asdict(s.spec), address=s.address, hostname=s.hostname,
                           layers=s.layers, display=s.display, machine_id=s.machine_id, image_hash=s.image_hash)

    def _set_state(self, s: Session, state: State) -> None:
        s.state = state
        self.ledger.update("session", s.id, state=state.value, init_pid=s.init_pid, starttime=s.init_start,
                           layers=s.layers, snapshot=s.snapshot)

    def _init_spec(self, s: Session) -> dict:
        return {"uid": SESSION_UID, "user": SESSION_USER, "home": f"/home/{SESSION_USER}", "path": SESSION_PATH,
                "screen": list(s.spec.screen), "window_manager": s.spec.window_manager, "desktop": s.spec.desktop,
                "dbus": s.spec.dbus,
                "system_bus": s.spec.system_bus, "accessibility": s.spec.accessibility, "env": s.spec.env,
                "programs": s.spec.programs, "session": s.id}

    def _prepare_dirs(self, s: Session) -> tuple[Path, Path, Path]:
        """The session's directory; its writable layer (upper and work) on a tmpfs of its own, sized
        ``writable_size``: a session that fills it gets ENOSPC, and the instance's store never fills from it."""
        sdir = Path(s.dir)
        self.ledger.record("dir", s.dir, session=s.id)
        for sub in ("rw", "root", "criu"):
            (sdir / sub).mkdir(parents=True, exist_ok=True)
        rw = sdir / "rw"
        self.ledger.record("mount", str(rw), session=s.id)
        linux.mount("tmpfs", str(rw), "tmpfs", linux.MS_NOSUID, f"size={s.spec.writable_size},mode=700")
        linux.mount("none", str(rw), None, linux.MS_PRIVATE)
        for sub in ("upper", "work"):
            (rw / sub).mkdir()
        return rw / "upper", rw / "work", sdir / "root"

    def _make_cgroup(self, s: Session) -> None:
        """The session's cgroup with its limits (recorded first): launch and restore start the session in it."""
        cg = self.cgroups.plan(self.run, s.id)
        self.ledger.record("cgroup", cg.name, **cg.ledger_data())
        s.cgroup = self.cgroups.create(self.run, s.id, s.spec.cgroup_limits())

    def _remove_cgroup(self, s: Session) -> int:
        """Best effort: a group that cannot go yet (a task in D state) keeps its ledger entry for the
        sweep, and the rest of the teardown goes on."""
        if s.cgroup is None:
            return 0
        try:
            killed = s.cgroup.kill_all()
            s.cgroup.remove()
        except DrumsError as exc:
            log.error("cgroup %s of %s not removed (left to the sweep): %s", s.cgroup.name, s.id, exc.message)
            return 0
        self.ledger.forget("cgroup", s.cgroup.name)
        return killed

    def _watch_oom(self) -> None:
        """A session whose cgroup saw an OOM kill is killed whole and marked broken (reason ``OOM: ...``)."""
        while True:
            time.sleep(0.5)
            try:
                self._check_ooms()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad read
                log.exception("OOM watcher")

    def _check_ooms(self) -> None:
        for s in list(self.sessions.values()):
            if s.cgroup is None or s.state not in (State.RUNNING, State.RESTORING, State.STARTING):
                continue
            try:
                kills = s.cgroup.oom_kills()
            except DrumsError:
                continue
            if kills > s.oom_kills:
                s.oom_kills = kills
                limit = s.spec.cgroup_limits().memory_max
                self._mark_broken(s, f"OOM: the session went over its memory limit ({limit >> 20} MiB); "
                                     f"the kernel killed a process and Drums stopped the session")
                try:
                    s.cgroup.kill_all()
                except DrumsError:
                    log.exception("could not stop session %s after its OOM", s.id)

    def _mount_root(self, s: Session, lowers: list) -> None:
        """Mount the overlay under the image's use lock (a rebuild or removal cannot swap the image
        out meanwhile), and only over the image version the session or snapshot expects."""
        upper, work, root = Path(s.dir) / "rw/upper", Path(s.dir) / "rw/work", Path(s.root)
        with images.mounting(s.spec.image) as rootfs_dir:
            have = images.get(s.spec.image).content_hash
            if s.image_hash and have != s.image_hash:
                raise Unavailable(f"image {s.spec.image!r} changed to {have[:12]} while {s.id} was being made",
                                  reason=Reason.IMAGE_CHANGED)
            if Path(lowers[-1]) != Path(rootfs_dir):
                raise Internal(f"image layer {lowers[-1]} is not the image's rootfs {rootfs_dir}",
                               reason=Reason.BAD_LAYERS)
            snapshots = str(self.instance.snapshots_dir) + "/"
            lowers = [rootfs.layer_alias(self.layer_aliases, p) if str(p).startswith(snapshots) else p
                      for p in lowers]
            self.ledger.record("mount", s.root, session=s.id)
            rootfs.mount_overlay(lowers, upper, work, root)
        # a copy of this mount in a namespace cloned later is then known as a copy, not a holder
        self.ledger.update("mount", s.root, mount_key=mount_key(s.root))

    def _x11_link(self, s: Session) -> None:
        """Route the daemon's X connections to the session's socket (resolved safely, see
        :mod:`drums_core.session.display`). No link on the host: one through ``/proc/<pid>/root`` would follow
        a symlink the session planted at its socket's path, for any host client that used it."""
        display.register_session(s.display, s.init_pid)

    def _wire_network(self, s: Session, create: bool) -> None:
        self.ledger.record("link", s.ifname, session=s.id)
        if create:
            netns.create_veth(s.ifname, s.init_pid)
        policy = s.spec.network_policy()
        netns.configure_host_side(s.ifname, f"{s.host_address}/30".split("/")[0])
        netns.configure_guest_side(s.init_pid, s.address, s.host_address, default_route=policy.nat)
        if policy.nat:
            self.nat.attach(s.id, s.ifname, s.address, policy)

    def _alive_reason(self, s: Session) -> str | None:
        if not is_alive(s.init_pid, s.init_start):
            return f"session init (pid {s.init_pid}) is gone"
        return None

    def _wait_port(self, s: Session, port: int, timeout: float) -> None:
        import socket

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            dead = self._alive_reason(s)
            if dead:
                raise Unavailable(f"session died while starting: {dead}", reason=Reason.SESSION_DIED)
            try:
                with socket.create_connection((s.address, port), timeout=0.5):
                    return
            except OSError as exc:
                last = exc
                time.sleep(0.02)
        raise Unavailable(f"guest port {port} not answering after {timeout}s: {last}", reason=Reason.NOT_READY)

    # ----------------------------------------------------------------- create
    def create(self, spec: dict | SessionSpec | None = None) -> Session:
        """Boot a cold session. Unavailable on any failure, after a full rollback."""
        spec = spec if isinstance(spec, SessionSpec) else SessionSpec.from_dict(spec)
        policy = netpolicy.resolve_for_host(spec.network_policy())
        spec.network = policy.to_spec()
        lowers, image_hash = self.image_lowers(spec.image)
        slot = self._alloc_slot()
        s = self._new_session(spec, slot)
        s.image_hash = image_hash
        t0 = time.monotonic()
        with self._lock:
            self.sessions[s.id] = s
        try:
            mark = _Marks(s.timings, t0)
            self._record_session(s)
            self._prepare_dirs(s)
            self._make_cgroup(s)
            self._mount_root(s, lowers)
            self._check_programs(s)
            rootfs.write_session_files(Path(s.root), s.hostname, s.machine_id, ID_BASE,
                                       json.dumps(self._init_spec(s)))
            if policy.nat:
                netpolicy.write_resolv_conf(s.root, policy, (ID_BASE, ID_BASE))
            mark("root")
            netns.wait_link_gone(s.ifname)
            mark("slot_free")
            s.init_pid = self._launch(s)
            self.init_pids_seen.add(s.init_pid)
            s.init_start = init_start_time(s.init_pid)
            self.ledger.record("process", s.id, pid=s.init_pid, starttime=s.init_start, tag=self.tag)
            mark("launch")
            self._wire_network(s, create=True)
            self._x11_link(s)
            mark("network")
            display.wait_ready(s.display, spec.expect_window, spec.ready_timeout, alive=lambda: self._alive_reason(s),
                               require_window=spec.expect_window is not None)
            mark("display")
            drawn = float(spec.desktop.get("ready_nonblank", 0.0)) if spec.desktop else 0.0
            if drawn:  # a desktop session's window manager is up before it has drawn anything
                display.wait_ready(s.display, None, spec.ready_timeout, min_nonblank=drawn,
                                   alive=lambda: self._alive_reason(s))
                mark("desktop_drawn")
            if spec.wait_port:
                self._wait_port(s, spec.wait_port, spec.ready_timeout)
                mark("port")
            s.timings["ready"] = time.monotonic() - t0
            s.liveness = Liveness.OK
            self._set_state(s, State.RUNNING)
            log.info("session %s up in %.2fs at %s (run %s)", s.id, s.timings["ready"], s.address, self.run)
            return s
        except BaseException as exc:
            self._teardown(s)
            if isinstance(exc, FailedPrecondition):  # the spec cannot start here: trying again would not help
                raise FailedPrecondition(f"session start failed: {exc.message}", reason=exc.reason,
                                         detail=exc.detail) from exc
            if isinstance(exc, DrumsError):
                raise Unavailable(f"session start failed: {exc.message}", reason=exc.reason, detail=exc.detail) from exc
            if isinstance(exc, (OSError, subprocess.SubprocessError, ValueError)):
                raise Unavailable(f"session start failed: {exc}", reason=Reason.START_FAILED) from exc
            raise

    def _check_programs(self, s: Session) -> None:
        """A session starts only from an image that has every program its spec names (found as the
        session init finds it: a path, or a name on the session's PATH, resolved inside the session's
        root, whose /bin is a symlink to usr/bin): else it is not made, with a reason naming the program
        (FailedPrecondition ``DESKTOP_MISSING`` for the desktop session, ``PROGRAM_MISSING`` otherwise),
        instead of a session init that died starting it."""
        wanted: list[tuple[str, str, Reason]] = []  # (program, what it is, reason)
        if s.spec.desktop:
            wanted.append((s.spec.desktop["argv"][0], f"the desktop {s.spec.desktop['name']!r}",
                           Reason.DESKTOP_MISSING))
        elif s.spec.window_manager:
            wanted.append((s.spec.window_manager, "the window manager", Reason.PROGRAM_MISSING))
        for prog in s.spec.programs:
            wanted.append((prog["argv"][0], f"the program {prog['name']!r}", Reason.PROGRAM_MISSING))
        with safepath.root_fd(s.root) as rfd:
            for prog, what, reason in wanted:
                rels = [prog] if "/" in prog else [f"{d}/{prog}" for d in SESSION_PATH.split(":")]
                if not any(_exists_in(rfd, rel) for rel in rels):
                    raise FailedPrecondition(f"image {s.spec.image!r} has no {prog!r}: {what} cannot start there "
                                             "(build the image with it, or name a program it has)", reason=reason,
                                             detail={"program": prog, "image": s.spec.image})

    def _launch(self, s: Session) -> int:
        spec = {"root": s.root, "uid": SESSION_UID, "hostname": s.hostname, "tag": self.tag, "session": s.id,
                "python": GUEST_PYTHON, "path": SESSION_PATH, "pythonpath": GUEST_CODE,
                "id_base": ID_BASE, "id_count": ID_COUNT, "sizes": s.spec.sizes()}
        launch_file = Path(s.dir) / "launch.json"
        launch_file.write_text(json.dumps(spec))
        launch.prepare_root(s.root, ID_BASE)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = here  # the launcher is the host's code (it runs as host root, before the pivot)
        paths = s.cgroup.paths if s.cgroup else []
        out = subprocess.run([sys.executable, "-m", "drums_core.session.launch", str(launch_file)], capture_output=True,
                             text=True, timeout=30, env=env, cwd="/", preexec_fn=lambda: cgroups.enter(paths))
        if out.returncode != 0:
            raise Unavailable(f"session launcher failed: {out.stderr.strip()[-2000:]}", reason=Reason.LAUNCH_FAILED)
        return int(out.stdout.strip().splitlines()[-1])

    # ----------------------------------------------------------------- teardown
    def _teardown(self, s: Session, from_destroy: bool = False) -> dict:
        """Remove everything a session holds, forgetting each resource once it is gone."""
        counts = {"processes": 0, "mounts": 0, "links": 0}
        if s.init_pid and is_alive(s.init_pid, s.init_start):
            try:
                os.kill(s.init_pid, signal.SIGKILL)
                counts["processes"] += 1
            except ProcessLookupError:
                pass
            if from_destroy:
                faults.hit("destroy-after-kill")
        if s.init_pid:
            wait_init_dead(s, timeout=10)
        counts["processes"] += kill_tree_under(s.dir)
        if from_destroy:
            faults.hit("destroy-before-cgroup-remove")
        counts["processes"] += self._remove_cgroup(s)
        link = X11_DIR / f"X{s.display}"
        display.unregister_session(s.display)
        if self.ledger.get("x11link", str(link)):
            if link.is_symlink():
                link.unlink()
            self.ledger.forget("x11link", str(link))
        if Path(s.dir).exists():
            counts["mounts"] += rootfs.unmount_tree(Path(s.dir))
        self.ledger.forget("mount", s.root)
        self.ledger.forget("mount", str(Path(s.dir) / "rw"))
        if from_destroy:
            faults.hit("destroy-after-unmount")
        if self.ledger.get("link", s.ifname):
            try:
                netns.wait_link_gone(s.ifname, timeout=3)
            except Unavailable:
                netns.delete_link(s.ifname)
                netns.wait_link_gone(s.ifname, timeout=5)
                counts["links"] += 1
            self.ledger.forget("link", s.ifname)
        policy = s.spec.network_policy()
        rules_gone = not policy.nat or self.nat.detach(s.id, s.ifname, s.address, policy)
        if s.init_pid:
            self.ledger.forget("process", s.id)
        if Path(s.dir).exists():
            shutil.rmtree(s.dir, ignore_errors=True)
        self.ledger.forget("dir", s.dir)
        self.ledger.forget("session", s.id)
        with self._lock:
            self.sessions.pop(s.id, None)
        if rules_gone:
            self._free_slot(s.slot)
        else:
            log.error("slot %d stays unused: the nat rules of %s on %s could not be removed", s.slot, s.id, s.ifname)
        return counts

    def destroy(self, sid: str) -> dict:
        s = self.get(sid)
        if not s.lock.acquire(timeout=30):
            raise Busy(f"session {sid} is busy", reason=Reason.SESSION_BUSY)
        try:
            s.state = State.STOPPING
            self.ledger.update("session", s.id, state=State.STOPPING.value)
            return self._teardown(s, from_destroy=True)
        finally:
            s.lock.release()

    # ----------------------------------------------------------------- checkpoint
    def _mark_broken(self, s: Session, reason: str) -> None:
        s.broken = reason
        s.liveness = Liveness.FAILED
        s.state = State.BROKEN
        try:
            self.ledger.update("session", s.id, state=State.BROKEN.value, broken=reason)
        except Exception:  # noqa: BLE001 - the in-memory mark is what callers see
            log.exception("could not record broken state of %s", s.id)
        log.error("session %s broken: %s", s.id, reason)

    # ----------------------------------------------------------------- in-session access
    def exec(self, sid: str, argv: list[str], user: str | None = None, timeout: float = 120.0,
             input: str | None = None) -> dict:
        s = self._usable(sid)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgument("exec needs a non-empty list of strings", reason=Reason.BAD_COMMAND)
        env = {"PATH": SESSION_PATH, "LANG": "C.UTF-8", "DISPLAY": ":0"}
        if user not in (None, "root"):
            if user != SESSION_USER:
                raise InvalidArgument(f"unknown user {user!r}", reason=Reason.BAD_USER)
            uid, cwd = SESSION_UID, f"/home/{user}"
            env.update({"HOME": cwd, "USER": user, "LOGNAME": user, "XDG_RUNTIME_DIR": f"/run/user/{SESSION_UID}",
                        "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{SESSION_UID}/bus"})
        else:
            uid, cwd = 0, "/"
            env.update({"HOME": "/root", "USER": "root"})
        # drums_core.session.enter: host code that enters the session and hardens itself before it execs anything
        # of the session's; the daemon's own environment is not passed on
        spec = {"pid": s.init_pid, "uid": uid, "cwd": cwd, "env": env, "argv": argv,
                "cgroup": s.cgroup.paths if s.cgroup else []}
        cmd = [sys.executable, "-m", "drums_core.session.enter", json.dumps(spec)]
        host_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                    "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        try:
            # stdin is always a pipe (empty without input), never the daemon's own: a process the command
            # leaves running would otherwise hold a host file, and the session could not be checkpointed.
            # What the session prints is read within bounds (EXEC_OUTPUT_LIMIT bytes, else
            # SESSION_REPLY_TOO_LARGE and the command is killed).
            out = bounded.run(cmd, limit=EXEC_OUTPUT_LIMIT, timeout=timeout, input=(input or "").encode(),
                              env=host_env, cwd="/", what=f"output of exec in {sid}")
        except Unavailable as exc:
            if exc.reason == bounded.TIMEOUT:
                raise Unavailable(f"command timed out after {timeout}s", reason=Reason.EXEC_TIMEOUT) from exc
            raise
        return {"returncode": out.returncode, "stdout": _text(out.stdout), "stderr": _text(out.stderr)}

    def screenshot(self, sid: str) -> bytes:
        s = self._usable(sid)
        with display.opened(s.display) as d:
            return display.png(display.grab(d))

    def windows(self, sid: str) -> list[dict]:
        s = self._usable(sid)
        with display.opened(s.display) as d:
            return [asdict(w) for w in display.windows(d)]

    def processes(self, sid: str) -> list[ProcessInfo]:
        return session_processes(self.get(sid).init_pid)

    def memory(self, sid: str) -> dict:
        from .processes import pss_kib

        procs = self.processes(sid)
        return {"pss_kib": sum(pss_kib(p.pid) for p in procs), "processes": len(procs)}

    def list_sessions(self) -> list[dict]:
        return [s.public() for s in list(self.sessions.values())]

    def shutdown(self, destroy_sessions: bool = False) -> None:
        if destroy_sessions:
            for sid in list(self.sessions):
                try:
                    self.destroy(sid)
                except DrumsError:
                    log.exception("destroy of %s at shutdown failed", sid)
            netns.delete_nft_table(self.nft_table)
            self.ledger.forget("nft", f"inet/{self.nft_table}")
            self.ledger.remove_if_empty()
