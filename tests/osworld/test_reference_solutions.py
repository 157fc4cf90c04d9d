"""Reference solutions of OSWorld tasks as regression tests (issue 15), through the real desktop-env
1.0.2 ``DesktopEnv(provider_name="drums")`` on the ``osworld`` image.

For each solution in ``solutions/<domain>/<id>.json`` (OSWorld's own task file, unchanged), in one
DesktopEnv:

1. ``reset(task)`` on a fresh desktop, its post-setup state saved (``_save_state``), ``evaluate()``
   untouched: 0;
2. when the task's evaluator has a ``postconfig`` (it changes the desktop: launches, closes, saves),
   ``reset(task)`` again (the env is used: the provider reverts to ``init_state`` and the setup runs
   again); without one, evaluation only read the desktop, which stays as it was set up;
   a sibling restored from the saved state (``drums_osworld.snapshot.branch``) evaluated untouched: 0;
3. the solution's actions through ``env.step`` on the fresh desktop, ``evaluate()``: 1;
4. a second sibling restored from the saved post-setup state, the same actions, ``evaluate()``: 1.

Every action's own answer from the guest is checked (a failed wait names the state it waited for
and lists the windows; a screenshot is kept in the test's tmp directory). ``env.vm_platform`` must
be ``"Linux"``. A separate test evaluates every no-internet Chrome task with a Chrome getter
untouched: none may raise (``Unsupported operating system`` was the symptom of a wrong platform).

Needs root, CRIU and the ``osworld`` image (``drums image build osworld``): fails with the reason
otherwise. Nothing is mocked.
"""
from __future__ import annotations

import ast
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.solutionlib import (IMAGE, OSWORLD_TASKS, all_solutions, chrome_getter_tasks, offline_catalog,
                                       score_snippet)

SOLUTIONS = all_solutions()
IMPRESS_OFFLINE = {"2cd43775-7085-45d8-89fa-9e35c0a915cf", "ef9d12bd-bcee-4ba0-a40e-918400f43ddf"}


@pytest.fixture(scope="module")
def osworld_image(osworld_venv) -> str:
    """The image, and OSWorld's real evaluator dependencies in its venv (the stubs then stand aside:
    every getter and metric these tasks reach is the real one)."""
    from drums_core.host import images
    from drums_core.errors import DrumsError
    from tests.support.osworld_harness import ensure_evaluators

    try:
        ensure_evaluators(osworld_venv)
    except Exception as exc:  # noqa: BLE001 - without them the scores would not be OSWorld's
        pytest.fail(f"OSWorld's evaluator dependencies could not be installed: {exc}")
    try:
        images.check_usable(IMAGE)
    except DrumsError as exc:
        pytest.fail(f"the {IMAGE!r} desktop image is not usable ({exc}); build it: drums image build {IMAGE}")
    if not OSWORLD_TASKS.is_dir():
        pytest.fail(f"OSWorld's task files are not at {OSWORLD_TASKS} (set DRUMS_OSWORLD_TASKS)")
    return IMAGE


def test_the_solution_set_covers_what_issue_15_asks() -> None:
    """At least 3 tasks each of chrome, gimp, vlc and os, both no-internet libreoffice_impress tasks
    and multi_apps 937087b6; each an OSWorld task that needs no internet and is feasible; at least half
    act through the GUI."""
    domains = Counter(s.domain for s in SOLUTIONS)
    for d in ("chrome", "gimp", "vlc", "os"):
        assert domains[d] >= 3, f"{d}: {domains[d]} solutions"
    assert {s.task_id for s in SOLUTIONS if s.domain == "libreoffice_impress"} == IMPRESS_OFFLINE
    assert "multi_apps/937087b6-f668-4ba6-9110-60682ee33441" in {s.task for s in SOLUTIONS}
    gui = [s for s in SOLUTIONS if s.via == "gui"]
    assert 2 * len(gui) >= len(SOLUTIONS), f"{len(gui)} of {len(SOLUTIONS)} act through the GUI"
    catalog = offline_catalog()
    for s in SOLUTIONS:
        entry = catalog[s.task]
        assert entry["offline"] and not entry["infeasible"], f"{s.task}: {entry['exclusions']}"
        assert s.task_file().is_file(), f"{s.task}: no task file at {s.task_file()}"
        task = json.loads(s.task_file().read_text())
        assert task["id"] == s.task_id and task["evaluator"]["func"] != "infeasible", s.task
        for action in s.actions:
            if action not in ("WAIT", "DONE", "FAIL"):
                ast.parse(action)  # syntax errors show here, not in a desktop
        if s.via == "gui":
            body = "\n".join(a.split("procs(name):", 1)[-1] for a in s.actions)
            assert "pyautogui." in body, f"{s.task} is marked gui but sends no pyautogui input"


