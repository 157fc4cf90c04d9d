"""A Drums session seen as an OSWorld desktop: the session plus its guest server.

This is the one place that knows what an OSWorld-compatible desktop image is made of (the guest
server on port 5000 as a session program, its reseed hook, readiness on that port), so the
provider, the snapshot bridge, the gymnasium env, the rollout runner and the benchmarks all boot,
restore and branch desktops the same way.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from drums_core.client import Client
from drums_core.records import Session, Snapshot
from drums_core.config import GUEST_PYTHON
from drums_core.errors import InvalidArgument
from drums_core.reasons import Reason

from . import image as osworld_image
from .guest.client import GuestClient
from .image import gnome

log = logging.getLogger("drums.osworld.desktop")

GUEST_PORT = 5000
# The desktop OSWorld's tasks expect (its applications, accessibility, sound, timedatectl): what
# the provider, the gym env and `drums up` boot unless told otherwise. The engine's `default`
# image (no Chromium, GIMP, VLC, ...) stays for bare sessions.
OSWORLD_IMAGE = osworld_image.NAME
DEFAULT_IMAGE = OSWORLD_IMAGE
# What a desktop of an image adds to its session spec (services, environment), by image name.
_IMAGE_DESKTOPS = {osworld_image.NAME: osworld_image.desktop_extras}
# The desktops a session can show: openbox (the engine's window manager, on a black screen) or GNOME
# Shell as OSWorld's Ubuntu has it (drums_osworld.image.gnome: an image with its packages, e.g.
# `osworld` once rebuilt with them). openbox stays the default until every OSWorld test passes on GNOME.
DESKTOPS = ("openbox", "gnome")
DEFAULT_DESKTOP = "openbox"


def _image_extras(image: str) -> dict:
    """What a desktop of ``image`` adds to its session spec: its own, or its nearest base image's (an
    image built from ``osworld``, e.g. to try additions, is an osworld desktop); ``{}`` for others."""
    from drums_core.errors import DrumsError
    from drums_core.host import image_store

    name = image
    for _ in range(8):  # a chain of bases is short; a loop in manifests must not hang the caller
        if name in _IMAGE_DESKTOPS:
            return _IMAGE_DESKTOPS[name]()
        try:
            base = image_store.get(name).base
        except (DrumsError, OSError, ValueError):  # not built here, or not readable by this user
            return {}
        if not base or base == name:
            return {}
        name = base
    return {}


def desktop_spec(screen: tuple[int, int] = (1920, 1080), image: str = DEFAULT_IMAGE,
                 expect_window: str | None = None, extra_programs: list[dict] | None = None,
                 desktop: str = DEFAULT_DESKTOP) -> dict:
    """The session spec of an OSWorld desktop: Xvfb + the ``desktop`` (openbox, or GNOME Shell
    started by gnome-session after the buses) + D-Bus + the guest server. Any image of the
    ``osworld`` family (``osworld``, or one made from it) gets the osworld image's services."""
    if desktop not in DESKTOPS:
        raise InvalidArgument(f"unknown desktop {desktop!r}: one of {', '.join(DESKTOPS)}", reason=Reason.BAD_DESKTOP)
    extras = _image_extras(image)
    programs = list(extras.pop("programs", []))
    programs += [{"name": "guest", "argv": [GUEST_PYTHON, "-m", "drums_osworld.guest",
                                             "--port", str(GUEST_PORT)]}]
    programs += list(extra_programs or [])
    if desktop == "gnome":
        extras["desktop"] = gnome.session_desktop()
    return {"image": image, "screen": [int(screen[0]), int(screen[1])], "programs": programs,
            "wait_port": GUEST_PORT, "reseed_path": "/drums/reseed", "expect_window": expect_window,
            "ready_timeout": 120.0, **extras}


def cli_desktop(screen: tuple[int, int], image: str | None, programs: list[dict],
                desktop: str | None = None) -> tuple[dict, int]:
    """What ``drums up`` boots without ``--bare`` (registered by :func:`drums_osworld.register_cli`):
    (an OSWorld desktop's session spec on ``image``, default :data:`OSWORLD_IMAGE`, showing ``desktop``
    (:data:`DESKTOPS`, default :data:`DEFAULT_DESKTOP`), with ``programs`` added; the guest server's port)."""
    return desktop_spec(screen, image or OSWORLD_IMAGE, extra_programs=programs,
                        desktop=desktop or DEFAULT_DESKTOP), GUEST_PORT


@dataclass
class Desktop:
    """One live desktop: ``session`` is the daemon's record of it, ``guest`` talks to its server."""

    client: Client
    session: Session
    guest: GuestClient = field(init=False)
    closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.guest = GuestClient(self.session["address"], GUEST_PORT, timeout=180.0)

    @property
    def id(self) -> str:
        """The session id."""
        return self.session["id"]

    @property
    def address(self) -> str:
        """The guest's address (reachable from the host only)."""
        return self.session["address"]

    @property
    def screen(self) -> tuple[int, int]:
        """The screen size, ``(width, height)``."""
        w, h = self.session["spec"]["screen"]
        return int(w), int(h)

    @classmethod
    def boot(cls, client: Client | None = None, screen: tuple[int, int] = (1920, 1080),
             image: str = DEFAULT_IMAGE, desktop: str = DEFAULT_DESKTOP) -> "Desktop":
        """Boot a cold desktop of ``image`` showing ``desktop`` (:data:`DESKTOPS`; the daemon's errors
        as :meth:`drums_core.Client.create` raises them)."""
        client = client or Client()
        return cls(client, client.create(desktop_spec(screen, image, desktop=desktop)))

    @classmethod
    def restore(cls, client: Client, snapshot: str, count: int = 1, expect_window: str | None = None,
                wait_live: bool = False, scope: str | None = None) -> list["Desktop"]:
        """``count`` sibling desktops of ``snapshot`` (arguments and errors: :meth:`drums_core.Client.restore`)."""
        sessions = client.restore(snapshot, count=count, expect_window=expect_window, wait_live=wait_live,
                                  scope=scope)
        return [cls(client, s) for s in sessions]

    def checkpoint(self, name: str | None = None, leave_running: bool = True, scope: str | None = None,
                   snapshot_id: str | None = None) -> Snapshot:
        """Checkpoint this desktop. With ``leave_running`` it goes on (same id and address) afterwards."""
        snap = self.client.checkpoint(self.id, name=name, leave_running=leave_running, scope=scope,
                                      snapshot_id=snapshot_id)
        if leave_running:
            self.refresh()
        else:
            self.closed = True
        return snap

    def refresh(self) -> Session:
        """Fetch the session's record again (``NotFound`` when it is gone)."""
        self.session = self.client.get(self.id)
        return self.session

    def reseed_draw(self) -> int:
        """A number from the guest server's RNG (siblings of one snapshot draw different ones)."""
        return int(self.guest._request("POST", "/drums/reseed").json()["draw"])

    def close(self) -> None:
        """Destroy the desktop (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.guest.close()
        finally:
            self.client.destroy(self.id)

    def __enter__(self) -> "Desktop":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
