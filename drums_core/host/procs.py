"""Process, path and mount discovery over ``/proc``: what the ledger and the sweep decide ownership by.

Ownership is decided by evidence that cannot collide by accident:

- a run tag, ``--tag drums:<run>`` as two whole argv elements (or the one element
  ``--tag=drums:<run>``), never a substring of the command line;
- a pid together with its start time (field 22 of ``/proc/<pid>/stat``), so a reused pid is
  never mistaken for the recorded process;
- a path, compared by whole components: ``/x/run1`` is within ``/x/run1`` and ``/x/run1/a``,
  never within ``/x/run10``.

A zombie counts as dead everywhere (on some hosts pid 1 never reaps, so a killed orphan stays a
zombie forever). Every reader returns ``None`` or an empty value for a process that vanished
while being read; only :func:`read_mountinfo` and :func:`parse_mountinfo` raise, because the
sweep fails closed when the mount table cannot be read.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

PROC = "/proc"
TAG_PREFIX = "drums:"
ZOMBIE_STATES = frozenset("ZXx")

# Paths no ledger may own: owning one of them would make every process or mount of the host
# "the run's". check_owned_path refuses them and anything shallower than two components.
DENIED_PATHS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/dev/shm", "/run/drums", "/run/user", "/run/lock", "/tmp/.X11-unix", "/tmp/.ICE-unix",
    "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var/lib", "/var/log",
    "/var/tmp", "/var/run", "/opt/drums",
})


# ---------------------------------------------------------------------------------------------
# paths


def norm_path(path: str) -> str:
    """Normalise an absolute path lexically (``//a/./b/`` -> ``/a/b``). Raises ValueError if relative."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError(f"not an absolute path: {path!r}")
    out = os.path.normpath(path)
    if out.startswith("//"):
        out = "/" + out.lstrip("/")
    return out


def check_owned_path(path: str) -> str:
    """Return ``path`` if a ledger may own it; raise ValueError otherwise.

    It must be absolute, already normalised (no ``.``/``..``/``//`` components, no trailing
    slash), at least two components deep and not one of :data:`DENIED_PATHS`.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"owned path must be absolute: {path!r}")
    if "\0" in path or "\n" in path:
        raise ValueError(f"owned path has a control character: {path!r}")
    if norm_path(path) != path:
        raise ValueError(f"owned path is not normalised: {path!r}")
    if path in DENIED_PATHS or path.count("/") < 2:
        raise ValueError(f"owned path is too broad: {path!r}")
    return path


def path_within(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it, by whole components (``/x/run1`` never holds ``/x/run10``)."""
    if not path or not root or not path.startswith("/") or not root.startswith("/"):
        return False
    path = norm_path(path)
    root = norm_path(root)
    if root == "/":
        return True
    return path == root or path.startswith(root + "/")


def within_any(path: str | None, roots: Iterable[str]) -> str | None:
    """The first of ``roots`` that holds ``path`` (see :func:`path_within`), or None."""
    if not path:
        return None
    for root in roots:
        if path_within(path, root):
            return root
    return None


def clean_link_target(target: str | None) -> str | None:
    """An absolute filesystem path from a ``/proc`` link target, or None (sockets, pipes, anon inodes).

    Strips the kernel's `` (deleted)`` suffix: a deleted file under a run's directory still
    names that directory.
    """
    if not target or not target.startswith("/"):
        return None
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    try:
        return norm_path(target)
    except ValueError:
        return None


def arg_paths(arg: str) -> list[str]:
    """Absolute paths named by one command-line element (``/a``, ``--root=/a``, ``lowerdir=/a:/b``)."""
    pieces = [arg]
    for sep in ("=", ",", ":"):
        pieces = [q for p in pieces for q in p.split(sep)]
    return _abs_paths(pieces)


def _abs_paths(pieces: Iterable[str]) -> list[str]:
    """The absolute paths among ``pieces``, normalised (those :func:`norm_path` refuses are left out)."""
    out: list[str] = []
    for piece in pieces:
        if piece.startswith("/"):
            try:
                out.append(norm_path(piece))
            except ValueError:
                continue
    return out


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
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read()
        return parse_stat(raw.decode("utf-8", "surrogateescape"))
    except (OSError, ValueError, IndexError):
        return None


def starttime(pid: int | str) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of its stat), or None if gone."""
    st = read_stat(pid)
    return st.starttime if st else None


def read_cmdline(pid: int | str) -> list[str]:
    """argv of ``pid`` ([] for kernel threads, zombies and vanished processes)."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    if not raw:
        return []
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")]


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

    @property
    def zombie(self) -> bool:
        return self.state in ZOMBIE_STATES

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.starttime)

    @property
    def tags(self) -> list[str]:
        return tags_of(self.argv)

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
    return ProcInfo(pid=pid, ppid=st.ppid, comm=st.comm, state=st.state, starttime=st.starttime,
                    argv=tuple(read_cmdline(pid)))


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
    """Live (non-zombie) processes whose argv carries ``tag`` as a whole ``--tag`` value."""
    procs = scan_processes() if procs is None else procs
    return [p for p in procs.values() if not p.zombie and has_tag(p.argv, tag)]


