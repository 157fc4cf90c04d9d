"""Run a command inside a session with the session's containment: what ``drums exec`` starts.

Run by the supervisor as ``python -m drums_core.session.enter '<spec as JSON>'`` (host root). Everything this
process needs is imported and built before it enters the session, and nothing of the session runs
before the hardening is in place: it joins the session's cgroup, takes the session's out-of-memory
score, enters the pid, net, uts, ipc, mount, time and user namespaces of the session's init (through
fds opened first), chroots to the init's root, drops the capability bounding set, loads the seccomp
filter, becomes the session's root or ``user``, and only then forks and execs the command (a program
the session may have replaced is thus never run with more than the session's own rights). Exit
status: the command's own, or 125 when entering failed (with the reason on stderr).
"""
from __future__ import annotations

import json
import os
import resource
import sys

from . import cgroup_fs, containment
from ..host import kernel_budget, linux

_NS_ORDER = (("pid", linux.CLONE_NEWPID), ("net", linux.CLONE_NEWNET), ("uts", linux.CLONE_NEWUTS),
             ("ipc", linux.CLONE_NEWIPC), ("mnt", linux.CLONE_NEWNS),
             # a restored session runs in a time namespace of CRIU's making: a command outside it that
             # outlives the exec would make every later snapshot of the session unrestorable
             ("time", linux.CLONE_NEWTIME), ("user", linux.CLONE_NEWUSER))


def enter(spec: dict) -> int:
    pid = int(spec["pid"])
    seccomp_filter = containment.seccomp_filter()
    ns_fds = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag) for name, flag in _NS_ORDER
              if name != "time" or os.path.exists("/proc/self/ns/time")]  # a kernel without time namespaces
    root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    if spec.get("cgroup"):
        cgroup_fs.enter(spec["cgroup"])
    containment.first_for_the_oom_killer()  # as the session's own processes (launch.py), before any namespace
    for fd, flag in ns_fds:  # the user namespace last: host root's rights over the others first
        linux.setns(fd, flag)
        os.close(fd)
    os.fchdir(root_fd)
    os.chroot(".")
    os.close(root_fd)
    for res, share in kernel_budget.session_rlimits().items():  # as the session's init has them (launch.py)
        resource.setrlimit(res, (share, share))
    containment.drop_bounding_set()
    uid = int(spec.get("uid", 0))
    os.setgroups([uid] if uid else [])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.chdir(spec.get("cwd") or "/")
    containment.install_seccomp(seccomp_filter)
    child = os.fork()  # the pid namespace applies to children
    if child == 0:
        try:
            os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
        except OSError as exc:
            sys.stderr.write(f"drums exec: {spec['argv'][0]}: {exc.strerror}\n")
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    while True:
        _, status = os.waitpid(child, 0)
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        code = enter(spec)
    except OSError as exc:
        sys.stderr.write(f"drums exec: could not enter session: {exc}\n")
        code = 125
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
