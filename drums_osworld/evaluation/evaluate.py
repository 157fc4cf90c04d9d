"""Score a task the way OSWorld 1.0.2's ``DesktopEnv.evaluate()`` does, without OSWorld.

The order and the edge cases are OSWorld's (``desktop_env/desktop_env.py``, ``evaluate`` and
``_set_evaluator_info``):

1. ``postconfig`` steps run first (even for infeasible tasks).
2. ``func == "infeasible"``: 1 when the last action was ``"FAIL"``, else 0. For any other task a
   last action of ``"FAIL"`` scores 0. (Only the string ``"FAIL"`` counts, not a dict action.)
3. A single metric: ``metric(result, expected, **options)``, or ``metric(result, **options)`` when
   there is no (or an empty) ``expected``. A ``FileNotFoundError`` from the *result* getter scores 0;
   every other exception, from any getter or metric, propagates.
4. A list of metrics with ``conj`` ``"and"`` (default): the first metric scoring 0 (or a
   ``FileNotFoundError`` from a result getter) returns 0, else the mean. With ``"or"``: the first
   metric scoring 1 returns 1, else the maximum (a ``FileNotFoundError`` from a result getter then
   leaves the previous metric's result in place, as in OSWorld).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from drums_osworld.evaluation.getters import GETTERS, EvalContext
from drums_osworld.evaluation.metrics import METRICS
from drums_osworld.evaluation.setup import run_setup
from drums_osworld.tasks import Task, load_task

logger = logging.getLogger("drums.osworld.evaluate")

__all__ = ["DEFAULT_CACHE_DIR", "evaluate", "task_cache_dir"]

#: Where task files are cached, one directory per task id (OSWorld's ``DesktopEnv(cache_dir=)``).
DEFAULT_CACHE_DIR = Path(os.environ.get("DRUMS_TASK_CACHE", "~/.cache/drums/tasks")).expanduser()


def task_cache_dir(task: Task, cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR) -> Path:
    """``<cache_dir>/<task id>``, created if missing (OSWorld's ``env.cache_dir``)."""
    path = Path(cache_dir) / task.id
    path.mkdir(parents=True, exist_ok=True)
    return path


def _resolve(ev: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``_set_evaluator_info``: metric(s), result getter(s), expected getter(s), options."""
    metric: Any = [METRICS[f] for f in ev["func"]] if isinstance(ev["func"], list) else METRICS[ev["func"]]
    if "result" in ev and len(ev["result"]) > 0:
        result_getter: Any = [GETTERS[r["type"]] for r in ev["result"]] if isinstance(ev["result"], list) \
            else GETTERS[ev["result"]["type"]]
    else:
        result_getter = [None] * len(metric) if isinstance(metric, list) else None
    if "expected" in ev and len(ev["expected"]) > 0:
        expected_getter: Any = [GETTERS[e["type"]] if e else None for e in ev["expected"]] \
            if isinstance(ev["expected"], list) else GETTERS[ev["expected"]["type"]]
    else:
        expected_getter = [None] * len(metric) if isinstance(metric, list) else None
    if isinstance(ev.get("options", {}), list):
        options: Any = [opt if opt else {} for opt in ev["options"]]
    elif "options" in ev:
        options = ev["options"]
    elif isinstance(metric, list):
        options = [{}] * len(metric)
    else:
        options = {}
    return metric, result_getter, expected_getter, options


def evaluate(task: Task | dict[str, Any] | str | os.PathLike[str], guest: Any, last_action: Any = None, *,
             cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR, client_password: str = "password",
             screen_size: tuple[int, int] = (1920, 1080)) -> float:
    """The task's score for the current state of the desktop behind ``guest``.

    ``last_action`` is the last action the agent took (``None`` when it took none); only
    ``"FAIL"`` matters. ``cache_dir`` is the cache base: files go to ``<cache_dir>/<task id>``.
    ``client_password`` and ``screen_size`` fill the ``postconfig`` placeholders.
    Raises :class:`~drums_osworld.tasks.TaskError` for a task Drums cannot evaluate, and lets
    getter and metric errors through as OSWorld does.
    """
    task = load_task(task, require_drums_support=True)
    ev = task.evaluator
    ctx = EvalContext(guest=guest, cache_dir=str(task_cache_dir(task, cache_dir)))

    postconfig = ev.get("postconfig", [])
    run_setup(postconfig, guest, task_cache_dir=ctx.cache_dir, client_password=client_password,
              screen_size=screen_size)

    failed = last_action is not None and isinstance(last_action, str) and last_action == "FAIL"
    if ev["func"] == "infeasible":
        return 1.0 if failed else 0.0
    if failed:
        return 0.0

    metric, result_getter, expected_getter, options = _resolve(ev)

    if isinstance(metric, list):
        results: list[Any] = []
        conj = ev.get("conj", "and")
        for idx, m in enumerate(metric):
            try:
                config = ev["result"][idx]
                result_state = result_getter[idx](ctx, config)
            except FileNotFoundError:
                logger.error("File not found!")
                if conj == "and":
                    return 0.0
            if "expected" in ev and expected_getter and ev["expected"]:
                expected_state = expected_getter[idx](ctx, ev["expected"][idx])
                score = m(result_state, expected_state, **options[idx])
            else:
                score = m(result_state, **options[idx])
            if conj == "and" and float(score) == 0.0:
                return 0.0
            if conj == "or" and float(score) == 1.0:
                return 1.0
            results.append(score)
        return float(sum(results) / len(results) if conj == "and" else max(results))

    try:
        result_state = result_getter(ctx, ev["result"])
    except FileNotFoundError:
        logger.error("File not found!")
        return 0.0
    if "expected" in ev and expected_getter and ev["expected"]:
        expected_state = expected_getter(ctx, ev["expected"])
        score = metric(result_state, expected_state, **options)
    else:
        score = metric(result_state, **options)
    return float(score)
