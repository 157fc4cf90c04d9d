"""Files inside a session root, opened from the host without following anything the session planted.

A session's root is untrusted: its owner (root inside the session) can turn any path in it into a
symlink to a host file. Every file the daemon reads or writes inside a session root goes through
:func:`open_in_root`, which resolves the path with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS)`` against an fd of the root: a symlink anywhere on the path (including the
last component) fails with ``ELOOP``, and ``..`` can never climb out. Failures become
:class:`~drums_core.errors.FailedPrecondition` with reason ``UNSAFE_PATH`` naming the path.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
from contextlib import contextmanager
from typing import Iterator

from ..errors import FailedPrecondition
from ..reasons import Reason

_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0,
            resolve: int = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) -> int:
    """The raw syscall; raises OSError."""
    takes_mode = flags & os.O_CREAT or (flags & os.O_TMPFILE) == os.O_TMPFILE
    how = _OpenHow(flags | os.O_CLOEXEC, mode if takes_mode else 0, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"openat2 {path}: {os.strerror(err)}")
    return fd


def _unsafe(root: str, rel: str, exc: OSError) -> FailedPrecondition:
    why = "a symlink on the path" if exc.errno in (errno.ELOOP, errno.EXDEV) else exc.strerror
    return FailedPrecondition(f"refusing {rel!r} in session root {root}: {why}", reason=Reason.UNSAFE_PATH,
                              detail={"path": rel, "root": root, "errno": exc.errno})


@contextmanager
def root_fd(root: str) -> Iterator[int]:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def open_in_root(root: str, rel: str, flags: int, mode: int = 0o644) -> int:
    """An fd for ``rel`` resolved inside ``root`` (no symlinks, no escape)."""
    with root_fd(root) as rfd:
        try:
            return openat2(rfd, rel.lstrip("/"), flags, mode)
        except OSError as exc:
            raise _unsafe(root, rel, exc) from exc


def write_file(root: str, rel: str, data: bytes | str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Replace the content of ``root/rel`` (created if absent); a regular file only."""
    raw = data.encode() if isinstance(data, str) else data
    # O_NONBLOCK: a FIFO planted at the path must not hang the daemon before the type check
    fd = open_in_root(root, rel, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FailedPrecondition(f"refusing {rel!r} in session root {root}: not a regular file",
                                     reason=Reason.UNSAFE_PATH, detail={"path": rel, "root": root})
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        os.write(fd, raw)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def replace_file(root: str, rel: str, data: bytes | str, mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
    """Put a new regular file at ``root/rel``, replacing whatever has that name (a symlink is
    replaced, never followed): written beside it under a fresh name, then renamed over it, with the
    parent directory resolved safely."""
    import secrets

    raw = data.encode() if isinstance(data, str) else data
    parent, _, name = rel.strip("/").rpartition("/")
    pfd = open_in_root(root, parent or ".", os.O_PATH | os.O_DIRECTORY)
    tmp = f".{name}.drums-{secrets.token_hex(6)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=pfd)
        try:
            os.write(fd, raw)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=pfd)
        except OSError:
            pass
        raise _unsafe(root, rel, exc) from exc
    finally:
        os.close(pfd)


def read_file(root: str, rel: str, limit: int = 1 << 20, timeout: float = 30.0) -> bytes:
    """A regular file of a session root, read through :mod:`.bounded`: Unavailable
    ``SESSION_REPLY_TOO_LARGE`` over ``limit`` bytes, ``SESSION_REPLY_TIMEOUT`` after ``timeout`` s."""
    from . import bounded

    fd = open_in_root(root, rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FailedPrecondition(f"refusing {rel!r} in session root {root}: not a regular file",
                                     reason=Reason.UNSAFE_PATH, detail={"path": rel, "root": root})
        return bounded.read_fd(fd, limit=limit, timeout=timeout, what=f"{rel!r} in session root {root}").data
    finally:
        os.close(fd)


def make_dir(root: str, rel: str, mode: int = 0o755, owner: tuple[int, int] | None = None) -> None:
    """``mkdir`` of the last component of ``rel`` under a parent resolved safely; fine if it is a directory."""
    parent, _, name = rel.strip("/").rpartition("/")
    pfd = open_in_root(root, parent or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        try:
            os.mkdir(name, mode, dir_fd=pfd)
        except FileExistsError:
            pass
        fd = openat2(pfd, name, os.O_PATH | os.O_DIRECTORY, resolve=RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        try:
            if owner is not None:
                os.chown(f"/proc/self/fd/{fd}", *owner)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unsafe(root, rel, exc) from exc
    finally:
        os.close(pfd)


def connect_unix(root: str, rel: str, timeout: float | None = None) -> socket.socket:
    """Connect to a unix socket inside ``root`` through an O_PATH fd (no symlink is followed)."""
    fd = open_in_root(root, rel, os.O_PATH)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        os.close(fd)
