"""Paths compared by whole components: ``/x/run1`` is within ``/x/run1`` and ``/x/run1/a``, never within
``/x/run10``; which paths a ledger may own (never ``/``, ``/tmp``, ...); the absolute paths a command
line element or a ``/proc`` link names. What the ledger and the sweep decide ownership of paths by."""
from __future__ import annotations

import os
from collections.abc import Iterable

# Paths no ledger may own: owning one of them would make every process or mount of the host
# "the run's". check_owned_path refuses them and anything shallower than two components.
DENIED_PATHS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/dev/shm", "/run/drums", "/run/user", "/run/lock", "/tmp/.X11-unix", "/tmp/.ICE-unix",
    "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var/lib", "/var/log",
    "/var/tmp", "/var/run", "/opt/drums",
})



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
    return abs_paths(pieces)


def abs_paths(pieces: Iterable[str]) -> list[str]:
    """The absolute paths among ``pieces``, normalised (those :func:`norm_path` refuses are left out)."""
    out: list[str] = []
    for piece in pieces:
        if piece.startswith("/"):
            try:
                out.append(norm_path(piece))
            except ValueError:
                continue
    return out
