"""Start a cold session: new namespaces, pivot into the overlay root, exec the session init.

Run by the supervisor as ``python -m drums_core.launch <spec.json>``. It unshares the namespaces,
forks the namespace's pid 1, prints that process's host pid on stdout once the root is in place,
and exits; the init then outlives both this launcher and the daemon.
"""
from __future__ import annotations

import json
import os
import sys

from . import linux

_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def make_dev_nodes(root: str) -> None:
    """Device nodes live in the session's upper (made from the host: mknod is refused inside a user namespace)."""
    dev = f"{root}/dev"
    os.makedirs(dev, exist_ok=True)
    for name, (major, minor) in _NODES.items():
        path = f"{dev}/{name}"
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(path, 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        if not os.path.lexists(f"{dev}/{name}"):
            os.symlink(target, f"{dev}/{name}")
    for sub in ("pts", "shm"):
        os.makedirs(f"{dev}/{sub}", exist_ok=True)


def _prepare_root(root: str, uid: int) -> None:
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount(root, root, None, linux.MS_BIND | linux.MS_REC)
    linux.mount("proc", f"{root}/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    linux.mount("devpts", f"{root}/dev/pts", "devpts", linux.MS_NOSUID | linux.MS_NOEXEC,
                "newinstance,ptmxmode=0666,mode=620,gid=5")
    linux.mount("tmpfs", f"{root}/dev/shm", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=1777")
    linux.mount("tmpfs", f"{root}/tmp", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=1777")
    linux.mount("tmpfs", f"{root}/run", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=755")
    os.makedirs(f"{root}/run/user/{uid}", mode=0o700)
    os.chown(f"{root}/run/user/{uid}", uid, uid)
    os.makedirs(f"{root}/run/lock", mode=0o1777)
    old = f"{root}/.oldroot"
    os.makedirs(old, exist_ok=True)
    linux.pivot_root(root, old)
    os.chdir("/")
    linux.umount("/.oldroot", linux.MNT_DETACH)


def _child(spec: dict, maps_done_r: int, userns_w: int, report_w: int) -> None:
    """Runs in the launcher's child: enter a user namespace, wait for its maps, make the rest, fork init."""
    linux.unshare(linux.CLONE_NEWUSER)
    os.write(userns_w, b"u")
    if os.read(maps_done_r, 1) != b"m":
        os._exit(1)
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID | linux.CLONE_NEWNET | linux.CLONE_NEWUTS
                  | linux.CLONE_NEWIPC)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        status = os.read(ready_r, 4096).decode()
        os.write(report_w, f"{pid}\n{status}".encode())
        os._exit(0)
    os.close(ready_r)
    try:
        _prepare_root(spec["root"], spec["uid"])
        linux.sethostname(spec["hostname"])
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        argv = [spec["python"], "-m", "drums_core.sessioninit", "--tag", spec["tag"], "--session", spec["session"],
                "--ready-fd", str(ready_w)]
        os.set_inheritable(ready_w, True)
        env = {"PATH": spec["path"], "LANG": "C.UTF-8"}
        if spec.get("pythonpath"):
            env["PYTHONPATH"] = spec["pythonpath"]
        os.execve(spec["python"], argv, env)
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent, then die
        os.write(ready_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(1)


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    make_dev_nodes(spec["root"])
    # The session gets a user namespace owned by host root with the identity mapping: host root keeps
    # every capability over it (CRIU needs CAP_SYS_RESOURCE over uid-1000 processes to read their
    # rlimits, and this host's bounding set lacks it), while uids inside are the host's own.
    maps_r, maps_w = os.pipe()
    userns_r, userns_w = os.pipe()
    report_r, report_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(maps_w)
        os.close(userns_r)
        os.close(report_r)
        try:
            _child(spec, maps_r, userns_w, report_w)
        finally:
            os._exit(1)
    os.close(maps_r)
    os.close(userns_w)
    os.close(report_w)
    if os.read(userns_r, 1) != b"u":
        sys.stderr.write("launcher child died before making its user namespace\n")
        sys.exit(1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child}/{name}", "w") as f:
            f.write("0 0 4294967295\n")
    os.write(maps_w, b"m")
    report = b""
    while True:
        chunk = os.read(report_r, 4096)
        if not chunk:
            break
        report += chunk
    os.waitpid(child, 0)
    lines = report.decode().split("\n", 1)
    if len(lines) < 2 or lines[1] != "ok":
        sys.stderr.write(f"session init failed before exec: {lines[-1] if lines else 'no report'}\n")
        sys.exit(1)
    sys.stdout.write(f"{lines[0]}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
