"""The AT-SPI walk behind ``/accessibility``, bounded against whatever the desktop's apps publish.

Facts taken from OSWorld's Linux guest (``desktop_env/server/main.py``), so agents and getters see
the same document: one element per accessible, tagged with its role name (spaces become ``-``,
``unknown`` when empty), under a ``desktop-frame`` root that declares the eight
``accessibility.ubuntu.example.org`` namespaces and has no attributes; the applications are the
desktop's children, walked from depth 1. Each element has ``name`` (always, possibly empty), one
``st:<state>="true"`` per state (``STATE_MULTI_LINE`` -> ``st:multi_line``), ``attr:<key>`` per
object attribute, ``cp:screencoord="(x, y)"`` and ``cp:size="(w, h)"`` in screen coordinates only
when the object is both ``visible`` and ``showing``, its text (U+FFFC and U+FFFD removed) as element
text, ``image="true"`` / ``selection="true"`` when it has those interfaces, ``val:value``/``min``/
``max``/``step`` from the Value interface and ``act:<action>_desc`` / ``act:<action>_kb`` per action
(spaces in the action name become ``-``). Children stop at depth 50 and at 1024 per element; inside
a spreadsheet (``document spreadsheet``) a ``table`` yields only its showing block of cells.

What differs, on purpose: everything the apps say is untrusted (an agent has root in the desktop and
can run an app that publishes anything), so the walk is bounded in nodes, bytes, string lengths and
time (a partial tree is still valid XML and the reply says why it stopped); an app that stops
answering is left after a few timeouts instead of stalling every request; one dead child does not
drop its siblings; role and attribute names are made valid XML names and characters XML cannot carry
are removed (OSWorld's lxml would raise instead). Applications are walked one after another in one
dedicated thread (libatspi is not thread-safe), in the desktop's order. ``libreoffice --version`` is
asked once per guest, not per request. Chromium's application is named ``Google Chrome``, as the
browser OSWorld's VM runs (its getters select ``application[name=Google\\ Chrome]``), since the
image's ``google-chrome`` is Chromium.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .a11y_xml import Node, NS, act, at, cp, st, val

log = logging.getLogger("drums.guest")

MAX_DEPTH = 50            # OSWorld's
MAX_WIDTH = 1024          # OSWorld's
MAX_NODES = 30_000        # a Writer desktop has ~2,000, Chromium ~250 plus the page
MAX_BYTES = 24 * 2**20    # of names, attributes and text together (the XML is a little larger)
MAX_STRING = 64 * 2**10   # one name, attribute value or action string
MAX_TEXT = 2**20          # one element's text (characters)
WALK_SECONDS = 20.0       # the whole walk; then the tree is cut where it got to
CALL_TIMEOUT_MS = 1000    # one D-Bus call to an app (libatspi's default is 800 ms)
STARTUP_TIMEOUT_MS = 5000  # ... to an app that registered moments ago (libatspi's default: 15 s)
APP_TIMEOUTS = 3          # timeouts after which an app is left for the rest of the walk
APP_ALIASES = {"Chromium": "Google Chrome"}

_pyatspi: Any = None
_pyatspi_failed = False
_lo_version: tuple[int, ...] | None = None


class _Stop(Exception):
    """The walk's budget is spent: stop descending (what exists so far is kept)."""


class _AppGone(Exception):
    """This application stopped answering, or used up its share of the walk: leave it."""


@dataclass
class Budget:
    deadline: float
    max_nodes: int = MAX_NODES
    max_bytes: int = MAX_BYTES
    nodes: int = 0
    bytes: int = 0
    truncated: list[str] = field(default_factory=list)

    def note(self, reason: str) -> None:
        if reason not in self.truncated:
            self.truncated.append(reason)

    def take(self, nbytes: int) -> None:
        self.nodes += 1
        self.bytes += nbytes
        if self.nodes > self.max_nodes:
            self.note(f"more than {self.max_nodes} nodes")
            raise _Stop
        if self.bytes > self.max_bytes:
            self.note(f"more than {self.max_bytes} bytes")
            raise _Stop
        if time.monotonic() > self.deadline:
            self.note(f"walk took longer than {WALK_SECONDS:g} s")
            raise _Stop


