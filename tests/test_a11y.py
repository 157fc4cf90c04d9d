"""AT-SPI accessibility on real desktops of the ``osworld`` image (issue 15).

``GET /accessibility`` gives the tree in the form of OSWorld's Linux guest, and OSWorld's own code
reads it: ``linearize_accessibility_tree`` (mm_agents), the ``check_accessibility_tree`` metric and
the ``active_url_from_accessTree`` getter through a real ``PythonController``, all run in the
OSWorld venv (tests/support/osworld_harness.py). On a Writer desktop the tree names the text typed into the
document; on a Chromium desktop, the address bar and its URL; siblings restored from one checkpoint
each keep their own accessibility bus and their own tree; a hostile application inside the desktop
(tests/support/a11y_hostile.py: endless, deep, cyclic, XML-breaking, huge, lying and hung) cannot break or
hang the guest: the reply is bounded, valid XML, and still has the real applications. The walk's
latency on Writer and Chromium desktops is printed (not asserted).
"""
from __future__ import annotations

import re
import statistics
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import requests

from drums_osworld.desktop import GUEST_PORT, desktop_spec
from drums_osworld.guest import a11y_atspi
from drums_osworld.guest.client import GuestClient
from tests.support.osworld_harness import run_osworld
from tests.support.wait import wait_until

IMAGE = "osworld"
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
ST = "{%s}" % NS["st"]
CP = "{%s}" % NS["cp"]
WRITER = {"name": "writer", "argv": ["soffice", "--writer", "--norestore", "--nologo"]}
HOSTILE = Path(__file__).resolve().parent / "support" / "a11y_hostile.py"
COORD = re.compile(r"^\(-?\d+, -?\d+\)$")

# OSWorld's linearizer, taken from the installed mm_agents/agent.py by its source (that module's
# own imports, model SDKs, are not installed in the test venv), run with the module's namespace
# constants and its real filter_nodes.
LINEARIZE = """
import ast, inspect, xml.etree.ElementTree as ET
import mm_agents
from mm_agents.accessibility_tree_wrap.heuristic_retrieve import filter_nodes
path = inspect.getfile(mm_agents).replace("__init__.py", "agent.py")
tree = ast.parse(open(path).read())
keep = [n for n in tree.body if isinstance(n, ast.Assign) and all(
    isinstance(t, ast.Name) and t.id.endswith(("_ns_ubuntu", "_ns_windows")) for t in n.targets)]
keep += [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "linearize_accessibility_tree"]
ns = {"ET": ET, "filter_nodes": filter_nodes}
exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)
xml = open(XML_PATH, encoding="utf-8").read()
emit(ns["linearize_accessibility_tree"](xml, platform="ubuntu"))
"""


def _guest(session: dict) -> GuestClient:
    return GuestClient(session["address"], GUEST_PORT, timeout=180.0)


def _get_tree(session: dict, timeout: float = 120.0) -> dict:
    r = requests.get(f"http://{session['address']}:{GUEST_PORT}/accessibility", timeout=timeout,
                     proxies={"http": None, "https": None})
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert body["source"] == "atspi", {k: v for k, v in body.items() if k != "AT"}
    return body


class _Unmet:
    """A tree without what is awaited: false, and shows its applications and focused paragraph."""

    def __init__(self, root: ET.Element):
        self.root = root

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        apps = [(a.tag, a.get("name")) for a in self.root]
        return f"applications: {apps}; focused paragraph: {_para_text(self.root)!r}"


def _wait_tree(session: dict, pred, what: str, timeout: float = 90.0) -> tuple[dict, ET.Element]:
    def tree():
        body = _get_tree(session)
        root = ET.fromstring(body["AT"])
        return (body, root) if pred(root) else _Unmet(root)

    return wait_until(tree, timeout, f"{what} in the tree", every=0.5)


