"""The mount table: ``/proc/<pid>/mountinfo`` parsed (:class:`MountInfo`; :func:`read_mountinfo` raises,
because the sweep fails closed when it cannot read it), the mounts at or under given paths, a
mount's identity (:func:`mount_key`) and a detached unmount that never follows a link."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import Unavailable
from . import bounded, linux
from .ownedpaths import abs_paths, norm_path, within_any

PROC = "/proc"
OWN_TABLE_LIMIT = 64 << 20  # this process's own table: the host's, never a session's to grow


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
                    out.extend(abs_paths(piece.replace("\\:", ":") for piece in value.split(":")))
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


class TableTooLarge(ValueError):
    """A mount table over its bound (:func:`read_mountinfo`): callers treat it as unreadable."""


def read_mountinfo(pid: int | str = "self") -> list[MountInfo]:
    """The mount table of ``pid``'s mount namespace, read through :mod:`.bounded`: another
    namespace's (a session may make thousands of mounts in a nested user namespace) up to
    ``bounded.MOUNTINFO_LIMIT`` bytes, this process's own up to :data:`OWN_TABLE_LIMIT`, each in at
    most ``bounded.PROC_TIMEOUT`` s. Raises OSError/ValueError (fail closed); over a bound,
    :class:`TableTooLarge` (a ValueError) naming the bound's reason."""
    limit = OWN_TABLE_LIMIT if pid == "self" else bounded.MOUNTINFO_LIMIT
    try:
        raw = bounded.read_path(f"{PROC}/{pid}/mountinfo", limit=limit, timeout=bounded.PROC_TIMEOUT).data
    except Unavailable as exc:
        raise TableTooLarge(f"mount table of {pid}: {exc}") from exc
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

MNT_DETACH = linux.MNT_DETACH
UMOUNT_NOFOLLOW = 8


def umount_detach(path: str) -> None:
    """``umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW)``; raises OSError with the errno."""
    linux.umount(path, MNT_DETACH | UMOUNT_NOFOLLOW)
