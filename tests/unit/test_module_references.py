"""Every ``module.name`` the package reads off one of its own modules exists there.

Names move between modules (one of each, the layout by layer); ruff cannot see that
``common.progress`` is gone from ``common`` when ``common`` itself imports. This walks the package's
source: for each name bound to a drums module by an import, each ``alias.attr`` it reads must be an
attribute of that module once imported.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("drums_core", "drums_osworld")


def _module_aliases(path: Path, package: str) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            if not base.startswith(PACKAGES):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                if importlib.util.find_spec(base) is not None and _is_module(full):
                    aliases[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PACKAGES) and a.asname:
                    aliases[a.asname] = a.name
    return aliases


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_attributes_read_off_drums_modules_exist():
    missing = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts)
            package = name[: -len(".__init__")] if name.endswith(".__init__") else name.rsplit(".", 1)[0]
            aliases = _module_aliases(path, package)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    module = importlib.import_module(aliases[node.value.id])
                    if not hasattr(module, node.attr):
                        missing.append(f"{rel}.py:{node.lineno}: {aliases[node.value.id]} has no {node.attr}")
    assert not missing, "\n".join(missing)
