"""The host's side of an accessibility tree: a desktop's XML made safe to hand to an agent.

The tree comes from inside the desktop, where an agent has root and may replace the guest server, so
the host contains it before it reaches the agent's code: OSWorld's agents (``mm_agents``'
``judge_node``, under ``linearize_accessibility_tree`` and ``tag_screenshot``) call ``eval`` on
every ``cp:screencoord`` and ``cp:size`` value, so a value that is not ``(int, int)`` is removed; a
document with a DOCTYPE (entities) or that does not parse becomes an empty ``desktop-frame``; and a
tree longer than the caller allows is cut at an element boundary (a prefix of the document in
document order), so what the agent gets still parses (a limit below the empty desktop's
``len(EMPTY)`` gives ""). A tree that needs none of this is returned as it came, character for
character.
"""
from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .a11y_xml import NS, Node

log = logging.getLogger("drums.osworld.a11y")

_COMPONENT = "{%s}" % NS["cp"]
_COORD = re.compile(r"\(-?\d{1,10}, -?\d{1,10}\)")
EMPTY = Node("desktop-frame").tostring()


@dataclass
class Contained:
    xml: str
    removed: list[str] = field(default_factory=list)  # what was taken out, for the log
    cut: bool = False


def contain(xml: str, max_chars: int) -> Contained:
    """``xml`` as an agent may read it (see the module's docstring)."""
    if "<!DOCTYPE" in xml or "<!ENTITY" in xml:
        return Contained(EMPTY, ["a DOCTYPE"])
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return Contained(EMPTY, [f"XML that does not parse ({exc})"])
    removed: list[str] = []
    for el in root.iter():
        for key in [k for k in el.attrib if k.startswith(_COMPONENT)]:
            if not _COORD.fullmatch(el.attrib[key]):
                removed.append(f"{el.tag} {key[len(_COMPONENT):]}={el.attrib[key][:40]!r}")
                del el.attrib[key]
    if not removed and len(xml) <= max_chars:
        return Contained(xml)
    out, cut = _write(root, max_chars)
    if len(out) > max_chars:  # too small a limit for even the empty desktop
        out, cut = "", True
    if removed or cut:
        log.warning("accessibility tree contained: %d attribute(s) removed%s", len(removed),
                    f", cut to {len(out)} of {len(xml)} characters" if cut else "")
    return Contained(out, removed, cut)


def _write(root: ET.Element, max_chars: int) -> tuple[str, bool]:
    """Serialize ``root`` in OSWorld's form, keeping elements in document order while they fit."""
    top = _node(root)
    used = len(top.tostring())
    made = {id(root): top}
    cut = False
    stack = [(child, root) for child in reversed(list(root))]
    while stack:
        el, parent_el = stack.pop()
        node = _node(el)
        parent = made[id(parent_el)]
        size = _leaf_size(node)
        if not parent.children and not parent.text:
            size += len(parent.tag) + 2  # "<p/>" becomes "<p>...</p>"
        if used + size > max_chars:
            cut = True
            break
        used += size
        parent.children.append(node)
        made[id(el)] = node
        stack.extend((child, el) for child in reversed(list(el)))
    return top.tostring(), cut


def _leaf_size(node: Node) -> int:
    out: list[str] = []
    node.write(out)
    return len("".join(out))


def _node(el: ET.Element) -> Node:
    tag = el.tag.split("}", 1)[1] if el.tag.startswith("{") else el.tag
    return Node(tag, dict(el.attrib), el.text or "")