def load_pyatspi() -> Any:
    """pyatspi, or None when it cannot be used here (no bus address yet: try again later)."""
    global _pyatspi, _pyatspi_failed
    if _pyatspi is not None or _pyatspi_failed:
        return _pyatspi
    bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    path = bus.split("path=", 1)[1].split(",", 1)[0] if "path=" in bus else ""
    if not (os.environ.get("AT_SPI_BUS_ADDRESS") or (path and os.path.exists(path))):
        return None
    try:
        import pyatspi  # type: ignore[import-not-found]
        from gi.repository import Atspi  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        log.info("pyatspi not available (%s); accessibility falls back to X11", exc)
        _pyatspi_failed = True
        return None
    try:
        Atspi.set_timeout(CALL_TIMEOUT_MS, STARTUP_TIMEOUT_MS)
    except Exception as exc:  # noqa: BLE001 - an older libatspi: keep its defaults
        log.info("Atspi.set_timeout failed: %s", exc)
    _pyatspi = pyatspi
    return pyatspi


def libreoffice_version() -> tuple[int, ...]:
    """LibreOffice's version (asked once; OSWorld asks on every request, which costs ~0.5 s)."""
    global _lo_version
    if _lo_version is None:
        _lo_version = (7, 4)
        try:
            out = subprocess.run(["libreoffice", "--version"], capture_output=True, text=True, timeout=20,
                                 stdin=subprocess.DEVNULL).stdout.split()
            if len(out) > 1:
                _lo_version = tuple(int(p) for p in re.findall(r"\d+", out[1])[:3]) or (7, 4)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return _lo_version


def _cut(s: Any, limit: int = MAX_STRING) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= limit else s[:limit]


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc)
    return "NoReply" in text or "Timeout" in text or "timed out" in text or "Did not receive a reply" in text


def current_desktop(pa: Any) -> Any:
    """The registry's desktop, its list of applications brought up to date.

    libatspi answers the desktop's children from its cache and applies the registry's
    ChildrenChanged signals (an application registered or left) only while it waits for a reply;
    without one round trip to the registry first, the first walk after an application registered
    listed the desktop without it."""
    desktop = pa.Registry.getDesktop(0)
    try:
        desktop.getRelationSet()  # an error reply is a round trip too
    except Exception as exc:  # noqa: BLE001 - the walk goes on with what the cache has
        log.info("the registry did not answer its round trip: %s", exc)
    return desktop


