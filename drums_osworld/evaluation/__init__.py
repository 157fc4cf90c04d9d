"""Task setup and scoring without OSWorld installed.

Drums' own implementations of the parts of OSWorld 1.0.2 its offline tasks use: the setup steps
(:func:`run_setup`, :func:`run_task_setup`), the getters (:data:`GETTERS`), the metrics
(:data:`METRICS`) and ``DesktopEnv.evaluate()`` (:func:`evaluate`). They talk to the guest only
through a :class:`~drums_osworld.guest.client.GuestClient` (or any object with its methods) and agree
with OSWorld's code on the same inputs (``tests/test_evaluation_parity.py``).

Typical use::

    from drums_osworld.guest.client import GuestClient
    from drums_osworld.evaluation import run_task_setup, evaluate

    guest = GuestClient("169.254.0.2")
    run_task_setup("tasks/os/e0df059f-28a6-4169-924f-b9623e7184cc.json", guest)
    ...                                   # the agent acts
    score = evaluate(task, guest, last_action="DONE")
"""
from __future__ import annotations

import os
from typing import Any

from drums_osworld.evaluation.evaluate import DEFAULT_CACHE_DIR, evaluate, task_cache_dir
from drums_osworld.evaluation.getters import GETTERS, EvalContext
from drums_osworld.evaluation.metrics import METRICS
from drums_osworld.evaluation.setup import (
    SUPPORTED_STEP_TYPES,
    DownloadNotCached,
    SetupError,
    download_cache_path,
    run_setup,
    substitute_placeholders,
)
from drums_osworld.tasks import Task, load_task

__all__ = [
    "DEFAULT_CACHE_DIR",
    "GETTERS",
    "METRICS",
    "SUPPORTED_STEP_TYPES",
    "DownloadNotCached",
    "EvalContext",
    "SetupError",
    "download_cache_path",
    "evaluate",
    "run_setup",
    "run_task_setup",
    "substitute_placeholders",
    "task_cache_dir",
]


def run_task_setup(task: Task | dict[str, Any] | str | os.PathLike[str], guest: Any, *,
                   cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR, client_password: str = "password",
                   screen_size: tuple[int, int] = (1920, 1080), strict: bool = False,
                   probe_timeout: float | None = 100.0) -> Task:
    """Validate ``task`` and run its ``config`` steps (``DesktopEnv.reset``'s setup); the task."""
    task = load_task(task, require_drums_support=True)
    run_setup(task.config, guest, task_cache_dir=task_cache_dir(task, cache_dir),
              client_password=client_password, screen_size=screen_size, strict=strict,
              probe_timeout=probe_timeout)
    return task
