"""Per-session resource limits through cgroups: this module owns every cgroup Drums makes.

A session's group is named ``drums/<run>/<session>`` (:func:`group_name`) and lives under each
controller hierarchy it uses:

- cgroup v1 (:class:`CgroupV1Driver`): one directory per hierarchy, for the ``memory``, ``pids``,
  ``cpu`` (alone or co-mounted with ``cpuacct``) and, when mounted, ``freezer`` controllers,
  e.g. ``/sys/fs/cgroup/memory/drums/<run>/<session>``;
- cgroup v2 (:class:`CgroupV2Driver`): one directory under the unified mount, with ``memory``,
  ``pids`` and ``cpu`` enabled in every ancestor's ``cgroup.subtree_control``.

:func:`detect` chooses at start-up (v1 when its memory, pids and cpu hierarchies are mounted, else
v2 when usable, else :class:`~drums_core.errors.FailedPrecondition` naming what is missing).

Plan, then apply, as the ledger needs (write-ahead)::

    cg = driver.plan(run, sid)                         # no side effect: names and paths only
    ledger.record("cgroup", cg.name, **cg.ledger_data())
    driver.create(run, sid, Limits(memory_max=...))    # idempotent
    ...start the session with preexec_fn=lambda: enter(cg.paths), or cg.attach(pid)...
    cg.remove()                                        # kill every member, rmdir; then
    ledger.forget("cgroup", cg.name)

The sweep (:mod:`drums_core.sweep.step_mounts`) reaps groups of dead runs with :func:`members`,
:func:`kill_members`, :func:`remove_dirs` and :func:`check_group_dir`; leak checks use
:func:`list_run_groups`. Nothing here follows a symlink or touches a directory outside
``<hierarchy>/drums/``.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..host import procs
from ..config import check_name
from ..errors import FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable

log = logging.getLogger("drums.cgroups")

BASE = "drums"
MiB = 1 << 20
GiB = 1 << 30
REQUIRED = ("memory", "pids", "cpu")          # controllers a session's limits need (v1 and v2)
V1_ROLES = ("memory", "pids", "cpu", "freezer", "devices")  # v1 hierarchies a session's group lives in
# The device nodes a session may open or make (v1 devices controller; Docker's default list minus
# what a desktop does not use). Anything else (a node in a layer a bundle or an image brought) is refused.
DEVICE_ALLOW = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
                "c 136:* rwm")
V1_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "net_prio",
                            "blkio", "perf_event", "hugetlb", "pids", "rdma", "misc"})
PROCS = "cgroup.procs"
MAX_WALK = 4096          # at most this many nested directories are visited under one group
_POLL = 0.01


# ---------------------------------------------------------------------------------------------
# limits


@dataclass(frozen=True)
class Limits:
    """What one session may use. Sizes are bytes.

    ``memory_max``: hard limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``); the kernel's OOM
    killer kills inside the group beyond it. ``memory_high``: soft limit (v1
    ``memory.soft_limit_in_bytes``, v2 ``memory.high``); None means 3/4 of ``memory_max`` (3 GiB for
    the default 4 GiB). ``pids_max``: tasks (threads count). ``cpu_weight``: 1..10000 (v2
    ``cpu.weight``; v1 ``cpu.shares`` = weight*1024/100 clamped to 2..262144).
    Nonsense raises :class:`InvalidArgument` with reason ``BAD_LIMITS``.
    """

    memory_max: int = 4 * GiB
    memory_high: int | None = None
    pids_max: int = 4096
    cpu_weight: int = 100

    MIN_MEMORY = 8 * MiB
    MAX_MEMORY = 1 << 50
    MAX_PIDS = 4194304  # PID_MAX_LIMIT

    def __post_init__(self) -> None:
        if self.memory_high is None and _is_int(self.memory_max):
            object.__setattr__(self, "memory_high", self.memory_max * 3 // 4)
        _check_int("memory_max", self.memory_max, self.MIN_MEMORY, self.MAX_MEMORY)
        _check_int("memory_high", self.memory_high, self.MIN_MEMORY, self.memory_max)
        _check_int("pids_max", self.pids_max, 1, self.MAX_PIDS)
        _check_int("cpu_weight", self.cpu_weight, 1, 10000)

    @property
    def cpu_shares(self) -> int:
        """The v1 ``cpu.shares`` of :attr:`cpu_weight` (100 -> 1024)."""
        return min(262144, max(2, self.cpu_weight * 1024 // 100))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if not _is_int(v) or not lo <= v <= hi:  # type: ignore[operator]
        raise InvalidArgument(f"limit {name}={v!r} must be an integer in {lo}..{hi}", reason="BAD_LIMITS")


# ---------------------------------------------------------------------------------------------
# names and hierarchies


def _check(name: str, what: str) -> str:
    # config.check_name's pattern ends in ``$``, which also matches before a trailing newline
    if isinstance(name, str) and "\n" in name:
        raise InvalidArgument(f"invalid {what} {name!r}: control character", reason="INVALID_NAME")
    return check_name(name, what)


def group_name(run: str, session: str) -> str:
    """``drums/<run>/<session>``; hostile names raise InvalidArgument (reason INVALID_NAME)."""
    return f"{BASE}/{_check(run, 'run')}/{_check(session, 'session')}"


def parse_group_name(name: str) -> tuple[str, str]:
    """(run, session) of ``drums/<run>/<session>``. InvalidArgument for anything else."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 3 or parts[0] != BASE:
        raise InvalidArgument(f"invalid cgroup name {name!r}: want {BASE}/<run>/<session>", reason="INVALID_NAME")
    return _check(parts[1], "run"), _check(parts[2], "session")


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: ``version`` 1 (with its ``controllers``) or 2."""

    mountpoint: str
    version: int
    controllers: frozenset[str] = frozenset()


def hierarchies(mounts: Iterable[procs.MountInfo] | None = None) -> list[Hierarchy]:
    """Every cgroup hierarchy mounted in this mount namespace, once each (first mount point wins).
    Raises OSError/ValueError when the mount table cannot be read."""
    table = procs.read_mountinfo() if mounts is None else mounts
    out: list[Hierarchy] = []
    seen: set[tuple[str, str]] = set()
    for m in table:
        if m.fstype not in ("cgroup", "cgroup2") or (m.dev, m.root) in seen:
            continue
        seen.add((m.dev, m.root))
        if m.fstype == "cgroup2":
            out.append(Hierarchy(m.mountpoint, 2))
            continue
        opts = set(m.superopts.split(","))
        ctrls = {o for o in opts if o in V1_CONTROLLERS or o.startswith("name=")}
        out.append(Hierarchy(m.mountpoint, 1, frozenset(ctrls)))
    return out


def cgroup_mountpoints(mounts: Iterable[procs.MountInfo]) -> set[str]:
    """Mount points of every cgroup/cgroup2 mount in ``mounts`` (the roots the sweep may act under)."""
    return {m.mountpoint for m in mounts if m.fstype in ("cgroup", "cgroup2")}


def check_group_dir(path: str, mounts: Sequence[procs.MountInfo]) -> str | None:
    """None when ``path`` is ``<cgroup mount>/drums/<run>/<session>`` with that cgroup mount the
    deepest mount holding it and no symlink on the way; else why not (the sweep then keeps it)."""
    try:
        norm = procs.check_owned_path(path)
        name = "/".join(norm.split("/")[-3:])
        parse_group_name(name)
    except (ValueError, InvalidArgument) as exc:
        return f"{path!r} is not a cgroup path of Drums: {exc}"
    root = norm[: -len(name) - 1]
    holder = max((m for m in mounts if procs.path_within(norm, m.mountpoint)), key=lambda m: m.depth, default=None)
    if holder is None or holder.fstype not in ("cgroup", "cgroup2") or holder.mountpoint != root:
        return f"{path} is not directly under a cgroup mount (deepest mount: {holder.mountpoint if holder else '-'})"
    if os.path.lexists(norm) and os.path.realpath(norm) != norm:
        return f"{path} goes through a symlink"
    return None


def list_run_groups(mounts: Iterable[procs.MountInfo] | None = None) -> dict[str, list[str]]:
    """Every Drums group on the host, by run: ``<hierarchy>/drums/<run>/<session>`` directories of
    every mounted hierarchy, and ``<hierarchy>/drums/<run>`` itself when it holds no session group.
    Raises OSError/ValueError when the mount table cannot be read."""
    out: dict[str, list[str]] = {}
    for h in hierarchies(mounts):
        base = os.path.join(h.mountpoint, BASE)
        for run in _subdirs(base):
            run_dir = os.path.join(base, run)
            sessions = [os.path.join(run_dir, s) for s in _subdirs(run_dir)]
            out.setdefault(run, []).extend(sessions or [run_dir])
    return {run: sorted(paths) for run, paths in sorted(out.items())}


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


# ---------------------------------------------------------------------------------------------
# file access


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def parse_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, cgroup.events) as a dict; other lines skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_procs(path: str) -> list[int]:
    """Pids in ``path/cgroup.procs`` (this pid namespace's numbers); [] when the group is gone."""
    try:
        text = _read(os.path.join(path, PROCS))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(x) for x in text.split() if x.isdigit() and int(x) > 0]


