"""The accessibility tree in OSWorld's XML form (``GET /accessibility``) and ``GET /terminal``.

Where AT-SPI answers (``pyatspi`` imports and the session has its accessibility bus) the tree is the
desktop's AT-SPI tree in the form OSWorld's Linux guest gives (:mod:`.a11y_atspi`, :mod:`.a11y_xml`).
Otherwise (an image without AT-SPI) it is built from X11: one ``application`` per client (grouped by
pid and class), one ``frame`` per top-level window with its title, class, geometry, visibility,
activity and focus, under a ``desktop-frame`` root that carries ``attr:drums-source="x11"``. The HTTP
reply says which (``"source"``), whether and why the walk was cut (``"truncated"``), its node count
and its time.
"""
from __future__ import annotations

import logging
from typing import Any

from . import a11y_atspi
from .a11y_xml import NS, Node, at, cp, st  # noqa: F401 - NS re-exported for callers
from .screen import XConnection
from .windows import list_windows

log = logging.getLogger("drums.guest")


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


def accessibility_tree(xc: XConnection) -> tuple[str, str]:
    """(xml, source) where source is ``atspi`` or ``x11``."""
    reply = accessibility_reply(xc)
    return reply["AT"], reply["source"]


def accessibility_reply(xc: XConnection) -> dict[str, Any]:
    """The body of ``GET /accessibility``: ``AT`` (the XML) as OSWorld's, plus what Drums adds."""
    tree = a11y_atspi.atspi_tree()
    if tree is not None:
        return {"AT": tree.xml, "source": "atspi", "truncated": tree.truncated or None, "nodes": tree.nodes,
                "seconds": round(tree.seconds, 3)}
    return {"AT": x11_tree(xc), "source": "x11", "truncated": None}


def terminal_output() -> tuple[str | None, str]:
    """Text of the focused terminal in an active gnome-terminal window (AT-SPI only)."""
    return a11y_atspi.terminal_output()
