"""In-process checks of pieces the live server cannot reach on this host: the AT-SPI walker (no
pyatspi here) with a fake pyatspi, the PNG encoder, and dropping to another user for commands."""
from __future__ import annotations

import io
import os
import pwd
import sys
import types
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from tests.support.guestlib import GuestServer
from PIL import Image

from drums_osworld.guest import a11y, a11y_atspi, a11y_xml
from drums_osworld.guest.commands import Runner
from drums_osworld.guest.screen import encode_png

ST = "{https://accessibility.ubuntu.example.org/ns/state}"
CP = "{https://accessibility.ubuntu.example.org/ns/component}"
AT = "{https://accessibility.ubuntu.example.org/ns/attributes}"


# ---------------------------------------------------------------------------------------------
# a fake pyatspi, just enough for the walker
# ---------------------------------------------------------------------------------------------
class _States:
    def __init__(self, states):
        self.states = states

    def getStates(self):
        return self.states

    def contains(self, s):
        return s in self.states


class _Text:
    def __init__(self, text):
        self.characterCount = len(text)
        self._t = text

    def getText(self, a, b):
        return self._t[a:b]


class _Comp:
    def __init__(self, ext):
        self.ext = ext

    def getExtents(self, _kind):
        return self.ext


class FakeNode:
    def __init__(self, role, name="", states=(), text=None, ext=None, attrs=None, children=()):
        self.role, self.name, self._states = role, name, list(states)
        self._text, self._ext, self._attrs = text, ext, attrs or {}
        self.children = list(children)

    @property
    def childCount(self):
        return len(self.children)

    def getChildAtIndex(self, i):
        return self.children[i]

    def getRoleName(self):
        return self.role

    def getState(self):
        return _States(self._states)

    def get_attributes(self):
        return self._attrs

    def queryComponent(self):
        if self._ext is None:
            raise NotImplementedError
        return _Comp(self._ext)

    def queryText(self):
        if self._text is None:
            raise NotImplementedError
        return _Text(self._text)

    def queryImage(self):
        raise NotImplementedError

    def querySelection(self):
        raise NotImplementedError

    def queryValue(self):
        raise NotImplementedError

    def queryAction(self):
        raise NotImplementedError


def _fake_pyatspi(desktop):
    names = {1: "STATE_ACTIVE", 2: "STATE_FOCUSED", 3: "STATE_SHOWING", 4: "STATE_VISIBLE",
             5: "STATE_ENABLED"}
    pa = types.SimpleNamespace(
        StateType=types.SimpleNamespace(_enum_lookup=names),
        STATE_ACTIVE=1, STATE_FOCUSED=2, STATE_SHOWING=3, XY_SCREEN=0,
        Registry=types.SimpleNamespace(getDesktop=lambda i: desktop))
    return pa


@pytest.fixture()
def fake_atspi(monkeypatch):
    term = FakeNode("terminal", "Terminal", states=[2, 3, 4, 5], text="$ ls\nfile  \n",
                    ext=(10, 20, 300, 200))
    frame = FakeNode("frame", "user@drums: ~", states=[1, 3, 4, 5], ext=(0, 0, 800, 600),
                     children=[FakeNode("filler", children=[term])])
    app = FakeNode("application", "gnome-terminal-server", attrs={"toolkit": "gtk"},
                   children=[frame])
    desktop = FakeNode("desktop frame", "main", children=[app])
    monkeypatch.setattr(a11y_atspi, "_pyatspi", _fake_pyatspi(desktop))
    return desktop


def test_atspi_tree_form(fake_atspi):
    tree = a11y_atspi.atspi_tree()
    assert tree.truncated == [] and tree.nodes == 4
    root = ET.fromstring(tree.xml)
    assert root.tag == "desktop-frame" and root.attrib == {}  # OSWorld's root has no attributes
    app = root.find("application")
    assert app.get("name") == "gnome-terminal-server" and app.get(AT + "toolkit") == "gtk"
    frame = app.find("frame")
    assert frame.get(ST + "active") == "true" and frame.get(CP + "screencoord") == "(0, 0)"
    term = root.find(".//terminal")
    assert term.text == "$ ls\nfile  \n" and term.get(CP + "size") == "(300, 200)"
    assert a11y.terminal_output() == ("$ ls\nfile", "atspi")


