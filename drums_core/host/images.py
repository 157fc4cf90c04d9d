"""Desktop images: root filesystems Drums builds from Debian packages, the lowest layer of a session.

A session never sees the host's ``/``: its lowest overlay layer is an image built here with
``mmdebstrap`` (or derived from another image), customised (user ``user``, sudo, locales, the guest
Python environment) and then id-shifted so that it is owned by the ids a session's user namespace
maps onto (``config.ID_BASE`` + 0..65535).

Store layout (``config.IMAGE_STORE``, a disk filesystem, never a tmpfs)::

    <store>/<name>/rootfs/          the image's root filesystem (ids shifted by ID_BASE)
    <store>/<name>/manifest.json    written last, inside the build directory: the commit marker
    <store>/<name>/build.log        what the build's tools printed
    <store>/.locks/<name>           flock: one build or removal of <name> at a time (a derived
                                    build holds its base's lock shared while it copies it)
    <store>/.locks/<name>@use       flock: shared by :func:`mounting` while a session mounts the
                                    image, exclusive while a rebuild or removal checks for mounts
                                    and swaps the image out (no name contains '@')
    <store>/.build-<name>-<rand8>/  a build (or a removal) in progress
    <store>/.staged-<name>/         a complete build that could not replace <name> because a
                                    session used it; the next build of the same spec swaps it in

A build happens in ``.build-<name>-<rand8>`` and is swapped onto ``<name>`` with one
``renameat2(RENAME_EXCHANGE)`` (or a rename when there is no old image) only when complete, so a
half-built image is never visible. Everything a build runs (mmdebstrap, chroot commands) runs in
its own pid and mount namespaces tied to the builder's life (parent-death signal, ``unshare
--kill-child``): a killed builder leaves no process and no mount, only a ``.build-*`` directory
that the next build of that name removes. Names never start with ``.``, so they cannot collide.

Identity:

- ``spec_hash`` = sha256 of the canonical spec JSON, the recipe (customisation version, guest pip
  pins, Debian suites), the base image's ``content_hash`` (derived images) and the sha256 of each
  ``files`` source's content. An unchanged ``spec_hash`` (with the same ``id_base``) makes a
  rebuild a no-op unless forced.
- ``content_hash`` = sha256 of ``spec_hash`` and the sorted ``package=version`` list that dpkg
  reports in the built image. It identifies what is in the image without reading its 1.3 GB:
  two builds of one spec that resolved to the same Debian package versions get the same hash.

Errors: bad specs and names are :class:`InvalidArgument`, a missing image :class:`NotFound`, an
image in use or built for another id base :class:`FailedPrecondition`, a failed build
:class:`Unavailable` (its build directory is removed, the previous image is untouched).
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from . import procs
from ..errors import DrumsError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

DEBIAN_BASE = "debian:bookworm"
SUITE = "bookworm"
MIRROR_LINES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Part of every spec_hash (with the customisation's own text): bump it to rebuild every image.
RECIPE_VERSION = 2  # 2: no device nodes in /dev but the six a session has
# The guest environment's PyPI packages, pinned with their closure (installed with --no-deps; the
# rest comes from Debian through --system-site-packages).
GUEST_PIP = (
    "PyAutoGUI==0.9.54", "PyMsgBox==2.0.1", "PyScreeze==1.0.1", "pytweening==1.2.0",
    "PyGetWindow==0.0.9", "PyRect==0.2.0", "MouseInfo==0.1.3", "pyperclip==1.11.0",
)
# Packages the customisation itself needs; added to every from-scratch build.
CUSTOMISE_PACKAGES = ("sudo", "locales", "python3", "python3-venv", "ca-certificates")
# dbus-user-session is left out: it depends on systemd and libpam-systemd (a PAM module that
# talks to logind), and it only works with a systemd --user manager, which sessions do not run.
# Sessions start their bus with dbus-launch (dbus-x11).
DEFAULT_PACKAGES = (
    "sudo", "locales", "fonts-dejavu-core", "fonts-liberation", "xvfb", "openbox", "dbus", "dbus-x11",
    "python3", "python3-venv", "python3-xlib", "python3-pil", "python3-numpy", "python3-flask",
    "python3-requests", "python3-tk", "python3-pip", "xdotool", "wmctrl", "xclip", "x11-utils",
    "x11-xserver-utils", "iproute2", "procps", "psmisc", "xterm", "imagemagick", "ffmpeg", "xdg-utils",
    "at-spi2-core", "mount", "ca-certificates", "libreoffice-writer", "libreoffice-calc", "libreoffice-impress",
)
# Debian package providing a module -> the module, checked in the guest venv after a build.
_MODULE_OF = {"python3-flask": "flask", "python3-xlib": "Xlib", "python3-pil": "PIL",
              "python3-numpy": "numpy", "python3-requests": "requests", "python3-tk": "tkinter"}
HOME_DIRS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos", ".config")
SPEC_FIELDS = {"name", "base", "packages", "files", "commands"}
FILE_FIELDS = {"src", "dest", "mode"}
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?$")
_BUILD_SUFFIX_RE = re.compile(r"^[0-9a-f]{8}$")  # secrets.token_hex(4)
_CAP_XATTR = "security.capability"
_CAP_V2, _CAP_V3 = 0x02000000, 0x03000000
_TAIL = 30


# ------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class FileSpec:
    """One host file copied into the image: ``src`` (host path), ``dest`` (absolute, in the image)."""

    src: str
    dest: str
    mode: int | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"src": self.src, "dest": self.dest}
        if self.mode is not None:
            d["mode"] = f"{self.mode:04o}"
        return d


@dataclass(frozen=True)
class ImageSpec:
    """What an image is made of. ``base`` is ``debian:bookworm`` or the name of another image."""

    name: str
    base: str = DEBIAN_BASE
    packages: tuple[str, ...] = ()
    files: tuple[FileSpec, ...] = ()
    commands: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "packages": list(self.packages),
                "files": [f.to_json() for f in self.files], "commands": list(self.commands)}

    @property
    def derived(self) -> bool:
        return self.base != DEBIAN_BASE

    @classmethod
    def from_json(cls, data: Any, *, relative_to: Path | None = None) -> ImageSpec:
        """Validate a spec document; relative ``src`` paths are taken relative to ``relative_to``."""
        if not isinstance(data, dict):
            raise _bad("an image spec must be a JSON object")
        unknown = set(data) - SPEC_FIELDS
        if unknown:
            raise _bad(f"unknown field(s) in image spec: {', '.join(sorted(unknown))} "
                       f"(allowed: {', '.join(sorted(SPEC_FIELDS))})")
        if "name" not in data:
            raise _bad("an image spec needs a 'name'")
        spec = cls(name=data["name"], base=data.get("base", DEBIAN_BASE),
                   packages=tuple(_str_list(data.get("packages", []), "packages")),
                   files=tuple(_file_spec(f, relative_to) for f in _list(data.get("files", []), "files")),
                   commands=tuple(_str_list(data.get("commands", []), "commands")))
        spec.validate()
        return spec

    def validate(self) -> None:
        config.check_name(self.name, "image name")
        if self.derived:
            config.check_name(self.base, "base image")
            if self.base == self.name:
                raise _bad(f"image {self.name!r} cannot be its own base")
        for p in self.packages:
            if not isinstance(p, str) or not _PACKAGE_RE.match(p):
                raise _bad(f"invalid Debian package name {p!r}")
        for f in self.files:
            _check_file_spec(f)


def _bad(message: str) -> InvalidArgument:
    return InvalidArgument(message, reason="INVALID_IMAGE_SPEC")


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"'{what}' must be a list")
    return value


def _str_list(value: Any, what: str) -> list[str]:
    items = _list(value, what)
    if not all(isinstance(v, str) and v for v in items):
        raise _bad(f"'{what}' must be a list of non-empty strings")
    return items


def _parse_mode(mode: Any) -> int | None:
    if mode is None:
        return None
    try:
        value = int(mode, 8) if isinstance(mode, str) else mode
    except ValueError:
        raise _bad(f"file mode {mode!r} is not an octal number like \"0644\"") from None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0o7777:
        raise _bad(f"file mode {mode!r} must be between 0000 and 7777 (octal)")
    return value


def _file_spec(item: Any, relative_to: Path | None) -> FileSpec:
    if not isinstance(item, dict):
        raise _bad("each entry of 'files' must be an object {src, dest, mode?}")
    unknown = set(item) - FILE_FIELDS
    if unknown:
        raise _bad(f"unknown field(s) in a 'files' entry: {', '.join(sorted(unknown))}")
    if not isinstance(item.get("src"), str) or not isinstance(item.get("dest"), str):
        raise _bad("each entry of 'files' needs string 'src' and 'dest'")
    src = Path(item["src"])
    if not src.is_absolute() and relative_to is not None:
        src = relative_to / src
    return FileSpec(src=str(src), dest=item["dest"], mode=_parse_mode(item.get("mode")))


def _check_file_spec(f: FileSpec) -> None:
    if not os.path.isabs(f.src):
        raise _bad(f"file source {f.src!r} must be an absolute path (or relative to the spec file)")
    if not os.path.isfile(f.src):
        raise _bad(f"file source {f.src!r} does not exist or is not a regular file")
    parts = f.dest.split("/")
    if not f.dest.startswith("/") or f.dest.endswith("/") or ".." in parts or "" in parts[1:]:
        raise _bad(f"file destination {f.dest!r} must be an absolute, normalised path to a file "
                   "in the image (no '..', no trailing '/')")
    if f.mode is not None:
        _parse_mode(f.mode)


def default_spec() -> ImageSpec:
    """The built-in ``default`` desktop image: Debian 12 with X, LibreOffice and Python."""
    return ImageSpec(name=config.DEFAULT_IMAGE, base=DEBIAN_BASE, packages=DEFAULT_PACKAGES)


def load_spec(path: str | Path) -> ImageSpec:
    """Read and validate a JSON image spec file (InvalidArgument when it is malformed)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise _bad(f"cannot read image spec {p}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(f"image spec {p} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return ImageSpec.from_json(data, relative_to=p.resolve().parent)


# Specs that layers above the engine ship (drums_osworld registers ``osworld``): name -> loader.
_REGISTERED: dict[str, Callable[[], ImageSpec]] = {}


def register_spec(name: str, loader: Callable[[], ImageSpec]) -> None:
    """Make ``drums image build NAME`` know a spec that a layer above the engine ships."""
    _REGISTERED[config.check_name(name, "image name")] = loader


def _load_entry_points() -> None:
    """Register the specs that installed packages declare (entry point group ``drums.image_specs``:
    ``NAME = module:function`` returning an :class:`ImageSpec`); the engine imports no layer above it."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="drums.image_specs"):
        if ep.name not in _REGISTERED:
            _REGISTERED[ep.name] = ep.load()


def builtin_spec(name: str) -> ImageSpec:
    if name not in _REGISTERED and name != config.DEFAULT_IMAGE:
        _load_entry_points()
    if name == config.DEFAULT_IMAGE:
        return default_spec()
    if name in _REGISTERED:
        spec = _REGISTERED[name]()
        if spec.name != name:
            raise _bad(f"the spec registered as {name!r} names image {spec.name!r}")
        return spec
    known = ", ".join(sorted({config.DEFAULT_IMAGE, *_REGISTERED}))
    raise InvalidArgument(f"there is no built-in spec for image {name!r} (built-in: {known}); pass --spec FILE",
                          reason="INVALID_IMAGE_SPEC")


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


def _image_dir(name: str) -> Path:
    return store() / config.check_name(name, "image name")


def rootfs_path(name: str) -> Path:
    """The root filesystem of a built image (NotFound when it is not built)."""
    get(name)
    return _image_dir(name) / "rootfs"


def _read_manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("unreadable image manifest %s: %s", path, exc)
        return None


def get(name: str) -> Manifest:
    """The manifest of a built image, or NotFound saying how to build it."""
    m = _read_manifest(_image_dir(name) / "manifest.json")
    if m is None:
        how = "drums image build" if name == config.DEFAULT_IMAGE else f"drums image build {name} --spec FILE"
        raise NotFound(f"image {name!r} is not built in {store()}; build it with `{how}` (as root)",
                       reason="IMAGE_NOT_FOUND")
    return m


def list_images() -> list[Manifest]:
    """Every built image in the store, by name."""
    try:
        names = sorted(n for n in os.listdir(store()) if not n.startswith("."))
    except FileNotFoundError:
        return []
    found = (_read_manifest(store() / n / "manifest.json") for n in names)
    return [m for m in found if m is not None]


def check_usable(name: str) -> Manifest:
    """The manifest of an image a session may use now; FailedPrecondition if its id base differs."""
    m = get(name)
    if m.id_base != config.ID_BASE:
        raise FailedPrecondition(
            f"image {name!r} was built for id base {m.id_base}, this host uses {config.ID_BASE} "
            f"(DRUMS_ID_BASE); rebuild it with `drums image build {name} --force`",
            reason="IMAGE_ID_BASE_MISMATCH")
    if not (_image_dir(name) / "rootfs").is_dir():
        raise FailedPrecondition(f"image {name!r} has a manifest but no rootfs; rebuild it with --force",
                                 reason="IMAGE_INCOMPLETE")
    return m


# ------------------------------------------------------------------------------------------ hashes
def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _recipe() -> dict[str, Any]:
    # The customisation script's text is in it too: editing it rebuilds images without a version bump.
    return {"version": RECIPE_VERSION, "guest_pip": list(GUEST_PIP), "mirrors": list(MIRROR_LINES),
            "customise_packages": list(CUSTOMISE_PACKAGES), "customise": _customise_script(),
            "finish": _FINISH_SCRIPT}


def spec_hash(spec: ImageSpec) -> str:
    """sha256 over the canonical spec, the recipe, the base image's content and the files' content."""
    base_content = get(spec.base).content_hash if spec.derived else None
    doc = {"spec": spec.to_json(), "recipe": _recipe(), "base_content_hash": base_content}
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    for f in spec.files:
        h.update(_sha256_file(f.src).encode())
    return h.hexdigest()


def content_hash(spec_digest: str, packages: dict[str, str]) -> str:
    """sha256 of the spec hash and the sorted ``package=version`` list (not of the 1.3 GB of files)."""
    listing = "\n".join(sorted(f"{p}={v}" for p, v in packages.items()))
    return hashlib.sha256(f"{spec_digest}\n{listing}\n".encode()).hexdigest()


def up_to_date(spec: ImageSpec) -> Manifest | None:
    """The built image's manifest when building ``spec`` again would change nothing, else None."""
    m = _read_manifest(_image_dir(spec.name) / "manifest.json")
    if m is None or m.id_base != config.ID_BASE or not (_image_dir(spec.name) / "rootfs").is_dir():
        return None
    return m if m.spec_hash == spec_hash(spec) else None


# ----------------------------------------------------------------------------------------- locking
@contextmanager
def _locked(name: str, *, shared: bool = False, progress: Progress | None = None,
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
    with _locked(name, shared=True, suffix="@use"):
        check_usable(name)
        yield _image_dir(name) / "rootfs"


@contextmanager
def _replacing(name: str, action: str) -> Iterator[None]:
    """No session mounts the image meanwhile, and none uses it now (FailedPrecondition)."""
    with _locked(name, suffix="@use"):
        _refuse_if_used(name, action)
        yield


def _stale_builds(name: str) -> list[Path]:
    prefix = f".build-{name}-"
    try:
        entries = os.listdir(store())
    except FileNotFoundError:
        return []
    return [store() / e for e in entries if e.startswith(prefix) and _BUILD_SUFFIX_RE.match(e[len(prefix):])]


def _remove_stale_builds(name: str, progress: Progress) -> None:
    """Remove what crashed builds or removals of ``name`` left (the caller holds the name's lock)."""
    for d in _stale_builds(name):
        progress(f"[image] {name}: removing {d.name} (left by an interrupted build)")
        _rmtree(d)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path)  # never follows symlinks; root may delete in read-only directories


def _new_build_dir(name: str) -> Path:
    store().mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        d = store() / f".build-{name}-{secrets.token_hex(4)}"
        try:
            d.mkdir(mode=0o755)
            return d
        except FileExistsError:
            continue
    raise Unavailable(f"cannot create a build directory in {store()}", reason="IMAGE_BUILD_FAILED")


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE)."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


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


