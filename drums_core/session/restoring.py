"""Restore, the supervisor's half that brings snapshots back as running sessions (one, or ``count``
siblings at once: a branch), in the named steps of :mod:`drums_core.session.restore_steps`, and the
liveness check that follows each restore. A mixin of :class:`drums_core.session.supervisor.Supervisor`,
whose state it uses."""
from __future__ import annotations

import http.client
import json
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import criu, display, faults, kernel_caps, netns, netpolicy, rootfs
from ..config import ID_BASE
from ..errors import DrumsError, Internal, InvalidArgument, NotFound, Unavailable
from ..reasons import Reason
from ..host import bounded, procs
from ..host.procs import is_alive
from ..store.snapshots import Snapshot
from .model import SETTLED_AGE, Liveness, Session, SessionSpec, State, init_start_time
from .processes import session_processes
from .restore_steps import RestoreStep, StepTrace, rolled_back

log = logging.getLogger("drums.supervisor")

RETRY_LIMIT = 3
RESTORE_BOOST = 4  # CPU weight of a restoring session, times its own
RACE_ATTEMPTS = 3  # restores of one sibling that CRIU lost to a process ending (see _restore_raced)
RESEED_REPLY_LIMIT = 64 << 10   # the reseed hook answers {"draw": ...}: a few dozen bytes
RESEED_REPLY_TIMEOUT = 5.0      # one exchange with the hook, connect to last byte
RESEED_CONNECT_WINDOW = 10.0    # how long a hook that refuses connections is tried again


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


def _started_by_dbus(pid: int) -> bool:
    try:  # the session writes its environment: its first 64 KiB are read, within bounds
        env = bounded.read_proc(pid, "environ", limit=1 << 16, truncate=True).data
    except (OSError, Unavailable):
        return False
    return b"\0DBUS_STARTER_BUS_TYPE=" in b"\0" + env


def _dbus_babysitter(comm: str, parent_comm: str | None) -> bool:
    """dbus-daemon starts an activated service through a babysitter: a fork of itself (same
    name, its parent a dbus-daemon) that waits for the service and exits with it, so it is as
    on-demand as the service (seen: a babysitter 3 s old at a checkpoint, gone in the sibling)."""
    return comm == "dbus-daemon" and parent_comm == "dbus-daemon"


@dataclass(frozen=True)
class RestoreAsk:
    """What the caller of a restore asks: wait for the liveness verdict, which window means ready,
    how much of the screen must differ from blank."""

    wait_live: bool = False
    expect_window: str | None = None
    min_nonblank: float = 0.0


