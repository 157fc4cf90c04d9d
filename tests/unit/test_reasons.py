"""The registry of reasons (``drums_core.reasons``): every reason Drums raises is a ``Reason`` of it,
never a string literal, and every registry entry is documented, raised somewhere (or says who uses
it) and in README.md's table. Reads the source with ``ast``; no root needed."""
from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from drums_core import errors
from drums_core.reasons import Reason, Retry, markdown

REPO = Path(__file__).resolve().parents[2]
REGISTRY = REPO / "drums_core" / "reasons.py"
FILES = sorted(p for pkg in ("drums_core", "drums_osworld") for p in (REPO / pkg).rglob("*.py") if p != REGISTRY)
README_BEGIN, README_END = "<!-- reasons:begin -->", "<!-- reasons:end -->"
REGENERATE = "python -m drums_core.reasons --markdown"
# Functions whose positional ``reason`` is a sentence for people (why a session, snapshot or node is
# marked broken or down, why an accessibility walk stopped), not a reason code.
MESSAGE_REASONS = {"_mark_broken", "mark_broken", "_mark_down", "note"}


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in FILES}


TREES = _trees()


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:120]}"


def _registry_name(node: ast.AST) -> str | None:
    """``X`` of a ``Reason.X`` (``drums_core.reasons.Reason.X`` too), else None."""
    if isinstance(node, ast.Attribute) and re.fullmatch(r"[A-Z][A-Z0-9_]*", node.attr):
        base = node.value
        if (isinstance(base, ast.Name) and base.id == "Reason") or \
                (isinstance(base, ast.Attribute) and base.attr == "Reason"):
            return node.attr
    return None