def users_of(name: str) -> list[str]:
    """Mounts (in any mount namespace) that use the image: overlay lowerdirs and bind mounts of it."""
    rootfs = _image_dir(name) / "rootfs"
    if not rootfs.is_dir():
        return []
    dev, rel = _fs_relative(rootfs)
    needle = str(rootfs)
    users: list[str] = []
    for mountinfo in _mount_namespaces():
        try:
            lines = mountinfo.read_text().splitlines()
        except OSError:
            continue
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


def _refuse_if_used(name: str, action: str) -> None:
    users = users_of(name)
    if users:
        raise FailedPrecondition(f"cannot {action} image {name!r}: mounted by {len(users)} mount(s), e.g. "
                                 f"{users[0]}; destroy the sessions that use it first",
                                 reason="IMAGE_IN_USE", detail=users)


def remove(name: str, progress: Progress | None = None) -> None:
    """Delete a built image; FailedPrecondition while any mount uses it, NotFound when absent."""
    say = progress or log.info
    get(name)  # before the lock: no lock file for a name that was never built
    with _locked(name, progress=say):
        get(name)
        trash = _new_build_dir(name)
        os.rmdir(trash)
        with _replacing(name, "remove"):
            os.rename(_image_dir(name), trash)  # invisible at once; a crash leaves only a .build-* dir
        _rmtree(trash)
        _remove_stale_builds(name, say)
        shutil.rmtree(_staged_dir(name), ignore_errors=True)
    say(f"[image] {name}: removed")


