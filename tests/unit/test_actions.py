"""The one action parser (drums_osworld.actions): what the gym env and the Ray node agent accept."""
from __future__ import annotations

import pytest

from drums_core.errors import InvalidArgument, from_wire
from drums_osworld import actions
from drums_osworld.actions import SPECIAL_ACTIONS, Action, InvalidAction, parse, parse_all


def test_parse_accepts_what_osworld_accepts() -> None:
    assert parse("pyautogui.click(1, 2)") == Action("code", "pyautogui.click(1, 2)")
    for special in SPECIAL_ACTIONS:
        assert parse(special) == Action(special)
        assert parse({"action_type": special}) == Action(special)
    assert parse({"command": "pyautogui.press('a')"}) == Action("code", "pyautogui.press('a')")
    assert parse("DONE").terminal and parse("FAIL").terminal
    assert not parse("WAIT").terminal and not parse("x = 1").terminal


@pytest.mark.parametrize("bad", [3, None, ["DONE"], {"action_type": "CLICK"}, {"command": 5}])
def test_parse_rejects_with_one_error_type(bad) -> None:
    with pytest.raises(InvalidAction) as info:
        parse(bad)
    # a ValueError for gymnasium callers, an InvalidArgument (BAD_ACTION) across the Ray envelope
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidArgument)
    assert info.value.reason == "BAD_ACTION"
    back = from_wire(info.value.to_wire())
    assert isinstance(back, InvalidArgument) and back.reason == "BAD_ACTION"


def test_parse_all_checks_every_action_first() -> None:
    assert parse_all(["WAIT", "DONE"]) == [Action("WAIT"), Action("DONE")]
    with pytest.raises(InvalidAction, match="must be a list"):
        parse_all("DONE")
    with pytest.raises(InvalidAction):
        parse_all(["pyautogui.click(1, 1)", 7])


def test_one_special_actions_everywhere() -> None:
    from drums_osworld.gym import env as gym_env
    from drums_osworld import tasks

    assert tasks.SPECIAL_ACTIONS is actions.SPECIAL_ACTIONS
    assert gym_env.fix_pyautogui_less_than is actions.fix_pyautogui_less_than
