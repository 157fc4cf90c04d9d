"""``DrumsProvider`` and ``DrumsVMManager``: OSWorld's provider interface as ``DesktopEnv`` calls it.

``DesktopEnv`` (desktop-env 1.0.2) calls, and nothing else:

    start_emulator(path_to_vm, headless, os_type)   restore a desktop (init_state, or what a revert named)
    get_ip_address(path_to_vm)                      "<session address>:5000:9222:8006:8080"
    save_state(path_to_vm, name)                    checkpoint, leaving the desktop running (same address)
    revert_to_snapshot(path_to_vm, name)            destroy the desktop; the next start restores ``name``
    stop_emulator(path_to_vm)                       destroy the desktop (idempotent)
    manager.get_vm_path(os_type=, region=, screen_size=)   "drums://default"

Every desktop a provider hands out is a restore of a snapshot: the first start on a host boots the
image cold once and checkpoints it as ``init_state`` (:func:`.images.ensure_init_state`).

The provider also knows whether its desktop is *pristine*: an untouched restore of a known
snapshot. Only then may a reset skip its revert (see :mod:`drums_osworld.snapshot.reuse`, which
OSWorld's ``DesktopEnv.reset`` goes through once :func:`.registration.register` ran). Anything that
can change the desktop clears it: a reset handing the desktop to a rollout, and every mutating call
through the env's controllers (:meth:`DrumsProvider.track_controllers`).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from drums_core.client import Client
from drums_core.errors import DrumsError, InvalidArgument, NotFound, Unavailable
from drums_core.reasons import Reason

from ..desktop import GUEST_PORT, Desktop
from ..setup_journal import SetupReport, strict_default
from . import leases, setup_watch
from .images import (DEFAULT_PATH, INIT_STATE, PORTS, ImageRef, connect, default_screen, ensure_init_state,
                     evicted_name, find_in_image, find_snapshot, log_store_actions, network_key, parse_path)

try:  # the ABCs are stdlib-only in desktop-env; Drums works without OSWorld installed too
    from desktop_env.providers.base import Provider as _ProviderBase
    from desktop_env.providers.base import VMManager as _VMManagerBase
except ImportError:  # pragma: no cover - OSWorld absent
    _ProviderBase = object
    _VMManagerBase = object

log = logging.getLogger("drums.osworld.provider")

LINUX_OS_TYPES = {"ubuntu", "linux", "debian"}
RESTORE_ATTEMPTS = 3

#: Controller methods that can change the desktop (everything else only looks at it).
MUTATING_PYTHON_CONTROLLER = ("execute_python_command", "execute_action", "run_python_script", "run_bash_script",
                              "start_recording", "end_recording")

_reaped_in: set[int] = set()
_SNAPSHOT_ID = re.compile(r"^[0-9a-f]{32}$")


def _check_os(os_type: Any) -> None:
    if os_type is not None and str(os_type).lower() not in LINUX_OS_TYPES:
        raise InvalidArgument(f"Drums desktops are Linux (Ubuntu-compatible); os_type {os_type!r} is not available",
                              reason=Reason.BAD_OS_TYPE)


class DrumsVMManager(_VMManagerBase):
    """Drums has no VM registry: a path names an image, and any number of desktops run from it."""

    checked_and_cleaned = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def initialize_registry(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: Drums keeps no VM registry."""
        pass

    def add_vm(self, vm_path: str, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: any number of desktops run from one image path."""
        pass

    def delete_vm(self, vm_path: str, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: desktops are deleted by their provider."""
        pass

    def occupy_vm(self, vm_path: str, pid: int, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: an image path is never occupied."""
        pass

    def list_free_vms(self, *args: Any, **kwargs: Any) -> list[str]:
        """The one path OSWorld should use: the default ``drums://`` image path."""
        return [DEFAULT_PATH]

    def check_and_clean(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: orphaned desktops are reclaimed by the leases' watchdog."""
        pass

    def get_vm_path(self, os_type: str = "Ubuntu", region: str | None = None,
                    screen_size: tuple[int, int] = (1920, 1080), *args: Any, **kwargs: Any) -> str:
        """The default ``drums://`` image path (``InvalidArgument`` ``BAD_OS_TYPE`` for a non-Linux ``os_type``)."""
        _check_os(os_type)
        return DEFAULT_PATH


class DrumsProvider(_ProviderBase):
    """One ``DesktopEnv``'s desktops, one at a time (plus the private snapshots it saved)."""

    def __init__(self, region: str | None = None, screen_size: tuple[int, int] | None = None,
                 client: Client | None = None, reuse_mode: str | None = None, adopt: Desktop | None = None,
                 share_snapshot: str | None = None, strict_setup: bool | None = None,
                 network: dict | str | None = None) -> None:
        self.region = region
        # the desktops' network policy: this option, else $DRUMS_NETWORK, else none (no route out)
        self.network = network_key(network)
        self._client = client
        self.screen = (int(screen_size[0]), int(screen_size[1])) if screen_size else default_screen()
        self.owner = uuid.uuid4().hex[:12]
        self.desktop: Desktop | None = None
        self.path_to_vm: str | None = None
        self.reuse_mode = reuse_mode or os.environ.get("DRUMS_OSWORLD_REUSE", "none")
        self._next: str | None = None          # snapshot id the next start restores
        self._session_from: str | None = None  # snapshot id the current desktop was restored from
        self._pristine = False                 # ... and nothing has touched it since
        self._adopt = adopt                    # a desktop restored for us (a branch sibling)
        self._owned: list[str] = []            # private snapshot ids, deleted when the last holder closes
        self._starting = False                 # inside DesktopEnv._start_emulator
        self.timings: dict[str, float] = {}
        # Failed setup is not a score (setup_watch, snapshot.reuse): the report of each setup() and
        # of the last reset; strict (option or DRUMS_STRICT_SETUP=1) makes a failed setup raise.
        self.strict_setup = strict_default() if strict_setup is None else bool(strict_setup)
        self.setup_reports: list[tuple[str, SetupReport]] = []
        self.setup_report: SetupReport | None = None
        self.setup_phase: str | None = None
        if adopt is not None:
            leases.hold(self.client, "session", adopt.id, self.owner)
        if share_snapshot is not None:
            self._own(share_snapshot)

    # ------------------------------------------------------------------ plumbing
    @property
    def client(self) -> Client:
        """The :class:`drums_core.Client` this provider's desktops come from (connected on first use)."""
        if self._client is None:
            self._client = connect()
        return self._client

    def image_ref(self, path_to_vm: str | None = None) -> ImageRef:
        """The image, screen and network of the desktops of ``path_to_vm`` (default: this provider's)."""
        return ImageRef(parse_path(path_to_vm if path_to_vm is not None else self.path_to_vm), self.screen,
                        self.network)

    def _own(self, snapshot_id: str) -> None:
        if snapshot_id not in self._owned:
            self._owned.append(snapshot_id)
            leases.hold(self.client, "snapshot", snapshot_id, self.owner)

    def _reap_once(self) -> None:
        if os.getpid() in _reaped_in:
            return
        _reaped_in.add(os.getpid())
        try:
            report = leases.reap_orphans(self.client)
            if any(report.values()):
                log.info("reclaimed what dead OSWorld processes left: %s", report)
        except DrumsError as exc:  # never let housekeeping stop a start
            log.warning("reclaiming orphaned sessions failed: %s", exc)

    def _restore(self, snapshot_id: str) -> Desktop:
        last: Unavailable | None = None
        for attempt in range(RESTORE_ATTEMPTS):
            try:
                return Desktop.restore(self.client, snapshot_id, count=1)[0]
            except Unavailable as exc:  # rolled back: safe to retry
                last = exc
                log.warning("restore of %s failed (attempt %d/%d): %s", snapshot_id, attempt + 1,
                            RESTORE_ATTEMPTS, exc)
                time.sleep(0.2 * (attempt + 1))
        assert last is not None
        raise last

    def resolve(self, snapshot_name: str | None, path_to_vm: str | None = None, fallback: bool = True) -> str:
        """The id of the snapshot ``snapshot_name`` means for this env: its own saved states first, then
        the image's (``init_state``, ``post_setup:<task>``), then a snapshot id; ``init_state`` is made
        when missing. A name nothing was saved under means ``init_state`` (with a warning) unless
        ``fallback`` is False (then NotFound)."""
        ref = self.image_ref(path_to_vm)
        name = snapshot_name or INIT_STATE
        snap = find_snapshot(self.client, name, ref.private_scope(self.owner))
        if snap is None:
            if name == INIT_STATE:
                snap = ensure_init_state(self.client, ref)
            else:
                snap = find_in_image(self.client, ref, name)
        if snap is None and _SNAPSHOT_ID.match(name):
            try:  # a snapshot id (as a branch or the snapshot bridge passes them)
                snap = self.client.snapshot(name)
            except (NotFound, InvalidArgument):
                snap = None
        if snap is None:
            if not fallback:
                raise NotFound(f"no snapshot {name!r} for {ref.path} at {ref.screen[0]}x{ref.screen[1]}",
                               reason=Reason.SNAPSHOT_NOT_FOUND)
            log.warning("no state %r was saved for %s: using %s", name, ref.path, INIT_STATE)
            snap = ensure_init_state(self.client, ref)
        return snap["id"]

    # ------------------------------------------------------------------ pristine tracking
    @property
    def session_snapshot(self) -> str | None:
        """The snapshot the current desktop was restored from (None for a cold boot)."""
        return self._session_from

    def is_pristine_from(self, snapshot_id: str) -> bool:
        """True while the desktop is an untouched restore of ``snapshot_id`` (and the daemon has not
        found it broken since: a restore's liveness is verified a few seconds after it returns)."""
        if self.desktop is None or not self._pristine or self._session_from != snapshot_id:
            return False
        try:
            state = self.desktop.refresh().get("state")
        except NotFound:
            state = None
        if state != "RUNNING":
            log.warning("desktop %s is %s: it will be replaced", self.desktop.id, state or "gone")
            self._pristine = False
        return self._pristine

    def mark_used(self) -> None:
        """Note that the current desktop was acted on: a later reset reverts it instead of reusing it."""
        self._pristine = False

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Marks DesktopEnv._start_emulator (see :meth:`stop_emulator`)."""
        self._starting = True
        try:
            yield
        finally:
            self._starting = False

    def track_controllers(self, controller: Any, setup_controller: Any) -> None:
        """Make every mutating call through these controllers mark the desktop used."""
        def marking(fn):
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any):
                self._pristine = False
                return fn(*args, **kwargs)
            wrapper.__drums_marking__ = True
            return wrapper

        for name in MUTATING_PYTHON_CONTROLLER:
            fn = getattr(controller, name, None)
            if fn is not None and not getattr(fn, "__drums_marking__", False):
                setattr(controller, name, marking(fn))
        for name in dir(type(setup_controller)):
            if name == "setup" or (name.startswith("_") and name.endswith("_setup") and not name.startswith("__")):
                fn = getattr(setup_controller, name, None)
                if callable(fn) and not getattr(fn, "__drums_marking__", False):
                    setattr(setup_controller, name, marking(fn))
        setup_watch.wrap(self, setup_controller)

    # ------------------------------------------------------------------ OSWorld's interface
    def start_emulator(self, path_to_vm: str | None, headless: bool = True, os_type: str = "Ubuntu",
                       *args: Any, **kwargs: Any) -> None:
        """Make this env's desktop exist: a restore of ``init_state`` or of what a revert named."""
        _check_os(os_type)
        ref = self.image_ref(path_to_vm)
        if self.desktop is not None and not self.desktop.closed:
            if ref.path == self.image_ref().path:
                return
            self._stop_desktop()
        self.path_to_vm = ref.path
        t0 = time.monotonic()
        if self._adopt is not None:
            desktop, self._adopt = self._adopt, None
            self.desktop, self._session_from, self._pristine = desktop, None, False
            return
        self._reap_once()
        snapshot_id = self._next or ensure_init_state(self.client, ref)["id"]
        self._next = None
        try:
            desktop = self._restore(snapshot_id)
        except NotFound as exc:
            if evicted_name(exc) != INIT_STATE:
                raise
            # the store evicted the image's init_state (a cache state) since it was looked up: make it again
            log.warning("init_state %s was evicted from the snapshot store; making it again", snapshot_id)
            snapshot_id = ensure_init_state(self.client, ref)["id"]
            desktop = self._restore(snapshot_id)
        try:
            leases.hold(self.client, "session", desktop.id, self.owner)
        except BaseException:
            desktop.close()
            raise
        self.desktop, self._session_from, self._pristine = desktop, snapshot_id, True
        self.timings["start"] = time.monotonic() - t0
        log.info("desktop %s at %s from snapshot %s in %.3fs", desktop.id, desktop.address, snapshot_id,
                 self.timings["start"])

    def get_ip_address(self, path_to_vm: str | None = None, *args: Any, **kwargs: Any) -> str:
        """``ip:server_port:chromium_port:vnc_port:vlc_port`` of the running desktop, as OSWorld parses it
        (``Unavailable`` ``NOT_STARTED`` when none runs)."""
        if self.desktop is None or self.desktop.closed:
            raise Unavailable("the Drums desktop is not running (start_emulator first)", reason=Reason.NOT_STARTED)
        return (f"{self.desktop.address}:{GUEST_PORT}:{PORTS['chromium']}:{PORTS['vnc']}:{PORTS['vlc']}")

    def save_state(self, path_to_vm: str | None = None, snapshot_name: str | None = None,
                   *args: Any, **kwargs: Any) -> dict:
        """Checkpoint the desktop under ``snapshot_name`` (private to this env); it keeps running."""
        return self.checkpoint(snapshot_name or f"state-{uuid.uuid4().hex[:8]}", private=True)

    def checkpoint(self, name: str, scope: str | None = None, private: bool = True, cache: bool = False) -> dict:
        """Checkpoint the running desktop, leaving it running with the same id and address.

        ``private`` snapshots go to this env's scope and are deleted when the env (and every branch
        sibling made from them) has closed; otherwise ``scope`` names a shared scope, kept until
        deleted explicitly, or evicted by the store when ``cache`` (a state that can be made again).
        Unavailable ``STORE_FULL`` when the store has no room and nothing can be evicted or spilled.
        """
        if self.desktop is None or self.desktop.closed:
            raise Unavailable("the Drums desktop is not running; nothing to save", reason=Reason.NOT_STARTED)
        if private:
            scope = self.image_ref().private_scope(self.owner)
        t0 = time.monotonic()
        snap = self.client.checkpoint(self.desktop.id, name=name, scope=scope, leave_running=True,
                                      cache=cache and not private)
        self.desktop.refresh()
        self.timings["checkpoint"] = time.monotonic() - t0
        log_store_actions(snap, name)
        if private:
            self._own(snap["id"])
        return snap

    def revert_to_snapshot(self, path_to_vm: str | None, snapshot_name: str | None,
                           *args: Any, **kwargs: Any) -> None:
        """Destroy the desktop; the next ``start_emulator`` restores ``snapshot_name`` (``init_state``
        when nothing was saved under that name)."""
        snapshot_id = self.resolve(snapshot_name, path_to_vm)
        self.revert_to_id(snapshot_id)
        return None

    def revert_to_id(self, snapshot_id: str) -> None:
        """Destroy the current desktop; the next start restores snapshot ``snapshot_id``."""
        t0 = time.monotonic()
        self._stop_desktop()
        self._next = snapshot_id
        self.timings["destroy"] = time.monotonic() - t0

    def stop_emulator(self, path_to_vm: str | None = None, *args: Any, **kwargs: Any) -> None:
        """Destroy the desktop and release this env's private snapshots. Safe to call again.

        DesktopEnv also calls this when a start fails; then only the desktop goes (the env's saved
        states stay, so a later reset can still revert to them)."""
        self._stop_desktop()
        if self._starting:
            return
        if self._adopt is not None:
            adopt, self._adopt = self._adopt, None
            self._destroy(adopt)
        self._next = None
        self._release_snapshots()
        journal, self._journal = getattr(self, "_journal", None), None
        if journal is not None:
            journal.close()
        if self._client is not None:
            leases.stop_watchdog_if_idle(self._client)

    close = stop_emulator

    # ------------------------------------------------------------------ teardown
    def _destroy(self, desktop: Desktop) -> None:
        try:
            desktop.close()
        except NotFound:
            pass  # already gone (reclaimed, or the daemon restarted without it)
        leases.release(self.client, "session", desktop.id, self.owner)

    def _stop_desktop(self) -> None:
        desktop, self.desktop = self.desktop, None
        self._pristine = False
        self._session_from = None
        if desktop is not None:
            self._destroy(desktop)

    def _release_snapshots(self) -> None:
        """Let go of this env's private snapshots; the last holder deletes each (a branch sibling
        holds the state it was restored from). Holders decide, not whether a session stands on the
        snapshot: a leave-running checkpoint leaves its own desktop standing on its older layers."""
        for sid in reversed(list(self._owned)):
            leases.release(self.client, "snapshot", sid, self.owner)
            if not leases.other_holders(self.client, "snapshot", sid, self.owner):
                try:
                    self.client.delete_snapshot(sid)
                except NotFound:
                    pass
                except DrumsError as exc:  # still stood on (a child snapshot, a session): reaped later
                    leases.hold(self.client, "snapshot", sid, self.owner)
                    log.warning("private snapshot %s stays leased: %s", sid, exc)
            self._owned.remove(sid)

    def __repr__(self) -> str:
        d = self.desktop
        return f"<DrumsProvider {self.owner} desktop={d.id if d else None} screen={self.screen[0]}x{self.screen[1]}>"