# -------------------------------------------------------------------------------- running things
def _set_pdeathsig() -> None:
    if _libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the parent died before the prctl
        os._exit(1)


# Runs in fresh pid + mount namespaces (unshare --kill-child): mounts and processes die with it.
_CHROOT_SETUP = r"""
root=$1 network=$2 cmd=$3
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
if [ "$network" = 1 ]; then
    [ -e "$root/etc/resolv.conf" ] || : >"$root/etc/resolv.conf"
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
    # Downloads trust what the host trusts (it may reach PyPI through a TLS-inspecting proxy);
    # the image keeps its own bundle: this bind ends with the namespace.
    bundle=/etc/ssl/certs/ca-certificates.crt
    if [ -f "$bundle" ] && [ -f "$root$bundle" ] && [ ! -L "$root$bundle" ]; then
        mount --bind "$bundle" "$root$bundle"
    fi
fi
exec chroot "$root" /bin/sh -ec "$cmd"
"""

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root", "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore", "PIP_NO_INPUT": "1"}


def _env() -> dict[str, str]:
    """A clean environment for build tools (nothing of the venv), keeping the host's proxies."""
    proxies = {k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    return {**_ENV, **proxies}


class _Builder:
    """One build of one spec in one build directory; its log is ``<build>/build.log``."""

    def __init__(self, spec: ImageSpec, build_dir: Path, progress: Progress) -> None:
        self.spec = spec
        self.dir = build_dir
        self.rootfs = build_dir / "rootfs"
        self.progress = progress
        self.log_path = build_dir / "build.log"

    def say(self, text: str) -> None:
        self.progress(f"[image] {self.spec.name}: {text}")

    def run(self, argv: list[str], what: str, *, stdin: bytes | None = None, capture: bool = False) -> str:
        """Run ``argv`` in its own pid and mount namespaces; output to the build log (or returned)."""
        full = ["unshare", "--pid", "--kill-child=SIGKILL", "--mount", "--propagation", "private", "--", *argv]
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n### {what}\n".encode())
            logf.flush()
            proc = subprocess.run(full, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE if capture else logf, stderr=logf, env=_env(),
                                  preexec_fn=_set_pdeathsig, check=False)
        if proc.returncode != 0:
            tail = self.log_path.read_text(errors="replace").splitlines()[-_TAIL:]
            raise Unavailable(f"building image {self.spec.name!r} failed at {what} (exit {proc.returncode}); "
                              f"log: {self.log_path}: {' | '.join(tail[-3:])}",
                              reason="IMAGE_BUILD_FAILED", detail=tail)
        return proc.stdout.decode() if capture else ""

    def chroot(self, script: str, what: str, *, network: bool = False, stdin: bytes | None = None,
               capture: bool = False, args: tuple[str, ...] = ()) -> str:
        if args:  # positional parameters for the script inside the chroot
            script = f"set -- {' '.join(_sh_quote(a) for a in args)}\n{script}"
        argv = ["sh", "-ec", _CHROOT_SETUP, "drums-chroot", str(self.rootfs), "1" if network else "0", script]
        return self.run(argv, what, stdin=stdin, capture=capture)


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------------------------- build steps
def _debootstrap(b: _Builder) -> None:
    if shutil.which("mmdebstrap", path=_ENV["PATH"]) is None:
        raise FailedPrecondition("mmdebstrap is not installed (apt-get install mmdebstrap, or run scripts/provision)",
                                 reason="MMDEBSTRAP_MISSING")
    packages = sorted(set(b.spec.packages) | set(CUSTOMISE_PACKAGES))
    b.say(f"mmdebstrap {SUITE} (packages: {len(packages)}) ...")
    b.run(["mmdebstrap", "--mode=root", "--variant=apt", "--format=directory",
           f"--include={','.join(packages)}",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
           "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/info/*",
           '--aptopt=Acquire::Retries "3"', SUITE, str(b.rootfs), *MIRROR_LINES], "mmdebstrap")


def _copy_base(b: _Builder) -> None:
    b.say(f"copying image {b.spec.base} ...")
    base = rootfs_path(b.spec.base)  # the caller holds the base's lock, shared
    b.run(["cp", "-a", "--reflink=auto", str(base), str(b.rootfs)], f"copy of image {b.spec.base}")
    b.say("unshifting ids ...")
    shift_ids(b.rootfs, -config.ID_BASE)


def _install_packages(b: _Builder) -> None:
    if not b.spec.packages:
        return
    b.say(f"apt-get install (packages: {len(b.spec.packages)}) ...")
    script = ("printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d\n"
              "apt-get update\n"
              'apt-get install -y --no-install-recommends "$@"\n'
              "rm -f /usr/sbin/policy-rc.d\n")
    b.chroot(script, "apt-get install", network=True, args=b.spec.packages)


def _customise_script() -> str:
    homes = " ".join(HOME_DIRS)
    pins = " ".join(GUEST_PIP)
    uid = config.SESSION_UID
    user = config.SESSION_USER
    return f"""
printf 'en_US.UTF-8 UTF-8\\nC.UTF-8 UTF-8\\n' >/etc/locale.gen
locale-gen
printf 'LANG=en_US.UTF-8\\n' >/etc/default/locale
getent group {user} >/dev/null || groupadd -g {uid} {user}
id -u {user} >/dev/null 2>&1 || useradd -u {uid} -g {uid} -m -d /home/{user} -s /bin/bash {user}
usermod -a -G sudo,audio,video {user}
echo '{user}:{config.SESSION_PASSWORD}' | chpasswd
printf '%s\\n' '{user} ALL=(ALL:ALL) ALL' 'Defaults:{user} !use_pty, !lecture' >/etc/sudoers.d/drums
chmod 0440 /etc/sudoers.d/drums
visudo -cf /etc/sudoers.d/drums
cd /home/{user} && mkdir -p {homes} && chown -R {uid}:{uid} /home/{user} && cd /
echo drums >/etc/hostname
printf '127.0.0.1\\tlocalhost\\n127.0.1.1\\tdrums\\n::1\\tlocalhost ip6-localhost ip6-loopback\\n' >/etc/hosts
mkdir -p /var/lib/dbus && ln -sf /etc/machine-id /var/lib/dbus/machine-id
mkdir -p {config.GUEST_CODE} /.oldroot
python3 -m venv --system-site-packages {config.GUEST_VENV}
{config.GUEST_VENV}/bin/pip install --no-deps {pins}
"""


def _customise(b: _Builder) -> None:
    b.say("customising (user, sudo, locales, guest venv) ...")
    b.chroot(_customise_script(), "customisation", network=True)


def _copy_files(b: _Builder) -> None:
    for f in b.spec.files:
        mode = f.mode if f.mode is not None else stat.S_IMODE(os.stat(f.src).st_mode)
        b.say(f"file {f.dest}")
        # Written from inside the chroot, so no path in the image can lead it out.
        script = 'mkdir -p "$(dirname "$1")"; cat >"$1"; chown 0:0 "$1"; chmod "$2" "$1"'
        b.chroot(script, f"file {f.dest}", stdin=Path(f.src).read_bytes(), args=(f.dest, f"{mode:o}"))


def _run_commands(b: _Builder) -> None:
    for i, cmd in enumerate(b.spec.commands, 1):
        b.say(f"command {i}/{len(b.spec.commands)}: {cmd[:60]}")
        b.chroot(cmd, f"command {i}: {cmd}", network=True)


_FINISH_SCRIPT = """
apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache /tmp/* /var/tmp/*
find /var/log -type f -delete
: >/etc/machine-id
printf '# sessions have no name service\\n' >/etc/resolv.conf
"""


# The only device nodes an image keeps in /dev: a session makes these six in its upper anyway.
SESSION_DEV_NODES = frozenset({"null", "zero", "full", "random", "urandom", "tty"})


def _strip_dev_nodes(rootfs: Path) -> int:
    """Remove the image's other device nodes (console, ptmx, ... from debootstrap): they would be
    the host's devices, and the overlay (index=on) could not even hide them in a session, since it
    copies a node up before removing it, which the session's devices cgroup denies.

    Done from the host on the image's own directory, after every chroot has ended: inside the
    chroot /dev is a bind of the host's /dev. Refuses anything but a plain directory on the
    image's filesystem, and never descends."""
    dev = rootfs / "dev"
    st = os.lstat(dev)
    mounted = procs.mounts_within(procs.read_mountinfo(), [os.path.realpath(dev)])
    if not stat.S_ISDIR(st.st_mode) or st.st_dev != os.lstat(rootfs).st_dev or mounted:
        raise Internal(f"{dev} is not a plain directory of the image; not touching it", reason="IMAGE_BUILD_FAILED")
    removed = 0
    with os.scandir(dev) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and entry.name not in SESSION_DEV_NODES:
                os.unlink(entry.path)
                removed += 1
    return removed


def _finish(b: _Builder) -> None:
    b.say("cleaning apt caches ...")
    b.chroot(_FINISH_SCRIPT, "cleanup")
    b.say(f"removed {_strip_dev_nodes(b.rootfs)} device node(s) from /dev")


def _verify(b: _Builder) -> dict[str, str]:
    """Check the guest environment imports; return its pip packages {name: version}."""
    modules = ["pyscreeze", "pymsgbox", "pytweening"] + [m for p, m in _MODULE_OF.items() if p in _all_packages(b)]
    # pyautogui itself needs a display to import; its files must be there.
    script = (f"env -u DISPLAY {config.GUEST_PYTHON} -c 'import importlib.util as u, {', '.join(modules)}; "
              "assert u.find_spec(\"pyautogui\")'\n"
              f"{config.GUEST_VENV}/bin/pip list --format=json --path $({config.GUEST_PYTHON} -c "
              "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')")
    out = b.chroot(script, "guest environment check", capture=True)
    return {p["name"]: p["version"] for p in json.loads(out)}


def _all_packages(b: _Builder) -> set[str]:
    names = set(b.spec.packages)
    base: str = b.spec.base
    while base != DEBIAN_BASE:  # a derived image has its bases' packages too
        spec = get(base).spec
        names |= set(spec.get("packages", []))
        base = spec.get("base", DEBIAN_BASE)
    return names


def _dpkg_packages(b: _Builder) -> dict[str, str]:
    out = b.chroot("dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'", "dpkg-query",
                   capture=True)
    rows = (line.split("\t") for line in out.splitlines() if line.strip())
    return {r[1]: r[2] for r in rows if len(r) == 3 and r[0].startswith("ii")}


# ------------------------------------------------------------------------------------- id shift
@dataclass
class ShiftReport:
    files: int = 0
    size_bytes: int = 0
    seconds: float = 0.0
    caps: list[dict[str, Any]] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
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
    for path, st in _walk(root):
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
                          reason="IMAGE_IDS_OUT_OF_RANGE", detail=report.out_of_range[:50])
    return report


