"""Public names that load on first access: a package's ``__getattr__`` and ``__dir__`` (PEP 562).

    __getattr__, __dir__ = lazy_exports(globals(), {"Client": "drums_core.client"})

keeps ``import <package>`` light: a name's module is imported when the name is first read, and the
value is then stored in the package so later reads do not come back here.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(namespace: dict[str, Any], table: dict[str, str]) -> tuple[Callable[[str], Any],
                                                                           Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module whose globals are ``namespace``; ``table`` maps each
    lazily loaded public name to the module it lives in."""
    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later accesses do not come here again
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