class Walker:
    """One walk over the desktop. Not thread-safe: runs in the AT-SPI thread only."""

    def __init__(self, pa: Any, budget: Budget) -> None:
        self.pa = pa
        self.budget = budget
        self.timeouts = 0
        self.app_name = ""
        self.app_deadline = budget.deadline
        self.app_share = 0.0

    # every call into an app goes through here: a failure is "not there", a timeout counts, and no
    # call starts after the walk's deadline or the app's share of it (so a node whose app answers
    # each of its ~20 calls slowly overruns them by one call, not by the node)
    def _call(self, fn: Callable[[], Any], default: Any = None) -> Any:
        now = time.monotonic()
        if now > self.budget.deadline:
            self.budget.note(f"walk took longer than {WALK_SECONDS:g} s")
            raise _Stop
        if now > self.app_deadline:
            raise _AppGone(f"application {self.app_name!r} cut after its share of the walk "
                           f"({self.app_share:.1f} s)")
        try:
            return fn()
        except NotImplementedError:
            return default
        except Exception as exc:  # noqa: BLE001 - a dying or lying accessible may fail any call
            if _is_timeout(exc):
                self.timeouts += 1
                if self.timeouts >= APP_TIMEOUTS:
                    raise _AppGone(f"application {self.app_name!r} stopped answering") from exc
            return default

    def desktop(self) -> Node:
        root = Node("desktop-frame")
        desktop = current_desktop(self.pa)  # no registry: raises, and the caller falls back to X11
        count = self._call(lambda: desktop.childCount, 0) or 0
        apps = []
        for i in range(min(int(count), MAX_WIDTH)):
            app = self._call(lambda i=i: desktop.getChildAtIndex(i))
            if app is not None:
                apps.append(app)
        for k, app in enumerate(apps):
            self.timeouts = 0
            self.app_name = ""
            # each application gets an equal share of the time left (what one leaves goes to the
            # ones after it): one that answers slowly cannot push the others out of the tree
            self.app_share = max(0.0, self.budget.deadline - time.monotonic()) / (len(apps) - k)
            self.app_deadline = time.monotonic() + self.app_share
            holder: list[Node] = []
            try:
                self._node(app, 1, None, holder)
            except _AppGone as gone:
                self.budget.note(str(gone))
            except _Stop:
                root.children.extend(holder)
                break
            root.children.extend(holder)
        return root

    def _node(self, acc: Any, depth: int, flag: str | None, into: list[Node]) -> None:
        """Build ``acc``'s element, append it to ``into`` first (so a cut keeps what was made), then its children."""
        c = self._call
        name = _cut(c(lambda: acc.name, ""))
        raw_role = _cut(c(lambda: acc.getRoleName(), "") or "", 256).strip()
        if depth == 1 and raw_role == "application":
            self.app_name = name
            name = APP_ALIASES.get(name, name)
        attrs: dict[str, str] = {"name": name}
        state_set = c(lambda: acc.getState())
        states = c(lambda: state_set.getStates(), []) if state_set is not None else []
        lookup = self.pa.StateType._enum_lookup
        for s in states or []:
            label = lookup.get(s, "")
            part = label.split("_", 1)[1].lower() if "_" in label else ""
            if part:
                attrs[st(part)] = "true"
        nbytes = len(name) + 64
        for k, v in list((c(lambda: acc.get_attributes(), {}) or {}).items())[:MAX_WIDTH]:
            if k:
                v = _cut(v)
                attrs[at(_cut(k, 256))] = v
                nbytes += len(k) + len(v)
        if attrs.get(st("visible")) == "true" and attrs.get(st("showing")) == "true":
            comp = c(lambda: acc.queryComponent())
            ext = c(lambda: comp.getExtents(self.pa.XY_SCREEN)) if comp is not None else None
            if ext is not None:
                try:
                    x, y, w, h = (int(v) for v in tuple(ext)[:4])
                    attrs[cp("screencoord")] = f"({x}, {y})"
                    attrs[cp("size")] = f"({w}, {h})"
                except (TypeError, ValueError):
                    pass
        text = ""
        txt = c(lambda: acc.queryText())
        if txt is not None:
            count = c(lambda: int(txt.characterCount), 0) or 0
            if count > 0:
                got = c(lambda: txt.getText(0, min(count, MAX_TEXT)), "") or ""
                text = _cut(got, MAX_TEXT).replace("\ufffc", "").replace("\ufffd", "")
        if c(lambda: acc.queryImage()) is not None:
            attrs["image"] = "true"
        if c(lambda: acc.querySelection()) is not None:
            attrs["selection"] = "true"
        value = c(lambda: acc.queryValue())
        if value is not None:
            for key, getter in (("value", lambda: value.currentValue), ("min", lambda: value.minimumValue),
                                ("max", lambda: value.maximumValue), ("step", lambda: value.minimumIncrement)):
                got = c(getter)
                if got is not None:
                    attrs[val(key)] = _cut(got, 64)
        action = c(lambda: acc.queryAction())
        if action is not None:
            n = c(lambda: int(action.nActions), 0) or 0
            for i in range(min(n, 64)):
                aname = _cut(c(lambda i=i: action.getName(i), "") or "", 256).replace(" ", "-")
                desc = _cut(c(lambda i=i: action.getDescription(i), "") or "")
                kb = _cut(c(lambda i=i: action.getKeyBinding(i), "") or "")
                attrs[act(f"{aname}_desc")] = desc
                attrs[act(f"{aname}_kb")] = kb
                nbytes += len(aname) * 2 + len(desc) + len(kb)
        nbytes += len(text)
        if not flag:
            if raw_role == "document spreadsheet":
                flag = "calc"
            elif raw_role == "application" and name == "Thunderbird":
                flag = "thunderbird"
        el = Node((raw_role or "unknown").replace(" ", "-"), attrs, text)
        into.append(el)
        self.budget.take(nbytes)
        if depth >= MAX_DEPTH:
            return
        count = c(lambda: int(acc.childCount), 0) or 0
        if count <= 0:
            return
        if flag == "calc" and raw_role == "table":
            self._calc_cells(acc, depth, flag, el, count)
            return
        for i in range(min(count, MAX_WIDTH)):
            ch = c(lambda i=i: acc.getChildAtIndex(i))
            if ch is not None:
                self._node(ch, depth + 1, flag, el.children)

    def _calc_cells(self, table: Any, depth: int, flag: str, el: Node, count: int) -> None:
        """A spreadsheet's table exposes every cell: keep the showing block only (as OSWorld does)."""
        showing_state = self.pa.STATE_SHOWING
        ncols = 1024 if libreoffice_version() < (7, 4) else 16384
        base, first_col, found = 0, None, False
        for r in range(1_048_576):
            col = first_col or 0
            while col < ncols:
                idx = base + col
                if idx >= count:
                    break
                ch = self._call(lambda idx=idx: table.getChildAtIndex(idx))
                showing = False
                if ch is not None:
                    ss = self._call(lambda ch=ch: ch.getState())
                    showing = bool(ss is not None and self._call(lambda ss=ss: ss.contains(showing_state), False))
                if showing:
                    self._node(ch, depth + 1, flag, el.children)
                    if not found:
                        first_col, found = col, True
                elif (found and first_col is not None) or col >= 500:
                    break
                col += 1
            if (found and col == first_col) or (not found and r >= 500) or base + col >= count:
                break
            base += ncols