# ------------------------------------------------------------------------------------------ build
def _human_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _make_rootfs(b: _Builder) -> None:
    if b.spec.derived:
        _copy_base(b)
        _install_packages(b)
    else:
        _debootstrap(b)
        _customise(b)
    _copy_files(b)
    _run_commands(b)
    _finish(b)


def _assemble(b: _Builder, digest: str, t0: float) -> Manifest:
    guest_pip = _verify(b)
    packages = _dpkg_packages(b)
    b.say("shifting ids ...")
    shift = shift_ids(b.rootfs, config.ID_BASE)
    b.say(f"shifted {shift.files} files in {shift.seconds:.1f}s")
    return Manifest(name=b.spec.name, spec=b.spec.to_json(), base=b.spec.base, id_base=config.ID_BASE,
                    packages=packages, size_bytes=shift.size_bytes, files_count=shift.files,
                    build_seconds=round(time.monotonic() - t0, 1),
                    built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    spec_hash=digest, content_hash=content_hash(digest, packages),
                    shift_seconds=round(shift.seconds, 2), guest_pip=guest_pip,
                    file_caps=[{**c, "path": "/" + os.path.relpath(c["path"], b.rootfs)} for c in shift.caps])


def _syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def _staged_dir(name: str) -> Path:
    return store() / f".staged-{name}"


