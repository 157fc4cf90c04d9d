"""What runs in a session, seen from the host: its processes, their identity and memory."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from ..errors import Unavailable
from ..host import bounded
from ..host.procs import is_alive, open_handle, read_stat, send_signal, starttime, wait_dead


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    nspid: int
    comm: str
    ppid: int


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _nspid(pid: int) -> int:
    try:
        text = bounded.read_proc(pid, "status").data.decode("utf-8", "surrogateescape")
    except (OSError, Unavailable):
        return -1
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return -1


def session_processes(init_pid: int) -> list[ProcessInfo]:
    """Every live process in the pid namespace whose init is ``init_pid``."""
    ns = _pidns(init_pid)
    if ns is None:
        return []
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if _pidns(pid) != ns:
            continue
        st = read_stat(pid)
        if st is None or st.zombie:
            continue
        out.append(ProcessInfo(pid=pid, nspid=_nspid(pid), comm=st.comm, ppid=st.ppid))
    return sorted(out, key=lambda p: p.nspid)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _refs_under(pid: int, top: str) -> bool:
    """Whether the process's root, cwd or any open file is at or under ``top``."""
    for link in ("root", "cwd"):
        try:
            if _under(os.readlink(f"/proc/{pid}/{link}"), top):
                return True
        except OSError:
            pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if _under(os.readlink(f"/proc/{pid}/fd/{fd}"), top):
                return True
        except OSError:
            continue
    return False


def _mount_devs_under(top: str) -> set[int]:
    """Device numbers of the mounts at or under ``top`` in this mount namespace (a session's overlay)."""
    devs = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if _under(parts[4], top):
                major, minor = (int(x) for x in parts[2].split(":"))
                devs.add(os.makedev(major, minor))
    return devs


def _root_dev(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/root").st_dev
    except OSError:
        return None


def kill_tree_under(top: str) -> int:
    """SIGKILL every live process whose root, cwd or an open file is at or under ``top`` (a session's
    directory: its restored tasks, and a CRIU still working on it). Returns how many.

    A task that pivoted into the session's root (its init, every task CRIU restored) reads ``/`` as
    ``/proc/<pid>/root``: it is found by its root's device, the session overlay's own, which is why
    this must run while the overlay is still mounted.
    """
    top = os.path.realpath(top)
    devs = _mount_devs_under(top)
    me = os.getpid()
    victims = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if (_refs_under(pid, top) or (devs and _root_dev(pid) in devs)) and is_alive(pid):
            start = starttime(pid)
            handle = open_handle(pid, start) if start is not None else None
            if handle is not None:
                victims.append(handle)
    try:
        for handle in victims:
            send_signal(handle, signal.SIGKILL)
        wait_dead(victims, 5)
    finally:
        for handle in victims:
            handle.close()
    return len(victims)


def pss_kib(pid: int) -> int:
    try:
        text = bounded.read_proc(pid, "smaps_rollup").data.decode("utf-8", "surrogateescape")
    except (OSError, Unavailable):
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0
