"""OSWorld's ``pyautogui`` action space: parsing an action and running it on a desktop's guest server.

An action is pyautogui code (a ``str``), one of :data:`SPECIAL_ACTIONS` (``"WAIT"``, ``"DONE"``,
``"FAIL"``), or a dict as OSWorld accepts it (``{"action_type": "DONE"}`` or ``{"command": code}``).
:func:`parse` turns one into an :class:`Action` or raises :class:`InvalidAction`; :func:`run` runs
one as OSWorld 1.0.2's ``DesktopEnv.step`` does; :func:`run_script` runs a list of them, all
parsed before any runs. The gym env (:mod:`drums_osworld.gym.env`) and the Ray node agent
(:mod:`drums_osworld.farm.node`) both act through this module.

Imports nothing heavy at module level: ``import drums_osworld`` and every guest server's start-up
import the gym env, which imports this module.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drums_core.errors import InvalidArgument
from drums_core.reasons import Reason

log = logging.getLogger("drums.osworld.actions")

__all__ = ["SPECIAL_ACTIONS", "Action", "InvalidAction", "fix_pyautogui_less_than", "parse", "parse_all", "run",
           "run_script"]

#: The actions that ``DesktopEnv.step`` treats specially rather than running as code.
SPECIAL_ACTIONS = ("WAIT", "DONE", "FAIL")
#: The special actions that end an episode (and a script).
TERMINAL_ACTIONS = ("DONE", "FAIL")
#: How much of a run's output and error an action's result keeps (the tail).
OUTPUT_TAIL = 4000


class InvalidAction(InvalidArgument, ValueError):
    """An action OSWorld would not run (reason ``BAD_ACTION``); nothing ran.

    An :class:`~drums_core.errors.InvalidArgument` (it crosses the Ray node's envelope as one) and
    a ``ValueError`` (what a gymnasium env raises for an action outside its space).
    """

    default_reason = Reason.BAD_ACTION


@dataclass(frozen=True)
class Action:
    """A parsed action: ``kind`` is ``"code"`` (with its pyautogui ``code``) or a special action."""

    kind: str
    code: str | None = None

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL_ACTIONS


def parse(action: Any) -> Action:
    """The :class:`Action` of ``action``; :class:`InvalidAction` for what OSWorld would not run."""
    if isinstance(action, str):
        return Action(action) if action in SPECIAL_ACTIONS else Action("code", action)
    if isinstance(action, Mapping):
        kind = action.get("action_type")
        if kind in SPECIAL_ACTIONS:
            return Action(kind)
        command = action.get("command")
        if isinstance(command, str):
            return Action("code", command)
        raise InvalidAction(f"a dict action needs action_type WAIT/DONE/FAIL or a 'command' string: {action!r:.200}")
    raise InvalidAction(f"an action is pyautogui code (str), WAIT, DONE or FAIL, not {type(action).__name__}")


def parse_all(actions: Any) -> list[Action]:
    """Every action of the list ``actions`` parsed (all checked before any runs)."""
    if not isinstance(actions, list):
        raise InvalidAction("actions must be a list")
    return [parse(a) for a in actions]


_PRESS_LESS_THAN = re.compile(r'pyautogui\.press\(["\'](?:<|\\u003c)["\']\)')
_TYPEWRITE = re.compile(r'pyautogui\.typewrite\((["\'])(.*?)\1\)')


def fix_pyautogui_less_than(code: str) -> str:
    """OSWorld's ``_fix_pyautogui_less_than_bug``: type ``<`` as shift+comma (pyautogui types ``>``).

    ``pyautogui.press('<')`` becomes ``pyautogui.hotkey("shift", ",")`` and a
    ``pyautogui.typewrite('a<b')`` is split around each ``<``, exactly as ``DesktopEnv.step`` does
    before it runs an action.
    """
    code = _PRESS_LESS_THAN.sub('pyautogui.hotkey("shift", ",")', code)

    def typewrite(match: re.Match[str]) -> str:
        quote, content = match.group(1), match.group(2)
        try:
            content = content.encode("utf-8").decode("unicode_escape")
        except UnicodeDecodeError:
            pass
        if "<" not in content:
            return match.group(0)
        parts = []
        for i, part in enumerate(content.split("<")):
            if i:
                parts.append('pyautogui.hotkey("shift", ",")')
            if part:
                parts.append(f"pyautogui.typewrite({quote}{part}{quote})")
        return "; ".join(parts)

    return _TYPEWRITE.sub(typewrite, code)


def run(guest: Any, action: Action, pause: float) -> dict[str, Any] | None:
    """Run ``action`` on ``guest`` (a :class:`~drums_osworld.guest.client.GuestClient`) as ``DesktopEnv.step`` does.

    ``WAIT`` sleeps ``pause``; ``DONE`` and ``FAIL`` run nothing; code runs through the guest's
    ``/execute`` after :func:`fix_pyautogui_less_than`. Every action is followed by a ``pause``.
    Returns the code's ``{"returncode", "output", "error"}`` (tails), or ``None`` for a special
    action. A guest call that fails is logged and gives ``returncode`` ``None`` with the failure as
    ``error``: OSWorld's controller logs these and goes on, the agent sees the screen as it is.
    """
    from .guest.client import GuestHTTPError, GuestTimeout

    result: dict[str, Any] | None = None
    if action.kind == "WAIT":
        time.sleep(pause)
    elif action.kind == "code":
        try:
            res = guest.run_python(fix_pyautogui_less_than(action.code or ""))
        except (GuestHTTPError, GuestTimeout) as exc:
            log.warning("action failed in the guest: %s", exc)
            result = {"returncode": None, "output": "", "error": str(exc)[-OUTPUT_TAIL:]}
        else:
            result = {"returncode": res.returncode, "output": res.output[-OUTPUT_TAIL:],
                      "error": res.error[-OUTPUT_TAIL:]}
    time.sleep(pause)
    return result


def run_script(guest: Any, actions: list, pause: float) -> dict[str, Any]:
    """Run ``actions`` in order with :func:`run`, up to and including the first ``DONE``/``FAIL``.

    All are parsed first (:class:`InvalidAction` and nothing runs if one is bad). Returns
    ``{"actions_run", "last_action", "errors"}``; ``errors`` lists the code actions that failed
    (``{"step", "returncode", "error"}``, or ``{"step", "error"}`` when the guest call failed).
    """
    parsed = parse_all(actions)
    ran, last, errors = 0, None, []
    for action, raw in zip(parsed, actions, strict=True):
        ran += 1
        last = raw
        res = run(guest, action, pause)
        if res is not None and res["returncode"] is None:
            errors.append({"step": ran, "error": res["error"][-2000:]})
        elif res is not None and res["returncode"] != 0:
            errors.append({"step": ran, "returncode": res["returncode"], "error": res["error"][-2000:]})
        if action.terminal:
            break
    return {"actions_run": ran, "last_action": last, "errors": errors}
