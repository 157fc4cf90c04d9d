"""Thin ctypes wrappers for the Linux calls Python 3.11 lacks (mount, unshare, setns, pivot_root).

Every wrapper raises OSError with the errno, so callers translate failures once, at their boundary.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_MEMORY_MERGE = 67


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(), target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or ''} {source} on {target}",
    )


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(os.fsencode(target), flags), f"umount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_libc.syscall(155, new_root.encode(), put_old.encode()), f"pivot_root {new_root}")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


AT_FDCWD = -100
RENAME_EXCHANGE = 2


def rename_exchange(a: str | os.PathLike, b: str | os.PathLike) -> None:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE): at no instant does either name miss."""
    _check(_libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE),
           f"renameat2({a}, {b}, RENAME_EXCHANGE)")


def syncfs(path: str | os.PathLike) -> None:
    """Flush the filesystem that holds ``path`` (a directory) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check(_libc.syncfs(fd), f"syncfs {path}")
    finally:
        os.close(fd)


class _Statfs(ctypes.Structure):  # struct statfs (x86_64): f_type first, 120 bytes in all
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 112)]


def statfs_type(path: str | os.PathLike) -> int:
    """The magic number of the filesystem that holds ``path`` (``statfs(2)``'s ``f_type``)."""
    buf = _Statfs()
    _check(_libc.statfs(os.fsencode(path), ctypes.byref(buf)), f"statfs {path}")
    return buf.f_type & 0xFFFFFFFF


def prctl(option: int, arg2: int = 0) -> int:
    return _check(_libc.prctl(option, ctypes.c_ulong(arg2), 0, 0, 0), f"prctl({option})")
