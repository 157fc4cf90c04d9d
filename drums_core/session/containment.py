"""What a session may not do, as data, and the calls that apply it (used by :mod:`drums_core.session.launch`).

The promise (README, "Containment"), in the manner of container runtimes' defaults:

* ids 0..65535 inside map onto an unprivileged host range (the launcher writes the maps);
* ``/proc/sys``, ``/proc/sysrq-trigger``, ``/proc/irq``, ``/proc/bus``, ``/proc/fs`` are read-only
  bind mounts, made by host root and locked by the kernel when the session's own mount namespace
  is made; the ``/proc`` is that of a pid namespace owned by the host's user namespace, so the
  kernel refuses ``/proc/kcore`` and ``/proc/timer_list`` to the session (EACCES) and refuses it
  another ``/proc``; ``/proc/keys`` lists only the session's own keys, and the filter below
  leaves it none; there is no ``/sys`` (and with none to copy, the kernel refuses a new one).
  Masking with bind mounts of ``/dev/null`` is not used: CRIU cannot re-create such mounts from
  inside the restored user namespace (``Can't bind-mount at .../proc/keys: Permission denied``);
* the capability bounding set lacks :data:`DROPPED_CAPS`, ``CAP_SYS_ADMIN`` among them (as in
  Docker's default set). A fresh session's hardening mounts are locked by the kernel, but CRIU
  re-creates a restored session's mount tree from inside its user namespace (unlocked) and gives
  it a pid namespace of its own user namespace; without ``CAP_SYS_ADMIN`` the session can neither
  unmount, remount nor mount anything (no other ``/proc``, no ``/sys``, no tmpfs), fresh or restored;
* every process of a session is first in line for the kernel's out-of-memory killer
  (:data:`OOM_SCORE_ADJ`, set by host root before the session runs; CRIU dumps it with each task and
  puts it back). The kernel lets an unprivileged task lower its own score, but never below 0, so the
  daemon runs at :data:`DAEMON_OOM_SCORE_ADJ` (where host root has ``CAP_SYS_RESOURCE``; without it
  nothing on the host goes below 0, and the daemon stays at 0): when the whole host runs out of
  memory, a desktop's process goes first, and the daemon after anything a session can do to its own score;
* a seccomp filter (:data:`DENIED_SYSCALLS`) fails those calls with ``EPERM``, and
  :data:`REFUSED_SYSCALLS` (what a checkpoint could not carry: memory protection keys) with their own errno.

Sizes of the session's tmpfs (``/tmp``, ``/dev/shm``, ``/run``) come from the launch spec.
"""
from __future__ import annotations

import errno
import os

from ..host import linux

# /proc entries made read-only (bind-mounted over themselves, then remounted read-only).
READONLY_PROC = ("sys", "sysrq-trigger", "irq", "bus", "fs")

# Capabilities removed from every session process's bounding set (numbers from linux/capability.h).
DROPPED_CAPS = {
    "CAP_SYS_ADMIN": 21,  # see the module docstring: what keeps the mounts as they are after a restore
    "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PACCT": 20, "CAP_SYS_BOOT": 22, "CAP_SYS_TIME": 25,
    "CAP_SYS_TTY_CONFIG": 26, "CAP_AUDIT_CONTROL": 30, "CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33,
    "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37, "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}
CAP_LAST = 40
PR_CAPBSET_DROP = 24

# Denied with EPERM: what Docker's default profile refuses to a container without extra
# capabilities, minus what the kernel's own user-namespace rules already decide (mount, unshare,
# setns: which filesystems a session may mount is FS_USERNS_MOUNT's business, and the session's
# locked mounts and its host-owned pid namespace keep /proc and /sys as they are).
DENIED_SYSCALLS = (
    # kernel keyrings are not namespaced
    "add_key", "keyctl", "request_key",
    # kernel code and tracing
    "bpf", "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "create_module", "get_kernel_syms", "query_module", "lookup_dcookie",
    # file handles bypass the mount namespace
    "open_by_handle_at", "name_to_handle_at",
    # hardware, clocks, host-wide switches
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "acct", "swapon", "swapoff", "reboot",
    "quotactl", "quotactl_fd", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old",
    # memory policy of other processes and page-fault handling in the kernel's favour
    "move_pages", "mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node", "userfaultfd",
    "kcmp",
    # io_uring: a large kernel surface that Docker's default profile also denies
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)