# ------------------------------------------------------------------------------------------------
# one thread owns libatspi
# ------------------------------------------------------------------------------------------------
_jobs: "queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future]]" = queue.Queue()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _serve() -> None:
    while True:
        fn, fut = _jobs.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
            fut.set_exception(exc)


def run_in_atspi_thread(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in the AT-SPI thread; TimeoutError when it does not finish in ``timeout`` s
    (the thread goes on; requests queue behind it, each with its own timeout)."""
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, name="atspi", daemon=True)
            _thread.start()
    fut: concurrent.futures.Future = concurrent.futures.Future()
    _jobs.put((fn, fut))
    try:
        return fut.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise TimeoutError(f"the AT-SPI thread did not answer in {timeout:g} s") from None


@dataclass
class Tree:
    xml: str
    nodes: int
    truncated: list[str]
    seconds: float


def atspi_tree(walk_seconds: float = WALK_SECONDS) -> Tree | None:
    """The desktop's AT-SPI tree, or None when AT-SPI is unavailable here."""
    pa = load_pyatspi()
    if pa is None:
        return None

    def walk() -> Tree:
        t0 = time.monotonic()
        budget = Budget(deadline=t0 + walk_seconds, max_nodes=MAX_NODES, max_bytes=MAX_BYTES)
        try:
            root = Walker(pa, budget).desktop()
        except _Stop:  # only from the desktop itself
            root = Node("desktop-frame")
        return Tree(root.tostring(), budget.nodes, budget.truncated, time.monotonic() - t0)

    try:
        return run_in_atspi_thread(walk, timeout=walk_seconds + 4 * STARTUP_TIMEOUT_MS / 1000 + 10)
    except Exception as exc:  # noqa: BLE001 - a broken bus: the caller falls back to X11
        log.warning("AT-SPI walk failed (%s)", exc)
        return None


def terminal_output() -> tuple[str | None, str]:
    """Text of the focused terminal of an active gnome-terminal window (as OSWorld's /terminal)."""
    pa = load_pyatspi()
    if pa is None:
        return None, "none"

    def find() -> str | None:
        desktop = current_desktop(pa)
        budget = Budget(deadline=time.monotonic() + WALK_SECONDS)
        for i in range(min(desktop.childCount, MAX_WIDTH)):
            app = desktop.getChildAtIndex(i)
            if app is None or app.getRoleName() != "application" or app.name != "gnome-terminal-server":
                continue
            for j in range(min(app.childCount, MAX_WIDTH)):
                frame = app.getChildAtIndex(j)
                if frame is None or frame.getRoleName() != "frame" or not frame.getState().contains(pa.STATE_ACTIVE):
                    continue
                found = _focused_terminals(pa, frame, 0, budget)
                return found[0] if len(found) == 1 else None
        return None

    try:
        return run_in_atspi_thread(find, timeout=WALK_SECONDS + 10), "atspi"
    except Exception as exc:  # noqa: BLE001
        log.warning("AT-SPI terminal lookup failed: %s", exc)
        return None, "none"


def _focused_terminals(pa: Any, node: Any, depth: int, budget: Budget) -> list[str]:
    out: list[str] = []
    if depth > MAX_DEPTH or budget.nodes > budget.max_nodes or time.monotonic() > budget.deadline:
        return out
    budget.nodes += 1
    try:
        if node.getRoleName() == "terminal" and node.getState().contains(pa.STATE_FOCUSED):
            t = node.queryText()
            out.append(_cut(t.getText(0, min(t.characterCount, MAX_TEXT)), MAX_TEXT).rstrip())
        for k in range(min(node.childCount, MAX_WIDTH)):
            ch = node.getChildAtIndex(k)
            if ch is not None:
                out += _focused_terminals(pa, ch, depth + 1, budget)
    except Exception:  # noqa: BLE001 - a dying accessible
        pass
    return out


__all__ = ["NS", "Tree", "atspi_tree", "terminal_output", "load_pyatspi", "MAX_NODES", "MAX_BYTES",
           "MAX_DEPTH", "MAX_WIDTH", "WALK_SECONDS"]