# ---------------------------------------------------------------------------------------------
# mountinfo


def unescape_mountinfo(field_: str) -> str:
    r"""Undo the kernel's octal escapes (``\040`` space, ``\011`` tab, ``\012`` newline, ``\134`` backslash)."""
    if "\\" not in field_:
        return field_
    out = bytearray()
    raw = field_.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(raw):
        digits = raw[i + 1:i + 4]
        if raw[i] == 0x5C and len(digits) == 3 and all(0x30 <= c <= 0x37 for c in digits):
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class MountInfo:
    mount_id: int
    parent_id: int
    dev: str
    root: str
    mountpoint: str
    options: str
    optional: tuple[str, ...]
    fstype: str
    source: str
    superopts: str
    deleted: bool = False

    @property
    def peer_groups(self) -> set[int]:
        """Peer groups this mount shares with or receives from (``shared:N``, ``master:N``)."""
        out: set[int] = set()
        for tag in self.optional:
            name, _, num = tag.partition(":")
            if name in ("shared", "master") and num.isdigit():
                out.add(int(num))
        return out

    @property
    def shared_groups(self) -> set[int]:
        out: set[int] = set()
        for tag in self.optional:
            name, _, num = tag.partition(":")
            if name == "shared" and num.isdigit():
                out.add(int(num))
        return out

    def referenced_paths(self) -> list[str]:
        """Host paths this mount names: its mount point and an overlay's lower/upper/work dirs."""
        out = [self.mountpoint]
        if self.fstype == "overlay":
            for opt in split_superopts(self.superopts):
                name, _, value = opt.partition("=")
                if name in ("lowerdir", "upperdir", "workdir", "datadir", "lowerdir+", "datadir+"):
                    out.extend(_abs_paths(piece.replace("\\:", ":") for piece in value.split(":")))
        return out

    @property
    def depth(self) -> int:
        return 0 if self.mountpoint == "/" else self.mountpoint.count("/")


def split_superopts(opts: str) -> list[str]:
    """Split mount options on commas not escaped with a backslash (overlay escapes them)."""
    out: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(opts):
        c = opts[i]
        if c == "\\" and i + 1 < len(opts):
            cur.append(opts[i:i + 2])
            i += 2
            continue
        if c == ",":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return [o for o in out if o]


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse ``/proc/<pid>/mountinfo``. Raises ValueError on a malformed line (callers fail closed)."""
    out: list[MountInfo] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            mountpoint = unescape_mountinfo(fields[4])
            deleted = False
            if mountpoint.endswith("//deleted"):
                mountpoint = mountpoint[: -len("//deleted")] or "/"
                deleted = True
            out.append(MountInfo(
                mount_id=int(fields[0]), parent_id=int(fields[1]), dev=fields[2],
                root=unescape_mountinfo(fields[3]), mountpoint=mountpoint, options=fields[5],
                optional=tuple(fields[6:sep]), fstype=fields[sep + 1],
                source=unescape_mountinfo(fields[sep + 2]),
                superopts=unescape_mountinfo(fields[sep + 3]) if len(fields) > sep + 3 else "",
                deleted=deleted,
            ))
        except (ValueError, IndexError) as exc:
            raise ValueError(f"malformed mountinfo line {lineno}: {line!r}") from exc
    return out


def read_mountinfo(pid: int | str = "self") -> list[MountInfo]:
    """The mount table of ``pid``'s mount namespace. Raises OSError/ValueError (fail closed)."""
    with open(f"{PROC}/{pid}/mountinfo", "rb") as f:
        raw = f.read()
    mounts = parse_mountinfo(raw.decode("utf-8", "surrogateescape"))
    if pid == "self" and not mounts:
        raise ValueError("empty mount table")
    return mounts


def mount_key(path: str, mounts: Iterable[MountInfo] | None = None) -> list[str] | None:
    """``[dev, root, mountpoint]`` of the top mount at ``path`` in this namespace, or None.

    Record it on a ``mount`` entry (``mount_key=``) after mounting: a copy of that mount in a mount
    namespace cloned meanwhile is then known as a copy (not a holder) even after the host unmounted it.
    """
    path = norm_path(path)
    hits = [m for m in (read_mountinfo() if mounts is None else mounts) if m.mountpoint == path]
    if not hits:
        return None
    parents = {m.parent_id for m in hits}
    top = next((m for m in hits if m.mount_id not in parents), hits[-1])
    return [top.dev, top.root, top.mountpoint]


def mounts_within(mounts: Iterable[MountInfo], roots: Iterable[str]) -> list[MountInfo]:
    """Mounts at or below any of ``roots`` (by component), deepest first (then newest first)."""
    roots = list(roots)
    hits = [m for m in mounts if within_any(m.mountpoint, roots)]
    hits.sort(key=lambda m: (m.depth, m.mount_id), reverse=True)
    return hits


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
PR_SET_CHILD_SUBREAPER = 36


def umount_detach(path: str) -> None:
    """``umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW)``; raises OSError with the errno."""
    if _libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


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
