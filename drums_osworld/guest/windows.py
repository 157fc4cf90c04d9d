"""Top-level windows: listing with names, classes, geometry and state; activating and closing.

Listing reads the EWMH properties the window manager (openbox in a Drums session) keeps on the
root window. Activation and closing use ``wmctrl`` when it is installed, because OSWorld's guest
does and tasks rely on its matching rules (``-a`` substring, case-insensitive; ``-F`` exact;
``-x`` on the ``instance.Class`` string); without ``wmctrl`` the same rules are applied here
and the requests are sent as EWMH client messages.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from Xlib import X, Xatom
from Xlib import display as xdisplay
from Xlib import error as xerror
from Xlib.protocol import event as xevent

from .screen import XConnection


@dataclass
class WindowInfo:
    id: int
    title: str
    instance: str
    wm_class: str
    pid: int | None
    x: int
    y: int
    width: int
    height: int
    viewable: bool
    active: bool
    focused: bool
    states: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    desktop: int | None = None

    @property
    def class_string(self) -> str:
        """What ``wmctrl -lx`` prints and ``wmctrl -x`` matches: ``instance.Class``."""
        return f"{self.instance}.{self.wm_class}" if self.instance or self.wm_class else ""


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v.decode("latin-1")
    return str(v)


def _prop(d: xdisplay.Display, win, name: str, type_=X.AnyPropertyType):
    try:
        p = win.get_full_property(d.intern_atom(name), type_)
    except xerror.XError:
        return None
    return None if p is None else p.value


def _atom_names(d: xdisplay.Display, atoms) -> list[str]:
    out = []
    for a in atoms or []:
        try:
            out.append(d.get_atom_name(int(a)))
        except xerror.XError:
            continue
    return out


def _title(d: xdisplay.Display, win) -> str:
    v = _prop(d, win, "_NET_WM_NAME", d.intern_atom("UTF8_STRING"))
    if v:
        return _text(v)
    try:
        return _text(win.get_wm_name())
    except xerror.XError:
        return ""


def _client_ids(d: xdisplay.Display) -> list[int]:
    root = d.screen().root
    for name in ("_NET_CLIENT_LIST_STACKING", "_NET_CLIENT_LIST"):
        v = _prop(d, root, name)
        if v is not None and len(v):
            return [int(i) for i in v]
    # No EWMH window manager: mapped children of the root with a WM_CLASS.
    out = []
    try:
        for w in root.query_tree().children:
            try:
                if w.get_attributes().map_state == X.IsViewable and w.get_wm_class():
                    out.append(w.id)
            except xerror.XError:
                continue
    except xerror.XError:
        pass
    return out


def _is_ancestor_or_self(d: xdisplay.Display, anc: int, win) -> bool:
    cur = win
    for _ in range(64):
        if cur is None or not hasattr(cur, "id") or cur.id in (0, X.PointerRoot):
            return False
        if cur.id == anc:
            return True
        try:
            tree = cur.query_tree()
        except xerror.XError:
            return False
        if tree.parent is None or tree.parent.id == tree.root.id or tree.parent.id == 0:
            return False
        cur = tree.parent
    return False


def list_windows(xc: XConnection) -> list[WindowInfo]:
    """Managed top-level windows, bottom to top in stacking order."""

    def q(d: xdisplay.Display) -> list[WindowInfo]:
        root = d.screen().root
        active_v = _prop(d, root, "_NET_ACTIVE_WINDOW")
        active = int(active_v[0]) if active_v is not None and len(active_v) else 0
        try:
            focus = d.get_input_focus().focus
        except xerror.XError:
            focus = None
        out: list[WindowInfo] = []
        for wid in _client_ids(d):
            win = d.create_resource_object("window", wid)
            try:
                attrs = win.get_attributes()
                geo = win.get_geometry()
                tr = win.translate_coords(root, 0, 0)
                cls = win.get_wm_class() or ("", "")
            except xerror.XError:
                continue  # the window vanished while we looked at it
            pid_v = _prop(d, win, "_NET_WM_PID", Xatom.CARDINAL)
            desk_v = _prop(d, win, "_NET_WM_DESKTOP", Xatom.CARDINAL)
            states = [
                s.replace("_NET_WM_STATE_", "").lower()
                for s in _atom_names(d, _prop(d, win, "_NET_WM_STATE", Xatom.ATOM))
            ]
            types = [
                s.replace("_NET_WM_WINDOW_TYPE_", "").lower()
                for s in _atom_names(d, _prop(d, win, "_NET_WM_WINDOW_TYPE", Xatom.ATOM))
            ]
            focused = bool(focus is not None and not isinstance(focus, int)
                           and _is_ancestor_or_self(d, wid, focus))
            out.append(WindowInfo(
                id=wid,
                title=_title(d, win),
                instance=_text(cls[0]),
                wm_class=_text(cls[1]),
                pid=int(pid_v[0]) if pid_v is not None and len(pid_v) else None,
                # translate_coords gives the root position of the window's origin, negated.
                x=-int(tr.x),
                y=-int(tr.y),
                width=int(geo.width),
                height=int(geo.height),
                viewable=attrs.map_state == X.IsViewable and "hidden" not in states,
                active=wid == active,
                focused=focused,
                states=states,
                types=types,
                desktop=int(desk_v[0]) if desk_v is not None and len(desk_v) else None,
            ))
        return out

    return xc.run(q)


def match(windows: list[WindowInfo], name: str, strict: bool = False,
          by_class: bool = False) -> list[WindowInfo]:
    """wmctrl's matching: substring, case-insensitive; ``strict`` = exact and case-sensitive."""
    out = []
    for w in windows:
        hay = w.class_string if by_class else w.title
        if strict:
            ok = hay == name
        else:
            ok = name.lower() in hay.lower()
        if ok:
            out.append(w)
    return out


