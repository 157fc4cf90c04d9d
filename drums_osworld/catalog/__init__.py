"""OSWorld's task set, classified: which tasks this machine can run, and what each one needs.

    python -m drums_osworld.catalog build --tasks ../shared/osworld-tasks   # writes the list
    python -m drums_osworld.catalog check --tasks ../shared/osworld-tasks   # the list is current?
    python -m drums_osworld.catalog show [--image NAME] [--offline]         # a table

The list (``osworld_offline.json`` next to this file, generated and committed) has one entry per
task of OSWorld's ``evaluation_examples`` (all 369): ``offline`` (needs nothing from the
internet, runs on desktop-env 1.0.2), every ``exclusions`` reason otherwise (:mod:`.rules`),
``infeasible`` (evaluator ``infeasible``: scored without any application), ``vs_code`` (needs VS
Code, which Debian does not package: reported apart) and the applications it needs
(:mod:`.apps`). :func:`image_fit` says which of them an image lacks.

Modules: :mod:`.rules` (why a task needs the internet), :mod:`.apps` (applications and images).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .apps import APPS, image_packages, missing_apps, task_apps
from .rules import CODES, Exclusion, exclusions, fingerprint, is_infeasible

__all__ = [
    "APPS", "CODES", "LIST_PATH", "Entry", "Exclusion", "build", "classify", "exclusions", "image_fit",
    "load_list", "read_tasks", "task_apps",
]

LIST_PATH = Path(__file__).with_name("osworld_offline.json")
DESKTOP_ENV = "1.0.2"
FORMAT = 1


@dataclass
class Entry:
    """One task of the list."""

    domain: str
    id: str
    offline: bool
    infeasible: bool
    vs_code: bool
    exclusions: list[dict[str, str]] = field(default_factory=list)
    apps: dict[str, list[str]] = field(default_factory=dict)
    fingerprint: str = ""

    @property
    def key(self) -> str:
        return f"{self.domain}/{self.id}"

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "id": self.id, "offline": self.offline, "infeasible": self.infeasible,
                "vs_code": self.vs_code, "exclusions": self.exclusions, "apps": self.apps,
                "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Entry":
        return cls(domain=str(d["domain"]), id=str(d["id"]), offline=bool(d["offline"]),
                   infeasible=bool(d["infeasible"]), vs_code=bool(d["vs_code"]),
                   exclusions=list(d.get("exclusions") or []), apps=dict(d.get("apps") or {}),
                   fingerprint=str(d.get("fingerprint", "")))


def classify(task: Mapping[str, Any], domain: str) -> Entry:
    """The list entry of one task (a parsed OSWorld task JSON)."""
    ex = exclusions(task)
    apps = task_apps(task)
    return Entry(domain=domain, id=str(task.get("id", "")), offline=not ex, infeasible=is_infeasible(task),
                 vs_code=domain == "vs_code" or "vscode" in apps["all"],
                 exclusions=[e.to_json() for e in ex], apps=apps, fingerprint=fingerprint(task))


def read_tasks(root: str | os.PathLike[str]) -> list[tuple[str, Path, dict[str, Any]]]:
    """``(domain, path, task)`` of every ``examples/<domain>/<id>.json`` under ``root`` (OSWorld's
    ``evaluation_examples`` layout), sorted; ``ValueError`` when there is none or one is not JSON."""
    base = Path(root)
    examples = base / "examples" if (base / "examples").is_dir() else base
    files = sorted(examples.glob("*/*.json"))
    if not files:
        raise ValueError(f"no task files under {examples} (expected examples/<domain>/<id>.json)")
    out = []
    for p in files:
        try:
            task = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{p}: not a readable task JSON: {exc}") from exc
        if not isinstance(task, dict) or task.get("id") != p.stem:
            raise ValueError(f"{p}: not an OSWorld task (its id must be the file name)")
        out.append((p.parent.name, p, task))
    return out


def build(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The list document for the task set under ``root``."""
    entries = [classify(task, domain) for domain, _, task in read_tasks(root)]
    offline = [e for e in entries if e.offline]
    by_code: Counter[str] = Counter()
    for e in entries:
        for code in {x["code"] for x in e.exclusions}:
            by_code[code] += 1
    counts = {
        "tasks": len(entries),
        "offline": len(offline),
        "excluded": len(entries) - len(offline),
        "excluded_by_code": dict(sorted(by_code.items())),
        "offline_by_domain": dict(sorted(Counter(e.domain for e in offline).items())),
        "offline_infeasible": sum(e.infeasible for e in offline),
        "offline_vs_code": sum(e.vs_code for e in offline),
        "offline_feasible_outside_vs_code": sum(1 for e in offline if not e.infeasible and not e.vs_code),
    }
    return {"format": FORMAT, "desktop_env": DESKTOP_ENV,
            "generated_by": "python -m drums_osworld.catalog build --tasks <evaluation_examples>",
            "rules": "drums_osworld/catalog/rules.py (codes: " + ", ".join(CODES) + ")",
            "counts": counts, "tasks": [e.to_json() for e in entries]}


def load_list(path: str | os.PathLike[str] | None = None) -> list[Entry]:
    """The committed list (or the one at ``path``)."""
    doc = json.loads(Path(path or LIST_PATH).read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path or LIST_PATH}: list format {doc.get('format')!r}, expected {FORMAT}")
    return [Entry.from_json(d) for d in doc["tasks"]]


def image_fit(entries: Iterable[Entry], image: str, store: str | os.PathLike[str] | None = None
              ) -> dict[str, dict[str, str]]:
    """``{"<domain>/<id>": {app: why}}`` for each task needing an application the image lacks."""
    pkgs = image_packages(image, store)
    out = {}
    for e in entries:
        missing = missing_apps(e.apps.get("all", []), pkgs)
        if missing:
            out[e.key] = missing
    return out