def _literals(node: ast.AST) -> list[ast.AST]:
    """The string literals (plain or f-strings) an expression may evaluate to: itself, or a branch
    of ``a if c else b`` / ``a or b`` (a literal in a condition is not a reason)."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return [node]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [n for v in node.values for n in _literals(v)]
    return []


def _reason_values() -> list[tuple[Path, ast.AST]]:
    """Every expression given as a reason: ``reason=`` keywords, ``default_reason`` class attributes,
    the default of a ``reason`` field, and positional arguments of functions taking ``reason``
    positionally (those of :data:`MESSAGE_REASONS` aside)."""
    positional: dict[str, int] = {}
    for tree in TREES.values():
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] + [tree]:
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef):
                    continue
                names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                if "reason" not in names or fn.name in MESSAGE_REASONS:
                    continue
                index = names.index("reason") - (1 if names and names[0] in ("self", "cls") else 0)
                positional[cls.name if fn.name == "__init__" and isinstance(cls, ast.ClassDef) else fn.name] = index
    found = []
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                found += [(path, k.value) for k in node.keywords if k.arg == "reason"]
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in positional and len(node.args) > positional[name]:
                    found.append((path, node.args[positional[name]]))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id in ("default_reason", "reason") for t in targets):
                    found.append((path, node.value))
    return found


def test_the_scan_sees_the_raise_sites():
    values = _reason_values()
    assert len(values) > 250, len(values)  # the walk found the engine's and the adapters' raises
    assert sum(1 for _, v in values if _registry_name(v)) > 250


def test_no_reason_is_a_string_literal():
    bad = [_where(p, v) for p, v in _reason_values() if _literals(v)]
    assert not bad, ("reasons given as string literals (use drums_core.reasons.Reason.X; add the code to "
                     f"the registry if it is new): {bad}")


def test_every_reason_named_exists_in_the_registry():
    names = {(p, n): _registry_name(n) for p, tree in TREES.items() for n in ast.walk(tree) if _registry_name(n)}
    unknown = [_where(p, n) for (p, n), name in names.items() if name not in Reason.__members__]
    assert not unknown, f"Reason.X names that are not in drums_core/reasons.py: {unknown}"


def test_callers_branch_on_registry_names_not_literals():
    bad = []
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "reason" for s in sides) \
                        and any(_literals(s) for s in sides):
                    bad.append(_where(path, node))
    assert not bad, f"comparisons of a reason with a string literal (compare with Reason.X): {bad}"


def test_errors_take_reason_by_keyword_only():
    # a positional string after the message could not be a reason unnoticed by the scan above
    for cls in (errors.DrumsError, *errors._BY_CODE.values()):
        param = inspect.signature(cls).parameters["reason"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, cls


def test_every_entry_is_documented():
    assert len(Reason) > 100
    for r in Reason:
        assert r.name == r.value, f"{r.name}: the code must be its name ({r.value!r})"
        assert r.meaning.strip() and r.meaning.rstrip().endswith("."), f"{r}: meaning must be a sentence"
        assert isinstance(r.retry, Retry), r
        assert r.raised_as and all(re.fullmatch(r"[A-Z][A-Za-z]+", c) for c in r.raised_as), r
        assert isinstance(r.until, str) and isinstance(r.note, str), r
    assert {r.retry for r in Reason} == set(Retry)


def test_every_entry_is_raised_somewhere_or_says_who_uses_it():
    used = {_registry_name(n) for tree in TREES.values() for n in ast.walk(tree)}
    dead = [r.name for r in Reason if r.name not in used and not r.note]
    assert not dead, (f"registry entries nothing in drums_core or drums_osworld uses: {dead}; remove them, or "
                      "give them a note saying who uses them (clients, tests)")


def _ancestry() -> dict[str, set[str]]:
    """Class name -> the names of it and its bases, for the classes of the packages (by name)."""
    bases = {c.name: {b.id if isinstance(b, ast.Name) else b.attr for b in c.bases
                      if isinstance(b, (ast.Name, ast.Attribute))}
             for tree in TREES.values() for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}

    def up(name: str, seen: set[str]) -> set[str]:
        if name in seen:
            return seen
        seen.add(name)
        for b in bases.get(name, ()):
            up(b, seen)
        return seen
    return {name: up(name, set()) for name in bases}


def test_raised_as_names_the_classes_raising_it():
    """Where the class a reason is raised with is written at the site (``Unavailable(...,
    reason=Reason.X)``, a ``default_reason`` of a class), the registry names it or one of its bases."""
    ancestry = _ancestry()
    wrong = []
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                cls = "InvalidArgument" if node.func.id == "Arg" else node.func.id  # protocol's argument check
                pairs += [(cls, k.value) for k in node.keywords if k.arg == "reason"]
            elif isinstance(node, ast.ClassDef):
                pairs += [(node.name, s.value) for s in node.body if isinstance(s, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == "default_reason" for t in s.targets)]
            for cls, value in pairs:
                name = _registry_name(value)
                if name in Reason.__members__ and cls in ancestry:
                    if not ancestry[cls] & set(Reason[name].raised_as):
                        wrong.append(f"{_where(path, node)[:90]}: {cls} not in {Reason[name].raised_as}")
    assert not wrong, f"raised_as of the registry misses the class: {wrong}"


def test_a_reason_travels_and_prints_as_its_plain_code():
    exc = errors.Unavailable("no room", reason=Reason.STORE_FULL)
    assert exc.reason == "STORE_FULL" and str(exc) == "no room [STORE_FULL]"
    wire = json.loads(json.dumps(exc.to_wire()))
    assert wire == {"code": "UNAVAILABLE", "reason": "STORE_FULL", "message": "no room", "detail": None}
    back = errors.from_wire(wire)
    assert type(back) is errors.Unavailable and back.reason is Reason.STORE_FULL
    other = errors.from_wire({"code": "NOT_FOUND", "reason": "SOMETHING_NEWER", "message": "m"})
    assert other.reason == "SOMETHING_NEWER"
    assert errors.Busy("b").reason is Reason.SESSION_BUSY and f"{Reason.SESSION_BUSY}" == "SESSION_BUSY"


def _readme_table() -> str:
    text = (REPO / "README.md").read_text()
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1, \
        f"README.md needs one {README_BEGIN} ... {README_END} block (its table of reasons)"
    return text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip("\n") + "\n"


def test_readme_table_is_the_registry():
    assert _readme_table() == markdown(), (
        f"README.md's table of reasons differs from the registry: regenerate it with `{REGENERATE}` and "
        f"paste the output between {README_BEGIN} and {README_END}")


@pytest.mark.parametrize("argv,code", [(["--markdown"], 0), ([], 2)])
def test_markdown_command(argv, code, capsys):
    from drums_core.reasons import main

    assert main(argv) == code
    if code == 0:
        assert capsys.readouterr().out == markdown()
