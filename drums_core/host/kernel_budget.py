"""The host's kernel budgets that sessions share: what every slot's share needs, what the host
allows, what is in use, and the host changes Drums makes so the sum fits.

Every session's user namespace is made by host root, so the kernel charges the per-user counts of
all sessions (inotify, fanotify, namespaces) to host root's own count one level up, beside CRIU's
and the daemon's own needs. Each session is capped in its own namespace
(:mod:`drums_core.session.kernel_caps`, per uid); the host's limit must hold every slot's share plus
:data:`HOST_RESERVE` for host root. Pids are the same story with the pid space: every slot's
``pids_max`` plus the host's own must fit ``kernel.pid_max`` and ``kernel.threads-max``.

Host changes (``python -m drums_core.host.kernel_budget apply``, run by ``scripts/provision``): a
limit below what :func:`needs` asks is raised, never lowered; the value found first is kept in
:data:`RECORD` so :func:`restore` (``drums shutdown --purge`` of the host's last instance, or
``python -m drums_core.host.kernel_budget restore``) puts it back. A limit Drums did not change is
never written back.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import Unavailable
from ..reasons import Reason

# How many sessions the host runs at once, over all its instances (the default instance has 64 slots).
HOST_SLOTS = int(os.environ.get("DRUMS_HOST_SLOTS", "64"))
# Per-session pids (the default of a session's limits and the most a spec may ask: the host's pid
# budget counts every slot at it). The osworld desktop with Chromium, GIMP, VLC and Impress open runs
# ~150 tasks. A hostile session that takes its limit in threads and lets them go, in a loop, slows
# every other session's restore through the kernel's shared task locks: at 4,096 its neighbours'
# restore p50 was 1.21 to 1.32 times that of a run without it (drums bench density), at 2,048 0.92.
SESSION_PIDS = 2048
SESSION_MEMORY_MAX = 4 << 30  # a session's default memory limit (cgroup_drivers.Limits)
# Uids of a session that hold its counts in honest use: session root (CRIU restores every fd of a
# restored tree as root, so a restored desktop's instances are charged to it) and the desktop user.
SHARE_UIDS = 2
RECORD = Path(os.environ.get("DRUMS_HOST_LIMITS_RECORD", "/var/lib/drums/host-limits.json"))

# /proc/sys/user/<name> -> each session's cap, per uid, written into its user namespace
# (session/kernel_caps.py). Sized from the osworld desktop with Chromium, GIMP, VLC and Impress open
# (6 inotify instances, a few hundred watches, 2 user namespaces: Chromium's sandbox), with room for
# a GNOME session and an agent's own programs.
SESSION_CAPS: dict[str, int] = {
    "max_inotify_instances": 64,
    "max_inotify_watches": 16384,
    "max_fanotify_groups": 8,
    "max_fanotify_marks": 8192,
    "max_user_namespaces": 64,
    "max_mnt_namespaces": 64,
    "max_net_namespaces": 64,
    "max_pid_namespaces": 64,
    "max_ipc_namespaces": 64,
    "max_uts_namespaces": 64,
    "max_cgroup_namespaces": 64,
    "max_time_namespaces": 64,
}

# counter name -> (host sysctl, the session cap it sums, host root's own reserve, the least kernel
# memory one object costs). All sessions' user namespaces are made by host root, so the host's count
# for root is the sum of every session's. Per uid a session stops at its cap; in all (session root
# may switch among many uids) it stops where its memory cgroup can pay no more: the kernel charges
# these objects to the memory cgroup of the process that makes them. Measured on this kind of host
# (cgroup v1, kernel 6.18): 983 bytes per inotify instance, 66 per watch, 2,621 per fanotify group,
# about 3,000 per user namespace; the costs below are lower bounds of those.
_COUNTERS = {
    "inotify_instances": ("fs/inotify/max_user_instances", "max_inotify_instances", 512, 512),
    "inotify_watches": ("fs/inotify/max_user_watches", "max_inotify_watches", 65536, 32),
    "fanotify_groups": ("fs/fanotify/max_user_groups", "max_fanotify_groups", 128, 1024),
    "fanotify_marks": ("fs/fanotify/max_user_marks", "max_fanotify_marks", 65536, 32),
    # user.max_*_namespaces can be written only with CAP_SYS_RESOURCE, which this kind of host's
    # bounding set lacks: these are sized by the caps alone (None), and fit the host's default.
    "user_namespaces": ("user/max_user_namespaces", "max_user_namespaces", 1024, None),
    "mnt_namespaces": ("user/max_mnt_namespaces", "max_mnt_namespaces", 1024, None),
    "net_namespaces": ("user/max_net_namespaces", "max_net_namespaces", 1024, None),
}
INT_MAX = 2**31 - 1
PID_RESERVE = 32768


def session_rlimits() -> dict[int, int]:
    """``{resource: limit}`` for a session's processes: the per-user counts the kernel bounds by a
    resource limit (POSIX message queue bytes, queued signals) are charged up the chain to host
    root too, against host root's own limit, which this kind of host cannot raise (no
    CAP_SYS_RESOURCE). Each session uid gets an equal share of it, host root keeps one share."""
    import resource

    out = {}
    for res in (resource.RLIMIT_MSGQUEUE, resource.RLIMIT_SIGPENDING):
        _, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            out[res] = hard // (HOST_SLOTS * SHARE_UIDS + 1)
    return out
HOST_RESERVE = {name: reserve for name, (_, _, reserve, _) in _COUNTERS.items()}


@dataclass
class Budget:
    """One shared count: the host's limit, what ``slots`` sessions' shares plus the host's reserve
    need, and the use now (None where the kernel does not show it)."""

    name: str
    sysctl: str
    limit: int
    need: int
    use: int | None = None

    @property
    def fits(self) -> bool:
        return self.limit >= self.need


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def read_sysctl(name: str) -> int:
    return int(_sysctl_path(name).read_text().split()[0])


def needs(slots: int = HOST_SLOTS, pids: int = SESSION_PIDS,
          memory_max: int = SESSION_MEMORY_MAX) -> dict[str, tuple[str, int]]:
    """``{counter: (host sysctl, value needed)}`` for ``slots`` sessions of ``pids`` pids and
    ``memory_max`` bytes each: every session at the most it can hold (its caps for each of its
    ``SHARE_UIDS`` uids, or what its memory limit pays for, the larger) plus host root's reserve."""
    out = {}
    for name, (sysctl, cap, reserve, cost) in _COUNTERS.items():
        share = SHARE_UIDS * SESSION_CAPS[cap]
        if cost is not None:
            share = max(share, memory_max // cost)
        out[name] = (sysctl, min(INT_MAX, slots * share + reserve))
    out["pid_max"] = ("kernel/pid_max", slots * pids + PID_RESERVE)
    out["threads_max"] = ("kernel/threads-max", slots * pids + PID_RESERVE)
    return out


def inotify_use() -> tuple[int, int]:
    """Inotify instances and watches held by processes on the host now (every session's and the
    host's: they are all charged to host root). Reads only fd links and the inotify fds' fdinfo,
    bounded per file."""
    from .procs import inotify_fdinfos  # here: session_rlimits runs at every drums exec, this does not

    instances = watches = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for info in inotify_fdinfos(pid):
                instances += 1
                watches += info.count(b"inotify wd:")
    return instances, watches


def pid_use() -> int:
    """Tasks (threads) on the host now."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def budgets(slots: int = HOST_SLOTS, pids: int = SESSION_PIDS, with_use: bool = True) -> list[Budget]:
    """Every shared budget: limit, need for ``slots`` sessions and, with ``with_use``, use now."""
    use: dict[str, int] = {}
    if with_use:
        use["inotify_instances"], use["inotify_watches"] = inotify_use()
        use["pid_max"] = use["threads_max"] = pid_use()
    return [Budget(name, sysctl, read_sysctl(sysctl), need, use.get(name))
            for name, (sysctl, need) in needs(slots, pids).items()]


def check_fits(slots: int, pids: int) -> None:
    """Refuse a configuration whose sessions cannot all fit the host's limits: ``PID_BUDGET`` for
    the pid space, ``HOST_BUDGET`` for a per-user kernel count, naming the limit, the need and the
    fix. Changes nothing."""
    for b in sorted(budgets(slots, pids, with_use=False), key=lambda b: b.name not in ("pid_max", "threads_max")):
        if b.fits:
            continue
        reason = Reason.PID_BUDGET if b.name in ("pid_max", "threads_max") else Reason.HOST_BUDGET
        raise Unavailable(
            f"{slots} sessions of {pids} pids do not fit this host's {b.sysctl.replace('/', '.')} = {b.limit}: "
            f"they need {b.need} (with the host's own reserve). Fix: scripts/provision raises it "
            f"(python -m drums_core.host.kernel_budget apply), or run fewer slots",
            reason=reason, detail={"counter": b.name, "sysctl": b.sysctl, "limit": b.limit, "need": b.need})


def _load_record() -> dict:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}


def _write_record(record: dict) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    tmp = RECORD.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, RECORD)


def apply(slots: int = HOST_SLOTS, pids: int = SESSION_PIDS) -> list[dict]:
    """Raise every host limit below its need; the value found is recorded (first time only) before
    it is written. Returns what changed."""
    record = _load_record()
    changed = []
    for name, (sysctl, need) in needs(slots, pids).items():
        value = read_sysctl(sysctl)
        if value >= need:
            continue
        new_entry = sysctl not in record
        record.setdefault(sysctl, value)
        _write_record(record)
        try:
            _sysctl_path(sysctl).write_text(f"{need}\n")
        except OSError as exc:
            if new_entry:  # never changed: nothing to put back
                del record[sysctl]
                _write_record(record)
            raise Unavailable(f"could not raise {sysctl.replace('/', '.')} from {value} to {need}: {exc}",
                              reason=Reason.HOST_BUDGET,
                              detail={"sysctl": sysctl, "limit": value, "need": need}) from exc
        changed.append({"counter": name, "sysctl": sysctl, "from": value, "to": need})
    return changed


def restore() -> list[dict]:
    """Put back every host limit Drums raised (as :data:`RECORD` has it) and forget the record."""
    record = _load_record()
    restored, left = [], {}
    for sysctl, prior in sorted(record.items()):
        try:
            _sysctl_path(sysctl).write_text(f"{prior}\n")
        except OSError as exc:  # kept in the record: the next restore tries again
            left[sysctl] = prior
            restored.append({"sysctl": sysctl, "to": prior, "error": str(exc)})
            continue
        restored.append({"sysctl": sysctl, "to": prior})
    if left:
        _write_record(left)
    elif record:
        RECORD.unlink(missing_ok=True)
    return restored


def shortage(log_lines: list[str], slots: int = HOST_SLOTS) -> Unavailable | None:
    """A CRIU failure that a host budget explains, as ``Unavailable`` ``HOST_BUDGET`` (or
    ``PID_BUDGET``) naming the counter, its use and its limit; None when no budget is short."""
    text = "\n".join(log_lines)
    short = None
    if "inotify" in text and ("Too many open files" in text or "No space left" in text):
        short = "inotify_instances" if "Too many open files" in text else "inotify_watches"
    elif "Resource temporarily unavailable" in text and ("fork" in text or "clone" in text):
        short = "pid_max"
    if short is None:
        return None
    b = next(b for b in budgets(slots) if b.name == short)
    return Unavailable(f"the host is out of {short.replace('_', ' ')}: {b.use} in use of "
                       f"{b.sysctl.replace('/', '.')} = {b.limit} (needs {b.need} for {slots} sessions); "
                       f"fix: scripts/provision, or fewer desktops",
                       reason=Reason.PID_BUDGET if short == "pid_max" else Reason.HOST_BUDGET,
                       detail={"counter": short, "use": b.use, "limit": b.limit, "sysctl": b.sysctl})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "show"
    if what == "apply":
        try:
            out = apply()
        except Unavailable as exc:
            print(f"kernel_budget: {exc}", file=sys.stderr)
            return 1
        if "--brief" in args:  # one line for scripts/provision
            print(", ".join(f"{c['sysctl'].replace('/', '.')} {c['from']} -> {c['to']}" for c in out)
                  or f"every limit fits {HOST_SLOTS} sessions")
            return 0
    elif what == "restore":
        out = restore()
    elif what == "show":
        out = [asdict(b) | {"fits": b.fits} for b in budgets()]
    else:
        print("usage: python -m drums_core.host.kernel_budget [show|apply|restore]", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