def _swap_in(name: str, src: Path) -> None:
    """Make the complete image in ``src`` visible as ``name`` in one rename; delete the old one.

    FailedPrecondition (nothing changed) when a mount uses the current image: a session may have
    started on it while this build ran.
    """
    target = _image_dir(name)
    with _replacing(name, "replace"):
        if target.exists():
            _exchange(src, target)  # src now holds the old image
        else:
            os.rename(src, target)
    shutil.rmtree(src, ignore_errors=True)  # what is left is cleaned by the next build


def _commit(b: _Builder, m: Manifest) -> None:
    """Write the manifest last, flush to disk, then swap the image in (or keep it staged, if in use)."""
    tmp = b.dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(m.to_json(), indent=1, sort_keys=True) + "\n")
    os.rename(tmp, b.dir / "manifest.json")
    _syncfs(b.dir)  # the rootfs's data reaches the disk before the image becomes visible
    try:
        _swap_in(b.spec.name, b.dir)
    except FailedPrecondition as exc:
        staged = _staged_dir(b.spec.name)
        shutil.rmtree(staged, ignore_errors=True)
        os.rename(b.dir, staged)
        exc.message += (f"; the new build is kept: run the same `drums image build` again when no session uses "
                        f"{b.spec.name!r} and it is swapped in at once")
        raise


