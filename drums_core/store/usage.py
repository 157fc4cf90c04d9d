"""What a directory really occupies: allocated blocks, each inode once, plus what its inodes cost.

A snapshot's layer is written by its session, which is untrusted: a file's ``st_size`` says nothing
of what it occupies (``truncate -s 20T`` allocates nothing; 3,000 names of one 64 MiB file hold
64 MiB once). The store therefore charges a snapshot by

    blocks   ``st_blocks * 512`` of each inode, counted once however many names it has
             (``(st_dev, st_ino)``; a walk never leaves the filesystem it started on)
    inodes   ``INODE_COST`` per inode and ``LINK_COST`` per further name: on the tmpfs that holds
             the store an inode is kernel memory too (measured on this machine: an empty file
             ~1.0 KiB, one more hard link ~0.22 KiB, with 0 blocks either way)

:func:`occupied` walks without following any symlink (directories are opened with ``O_NOFOLLOW``
relative to their parent's descriptor, one descriptor open at a time, so neither a deep tree nor a
long path stops it), and is bounded in time and in names: past its bound it stops and says so
(``complete=False``) with what it counted so far; the caller decides what to charge then.
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

INODE_COST = 1024        # an inode (and its first name) on tmpfs: ~1.0 KiB of kernel memory, measured
LINK_COST = 256          # each further name (a dentry): ~0.22 KiB, measured
WALK_SECONDS = 30.0      # a layer walk stops after this long (~4.4 us a name here: ~7M names)
WALK_MAX_ENTRIES = 2_000_000  # ... or after this many names (bounds the walk's own memory too)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Usage:
    """What a walk counted. ``charge`` is what the store counts for it."""

    blocks: int = 0        # bytes of allocated blocks, each inode once
    inodes: int = 0        # distinct inodes (directories, files, links, whiteouts...)
    entries: int = 0       # names seen (the root included)
    apparent: int = 0      # sum of st_size over every name of a regular file (what sizes claim)
    complete: bool = True  # False: the walk stopped at its bound (or met a race) before the end
    seconds: float = 0.0
    why: str = ""          # why it stopped early

    @property
    def charge(self) -> int:
        return self.blocks + self.inodes * INODE_COST + max(0, self.entries - self.inodes) * LINK_COST

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.blocks + other.blocks, self.inodes + other.inodes, self.entries + other.entries,
                     self.apparent + other.apparent, self.complete and other.complete,
                     self.seconds + other.seconds, self.why or other.why)

    def to_dict(self) -> dict:
        return {**asdict(self), "charge": self.charge}


def fs_usage(path: str | os.PathLike[str]) -> Usage:
    """The use of the whole filesystem holding ``path`` (``statvfs``: used blocks, used inodes), as the
    kernel counts it. For a session's writable tmpfs this is what its upper occupies, in O(1)."""
    st = os.statvfs(path)
    inodes = max(0, st.f_files - st.f_ffree)
    return Usage(blocks=(st.f_blocks - st.f_bfree) * st.f_frsize, inodes=inodes, entries=inodes)


def occupied(root: str | os.PathLike[str], *, seconds: float = WALK_SECONDS, max_entries: int = WALK_MAX_ENTRIES,
             skip: frozenset[str] | set[str] = frozenset()) -> Usage:
    """What the tree at ``root`` occupies (see the module docstring). ``root`` itself must not be a
    symlink (an absent root occupies nothing); ``skip``: names directly under ``root`` left out."""
    t0 = time.monotonic()
    deadline = t0 + seconds
    u = Usage()
    seen: set[int] = set()  # inode numbers of multiply linked non-directories already counted

    def count(st: os.stat_result) -> None:
        u.entries += 1
        if stat.S_ISREG(st.st_mode):
            u.apparent += st.st_size
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if st.st_ino in seen:
                return
            seen.add(st.st_ino)
        u.inodes += 1
        u.blocks += st.st_blocks * 512

    def stop(why: str) -> None:
        u.complete = False
        u.why = u.why or why

    def list_dir(fd: int, top: bool) -> list[str] | None:
        """Count the names of the directory open at ``fd``; its subdirectories' names (None: bound hit)."""
        subdirs = []
        with os.scandir(fd) as it:
            for i, entry in enumerate(it):
                if top and entry.name in skip:
                    continue
                if u.entries >= max_entries:
                    stop(f"more than {max_entries} names")
                    return None
                if i & 1023 == 1023 and time.monotonic() > deadline:
                    stop(f"walk over {seconds:.0f} s")
                    return None
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone meanwhile: occupies nothing now
                count(st)
                if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                    subdirs.append(entry.name)
        return subdirs

    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return u
    try:
        st = os.fstat(fd)
        dev = st.st_dev
        count(st)
        names = list_dir(fd, top=True)
        stack: list[tuple[list[str], int]] = [] if names is None else [(names, st.st_ino)]
        while stack:
            pending, _ino = stack[-1]
            if time.monotonic() > deadline:
                stop(f"walk over {seconds:.0f} s")
                break
            if pending:
                name = pending.pop()
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # replaced meanwhile (by a symlink: ELOOP; gone: ENOENT)
                    stop(f"{name}: {exc.strerror}")
                    continue
                sst = os.fstat(sub)
                if sst.st_dev != dev:
                    os.close(sub)
                    continue
                os.close(fd)
                fd = sub
                names = list_dir(fd, top=False)
                if names is None:
                    break
                stack.append((names, sst.st_ino))
                continue
            stack.pop()
            if not stack:
                break
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            ust = os.fstat(up)
            os.close(fd)
            fd = up
            if (ust.st_dev, ust.st_ino) != (dev, stack[-1][1]):  # moved meanwhile: not where we were
                stop("a directory moved during the walk")
                break
    finally:
        os.close(fd)
    u.seconds = time.monotonic() - t0
    return u


def snapshot_usage(snap_dir: Path, *, upper_fallback: Usage | None = None,
                   seconds: float = WALK_SECONDS, max_entries: int = WALK_MAX_ENTRIES) -> dict:
    """A snapshot directory's charge: its ``layer`` (written by the session) and the rest (CRIU's
    images, the manifest and markers), each walked as :func:`occupied` does. A layer walk cut short
    by its bound is charged the larger of what it counted and ``upper_fallback`` (what the session's
    writable filesystem held when it was frozen), so nothing a session hides past the bound goes
    uncounted. Returns ``{"size", "layer", "images", "basis"}`` (usages as dicts)."""
    images = occupied(snap_dir, skip={"layer"}, seconds=seconds, max_entries=max_entries)
    layer = occupied(snap_dir / "layer", seconds=seconds, max_entries=max_entries)
    layer_charge = layer.charge
    basis = "blocks"
    if not layer.complete:
        basis = "blocks, layer walk cut short: " + layer.why
        if upper_fallback is not None:
            layer_charge = max(layer_charge, upper_fallback.charge)
            basis += "; charged what the session's writable filesystem held"
    return {"size": images.charge + layer_charge, "layer": {**layer.to_dict(), "charged": layer_charge},
            "images": images.to_dict(), "basis": basis}
