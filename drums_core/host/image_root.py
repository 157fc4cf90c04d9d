"""The last step into an image build's root: ``image_root.main([ROOT, COMMAND])``.

Run by the chroot setup of :mod:`drums_core.host.image_recipe` inside the build step's own mount
namespace, once ROOT is a mount point with /proc, /sys and /dev under it. It makes ROOT the root of
that namespace (pivot_root) and detaches the rest, then runs COMMAND with ``/bin/sh -ec`` there.
A chroot would leave the namespace holding a copy of every host mount for the step's duration
(an apt-get install: minutes): a session's overlay unmounted on the host meanwhile lived on in
it, pinned, and ``image_store.users_of`` then counted it, refusing to rebuild or remove that
image (it now passes over such unpivoted copies, which CRIU's restores also make).
"""
from __future__ import annotations

import os

from . import linux


def enter(root: str) -> None:
    """Make ``root`` (a mount point) this mount namespace's root; the old root is detached."""
    old = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    try:
        os.chdir(root)
        linux.pivot_root(".", ".")  # the old root now lies over the new one, at "."
        os.fchdir(old)
        linux.umount(".", linux.MNT_DETACH)
    finally:
        os.close(old)
    os.chdir("/")


def main(argv: list[str]) -> None:
    root, command = argv
    enter(root)
    os.execv("/bin/sh", ["/bin/sh", "-ec", command])