def _try_staged(spec: ImageSpec, say: Progress, force: bool) -> Manifest | None:
    """Swap in a complete build of this very spec that was kept because the image was in use."""
    staged = _staged_dir(spec.name)
    m = _read_manifest(staged / "manifest.json")
    if m is None or force or m.id_base != config.ID_BASE or m.spec_hash != spec_hash(spec):
        if staged.exists():
            shutil.rmtree(staged)
        return None
    say(f"[image] {spec.name}: swapping in the kept build (content {m.content_hash[:8]})")
    _swap_in(spec.name, staged)
    return m


def build(spec: ImageSpec, progress: Progress | None = None, force: bool = False) -> Manifest:
    """Build ``spec`` into the store (a no-op when its spec hash is unchanged, unless ``force``)."""
    say = progress or log.info
    spec.validate()
    if os.geteuid() != 0:
        raise FailedPrecondition("building an image needs root (mmdebstrap, chroot, chown)",
                                 reason="NOT_ROOT")
    if spec.derived:
        get(spec.base)  # NotFound (saying how to build it) before anything is created
    store().mkdir(parents=True, exist_ok=True)
    with _locked(spec.name, progress=say):
        _remove_stale_builds(spec.name, say)
        current = None if force else up_to_date(spec)
        if current is not None:
            say(f"[image] {spec.name}: unchanged (content {current.content_hash[:8]}); --force rebuilds")
            return current
        if _image_dir(spec.name).exists():
            _refuse_if_used(spec.name, "rebuild")
        return _try_staged(spec, say, force) or _build_locked(spec, say)