def _walk(path: str) -> list[str]:
    """``path`` and every directory (nested group) under it, parents first; never follows symlinks."""
    out, todo = [], [path]
    while todo and len(out) < MAX_WALK:
        d = todo.pop()
        out.append(d)
        todo.extend(os.path.join(d, n) for n in reversed(_subdirs(d)))
    return out


def members(paths: Iterable[str]) -> set[int]:
    """Every process in the groups ``paths`` and in groups nested under them."""
    return {pid for p in paths for d in _walk(p) for pid in read_procs(d)}


def enter(paths: Sequence[str]) -> None:
    """Move the *calling* process into the group directories ``paths`` (every controller's).

    Safe in a ``preexec_fn`` or after ``fork()``: only ``os.open``/``os.write``/``os.close``, no
    import, no lock. Raises OSError (in a preexec_fn, subprocess reports it as SubprocessError).
    """
    for p in paths:
        fd = os.open(p + "/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# killing and removing (shared by SessionCgroup and the sweep)


@dataclass
class KillResult:
    """``killed``: processes seen in the groups and dead afterwards; ``spared``: members ``spare``
    protected (left alive); ``left``: other members still alive at the deadline."""

    killed: int = 0
    spared: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)


@contextlib.contextmanager
def _frozen(paths: Sequence[str]) -> Iterator[None]:
    """Freeze the groups (v1 ``freezer.state``, v2 ``cgroup.freeze``) while inside; thaw on exit.
    Waits at most ~1 s for the freeze to settle, then goes on (a task in D state may delay it)."""
    v1 = [p for p in paths if os.path.exists(os.path.join(p, "freezer.state"))]
    v2 = [p for p in paths if os.path.exists(os.path.join(p, "cgroup.freeze"))]
    done: list[tuple[str, str]] = []
    try:
        for p in v1:
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(p, "freezer.state"), "FROZEN")
                done.append((os.path.join(p, "freezer.state"), "THAWED"))
        for p in v2:
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(p, "cgroup.freeze"), "1")
                done.append((os.path.join(p, "cgroup.freeze"), "0"))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not all(_settled(p) for p in v1 + v2):
            time.sleep(_POLL)
        yield
    finally:
        for f, value in done:
            with contextlib.suppress(FileNotFoundError):
                _write(f, value)


