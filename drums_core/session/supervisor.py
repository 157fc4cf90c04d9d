"""The Supervisor: makes sessions, checkpoints, restores and branches them, destroys them.

One per host (per instance), living inside ``drumsd``. It owns every host-global resource: slots,
display numbers, veth names and addresses, the nftables table. Every resource is recorded in the
run's ledger before it is created and forgotten only after it is gone (plan, then apply), so the
sweep can always finish what a crash left.
"""
from __future__ import annotations

import enum
import json
import re
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from . import cgroups, criu, display, faults, launch, netns, netpolicy, rootfs
from ..host import images, linux
from ..config import (GUEST_CODE, GUEST_PYTHON, ID_BASE, ID_COUNT, SESSION_PATH, SESSION_UID,
                     SESSION_USER, X11_DIR, Instance, check_name, display_number, host_ifname, nft_table_name,
                     slot_addresses)
from ..errors import Busy, DrumsError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
from .restore_steps import RestoreStep, StepTrace, rolled_back
from ..sweep.ledger import Ledger
from .nat import NatManager
from ..host import procs
from ..host.mounttable import mount_key
from ..host.procs import boot_id, is_alive
from .processes import ProcessInfo, kill_tree_under, session_processes
from ..store.snapshots import Snapshot, SnapshotStore
from ..store.budget import BudgetConfig, StoreKeeper

log = logging.getLogger("drums.supervisor")

RETRY_LIMIT = 3


class Liveness(enum.StrEnum):
    """Whether a restored session's settled processes outlived the restore (see ``SETTLED_AGE``)."""

    UNCHECKED = "unchecked"
    OK = "ok"
    FAILED = "failed"


