"""The host's view of a session's X server: windows, screenshots, readiness.

The daemon connects to a session's X server through its socket inside the session root,
``/proc/<init>/root/tmp/.X11-unix/X0``, resolved by :func:`drums_core.host.safepath.connect_unix` so a
symlink the session planted there is refused rather than followed to a host socket. The supervisor
registers each session's display number with :func:`register_session` (:func:`connect` then uses
that route). There is no ``/tmp/.X11-unix/X<display>`` link on the host: one through
``/proc/<pid>/root`` would follow whatever the session planted at its socket's path.

A connection the daemon makes belongs to the host's network namespace, and so does the X server's
end of it: while the X server holds that end, CRIU cannot dump the session ("Unix socket N not
found": it is not among the sockets of the session's namespace). :func:`close` (and :func:`opened`)
therefore return only once the server has closed its end (the kernel says it is released).
"""
from __future__ import annotations

import io
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from Xlib import X, display as xdisplay, error as xerror
from Xlib.support import connect as _xconnect

from ..host import safepath, unixsock
from ..errors import DrumsError, Unavailable
from ..reasons import Reason

X_TIMEOUT = 15.0  # seconds any one read or write on a session's X connection may take
_routes: dict[int, int] = {}  # display number -> session init pid
_routes_lock = threading.Lock()
_plain_get_socket = _xconnect.get_socket


def _get_socket(dname, protocol, host, dno):
    with _routes_lock:
        pid = _routes.get(dno)
    if pid is None or host:
        return _plain_get_socket(dname, protocol, host, dno)
    try:
        # a timeout: the server is the session's, and one that never answers must not hang the daemon
        return safepath.connect_unix(f"/proc/{pid}/root", "tmp/.X11-unix/X0", timeout=X_TIMEOUT)
    except DrumsError as exc:
        raise OSError(f"X socket of display :{dno}: {exc.message}") from exc


_xconnect.get_socket = _get_socket


def register_session(number: int, init_pid: int) -> None:
    """Route connections to display ``number`` to the X socket inside the session whose init is ``init_pid``."""
    with _routes_lock:
        _routes[number] = init_pid


def unregister_session(number: int) -> None:
    with _routes_lock:
        _routes.pop(number, None)


@dataclass
class Window:
    id: int
    title: str
    wm_class: str
    mapped: bool


def connect(number: int) -> xdisplay.Display:
    """A connection to display ``number`` (``Unavailable X_UNREACHABLE``); end it with :func:`close`."""
    try:
        return xdisplay.Display(f":{number}")
    except (xerror.DisplayError, OSError, ConnectionError, TimeoutError) as exc:
        raise Unavailable(f"X display :{number} not reachable: {exc}", reason=Reason.X_UNREACHABLE) from exc


def close(d: xdisplay.Display, timeout: float = X_TIMEOUT) -> None:
    """End ``d`` and return once the X server has closed its end (at most ``timeout`` s, see
    :func:`until_peer_closed`). Never raises (a dead connection is closed as well)."""
    sock = d.display.socket
    try:
        d.flush()
        until_peer_closed(sock, timeout)
    except (OSError, ConnectionError, xerror.XError):
        pass
    finally:
        try:
            d.close()
        except Exception:  # noqa: BLE001 - the socket is closed whatever Xlib thinks of it
            sock.close()


def until_peer_closed(sock: socket.socket, timeout: float) -> bool:
    """Stop writing on ``sock``, then wait until the peer has closed its end: read (and drop) what
    still comes until the end of the stream (the peer read ours, and shut its end down or closed
    it), then until the kernel reports the peer's socket released (a server may shut a connection
    down before it closes its descriptor: X's transport layer does). True when that happened within
    ``timeout`` s; False after that, however the peer behaves (it is the session's, and may never
    close, or flood)."""
    sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 16):
                break
        except TimeoutError:
            return False
    pause = 0.001
    while unixsock.peer_inode(sock) != 0:
        if time.monotonic() + pause > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return True


