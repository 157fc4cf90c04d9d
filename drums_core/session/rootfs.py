"""Overlay roots: the desktop image layer, per-session uppers, and freezing an upper into a layer."""
from __future__ import annotations

import compileall
import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from ..host import linux, safepath
from ..config import GUEST_CODE, GUEST_SITE
from ..errors import FailedPrecondition, Internal
from ..reasons import Reason


def is_mountpoint(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == target:
                return True
    return False


def ensure_tmpfs(path: Path, size: str = "50%") -> bool:
    """Mount a private tmpfs at ``path`` unless one is there. Returns True when it mounted one."""
    path.mkdir(parents=True, exist_ok=True)
    if is_mountpoint(path):
        return False
    linux.mount("tmpfs", str(path), "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, f"mode=700,size={size}")
    linux.mount("none", str(path), None, linux.MS_PRIVATE)
    return True


def build_code_layer(parent: Path, owner: int) -> Path:
    """The Drums code layer: this package's Python sources (and their bytecode) at ``GUEST_CODE`` inside
    every session.

    Laid over the image, so the session init and the guest server run from inside the session (the
    image's own Python, never the host's venv). Named by a hash of the sources, so a daemon of
    another version never reuses it; owned by the session's root (``owner``), like the image.
    """
    here = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding both packages
    files: list[tuple[Path, str]] = []
    for pkg in ("drums_core", "drums_osworld"):
        for p in sorted((here / pkg).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed", ".json"):
                files.append((p, str(p.relative_to(here))))
    digest = hashlib.sha256(GUEST_SITE.encode())
    for p, rel in files:
        digest.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    layer = parent / f"code-{digest.hexdigest()[:16]}-{owner}"
    if layer.is_dir():
        return layer
    tmp = parent / f".{layer.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    dest = tmp / GUEST_CODE.lstrip("/")
    for p, rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest / rel)  # its time kept: the checkout's bytecode of it stays valid
        cached = Path(importlib.util.cache_from_source(str(p)))
        if p.suffix == ".py" and cached.is_file():
            mine = Path(importlib.util.cache_from_source(str(dest / rel)))
            mine.parent.mkdir(exist_ok=True)
            shutil.copy2(cached, mine)
    # with its bytecode: the layer is read-only in a session, where every session init, exec helper and
    # guest server would otherwise compile what it imports at each start (the tag in the file names
    # makes an image whose Python differs from this one's ignore them). What the checkout had compiled
    # (scripts/provision compiles it) came along; this compiles only what is missing or stale.
    compileall.compile_dir(str(dest), quiet=1, workers=1)
    # the image's guest Python finds the code for every program of the session, agents' own included
    site = tmp / GUEST_SITE.lstrip("/")
    site.mkdir(parents=True)
    (site / "drums-code.pth").write_text(GUEST_CODE + "\n")
    for dirpath, dirs, names in os.walk(tmp):
        for name in [*dirs, *names]:
            full = os.path.join(dirpath, name)
            os.lchown(full, owner, owner)
            os.chmod(full, 0o755 if name in dirs else 0o644)
    os.chown(tmp, owner, owner)
    os.chmod(tmp, 0o755)
    try:
        tmp.rename(layer)
    except OSError:  # another daemon made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return layer


def _escape_layer(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:").replace(",", "\\,")


# CRIU reads /proc/*/mountinfo a line at a time into a page-sized buffer: one longer line (an
# overlay's options name every layer) makes every dump on the host fail. Fields besides the options
# and the mount point (twice: root and mount point) take about a hundred bytes.
CRIU_MOUNTINFO_LINE = 4000
MOUNTINFO_OVERHEAD = 160


def mount_overlay(lowers: list[Path | str], upper: Path, work: Path, target: Path) -> None:
    """The session root (``:``, ``,`` and ``\\`` in layer paths escaped as overlay's option parser wants).

    ``index=on,nfs_export=on`` make the overlay's file handles openable again: CRIU dumps an
    inotify watch (the system bus's on ``/usr/share/dbus-1/system.d``, a file manager's on the home
    folder) by opening its handle, and without them it must guess the path from a scan of a few
    folders, which fails for most of what desktop applications watch ("Can't dump that handle")."""
    lowerdir = ":".join(_escape_layer(str(p)) for p in lowers)
    opts = f"lowerdir={lowerdir},upperdir={upper},workdir={work},redirect_dir=on,index=on,nfs_export=on"
    # the mount's line in /proc/*/mountinfo must stay readable by CRIU, or no session of the host
    # could be dumped any more ("Can't parse ... mountinfo"): refuse the mount instead
    line = len(opts) + 2 * len(str(target)) + MOUNTINFO_OVERHEAD
    if line > CRIU_MOUNTINFO_LINE:
        raise FailedPrecondition(
            f"a root of {len(lowers)} layers would need a mount line of {line} bytes; CRIU reads at most "
            f"{CRIU_MOUNTINFO_LINE}: restore from a shorter chain of checkpoints", reason=Reason.CHAIN_TOO_DEEP,
            detail={"layers": len(lowers), "line_bytes": line, "limit": CRIU_MOUNTINFO_LINE})
    linux.mount("overlay", str(target), "overlay", 0, opts)
    linux.mount("none", str(target), None, linux.MS_PRIVATE)


ALIAS_HEX = 5


def layer_alias(alias_dir: Path, layer: Path | str) -> str:
    """A short name for a checkpoint layer (a symlink in ``alias_dir``, which only the host writes),
    so that a deep chain of layers fits in one mount line: ``<alias_dir>/<5+ hex>`` (a few hundred
    layers an instance: a clash only lengthens the name; each byte saved is a hundred in a chain of
    100, whose line also carries the instance's name, ``pytest-<pid>`` with pids of up to 7 digits)."""
    alias_dir.mkdir(exist_ok=True)
    target = str(layer)
    digest = hashlib.sha256(target.encode()).hexdigest()
    for n in range(ALIAS_HEX, len(digest) + 1):
        link = alias_dir / digest[:n]
        try:
            os.symlink(target, link)
            return str(link)
        except FileExistsError:
            if os.path.islink(link) and os.readlink(link) == target:
                return str(link)
    raise Internal(f"no free alias for layer {target} in {alias_dir}", reason=Reason.ALIAS_CLASH)


def prune_aliases(alias_dir: Path) -> int:
    """Remove the aliases whose layer is gone (its snapshot was deleted). Returns how many."""
    gone = 0
    if not alias_dir.is_dir():
        return 0
    for entry in os.scandir(alias_dir):
        if entry.is_symlink() and not os.path.exists(entry.path):
            os.unlink(entry.path)
            gone += 1
    return gone


def mounts_under(target: Path) -> list[str]:
    """Mount points (in this mount namespace) at ``target`` (its real path) or under it, by component."""
    real = os.path.realpath(target)
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == real or point.startswith(real + "/"):
                mounts.append(point)
    return mounts


def unmount_tree(target: Path) -> int:
    """Unmount ``target`` and everything under it, deepest first. Returns how many were unmounted."""
    count = 0
    for point in sorted(mounts_under(target), key=len, reverse=True):
        try:
            linux.umount(point, linux.MNT_DETACH)
            count += 1
        except OSError:
            if is_mountpoint(Path(point)):
                raise
    return count


def write_session_files(root: Path, hostname: str, machine_id: str, owner: int,
                        spec_json: str | None = None) -> None:
    """The reseeded identity files, written through :mod:`drums_core.host.safepath`: the root is the
    session's, so a symlink it planted on any of these paths fails the write (``UNSAFE_PATH``)."""
    r = str(root)
    ids = (owner, owner)
    safepath.write_file(r, "etc/hostname", hostname + "\n", owner=ids)
    safepath.write_file(r, "etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost\n",
                        owner=ids)
    safepath.write_file(r, "etc/machine-id", machine_id + "\n", mode=0o444, owner=ids)
    if spec_json is not None:
        safepath.make_dir(r, "etc/drums", owner=ids)
        safepath.write_file(r, "etc/drums/session.json", spec_json, owner=ids)


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
