"""``drums rollouts``: N siblings of a saved mid-task state, one script each, scored.

The saved state is made once per module through the gymnasium env (``save_state(..., keep=True)``,
so it outlives the env that made it) and deleted at the end. Real daemon, CRIU, X and LibreOffice.
"""
from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import gymnasium
import pytest

from drums_core.client import Client
from drums_osworld.apps.rollouts import load_scripts, run_rollouts
from drums_osworld.tasks import load_task, tasks_dir
from tests.support.suite import DRUMS_CLI

from tests.support.gymlib import run_script, snapshot_ids

REPO = Path(__file__).resolve().parents[2]
WRITER_TASK = tasks_dir() / "libreoffice_writer" / "drums-writer-type-and-save.json"
RENAME_TASK = tasks_dir() / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"

SAVE_AS = ["pyautogui.hotkey('ctrl', 'shift', 's'); time.sleep(3)",
           "import os; pyautogui.hotkey('ctrl', 'a'); pyautogui.write(os.path.expanduser('~/Documents/{name}'), "
           "interval=0.02); time.sleep(0.5); pyautogui.press('enter'); time.sleep(3)"]


def save_as(name: str) -> list[str]:
    return [SAVE_AS[0], SAVE_AS[1].replace("{name}", name)]


def saved_state(client: Client, task_path: Path, actions: list[str]) -> str:
    """Set the task up, run ``actions``, save the state (kept after the env closes); its name."""
    name = f"pytest-mid-{uuid.uuid4().hex[:8]}"
    env = gymnasium.make("drums_osworld:drums/Desktop-v0", task=str(task_path), client=client, pause=0.5)
    try:
        env.reset(seed=0)
        run = run_script(env, actions, finish=False)
        assert not run.failed and not run.terminated, run
        env.unwrapped.save_state(name, keep=True)
    finally:
        env.close()
    assert name in {s["name"] for s in client.snapshots()}, "a kept state outlives its env"
    return name


@pytest.fixture(scope="module")
def module_client(drums_instance):
    from tests.support.suite import SUITE_DAEMON_ENV

    return Client(drums_instance, daemon_env=SUITE_DAEMON_ENV)


@pytest.fixture(scope="module")
def writer_typed(module_client):
    """Writer open with 'Drums was here' typed, not saved yet."""
    task = load_task(WRITER_TASK, require_drums_support=True)
    name = saved_state(module_client, WRITER_TASK, task.solution[:2])
    yield name
    module_client.delete_snapshot(name)


@pytest.fixture(scope="module")
def rename_started(module_client):
    """The rename task set up and one harmless action taken."""
    name = saved_state(module_client, RENAME_TASK, ["pyautogui.moveTo(200, 200)"])
    yield name
    module_client.delete_snapshot(name)


def test_rollouts_cli_four_writer_branches(client, instance_env, writer_typed, tmp_path: Path) -> None:
    """Two right and two wrong ways to finish: scores 1,0,1,0 in the table and the JSON lines."""
    scripts = [
        {"name": "save-as", "actions": [*save_as("drums_note.odt"), "DONE"]},
        {"name": "typo-then-save", "actions": ["pyautogui.write('!', interval=0.03); time.sleep(0.5)",
                                               *save_as("drums_note.odt"), "DONE"]},
        {"name": "ctrl-s", "actions": ["pyautogui.hotkey('ctrl', 's'); time.sleep(3)", save_as("drums_note.odt")[1],
                                       "DONE"]},
        {"name": "other-file", "actions": [*save_as("other.odt"), "DONE"]},
    ]
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(scripts))
    out = tmp_path / "out"
    before = snapshot_ids(client)
    r = subprocess.run([*DRUMS_CLI, "rollouts", "--task", str(WRITER_TASK),
                        "--from-state", writer_typed, "--branches", "4", "--actions", str(actions),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-3000:]}"

    table = [line.split() for line in r.stdout.splitlines()]
    assert table[0][:3] == ["BRANCH", "NAME", "SCORE"], r.stdout
    assert [(row[1], row[2]) for row in table[1:5]] == [("save-as", "1"), ("typo-then-save", "0"),
                                                         ("ctrl-s", "1"), ("other-file", "0")], r.stdout

    lines = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [b["score"] for b in lines] == [1.0, 0.0, 1.0, 0.0]
    assert [b["actions"] for b in lines] == [s["actions"] for s in scripts]
    for b in lines:
        assert b["error"] is None and b["terminated"] and b["actions_run"] == len(b["actions"])
        assert b["liveness"] == "ok", "every sibling passed the daemon's liveness check"
        assert b["state"] == writer_typed and b["task"] == "drums-writer-type-and-save"
        assert set(b["timings"]) >= {"restore", "actions", "evaluate", "total"}
        assert Path(b["screenshots"]["final"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(b["screenshots"]["steps"]) == len(b["actions"])
    assert len({b["session"] for b in lines}) == 4
    assert snapshot_ids(client) == before, "rollouts never deletes (or adds) a snapshot"


def test_rollouts_json_output_and_python_function(client, instance_env, rename_started, tmp_path: Path,
                                                  capsys) -> None:
    from drums_core.cli import main as drums

    def mv(dst: str) -> str:
        return f"import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/{dst}', shell=True)"

    scripts = [[mv("todo_list_Jan_2"), "DONE"], [mv("todo_list_Jan_3"), "DONE"], [mv("todo_list_Jan_2")],
               ["FAIL", mv("todo_list_Jan_2")]]
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps({"branches": scripts}))
    capsys.readouterr()
    rc = drums(["rollouts", "--task", RENAME_TASK.stem, "--from-state", rename_started, "--actions", str(actions),
                "--out", str(tmp_path / "cli"), "--json", "--no-progress", "--pause", "0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [b["score"] for b in lines] == [1.0, 0.0, 1.0, 0.0]
    # Branch 2 has no DONE: it is scored where it stops. Branch 3 ends at FAIL and skips the rest.
    assert [b["terminated"] for b in lines] == [True, True, False, True]
    assert [b["actions_run"] for b in lines] == [2, 2, 1, 1]

    # The same from Python, one script repeated on every branch.
    report = run_rollouts(RENAME_TASK, rename_started, [[mv("todo_list_Jan_2")]], branches=3,
                          out_dir=tmp_path / "py", client=client, pause=0.0, progress=False)
    assert report.scores == [1.0, 1.0, 1.0] and report.ok
    assert "3 branches" in report.table()
    assert (tmp_path / "py" / "summary.json").exists()


def test_rollouts_reports_bad_input_without_touching_anything(client, instance_env, tmp_path: Path,
                                                              capsys) -> None:
    from drums_core.cli import main as drums

    with pytest.raises(ValueError, match="3 scripts for 2 branches"):
        load_scripts([["DONE"], ["DONE"], ["DONE"]], branches=2)
    with pytest.raises(ValueError, match="non-empty list"):
        load_scripts([{"name": "x", "actions": []}])
    actions = tmp_path / "a.json"
    actions.write_text('[["DONE"]]')
    before = snapshot_ids(client)
    rc = drums(["rollouts", "--task", str(RENAME_TASK), "--from-state", "no-such-state-anywhere",
                "--actions", str(actions), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 1
    assert "SNAPSHOT_NOT_FOUND" in capsys.readouterr().err
    assert drums(["rollouts", "--task", "no-such-task", "--from-state", "x", "--actions", str(actions),
                  "--out", str(tmp_path / "o")]) == 2
    assert snapshot_ids(client) == before and client.list() == []