@contextmanager
def opened(number: int) -> Iterator[xdisplay.Display]:
    """``with opened(n) as d``: a connection to display ``n``, ended by :func:`close`."""
    d = connect(number)
    try:
        yield d
    finally:
        close(d)


def _title(d: xdisplay.Display, win) -> str:
    try:
        prop = win.get_full_property(d.intern_atom("_NET_WM_NAME"), d.intern_atom("UTF8_STRING"))
        if prop and prop.value:
            v = prop.value
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        name = win.get_wm_name()
        if isinstance(name, bytes):
            return name.decode("latin-1")
        return name or ""
    except xerror.XError:
        return ""


def windows(d: xdisplay.Display) -> list[Window]:
    """Client windows: those on _NET_CLIENT_LIST plus any titled window two levels under the root
    (top-levels and the clients inside window-manager frames)."""
    root = d.screen().root
    ids: list[int] = []
    try:
        prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        if prop is not None:
            ids = list(prop.value)
    except xerror.XError:
        ids = []
    try:
        for top in root.query_tree().children:
            ids.append(top.id)
            try:
                ids.extend(c.id for c in top.query_tree().children)
            except xerror.XError:
                continue
    except xerror.XError:
        pass
    out: list[Window] = []
    seen: set[int] = set()
    for wid in ids:
        if wid in seen:
            continue
        seen.add(wid)
        win = d.create_resource_object("window", wid)
        try:
            attrs = win.get_attributes()
            cls = win.get_wm_class() or ("", "")
        except xerror.XError:
            continue
        title = _title(d, win)
        if not title:
            continue
        try:
            geo = win.get_geometry()
            if geo.width <= 1 and geo.height <= 1:  # a window manager's own hidden window
                continue
        except xerror.XError:
            continue
        out.append(Window(id=wid, title=title, wm_class=cls[1] or "", mapped=attrs.map_state == X.IsViewable))
    return out


def grab(d: xdisplay.Display) -> np.ndarray:
    """The root window as an HxWx3 uint8 RGB array."""
    screen = d.screen()
    w, h = screen.width_in_pixels, screen.height_in_pixels
    raw = screen.root.get_image(0, 0, w, h, X.ZPixmap, 0xFFFFFFFF).data
    arr = np.frombuffer(raw, dtype=np.uint8).reshape(h, w, 4)
    return arr[:, :, 2::-1].copy()


def nonblank_fraction(arr: np.ndarray) -> float:
    """Share of pixels that differ from the top-left pixel's colour (an empty screen is uniform)."""
    ref = arr[0, 0]
    return float(np.any(arr != ref, axis=2).mean())


def find_mapped(d: xdisplay.Display, expect_title: str | None, expect_ids: list[int] | None = None) -> str | None:
    """Title of a mapped client window matching ``expect_title`` (or whose X id is one of
    ``expect_ids``): the window manager's ``_NET_CLIENT_LIST`` first (two round trips per window),
    the full tree walk only when the list is empty (no window manager, or not up yet)."""
    ids_ok = set(expect_ids or ())
    root = d.screen().root
    try:
        prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        ids = list(prop.value) if prop is not None else []
    except xerror.XError:
        ids = []
    if not ids:
        wins = [w for w in windows(d) if w.mapped and (expect_title is None or expect_title in w.title
                                                         or w.id in ids_ok)]
        return wins[0].title if wins else None
    for wid in ids:
        win = d.create_resource_object("window", wid)
        title = _title(d, win)
        if not title or (expect_title is not None and expect_title not in title and wid not in ids_ok):
            continue
        try:
            if win.get_attributes().map_state == X.IsViewable:
                return title
        except xerror.XError:
            continue
    return None


def _strip(screen, y: int, rows: int) -> np.ndarray:
    """The root window's pixels in rows ``y..y+rows`` (full width), as raw 24-bit values (no RGB copy)."""
    raw = screen.root.get_image(0, y, screen.width_in_pixels, rows, X.ZPixmap, 0xFFFFFFFF).data
    return np.frombuffer(raw, dtype=np.uint32) & 0x00FFFFFF


