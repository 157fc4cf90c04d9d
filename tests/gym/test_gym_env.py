"""``drums/Desktop-v0`` under gymnasium's contract, on real desktops.

Real daemon (the suite's instance), real CRIU, real Xvfb, real LibreOffice; nothing here is mocked.
Covered: registration (also the ``"module:env"`` form with nothing imported), the spaces (any
Unicode text, also through AsyncVectorEnv's shared memory), pickling, OSWorld's ``<`` fix against
OSWorld's own function, ``check_env`` in both reuse modes, every task in ``tasks/`` scoring 0.0
before and 1.0 after its reference solution (and 0.0 after its wrong one) through ``step``,
branching (continuation, isolation, chained states, ownership of saved states), truncation, and
sync and async vector envs. After each test no session is left (the ``client`` fixture) and no
snapshot an env made survives its ``close()``.
"""
from __future__ import annotations

import copy
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError, ResetNeeded
from gymnasium.spaces.utils import flatten, unflatten
from gymnasium.utils.env_checker import check_env
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

from drums_osworld.gym.env import ENV_ID, DrumsDesktopEnv, UnicodeText, fix_pyautogui_less_than
from drums_osworld.tasks import list_tasks, load_task, tasks_dir

from tests.support.gymlib import run_parallel, run_script, snapshot_ids

REPO = Path(__file__).resolve().parents[2]
TASKS = list_tasks()
SHELL_TASK = tasks_dir() / "os" / "drums-os-make-executable.json"
RENAME_TASK = tasks_dir() / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
COUNT_TASK = tasks_dir() / "shell" / "drums-shell-count-lines.json"
MODULE_ID = f"drums_osworld:{ENV_ID}"


def make(task: Path, client, **kwargs):
    kwargs.setdefault("pause", 0.0)
    return gymnasium.make(MODULE_ID, task=str(task), client=client, **kwargs)


def mv(dst: str) -> str:
    return f"import subprocess; subprocess.run('mv ~/Desktop/todo_list_Jan_1 ~/Desktop/{dst}', shell=True, check=True)"


