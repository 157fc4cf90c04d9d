"""What a stopped instance leaves on the host, and the steps that remove it: :func:`sweep_instance`
(its dead runs swept, its state tmpfs unmounted, its daemon files and emptied state directory gone)
and the two steps it shares with ``drums shutdown --purge`` (:mod:`drums_core.daemon.purge`), which
adds its refusals and deletes more (snapshots spilled to disk, the log, a state directory's contents):
:func:`unmount_state` and :func:`remove_files`. Neither follows a symbolic link."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..config import Instance
from ..session import rootfs
from .driver import sweep


def real_dir(path: Path) -> bool:
    """``path`` is a directory and not a symbolic link (never follows one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def unmount_state(instance: Instance) -> int:
    """Unmount the instance's state tmpfs and whatever is mounted on it, deepest first; how many mounts
    went (0 when the state directory is not a mount point). Only once its daemon has stopped."""
    state = instance.state_dir
    return rootfs.unmount_tree(state) if state.exists() and rootfs.is_mountpoint(state) else 0


def remove_files(paths: Iterable[Path]) -> list[str]:
    """Unlink each of ``paths`` that is there and is not a directory (a symbolic link itself goes, its
    target stays); the paths removed."""
    removed = []
    for p in paths:
        if os.path.lexists(p) and not real_dir(p):
            os.unlink(p)
            removed.append(str(p))
    return removed


def sweep_instance(instance: Instance) -> dict:
    """What a stopped instance left on the host, gone: its dead runs swept (:func:`sweep`), its state
    tmpfs unmounted, its daemon files (``instance.daemon_files``) and its emptied state directory
    removed. Its log stays, to be read. Only once its daemon has stopped: under a live daemon this
    would unmount the state it works in. Returns ``{"sweep": <report, {} without ledgers>, "unmounted": n}``.
    """
    report = sweep(instance.ledger_root) if instance.ledger_root.exists() else None
    unmounted = unmount_state(instance)
    remove_files(instance.daemon_files)
    try:
        instance.state_dir.rmdir()
    except OSError:
        pass
    return {"sweep": report.to_dict() if report is not None else {}, "unmounted": unmounted}