@pytest.mark.parametrize("sol", SOLUTIONS, ids=[s.short for s in SOLUTIONS])
def test_reference_solution_scores(sol, osworld_image, osworld, client, tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = osworld.run(score_snippet(sol, tmp_path / "screens"), timeout=2400)
    took = time.monotonic() - t0
    scores = {k: out.get(k) for k in ("fresh_untouched", "restored_untouched", "fresh_solved", "restored_solved")}
    print(f"REFERENCE {sol.task} via={sol.via} scores={json.dumps(scores)} test_s={took:.1f} "
          f"times={json.dumps(out['times'])}" + (" ACTION FAILED" if "action_failed" in out else ""))
    assert "action_failed" not in out, f"{sol.task}: {out['action_failed']}\nscores so far: {scores} " \
                                       f"(screens in {tmp_path / 'screens'})"
    assert out["vm_platform"] == "Linux"
    # easyocr stays a stand-in (desktop-env imports it at module level; only compare_image_text uses it)
    assert set(out["stubs_imported"]) <= {"easyocr"}, f"stand-ins instead of real modules: {out['stubs_imported']}"
    assert out["sibling_differs"]
    assert scores == {"fresh_untouched": 0, "restored_untouched": 0, "fresh_solved": 1, "restored_solved": 1}, \
        f"{sol.task}: {scores} (screens in {tmp_path / 'screens'})"
    assert client.list() == []


CHROME_SNIPPET = '''
    import inspect
    import desktop_env.evaluators.getters.chrome as chrome_getters

    class Catch(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []
        def emit(self, record):
            self.lines.append(record.getMessage())
    catch = Catch()
    logging.getLogger().addHandler(catch)

    res = {{"tasks": {{}}}}
    env = DesktopEnv(provider_name="drums", path_to_vm={path!r}, action_space="pyautogui", require_a11y_tree=False)
    try:
        res["vm_platform"] = env.vm_platform
        for task_id in {ids!r}:
            task = json.load(open(os.path.join({root!r}, "chrome", task_id + ".json")))
            start = len(catch.lines)
            t0 = time.monotonic()
            try:
                env.reset(task_config=task)
                score, error = env.evaluate(), None
            except Exception as exc:
                score, error = None, f"{{type(exc).__name__}}: {{exc}}"
            unsupported = [m for m in catch.lines[start:] if "Unsupported operating system" in m]
            res["tasks"][task_id] = {{"score": score, "error": error, "unsupported_logged": unsupported,
                                     "seconds": round(time.monotonic() - t0, 1)}}
    finally:
        env.close()
    emit(res)
'''


def test_chrome_getter_tasks_evaluate_on_linux(osworld_image, osworld, client) -> None:
    """``env.vm_platform == "Linux"``, and every no-internet Chrome task whose evaluator reads through a
    Chrome getter evaluates (untouched) without an error: no ``Unsupported operating system``."""
    tasks = chrome_getter_tasks(osworld.venv)
    assert len(tasks) >= 6, f"expected the no-internet Chrome getter tasks, found {tasks}"
    t0 = time.monotonic()
    out = osworld.run(CHROME_SNIPPET.format(path=f"drums://{IMAGE}", ids=[t for t, _ in tasks],
                                            root=str(OSWORLD_TASKS)), timeout=3600)
    print(f"chrome getter tasks ({time.monotonic() - t0:.0f} s):")
    for task_id, getters in tasks:
        print(" ", task_id, getters, out["tasks"][task_id])
    assert out["vm_platform"] == "Linux"
    bad = {t: r for t, r in out["tasks"].items() if r["error"] is not None or r["unsupported_logged"]}
    assert not bad, f"Chrome getter tasks that did not evaluate: {json.dumps(bad, indent=1)}"
    assert set(out["tasks"]) == {t for t, _ in tasks}
    assert client.list() == []
