"""The id shift: move the owner and group of every file of an image by ``config.ID_BASE`` (up after a
build, down before a derived build copies it), keeping setuid/setgid bits and file capabilities."""
from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from ..errors import Unavailable
from ..reasons import Reason

log = logging.getLogger("drums_core.host.images")

_CAP_XATTR = "security.capability"
_CAP_V2, _CAP_V3 = 0x02000000, 0x03000000


@dataclass
class ShiftReport:
    files: int = 0
    size_bytes: int = 0
    seconds: float = 0.0
    caps: list[dict[str, Any]] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under root (root included) with its lstat, never following symlinks."""
    yield str(root), os.lstat(root)
    stack = [str(root)]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                yield e.path, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)


def _shift_caps(raw: bytes, delta: int) -> bytes | None:
    """The capability xattr with its root id moved by ``delta`` (v2 means root id 0), or None."""
    if len(raw) < 20:
        return None
    magic = int.from_bytes(raw[:4], "little")
    version, flags = magic & 0xFF000000, magic & 0x00FFFFFF
    if version == _CAP_V2 and len(raw) == 20:
        rootid = 0
    elif version == _CAP_V3 and len(raw) == 24:
        rootid = int.from_bytes(raw[20:24], "little")
    else:
        return None
    new_root = rootid + delta
    if new_root == 0:
        return (_CAP_V2 | flags).to_bytes(4, "little") + raw[4:20]
    return (_CAP_V3 | flags).to_bytes(4, "little") + raw[4:20] + new_root.to_bytes(4, "little")


def _shift_one(path: str, st: os.stat_result, delta: int, low: int, report: ShiftReport) -> None:
    if not (low <= st.st_uid < low + config.ID_COUNT and low <= st.st_gid < low + config.ID_COUNT):
        report.out_of_range.append(f"{path} ({st.st_uid}:{st.st_gid})")
        return
    caps = None
    if stat.S_ISREG(st.st_mode):
        try:
            caps = os.getxattr(path, _CAP_XATTR, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise
    os.lchown(path, st.st_uid + delta, st.st_gid + delta)
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        os.chmod(path, stat.S_IMODE(st.st_mode))  # chown cleared setuid/setgid (sudo!)
    if caps is not None:
        _restore_caps(path, caps, delta, report)


def _restore_caps(path: str, caps: bytes, delta: int, report: ShiftReport) -> None:
    new = _shift_caps(caps, delta)
    restored = False
    if new is not None:
        try:
            os.setxattr(path, _CAP_XATTR, new, follow_symlinks=False)
            restored = True
        except OSError as exc:
            log.warning("cannot restore file capabilities of %s: %s", path, exc)
    report.caps.append({"path": path, "restored": restored})


def shift_ids(root: Path, delta: int) -> ShiftReport:
    """Move the owner and group of every file under ``root`` by ``delta`` (lchown, no symlink followed).

    Ids must lie in the 65536-id range being moved (0.. for a shift up, ID_BASE.. for a shift down);
    anything else is an error listing the offending files. Modes with setuid/setgid are re-applied
    and ``security.capability`` is re-set with the root id moved too (v3 capabilities), as chown
    clears both. Hard links are shifted once.
    """
    t0 = time.monotonic()
    low = 0 if delta >= 0 else -delta
    report = ShiftReport()
    seen: set[int] = set()
    for path, st in walk(root):
        report.files += 1
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
        report.size_bytes += st.st_blocks * 512
        _shift_one(path, st, delta, low, report)
    report.seconds = time.monotonic() - t0
    if report.out_of_range:
        raise Unavailable(f"{len(report.out_of_range)} file(s) under {root} have ids outside "
                          f"{low}..{low + config.ID_COUNT - 1}, e.g. {report.out_of_range[0]}",
                          reason=Reason.IMAGE_IDS_OUT_OF_RANGE, detail=report.out_of_range[:50])
    return report