def _build_locked(spec: ImageSpec, say: Progress) -> Manifest:
    # A derived build holds its base's lock (shared) throughout: the base's content hash in the
    # spec hash is that of the tree it copies.
    with _locked(spec.base, shared=True, progress=say) if spec.derived else nullcontext():
        t0 = time.monotonic()
        digest = spec_hash(spec)
        b = _Builder(spec, _new_build_dir(spec.name), say)
        try:
            _make_rootfs(b)
            m = _assemble(b, digest, t0)
            _commit(b, m)
        except BaseException:
            shutil.rmtree(b.dir, ignore_errors=True)
            raise
    say(f"[image] {spec.name}: done in {m.build_seconds:.1f}s, {_human_size(m.size_bytes)}, "
        f"content {m.content_hash[:8]}")
    return m


# -------------------------------------------------------------------------------------------- CLI
def _row(m: Manifest) -> dict[str, str]:
    return {"name": m.name, "content": m.content_hash[:12], "size": _human_size(m.size_bytes),
            "packages": str(len(m.packages)), "base": m.base, "id_base": str(m.id_base),
            "built_at": m.built_at}


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no images; build the default one with `drums image build`)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _cmd_build(args: argparse.Namespace) -> tuple[Any, str]:
    if args.spec:
        spec = load_spec(args.spec)
        if args.name and args.name != spec.name:
            raise InvalidArgument(f"the spec file names image {spec.name!r}, not {args.name!r}",
                                  reason="INVALID_IMAGE_SPEC")
    else:
        spec = builtin_spec(args.name or config.DEFAULT_IMAGE)
    before = None if args.force else up_to_date(spec)
    m = build(spec, progress=lambda line: print(line, file=sys.stderr, flush=True), force=args.force)
    built = before is None or before.built_at != m.built_at
    human = (f"{m.name}: built in {m.build_seconds:.1f}s, {_human_size(m.size_bytes)}, content {m.content_hash[:8]}"
             if built else f"{m.name}: unchanged, content {m.content_hash[:8]}, {_human_size(m.size_bytes)}")
    return {"built": built, "image": m.to_json()}, human


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``drums image`` (usage errors: one line, exit status 2)."""
    from ..cli import UsageParser

    parser = UsageParser(prog="drums image", description="desktop images built from Debian packages")
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print a JSON document")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    b = sub.add_parser("build", parents=[common], help="build an image (the default one unless NAME/--spec)")
    b.add_argument("name", nargs="?", help="the image to build (default: default; osworld: OSWorld's applications)")
    b.add_argument("--spec", metavar="FILE", help="a JSON image spec file")
    b.add_argument("--force", action="store_true", help="rebuild even when the spec is unchanged")
    sub.add_parser("ls", parents=[common], help="list built images")
    r = sub.add_parser("rm", parents=[common], help="remove an image no session uses")
    r.add_argument("name", help="the image to remove")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``drums image build|ls|rm`` (also ``python -m drums_core.host.images``)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "build":
            data, human = _cmd_build(args)
        elif args.cmd == "ls":
            images = list_images()
            data, human = [m.to_json() for m in images], _table([_row(m) for m in images])
        else:
            remove(args.name, progress=lambda line: print(line, file=sys.stderr, flush=True))
            data, human = {"removed": args.name}, f"removed image {args.name}"
    except DrumsError as exc:
        from ..cli import report_error

        return report_error(exc, args.json, "drums image")
    print(json.dumps(data, indent=1) if args.json else human)
    return 0


if __name__ == "__main__":
    sys.exit(main())