def _focused_paragraph(root: ET.Element) -> ET.Element | None:
    for el in root.iter("paragraph"):
        if el.get(ST + "focused") == "true":
            return el
    return None


def _para_text(root: ET.Element) -> str | None:
    p = _focused_paragraph(root)
    return None if p is None else (p.text or "")


def _linearize(xml: str, tmp_path: Path) -> str:
    p = tmp_path / "tree.xml"
    p.write_text(xml, encoding="utf-8")
    return run_osworld(f"XML_PATH = {str(p)!r}\n" + LINEARIZE, timeout=300)


def _check_metric(xml: str, rules: list[dict], tmp_path: Path) -> float:
    p = tmp_path / "metric.xml"
    p.write_text(xml, encoding="utf-8")
    return run_osworld(f"""
        from desktop_env.evaluators.metrics.general import check_accessibility_tree
        emit(check_accessibility_tree(open({str(p)!r}, encoding="utf-8").read(), {rules!r}))
    """, timeout=300)


def _type(guest: GuestClient, text: str) -> None:
    r = guest.execute(["xdotool", "type", "--delay", "30", "--", text])
    assert r.returncode == 0, r


def _latency(session: dict, label: str, n: int = 5) -> None:
    walls, walks, nodes = [], [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        body = _get_tree(session)
        walls.append(time.perf_counter() - t0)
        walks.append(body["seconds"])
        nodes = body["nodes"]
    print(f"\n/accessibility on a {label} desktop: median {statistics.median(walls):.3f} s over the veth "
          f"(walk {statistics.median(walks):.3f} s, {nodes} nodes, {len(body['AT'])} characters; n={n})")


def _check_form(xml: str, root: ET.Element) -> None:
    """OSWorld's form: root ``desktop-frame`` without attributes declaring exactly its namespaces."""
    assert root.tag == "desktop-frame" and root.attrib == {}
    head = xml[: xml.index(">") + 1]
    assert dict(re.findall(r'xmlns:(\w+)="([^"]+)"', head)) == NS
    for el in root.iter():
        if el is root:
            continue
        assert "name" in el.attrib, el.tag
        for key in (CP + "screencoord", CP + "size"):
            if key in el.attrib:
                assert COORD.match(el.get(key)), (el.tag, el.get(key))
                assert el.get(ST + "visible") == el.get(ST + "showing") == "true"


# ---------------------------------------------------------------------------------------------------
def test_writer_tree_names_the_document_text(client, tmp_path):
    s = client.create(desktop_spec(image=IMAGE, extra_programs=[WRITER]))
    try:
        g = _guest(s)
        _wait_tree(s, lambda r: _focused_paragraph(r) is not None, "Writer's focused paragraph")
        typed = "Drums a11y <tree> & 42"  # no quotes: Writer's autocorrect would curl them
        _type(g, typed)
        body, root = _wait_tree(s, lambda r: _para_text(r) == typed,
                                "the typed text")
        _check_form(body["AT"], root)
        app = [a for a in root if a.tag == "application" and a.get("name") == "soffice"]
        assert len(app) == 1 and app[0].find(".//document-text") is not None
        assert body["truncated"] is None and body["nodes"] == len(list(root.iter())) - 1
        table = _linearize(body["AT"], tmp_path)
        rows = [r.split("\t") for r in table.splitlines()]
        assert rows[0][:3] == ["tag", "name", "text"]
        para = [r for r in rows if r[0] == "paragraph" and r[2] == typed]
        assert len(para) == 1, [r for r in rows if r[0] == "paragraph"]
        assert COORD.match(para[0][5]) and COORD.match(para[0][6])
        assert _check_metric(body["AT"], [{"xpath": '//paragraph[@st:focused="true"]', "text": typed,
                                           "exact": True}], tmp_path) == 1.0
        _latency(s, "Writer")
    finally:
        client.destroy(s["id"])


def test_chromium_tree_names_the_address_bar(client, tmp_path):
    page = "/home/user/a11y-page.html"
    url = "file://" + page
    s = client.create(desktop_spec(image=IMAGE))
    try:
        g = _guest(s)
        g.upload(page, b"<html><head><title>Drums page</title></head><body><h1>Drums heading</h1>"
                       b"<button>Press me</button></body></html>")
        g.launch(["google-chrome", url])

        def ready(root: ET.Element) -> bool:
            bars = root.findall(".//entry[@name='Address and search bar']")
            heads = [h for h in root.iter("heading") if h.get("name") == "Drums heading"]
            return bool(bars) and url.split("://", 1)[1] in (bars[0].text or "") and bool(heads)

        body, root = _wait_tree(s, ready, "Chromium's address bar with the page")
        _check_form(body["AT"], root)
        apps = [a for a in root if a.tag == "application"]
        assert [a.get("name") for a in apps] == ["Google Chrome"]  # as on OSWorld's VM
        table = _linearize(body["AT"], tmp_path)
        assert any(r.startswith("entry\tAddress and search bar\t") for r in table.splitlines()), table[:2000]
        assert any(r.startswith("push-button\tPress me\t") for r in table.splitlines()), table[:2000]
        # OSWorld's own getter, through its own controller, against this guest
        got = run_osworld(f"""
            from desktop_env.controllers.python import PythonController
            from desktop_env.evaluators.getters.chrome import get_active_url_from_accessTree
            class Env:
                controller = PythonController(vm_ip={s['address']!r}, server_port={GUEST_PORT})
            emit(get_active_url_from_accessTree(Env(), {{"goto_prefix": ""}}))
        """, timeout=300)
        bar = root.findall(".//entry[@name='Address and search bar']")[0].text
        assert got == bar and url.split("://", 1)[1] in got
        _latency(s, "Chromium")
    finally:
        client.destroy(s["id"])


def test_gtk_apps_gimp_and_terminal(client):
    """GTK 2 (GIMP, through gail and the atk-bridge module) and GTK 3 (gnome-terminal) export their
    trees; ``/terminal`` reads the focused terminal as OSWorld's guest does."""
    s = client.create(desktop_spec(image=IMAGE, extra_programs=[
        {"name": "gimp", "argv": ["gimp", "--no-splash"]}]))
    try:
        g = _guest(s)
        if g.execute(["test", "-e", "/usr/lib/x86_64-linux-gnu/gtk-2.0/modules/libgail.so"]).returncode != 0:
            pytest.fail("the osworld image lacks libgail-common: GTK 2 apps (GIMP) cannot load gail, so "
                        "atk-bridge has no root and GIMP never joins the accessibility bus")
        _wait_tree(s, lambda r: any(a.get("name") == "gimp" and a.find("frame") is not None for a in r),
                   "GIMP's frame", timeout=120)
        g.launch(["gnome-terminal"])
        _wait_tree(s, lambda r: r.find(".//terminal") is not None, "gnome-terminal's terminal", timeout=60)
        # /terminal is None until its window is active and its terminal focused
        wait_until(lambda: g.terminal() is not None, 60, "gnome-terminal to have the focus", every=0.5)
        _type(g, "echo drums-$((6*7))\n")
        wait_until(lambda: "drums-42" in (g.terminal() or ""), 60, "/terminal to show the command's output",
                   every=0.5)
        body, root = _wait_tree(s, lambda r: True, "the tree")
        _check_form(body["AT"], root)
        names = [a.get("name") for a in root]
        assert "gimp" in names and "gnome-terminal-server" in names, names
        _latency(s, "GIMP + gnome-terminal", n=3)
    finally:
        client.destroy(s["id"])


def test_siblings_each_have_their_own_tree(client):
    s = client.create(desktop_spec(image=IMAGE, extra_programs=[WRITER]))
    made = [s]
    snap = None
    try:
        _wait_tree(s, lambda r: _focused_paragraph(r) is not None, "Writer's focused paragraph")
        _type(_guest(s), "common")
        _wait_tree(s, lambda r: _para_text(r) == "common", "the typed text")
        snap = client.checkpoint(s["id"], leave_running=False)
        made = client.restore(snap["id"], count=2)
        words = {}
        for sib, word in zip(made, ("alpha", "beta"), strict=True):
            _type(_guest(sib), "-" + word)
            words[sib["id"]] = "common-" + word
        for sib in made:
            want = words[sib["id"]]
            _wait_tree(sib, lambda r, want=want: _para_text(r) == want, want)
            ps = _guest(sib).execute("ps -eo args", shell=True).output
            # each sibling restored its own bus and registry (nothing was started after the restore)
            assert "at-spi-bus-launcher" in ps and "at-spi2-registryd" in ps and "accessibility.conf" in ps, ps
    finally:
        for m in made:
            client.destroy(m["id"])
        if snap is not None:
            client.delete_snapshot(snap["id"])


def test_hostile_app_cannot_break_the_tree(client, tmp_path):
    s = client.create(desktop_spec(image=IMAGE, extra_programs=[WRITER]))
    try:
        g = _guest(s)
        _wait_tree(s, lambda r: _focused_paragraph(r) is not None, "Writer's focused paragraph")
        g.upload("/tmp/a11y_hostile.py", HOSTILE.read_bytes())
        for mode in ("frozen", "big"):
            g.launch(["python3", "/tmp/a11y_hostile.py", mode, f"/tmp/hostile-{mode}.ready"])
        wait_until(lambda: g.execute("ls /tmp/hostile-frozen.ready /tmp/hostile-big.ready", shell=True).returncode == 0,
                   60, "the hostile apps to register", every=0.2)
        t0 = time.monotonic()
        body = _get_tree(s, timeout=a11y_atspi.WALK_SECONDS + 60)  # answers; never hangs
        took = time.monotonic() - t0
        xml = body["AT"]
        root = ET.fromstring(xml)  # valid XML (lxml parses it below, in OSWorld's metric)
        _check_form(xml, root)
        assert body["truncated"], ("the endless tree was not cut", {k: v for k, v in body.items() if k != "AT"},
                                   [a.get("name", "")[:40] for a in root])
        assert body["nodes"] <= a11y_atspi.MAX_NODES + 1 and len(list(root.iter())) == body["nodes"] + 1
        assert len(xml) < 2 * a11y_atspi.MAX_BYTES
        names = [a.get("name") for a in root]
        assert "soffice" in names, names  # the real application is all there
        assert root.find(".//document-text") is not None
        evil = [n for n in names if n.startswith("evil-")]
        assert all(any(n.startswith(m) for n in evil) for m in ("evil-frozen", "evil-big")), names
        # names keep what XML can carry: markup and quotes as text, control characters dropped
        assert evil and all(n.endswith('evil<app name="x">&amp;\'"]]><!--') for n in evil), evil
        assert _linearize(xml, tmp_path).startswith("tag\tname\ttext")
        assert _check_metric(xml, [{"xpath": "//application[@name='soffice']//document-text"}], tmp_path) == 1.0
        print(f"\nhostile apps: reply in {took:.1f} s, {body['nodes']} nodes, {len(xml)} characters, "
              f"cut: {body['truncated']}")
        assert len(g.screenshot()) > 1000  # the guest goes on serving
        pids = g.execute("cat /tmp/hostile-frozen.ready /tmp/hostile-big.ready", shell=True).output.split()
        assert g.execute(["kill", *pids]).returncode == 0
        body, root = _wait_tree(s, lambda r: not any((a.get("name") or "").startswith("evil-") for a in r),
                                "the tree without the hostile apps")
        assert body["truncated"] is None and root.find(".//document-text") is not None
    finally:
        client.destroy(s["id"])
