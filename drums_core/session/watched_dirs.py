"""Bring the directories a session's inotify watches point at back into the kernel's dentry cache
before a dump.

CRIU dumps an inotify watch by the file handle the kernel prints in the watch's fdinfo
(``fhandle-bytes``, ``f_handle``). Overlayfs can make that handle only from a cached dentry of the
watched inode; the watch holds the inode, not its dentry, so under memory pressure (a host full of
desktops) the dentry is reclaimed, the fdinfo line comes without a handle and CRIU fails the dump
(``parse_fdinfo_pid_s: error parsing [inotify wd:...]``). Looking the directory up again by path
puts its dentry back. Which directories are watched is not known (that is what the handle would
say), so :func:`warm` walks the session's root for the watched inodes, never following a link,
the usual places first (:data:`FIRST`), within :data:`WALK_LIMIT` names and :data:`WALK_SECONDS`.
"""
from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections import deque

from ..host import procs
from .processes import session_processes

log = logging.getLogger("drums.session.watched_dirs")

# Where desktops' watches are: the session bus's service and config directories, home, runtime dirs.
FIRST = ("etc/dbus-1", "usr/share/dbus-1", "home", "root", "tmp", "run", "etc", "var", "usr/share", "usr/local",
         "opt", "usr", "")
WALK_LIMIT = 400_000
WALK_SECONDS = 5.0
_WATCH = re.compile(rb"^inotify wd:[0-9a-f]+ ino:([0-9a-f]+) sdev:([0-9a-f]+) ", re.M)


def _kdev(sdev: int) -> int:
    """The kernel's dev_t as fdinfo prints it (MAJOR << 20 | MINOR) as ``st_dev``."""
    return os.makedev(sdev >> 20, sdev & 0xFFFFF)


def unhandled_watches(init_pid: int) -> set[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every inotify watch of the session whose fdinfo line carries no file
    handle (the ones CRIU cannot dump)."""
    want: set[tuple[int, int]] = set()
    for p in session_processes(init_pid):
        for info in procs.inotify_fdinfos(p.pid):
            for line in info.splitlines():
                m = _WATCH.match(line)
                if m and b"fhandle-bytes:" not in line:
                    want.add((_kdev(int(m.group(2), 16)), int(m.group(1), 16)))
    return want


def warm(init_pid: int) -> dict:
    """Look up, inside the session's root, the watched directories whose dentries the kernel let go
    (see the module docstring). Returns what it did: ``missing``, ``found``, ``walked``, ``seconds``."""
    t0 = time.monotonic()
    want = unhandled_watches(init_pid)
    report = {"missing": len(want), "found": 0, "walked": 0, "seconds": 0.0}
    if not want:
        return report
    root = f"/proc/{init_pid}/root"
    devs = {dev for dev, _ in want}
    seen_dirs: set[tuple[int, int]] = set()
    queue = deque(os.path.join(root, d) if d else root for d in FIRST)
    deadline = t0 + WALK_SECONDS
    while queue and want and report["walked"] < WALK_LIMIT and time.monotonic() < deadline:
        path = queue.popleft()
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen_dirs:
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            want.discard((st.st_dev, st.st_ino))
            with os.scandir(path) as it:
                for entry in it:
                    report["walked"] += 1
                    try:
                        est = entry.stat(follow_symlinks=False)  # the lookup that caches the dentry
                    except OSError:
                        continue
                    if (est.st_dev, est.st_ino) in want:
                        want.discard((est.st_dev, est.st_ino))
                        report["found"] += 1
                    if stat.S_ISDIR(est.st_mode) and est.st_dev in devs:
                        queue.append(entry.path)
        except OSError:
            continue
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["found"] = report["missing"] - len(want)
    if want:
        log.warning("session %d: %d inotify watch(es) not found again in %d names (%.2fs); the dump may fail",
                    init_pid, len(want), report["walked"], report["seconds"])
    return report