def _settled(path: str) -> bool:
    try:
        if os.path.exists(os.path.join(path, "freezer.state")):
            return _read(os.path.join(path, "freezer.state")).strip() == "FROZEN"
        return parse_keyed(_read(os.path.join(path, "cgroup.events"))).get("frozen") == 1
    except FileNotFoundError:
        return True


def _pin(pids: Iterable[int], paths: Sequence[str]) -> list[procs.Handle]:
    """Pidfd handles of ``pids`` that are still members after their pidfd was opened."""
    handles = []
    for pid in pids:
        start = procs.starttime(pid)
        h = procs.open_handle(pid, start) if start is not None else None
        if h is not None:
            handles.append(h)
    still = members(paths)
    keep = [h for h in handles if h.pid in still]
    for h in handles:
        if h.pid not in still:
            h.close()
    return keep


def kill_members(paths: Sequence[str], timeout: float = 5.0,
                 spare: Callable[[int], bool] | None = None) -> KillResult:
    """SIGKILL every process in the groups ``paths`` (and nested groups) until they are empty.

    Each pass freezes the groups, pins the members by pidfd, kills them (v2: also ``cgroup.kill``,
    which catches forks in flight), thaws and waits; passes repeat until no member is left or
    ``timeout`` passes. Members for which ``spare(pid)`` is true are not touched: while there is one,
    the groups are neither frozen nor ``cgroup.kill``-ed, the others are killed one by one.
    """
    deadline = time.monotonic() + timeout
    killed: set[tuple[int, int]] = set()
    spared: set[int] = set()
    while True:
        current = members(paths)
        spared |= {pid for pid in current if spare is not None and spare(pid)}
        targets = current - spared
        if not targets or time.monotonic() >= deadline:
            break
        with _frozen(paths) if not spared else contextlib.nullcontext():
            handles = _pin(members(paths) - spared, paths)
            for h in handles:
                procs.send_signal(h, signal.SIGKILL)
            if not spared:
                for p in paths:
                    with contextlib.suppress(FileNotFoundError):
                        if os.path.exists(os.path.join(p, "cgroup.kill")):
                            _write(os.path.join(p, "cgroup.kill"), "1")
        procs.wait_dead(handles, max(0.0, min(1.0, deadline - time.monotonic())))
        killed |= {(h.pid, h.starttime) for h in handles if procs.handle_dead(h)}
        for h in handles:
            h.close()
    left = sorted(members(paths) - spared)
    return KillResult(killed=len(killed), spared=sorted(spared), left=left)