# Refused with another answer than EPERM, because a checkpoint could not carry what they make.
# pkey_alloc: CRIU does not dump a process's allocated memory protection keys (the kernel keeps
# them in the mm, and no /proc file lists them), so after a restore the process's own
# pkey_mprotect(..., key) fails with EINVAL. Chromium 156 takes a key when the CPU has PKU, and
# its restored renderers then die with SIGTRAP at their next page commit ("Can't open this page,
# error code 5"). ENOSPC is the kernel's answer when every key is taken, which every caller must
# handle: Chromium and V8 then protect their pages without keys.
REFUSED_SYSCALLS = {"pkey_alloc": errno.ENOSPC}


def _bind(src: str, dst: str, flags: int) -> None:
    linux.mount(src, dst, None, linux.MS_BIND)
    linux.mount("none", dst, None, linux.MS_BIND | linux.MS_REMOUNT | flags)


def _tmpfs(path: str, size: str, mode: int, owner: int, flags: int = linux.MS_NOSUID | linux.MS_NODEV) -> None:
    linux.mount("tmpfs", path, "tmpfs", flags, f"size={size},mode={mode:o},uid={owner},gid={owner}")


def harden_proc(proc: str) -> None:
    """Read-only parts of a mounted ``/proc`` (host root, before the session's namespaces)."""
    ro = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    for rel in READONLY_PROC:
        path = f"{proc}/{rel}"
        if os.path.exists(path):
            _bind(path, path, ro)


def prepare_root(spec: dict) -> None:
    """Mount the session's root as host root in the new mount namespace, then pivot into it."""
    root, base, uid = spec["root"], spec["id_base"], spec["uid"]
    sizes = spec.get("sizes", {})
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount(root, root, None, linux.MS_BIND | linux.MS_REC)
    linux.mount("proc", f"{root}/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    harden_proc(f"{root}/proc")
    _tmpfs(f"{root}/dev/shm", sizes.get("shm", "512m"), 0o1777, base)
    _tmpfs(f"{root}/tmp", sizes.get("tmp", "1g"), 0o1777, base)
    _tmpfs(f"{root}/run", sizes.get("run", "256m"), 0o755, base)
    for path, mode, owner in ((f"{root}/run/user", 0o755, base), (f"{root}/run/user/{uid}", 0o700, base + uid),
                              (f"{root}/run/lock", 0o1777, base)):
        os.mkdir(path, mode)
        os.chown(path, owner, owner)
        os.chmod(path, mode)
    old = f"{root}/.oldroot"
    os.makedirs(old, exist_ok=True)
    linux.pivot_root(root, old)
    os.chdir("/")
    linux.umount("/.oldroot", linux.MNT_DETACH)


# Added to a process's out-of-memory badness (-1000..1000; the host's own processes are at 0). A task
# without CAP_SYS_RESOURCE may lower its own down to 0, no further (measured on this kernel).
OOM_SCORE_ADJ = 500           # every session process, fresh or restored
DAEMON_OOM_SCORE_ADJ = -500   # drumsd: below any score a session can give itself


def set_oom_score_adj(value: int) -> None:
    """This process's out-of-memory score, inherited by what it starts (host root only)."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(int(value)))


def first_for_the_oom_killer() -> None:
    """This process and whatever it starts: :data:`OOM_SCORE_ADJ` (call as host root, before the
    session's user namespace exists)."""
    set_oom_score_adj(OOM_SCORE_ADJ)


def mount_devpts() -> None:
    """The session's own pty instance (inside its user namespace, so ``gid=5`` is the session's tty group)."""
    linux.mount("devpts", "/dev/pts", "devpts", linux.MS_NOSUID | linux.MS_NOEXEC,
                "newinstance,ptmxmode=0666,mode=620,gid=5")


def drop_bounding_set() -> None:
    for cap in DROPPED_CAPS.values():
        try:
            linux.prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # a capability this kernel does not know
                raise


def seccomp_filter():
    """The filter as a libseccomp object (python3-seccomp), allowing all but :data:`DENIED_SYSCALLS`
    (``EPERM``) and :data:`REFUSED_SYSCALLS` (their own errno)."""
    import seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    f.set_attr(seccomp.Attr.CTL_NNP, 0)
    rules = {**{name: errno.EPERM for name in DENIED_SYSCALLS}, **REFUSED_SYSCALLS}
    for name, err in rules.items():
        try:
            f.add_rule(seccomp.ERRNO(err), name)
        except (RuntimeError, ValueError, OSError):
            continue  # not a syscall on this architecture
    return f


def install_seccomp(f) -> None:
    """Load ``f`` (from :func:`seccomp_filter`) into this process; inherited across exec and fork.

    Without no_new_privs (this process has CAP_SYS_ADMIN in its user namespace), so sudo works."""
    f.load()
