"""Process discovery over ``/proc`` and signalling by pidfd: what the ledger and the sweep decide ownership by.

Ownership is decided by evidence that cannot collide by accident, nor be forged by a session:

- a run tag, ``--tag drums:<run>`` as two whole argv elements (or the one element
  ``--tag=drums:<run>``), never a substring of the command line; and a tag counts only where what
  the session cannot write agrees (:attr:`ProcInfo.tags`): a process in a Drums cgroup
  (``<hierarchy>/drums/<run>/...``, which only host root can move it out of) vouches for its own
  run's tag alone, and a process outside every Drums cgroup only when it is in the host's user
  namespace (a session's processes never are: a user namespace cannot be left). A desktop that
  writes another instance's tag into its argv is therefore nobody's but its own run's;
- a pid together with its start time (field 22 of ``/proc/<pid>/stat``), so a reused pid is
  never mistaken for the recorded process;
- a path, compared by whole components (:mod:`.ownedpaths`); mounts are read by :mod:`.mounttable`.

Everything read from ``/proc/<pid>`` goes through :mod:`.bounded` (a session shapes its own
processes' argv, environment and mount tables): argv is read up to :data:`CMDLINE_LIMIT` bytes, so
a process that points its argument area at a large region (``prctl(PR_SET_MM_MAP)``) costs a scan
a few KiB, not its region.

A zombie counts as dead everywhere (on some hosts pid 1 never reaps, so a killed orphan stays a
zombie forever). Every reader returns ``None`` or an empty value for a process that vanished
while being read; only :func:`.mounttable.read_mountinfo` and :func:`.mounttable.parse_mountinfo` raise, because the
sweep fails closed when the mount table cannot be read.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import Unavailable
from . import bounded
from .ownedpaths import clean_link_target

PROC = "/proc"
TAG_PREFIX = "drums:"
ZOMBIE_STATES = frozenset("ZXx")
CGROUP_BASE = "drums"                     # session groups: <hierarchy>/drums/<run>/<session>
CMDLINE_LIMIT = bounded.CMDLINE_LIMIT     # argv bytes kept; a tag is a whole element within them
CGROUP_LIMIT = 64 << 10                   # /proc/<pid>/cgroup: one line per hierarchy


# ---------------------------------------------------------------------------------------------
# tags


def run_tag(run: str) -> str:
    return f"{TAG_PREFIX}{run}"


def tags_of(argv: Iterable[str]) -> list[str]:
    """Every value given to ``--tag`` in ``argv`` (``--tag X`` and ``--tag=X``), as whole elements."""
    out: list[str] = []
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--tag" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--tag="):
            out.append(arg[len("--tag="):])
    return out


def has_tag(argv: Iterable[str], tag: str) -> bool:
    """Exact element match: ``drums:run1`` never matches ``drums:run10`` or ``xdrums:run1``."""
    return tag in tags_of(argv)


# ---------------------------------------------------------------------------------------------
# /proc readers


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    state: str
    ppid: int
    starttime: int

    @property
    def zombie(self) -> bool:
        return self.state in ZOMBIE_STATES


def parse_stat(text: str) -> Stat:
    """Parse the text of ``/proc/<pid>/stat`` (``comm`` may contain spaces and parentheses)."""
    lpar = text.index("(")
    rpar = text.rindex(")")
    pid = int(text[:lpar].strip())
    comm = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    return Stat(pid=pid, comm=comm, state=rest[0], ppid=int(rest[1]), starttime=int(rest[19]))


def read_stat(pid: int | str) -> Stat | None:
    try:
        raw = bounded.read_path(f"{PROC}/{pid}/stat", limit=4096, timeout=bounded.PROC_TIMEOUT).data
        return parse_stat(raw.decode("utf-8", "surrogateescape"))
    except (OSError, ValueError, IndexError, Unavailable):
        return None


def starttime(pid: int | str) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of its stat), or None if gone."""
    st = read_stat(pid)
    return st.starttime if st else None


def read_cmdline(pid: int | str, limit: int = CMDLINE_LIMIT) -> list[str]:
    """argv of ``pid`` ([] for kernel threads, zombies and vanished processes): its whole elements
    within the first ``limit`` bytes (an element cut by the limit is left out, so a tag is seen whole
    or not at all)."""
    try:
        got = bounded.read_path(f"{PROC}/{pid}/cmdline", limit=limit, timeout=bounded.PROC_TIMEOUT, truncate=True)
    except (OSError, Unavailable):
        return []
    raw = got.data
    if got.truncated:
        raw = raw[:raw.rfind(b"\0") + 1]
    if not raw:
        return []
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")]