def nonblank_fraction_raw(d: xdisplay.Display) -> float:
    """:func:`nonblank_fraction` of the root window, on the raw 32-bit pixels (no RGB copy)."""
    screen = d.screen()
    px = _strip(screen, 0, screen.height_in_pixels)
    return float(np.count_nonzero(px != px[0])) / px.size


def nonblank_exceeds(d: xdisplay.Display, fraction: float, rows: int = 64) -> tuple[bool, float]:
    """Whether more than ``fraction`` of the root window's pixels differ from its top-left pixel:
    the same count as :func:`nonblank_fraction_raw`, read in strips of ``rows`` rows and stopped as
    soon as the answer is certain (a screen mostly covered by a window is decided after the first
    ``fraction`` of it). Returns (answer, share of differing pixels among those read)."""
    screen = d.screen()
    w, h = screen.width_in_pixels, screen.height_in_pixels
    total = w * h
    need = fraction * total
    ref = None
    differ = seen = 0
    for y in range(0, h, rows):
        px = _strip(screen, y, min(rows, h - y))
        if ref is None:
            ref = px[0]
        differ += int(np.count_nonzero(px != ref))
        seen += px.size
        if differ > need:
            return True, differ / seen
        if differ + (total - seen) <= need:
            return False, differ / seen
    return differ > need, differ / max(seen, 1)


def nonblank_sampled(d: xdisplay.Display, bands: int = 8, height: int = 4) -> float:
    """Non-blank share of a sample of the screen: ``bands`` full-width strips (a few KiB each, a
    round trip of well under a millisecond, where a full 8 MiB grab costs 25-100 ms in python-xlib).
    A blank screen is uniform, so one differing pixel in the sample proves it is not blank; only
    an all-uniform sample falls back to the full grab."""
    screen = d.screen()
    h = screen.height_in_pixels
    ref = None
    differ = total = 0
    for i in range(bands):
        y = min(h - height, (h * (2 * i + 1)) // (2 * bands))
        px = _strip(screen, y, height)
        if ref is None:
            ref = px[0]
        differ += int(np.count_nonzero(px != ref))
        total += px.size
    if differ:
        return differ / total
    return nonblank_fraction_raw(d)


def png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def wait_ready(number: int, expect_title: str | None, timeout: float, min_nonblank: float = 0.0,
               alive=None, require_window: bool = True, expect_ids: list[int] | None = None) -> dict:
    """Wait until a mapped window matches ``expect_title`` (any window when None; or is one of the
    X windows ``expect_ids``) and the screen is not blank.

    With ``require_window=False`` and no ``expect_title``, an X server that answers is enough (a bare
    desktop has no window to wait for).

    ``alive`` is a callable returning a reason string when the session died meanwhile.
    Returns what was seen; raises Unavailable on timeout.
    """
    deadline = time.monotonic() + timeout
    d = None
    last = "no X connection"
    delay = 0.005
    try:
        while True:
            if alive is not None:
                dead = alive()
                if dead:
                    raise Unavailable(f"session died while waiting for readiness: {dead}", reason=Reason.SESSION_DIED)
            try:
                if d is None:
                    d = connect(number)
                if expect_title is None and not require_window:
                    d.screen().root.get_geometry()
                    return {"window": None, "nonblank": None}
                title = find_mapped(d, expect_title, expect_ids)
                if title is not None:
                    if min_nonblank == 0.0:
                        frac = nonblank_sampled(d)
                        enough = frac > 0.0
                    else:
                        enough, frac = nonblank_exceeds(d, min_nonblank)
                    if enough:
                        return {"window": title, "nonblank": frac}
                    last = f"screen blank ({frac:.3f} <= {min_nonblank})"
                else:
                    last = f"no mapped window matching {expect_title!r}"
            except (Unavailable, xerror.XError, ConnectionError, OSError) as exc:
                last = str(exc) if isinstance(exc, Unavailable) else f"X error: {exc}"
                if d is not None:
                    close(d, timeout=1.0)
                d = None
            if time.monotonic() > deadline:
                raise Unavailable(f"desktop not ready after {timeout}s: {last}", reason=Reason.NOT_READY)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    finally:
        if d is not None:
            close(d)