class _Background:
    """``fn()`` in a thread of its own: ``join()``, then ``result()`` returns its value or raises what it raised."""

    def __init__(self, name: str, fn) -> None:
        self._value = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
                self._error = exc

        self._thread = threading.Thread(target=run, name=name)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class State(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    RESTORING = "RESTORING"
    STOPPING = "STOPPING"
    BROKEN = "BROKEN"


def _started_by_dbus(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(1 << 16)
    except OSError:
        return False
    return b"\0DBUS_STARTER_BUS_TYPE=" in b"\0" + env


# Processes at least this old (seconds) when a session is checkpointed must still be alive a
# liveness delay after each restore; younger ones may end by themselves.
SETTLED_AGE = 3.0


@dataclass
class SessionSpec:
    """What a desktop is made of. ``programs`` are started by the session init after X and the WM."""

    image: str = "default"
    screen: tuple[int, int] = (1920, 1080)
    window_manager: str = "openbox"
    dbus: bool = True
    system_bus: bool = False  # a system D-Bus in the session (timedatectl and other system services)
    accessibility: bool = False  # the AT-SPI bus, and toolkits export their accessibility trees to it
    env: dict = field(default_factory=dict)  # over the user's environment, for every program
    programs: list[dict] = field(default_factory=list)
    wait_port: int | None = None
    reseed_path: str | None = None
    expect_window: str | None = None
    ready_timeout: float = 60.0
    tmp_size: str = "1g"
    shm_size: str = "512m"
    run_size: str = "256m"
    writable_size: str = "2g"
    limits: dict = field(default_factory=dict)  # cgroups.Limits fields: memory_max, memory_high, pids_max, cpu_weight
    network: dict = field(default_factory=lambda: {"policy": "none"})  # see drums_core.session.netpolicy

    def network_policy(self) -> netpolicy.NetworkPolicy:
        return netpolicy.NetworkPolicy.from_spec(self.network)

    def cgroup_limits(self) -> cgroups.Limits:
        return cgroups.Limits(**self.limits)

    def sizes(self) -> dict:
        return {"tmp": self.tmp_size, "shm": self.shm_size, "run": self.run_size}

    @classmethod
    def from_dict(cls, data: dict | None) -> "SessionSpec":
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidArgument(f"unknown session spec fields: {sorted(unknown)}", reason="BAD_SPEC")
        if "screen" in data:
            w, h = data["screen"]
            if not (64 <= int(w) <= 8192 and 64 <= int(h) <= 8192):
                raise InvalidArgument(f"bad screen size {data['screen']}", reason="BAD_SPEC")
            data["screen"] = (int(w), int(h))
        spec = cls(**data)
        check_name(spec.image, "image")
        for size in (spec.tmp_size, spec.shm_size, spec.run_size, spec.writable_size):
            if not isinstance(size, str) or not re.fullmatch(r"[1-9][0-9]{0,6}[kmg]", size):
                raise InvalidArgument(f"bad tmpfs size {size!r}: a number with k, m or g", reason="BAD_SPEC")
        if not isinstance(spec.env, dict) or len(spec.env) > 64 or not all(
                isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", k) and isinstance(v, str)
                and len(v) <= 4096 and "\0" not in v for k, v in spec.env.items()):
            raise InvalidArgument("bad env: at most 64 NAME=value strings (names of letters, digits and _)",
                                  reason="BAD_SPEC")
        if not isinstance(spec.limits, dict) or set(spec.limits) - set(cgroups.Limits.__dataclass_fields__):
            raise InvalidArgument(f"bad limits {spec.limits!r}: use memory_max, memory_high, pids_max, cpu_weight",
                                  reason="BAD_SPEC")
        try:
            spec.cgroup_limits()
        except InvalidArgument as exc:
            raise InvalidArgument(exc.message, reason="BAD_SPEC") from exc
        for prog in spec.programs:
            if not isinstance(prog, dict) or not isinstance(prog.get("argv"), list) or not prog.get("name"):
                raise InvalidArgument(f"bad program entry {prog!r}", reason="BAD_SPEC")
            check_name(prog["name"], "program name")
        spec.network = spec.network_policy().to_spec()
        return spec


@dataclass
class Session:
    id: str
    slot: int
    state: State
    spec: SessionSpec
    dir: str
    root: str
    ifname: str
    host_address: str
    address: str
    display: int
    hostname: str
    machine_id: str
    created: float
    init_pid: int = 0
    init_start: int = 0
    snapshot: str | None = None
    layers: list[str] = field(default_factory=list)
    broken: str | None = None
    liveness: Liveness = Liveness.UNCHECKED
    timings: dict = field(default_factory=dict)
    cgroup: cgroups.SessionCgroup | None = field(default=None, repr=False)
    oom_kills: int = 0
    image_hash: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def public(self) -> dict:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in ("lock", "cgroup")}
        d["cgroup"] = self.cgroup.name if self.cgroup else None
        d["state"] = self.state.value
        d["liveness"] = Liveness(self.liveness).value
        d["spec"] = asdict(self.spec)
        d["layers"] = list(self.layers)
        d["timings"] = dict(self.timings)
        return d


class _Flight:
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


class _Marks:
    """Phase timings, cumulative seconds since the operation began."""

    def __init__(self, timings: dict, t0: float) -> None:
        self.timings, self.t0 = timings, t0

    def __call__(self, phase: str) -> None:
        self.timings[phase] = round(time.monotonic() - self.t0, 4)


def _hex_id() -> str:
    return uuid.uuid4().hex[:12]


def _started(init_pid: int) -> int:
    """The start time of an init just launched or restored; ProcessLookupError when it is gone already."""
    start = procs.starttime(init_pid)
    if start is None:
        raise ProcessLookupError(init_pid)
    return start


def _wait_init_dead(s: Session, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until the session's init, pinned by its start time, is gone."""
    handle = procs.open_handle(s.init_pid, s.init_start)
    if handle is not None:
        try:
            procs.wait_dead([handle], timeout)
        finally:
            handle.close()


class Supervisor:
    def __init__(self, instance: Instance, run: str | None = None, liveness_delay: float = 3.0) -> None:
        self.instance = instance
        self.run = run or f"{instance.name}-{_hex_id()}"
        self.tag = f"drums:{self.run}"
        self.liveness_delay = liveness_delay
        self._lock = threading.RLock()
        self.sessions: dict[str, Session] = {}
        self._slots_in_use: set[int] = set()
        self._retry_streak: dict[str, int] = {}
        self._checkpoints: dict[str, _Flight] = {}
        self.counters = {"dumps": 0, "restores": 0}
        self.init_pids_seen: set[int] = set()  # the reaper reaps these at once (orphaned to us)
        self._code_layer: Path | None = None
        instance.state_dir.mkdir(parents=True, exist_ok=True)
        self.mounted_state = rootfs.ensure_tmpfs(instance.state_dir)
        for d in (instance.sessions_dir, instance.snapshots_dir, instance.images_dir, instance.ledger_root):
            d.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger.create(instance.ledger_root, self.run)
        budget = BudgetConfig.from_env(instance.state_dir, instance.name)
        self.store = SnapshotStore(instance.snapshots_dir, spill_root=budget.spill_root)
        self.keeper = StoreKeeper(self.store, budget, self._stacked_on, instance.state_dir / "store-journal.jsonl")
        self.cgroups = cgroups.detect()
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
        raise Unavailable(f"all {self.instance.slot_count} session slots are in use", reason="NO_SLOT")

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
                                     reason="SNAPSHOT_PREDATES_IMAGES")
        manifest = images.get(snap.image)
        if manifest.content_hash != snap.image_hash:
            raise FailedPrecondition(
                f"snapshot {snap.id} was made on image {snap.image!r} {snap.image_hash[:12]}, but this host has "
                f"{snap.image!r} {manifest.content_hash[:12]}: build that version here (`drums image build "
                f"{snap.image}` with the spec it was made from) or re-create the snapshot", reason="IMAGE_MISMATCH",
                detail={"image": snap.image, "want": snap.image_hash, "have": manifest.content_hash})
        if snap.id_base != ID_BASE:
            raise FailedPrecondition(f"snapshot {snap.id} was made with id base {snap.id_base}, this host uses "
                                     f"{ID_BASE} (DRUMS_ID_BASE)", reason="ID_BASE_MISMATCH")

    def _stacked_on(self) -> tuple[set, set]:
        """What live sessions stack on: their layers' paths, and the snapshots they were restored from."""
        sessions = list(self.sessions.values())
        return {layer for s in sessions for layer in s.layers}, {s.snapshot for s in sessions if s.snapshot}

    def get(self, sid: str) -> Session:
        if not isinstance(sid, str):
            raise InvalidArgument(f"invalid session id {sid!r}", reason="INVALID_NAME")
        s = self.sessions.get(sid)
        if s is None:
            raise NotFound(f"no session {sid!r}", reason="SESSION_NOT_FOUND")
        return s

    def _usable(self, sid: str) -> Session:
        s = self.get(sid)
        if s.state == State.BROKEN:
            raise Internal(f"session {sid} is broken: {s.broken}", reason="SESSION_BROKEN", detail=s.broken)
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
                "screen": list(s.spec.screen), "window_manager": s.spec.window_manager, "dbus": s.spec.dbus,
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
                                  reason="IMAGE_CHANGED")
            if Path(lowers[-1]) != Path(rootfs_dir):
                raise Internal(f"image layer {lowers[-1]} is not the image's rootfs {rootfs_dir}", reason="BAD_LAYERS")
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
                raise Unavailable(f"session died while starting: {dead}", reason="SESSION_DIED")
            try:
                with socket.create_connection((s.address, port), timeout=0.5):
                    return
            except OSError as exc:
                last = exc
                time.sleep(0.02)
        raise Unavailable(f"guest port {port} not answering after {timeout}s: {last}", reason="NOT_READY")

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
            rootfs.write_session_files(Path(s.root), s.hostname, s.machine_id, ID_BASE,
                                       json.dumps(self._init_spec(s)))
            if policy.nat:
                netpolicy.write_resolv_conf(s.root, policy, (ID_BASE, ID_BASE))
            mark("root")
            netns.wait_link_gone(s.ifname)
            mark("slot_free")
            s.init_pid = self._launch(s)
            self.init_pids_seen.add(s.init_pid)
            s.init_start = _started(s.init_pid)
            self.ledger.record("process", s.id, pid=s.init_pid, starttime=s.init_start, tag=self.tag)
            mark("launch")
            self._wire_network(s, create=True)
            self._x11_link(s)
            mark("network")
            display.wait_ready(s.display, spec.expect_window, spec.ready_timeout, alive=lambda: self._alive_reason(s),
                               require_window=spec.expect_window is not None)
            mark("display")
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
            if isinstance(exc, DrumsError):
                raise Unavailable(f"session start failed: {exc.message}", reason=exc.reason, detail=exc.detail) from exc
            if isinstance(exc, (OSError, subprocess.SubprocessError, ValueError)):
                raise Unavailable(f"session start failed: {exc}", reason="START_FAILED") from exc
            raise

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
            raise Unavailable(f"session launcher failed: {out.stderr.strip()[-2000:]}", reason="LAUNCH_FAILED")
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
            _wait_init_dead(s, timeout=10)
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
            raise Busy(f"session {sid} is busy", reason="SESSION_BUSY")
        try:
            s.state = State.STOPPING
            self.ledger.update("session", s.id, state=State.STOPPING.value)
            return self._teardown(s, from_destroy=True)
        finally:
            s.lock.release()

    # ----------------------------------------------------------------- checkpoint
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
                flight = self._checkpoints[snap_id] = _Flight(params)
        if not mine:
            if flight.params != params:
                raise FailedPrecondition(f"snapshot id {snap_id} is being made with other parameters",
                                         reason="SNAPSHOT_ID_CONFLICT")
            return flight.wait()
        try:
            s = self._usable(sid)
            if not s.lock.acquire(blocking=False):
                raise Busy(f"session {sid} is busy", reason="SESSION_BUSY")
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
                        moved += self.keeper.settle(snap_id)
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

    def _check_store_room(self, s: Session, snap_id: str) -> None:
        """Make room in the instance's store for a checkpoint's images and layer (its session's anonymous
        and shared memory plus its writable layer's use), evicting or spilling what nothing uses; else
        Unavailable STORE_FULL with nothing touched (see :mod:`drums_core.store.budget`)."""
        from ..store.budget import MARGIN

        rw = os.statvfs(Path(s.dir) / "rw")
        need = (rw.f_blocks - rw.f_bfree) * rw.f_frsize + self._dump_estimate(s)
        self.keeper.make_room(need, snap_id)
        st = os.statvfs(self.instance.state_dir)
        free = st.f_bavail * st.f_frsize
        if need + MARGIN > free:
            raise Unavailable(f"the state store has {free >> 20} MiB free; a checkpoint of {s.id} may need "
                              f"{need >> 20} MiB", reason="STORE_FULL", detail={"free": free, "need": need})

    @staticmethod
    def _dump_estimate(s: Session) -> int:
        """What CRIU will write for the session: its anonymous and shared (tmpfs, shm) memory."""
        if s.cgroup is None:
            return 0
        try:
            stat = cgroups.parse_keyed(Path(s.cgroup._dir("memory"), "memory.stat").read_text())
        except (OSError, DrumsError):
            return s.cgroup.memory_current()
        if s.cgroup.driver == "v2":
            return stat.get("anon", 0) + stat.get("shmem", 0)
        return stat.get("total_rss", 0) + stat.get("total_shmem", 0)

    def _existing_checkpoint(self, snap_id: str, params: dict) -> Snapshot | None:
        try:
            snap = self.store.get(snap_id, committed_only=False)
        except NotFound:
            return None
        if snap.params != params:
            raise FailedPrecondition(f"snapshot id {snap_id} exists with other parameters {snap.params}",
                                     reason="SNAPSHOT_ID_CONFLICT")
        if snap.boot_id != boot_id():
            raise FailedPrecondition(f"snapshot {snap_id} is from another boot", reason="SNAPSHOT_OTHER_BOOT")
        if snap.state == "published":
            snap = self.store.commit(snap_id)
        return snap

    def _checkpoint_locked(self, s: Session, snap_id: str, name: str | None, params: dict,
                           leave_running: bool) -> Snapshot:
        """stage (dump, move images, freeze the upper) -> publish (rename) -> commit (record)."""
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
        try:
            d = display.connect(s.display)
            try:
                titles = [w.title for w in display.windows(d) if w.mapped and w.title]
            finally:
                d.close()
        except Exception:  # noqa: BLE001 - window titles are a readiness hint only
            titles = []
        # The veth leaves before the dump: CRIU cannot re-create a veth from inside a user namespace
        # (EOPNOTSUPP), and every restore gets a fresh pair anyway.
        netns.delete_link(s.ifname)
        netns.wait_link_gone(s.ifname)
        try:
            res = criu.dump(s.init_pid, staging / "dump", staging)
        except Unavailable as exc:
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
                    raise Internal(f"checkpoint of {s.id} failed and its network could not be put back: "
                                   f"{exc.message}; {wire}", reason="CHECKPOINT_FAILED",
                                   detail={"dump": exc.detail, "network": str(wire)}) from exc
                self._set_state(s, State.RUNNING)
                raise
            self._mark_broken(s, f"checkpoint failed and the session died: {exc.message}")
            raise Internal(f"checkpoint of {s.id} failed and the session is gone: {exc.message}",
                           reason="CHECKPOINT_FAILED", detail=exc.detail) from exc
        with self._lock:
            self.counters["dumps"] += 1
        layers = [str(self.store.path(snap_id) / "layer")] + list(s.layers)
        snap = Snapshot(id=snap_id, name=name, scope=params["scope"], session=s.id, image=s.spec.image,
                        layers=layers, parent=s.snapshot, created=time.time(), boot_id=boot_id(), size=0,
                        params=params, processes=procs, windows=titles, spec=asdict(s.spec),
                        dump_seconds=res.seconds, image_hash=s.image_hash, id_base=ID_BASE,
                        retention=params.get("retention", "pinned"))
        self.store.mark_dumped(snap, upper=str(Path(s.dir) / "rw/upper"), root=s.root)
        faults.hit("checkpoint-after-dump")
        _wait_init_dead(s, timeout=10)
        snap = self.store.finish(snap_id)
        self.ledger.forget("snapshot", snap_id)
        self.ledger.forget("mount", s.root)
        self.ledger.forget("op", f"checkpoint/{snap_id}")
        faults.hit("checkpoint-committed")
        log.info("checkpoint %s of %s: dump %.3fs, %d MiB", snap_id, s.id, res.seconds, snap.size >> 20)
        old_slot = s.slot
        with self._lock:
            self._slots_in_use.add(old_slot)
        with self.nat.pinned(s.spec.network_policy() if leave_running else netpolicy.NetworkPolicy()):
            self._teardown(s)
            if leave_running:
                with self._lock:
                    self._slots_in_use.add(old_slot)
                try:
                    new = self._restore_one(snap, slot=old_slot, sid=s.id, reseed=False, hostname=s.hostname,
                                            machine_id=s.machine_id)
                except DrumsError as exc:  # the snapshot is committed: say which, the session is gone
                    raise type(exc)(f"checkpoint {snap.id} of {s.id} is committed, but the session could not go "
                                    f"on running from it: {exc.message}", reason=exc.reason,
                                    detail={"snapshot": snap.id, "cause": exc.detail}) from exc
                new.timings["checkpoint"] = time.monotonic() - t0
        return snap

    # ----------------------------------------------------------------- restore
    def restore(self, ref: str, count: int = 1, wait_live: bool = False, expect_window: str | None = None,
                scope: str | None = None, min_nonblank: float = 0.0) -> list[Session]:
        """Restore ``count`` siblings of a snapshot at once (a branch). All or nothing.

        A sibling counts as ready when ``expect_window`` (default: the snapshot's first window) is
        mapped and more than ``min_nonblank`` of its screen differs from blank (0.0: any pixel)."""
        if not isinstance(count, int) or not 1 <= count <= self.instance.slot_count:
            raise InvalidArgument(f"count must be 1..{self.instance.slot_count}", reason="BAD_COUNT")
        if isinstance(min_nonblank, bool) or not isinstance(min_nonblank, (int, float)) \
                or not 0.0 <= min_nonblank < 1.0:
            raise InvalidArgument("min_nonblank must be a number in [0, 1)", reason="BAD_NONBLANK")
        if expect_window is not None and not isinstance(expect_window, str):
            raise InvalidArgument("expect_window must be a string", reason="BAD_WINDOW")
        try:
            snap = self.store.resolve(ref, scope)
        except NotFound as exc:
            evicted = self.keeper.evicted_error(ref)
            if evicted is None:
                raise
            raise evicted from exc
        self.check_snapshot_image(snap)
        with self.keeper.hold(snap.id):  # not evicted nor spilled while its siblings are being set up
            self.store.touch(snap.id)
            return self._restore_all(snap, count, wait_live, expect_window, min_nonblank)

    def _restore_all(self, snap: Snapshot, count: int, wait_live: bool, expect_window: str | None,
                     min_nonblank: float) -> list[Session]:
        results: list[Session | BaseException | None] = [None] * count

        def one(i: int) -> None:
            try:
                results[i] = self._restore_counted(snap, wait_live=wait_live, expect_window=expect_window,
                                                   min_nonblank=float(min_nonblank))
            except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
                results[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if isinstance(r, Session):
                    try:
                        self.destroy(r.id)
                    except DrumsError:
                        pass
            raise errors[0]
        return [r for r in results if isinstance(r, Session)]

    def _restore_counted(self, snap: Snapshot, **kw) -> Session:
        try:
            s = self._restore_one(snap, **kw)
        except Unavailable as exc:
            with self._lock:
                streak = self._retry_streak.get(snap.id, 0) + 1
                self._retry_streak[snap.id] = streak
            if streak >= RETRY_LIMIT:
                with self._lock:
                    self._retry_streak[snap.id] = 0
                raise Internal(f"restore of {snap.id} failed {streak} times in a row: {exc.message}",
                               reason="RETRIES_EXHAUSTED", detail=exc.detail) from exc
            raise
        except DrumsError:
            with self._lock:
                self._retry_streak[snap.id] = 0
            raise
        with self._lock:
            self._retry_streak[snap.id] = 0
        return s

    def _restore_one(self, snap: Snapshot, slot: int | None = None, sid: str | None = None, reseed: bool = True,
                     hostname: str | None = None, machine_id: str | None = None, wait_live: bool = False,
                     expect_window: str | None = None, count_retry: bool = True,
                     min_nonblank: float = 0.0) -> Session:
        spec = SessionSpec.from_dict(snap.spec)
        self.check_snapshot_image(snap)
        netpolicy.resolve_for_host(spec.network_policy(), restoring=True)
        lowers, _ = self.image_lowers(spec.image)
        broken = self.store.broken_reason(snap.id)
        if broken:
            raise Internal(f"snapshot {snap.id} is broken: {broken}", reason="SNAPSHOT_BROKEN", detail=broken)
        try:
            # CRIU spins instead of failing on a truncated pages image: check the recorded sizes first
            self.store.verify(snap)
        except Internal as corrupt:
            self.store.mark_broken(snap.id, corrupt.message)
            raise Internal(f"snapshot {snap.id} has corrupt images: {corrupt.message}", reason="IMAGES_CORRUPT",
                           detail={"verify": corrupt.message, "criu_log": []}) from corrupt
        slot = self._alloc_slot() if slot is None else slot
        s = self._new_session(spec, slot, sid)
        if hostname:
            s.hostname = hostname
        if machine_id:
            s.machine_id = machine_id
        s.snapshot = snap.id
        s.image_hash = snap.image_hash
        s.layers = list(snap.layers)
        s.state = State.RESTORING
        t0 = time.monotonic()
        with self._lock:
            self.sessions[s.id] = s
        trace = StepTrace(s.id, snap.id)
        try:
            with trace.step(RestoreStep.PREPARE_ROOT):
                self._record_session(s)
                faults.hit("restore-before-overlay")
                self._prepare_dirs(s)
                faults.hit("restore-after-writable-layer")
                self._make_cgroup(s)
                faults.hit("restore-after-cgroup")
                self._mount_root(s, [*snap.layers, *lowers])
                faults.hit("restore-after-overlay")
                netns.wait_link_gone(s.ifname)
            with trace.step(RestoreStep.CRIU):
                faults.arm_criu_timer()
                try:
                    res = criu.restore(self.store.path(snap.id) / "images", Path(s.dir) / "criu", Path(s.root), {},
                                       cgroup_paths=s.cgroup.paths if s.cgroup else None)
                finally:
                    faults.disarm_criu_timer()
                self.counters["restores"] += 1
                s.timings["criu"] = res.seconds
                s.init_pid = res.pid
                self.init_pids_seen.add(s.init_pid)
                s.init_start = _started(s.init_pid)
                self.ledger.record("process", s.id, pid=s.init_pid, starttime=s.init_start, tag=self.tag)
                faults.hit("restore-after-criu")
                faults.fail("restore-resume")
                self._x11_link(s)
            expect = expect_window if expect_window is not None else (spec.expect_window or
                                                                       (snap.windows[0] if snap.windows else None))
            # readiness needs neither the network nor the reseed: the X server is waited for meanwhile
            ready = _Background(f"ready-{s.id}", lambda: self._wait_drawn(s, trace, expect, spec, min_nonblank, t0))
            try:
                with trace.step(RestoreStep.NETWORK):
                    self._wire_network(s, create=True)
                s.timings["network"] = time.monotonic() - t0
                with trace.step(RestoreStep.RESEED):
                    if reseed:
                        self._reseed(s)
                    else:
                        rootfs.write_session_files(Path(s.root), s.hostname, s.machine_id, ID_BASE)
                s.timings["reseed"] = time.monotonic() - t0
            finally:
                ready.join()
            s.timings["display"] = ready.result()
            with trace.step(RestoreStep.READINESS):
                faults.hit("restore-after-register")
                faults.fail("restore-readiness")
                if spec.wait_port and not (reseed and spec.reseed_path):  # the reseed already spoke to the port
                    self._wait_port(s, spec.wait_port, spec.ready_timeout)
            s.timings["ready"] = time.monotonic() - t0
            self._set_state(s, State.RUNNING)
        except BaseException as exc:
            self._teardown(s)
            faults.hit("restore-teardown-done")
            err = rolled_back(exc, snap.id, lambda: self._corrupt_images(snap))
            if err is exc:
                raise
            raise err from exc
        # A process younger than SETTLED_AGE at the dump may be one that ends by itself (Chromium's
        # start-up helpers do, a second or two after its window shows): only settled ones must live on.
        # Snapshots from before ages were recorded ([nspid, comm]) require every process.
        # D-Bus-activated services exit when idle and come back when asked.
        expected = [(p[0], p[1]) for p in snap.processes
                    if len(p) < 3 or (p[2] >= SETTLED_AGE and not (len(p) > 3 and p[3]))]
        if wait_live:
            with trace.step(RestoreStep.LIVENESS):
                time.sleep(self.liveness_delay)
                dead = self._check_liveness(s, expected)
                if dead:
                    self._teardown(s)
                    raise Internal(f"restored session {s.id} failed its liveness check: {dead}",
                                   reason="LIVENESS_FAILED", detail=dead)
            s.liveness = Liveness.OK
        else:
            threading.Thread(target=self._liveness_later, args=(s, expected), daemon=True).start()
        s.timings["steps"] = dict(trace.seconds)
        log.info("restored %s from %s in %.3fs (%s)", s.id, snap.id, s.timings["ready"],
                 ", ".join(f"{k} {v:.3f}s" for k, v in trace.seconds.items()))
        return s

    def _wait_drawn(self, s: Session, trace: StepTrace, expect: str | None, spec: SessionSpec,
                    min_nonblank: float, t0: float) -> float:
        """The readiness step's X part: the display draws (``expect``'s window, if any). Returns the
        seconds since ``t0``."""
        with trace.step(RestoreStep.READINESS):
            display.wait_ready(s.display, expect, spec.ready_timeout, alive=lambda: self._alive_reason(s),
                               require_window=expect is not None, min_nonblank=min_nonblank)
        return time.monotonic() - t0

    def _corrupt_images(self, snap: Snapshot) -> str | None:
        """What is wrong with ``snap``'s images (and it is then marked broken), or None if they verify."""
        try:
            self.store.verify(snap)
        except Internal as corrupt:
            self.store.mark_broken(snap.id, corrupt.message)
            return corrupt.message
        return None

    def _reseed(self, s: Session) -> None:
        faults.hit("restore-mid-reseed")
        faults.fail("restore-reseed")
        rootfs.write_session_files(Path(s.root), s.hostname, s.machine_id, ID_BASE)
        import socket as _socket

        try:
            netns.in_namespaces(s.init_pid, {"uts": 0x04000000}, lambda: _socket.sethostname(s.hostname))
        except OSError as exc:
            raise Unavailable(f"could not set hostname: {exc}", reason="RESEED_FAILED") from exc
        if s.spec.reseed_path and s.spec.wait_port:
            url = f"http://{s.address}:{s.spec.wait_port}{s.spec.reseed_path}"
            deadline = time.monotonic() + 10
            while True:
                try:
                    r = requests.post(url, timeout=5)
                    if r.status_code == 200:
                        s.timings["reseed_draw"] = r.json().get("draw")
                        break
                    raise Unavailable(f"reseed hook answered {r.status_code}", reason="RESEED_FAILED")
                except requests.RequestException as exc:
                    if time.monotonic() > deadline:
                        raise Unavailable(f"reseed hook unreachable: {exc}", reason="RESEED_FAILED") from exc
                    time.sleep(0.02)

    def _process_ages(self, s: Session) -> list[list]:
        """``[nspid, comm, age in seconds, on_demand]`` of each session process at a checkpoint. A
        process that came back from the session's own snapshot adds the age it had there (a
        restore starts every process anew as far as the kernel's start times go). ``on_demand``:
        D-Bus started it on request (its environment has ``DBUS_STARTER_BUS_TYPE``): such services
        exit when idle (systemd-timedated after 30 s) and come back when asked. The environment is
        the session's to write; at worst a session exempts its own processes from its own check."""
        inherited: dict[tuple, float] = {}
        if s.snapshot:
            try:
                parent = self.store.get(s.snapshot)
                inherited = {(p[0], p[1]): float(p[2]) for p in parent.processes if len(p) > 2}
            except DrumsError:
                pass
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        tck = os.sysconf("SC_CLK_TCK")
        out = []
        for p in session_processes(s.init_pid):
            start = procs.starttime(p.pid)
            if start is None:
                continue
            age = max(0.0, uptime - start / tck)
            out.append([p.nspid, p.comm, round(age + inherited.get((p.nspid, p.comm), 0.0), 3),
                        _started_by_dbus(p.pid)])
        return out

    def _check_liveness(self, s: Session, expected: list[tuple]) -> str | None:
        if not is_alive(s.init_pid, s.init_start):
            return f"session init (pid {s.init_pid}) died"
        now = {(p.nspid, p.comm) for p in session_processes(s.init_pid)}
        missing = [f"{comm} (pid {nspid} in session)" for nspid, comm in expected if (nspid, comm) not in now]
        if missing:
            return "process died after restore: " + ", ".join(missing)
        return None

    def _liveness_later(self, s: Session, expected: list[tuple]) -> None:
        time.sleep(self.liveness_delay)
        if self.sessions.get(s.id) is not s or s.state != State.RUNNING:
            return
        dead = self._check_liveness(s, expected)
        if dead:
            self._mark_broken(s, dead)
        else:
            s.liveness = Liveness.OK

    def wait_live(self, sid: str, timeout: float = 30.0) -> Session:
        s = self.get(sid)
        deadline = time.monotonic() + timeout
        while s.liveness == Liveness.UNCHECKED and s.state != State.BROKEN and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._usable(sid)

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
            raise InvalidArgument("exec needs a non-empty list of strings", reason="BAD_COMMAND")
        env = {"PATH": SESSION_PATH, "LANG": "C.UTF-8", "DISPLAY": ":0"}
        if user not in (None, "root"):
            if user != SESSION_USER:
                raise InvalidArgument(f"unknown user {user!r}", reason="BAD_USER")
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
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input, env=host_env,
                                 cwd="/")
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"command timed out after {timeout}s", reason="EXEC_TIMEOUT") from exc
        return {"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}

    def screenshot(self, sid: str) -> bytes:
        s = self._usable(sid)
        d = display.connect(s.display)
        try:
            return display.png(display.grab(d))
        finally:
            d.close()

    def windows(self, sid: str) -> list[dict]:
        s = self._usable(sid)
        d = display.connect(s.display)
        try:
            return [asdict(w) for w in display.windows(d)]
        finally:
            d.close()

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