def remove_dirs(paths: Iterable[str], timeout: float = 2.0) -> tuple[list[str], dict[str, str]]:
    """rmdir every group in ``paths`` (nested groups first), retrying EBUSY until ``timeout``.

    Returns (directories removed, {directory: why} of those that stayed). Gone ones count as neither.
    """
    deadline = time.monotonic() + timeout
    removed: list[str] = []
    failed: dict[str, str] = {}
    for top in paths:
        for d in reversed(_walk(top)):
            why = _rmdir(d, deadline)
            if why is None:
                removed.append(d)
            elif why != "gone":
                failed[d] = why
    return removed, failed


def _rmdir(path: str, deadline: float) -> str | None:
    while True:
        try:
            os.rmdir(path)
            return None
        except FileNotFoundError:
            return "gone"
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return f"rmdir: {exc.strerror} ({len(read_procs(path))} processes in it)"
        time.sleep(_POLL)


def remove_run_dir(group_dir: str) -> bool:
    """rmdir ``<hierarchy>/drums/<run>`` of a session group when it is empty. True if removed."""
    run_dir = os.path.dirname(group_dir)
    if os.path.basename(os.path.dirname(run_dir)) != BASE:
        return False
    try:
        os.rmdir(run_dir)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
            return False
        raise


# ---------------------------------------------------------------------------------------------
# one session's group