def _client_message(d: xdisplay.Display, win_id: int, msg_type: str, data: list[int]) -> None:
    root = d.screen().root
    win = d.create_resource_object("window", win_id)
    data = (data + [0] * 5)[:5]
    ev = xevent.ClientMessage(window=win, client_type=d.intern_atom(msg_type), data=(32, data))
    root.send_event(ev, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)
    d.flush()


def activate_id(xc: XConnection, win_id: int) -> bool:
    """Raise and focus one window (switching desktop first, as wmctrl does)."""
    if shutil.which("wmctrl"):
        r = subprocess.run(["wmctrl", "-i", "-a", hex(win_id)], capture_output=True, timeout=10)
        if r.returncode == 0:
            return True

    def act(d: xdisplay.Display) -> bool:
        win = d.create_resource_object("window", win_id)
        desk = _prop(d, win, "_NET_WM_DESKTOP", Xatom.CARDINAL)
        if desk is not None and len(desk) and int(desk[0]) != 0xFFFFFFFF:
            _client_message(d, d.screen().root.id, "_NET_CURRENT_DESKTOP", [int(desk[0]), X.CurrentTime])
        _client_message(d, win_id, "_NET_ACTIVE_WINDOW", [2, X.CurrentTime, 0])
        try:
            win.map()
            win.configure(stack_mode=X.Above)
        except xerror.XError:
            return False
        d.flush()
        return True

    return xc.run(act)


def close_id(xc: XConnection, win_id: int) -> bool:
    if shutil.which("wmctrl"):
        r = subprocess.run(["wmctrl", "-i", "-c", hex(win_id)], capture_output=True, timeout=10)
        if r.returncode == 0:
            return True
    return xc.run(lambda d: (_client_message(d, win_id, "_NET_CLOSE_WINDOW", [X.CurrentTime, 2]), True)[1])


def wmctrl_by_name(xc: XConnection, action: str, name: str, strict: bool, by_class: bool) -> bool:
    """``wmctrl -[x][F]a|c NAME``; True when a window matched. ``action`` is ``a`` or ``c``.

    wmctrl also fails when a window still in the window manager's client list is already gone (it
    exits on the X error, BadWindow): right after another window was closed, that list lags behind.
    So a failure of wmctrl is checked against this module's own listing (which skips such windows),
    and a window that matches there is acted on directly."""
    if shutil.which("wmctrl"):
        flags = "-{}{}{}".format("x" if by_class else "", "F" if strict else "", action)
        r = subprocess.run(["wmctrl", flags, name], capture_output=True, timeout=10)
        if r.returncode == 0:
            return True
    found = match(list_windows(xc), name, strict, by_class)
    if not found:
        return False
    # wmctrl acts on the first match in _NET_CLIENT_LIST order (oldest first).
    target = min(found, key=lambda w: w.id).id
    return activate_id(xc, target) if action == "a" else close_id(xc, target)
