"""Where OSWorld's task set is for the tests: ``../shared/osworld-tasks`` next to the checkout.

A fresh clone elsewhere (``git clone . /tmp/x``) finds it next to the checkout it was cloned from
(its ``origin``). ``DRUMS_OSWORLD_TASKS`` overrides both. Tests that need it fail with this
message when it is nowhere.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import REPO


def _origin_checkout() -> Path | None:
    out = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"], capture_output=True,
                         text=True, check=False)
    url = out.stdout.strip()
    return Path(url) if url.startswith("/") else None


def candidates() -> list[Path]:
    found = [Path(os.environ["DRUMS_OSWORLD_TASKS"])] if os.environ.get("DRUMS_OSWORLD_TASKS") else []
    found.append(REPO.parent / "shared" / "osworld-tasks")
    origin = _origin_checkout()
    if origin is not None:
        found.append(origin.parent / "shared" / "osworld-tasks")
    return found


def osworld_tasks_dir() -> Path:
    """The task set's root (it holds ``examples/<domain>/<id>.json``); the first candidate when none
    exists, so that a test's own check names where it looked."""
    paths = candidates()
    return next((p for p in paths if (p / "examples").is_dir()), paths[0])


def where_looked() -> str:
    return ", ".join(str(p) for p in candidates()) + " (set DRUMS_OSWORLD_TASKS)"
