"""Emptying and removing groups, shared by :class:`~drums_core.session.cgroup_session.SessionCgroup`
and the sweep: freeze, SIGKILL every member by pidfd, thaw, until empty; then rmdir, nested first."""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..host import procs
from .cgroup_fs import BASE, POLL, members, parse_keyed, read_procs, read_value, walk, write_value


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
                write_value(os.path.join(p, "freezer.state"), "FROZEN")
                done.append((os.path.join(p, "freezer.state"), "THAWED"))
        for p in v2:
            with contextlib.suppress(FileNotFoundError):
                write_value(os.path.join(p, "cgroup.freeze"), "1")
                done.append((os.path.join(p, "cgroup.freeze"), "0"))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not all(_settled(p) for p in v1 + v2):
            time.sleep(POLL)
        yield
    finally:
        for f, value in done:
            with contextlib.suppress(FileNotFoundError):
                write_value(f, value)


def _settled(path: str) -> bool:
    try:
        if os.path.exists(os.path.join(path, "freezer.state")):
            return read_value(os.path.join(path, "freezer.state")).strip() == "FROZEN"
        return parse_keyed(read_value(os.path.join(path, "cgroup.events"))).get("frozen") == 1
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
                            write_value(os.path.join(p, "cgroup.kill"), "1")
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
        for d in reversed(walk(top)):
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
        time.sleep(POLL)


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
