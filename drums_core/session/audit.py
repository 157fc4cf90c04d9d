"""Sharing audit: what two sessions both reference (files, pipes, sockets, locks, devices).

Siblings must share nothing writable. Objects are identified by (device, inode) from the fds and
memory maps of every process of each session, plus the locks in ``/proc/locks``. Character devices
are compared by device number, so two sessions' own ``/dev/null`` nodes show up as the same
``/dev/null``-class device (harmless) rather than as nothing.
"""
from __future__ import annotations

import os
import stat

from .processes import session_processes

HARMLESS_CHR = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0)}  # null zero full random urandom tty


def _objects(init_pid: int) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    pids = [p.pid for p in session_processes(init_pid)]
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            path = f"{fd_dir}/{fd}"
            try:
                st = os.stat(path)
                target = os.readlink(path)
            except OSError:
                continue
            rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
            if stat.S_ISCHR(st.st_mode) and rdev in HARMLESS_CHR:
                key = ("chr", rdev)
                kind = "chardev"
            elif target.startswith("anon_inode:"):
                # every anon file has the one anon inode: identity is the open file, compared by kcmp
                key = ("anon", target, pid, int(fd))
                kind = "anon"
            else:
                key = ("ino", st.st_dev, st.st_ino)
                kind = ("pipe" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                        else "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other")
            out.setdefault(key, {"kind": kind, "target": target, "pids": []})["pids"].append(pid)
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or parts[4] == "0":
                        continue
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    key = ("ino", os.makedev(major, minor), int(parts[4]))
                    out.setdefault(key, {"kind": "mapping", "target": parts[5].strip(), "pids": []})["pids"].append(pid)
        except OSError:
            continue
    try:
        with open("/proc/locks") as f:
            pidset = set(pids)
            for line in f:
                fields = line.split()
                try:
                    lpid = int(fields[4])
                except (IndexError, ValueError):
                    continue
                if lpid in pidset:
                    major, minor, ino = fields[5].split(":")
                    key = ("ino", os.makedev(int(major, 16), int(minor, 16)), int(ino))
                    out.setdefault(key, {"kind": "lock", "target": fields[5], "pids": []})["pids"].append(lpid)
    except OSError:
        pass
    return out


def _kcmp_same_file(pid1: int, fd1: int, pid2: int, fd2: int) -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(312, pid1, pid2, 0, fd1, fd2) == 0  # SYS_kcmp, KCMP_FILE


def _shared_anon(a: dict, b: dict) -> list[dict]:
    out = []
    anon_a = [k for k in a if k[0] == "anon"]
    anon_b = [k for k in b if k[0] == "anon"]
    for ka in anon_a:
        for kb in anon_b:
            if ka[1] == kb[1] and _kcmp_same_file(ka[2], ka[3], kb[2], kb[3]):
                out.append({"kind": "anon", "target": ka[1], "key": list(map(str, ka)), "harmless": False})
    return out


def sharing_audit(init_a: int, init_b: int, layer_devs: set[int] | None = None) -> dict:
    """Objects referenced by both sessions.

    ``shared`` lists the writable-capable objects both reference; ``unexpected`` those of them that
    are not /dev/null-class devices. Files both map or open from a read-only lower layer (the base
    root or a frozen checkpoint layer, identified by ``layer_devs``) cannot be written through an
    overlay (a write copies up into the session's own upper), so they are counted apart in
    ``readonly_layer_files``.
    """
    layer_devs = layer_devs or set()
    a, b = _objects(init_a), _objects(init_b)
    shared = []
    readonly = 0
    for key in sorted(set(a) & set(b), key=str):
        kind = a[key]["kind"]
        if key[0] == "ino" and key[1] in layer_devs and kind in ("mapping", "file", "dir"):
            readonly += 1
            continue
        entry = {"kind": kind, "target": a[key]["target"], "key": list(map(str, key)),
                 "harmless": key[0] == "chr" and key[1] in HARMLESS_CHR}
        shared.append(entry)
    shared.extend(_shared_anon(a, b))
    return {"shared": shared, "unexpected": [s for s in shared if not s["harmless"]],
            "readonly_layer_files": readonly, "objects": {"a": len(a), "b": len(b)}}
