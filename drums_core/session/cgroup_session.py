"""One session's group (:class:`SessionCgroup`): its directories under each hierarchy, attaching a
process, reading its usage (members, OOM kills, memory), killing its members and removing it."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import FailedPrecondition, Internal, InvalidArgument, NotFound
from ..reasons import Reason
from .cgroup_fs import PROCS, REQUIRED, V1_ROLES, members, parse_group_name, parse_keyed, read_value, write_value
from .cgroup_kill import kill_members, remove_dirs, remove_run_dir

log = logging.getLogger("drums.cgroups")


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
            raise InvalidArgument(f"cgroup record {name!r} lacks driver/paths", reason=Reason.INVALID_ARGUMENT)
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
                                         reason=Reason.CONTROLLER_NOT_ENABLED)
            return self.dirs["unified"]
        if role not in self.dirs:
            raise FailedPrecondition(f"cgroup {self.name}: no {role} hierarchy", reason=Reason.CONTROLLER_NOT_ENABLED)
        return self.dirs[role]

    def exists(self) -> bool:
        return any(os.path.isdir(p) for p in self.paths)

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group in every hierarchy."""
        for p in self.paths:
            try:
                write_value(os.path.join(p, PROCS), str(int(pid)))
            except ProcessLookupError as exc:
                raise NotFound(f"cannot move pid {pid} into {self.name}: no such process",
                               reason=Reason.NO_SUCH_PROCESS) from exc
            except OSError as exc:
                raise Internal(f"cannot move pid {pid} into {p}: {exc.strerror}", reason=Reason.CGROUP_FAILED,
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
            return read_value(path)
        except OSError as exc:
            raise Internal(f"cgroup {self.name}: cannot read {path}: {exc.strerror}",
                           reason=Reason.CGROUP_FAILED) from exc

    def kill_all(self, timeout: float = 5.0) -> int:
        """SIGKILL every process in the group and wait until it is empty; returns how many died.
        Internal (reason CGROUP_NOT_EMPTY) when members are still there after ``timeout``."""
        res = kill_members(self.paths, timeout)
        if res.left:
            raise Internal(f"cgroup {self.name}: {len(res.left)} processes survived SIGKILL",
                           reason=Reason.CGROUP_NOT_EMPTY, detail={"pids": res.left})
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
            raise Internal(f"cgroup {self.name}: cannot remove {sorted(failed)}", reason=Reason.CGROUP_NOT_EMPTY,
                           detail=failed)
        for p in self.paths:
            remove_run_dir(p)
        log.info("cgroup removed run=%s session=%s", self.run, self.session)


_V1_PROBE = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.shares",
             "freezer": "freezer.state", "devices": "devices.list"}


def _read_words(path: str) -> list[str]:
    try:
        return read_value(path).split()
    except FileNotFoundError:
        return []
