"""Image specs: what a desktop image is made of (:class:`ImageSpec`: a Debian base or another image,
packages, files, commands), read from JSON and validated (InvalidArgument, ``INVALID_IMAGE_SPEC``);
the built-in ``default`` spec and the specs layers above the engine register (``drums.image_specs``)."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..errors import InvalidArgument
from ..reasons import Reason

DEBIAN_BASE = "debian:bookworm"
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
SPEC_FIELDS = {"name", "base", "packages", "files", "commands"}
FILE_FIELDS = {"src", "dest", "mode"}
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?$")


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
    return InvalidArgument(message, reason=Reason.INVALID_IMAGE_SPEC)


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
                          reason=Reason.INVALID_IMAGE_SPEC)
