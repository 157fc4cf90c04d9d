"""Every task in tasks/, end to end on a local stand-in desktop (no Drums session needed).

For each task: run its setup, score it (0.0), run its wrong solution if it has one (0.0); then
on a fresh home run the setup again and its reference solution (1.0). The desktop is a private
Xvfb + openbox on this host and the guest is ``tests/support/local_guest.LocalGuest`` (the guest server's
behaviour, run locally with ``HOME`` in a scratch directory), so this checks the tasks' logic and
Drums' setup/evaluation code. The same tasks in real sessions are the live tests' job.

Needs Xvfb, openbox, wmctrl, LibreOffice and a Python with pyautogui; fails with the reason when
one is missing.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from drums_osworld.evaluation import evaluate, run_task_setup
from drums_osworld.tasks import SPECIAL_ACTIONS, Task, list_tasks, load_task

from tests.support.local_guest import LocalDesktop, LocalGuest, find_pyautogui_python

TASK_FILES = list_tasks()


@pytest.fixture(scope="module")
def desktop() -> Iterator[LocalDesktop]:
    d = LocalDesktop()
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def pyautogui_python(desktop: LocalDesktop) -> str:
    for tool in ("soffice", "libreoffice", "xdotool"):
        if shutil.which(tool) is None:
            pytest.fail(f"the local task check needs {tool} on PATH")
    return find_pyautogui_python(desktop.display)


@contextmanager
def fresh_guest(desktop: LocalDesktop, python: str, root: Path) -> Iterator[LocalGuest]:
    root.mkdir(parents=True)
    guest = LocalGuest(desktop, python, root / "home")
    try:
        yield guest
    finally:
        guest.kill_all()
        shutil.rmtree(root, ignore_errors=True)


def run_actions(guest: LocalGuest, actions: list[str], pause: float = 0.5) -> str | None:
    """Run actions as DesktopEnv.step does (pyautogui code through /execute); the last action."""
    last = None
    for i, action in enumerate(actions):
        last = action
        if action in SPECIAL_ACTIONS:
            if action == "WAIT":
                time.sleep(pause)
            continue
        res = guest.run_python(action)
        assert res.returncode == 0, (f"action {i} failed (rc {res.returncode}): {res.error[-2000:]}; "
                                     f"desktop: {guest.desktop.problem() if guest.desktop else None}")
        time.sleep(pause)
    return last


def _score(task: Task, guest: LocalGuest, last: str | None, cache: Path, shots: Path, name: str) -> float:
    score = evaluate(task, guest, last, cache_dir=cache)
    shots.mkdir(parents=True, exist_ok=True)
    (shots / f"{name}.png").write_bytes(guest.screenshot())
    return score


def _seen(guest: LocalGuest, shots: Path) -> str:
    """What a failure message needs when the screens are gone with the run: the windows."""
    windows = guest.execute(["wmctrl", "-l"]).output.strip() or "(none)"
    return f"windows:\n{windows}\n(screens in {shots})"


@pytest.mark.parametrize("path", TASK_FILES, ids=[p.stem for p in TASK_FILES])
def test_task_scores_locally(path: Path, desktop: LocalDesktop, pyautogui_python: str,
                             tmp_path: Path) -> None:
    task = load_task(path, require_drums_support=True)
    assert task.solution, f"{path} has no drums_solution"
    assert desktop.problem() is None, f"the local desktop broke before {task.id}: {desktop.problem()}"
    shots = tmp_path / "screens"

    with fresh_guest(desktop, pyautogui_python, tmp_path / "round1") as guest:
        cache = tmp_path / "cache1"
        run_task_setup(task, guest, cache_dir=cache, screen_size=desktop.size)
        before = _score(task, guest, None, cache, shots, "before")
        assert before == 0.0, f"{task.id}: score {before} right after setup; {_seen(guest, shots)}"
        if task.wrong_solution:
            last = run_actions(guest, task.wrong_solution)
            wrong = _score(task, guest, last, cache, shots, "wrong")
            assert wrong == 0.0, f"{task.id}: the wrong solution scores {wrong}; {_seen(guest, shots)}"

    with fresh_guest(desktop, pyautogui_python, tmp_path / "round2") as guest:
        cache = tmp_path / "cache2"
        run_task_setup(task, guest, cache_dir=cache, screen_size=desktop.size)
        last = run_actions(guest, task.solution)
        after = _score(task, guest, last, cache, shots, "after")
        assert desktop.problem() is None, f"the local desktop broke during {task.id}: {desktop.problem()}"
        assert after == 1.0, f"{task.id}: the reference solution scores {after}; {_seen(guest, shots)}"
