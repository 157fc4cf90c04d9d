"""Cgroups on the filesystem: group names (``drums/<run>/<session>``), the mounted hierarchies, the
check that a directory is a group Drums may touch, the groups that exist, and reading and writing
a group's files (its members, :func:`enter`)."""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import check_name
from ..errors import InvalidArgument
from ..reasons import Reason
from ..host import mounttable, ownedpaths

BASE = "drums"
REQUIRED = ("memory", "pids", "cpu")          # controllers a session's limits need (v1 and v2)
V1_ROLES = ("memory", "pids", "cpu", "freezer", "devices")  # v1 hierarchies a session's group lives in
V1_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "net_prio",
                            "blkio", "perf_event", "hugetlb", "pids", "rdma", "misc"})
PROCS = "cgroup.procs"
MAX_WALK = 4096          # at most this many nested directories are visited under one group
POLL = 0.01


# ---------------------------------------------------------------------------------------------
# names and hierarchies


def _check(name: str, what: str) -> str:
    # config.check_name's pattern ends in ``$``, which also matches before a trailing newline
    if isinstance(name, str) and "\n" in name:
        raise InvalidArgument(f"invalid {what} {name!r}: control character", reason=Reason.INVALID_NAME)
    return check_name(name, what)


def group_name(run: str, session: str) -> str:
    """``drums/<run>/<session>``; hostile names raise InvalidArgument (reason INVALID_NAME)."""
    return f"{BASE}/{_check(run, 'run')}/{_check(session, 'session')}"


def parse_group_name(name: str) -> tuple[str, str]:
    """(run, session) of ``drums/<run>/<session>``. InvalidArgument for anything else."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 3 or parts[0] != BASE:
        raise InvalidArgument(f"invalid cgroup name {name!r}: want {BASE}/<run>/<session>", reason=Reason.INVALID_NAME)
    return _check(parts[1], "run"), _check(parts[2], "session")


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: ``version`` 1 (with its ``controllers``) or 2."""

    mountpoint: str
    version: int
    controllers: frozenset[str] = frozenset()


def hierarchies(mounts: Iterable[mounttable.MountInfo] | None = None) -> list[Hierarchy]:
    """Every cgroup hierarchy mounted in this mount namespace, once each (first mount point wins).
    Raises OSError/ValueError when the mount table cannot be read."""
    table = mounttable.read_mountinfo() if mounts is None else mounts
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


def cgroup_mountpoints(mounts: Iterable[mounttable.MountInfo]) -> set[str]:
    """Mount points of every cgroup/cgroup2 mount in ``mounts`` (the roots the sweep may act under)."""
    return {m.mountpoint for m in mounts if m.fstype in ("cgroup", "cgroup2")}


def check_group_dir(path: str, mounts: Sequence[mounttable.MountInfo]) -> str | None:
    """None when ``path`` is ``<cgroup mount>/drums/<run>/<session>`` with that cgroup mount the
    deepest mount holding it and no symlink on the way; else why not (the sweep then keeps it)."""
    try:
        norm = ownedpaths.check_owned_path(path)
        name = "/".join(norm.split("/")[-3:])
        parse_group_name(name)
    except (ValueError, InvalidArgument) as exc:
        return f"{path!r} is not a cgroup path of Drums: {exc}"
    root = norm[: -len(name) - 1]
    holder = max((m for m in mounts if ownedpaths.path_within(norm, m.mountpoint)), key=lambda m: m.depth, default=None)
    if holder is None or holder.fstype not in ("cgroup", "cgroup2") or holder.mountpoint != root:
        return f"{path} is not directly under a cgroup mount (deepest mount: {holder.mountpoint if holder else '-'})"
    if os.path.lexists(norm) and os.path.realpath(norm) != norm:
        return f"{path} goes through a symlink"
    return None


def list_run_groups(mounts: Iterable[mounttable.MountInfo] | None = None) -> dict[str, list[str]]:
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


def read_value(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def write_value(path: str, value: str) -> None:
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
        text = read_value(os.path.join(path, PROCS))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(x) for x in text.split() if x.isdigit() and int(x) > 0]


def walk(path: str) -> list[str]:
    """``path`` and every directory (nested group) under it, parents first; never follows symlinks."""
    out, todo = [], [path]
    while todo and len(out) < MAX_WALK:
        d = todo.pop()
        out.append(d)
        todo.extend(os.path.join(d, n) for n in reversed(_subdirs(d)))
    return out


def members(paths: Iterable[str]) -> set[int]:
    """Every process in the groups ``paths`` and in groups nested under them."""
    return {pid for p in paths for d in walk(p) for pid in read_procs(d)}


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
