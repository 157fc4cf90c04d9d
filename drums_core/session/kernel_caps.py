"""Each session's share of the kernel's per-user counts, written into its own user namespace.

The kernel charges a per-user count (inotify instances and watches, fanotify groups and marks,
namespaces of each kind) at every level of the user-namespace chain: to ``(namespace, uid)`` where
the process runs, then to ``(parent, owner of the namespace)`` one level up, and so on. A session's
user namespace is made by host root, so without a cap of its own every session's inotify instances
land on host root's count (``fs.inotify.max_user_instances``, 128 by default): one desktop user
holding 119 of them made CRIU's own ``inotify_init`` fail for every restore on the host.

Each level checks its own ``/proc/sys/user/max_*`` (the values of the namespace the writer runs in).
Drums writes the caps into every session's user namespace before any of the session's
programs run: a fresh session's by the launcher (after the id maps), a restored one's at CRIU's
``setup-namespaces`` point (the namespace exists, no restored task runs yet). A session cannot raise
them: ``/proc/sys`` is a locked read-only mount in it, and a nested user namespace it makes is
charged at the session's level too. The host's own limits are raised to fit every slot's share plus
host root's own need (:mod:`drums_core.host.kernel_budget`).

The values are :data:`drums_core.host.kernel_budget.SESSION_CAPS`.
"""
from __future__ import annotations

import os

from ..errors import Unavailable
from ..reasons import Reason
from ..host import linux
from ..host.kernel_budget import SESSION_CAPS



def _write_caps(proc_fd: int, caps: dict[str, int]) -> None:
    for name, value in caps.items():
        try:
            fd = os.open(f"sys/user/{name}", os.O_WRONLY, dir_fd=proc_fd)
        except FileNotFoundError:  # a kernel without this count (max_time_namespaces before 5.6, ...)
            continue
        try:
            os.write(fd, f"{value}\n".encode())
        finally:
            os.close(fd)


def join_and_write(proc_fd: int, ns_fd: int, caps: dict[str, int] | None = None) -> None:
    """Join the user namespace ``ns_fd`` (for good: the caller must need no host privilege after)
    and write ``caps`` through the host's ``/proc`` at ``proc_fd``. For a single-threaded process
    that is done with its privileged work (the launcher's child, after it wrote the id maps)."""
    linux.setns(ns_fd, linux.CLONE_NEWUSER)
    _write_caps(proc_fd, SESSION_CAPS if caps is None else caps)


def apply(userns_pid: int, caps: dict[str, int] | None = None, *, proc_fd: int | None = None) -> None:
    """Write ``caps`` (default :data:`SESSION_CAPS`) into the user namespace of host pid ``userns_pid``.

    Runs in a forked child that joins that user namespace (the values a write sets are those of the
    writer's user namespace) through the host's ``/proc`` (``proc_fd``, default ``/proc``), then
    exits: the caller keeps its own credentials. Raises Unavailable ``KERNEL_CAPS_FAILED`` when the
    namespace cannot be joined or a value cannot be written (the session must not run uncapped)."""
    caps = SESSION_CAPS if caps is None else caps
    own_proc = proc_fd is None
    if own_proc:
        proc_fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
    try:
        ns_fd = os.open(f"{userns_pid}/ns/user", os.O_RDONLY, dir_fd=proc_fd)
    except OSError as exc:
        if own_proc:
            os.close(proc_fd)
        raise Unavailable(f"could not open the user namespace of pid {userns_pid}: {exc}",
                          reason=Reason.KERNEL_CAPS_FAILED) from exc
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # only os-level calls from here: the parent may be a threaded daemon
            status = 1
            try:
                os.close(r)
                join_and_write(proc_fd, ns_fd, caps)
                status = 0
            except BaseException as exc:  # noqa: BLE001 - reported through the pipe
                try:
                    os.write(w, f"{type(exc).__name__}: {exc}".encode()[:1000])
                except OSError:
                    pass
            finally:
                os._exit(status)
        os.close(w)
        w = -1
        err = b""
        while chunk := os.read(r, 1024):
            err += chunk
            if len(err) > 4096:
                break
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise Unavailable(f"could not write the session's kernel caps into its user namespace "
                              f"(pid {userns_pid}): {err.decode(errors='replace') or 'helper failed'}",
                              reason=Reason.KERNEL_CAPS_FAILED)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        os.close(ns_fd)
        if own_proc:
            os.close(proc_fd)


def read(userns_pid: int) -> dict[str, int]:
    """The caps in force in the user namespace of host pid ``userns_pid`` (read from inside it, as
    :func:`apply` writes them), for tests and ``drums doctor``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            fd = os.open(f"/proc/{userns_pid}/ns/user", os.O_RDONLY)
            linux.setns(fd, linux.CLONE_NEWUSER)
            out = []
            for name in SESSION_CAPS:
                try:
                    with open(f"/proc/sys/user/{name}") as f:
                        out.append(f"{name} {f.read().strip()}")
                except FileNotFoundError:
                    continue
            os.write(w, "\n".join(out).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return {k: int(v) for k, v in (line.split() for line in data.decode().splitlines() if line)}


def apply_restored(root_pid: int) -> None:
    """CRIU's ``setup-namespaces`` hook of a restore: cap the restored tree's user namespace before
    any of its tasks runs. A tree still in the host's user namespace is refused (it would write the
    host's own values)."""
    if os.stat(f"/proc/{root_pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino:
        raise Unavailable(f"the restored tree (pid {root_pid}) has no user namespace of its own yet",
                          reason=Reason.KERNEL_CAPS_FAILED)
    apply(root_pid)
