"""Start a cold session: namespaces, the contained root, then exec the session init.

Run by the supervisor as ``python -m drums_core.session.launch <spec.json>`` (host root). The order is what
makes the containment hold (see :mod:`drums_core.session.containment` for what is applied):

1. The launcher's child makes a mount and a pid namespace **owned by the host's user namespace**
   and forks the pid-ns init. The init, still host root, mounts ``/proc`` (read-only and masked
   parts), sized tmpfs for ``/tmp``, ``/run`` and ``/dev/shm``, and pivots into the overlay root.
2. The init then enters a new user namespace whose maps (written by the child from outside) put
   ids 0..65535 on the unprivileged host range ``id_base..``, becomes uid 0 there, and makes the
   session's own mount, net, uts and ipc namespaces. Its mount namespace is a copy made from a
   more privileged one, so the kernel locks every mount made in step 1: the session's root cannot
   unmount the masks, remount ``/proc/sys`` writable, or resize its tmpfs; and because the pid
   namespace belongs to the host's user namespace, it cannot mount another ``/proc``.
3. It drops the capability bounding set, installs the seccomp filter and execs the session init.

The launcher prints the init's host pid on stdout once the init has exec'd, and exits; the init
then outlives both this launcher and the daemon.
"""
from __future__ import annotations

import json
import os
import resource
import stat
import sys

from . import containment, kernel_caps
from ..host import kernel_budget, linux

_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def make_dev_nodes(root: str, owner: int) -> None:
    """Device nodes live in the session's upper (made from the host: mknod is refused inside a user namespace).

    ``root`` is a fresh upper over the image, made by the daemon; nothing in it is session-made yet.
    """
    dev = f"{root}/dev"
    os.makedirs(dev, exist_ok=True)
    for entry in os.scandir(dev):  # an image's other nodes (console, ...) are the host's devices: hide them
        mode = entry.stat(follow_symlinks=False).st_mode
        if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and entry.name not in _NODES:
            os.unlink(entry.path)
    for name, (major, minor) in _NODES.items():
        path = f"{dev}/{name}"
        if not os.path.lexists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        os.lchown(path, owner, owner)
        os.chmod(path, 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        if os.path.lexists(f"{dev}/{name}") and not os.path.islink(f"{dev}/{name}"):
            os.unlink(f"{dev}/{name}")  # an image's /dev/ptmx node: the root is nodev, the pts instance's works
        if not os.path.lexists(f"{dev}/{name}"):
            os.symlink(target, f"{dev}/{name}")
            os.lchown(f"{dev}/{name}", owner, owner)
    for sub in ("pts", "shm"):
        os.makedirs(f"{dev}/{sub}", exist_ok=True)
        os.lchown(f"{dev}/{sub}", owner, owner)


def _read_to_eof(fd: int) -> bytes:
    """Everything written to a pipe until its last writer closes it."""
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    return out


def _write_maps(proc_dir: int, base: int, count: int) -> None:
    for name in ("uid_map", "gid_map"):
        fd = os.open(name, os.O_WRONLY, dir_fd=proc_dir)
        try:
            os.write(fd, f"0 {base} {count}\n".encode())
        finally:
            os.close(fd)


def _init(spec: dict, to_child: int, from_child: int, ready_w: int) -> None:
    """The pid-ns init: contained root as host root, then into the session's user namespace, then exec."""
    seccomp_filter = containment.seccomp_filter()  # built (and libseccomp imported) before the pivot
    rlimits = kernel_budget.session_rlimits()
    containment.first_for_the_oom_killer()  # while /proc is the host's and this is host root
    containment.prepare_root(spec)
    linux.unshare(linux.CLONE_NEWUSER)
    os.write(to_child, b"u")
    if os.read(from_child, 1) != b"m":
        os._exit(1)
    os.setresgid(0, 0, 0)
    os.setgroups([])
    os.setresuid(0, 0, 0)
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC)
    containment.mount_devpts()
    linux.sethostname(spec["hostname"])
    os.setsid()
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    argv = [spec["python"], "-m", "drums_core.session.init", "--tag", spec["tag"], "--session", spec["session"],
            "--ready-fd", str(ready_w)]
    os.set_inheritable(ready_w, True)
    env = {"PATH": spec["path"], "LANG": "C.UTF-8"}
    if spec.get("pythonpath"):
        env["PYTHONPATH"] = spec["pythonpath"]
    for res, share in rlimits.items():  # the session's share of host root's queued signals and mqueue bytes
        resource.setrlimit(res, (share, share))
    containment.drop_bounding_set()
    containment.install_seccomp(seccomp_filter)
    os.execve(spec["python"], argv, env)


def _child(spec: dict, report_w: int) -> None:
    """Runs in the launcher's child (host root): make the pid/mount namespaces, fork the init, map it."""
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID)
    to_child_r, to_child_w = os.pipe()   # init -> child: "u" = user namespace made
    to_init_r, to_init_w = os.pipe()     # child -> init: "m" = maps written
    ready_r, ready_w = os.pipe()         # init (session init after exec) -> child: "ok" or the error
    # The init's pivot_root moves this process's root too (same mount namespace): hold the host's
    # /proc before the fork, so the init's /proc/<pid> is found whenever the init gets that far.
    host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:
        for fd in (to_child_r, to_init_w, ready_r, report_w, host_proc):
            os.close(fd)
        try:
            _init(spec, to_child_w, to_init_r, ready_w)
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent, then die
            os.write(ready_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(1)
    for fd in (to_child_w, to_init_r, ready_w):
        os.close(fd)
    proc_dir = os.open(str(pid), os.O_PATH | os.O_DIRECTORY, dir_fd=host_proc)
    if os.read(to_child_r, 1) == b"u":
        _write_maps(proc_dir, spec["id_base"], spec["id_count"])
        # The session's share of the kernel's per-user counts, before anything of the session runs.
        # This process joins the session's user namespace for good: it needs no host privilege after.
        ns_fd = os.open("ns/user", os.O_RDONLY, dir_fd=proc_dir)
        try:
            kernel_caps.join_and_write(host_proc, ns_fd, spec.get("kernel_caps"))
        except OSError as exc:
            os.write(report_w, f"{pid}\nKernelCaps: could not write the session's kernel caps: {exc}".encode())
            os.kill(pid, 9)
            os._exit(0)
        finally:
            os.close(ns_fd)
        os.write(to_init_w, b"m")
    os.close(to_init_w)
    status = _read_to_eof(ready_r)
    os.write(report_w, f"{pid}\n{status.decode(errors='replace') or 'init exited before exec'}".encode())
    os._exit(0)


def prepare_root(root: str, owner: int) -> None:
    """Run by the daemon on a fresh session root before the launcher starts (outside the session's
    cgroup: on an image that still has other device nodes, hiding them copies them up, which the
    group's device rules would deny)."""
    make_dev_nodes(root, owner)
    os.chown(root, owner, owner)  # the root directory is the fresh upper's: root's own
    os.chmod(root, 0o755)


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    report_r, report_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(report_r)
        try:
            _child(spec, report_w)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then die
            os.write(report_w, f"0\n{type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(1)
    os.close(report_w)
    report = _read_to_eof(report_r)
    os.waitpid(child, 0)
    lines = report.decode().split("\n", 1)
    if len(lines) < 2 or lines[1] != "ok":
        sys.stderr.write(f"session init failed before exec: {lines[-1] if lines else 'no report'}\n")
        sys.exit(1)
    sys.stdout.write(f"{lines[0]}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