def test_atspi_walk_is_bounded(monkeypatch):
    """An app claiming a wide and deep tree: the walk stops at the node budget, the XML stays valid."""
    class Endless(FakeNode):
        def __init__(self, depth):
            super().__init__("panel", f"n<{depth}>\x01", states=[3, 4, 5], ext=(0, 0, 1, 1))
            self.depth = depth

        @property
        def childCount(self):
            return 2**31 - 1

        def getChildAtIndex(self, i):
            return Endless(self.depth + 1)

    desktop = FakeNode("desktop frame", "main", children=[Endless(1)])
    monkeypatch.setattr(a11y_atspi, "_pyatspi", _fake_pyatspi(desktop))
    monkeypatch.setattr(a11y_atspi, "MAX_NODES", 500)
    tree = a11y_atspi.atspi_tree()
    root = ET.fromstring(tree.xml)
    assert tree.truncated == ["more than 500 nodes"] and tree.nodes == 501
    assert len(list(root.iter())) == 502  # the root, the 500 counted and the one that went over
    depth, el = 0, root
    while len(el):
        el, depth = el[0], depth + 1
    assert depth == a11y_atspi.MAX_DEPTH  # the first branch went all the way down, then stopped


def test_no_atspi_means_x11(monkeypatch):
    monkeypatch.setattr(a11y_atspi, "_pyatspi", None)
    monkeypatch.setattr(a11y_atspi, "_pyatspi_failed", True)
    assert a11y_atspi.atspi_tree() is None
    assert a11y.terminal_output() == (None, "none")


def test_xml_escaping_of_hostile_titles():
    n = a11y_xml.Node("frame", {"name": 'a"<b>&\x01\x1f\n', a11y_xml.st("showing"): "true",
                                a11y_xml.at("1 bad key"): "v", a11y_xml.at("1-bad-key"): "dup"}, "t<\x00>")
    root = a11y_xml.Node("desktop-frame")
    root.children.append(n)
    parsed = ET.fromstring(root.tostring())
    f = parsed.find("frame")
    assert f.get("name") == 'a"<b>&\n' and f.text == "t<>" and f.get(ST + "showing") == "true"
    assert f.get(AT + "x-1-bad-key") == "v"  # made a valid name; the repeat after cleaning is dropped


# ---------------------------------------------------------------------------------------------
# PNG encoder
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(1, 1), (3, 2), (1920, 1080)])
def test_encode_png_roundtrip(size):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    a[: size[1] // 2] = 17  # some flat area too
    png = encode_png(Image.fromarray(a, "RGB"))
    back = Image.open(io.BytesIO(png))
    assert back.size == size and back.mode == "RGB"
    assert (np.asarray(back) == a).all()


# ---------------------------------------------------------------------------------------------
# commands as another user
# ---------------------------------------------------------------------------------------------
def test_runner_degrades_without_user(monkeypatch):
    monkeypatch.delenv("DRUMS_GUEST_USER", raising=False)
    r = Runner(None)
    assert r.drop is None and r.uid == os.getuid()
    r = Runner("no-such-user-drums")
    assert r.drop is None and r.uid == os.getuid()
    assert r.expand_home("~/x") == r.home.rstrip("/") + "/x" and r.expand_home("a~/") == "a~/"
    assert r.env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def _uid1000():
    try:
        return pwd.getpwuid(1000)
    except KeyError:
        return None


def test_server_as_root_drops_to_user(xserver, tmp_path):
    if os.geteuid() != 0 or _uid1000() is None:
        pytest.fail("needs root and a uid-1000 account on the host")
    pw = _uid1000()
    s = GuestServer(xserver.display, args=("--run-as-user", pw.pw_name))
    os.chmod(s.tmp, 0o755)  # the user must reach the server's scratch directory inside it
    try:
        s.start()
        assert s.get("/drums/health").json()["user"] == pw.pw_name
        body = s.execute(["sh", "-c", "id -u; echo $HOME; echo $XDG_RUNTIME_DIR"]).json()
        assert body["output"].split() == ["1000", pw.pw_dir, "/run/user/1000"]
        target = tmp_path / "drop" / "up.txt"
        r = s.post("/setup/upload", data={"file_path": str(target)},
                   files={"file_data": ("up.txt", b"hi")})
        assert r.status_code == 200
        assert target.stat().st_uid == 1000 and target.parent.stat().st_uid == 1000
        r = s.post("/run_python", json={"code": "import os; print(os.getuid())"})
        assert r.json()["output"] == "1000\n"
    finally:
        s.stop()
