"""``drums://<image>`` paths, snapshot scopes, and the shared ``init_state`` of each image.

A *path* names a desktop image (the base root plus its programs) as OSWorld's ``path_to_vm``:
``drums://default`` (also accepted: ``drums:default`` and a bare ``default``). Together with the
screen size it names one kind of fresh desktop, an :class:`ImageRef`, whose snapshots live in
scopes derived from it:

    osworld:<image>:<w>x<h>:<spec hash>               init_state (shared by every worker on the host)
    osworld:<image>:<w>x<h>:<spec hash>:setup:<hash>  post_setup:<task id> (shared; keyed by the setup)
    osworld:<image>:<w>x<h>:<spec hash>:env:<id>      states one DesktopEnv saved (private to it)

The spec hash covers the session spec (programs, readiness, screen), so a changed guest never
restores an ``init_state`` made by another version. :func:`ensure_init_state` boots the image
cold once per host and checkpoints it; concurrent first uses on one host serialise on a lock file
and find the snapshot by name, so exactly one cold boot happens.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from drums_core.client import Client
from drums_core.config import VENV, check_name
from drums_core.errors import DrumsError, InvalidArgument, NotFound, Unavailable
from drums_core.reasons import Reason

from ..desktop import DEFAULT_IMAGE, Desktop, desktop_spec

log = logging.getLogger("drums.osworld.provider")

SCHEME = "drums://"
DEFAULT_PATH = SCHEME + DEFAULT_IMAGE
INIT_STATE = "init_state"
PORTS = {"server": 5000, "chromium": 9222, "vnc": 8006, "vlc": 8080}


def parse_path(path_to_vm: str | None) -> str:
    """The image named by an OSWorld ``path_to_vm`` (``drums://<image>``); InvalidArgument otherwise."""
    if path_to_vm is None or path_to_vm == "":
        return DEFAULT_IMAGE
    if not isinstance(path_to_vm, str):
        raise InvalidArgument(f"path_to_vm must be a string like {DEFAULT_PATH!r}, got {path_to_vm!r}",
                              reason=Reason.BAD_PATH)
    raw = path_to_vm
    for prefix in (SCHEME, "drums:"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
            break
    else:
        if "/" in raw or raw.endswith((".vmx", ".qcow2", ".vbox")):
            raise InvalidArgument(f"path_to_vm {path_to_vm!r} is not a Drums image; use {DEFAULT_PATH!r} "
                                  "or drums://<image>", reason=Reason.BAD_PATH)
    raw = raw.rstrip("/") or DEFAULT_IMAGE
    return check_name(raw, "image")


def image_path(image: str) -> str:
    return SCHEME + image


@dataclass(frozen=True)
class ImageRef:
    """One kind of fresh desktop: an image at a screen size, with a network policy (the canonical
    JSON of a ``nat`` policy, see :mod:`drums_core.session.netpolicy`; empty for ``none``). A ``nat``
    desktop's spec, and so its scopes and ``init_state``, differ from the ``none`` one's."""

    image: str = DEFAULT_IMAGE
    screen: tuple[int, int] = (1920, 1080)
    network: str = ""

    @property
    def path(self) -> str:
        return image_path(self.image)

    def spec(self) -> dict:
        spec = desktop_spec(self.screen, self.image)
        if self.network:
            spec["network"] = json.loads(self.network)
        return spec

    @property
    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()[:10]

    @property
    def scope(self) -> str:
        w, h = self.screen
        return f"osworld:{self.image}:{w}x{h}:{self.spec_hash}"

    def setup_scope(self, setup_config: list) -> str:
        digest = hashlib.sha256(json.dumps(setup_config, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return f"{self.scope}:setup:{digest}"

    def private_scope(self, owner: str) -> str:
        return f"{self.scope}:env:{owner}"


def network_key(network: object = None) -> str:
    """The ``network`` of an :class:`ImageRef` for a policy given as a provider option (a dict or the
    text form), or else ``$DRUMS_NETWORK`` (``none``, ``nat:<upstream>[:<dns>,...]`` or a JSON object).
    InvalidArgument ``BAD_NETWORK`` for a bad one."""
    from drums_core.session.netpolicy import NetworkPolicy

    if network is None:
        network = os.environ.get("DRUMS_NETWORK") or None
    policy = NetworkPolicy.from_spec(network)
    return json.dumps(policy.to_spec(), sort_keys=True) if policy.nat else ""


def default_screen() -> tuple[int, int]:
    return int(os.environ.get("SCREEN_WIDTH", 1920)), int(os.environ.get("SCREEN_HEIGHT", 1080))


# ------------------------------------------------------------------------------------ client
def _drums_python() -> Path:
    return VENV / "bin" / "python"


def can_run_daemon() -> bool:
    """Whether this interpreter has what drumsd imports (it is Drums' own venv, or one like it)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("pyroute2", "Xlib", "numpy"))


def connect(client: Client | None = None) -> Client:
    """A client of this host's drumsd, started first when none runs.

    OSWorld often runs in an interpreter of its own, which cannot run the daemon (it needs Drums'
    venv: pyroute2, pycriu). The daemon is then started through Drums' own interpreter, by the
    ordinary client auto-start, and this process's client never auto-starts one itself.
    """
    if client is not None:
        return client
    ours = can_run_daemon()
    probe = Client(autostart=False)
    try:
        probe.ping()
    except Unavailable as exc:
        if exc.reason != Reason.DAEMON_DOWN:
            raise
        if ours:
            Client().ping()
        else:
            pkg_parent = str(Path(__file__).resolve().parents[2])
            env = dict(os.environ)
            env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            out = subprocess.run([str(_drums_python()), "-c", "from drums_core.client import Client; Client().ping()"],
                                 env=env, capture_output=True, text=True, timeout=120, cwd="/")
            if out.returncode != 0:
                raise Unavailable(f"could not start drumsd with {_drums_python()}: {out.stderr.strip()[-1500:]}",
                                  reason=Reason.DAEMON_START_FAILED) from exc
    return Client(probe.instance, autostart=ours)


def osworld_dir(client: Client) -> Path:
    """Where this layer keeps its lock and lease files: inside the instance's state directory."""
    d = client.instance.state_dir / "osworld"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


# ------------------------------------------------------------------------------------ snapshots
def find_snapshot(client: Client, name: str, scope: str | None) -> dict | None:
    """The newest committed snapshot called ``name`` in ``scope``, or None."""
    try:
        return client.snapshot(name, scope=scope)
    except NotFound:
        return None


def find_in_image(client: Client, ref: ImageRef, name: str) -> dict | None:
    """The newest committed snapshot called ``name`` in any scope of ``ref`` (private ones excluded)."""
    best = None
    for s in client.snapshots():
        scope = s.get("scope") or ""
        if s.get("name") != name or s.get("state") != "committed":
            continue
        if not (scope == ref.scope or scope.startswith(ref.scope + ":setup:")):
            continue
        if best is None or s["created"] > best["created"]:
            best = s
    return best


def evicted_name(exc: NotFound) -> str | None:
    """The name of the snapshot a NotFound says the store evicted (None: it says something else)."""
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    evicted = detail.get("evicted")
    return evicted.get("name") if isinstance(evicted, dict) else None


def log_store_actions(snap: dict, name: str) -> None:
    """Log what the store evicted or spilled to make room for ``snap`` (the daemon's answer says)."""
    for a in (snap.get("store") or {}).get("actions") or []:
        log.info("saving %s: the snapshot store %s %s (%s, %s, %.0f MiB) to make room", name, a.get("action"),
                 a.get("name") or a.get("id"), a.get("id"), a.get("retention"), (a.get("size") or 0) / 2**20)


def ensure_init_state(client: Client, ref: ImageRef) -> dict:
    """The image's ``init_state``, booting the image cold and checkpointing it on first use."""
    snap = find_snapshot(client, INIT_STATE, ref.scope)
    if snap is not None:
        return snap
    digest = hashlib.sha256(ref.scope.encode()).hexdigest()[:16]
    with file_lock(osworld_dir(client) / "locks" / f"init-{digest}.lock"):
        snap = find_snapshot(client, INIT_STATE, ref.scope)  # another worker may have made it meanwhile
        if snap is not None:
            return snap
        t0 = time.monotonic()
        desktop = Desktop(client, client.create(ref.spec()))
        try:
            # a cache state: the store may evict it when nothing uses it (it is made again here)
            snap = client.checkpoint(desktop.id, name=INIT_STATE, scope=ref.scope, leave_running=False, cache=True)
            desktop.closed = True
            log_store_actions(snap, INIT_STATE)
        except DrumsError:
            try:
                client.destroy(desktop.id)
            except NotFound:
                pass
            raise
        log.info("init_state of %s %dx%d: cold boot + checkpoint in %.2fs (snapshot %s)", ref.image,
                 ref.screen[0], ref.screen[1], time.monotonic() - t0, snap["id"])
        return snap