def cgroup_runs(pid: int | str) -> frozenset[str]:
    """The runs whose Drums groups (``.../drums/<run>/...``, in any hierarchy) hold ``pid``, as the
    kernel reports them in ``/proc/<pid>/cgroup`` (paths relative to this process's cgroup
    namespace; a session cannot rename its group nor leave it). Empty when it is in none, or gone."""
    try:
        raw = bounded.read_path(f"{PROC}/{pid}/cgroup", limit=CGROUP_LIMIT, timeout=bounded.PROC_TIMEOUT).data
    except (OSError, Unavailable):
        return frozenset()
    out: set[str] = set()
    for line in raw.decode("utf-8", "surrogateescape").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        segs = parts[2].split("/")
        for i, seg in enumerate(segs[:-1]):
            if seg == CGROUP_BASE:
                if segs[i + 1]:
                    out.add(segs[i + 1])
                break  # the first drums/ level is the host's; a deeper one would be the session's own
    return frozenset(out)


_OWN_USERNS: list[str | None] = []


def own_userns() -> str | None:
    """This process's user namespace (``user:[inode]``), read once."""
    if not _OWN_USERNS:
        _OWN_USERNS.append(readlink(f"{PROC}/self/ns/user"))
    return _OWN_USERNS[0]


def userns(pid: int | str) -> str | None:
    return readlink(f"{PROC}/{pid}/ns/user")


INOTIFY_FDINFO_LIMIT = 1 << 20  # a watch is a line of ~150 bytes; the session shapes how many