@dataclass(frozen=True)
class SessionCgroup:
    """The group ``name`` = ``drums/<run>/<session>`` of one session.

    ``dirs`` maps a role to its directory: v1 ``memory``/``pids``/``cpu``/``freezer``, v2
    ``unified``. ``controllers``: the v2 controllers enabled for it (all of :data:`REQUIRED` from
    :func:`detect`). Methods raise NotFound (no such process), FailedPrecondition (a controller
    this group does not have) or Internal (the kernel refused; detail says what).
    """

    name: str
    driver: str
    dirs: Mapping[str, str] = field(hash=False)
    controllers: frozenset[str] = frozenset(REQUIRED)

    @property
    def run(self) -> str:
        return self.name.split("/")[1]

    @property
    def session(self) -> str:
        return self.name.split("/")[2]

    @property
    def paths(self) -> list[str]:
        """Every controller directory, sorted, once each (what the ledger records)."""
        return sorted(set(self.dirs.values()))

    def ledger_data(self) -> dict:
        """The data of this group's ledger entry (kind ``cgroup``, key :attr:`name`)."""
        return {"paths": self.paths, "driver": self.driver, "session": self.session}

    @classmethod
    def from_record(cls, name: str, data: Mapping) -> SessionCgroup:
        """The group a ledger entry recorded (to adopt or remove it after a restart)."""
        parse_group_name(name)
        driver, paths = data.get("driver"), data.get("paths")
        if driver not in ("v1", "v2") or not isinstance(paths, list) or not paths \
                or not all(isinstance(p, str) and p.endswith("/" + name) for p in paths):
            raise InvalidArgument(f"cgroup record {name!r} lacks driver/paths", reason="INVALID_ARGUMENT")
        if driver == "v2":
            d = paths[0]
            ctrls = frozenset(_read_words(os.path.join(os.path.dirname(d), "cgroup.subtree_control")))
            return cls(name, "v2", {"unified": d}, ctrls & frozenset(REQUIRED))
        roles = {}
        for p in paths:
            for role in V1_ROLES:
                if os.path.exists(os.path.join(p, _V1_PROBE[role])):
                    roles.setdefault(role, p)
        return cls(name, "v1", roles or {"unknown": paths[0]})

    def _dir(self, role: str) -> str:
        if self.driver == "v2":
            if role not in self.controllers:
                raise FailedPrecondition(f"cgroup {self.name}: the {role} controller is not enabled",
                                         reason="CONTROLLER_NOT_ENABLED")
            return self.dirs["unified"]
        if role not in self.dirs:
            raise FailedPrecondition(f"cgroup {self.name}: no {role} hierarchy", reason="CONTROLLER_NOT_ENABLED")
        return self.dirs[role]

    def exists(self) -> bool:
        return any(os.path.isdir(p) for p in self.paths)

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group in every hierarchy."""
        for p in self.paths:
            try:
                _write(os.path.join(p, PROCS), str(int(pid)))
            except ProcessLookupError as exc:
                raise NotFound(f"cannot move pid {pid} into {self.name}: no such process",
                               reason="NO_SUCH_PROCESS") from exc
            except OSError as exc:
                raise Internal(f"cannot move pid {pid} into {p}: {exc.strerror}", reason="CGROUP_FAILED",
                               detail=str(exc)) from exc
        log.debug("cgroup attach run=%s session=%s pid=%d", self.run, self.session, pid)

    def pids(self) -> list[int]:
        """Every process in the group (any hierarchy, nested groups included), sorted."""
        return sorted(members(self.paths))

    def oom_kills(self) -> int:
        """How many processes the OOM killer killed in this group (``oom_kill``)."""
        d = self._dir("memory")
        f = "memory.events" if self.driver == "v2" else "memory.oom_control"
        return parse_keyed(self._read(os.path.join(d, f))).get("oom_kill", 0)

    def memory_current(self) -> int:
        """Bytes charged to the group now."""
        d = self._dir("memory")
        f = "memory.current" if self.driver == "v2" else "memory.usage_in_bytes"
        return int(self._read(os.path.join(d, f)).strip())

    def _read(self, path: str) -> str:
        try:
            return _read(path)
        except OSError as exc:
            raise Internal(f"cgroup {self.name}: cannot read {path}: {exc.strerror}", reason="CGROUP_FAILED") from exc

    def kill_all(self, timeout: float = 5.0) -> int:
        """SIGKILL every process in the group and wait until it is empty; returns how many died.
        Internal (reason CGROUP_NOT_EMPTY) when members are still there after ``timeout``."""
        res = kill_members(self.paths, timeout)
        if res.left:
            raise Internal(f"cgroup {self.name}: {len(res.left)} processes survived SIGKILL",
                           reason="CGROUP_NOT_EMPTY", detail={"pids": res.left})
        if res.killed:
            log.info("cgroup killed run=%s session=%s processes=%d", self.run, self.session, res.killed)
        return res.killed

    def remove(self, timeout: float = 5.0) -> None:
        """Kill every member, rmdir the group's directories (and an empty ``drums/<run>``).
        Afterwards no directory of it is left, or Internal (reason CGROUP_NOT_EMPTY) says which is."""
        t0 = time.monotonic()
        self.kill_all(timeout)
        _, failed = remove_dirs(self.paths, max(1.0, timeout - (time.monotonic() - t0)))
        if failed:
            raise Internal(f"cgroup {self.name}: cannot remove {sorted(failed)}", reason="CGROUP_NOT_EMPTY",
                           detail=failed)
        for p in self.paths:
            remove_run_dir(p)
        log.info("cgroup removed run=%s session=%s", self.run, self.session)


_V1_PROBE = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.shares",
             "freezer": "freezer.state", "devices": "devices.list"}


def _read_words(path: str) -> list[str]:
    try:
        return _read(path).split()
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------------------------------------
# drivers


class CgroupDriver:
    """Makes session groups on one kind of host. Use :func:`detect`, or a subclass directly in tests."""

    version = ""

    def roots(self) -> list[str]:
        """The hierarchy mount points this driver makes groups under."""
        raise NotImplementedError

    def plan(self, run: str, session: str) -> SessionCgroup:
        """The group of ``run``/``session`` without creating anything (record it, then create)."""
        raise NotImplementedError

    def _make(self, cg: SessionCgroup, made: list[str]) -> None:
        raise NotImplementedError

    def _apply(self, cg: SessionCgroup, limits: Limits) -> None:
        raise NotImplementedError

    def create(self, run: str, session: str, limits: Limits | None = None) -> SessionCgroup:
        """Make the group (idempotent: an existing one gets ``limits`` again) and set its limits.

        InvalidArgument for hostile names or bad limits (nothing made). Unavailable when the kernel
        refused and every directory this call made was removed again; Internal when not.
        """
        limits = limits if limits is not None else Limits()
        cg = self.plan(run, session)
        made: list[str] = []
        try:
            self._make(cg, made)
            self._apply(cg, limits)
        except OSError as exc:
            left = _undo(made)
            cls = Internal if left else Unavailable
            raise cls(f"cannot create cgroup {cg.name} ({self.version}): {exc}", reason="CGROUP_FAILED",
                      detail={"error": str(exc), "left": left}) from exc
        log.info("cgroup created run=%s session=%s driver=%s memory_max=%d pids_max=%d cpu_weight=%d",
                 run, session, self.version, limits.memory_max, limits.pids_max, limits.cpu_weight)
        return cg


def _undo(made: list[str]) -> list[str]:
    left = []
    for d in reversed(made):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError:
            left.append(d)
    return left


def _mkdirs(root: str, name: str, made: list[str], prepare: Callable[[str], None] | None = None) -> str:
    """mkdir ``root/name`` level by level; ``prepare(dir)`` runs on each level before its child is
    made. Retries when a concurrent remove of an empty ``drums/<run>`` races it."""
    for _ in range(5):
        d = root
        try:
            for part in name.split("/"):
                if prepare is not None:
                    prepare(d)
                d = os.path.join(d, part)
                try:
                    os.mkdir(d, 0o755)
                    made.append(d)
                except FileExistsError:
                    if not os.path.isdir(d) or os.path.islink(d):
                        raise
            return d
        except FileNotFoundError:
            continue
    raise OSError(errno.ENOENT, f"{root}/{name} kept disappearing while being made")


class CgroupV1Driver(CgroupDriver):
    """cgroup v1: ``mounts`` maps each role (memory, pids, cpu, optional freezer) to its hierarchy's
    mount point; a co-mounted ``cpu,cpuacct`` hierarchy serves the ``cpu`` role."""

    version = "v1"

    def __init__(self, mounts: Mapping[str, str]) -> None:
        missing = [r for r in REQUIRED if r not in mounts]
        if missing:
            raise FailedPrecondition(f"cgroup v1: no hierarchy for {', '.join(missing)}", reason="CGROUP_UNAVAILABLE")
        self.mounts = {r: mounts[r] for r in V1_ROLES if r in mounts}

    @classmethod
    def from_host(cls, found: Iterable[Hierarchy] | None = None) -> CgroupV1Driver:
        """The v1 hierarchies mounted here; FailedPrecondition naming the controllers that are not."""
        found = hierarchies() if found is None else found
        roles: dict[str, str] = {}
        for h in found:
            if h.version == 1:
                for r in V1_ROLES:
                    if r in h.controllers:
                        roles.setdefault(r, h.mountpoint)
        return cls(roles)

    def roots(self) -> list[str]:
        return sorted(set(self.mounts.values()))

    def plan(self, run: str, session: str) -> SessionCgroup:
        name = group_name(run, session)
        return SessionCgroup(name, "v1", {r: os.path.join(m, name) for r, m in self.mounts.items()})

    def _make(self, cg: SessionCgroup, made: list[str]) -> None:
        for role, mount in self.mounts.items():
            _mkdirs(mount, cg.name, made, _v1_memory_hierarchy if role == "memory" else None)

    def _apply(self, cg: SessionCgroup, limits: Limits) -> None:
        mem = cg.dirs["memory"]
        _v1_memory_hierarchy(mem)
        _write(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_max))
        _write(os.path.join(mem, "memory.soft_limit_in_bytes"), str(limits.memory_high))
        if parse_keyed(_read(os.path.join(mem, "memory.oom_control"))).get("oom_kill_disable"):
            _write(os.path.join(mem, "memory.oom_control"), "0")  # the OOM killer must act in the group
        _write(os.path.join(cg.dirs["pids"], "pids.max"), str(limits.pids_max))
        _write(os.path.join(cg.dirs["cpu"], "cpu.shares"), str(limits.cpu_shares))
        if "devices" in cg.dirs:
            _write(os.path.join(cg.dirs["devices"], "devices.deny"), "a")
            for rule in DEVICE_ALLOW:
                _write(os.path.join(cg.dirs["devices"], "devices.allow"), rule)


def _v1_memory_hierarchy(d: str) -> None:
    """Turn on ``memory.use_hierarchy`` where the kernel still lets it be off (always on since 5.x)."""
    f = os.path.join(d, "memory.use_hierarchy")
    with contextlib.suppress(FileNotFoundError):
        if _read(f).strip() == "0":
            try:
                _write(f, "1")
            except OSError as exc:
                log.warning("cgroup: cannot set %s to 1: %s", f, exc.strerror)


class CgroupV2Driver(CgroupDriver):
    """cgroup v2 under the unified mount ``root``.

    ``controllers`` are enabled in ``cgroup.subtree_control`` of ``root``, ``root/drums`` and
    ``root/drums/<run>``, and only their limits are written. :func:`detect` always asks for all of
    :data:`REQUIRED`; a driver with fewer (tests on a host whose controllers are bound to v1) sets
    fewer limits. FailedPrecondition when ``root`` lacks one of ``controllers``.
    """

    version = "v2"

    def __init__(self, root: str = "/sys/fs/cgroup", controllers: Iterable[str] = REQUIRED) -> None:
        self.root = procs.norm_path(root)
        self.controllers = frozenset(controllers)
        try:
            available = set(_read(os.path.join(self.root, "cgroup.controllers")).split())
        except OSError as exc:
            raise FailedPrecondition(f"cgroup v2: {self.root} is not a cgroup2 root: {exc.strerror}",
                                     reason="CGROUP_UNAVAILABLE") from exc
        missing = sorted(self.controllers - available)
        if missing:
            raise FailedPrecondition(
                f"cgroup v2 at {self.root}: controllers {', '.join(missing)} not available "
                f"(cgroup.controllers has {' '.join(sorted(available)) or 'none'}; bound to v1 hierarchies?)",
                reason="CGROUP_UNAVAILABLE")

    @classmethod
    def from_host(cls, found: Iterable[Hierarchy] | None = None) -> CgroupV2Driver:
        """The cgroup2 mount (``/sys/fs/cgroup`` first) with all of :data:`REQUIRED`."""
        found = hierarchies() if found is None else found
        roots = sorted((h.mountpoint for h in found if h.version == 2), key=lambda m: m != "/sys/fs/cgroup")
        if not roots:
            raise FailedPrecondition("cgroup v2: no cgroup2 mount", reason="CGROUP_UNAVAILABLE")
        errors = []
        for r in roots:
            try:
                return cls(r)
            except FailedPrecondition as exc:
                errors.append(exc.message)
        raise FailedPrecondition("; ".join(errors), reason="CGROUP_UNAVAILABLE")

    def roots(self) -> list[str]:
        return [self.root]

    def plan(self, run: str, session: str) -> SessionCgroup:
        name = group_name(run, session)
        return SessionCgroup(name, "v2", {"unified": os.path.join(self.root, name)}, self.controllers)

    def _enable(self, d: str) -> None:
        f = os.path.join(d, "cgroup.subtree_control")
        have = set(_read(f).split())
        for c in sorted(self.controllers - have):
            _write(f, "+" + c)

    def _make(self, cg: SessionCgroup, made: list[str]) -> None:
        leaf = cg.dirs["unified"]

        def prepare(d: str) -> None:
            if d != leaf:
                self._enable(d)

        _mkdirs(self.root, cg.name, made, prepare)

    def _apply(self, cg: SessionCgroup, limits: Limits) -> None:
        d = cg.dirs["unified"]
        if "memory" in self.controllers:
            _write(os.path.join(d, "memory.max"), str(limits.memory_max))
            _write(os.path.join(d, "memory.high"), str(limits.memory_high))
        if "pids" in self.controllers:
            _write(os.path.join(d, "pids.max"), str(limits.pids_max))
        if "cpu" in self.controllers:
            _write(os.path.join(d, "cpu.weight"), str(limits.cpu_weight))


def detect(prefer: str | None = None) -> CgroupDriver:
    """The driver for this host: v1 when its memory, pids and cpu hierarchies are mounted, else v2
    when a cgroup2 mount has those controllers. ``prefer`` ("v1"/"v2") tries only that one.
    FailedPrecondition (reason CGROUP_UNAVAILABLE) names what is missing."""
    if prefer not in (None, "v1", "v2"):
        raise InvalidArgument(f"unknown cgroup driver {prefer!r}: v1 or v2", reason="INVALID_ARGUMENT")
    try:
        found = hierarchies()
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"cannot read the mount table: {exc}", reason="CGROUP_UNAVAILABLE") from exc
    errors = []
    for version, cls in (("v1", CgroupV1Driver), ("v2", CgroupV2Driver)):
        if prefer in (None, version):
            try:
                return cls.from_host(found)
            except FailedPrecondition as exc:
                errors.append(exc.message)
    raise FailedPrecondition(f"no usable cgroup driver: {'; '.join(errors)}", reason="CGROUP_UNAVAILABLE")
