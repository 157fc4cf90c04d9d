"""The host's containment of a desktop's accessibility tree (drums_osworld.guest.a11y_guard).

The threat is shown with OSWorld's own agent code: ``mm_agents``' ``filter_nodes`` (under
``linearize_accessibility_tree``) evals ``cp:screencoord``/``cp:size``, so a desktop that controls
its guest can make it run code on the agent's host; after ``contain`` the same call runs nothing.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from tests.support.osworld_harness import run_osworld

from drums_osworld.guest.a11y_guard import EMPTY, contain
from drums_osworld.guest.a11y_xml import NS, Node, cp, st

# filter_nodes over the raw tree (did the payload run?), then over the contained one
TWICE = """
import os
import xml.etree.ElementTree as ET
from mm_agents.accessibility_tree_wrap.heuristic_retrieve import filter_nodes
filter_nodes(ET.fromstring(open(RAW).read()), platform="ubuntu")
ran_raw = os.path.exists(FLAG)
if ran_raw:
    os.unlink(FLAG)
kept = [n.get("name") for n in filter_nodes(ET.fromstring(open(SAFE).read()), platform="ubuntu")]
emit([ran_raw, os.path.exists(FLAG), kept])
"""


def _tree(n: int = 3) -> str:
    root = Node("desktop-frame")
    app = Node("application", {"name": "app"})
    root.children.append(app)
    for i in range(n):
        app.children.append(Node("push-button", {"name": f"b{i}", st("showing"): "true", st("visible"): "true",
                                                 st("enabled"): "true", cp("screencoord"): f"({i}, 2)",
                                                 cp("size"): "(10, 10)"}, f"text {i} <&>"))
    return root.tostring()


def test_a_good_tree_is_returned_as_it_came():
    xml = _tree()
    got = contain(xml, 10**6)
    assert got.xml is xml and not got.removed and not got.cut


def test_code_in_coordinates_is_removed_before_an_agent_evals_it(tmp_path):
    flag = tmp_path / "ran"
    payload = f"[__import__('pathlib').Path({str(flag)!r}).write_text('x'), (1, 1)][1]"
    xml = _tree().replace('cp:screencoord="(1, 2)"', f'cp:screencoord="{payload}"')
    # the same attack under another prefix bound to the component namespace
    xml = xml.replace("<desktop-frame ", f'<desktop-frame xmlns:zz="{NS["cp"]}" ', 1)
    xml = xml.replace('cp:size="(10, 10)"', f'zz:size="{payload}"', 1)
    raw = tmp_path / "raw.xml"
    raw.write_text(xml)
    got = contain(xml, 10**6)
    assert len(got.removed) == 2 and not got.cut
    safe = tmp_path / "safe.xml"
    safe.write_text(got.xml)
    # one OSWorld interpreter (its import is the test's cost): the raw tree, then the contained one
    ran_raw, ran_safe, kept = run_osworld(f"FLAG, RAW, SAFE = {str(flag)!r}, {str(raw)!r}, {str(safe)!r}\n" + TWICE)
    assert ran_raw, "OSWorld's filter_nodes did not eval the desktop's value (the threat is gone?)"
    assert not ran_safe and not flag.exists()
    assert kept == ["b2"]  # b0 lost its size, b1 its position: filter_nodes drops them; b2 is intact
    assert ET.fromstring(got.xml).find(".//push-button").get("name") == "b0"


def test_a_long_tree_is_cut_at_an_element_and_still_parses():
    xml = _tree(2000)
    for limit in (len(EMPTY), 5000, 100_000, len(xml) - 1):
        got = contain(xml, limit)
        assert got.cut and len(got.xml) <= limit
        cut = list(ET.fromstring(got.xml).iter())
        full = list(ET.fromstring(xml).iter())
        assert [(e.tag, e.attrib, e.text) for e in cut] == [(e.tag, e.attrib, e.text) for e in full[:len(cut)]]
        if limit > 1000:
            assert len(cut) > 2
    assert contain(xml, len(EMPTY) - 1).xml == ""


def test_entities_and_garbage_become_an_empty_desktop():
    bomb = ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
            '<desktop-frame name="&b;"/>')
    for xml in (bomb, "<desktop-frame><unclosed>", "not xml at all"):
        got = contain(xml, 10**6)
        assert got.xml == EMPTY and got.removed
        assert ET.fromstring(got.xml).tag == "desktop-frame"
