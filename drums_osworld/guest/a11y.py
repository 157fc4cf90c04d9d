"""The accessibility tree in OSWorld's XML form.

OSWorld's guest walks AT-SPI with ``pyatspi`` and writes one element per accessible, tagged with
the role name (spaces become ``-``), with ``name``, states as ``st:<state>="true"``, attributes as
``attr:<name>``, on-screen geometry as ``cp:screencoord="(x, y)"`` and ``cp:size="(w, h)"``, text
content as element text, under a ``desktop-frame`` root that declares the ``accessibility.ubuntu``
namespaces. Agents parse it (``linearize_accessibility_tree``) and some getters run XPath on it.

Here the AT-SPI tree is used when ``pyatspi`` imports and the desktop exposes at least one
accessible application. Otherwise the tree is built from X11: one ``application`` per client
(grouped by pid and class), one ``frame`` per top-level window with its title, class, geometry,
visibility, activity and focus. The root carries ``attr:drums-source`` (``atspi`` or ``x11``) and
the HTTP reply adds ``"source"``.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import subprocess
from xml.sax.saxutils import escape, quoteattr

from .screen import XConnection
from .windows import list_windows

log = logging.getLogger("drums.guest")

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}

MAX_DEPTH = 50
MAX_WIDTH = 1024
ATSPI_TIMEOUT = 30.0

# Characters XML 1.0 cannot carry at all.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NAME_OK = re.compile(r"[^A-Za-z0-9_.\-]")


def _clean(s: object) -> str:
    return _BAD_XML.sub("", "" if s is None else str(s))


def _tag(role: str) -> str:
    t = _NAME_OK.sub("-", (role or "unknown").strip().replace(" ", "-")) or "unknown"
    return t if t[0].isalpha() or t[0] == "_" else "x-" + t


def _qname(key: str) -> str:
    """``{uri}local`` -> ``prefix:local`` for our namespaces; plain names stay as they are."""
    if key.startswith("{"):
        uri, local = key[1:].split("}", 1)
        for p, u in NS.items():
            if u == uri:
                return f"{p}:{_NAME_OK.sub('-', local) or 'x'}"
    return _NAME_OK.sub("-", key) or "x"


class Node:
    __slots__ = ("tag", "attrs", "text", "children")

    def __init__(self, tag: str, attrs: dict[str, str] | None = None, text: str = "") -> None:
        self.tag = _tag(tag)
        self.attrs = attrs or {}
        self.text = text
        self.children: list[Node] = []

    def write(self, out: list[str], root: bool = False) -> None:
        out.append("<" + self.tag)
        if root:
            for p, u in NS.items():
                out.append(f" xmlns:{p}={quoteattr(u)}")
        seen = set()
        for k, v in self.attrs.items():
            q = _qname(k)
            if q in seen:
                continue
            seen.add(q)
            out.append(f" {q}={quoteattr(_clean(v))}")
        if not self.children and not self.text:
            out.append("/>")
            return
        out.append(">")
        if self.text:
            out.append(escape(_clean(self.text)))
        for c in self.children:
            c.write(out)
        out.append(f"</{self.tag}>")

    def tostring(self) -> str:
        out: list[str] = []
        self.write(out, root=True)
        return "".join(out)


def st(name: str) -> str:
    return "{%s}%s" % (NS["st"], name)


def at(name: str) -> str:
    return "{%s}%s" % (NS["attr"], name)


def cp(name: str) -> str:
    return "{%s}%s" % (NS["cp"], name)


# --------------------------------------------------------------------------------------------
# X11 window tree
# --------------------------------------------------------------------------------------------
def x11_tree(xc: XConnection) -> str:
    wins = list_windows(xc)
    w, h = xc.screen_size()
    root = Node("desktop-frame", {"name": "Desktop", at("drums-source"): "x11",
                                  cp("screencoord"): "(0, 0)", cp("size"): f"({w}, {h})"})
    apps: dict[tuple, Node] = {}
    for win in wins:
        key = (win.pid, win.wm_class, win.instance)
        app = apps.get(key)
        if app is None:
            attrs = {"name": win.instance or win.wm_class or "unknown", at("class"): win.wm_class,
                     at("instance"): win.instance}
            if win.pid is not None:
                attrs[at("pid")] = str(win.pid)
            app = apps[key] = Node("application", attrs)
            root.children.append(app)
        attrs = {"name": win.title}
        states = ["enabled", "sensitive", "focusable", "resizable"]
        if win.viewable:
            states += ["visible", "showing"]
        else:
            states += ["iconified"]
        if win.active:
            states.append("active")
        if win.focused:
            states.append("focused")
        for s in win.states:
            if s in ("modal", "maximized_vert", "maximized_horz", "fullscreen", "above", "below",
                     "sticky", "shaded"):
                states.append(s.replace("_", "-"))
        for s in states:
            attrs[st(s)] = "true"
        attrs[at("class")] = win.wm_class
        attrs[at("instance")] = win.instance
        attrs[at("window-id")] = hex(win.id)
        if win.types:
            attrs[at("window-type")] = ",".join(win.types)
        if win.viewable:
            attrs[cp("screencoord")] = f"({win.x}, {win.y})"
            attrs[cp("size")] = f"({win.width}, {win.height})"
        tag = "dialog" if "dialog" in win.types else "frame"
        app.children.append(Node(tag, attrs))
    return root.tostring()


# --------------------------------------------------------------------------------------------
# AT-SPI tree (only where pyatspi exists and the desktop exposes applications)
# --------------------------------------------------------------------------------------------
_pyatspi = None
_pyatspi_failed = False


def _load_pyatspi():
    global _pyatspi, _pyatspi_failed
    if _pyatspi is not None or _pyatspi_failed:
        return _pyatspi
    bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    path = bus.split("path=", 1)[1].split(",", 1)[0] if "path=" in bus else ""
    if not (os.environ.get("AT_SPI_BUS_ADDRESS") or (path and os.path.exists(path))):
        return None  # no session bus: pyatspi would block or fail; try again next time
    try:
        import pyatspi  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        log.info("pyatspi not available (%s); accessibility falls back to X11", exc)
        _pyatspi_failed = True
        return None
    _pyatspi = pyatspi
    return pyatspi


_lo_version: tuple[int, ...] | None = None


def _libreoffice_version() -> tuple[int, ...]:
    global _lo_version
    if _lo_version is None:
        _lo_version = (7, 4)
        try:
            out = subprocess.run(["libreoffice", "--version"], capture_output=True, text=True,
                                 timeout=20).stdout.split()
            if len(out) > 1:
                _lo_version = tuple(int(p) for p in re.findall(r"\d+", out[1])[:3]) or (7, 4)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return _lo_version


def _atspi_node(pa, node, depth: int, flag: str | None) -> Node:
    attrs: dict[str, str] = {"name": node.name or ""}
    try:
        for s in node.getState().getStates():
            n = pa.StateType._enum_lookup[s].split("_", 1)[1].lower()
            if n:
                attrs[st(n)] = "true"
    except Exception:  # noqa: BLE001 - a dying accessible may fail any call
        pass
    try:
        for k, v in (node.get_attributes() or {}).items():
            if k:
                attrs[at(k)] = v
    except Exception:  # noqa: BLE001
        pass
    if attrs.get(st("visible")) == "true" and attrs.get(st("showing")) == "true":
        try:
            ext = node.queryComponent().getExtents(pa.XY_SCREEN)
            attrs[cp("screencoord")] = str((ext[0], ext[1]))
            attrs[cp("size")] = str((ext[2], ext[3]))
        except Exception:  # noqa: BLE001
            pass
    text = ""
    try:
        t = node.queryText()
        text = t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except Exception:  # noqa: BLE001
        pass
    for probe, key in (("queryImage", "image"), ("querySelection", "selection")):
        try:
            getattr(node, probe)()
            attrs[key] = "true"
        except Exception:  # noqa: BLE001
            pass
    try:
        v = node.queryValue()
        for k, fn in (("value", lambda: v.currentValue), ("min", lambda: v.minimumValue),
                      ("max", lambda: v.maximumValue), ("step", lambda: v.minimumIncrement)):
            try:
                attrs["{%s}%s" % (NS["val"], k)] = str(fn())
            except Exception:  # noqa: BLE001
                pass
    except Exception:  # noqa: BLE001
        pass
    try:
        a = node.queryAction()
        for i in range(a.nActions):
            n = a.getName(i).replace(" ", "-")
            attrs["{%s}%s_desc" % (NS["act"], n)] = a.getDescription(i)
            attrs["{%s}%s_kb" % (NS["act"], n)] = a.getKeyBinding(i)
    except Exception:  # noqa: BLE001
        pass
    try:
        raw_role = node.getRoleName().strip()
    except Exception:  # noqa: BLE001
        raw_role = ""
    if not flag:
        if raw_role == "document spreadsheet":
            flag = "calc"
        elif raw_role == "application" and node.name == "Thunderbird":
            flag = "thunderbird"
    el = Node(raw_role or "unknown", attrs, text)
    if depth >= MAX_DEPTH:
        return el
    try:
        count = node.childCount
    except Exception:  # noqa: BLE001
        return el
    if flag == "calc" and raw_role == "table":
        # Spreadsheets expose every cell; keep the showing block only (as OSWorld does).
        ncols = 1024 if _libreoffice_version() < (7, 4) else 16384
        base, first_col, found = 0, None, False
        for r in range(1_048_576):
            col = first_col or 0
            while col < ncols:
                idx = base + col
                if idx >= count:
                    break
                try:
                    ch = node.getChildAtIndex(idx)
                    showing = ch.getState().contains(pa.STATE_SHOWING)
                except Exception:  # noqa: BLE001
                    showing = False
                if showing:
                    el.children.append(_atspi_node(pa, ch, depth + 1, flag))
                    if not found:
                        first_col, found = col, True
                elif (found and first_col is not None) or col >= 500:
                    break
                col += 1
            if (found and col == first_col) or (not found and r >= 500) or base + col >= count:
                break
            base += ncols
        return el
    for i in range(min(count, MAX_WIDTH)):
        try:
            ch = node.getChildAtIndex(i)
            if ch is not None:
                el.children.append(_atspi_node(pa, ch, depth + 1, flag))
        except Exception:  # noqa: BLE001
            continue
    return el


def atspi_tree() -> str | None:
    """The AT-SPI desktop as XML, or None when AT-SPI is unavailable or exposes nothing."""
    pa = _load_pyatspi()
    if pa is None:
        return None

    def walk() -> str | None:
        desktop = pa.Registry.getDesktop(0)
        apps = [desktop.getChildAtIndex(i) for i in range(desktop.childCount)]
        apps = [a for a in apps if a is not None]
        if not apps:
            return None
        root = Node("desktop-frame", {at("drums-source"): "atspi"})
        for a in apps:
            root.children.append(_atspi_node(pa, a, 1, None))
        return root.tostring()

    ex = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return ex.submit(walk).result(timeout=ATSPI_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - includes the timeout: fall back to X11
        log.warning("AT-SPI walk failed (%s); falling back to X11", exc)
        return None
    finally:
        ex.shutdown(wait=False)


def accessibility_tree(xc: XConnection) -> tuple[str, str]:
    """(xml, source) where source is ``atspi`` or ``x11``."""
    xml = atspi_tree()
    if xml is not None:
        return xml, "atspi"
    return x11_tree(xc), "x11"


def _focused_terminals(pa, node, depth: int = 0) -> list[str]:
    out: list[str] = []
    if depth > MAX_DEPTH:
        return out
    if node.getRoleName() == "terminal" and node.getState().contains(pa.STATE_FOCUSED):
        t = node.queryText()
        out.append(t.getText(0, t.characterCount).rstrip())
    for k in range(min(node.childCount, MAX_WIDTH)):
        out += _focused_terminals(pa, node.getChildAtIndex(k), depth + 1)
    return out


def terminal_output() -> tuple[str | None, str]:
    """Text of the focused terminal in an active gnome-terminal window (AT-SPI only)."""
    pa = _load_pyatspi()
    if pa is None:
        return None, "none"

    def find() -> str | None:
        desktop = pa.Registry.getDesktop(0)
        for i in range(desktop.childCount):
            app = desktop.getChildAtIndex(i)
            if app is None or app.getRoleName() != "application" or app.name != "gnome-terminal-server":
                continue
            for j in range(app.childCount):
                frame = app.getChildAtIndex(j)
                if frame.getRoleName() != "frame" or not frame.getState().contains(pa.STATE_ACTIVE):
                    continue
                found = _focused_terminals(pa, frame)
                return found[0] if len(found) == 1 else None
        return None

    ex = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return ex.submit(find).result(timeout=ATSPI_TIMEOUT), "atspi"
    except Exception as exc:  # noqa: BLE001
        log.warning("AT-SPI terminal lookup failed: %s", exc)
        return None, "none"
    finally:
        ex.shutdown(wait=False)
