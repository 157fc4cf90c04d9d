"""The image store on disk (``config.IMAGE_STORE``; layout: :mod:`drums_core.host.images`): built
images' manifests, listing, the locks that order builds, removals and sessions' mounts, the check
that no mount uses an image, swapping a complete build in, and removal."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from ..errors import FailedPrecondition, NotFound, Unavailable
from ..reasons import Reason
from . import bounded, linux, mounttable

log = logging.getLogger("drums_core.host.images")

Progress = Callable[[str], None]
_BUILD_SUFFIX_RE = re.compile(r"^[0-9a-f]{8}$")  # secrets.token_hex(4)


# --------------------------------------------------------------------------------------- manifests
@dataclass
class Manifest:
    """What ``<store>/<name>/manifest.json`` records about a built image."""

    name: str
    spec: dict[str, Any]
    base: str
    id_base: int
    packages: dict[str, str]
    size_bytes: int
    files_count: int
    build_seconds: float
    built_at: str
    spec_hash: str
    content_hash: str
    shift_seconds: float = 0.0
    guest_pip: dict[str, str] = field(default_factory=dict)
    # Files that carried security.capability: {"path", "restored"} (restored as v3 with the new root id).
    file_caps: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def store() -> Path:
    return config.IMAGE_STORE


def image_dir(name: str) -> Path:
    return store() / config.check_name(name, "image name")


def rootfs_path(name: str) -> Path:
    """The root filesystem of a built image (NotFound when it is not built)."""
    get(name)
    return image_dir(name) / "rootfs"


def read_manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("unreadable image manifest %s: %s", path, exc)
        return None


def get(name: str) -> Manifest:
    """The manifest of a built image, or NotFound saying how to build it."""
    m = read_manifest(image_dir(name) / "manifest.json")
    if m is None:
        how = "drums image build" if name == config.DEFAULT_IMAGE else f"drums image build {name} --spec FILE"
        raise NotFound(f"image {name!r} is not built in {store()}; build it with `{how}` (as root)",
                       reason=Reason.IMAGE_NOT_FOUND)
    return m


def list_images() -> list[Manifest]:
    """Every built image in the store, by name."""
    try:
        names = sorted(n for n in os.listdir(store()) if not n.startswith("."))
    except FileNotFoundError:
        return []
    found = (read_manifest(store() / n / "manifest.json") for n in names)
    return [m for m in found if m is not None]


def check_usable(name: str) -> Manifest:
    """The manifest of an image a session may use now; FailedPrecondition if its id base differs."""
    m = get(name)
    if m.id_base != config.ID_BASE:
        raise FailedPrecondition(
            f"image {name!r} was built for id base {m.id_base}, this host uses {config.ID_BASE} "
            f"(DRUMS_ID_BASE); rebuild it with `drums image build {name} --force`",
            reason=Reason.IMAGE_ID_BASE_MISMATCH)
    if not (image_dir(name) / "rootfs").is_dir():
        raise FailedPrecondition(f"image {name!r} has a manifest but no rootfs; rebuild it with --force",
                                 reason=Reason.IMAGE_INCOMPLETE)
    return m

# ----------------------------------------------------------------------------------------- locking
@contextmanager
def locked(name: str, *, shared: bool = False, progress: Progress | None = None,
            suffix: str = "") -> Iterator[None]:
    """flock ``<store>/.locks/<name><suffix>`` (suffix ``@use``: the mount/replace lock; no name has '@')."""
    lock_dir = store() / ".locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / (config.check_name(name, "image name") + suffix)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                holder = "a session mounting" if suffix else "another build or removal of"
                progress(f"[image] {name}: waiting for {holder} {name}")
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


@contextmanager
def mounting(name: str) -> Iterator[Path]:
    """Hold while mounting an overlay over an image: yields its rootfs (checked usable).

    A rebuild or removal swaps the image out only under the exclusive side of this lock, after it
    has looked for mounts that use the image; so a mount made inside this block is either seen
    (and the rebuild or removal refuses) or made on the new image, never on a tree being deleted.
    """
    with locked(name, shared=True, suffix="@use"):
        check_usable(name)
        yield image_dir(name) / "rootfs"


@contextmanager
def replacing(name: str, action: str) -> Iterator[None]:
    """No session mounts the image meanwhile, and none uses it now (FailedPrecondition)."""
    with locked(name, suffix="@use"):
        refuse_if_used(name, action)
        yield


def stale_builds(name: str) -> list[Path]:
    prefix = f".build-{name}-"
    try:
        entries = os.listdir(store())
    except FileNotFoundError:
        return []
    return [store() / e for e in entries if e.startswith(prefix) and _BUILD_SUFFIX_RE.match(e[len(prefix):])]


def remove_stale_builds(name: str, progress: Progress) -> None:
    """Remove what crashed builds or removals of ``name`` left (the caller holds the name's lock)."""
    for d in stale_builds(name):
        progress(f"[image] {name}: removing {d.name} (left by an interrupted build)")
        rmtree(d)


def rmtree(path: Path) -> None:
    shutil.rmtree(path)  # never follows symlinks; root may delete in read-only directories


def new_build_dir(name: str) -> Path:
    store().mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        d = store() / f".build-{name}-{secrets.token_hex(4)}"
        try:
            d.mkdir(mode=0o755)
            return d
        except FileExistsError:
            continue
    raise Unavailable(f"cannot create a build directory in {store()}", reason=Reason.IMAGE_BUILD_FAILED)


def staged_dir(name: str) -> Path:
    return store() / f".staged-{name}"


def swap_in(name: str, src: Path) -> None:
    """Make the complete image in ``src`` visible as ``name`` in one rename; delete the old one.

    FailedPrecondition (nothing changed) when a mount uses the current image: a session may have
    started on it while this build ran.
    """
    target = image_dir(name)
    with replacing(name, "replace"):
        if target.exists():
            linux.rename_exchange(src, target)  # src now holds the old image
        else:
            os.rename(src, target)
    shutil.rmtree(src, ignore_errors=True)  # what is left is cleaned by the next build



# ---------------------------------------------------------------------------------------- in use
def _mount_namespaces() -> Iterator[Path]:
    """One mountinfo path per mount namespace on the host (ours first)."""
    seen: set[int] = set()
    pids = ["self"] + [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        try:
            ino = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        except OSError:
            continue
        if ino not in seen:
            seen.add(ino)
            yield Path(f"/proc/{pid}/mountinfo")


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _fs_relative(path: Path) -> tuple[str, str]:
    """(major:minor, path within its filesystem) of a directory, from our own mountinfo."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    best_point, best_root = "/", "/"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            root, point = _unescape(fields[3]), _unescape(fields[4])
            inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
            if fields[2] == dev and inside and len(point) >= len(best_point):
                best_point, best_root = point, root
    rel = os.path.relpath(str(path), best_point)
    return dev, os.path.normpath(os.path.join(best_root, rel))


def _root_mount(text: str) -> tuple[str, str] | None:
    """(major:minor, root within its filesystem) of the mount a mount table has on top at ``/``;
    None when the table does not parse (such a namespace is then never taken for a copy)."""
    try:
        tops = [(m.dev, m.root) for m in mounttable.parse_mountinfo(text) if m.mountpoint == "/"]
    except ValueError:
        return None
    return tops[-1] if tops else None


def users_of(name: str) -> list[str]:
    """Mounts that use the image (overlay lowerdirs and bind mounts of it): the host's own, and those
    of every other mount namespace whose root is not the host's.

    A namespace whose root is still the host's is an unpivoted copy of the host's mount table: a
    CRIU restore's, a session launch's or an image build step's before it pivots (up to 3.4 s
    each, measured under the test suite's parallel lane), or any program that unshared without
    pivoting. What it holds that the host still mounts is in the host's own table; what the host
    has unmounted lives on only in that copy (where the host's mounts are private, an unmount does
    not reach it), used by no session, and gone when that program ends. Counting it refused a
    rebuild after the last session's overlay was gone. A session's namespace pivots into its
    overlay, so it is counted, also after the sweep has detached the overlay on the host while the
    session's processes live on."""
    rootfs = image_dir(name) / "rootfs"
    if not rootfs.is_dir():
        return []
    dev, rel = _fs_relative(rootfs)
    needle = str(rootfs)
    users: list[str] = []
    host_root = _root_mount(Path("/proc/self/mountinfo").read_text())
    for i, mountinfo in enumerate(_mount_namespaces()):  # ours first
        try:
            text = bounded.read_path(str(mountinfo), limit=mounttable.OWN_TABLE_LIMIT if i == 0 else
                                     bounded.MOUNTINFO_LIMIT, timeout=bounded.PROC_TIMEOUT).data.decode(
                                         "utf-8", "surrogateescape")
        except OSError:
            continue
        except Unavailable as exc:  # fail closed: a table too large to read may hold the image
            users.append(f"a mount table that could not be read whole ({exc.reason}; {mountinfo.parent.name})")
            continue
        if i > 0 and host_root is not None and _root_mount(text) == host_root:
            continue
        lines = text.splitlines()
        for line in lines:
            pre, _, post = line.partition(" - ")
            fields = pre.split()
            root, point = _unescape(fields[3]), _unescape(fields[4])
            options = _unescape(post)
            is_lower = "lowerdir" in options and re.search(re.escape(needle) + r"(/[^:,]*)?([:,]|$)", options)
            is_bind = fields[2] == dev and (root == rel or root.startswith(rel + "/"))
            if is_lower or is_bind:
                users.append(f"{point} ({'overlay lower' if is_lower else 'bind'}; {mountinfo.parent.name})")
    return sorted(set(users))


def refuse_if_used(name: str, action: str) -> None:
    users = users_of(name)
    if users:
        raise FailedPrecondition(f"cannot {action} image {name!r}: mounted by {len(users)} mount(s), e.g. "
                                 f"{users[0]}; destroy the sessions that use it first",
                                 reason=Reason.IMAGE_IN_USE, detail=users)


def remove(name: str, progress: Progress | None = None) -> None:
    """Delete a built image; FailedPrecondition while any mount uses it, NotFound when absent."""
    say = progress or log.info
    get(name)  # before the lock: no lock file for a name that was never built
    with locked(name, progress=say):
        get(name)
        trash = new_build_dir(name)
        os.rmdir(trash)
        with replacing(name, "remove"):
            os.rename(image_dir(name), trash)  # invisible at once; a crash leaves only a .build-* dir
        rmtree(trash)
        remove_stale_builds(name, say)
        shutil.rmtree(staged_dir(name), ignore_errors=True)
    say(f"[image] {name}: removed")
