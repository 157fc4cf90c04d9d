"""Making sessions' groups and applying their :class:`Limits`: :class:`CgroupV1Driver` (one directory
per controller hierarchy) and :class:`CgroupV2Driver` (the unified hierarchy), chosen by :func:`detect`."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import FailedPrecondition, Internal, InvalidArgument, Unavailable
from ..reasons import Reason
from ..host.kernel_budget import SESSION_MEMORY_MAX, SESSION_PIDS
from ..host import ownedpaths
from .cgroup_fs import REQUIRED, V1_ROLES, Hierarchy, group_name, hierarchies, parse_keyed, read_value, write_value
from .cgroup_session import SessionCgroup

log = logging.getLogger("drums.cgroups")

MiB = 1 << 20
GiB = 1 << 30
# The device nodes a session may open or make (v1 devices controller; Docker's default list minus
# what a desktop does not use). Anything else (a node in a layer a bundle or an image brought) is refused.
DEVICE_ALLOW = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
                "c 136:* rwm")


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

    memory_max: int = SESSION_MEMORY_MAX  # the host budget (host/kernel_budget.py) counts every slot at this
    memory_high: int | None = None
    pids_max: int = SESSION_PIDS  # the host budget (host/kernel_budget.py) counts every slot at this
    cpu_weight: int = 100

    MIN_MEMORY = 8 * MiB
    MAX_MEMORY = 1 << 50
    MAX_PIDS = SESSION_PIDS  # the host's pid budget (host/kernel_budget.py) counts every slot at this

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
        raise InvalidArgument(f"limit {name}={v!r} must be an integer in {lo}..{hi}", reason=Reason.BAD_LIMITS)



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

    def set_cpu_weight(self, cg: SessionCgroup, limits: Limits) -> None:
        """Write ``limits.cpu_weight`` alone into a live group (the restore's boost and its end)."""
        if "cpu" in cg.dirs:
            write_value(os.path.join(cg.dirs["cpu"], "cpu.shares"), str(limits.cpu_shares))
        elif "unified" in cg.dirs and os.path.exists(os.path.join(cg.dirs["unified"], "cpu.weight")):
            write_value(os.path.join(cg.dirs["unified"], "cpu.weight"), str(limits.cpu_weight))

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
            raise cls(f"cannot create cgroup {cg.name} ({self.version}): {exc}", reason=Reason.CGROUP_FAILED,
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
            raise FailedPrecondition(f"cgroup v1: no hierarchy for {', '.join(missing)}",
                                     reason=Reason.CGROUP_UNAVAILABLE)
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
        write_value(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_max))
        write_value(os.path.join(mem, "memory.soft_limit_in_bytes"), str(limits.memory_high))
        if parse_keyed(read_value(os.path.join(mem, "memory.oom_control"))).get("oom_kill_disable"):
            write_value(os.path.join(mem, "memory.oom_control"), "0")  # the OOM killer must act in the group
        write_value(os.path.join(cg.dirs["pids"], "pids.max"), str(limits.pids_max))
        write_value(os.path.join(cg.dirs["cpu"], "cpu.shares"), str(limits.cpu_shares))
        if "devices" in cg.dirs:
            write_value(os.path.join(cg.dirs["devices"], "devices.deny"), "a")
            for rule in DEVICE_ALLOW:
                write_value(os.path.join(cg.dirs["devices"], "devices.allow"), rule)


def _v1_memory_hierarchy(d: str) -> None:
    """Turn on ``memory.use_hierarchy`` where the kernel still lets it be off (always on since 5.x)."""
    f = os.path.join(d, "memory.use_hierarchy")
    with contextlib.suppress(FileNotFoundError):
        if read_value(f).strip() == "0":
            try:
                write_value(f, "1")
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
        self.root = ownedpaths.norm_path(root)
        self.controllers = frozenset(controllers)
        try:
            available = set(read_value(os.path.join(self.root, "cgroup.controllers")).split())
        except OSError as exc:
            raise FailedPrecondition(f"cgroup v2: {self.root} is not a cgroup2 root: {exc.strerror}",
                                     reason=Reason.CGROUP_UNAVAILABLE) from exc
        missing = sorted(self.controllers - available)
        if missing:
            raise FailedPrecondition(
                f"cgroup v2 at {self.root}: controllers {', '.join(missing)} not available "
                f"(cgroup.controllers has {' '.join(sorted(available)) or 'none'}; bound to v1 hierarchies?)",
                reason=Reason.CGROUP_UNAVAILABLE)

    @classmethod
    def from_host(cls, found: Iterable[Hierarchy] | None = None) -> CgroupV2Driver:
        """The cgroup2 mount (``/sys/fs/cgroup`` first) with all of :data:`REQUIRED`."""
        found = hierarchies() if found is None else found
        roots = sorted((h.mountpoint for h in found if h.version == 2), key=lambda m: m != "/sys/fs/cgroup")
        if not roots:
            raise FailedPrecondition("cgroup v2: no cgroup2 mount", reason=Reason.CGROUP_UNAVAILABLE)
        errors = []
        for r in roots:
            try:
                return cls(r)
            except FailedPrecondition as exc:
                errors.append(exc.message)
        raise FailedPrecondition("; ".join(errors), reason=Reason.CGROUP_UNAVAILABLE)

    def roots(self) -> list[str]:
        return [self.root]

    def plan(self, run: str, session: str) -> SessionCgroup:
        name = group_name(run, session)
        return SessionCgroup(name, "v2", {"unified": os.path.join(self.root, name)}, self.controllers)

    def _enable(self, d: str) -> None:
        f = os.path.join(d, "cgroup.subtree_control")
        have = set(read_value(f).split())
        for c in sorted(self.controllers - have):
            write_value(f, "+" + c)

    def _make(self, cg: SessionCgroup, made: list[str]) -> None:
        leaf = cg.dirs["unified"]

        def prepare(d: str) -> None:
            if d != leaf:
                self._enable(d)

        _mkdirs(self.root, cg.name, made, prepare)

    def _apply(self, cg: SessionCgroup, limits: Limits) -> None:
        d = cg.dirs["unified"]
        if "memory" in self.controllers:
            write_value(os.path.join(d, "memory.max"), str(limits.memory_max))
            write_value(os.path.join(d, "memory.high"), str(limits.memory_high))
        if "pids" in self.controllers:
            write_value(os.path.join(d, "pids.max"), str(limits.pids_max))
        if "cpu" in self.controllers:
            write_value(os.path.join(d, "cpu.weight"), str(limits.cpu_weight))


def detect(prefer: str | None = None) -> CgroupDriver:
    """The driver for this host: v1 when its memory, pids and cpu hierarchies are mounted, else v2
    when a cgroup2 mount has those controllers. ``prefer`` ("v1"/"v2") tries only that one.
    FailedPrecondition (reason CGROUP_UNAVAILABLE) names what is missing."""
    if prefer not in (None, "v1", "v2"):
        raise InvalidArgument(f"unknown cgroup driver {prefer!r}: v1 or v2", reason=Reason.INVALID_ARGUMENT)
    try:
        found = hierarchies()
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"cannot read the mount table: {exc}", reason=Reason.CGROUP_UNAVAILABLE) from exc
    errors = []
    for version, cls in (("v1", CgroupV1Driver), ("v2", CgroupV2Driver)):
        if prefer in (None, version):
            try:
                return cls.from_host(found)
            except FailedPrecondition as exc:
                errors.append(exc.message)
    raise FailedPrecondition(f"no usable cgroup driver: {'; '.join(errors)}", reason=Reason.CGROUP_UNAVAILABLE)