def inotify_fdinfos(pid: int | str) -> list[bytes]:
    """The fdinfo of each inotify fd of ``pid`` (one ``inotify wd:`` line a watch), read within
    bounds; [] for a process gone or unreadable."""
    try:
        fds = os.listdir(f"{PROC}/{pid}/fd")
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            if os.readlink(f"{PROC}/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            out.append(bounded.read_proc(pid, f"fdinfo/{fd}", limit=INOTIFY_FDINFO_LIMIT, truncate=True).data)
        except (OSError, Unavailable):
            continue
    return out


def readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def boot_id() -> str:
    """This boot's id. OSError when it cannot be read: callers fail closed (a wrong or missing id
    would make a live ledger owner look dead, or a snapshot of another boot look restorable)."""
    with open(f"{PROC}/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def is_alive(pid: int, start: int | None = None) -> bool:
    """True when ``pid`` exists, is not a zombie and (if given) started at ``start``.

    A killed multi-threaded process shows its leader as a zombie while its other threads still exit
    and still hold its files and namespaces: it counts as alive until every thread is gone.
    """
    st = read_stat(pid)
    if st is None or (start is not None and st.starttime != start):
        return False
    if not st.zombie:
        return True
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            state = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ZOMBIE_STATES:
            return True
    return False


def list_pids() -> list[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def mnt_ns(pid: int | str = "self") -> str | None:
    return readlink(f"{PROC}/{pid}/ns/mnt")


@dataclass(frozen=True)
class ProcPaths:
    cwd: str | None
    root: str | None
    exe: str | None
    fds: tuple[str, ...]

    def all(self) -> list[str]:
        return [p for p in (self.cwd, self.root, self.exe, *self.fds) if p]


def proc_paths(pid: int) -> ProcPaths:
    """cwd, root, exe and open-file paths of ``pid`` (sockets, pipes and anon inodes left out)."""
    base = f"{PROC}/{pid}"
    fds: list[str] = []
    try:
        names = os.listdir(f"{base}/fd")
    except OSError:
        names = []
    for name in names:
        target = clean_link_target(readlink(f"{base}/fd/{name}"))
        if target:
            fds.append(target)
    return ProcPaths(
        cwd=clean_link_target(readlink(f"{base}/cwd")),
        root=clean_link_target(readlink(f"{base}/root")),
        exe=clean_link_target(readlink(f"{base}/exe")),
        fds=tuple(fds),
    )


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    comm: str
    state: str
    starttime: int
    argv: tuple[str, ...]
    cgroup_runs: frozenset[str] = frozenset()   # runs of the Drums groups it is in (cgroup_runs)
    foreign_userns: bool = False                # in a user namespace other than this process's

    @property
    def zombie(self) -> bool:
        return self.state in ZOMBIE_STATES

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.starttime)

    @property
    def claimed_tags(self) -> list[str]:
        """Every ``--tag`` value in its argv, as the process wrote it (it may be a session's forgery)."""
        return tags_of(self.argv)

    @property
    def tags(self) -> list[str]:
        """The run tags that count: those its argv carries and what it cannot forge agrees with.

        - in one run's Drums groups: that run's tag only (a desktop that writes another run's tag
          into its argv stays its own run's);
        - in the groups of several runs (never made so): none;
        - in no Drums group: its tags when it is in this process's user namespace (host-side
          processes), none when it is in another one (a session's process outside every group).
        """
        claimed = tags_of(self.argv)
        if not claimed:
            return []
        if self.cgroup_runs:
            if len(self.cgroup_runs) != 1:
                return []
            (run,) = self.cgroup_runs
            return [t for t in claimed if t == run_tag(run)]
        return [] if self.foreign_userns else claimed

    @property
    def is_criu(self) -> bool:
        """A CRIU process or a task CRIU forked that has not got its own name back yet."""
        if self.comm == "criu":
            return True
        return bool(self.argv) and os.path.basename(self.argv[0]) == "criu"

    def describe(self) -> str:
        cmd = " ".join(self.argv) if self.argv else f"[{self.comm}]"
        if len(cmd) > 160:
            cmd = cmd[:157] + "..."
        return f"{self.pid} {cmd}"


def read_proc(pid: int) -> ProcInfo | None:
    st = read_stat(pid)
    if st is None:
        return None
    argv = tuple(read_cmdline(pid))
    runs: frozenset[str] = frozenset()
    foreign = False
    if tags_of(argv):  # the evidence a tag needs (ProcInfo.tags); untagged processes are not asked
        runs = cgroup_runs(pid)
        ns = userns(pid)
        foreign = ns is None or ns != own_userns()
    return ProcInfo(pid=pid, ppid=st.ppid, comm=st.comm, state=st.state, starttime=st.starttime,
                    argv=argv, cgroup_runs=runs, foreign_userns=foreign)


def scan_processes() -> dict[int, ProcInfo]:
    """Every user-space process of the host (kernel threads left out), by pid."""
    out: dict[int, ProcInfo] = {}
    for pid in list_pids():
        info = read_proc(pid)
        if info is None or pid == 2 or info.ppid == 2:
            continue
        out[pid] = info
    return out


def children_map(procs: dict[int, ProcInfo]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    return kids


def descendants(procs: dict[int, ProcInfo], roots: Iterable[int]) -> set[int]:
    """Pids below ``roots`` in the parent tree (the roots themselves not included)."""
    kids = children_map(procs)
    out: set[int] = set()
    stack = list(roots)
    while stack:
        for child in kids.get(stack.pop(), ()):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def ancestors(procs: dict[int, ProcInfo], pid: int) -> list[int]:
    out: list[int] = []
    seen = {pid}
    cur = procs.get(pid)
    while cur is not None and cur.ppid not in seen and cur.ppid > 0:
        out.append(cur.ppid)
        seen.add(cur.ppid)
        cur = procs.get(cur.ppid)
    return out


def self_and_ancestors() -> set[int]:
    out = {os.getpid()}
    pid = os.getpid()
    for _ in range(4096):
        st = read_stat(pid)
        if st is None or st.ppid <= 0:
            break
        out.add(st.ppid)
        pid = st.ppid
    return out


def find_tagged(tag: str, procs: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    """Live (non-zombie) processes whose argv carries ``tag`` as a whole ``--tag`` value that counts
    (:attr:`ProcInfo.tags`)."""
    procs = scan_processes() if procs is None else procs
    return [p for p in procs.values() if not p.zombie and tag in p.tags]


# ---------------------------------------------------------------------------------------------
# signalling without pid reuse


@dataclass
class Handle:
    """A process pinned by a pidfd (or, where pidfds are missing, by pid + start time)."""

    pid: int
    starttime: int
    fd: int | None = None
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if self.fd is not None and not self._closed:
            os.close(self.fd)
        self._closed = True


def open_handle(pid: int, start: int) -> Handle | None:
    """Pin ``pid`` if it is still the process that started at ``start`` and not a zombie; else None."""
    fd: int | None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
            return None
        fd = None
    # The pidfd was opened before this check, so it refers to the process checked here.
    if not is_alive(pid, start):
        if fd is not None:
            os.close(fd)
        return None
    return Handle(pid=pid, starttime=start, fd=fd)


def send_signal(handle: Handle, sig: int) -> bool:
    """Signal the pinned process; False when it is already gone."""
    try:
        if handle.fd is not None:
            signal.pidfd_send_signal(handle.fd, sig)
        else:
            if not is_alive(handle.pid, handle.starttime):
                return False
            os.kill(handle.pid, sig)
        return True
    except ProcessLookupError:
        return False


def handle_dead(handle: Handle) -> bool:
    return not is_alive(handle.pid, handle.starttime)


def wait_dead(handles: Iterable[Handle], timeout: float) -> list[Handle]:
    """Wait (at most ``timeout`` s) until each process has exited or is a zombie; return those still alive."""
    pending = [h for h in handles if not handle_dead(h)]
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        poller = select.poll()
        for h in pending:
            if h.fd is not None:
                poller.register(h.fd, select.POLLIN)
        try:
            poller.poll(min(left, 0.05) * 1000)
        except InterruptedError:
            pass
        pending = [h for h in pending if not handle_dead(h)]
    return pending


def reap_children() -> list[int]:
    """Reap every exited child of this process (tests that act as a subreaper use it)."""
    out: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append(pid)
