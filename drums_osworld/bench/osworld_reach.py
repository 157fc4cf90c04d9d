"""Which optional modules OSWorld's getters and metrics reach, and absent ones for the rest.

``import desktop_env.desktop_env`` imports every getter and metric module, and with them easyocr
(torch), librosa, OpenCV, scikit-image, SciPy, PyMuPDF, borb, Playwright, PyDrive and more. The
benchmark installs the real ones (``tests/osworld_harness.py``, ``EVALUATOR_DEPENDENCIES``); a
module may stay out only when no benchmarked task reaches it. :func:`reached` finds, statically,
the optional modules that the given getters and metrics use: their own code and the functions of
their module they call, transitively. :func:`install_absent` then lets the import of a missing,
unreached module succeed with a module whose every attribute raises ``ImportError`` naming it (so
a task that did reach it fails loudly as an evaluator error, never silently).

    python -m drums_osworld.bench.osworld_reach '{"getters": [...], "metrics": [...]}'

prints ``{"absent": [...], "reached": {module: [functions]}, "conflicts": [...]}`` (run in
OSWorld's interpreter; desktop_env is located, not imported).
"""
from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

#: Optional third-party modules desktop_env's evaluators import at module level.
OPTIONAL = ("easyocr", "librosa", "cv2", "skimage", "scipy", "acoustid", "fastdtw", "imagehash", "fitz",
            "borb", "playwright", "pydrive", "torch")


def absent(candidates=OPTIONAL) -> list[str]:
    return [m for m in candidates if importlib.util.find_spec(m) is None]


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec("desktop_env")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("desktop_env is not installed in this interpreter")
    return Path(list(spec.submodule_search_locations)[0]) / "evaluators" / name


def _exports(pkg: Path) -> dict[str, str]:
    """``{function name: module file}`` from a package ``__init__``'s ``from .x import ...``."""
    out: dict[str, str] = {}
    for node in ast.parse((pkg / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for a in node.names:
                out[a.asname or a.name] = str(pkg / f"{node.module}.py")
    return out


class _Module:
    def __init__(self, path: str) -> None:
        tree = ast.parse(Path(path).read_text())
        self.aliases: dict[str, str] = {}  # local name -> top-level module
        self.funcs: dict[str, ast.AST] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[(a.asname or a.name).split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = node.module.split(".")[0]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.funcs[node.name] = node

    def uses(self, func: str) -> set[str]:
        seen, todo, mods = set(), [func], set()
        while todo:
            f = todo.pop()
            if f in seen or f not in self.funcs:
                continue
            seen.add(f)
            for n in ast.walk(self.funcs[f]):
                if isinstance(n, ast.Name):
                    if n.id in self.aliases:
                        mods.add(self.aliases[n.id])
                    elif n.id in self.funcs:
                        todo.append(n.id)
        return mods


def reached(getters: list[str], metrics: list[str]) -> dict[str, list[str]]:
    """``{optional module: [getter/metric names using it]}`` for these getters (types) and metrics."""
    out: dict[str, list[str]] = {}
    cache: dict[str, _Module] = {}
    for kind, names, prefix in (("getters", getters, "get_"), ("metrics", metrics, "")):
        exports = _exports(_package_dir(kind))
        for name in sorted(set(names)):
            path = exports.get(prefix + name)
            if path is None:
                continue
            mod = cache.setdefault(path, _Module(path))
            for m in mod.uses(prefix + name) & set(OPTIONAL):
                out.setdefault(m, []).append(f"{kind[:-1]} {name}")
    return out


class _AbsentModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise ImportError(f"{self.__name__} is not installed (no benchmarked task reaches it, so the benchmark "
                          f"leaves it out); {self.__name__}.{attr} was used")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _AbsentModule(spec.name, "not installed: absent for the benchmark")
        m.__path__ = []
        return m

    def exec_module(self, module) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install_absent(names: list[str]) -> list[str]:
    """Absent modules for ``names`` that are really not installed; returns the ones installed."""
    todo = {n for n in names if importlib.util.find_spec(n) is None}
    if todo:
        sys.meta_path.append(_Finder(todo))  # last: a real installation always wins
    return sorted(todo)


def main(argv: list[str]) -> int:
    args = json.loads(argv[0]) if argv else {}
    gone = absent()
    reach = reached(list(args.get("getters") or []), list(args.get("metrics") or []))
    print(json.dumps({"absent": gone, "reached": reach, "conflicts": sorted(set(gone) & set(reach))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