class RestoreOps:
    """``Supervisor.restore`` and its steps, ``wait_live`` and the liveness check."""

    # ----------------------------------------------------------------- restore
    def restore(self, ref: str, count: int = 1, wait_live: bool = False, expect_window: str | None = None,
                scope: str | None = None, min_nonblank: float = 0.0) -> list[Session]:
        """Restore ``count`` siblings of a snapshot at once (a branch). All or nothing.

        A sibling counts as ready when ``expect_window`` (default: the snapshot's first window) is
        mapped and more than ``min_nonblank`` of its screen differs from blank (0.0: any pixel)."""
        if not isinstance(count, int) or not 1 <= count <= self.instance.slot_count:
            raise InvalidArgument(f"count must be 1..{self.instance.slot_count}", reason=Reason.BAD_COUNT)
        if isinstance(min_nonblank, bool) or not isinstance(min_nonblank, (int, float)) \
                or not 0.0 <= min_nonblank < 1.0:
            raise InvalidArgument("min_nonblank must be a number in [0, 1)", reason=Reason.BAD_NONBLANK)
        if expect_window is not None and not isinstance(expect_window, str):
            raise InvalidArgument("expect_window must be a string", reason=Reason.BAD_WINDOW)
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
            return self._restore_all(snap, count, RestoreAsk(bool(wait_live), expect_window, float(min_nonblank)))

    def _restore_all(self, snap: Snapshot, count: int, ask: RestoreAsk) -> list[Session]:
        results: list[Session | BaseException | None] = [None] * count

        def one(i: int) -> None:
            try:
                results[i] = self._restore_counted(snap, ask)
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

    def _restore_counted(self, snap: Snapshot, ask: RestoreAsk) -> Session:
        try:
            s = self._restore_raced(snap, ask)
        except Unavailable as exc:
            if exc.reason in (Reason.HOST_BUDGET, Reason.PID_BUDGET):  # the host's shortage, not this snapshot's fault
                raise
            with self._lock:
                streak = self._retry_streak.get(snap.id, 0) + 1
                self._retry_streak[snap.id] = streak
            if streak >= RETRY_LIMIT:
                with self._lock:
                    self._retry_streak[snap.id] = 0
                raise Internal(f"restore of {snap.id} failed {streak} times in a row: {exc.message}",
                               reason=Reason.RETRIES_EXHAUSTED, detail=exc.detail) from exc
            raise
        except DrumsError:
            with self._lock:
                self._retry_streak[snap.id] = 0
            raise
        with self._lock:
            self._retry_streak[snap.id] = 0
        return s

    def _restore_raced(self, snap: Snapshot, ask: RestoreAsk) -> Session:
        """:meth:`_restore_one`, once more (:data:`RACE_ATTEMPTS` in all) after each restore that CRIU
        lost to a process ending as it let go of the tasks (:data:`criu.RESTORE_RACE`): that one was
        rolled back whole (session, root, network), and a new one starts from nothing."""
        for attempt in range(1, RACE_ATTEMPTS + 1):
            try:
                return self._restore_one(snap, ask)
            except Unavailable as exc:
                if attempt == RACE_ATTEMPTS or not criu.lost_a_race_at_detach(exc):
                    raise
                log.info("restore of %s: a restored process ended while CRIU let go of the tasks (attempt %d of %d); "
                         "restoring again", snap.id, attempt, RACE_ATTEMPTS)
        raise AssertionError("unreachable")

    def _restore_one(self, snap: Snapshot, ask: RestoreAsk) -> Session:
        spec = SessionSpec.from_dict(snap.spec)
        self.check_snapshot_image(snap)
        netpolicy.resolve_for_host(spec.network_policy(), restoring=True)
        lowers, _ = self.image_lowers(spec.image)
        broken = self.store.broken_reason(snap.id)
        if broken:
            raise Internal(f"snapshot {snap.id} is broken: {broken}", reason=Reason.SNAPSHOT_BROKEN, detail=broken)
        try:
            # CRIU spins instead of failing on a truncated pages image: check the recorded sizes first
            self.store.verify(snap)
        except Internal as corrupt:
            self.store.mark_broken(snap.id, corrupt.message)
            raise Internal(f"snapshot {snap.id} has corrupt images: {corrupt.message}", reason=Reason.IMAGES_CORRUPT,
                           detail={"verify": corrupt.message, "criu_log": []}) from corrupt
        s = self._new_session(spec, self._alloc_slot())
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
                self._restore_boost(s, True)
                faults.hit("restore-after-cgroup")
                self._mount_root(s, [*snap.layers, *lowers])
                faults.hit("restore-after-overlay")
                netns.wait_link_gone(s.ifname)
            with trace.step(RestoreStep.CRIU):
                faults.arm_criu_timer()
                try:
                    res = criu.restore(self.store.path(snap.id) / "images", Path(s.dir) / "criu", Path(s.root), {},
                                       cgroup_paths=s.cgroup.paths if s.cgroup else None,
                                       setup_namespaces=kernel_caps.apply_restored)
                finally:
                    faults.disarm_criu_timer()
                self.counters["restores"] += 1
                s.timings["criu"] = res.seconds
                s.init_pid = res.pid
                self.init_pids_seen.add(s.init_pid)
                s.init_start = init_start_time(s.init_pid)
                self.ledger.record("process", s.id, pid=s.init_pid, starttime=s.init_start, tag=self.tag)
                faults.hit("restore-after-criu")
                faults.fail("restore-resume")
                self._x11_link(s)
            expect = ask.expect_window if ask.expect_window is not None else (
                spec.expect_window or (snap.windows[0] if snap.windows else None))
            # the snapshot's own first window is found by its X id too: its title may change as soon as
            # the application runs on (a page that finished loading after the dump)
            same_window = (snap.window_ids[:1] if ask.expect_window is None and not spec.expect_window
                           and snap.windows else [])
            # readiness needs neither the network nor the reseed: the X server is waited for meanwhile
            ready = _Background(f"ready-{s.id}",
                                lambda: self._wait_drawn(s, trace, expect, spec, ask.min_nonblank, t0, same_window))
            try:
                with trace.step(RestoreStep.NETWORK):
                    self._wire_network(s, create=True)
                s.timings["network"] = time.monotonic() - t0
                with trace.step(RestoreStep.RESEED):
                    self._reseed(s)
                s.timings["reseed"] = time.monotonic() - t0
            finally:
                ready.join()
            s.timings["display"] = ready.result()
            with trace.step(RestoreStep.READINESS):
                faults.hit("restore-after-register")
                faults.fail("restore-readiness")
                if spec.wait_port and not spec.reseed_path:  # else the reseed already spoke to the port
                    self._wait_port(s, spec.wait_port, spec.ready_timeout)
            s.timings["ready"] = time.monotonic() - t0
            self._restore_boost(s, False)
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
        if ask.wait_live:
            with trace.step(RestoreStep.LIVENESS):
                time.sleep(self.liveness_delay)
                dead = self._check_liveness(s, expected)
                if dead:
                    self._teardown(s)
                    raise Internal(f"restored session {s.id} failed its liveness check: {dead}",
                                   reason=Reason.LIVENESS_FAILED, detail=dead)
            s.liveness = Liveness.OK
        else:
            threading.Thread(target=self._liveness_later, args=(s, expected), daemon=True).start()
        s.timings["steps"] = dict(trace.seconds)
        log.info("restored %s from %s in %.3fs (%s)", s.id, snap.id, s.timings["ready"],
                 ", ".join(f"{k} {v:.3f}s" for k, v in trace.seconds.items()))
        return s

    def _wait_drawn(self, s: Session, trace: StepTrace, expect: str | None, spec: SessionSpec,
                    min_nonblank: float, t0: float, expect_ids: list[int] | None = None) -> float:
        """The readiness step's X part: the display draws (``expect``'s window, if any, found by its
        title or by one of ``expect_ids``). Returns the seconds since ``t0``."""
        with trace.step(RestoreStep.READINESS):
            display.wait_ready(s.display, expect, spec.ready_timeout, alive=lambda: self._alive_reason(s),
                               require_window=expect is not None, min_nonblank=min_nonblank,
                               expect_ids=expect_ids)
        return time.monotonic() - t0

    def _corrupt_images(self, snap: Snapshot) -> str | None:
        """What is wrong with ``snap``'s images (and it is then marked broken), or None if they verify."""
        try:
            self.store.verify(snap)
        except Internal as corrupt:
            self.store.mark_broken(snap.id, corrupt.message)
            return corrupt.message
        return None

    def _restore_boost(self, s: Session, on: bool) -> None:
        """A restoring session (CRIU, then its own programs resuming) runs at :data:`RESTORE_BOOST`
        times its CPU weight until it is ready: a busy neighbour, a hostile one among them, weighs
        no more than a share of it. A running session has its own weight only."""
        if s.cgroup is None:
            return
        limits = s.spec.cgroup_limits()
        if on:
            limits = dataclasses.replace(limits, cpu_weight=min(10000, limits.cpu_weight * RESTORE_BOOST))
        self.cgroups.set_cpu_weight(s.cgroup, limits)

    def _reseed(self, s: Session) -> None:
        faults.hit("restore-mid-reseed")
        faults.fail("restore-reseed")
        rootfs.write_session_files(Path(s.root), s.hostname, s.machine_id, ID_BASE)
        import socket as _socket

        try:
            netns.in_namespaces(s.init_pid, {"uts": 0x04000000}, lambda: _socket.sethostname(s.hostname))
        except OSError as exc:
            raise Unavailable(f"could not set hostname: {exc}", reason=Reason.RESEED_FAILED) from exc
        if s.spec.reseed_path and s.spec.wait_port:
            # The guest's answer is the session's to shape: each attempt (connect, headers, body) is
            # bounded in time and bytes (SESSION_REPLY_TIMEOUT / SESSION_REPLY_TOO_LARGE fail this
            # restore alone, at once); only a connection that was never made is tried again.
            what = f"reseed hook of {s.id} (POST http://{s.address}:{s.spec.wait_port}{s.spec.reseed_path})"
            deadline = time.monotonic() + RESEED_CONNECT_WINDOW
            while True:
                try:
                    r = bounded.http_request("POST", s.address, s.spec.wait_port, s.spec.reseed_path,
                                             body=b"", limit=RESEED_REPLY_LIMIT, timeout=RESEED_REPLY_TIMEOUT,
                                             what=what)
                except (OSError, http.client.HTTPException) as exc:
                    if time.monotonic() > deadline:
                        raise Unavailable(f"reseed hook unreachable: {exc}", reason=Reason.RESEED_FAILED) from exc
                    time.sleep(0.02)
                    continue
                if r.status != 200:
                    raise Unavailable(f"reseed hook answered {r.status}", reason=Reason.RESEED_FAILED)
                try:
                    reply = json.loads(r.body)
                except ValueError as exc:
                    raise Unavailable(f"reseed hook answered no JSON: {r.body[:200]!r}",
                                      reason=Reason.RESEED_FAILED) from exc
                s.timings["reseed_draw"] = reply.get("draw") if isinstance(reply, dict) else None
                break

    def _process_ages(self, s: Session) -> list[list]:
        """``[nspid, comm, age in seconds, on_demand]`` of each session process at a checkpoint. A
        process that came back from the session's own snapshot adds the age it had there (a
        restore starts every process anew as far as the kernel's start times go). ``on_demand``:
        D-Bus started it on request (its environment has ``DBUS_STARTER_BUS_TYPE``, or it is the
        bus's babysitter of such a service): such services exit when idle (systemd-timedated after
        30 s) and come back when asked. The environment is the session's to write; at worst a
        session exempts its own processes from its own check."""
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
        found = session_processes(s.init_pid)
        comm_of = {p.pid: p.comm for p in found}
        for p in found:
            start = procs.starttime(p.pid)
            if start is None:
                continue
            age = max(0.0, uptime - start / tck)
            on_demand = _started_by_dbus(p.pid) or _dbus_babysitter(p.comm, comm_of.get(p.ppid))
            out.append([p.nspid, p.comm, round(age + inherited.get((p.nspid, p.comm), 0.0), 3), on_demand])
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