# ------------------------------------------------------------------ no desktop needed
def test_module_form_registers_without_prior_import(tmp_path: Path) -> None:
    """``gymnasium.make("drums_osworld:drums/Desktop-v0")`` in a fresh interpreter that imported nothing of ours."""
    code = textwrap.dedent(f"""
        import sys, warnings
        warnings.filterwarnings("error", message=".*Overriding environment.*")
        import gymnasium
        assert "drums_osworld" not in sys.modules
        env = gymnasium.make({MODULE_ID!r}, task={str(SHELL_TASK)!r})
        assert "drums_osworld" in sys.modules
        import drums_osworld.gym.env as g
        g.register_envs(); g.register_envs()          # idempotent: no "Overriding" warning
        spec = gymnasium.spec({ENV_ID!r})
        env2 = gymnasium.make({ENV_ID!r}, task={str(SHELL_TASK)!r})
        print(spec.nondeterministic, spec.entry_point, type(env.unwrapped).__name__, env.unwrapped.session_id)
        env.close(); env.close(); env2.close()
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "drums_osworld.gym.env:DrumsDesktopEnv", "DrumsDesktopEnv", "None"]


def test_unicode_text_space() -> None:
    space = UnicodeText(64)
    text = "Grüße, ‘quotes’ — 漢字 𝄞 <tag>\n\t"
    assert space.contains(text) and text in space
    assert not space.contains("x" * 65) and not space.contains(b"bytes")
    assert UnicodeText(64, min_length=1).contains("") is False
    assert unflatten(space, flatten(space, text)) == text
    space.seed(3)
    samples = [space.sample() for _ in range(20)]
    assert all(s in space for s in samples)
    assert space == copy.deepcopy(space) == pickle.loads(pickle.dumps(space))
    # AsyncVectorEnv's shared memory: the batch read once at construction must follow later writes.
    memory = create_shared_memory(space, n=2, ctx=mp.get_context("spawn"))
    batch = read_from_shared_memory(space, memory, n=2)
    write_to_shared_memory(space, 0, text, memory)
    write_to_shared_memory(space, 1, "second", memory)
    assert tuple(batch) == (text, "second")
    write_to_shared_memory(space, 1, "", memory)
    assert copy.deepcopy(batch) == (text, "")
    assert isinstance(copy.deepcopy(batch), tuple)


def test_env_pickles_as_its_arguments_and_closes_idempotently() -> None:
    env = DrumsDesktopEnv(task=str(SHELL_TASK), reuse="post_setup", screen_size=(1280, 720), pause=0.25)
    clone = pickle.loads(pickle.dumps(env))
    try:
        assert isinstance(clone, DrumsDesktopEnv) and clone is not env
        assert clone.session_id is None and clone.task.id == env.task.id
        assert (clone.reuse, clone.screen_size, clone.pause) == ("post_setup", (1280, 720), 0.25)
        assert clone.observation_space == env.observation_space
        assert clone.observation_space["screenshot"].shape == (720, 1280, 3)
        with pytest.raises(ResetNeeded):
            env.step("WAIT")
    finally:
        env.close()
        env.close()
        clone.close()
    with pytest.raises(ClosedEnvironmentError):
        env.reset()
    with pytest.raises(ValueError):
        DrumsDesktopEnv(task=str(SHELL_TASK), reuse="sometimes")


def test_less_than_fix_matches_osworld() -> None:
    from tests.support.osworld_harness import run_osworld

    cases = ["pyautogui.press('<')", 'pyautogui.press("<")', "pyautogui.press('\\u003c')",
             "pyautogui.typewrite('a<b<c')", 'pyautogui.typewrite("<html>")', "pyautogui.typewrite('no less')",
             "pyautogui.typewrite('x\\u003cy')", "pyautogui.write('a<b')",
             "pyautogui.typewrite('<'); pyautogui.press('<')",
             "pyautogui.typewrite('a\\\\nb<c')", "x = 1 < 2; pyautogui.typewrite('<<')", "pyautogui.typewrite('ü<')"]
    theirs = run_osworld(f"""
        from desktop_env.desktop_env import _fix_pyautogui_less_than_bug as fix
        emit([fix(c) for c in {cases!r}])
    """)
    assert [fix_pyautogui_less_than(c) for c in cases] == theirs


# ------------------------------------------------------------------ on real desktops
@pytest.mark.parametrize("reuse", ["none", "post_setup"])
def test_check_env_passes(client, reuse: str) -> None:
    before = snapshot_ids(client)
    env = make(SHELL_TASK, client, reuse=reuse)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        gym_warnings = [str(w.message) for w in caught if "WARN:" in str(w.message)]
        assert not gym_warnings, gym_warnings
    finally:
        env.close()
    assert snapshot_ids(client) == before


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_task_scores_through_the_gym_env(client, path: Path) -> None:
    """0.0 right after setup, 0.0 after the wrong solution, 1.0 after the reference solution.

    One cold boot + setup per task; the "before" and "wrong" runs are branches of the state right
    after setup, run at the same time as the solution on the original desktop.
    """
    task = load_task(path, require_drums_support=True)
    assert task.solution, f"{path} has no drums_solution"
    before_snaps = snapshot_ids(client)
    env = make(path, client, pause=0.5)
    try:
        obs, info = env.reset(seed=0)
        assert obs["instruction"] == task.instruction and obs in env.observation_space
        assert info["task_id"] == task.id and info["seconds"]["setup"] >= 0
        env.unwrapped.save_state("after-setup")
        branches = env.unwrapped.branch("after-setup", 2 if task.wrong_solution else 1)
        try:
            jobs = [(env, task.solution), (branches[0], ["DONE"])]
            if task.wrong_solution:
                jobs.append((branches[1], task.wrong_solution))
            runs = run_parallel(jobs)
        finally:
            for b in branches:
                b.close()
        solved, before = runs[0], runs[1]
        assert before.reward == 0.0, f"{task.id}: scores {before.reward} right after setup"
        assert not solved.failed, f"{task.id}: solution actions failed in the guest: {solved.failed}"
        assert solved.terminated and solved.reward == 1.0, f"{task.id}: the solution scores {solved.reward}"
        assert all(r == 0.0 for r in solved.rewards[:-1]), "the reward is sparse: 0 until the episode ends"
        if task.wrong_solution:
            assert runs[2].reward == 0.0, f"{task.id}: the wrong solution scores {runs[2].reward}"
    finally:
        env.close()
    assert snapshot_ids(client) == before_snaps, "close() must delete the states the env saved"


def test_branches_continue_the_episode_independently(client) -> None:
    before = snapshot_ids(client)
    env = make(RENAME_TASK, client, max_steps=5)
    u = env.unwrapped
    kids, grand = [], None
    try:
        env.reset(seed=1)
        mark = "import os; open(os.path.expanduser('~/step1'), 'w').write('parent')"
        assert run_script(env, [mark], finish=False).failed == []
        saved = u.save_state("mid")
        assert saved["step"] == 1 and saved["snapshot"] in snapshot_ids(client)
        kids = u.branch("mid", 3)
        assert [k.step_count for k in kids] == [1, 1, 1]
        assert all(k.action_history == [mark] for k in kids)
        assert len({k.session_id for k in kids} | {u.session_id}) == 4
        for i, k in enumerate(kids):
            k.step(f"import os; open(os.path.expanduser('~/kid'), 'w').write('{i}')")
        for i, k in enumerate(kids):
            assert k.desktop.guest.execute("cat ~/kid ~/step1", shell=True).output == f"{i}parent"
        assert "No such file" in u.desktop.guest.execute("cat ~/kid", shell=True).error

        # A state saved by a branch is the family's: the original env can branch from it (chained).
        assert kids[0].save_state("kid0")["step"] == 2
        assert set(u.saved_states) == {"mid", "kid0"}
        grand = u.branch("kid0", 1)[0]
        assert grand.step_count == 2
        assert grand.desktop.guest.execute("cat ~/kid", shell=True).output == "0"

        runs = run_parallel([(kids[0], [mv("todo_list_Jan_2")]), (kids[1], [mv("todo_list_Jan_3")]),
                             (kids[2], ["FAIL"]), (grand, [mv("todo_list_Jan_2")])])
        assert [r.reward for r in runs] == [1.0, 0.0, 0.0, 1.0]

        # The original goes on; max_steps=5 truncates at step 5 and scores then.
        for _ in range(3):
            _, reward, terminated, truncated, info = env.step("WAIT")
            assert (reward, terminated, truncated) == (0.0, False, False)
        _, reward, terminated, truncated, info = env.step("WAIT")
        assert (terminated, truncated, info["score"], reward) == (False, True, 0.0, 0.0)
        with pytest.raises(ResetNeeded):
            env.step("WAIT")

        # Saved states live while any env of the family is open, whoever closes first.
        env.close()
        mine = snapshot_ids(client) - before
        assert len(mine) == 2
        for k in kids:
            k.close()
        assert snapshot_ids(client) - before == mine
        grand.close()
        assert snapshot_ids(client) == before
    finally:
        for e in [env, *kids, *([grand] if grand is not None else [])]:
            e.close()


def test_async_vector_env_steps_resets_and_leaves_nothing(client) -> None:
    task = load_task(COUNT_TASK, require_drums_support=True)
    sol, wrong = task.solution[0], task.wrong_solution[0]
    before = snapshot_ids(client)
    venv = gymnasium.make_vec(MODULE_ID, num_envs=4, vectorization_mode="async",
                              vector_kwargs={"context": "spawn"}, task=str(COUNT_TASK), client=client, pause=0.0)
    try:
        obs, info = venv.reset(seed=7)
        assert obs["screenshot"].shape == (4, 1080, 1920, 3) and obs["screenshot"].dtype == np.uint8
        assert list(obs["instruction"]) == [task.instruction] * 4
        first = set(info["session"])
        assert len(first) == 4 and first <= {s["id"] for s in client.list()}

        obs, reward, terminated, truncated, info = venv.step((sol, wrong, "WAIT", sol))
        assert reward.tolist() == [0.0] * 4 and not terminated.any() and not truncated.any()
        obs, reward, terminated, truncated, info = venv.step(("DONE",) * 4)
        assert reward.tolist() == [1.0, 0.0, 0.0, 1.0] and terminated.all()
        # NEXT_STEP autoreset: this step resets every sub-env (new desktops, the task set up again).
        obs, reward, terminated, truncated, info = venv.step(("WAIT",) * 4)
        assert reward.tolist() == [0.0] * 4 and not terminated.any()
        assert set(info["session"]).isdisjoint(first) and list(obs["instruction"]) == [task.instruction] * 4

        obs, info = venv.reset()
        obs, reward, terminated, truncated, info = venv.step((sol, "FAIL", sol, "DONE"))
        assert reward.tolist() == [0.0, 0.0, 0.0, 0.0] and terminated.tolist() == [False, True, False, True]
        assert len(client.list()) == 4
    finally:
        venv.close()
    assert client.list() == []
    assert snapshot_ids(client) == before


def test_sync_vector_env_reuses_the_post_setup_state(client) -> None:
    task = load_task(COUNT_TASK, require_drums_support=True)
    before = snapshot_ids(client)
    venv = gymnasium.make_vec(MODULE_ID, num_envs=2, vectorization_mode="sync", task=str(COUNT_TASK), client=client,
                              pause=0.0, reuse="post_setup", require_a11y_tree=True)
    try:
        obs, info = venv.reset(seed=3)
        assert info["source"].tolist() == ["setup", "setup"]
        assert all(tree.startswith("<") for tree in obs["accessibility_tree"])
        obs, reward, terminated, _, _ = venv.step((task.solution[0], "DONE"))
        obs, reward, terminated, _, _ = venv.step(("DONE", "WAIT"))
        assert reward.tolist() == [1.0, 0.0]
        obs, info = venv.reset()
        assert info["source"].tolist() == ["post_setup_restore"] * 2
        # The restored state is the one right after setup: unsolved, and solvable.
        obs, reward, terminated, _, _ = venv.step(("DONE", task.solution[0]))
        obs, reward, terminated, _, _ = venv.step(("WAIT", "DONE"))
        assert reward.tolist() == [0.0, 1.0]
        assert len(snapshot_ids(client) - before) == 2   # one post-setup state per sub-env
    finally:
        venv.close()
    assert snapshot_ids(client) == before
