"""The accessibility tree's XML, written as OSWorld's guest writes it (``lxml.etree.tostring``).

The root declares the eight ``accessibility.ubuntu.example.org`` namespaces (prefixes ``st``,
``attr``, ``cp``, ``doc``, ``docattr``, ``txt``, ``val``, ``act``); attributes are double-quoted
with ``& < > "`` and tab/newline/carriage return escaped, text with ``& < >`` and carriage return
escaped, and an element with neither text nor children is self-closed. Whatever an app supplies is
made safe here: tags and attribute local names become valid XML names (characters outside
``[A-Za-z0-9_.-]`` become ``-``, a name not starting with a letter or ``_`` gets an ``x-`` prefix),
characters XML 1.0 cannot carry are removed, and a repeated attribute keeps its first value.
"""
from __future__ import annotations

import re

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
_PREFIX = {uri: p for p, uri in NS.items()}

# Characters XML 1.0 cannot carry at all.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]")
_ATTR_ESC = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
                           "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})
_TEXT_ESC = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})


def clean(s: object) -> str:
    """``s`` as text XML 1.0 can carry."""
    return _BAD_XML.sub("", "" if s is None else str(s))


def xml_name(name: str, default: str = "unknown") -> str:
    """A valid XML (NCName) name for ``name``."""
    t = _NAME_BAD.sub("-", name or "") or default
    return t if (t[0].isalpha() or t[0] == "_") else "x-" + t


def qname(key: str) -> str:
    """``{uri}local`` -> ``prefix:local`` for our namespaces; a plain name is made valid as it is."""
    if key.startswith("{") and "}" in key:
        uri, local = key[1:].split("}", 1)
        prefix = _PREFIX.get(uri)
        if prefix:
            return f"{prefix}:{xml_name(local, 'x')}"
    return xml_name(key, "x")


def st(name: str) -> str:
    return "{%s}%s" % (NS["st"], name)


def at(name: str) -> str:
    return "{%s}%s" % (NS["attr"], name)


def cp(name: str) -> str:
    return "{%s}%s" % (NS["cp"], name)


def val(name: str) -> str:
    return "{%s}%s" % (NS["val"], name)


def act(name: str) -> str:
    return "{%s}%s" % (NS["act"], name)


class Node:
    """One element: tag (made valid), attributes by ``{uri}local`` or plain name, text, children."""

    __slots__ = ("tag", "attrs", "text", "children")

    def __init__(self, tag: str, attrs: dict[str, str] | None = None, text: str = "") -> None:
        self.tag = xml_name(tag.strip() if tag else "")
        self.attrs = attrs or {}
        self.text = text
        self.children: list[Node] = []

    def write(self, out: list[str], root: bool = False) -> None:
        # iterative, so a deep tree cannot exhaust Python's stack
        stack: list[tuple[Node, bool]] = [(self, root)]
        while stack:
            node, first = stack.pop()
            if first is None:  # type: ignore[comparison-overlap]  # closing marker
                out.append(f"</{node.tag}>")
                continue
            out.append("<" + node.tag)
            if first:
                for p, u in NS.items():
                    out.append(f' xmlns:{p}="{u}"')
            seen: set[str] = set()
            for k, v in node.attrs.items():
                q = qname(k)
                if q in seen:
                    continue
                seen.add(q)
                out.append(f' {q}="{clean(v).translate(_ATTR_ESC)}"')
            text = clean(node.text) if node.text else ""
            if not node.children and not text:
                out.append("/>")
                continue
            out.append(">")
            if text:
                out.append(text.translate(_TEXT_ESC))
            stack.append((node, None))  # type: ignore[arg-type]
            for c in reversed(node.children):
                stack.append((c, False))

    def tostring(self) -> str:
        out: list[str] = []
        self.write(out, root=True)
        return "".join(out)
