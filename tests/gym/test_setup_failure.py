"""Failed setup is not a score: a task whose setup launches a missing program, on real desktops.

The task is OSWorld's e0df059f (rename a directory) with two launches before its own steps: VS
Code (``code``, which no Debian image has: the guest refuses the launch) and, through a shell, a
program that does not exist (the guest accepts the launch; the shell exits 127). OSWorld's own
setup only logs such failures; the env must say the attempt is invalid, name the steps, never score
it, and raise from ``reset`` when strict. ``drums rollouts`` from a state saved after that setup
reports every branch invalid. Real daemon, CRIU, X and guest server.
"""
from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import gymnasium
import pytest

from drums_osworld.gym.env import DrumsDesktopEnv
from drums_osworld.apps.rollouts import run_rollouts
from drums_osworld.setup_journal import SetupFailed
from drums_osworld.tasks import load_task, tasks_dir

RENAME_TASK = tasks_dir() / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
MV = "import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2', shell=True)"


def broken_task() -> dict:
    task = copy.deepcopy(dict(load_task(RENAME_TASK).raw))
    task["id"] = "drums-broken-setup-" + uuid.uuid4().hex[:6]
    task["config"] = [{"type": "launch", "parameters": {"command": ["code", "--new-window"]}},
                      {"type": "launch", "parameters": {"command": "drums-no-such-app --start", "shell": True}},
                      {"type": "sleep", "parameters": {"seconds": 0.5}},
                      *task["config"]]
    return task


def assert_names_the_failures(setup: dict) -> None:
    assert setup["ok"] is False
    steps = {(i["step"], i["type"]) for i in setup["issues"]}
    assert steps == {(0, "launch"), (1, "launch")}, setup["issues"]
    errors = " ".join(i["error"] for i in setup["issues"])
    assert "code" in errors and "127" in errors
    assert "vscode" in setup["missing_apps"], setup["missing_apps"]


def test_gym_env_reports_the_attempt_invalid_and_never_scores_it(client, instance_env) -> None:
    env = gymnasium.make("drums_osworld:drums/Desktop-v0", task=broken_task(), client=client, pause=0.2,
                         strict_setup=False)
    try:
        _, info = env.reset(seed=0)
        assert_names_the_failures(info["setup"])
        assert "step 1 (launch)" in info["invalid"] and "step 2 (launch)" in info["invalid"]
        # the steps after the failed ones ran: the agent could act, the score would be a plausible 0/1
        _, _, _, _, _ = env.step(MV)
        with pytest.raises(SetupFailed) as err:
            env.unwrapped.evaluate()
        assert err.value.reason == "SETUP_FAILED" and err.value.detail["setup"]["ok"] is False
        _, reward, terminated, _, info = env.step("DONE")
        assert terminated and info["score"] is None and "step 1 (launch)" in info["invalid"]
        assert reward == 0.0  # gymnasium needs a number; the score is None and info says why
    finally:
        env.close()


def test_gym_env_strict_raises_from_reset(client, instance_env, monkeypatch) -> None:
    monkeypatch.setenv("DRUMS_STRICT_SETUP", "1")
    env = DrumsDesktopEnv(task=broken_task(), client=client, pause=0.2)
    try:
        assert env.strict_setup
        with pytest.raises(SetupFailed) as err:
            env.reset(seed=0)
        assert_names_the_failures(err.value.report.to_json())
    finally:
        env.close()


def test_a_clean_setup_reports_ok(client, instance_env) -> None:
    env = DrumsDesktopEnv(task=RENAME_TASK, client=client, pause=0.2, strict_setup=True)
    try:
        _, info = env.reset(seed=0)
        assert info["setup"]["ok"] is True and info["setup"]["entries"] >= 2 and "invalid" not in info
        env.step(MV)
        assert env.step("DONE")[4]["score"] == 1.0
    finally:
        env.close()


def test_rollouts_from_a_state_with_a_failed_setup_are_invalid(client, instance_env, tmp_path: Path, capsys) -> None:
    from drums_core.cli import main as drums

    task = broken_task()
    task_file = tmp_path / f"{task['id']}.json"
    task_file.write_text(json.dumps(task))
    name = f"pytest-broken-{uuid.uuid4().hex[:8]}"
    env = DrumsDesktopEnv(task=task, client=client, pause=0.2, strict_setup=False)
    try:
        env.reset(seed=0)
        env.save_state(name, keep=True)
    finally:
        env.close()
    try:
        report = run_rollouts(task_file, name, [[MV, "DONE"]], branches=2, out_dir=tmp_path / "py", client=client,
                              pause=0.0, progress=False)
        assert not report.ok and report.scores == [None, None]
        for b in report.branches:
            assert b.invalid and "step 1 (launch)" in b.invalid and b.actions_run == 0
            assert_names_the_failures(b.setup)
        assert "2 invalid" in report.table()
        actions = tmp_path / "actions.json"
        actions.write_text(json.dumps([[MV, "DONE"]]))
        capsys.readouterr()
        rc = drums(["rollouts", "--task", str(task_file), "--from-state", name, "--actions", str(actions),
                    "--branches", "1", "--out", str(tmp_path / "cli"), "--json", "--no-progress", "--pause", "0"])
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
        assert rc == 1 and len(lines) == 1
        assert lines[0]["score"] is None and "step 2 (launch)" in lines[0]["invalid"]
    finally:
        client.delete_snapshot(name)
