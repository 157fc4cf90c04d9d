"""Reference solutions of OSWorld tasks (``tests/osworld/solutions/<domain>/<id>.json``) and the
snippet that scores them through the real desktop-env 1.0.2 ``DesktopEnv(provider_name="drums")``.

A solution file::

    {"task": "<domain>/<id>",            OSWorld's own task file, read from OSWORLD_TASKS
     "via": "gui" | "file",              gui: pyautogui clicks/keys that the score depends on;
                                         file: code that writes the evaluated state directly
     "how": "one line",
     "actions": [<action>, ...]}         an action is pyautogui code (a string, or a list of
                                         lines), or WAIT / DONE

Each action is sent through ``DesktopEnv.step`` as an agent's is, with ``solutions/guestlib.py``
(waits for windows, focus and file contents; fails with the reason and the open windows) in front.
"""
from __future__ import annotations

import ast
import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .taskset import osworld_tasks_dir

SOLUTIONS = REPO / "tests" / "osworld" / "solutions"
GUESTLIB = SOLUTIONS / "guestlib.py"
OSWORLD_TASKS = osworld_tasks_dir() / "examples"
IMAGE = os.environ.get("DRUMS_OSWORLD_TEST_IMAGE", "osworld")
SPECIAL = ("WAIT", "DONE", "FAIL")


@dataclass(frozen=True)
class Solution:
    task: str                 # "<domain>/<id>"
    via: str
    how: str
    actions: tuple[str, ...]  # as sent through env.step (guestlib prepended)

    @property
    def domain(self) -> str:
        return self.task.split("/", 1)[0]

    @property
    def task_id(self) -> str:
        return self.task.split("/", 1)[1]

    @property
    def short(self) -> str:
        return f"{self.domain}-{self.task_id[:8]}"

    def task_file(self) -> Path:
        return OSWORLD_TASKS / f"{self.task}.json"


def load_solution(path: Path) -> Solution:
    data = json.loads(path.read_text())
    missing = {"task", "via", "how", "actions"} - data.keys()
    if missing:
        raise ValueError(f"{path}: missing {sorted(missing)}")
    if data["via"] not in ("gui", "file"):
        raise ValueError(f"{path}: via must be gui or file, not {data['via']!r}")
    if f"{path.parent.name}/{path.stem}" != data["task"]:
        raise ValueError(f"{path}: its task {data['task']!r} is not its <domain>/<id> path")
    lib = GUESTLIB.read_text()
    actions = []
    for a in data["actions"]:
        code = "\n".join(a) if isinstance(a, list) else a
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"{path}: an empty or malformed action")
        actions.append(code if code in SPECIAL else lib + "\n" + code)
    if not actions:
        raise ValueError(f"{path}: no actions")
    return Solution(data["task"], data["via"], data["how"], tuple(actions))


def all_solutions() -> list[Solution]:
    return [load_solution(p) for p in sorted(SOLUTIONS.glob("*/*.json"))]


# ------------------------------------------------------------------------------------------- snippet
# Runs in the OSWorld venv (osworldlib.PRELUDE in front). One task: a fresh desktop scored untouched,
# then a second fresh desktop (reset reverts to init_state and runs the setup again) whose post-setup
# state is saved; a sibling restored from that state is scored untouched, the fresh desktop is solved
# and scored, and a second restored sibling is solved and scored.
SCORE_SNIPPET = '''
    import sys
    from drums_osworld.snapshot import branch, close_all

    TASK = json.load(open({task_file!r}))
    ACTIONS = {actions!r}
    SHOTS = {shots!r}
    os.makedirs(SHOTS, exist_ok=True)

    class ActionFailed(Exception):
        pass

    def shot(e, name):
        try:
            png = e.controller.get_screenshot()
            if png:
                open(os.path.join(SHOTS, name + ".png"), "wb").write(png)
        except Exception as exc:  # noqa: BLE001 - a screenshot is only for the failure message
            print("screenshot failed:", exc)

    def solve(e, label):
        """Every action through e.step; the guest's answer of each is caught on its way back."""
        answers = []
        original = e.controller.execute_python_command
        def recorded(command):
            r = original(command)
            answers.append(r)
            return r
        e.controller.execute_python_command = recorded
        took = []
        try:
            for i, action in enumerate(ACTIONS):
                n = len(answers)
                t0 = time.monotonic()
                e.step(action, pause=0.5)
                took.append(round(time.monotonic() - t0, 2))
                if action in ("WAIT", "DONE", "FAIL"):
                    continue
                r = answers[n] if len(answers) > n else None
                if not r or r.get("returncode") != 0:
                    shot(e, f"{{label}}-action{{i}}-failed")
                    windows = guest_sh(e, "wmctrl -lx")
                    raise ActionFailed(f"{{label}}: action {{i}} failed: "
                                       f"{{(r or {{}}).get('error', 'no answer from the guest')[-3000:]}}\\n"
                                       f"output: {{(r or {{}}).get('output', '')[-1000:]}}\\nwindows:\\n{{windows}}")
        finally:
            del e.controller.execute_python_command
        shot(e, f"{{label}}-solved")
        return took

    res = {{"times": {{}}}}
    t_all = time.monotonic()
    env = DesktopEnv(provider_name="drums", path_to_vm={path!r}, action_space="pyautogui",
                     require_a11y_tree=False)
    sibs = []
    try:
        res["vm_platform"] = env.vm_platform
        t0 = time.monotonic()
        env.reset(task_config=TASK)
        res["times"]["reset_fresh"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        env._save_state("after_setup")              # the post-setup state, before anything evaluates it
        res["times"]["save_state"] = round(time.monotonic() - t0, 2)
        shot(env, "fresh-untouched")
        res["fresh_untouched"] = env.evaluate()
        if TASK["evaluator"].get("postconfig"):
            # the evaluator changed the desktop (launched, closed, saved): solve on a new setup. Without
            # a postconfig, evaluate() only reads (files, commands' output, the tree), and the same
            # fresh desktop is solved
            t0 = time.monotonic()
            env.reset(task_config=TASK)             # used: reverts to init_state, runs the setup again
            res["times"]["reset_revert"] = round(time.monotonic() - t0, 2)

        t0 = time.monotonic()
        untouched, = sibs = branch(env, 1, "after_setup")
        res["times"]["restore_sibling"] = round(time.monotonic() - t0, 2)
        shot(untouched, "restored-untouched")
        res["restored_untouched"] = untouched.evaluate()
        close_all(sibs)
        sibs = []

        try:
            res["times"]["actions_fresh"] = solve(env, "fresh")
            res["fresh_solved"] = env.evaluate()

            solver, = sibs = branch(env, 1, "after_setup")   # the saved post-setup state, not the solved one
            res["sibling_differs"] = solver.provider.desktop.id != env.provider.desktop.id
            res["times"]["actions_restored"] = solve(solver, "restored")
            res["restored_solved"] = solver.evaluate()
        except ActionFailed as exc:       # reported with the scores so far
            res["action_failed"] = str(exc)
    finally:
        try:
            close_all(sibs)
        finally:
            env.close()
    res["times"]["total"] = round(time.monotonic() - t_all, 2)
    res["stubs_imported"] = sorted(n for n, m in sys.modules.items() if getattr(m, "__drums_stub__", False))
    emit(res)
'''


def score_snippet(sol: Solution, shots: Path) -> str:
    return textwrap.dedent(SCORE_SNIPPET).format(task_file=str(sol.task_file()), actions=list(sol.actions),
                                                 shots=str(shots), path=f"drums://{IMAGE}")


# ------------------------------------------------------------------------------- chrome getter tasks
CATALOG = REPO / "drums_osworld" / "catalog" / "osworld_offline.json"


def offline_catalog() -> dict[str, dict]:
    """The committed list of OSWorld tasks (drums_osworld/catalog): "<domain>/<id>" -> its entry
    (``offline``, ``infeasible``, ``exclusions`` with their reasons, ``apps``)."""
    data = json.loads(CATALOG.read_text())
    return {f"{t['domain']}/{t['id']}": t for t in data["tasks"]}


def desktop_env_names(venv: Path) -> tuple[set[str], set[str], set[str]]:
    """(every getter type, the Chrome getter types, every metric) that desktop-env in ``venv`` defines:
    ``get_<type>`` functions of evaluators/getters/*.py (chrome.py apart) and functions of
    evaluators/metrics/*.py, read from the source (the Drums venv cannot import desktop_env)."""
    pkgs = list(venv.glob("lib/python3*/site-packages/desktop_env/evaluators"))
    if len(pkgs) != 1:
        raise FileNotFoundError(f"desktop-env's evaluators not found in {venv}: {pkgs}")

    def functions(path: Path) -> set[str]:
        return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    getters: set[str] = set()
    chrome: set[str] = set()
    for f in (pkgs[0] / "getters").glob("*.py"):
        names = {n[4:] for n in functions(f) if n.startswith("get_")}
        getters |= names
        if f.name == "chrome.py":
            chrome = names
    metrics = set().union(*(functions(f) for f in (pkgs[0] / "metrics").glob("*.py")))
    return getters, chrome, metrics


def _getter_configs(ev: dict) -> list[dict]:
    cfgs: list = []
    for key in ("result", "expected"):
        v = ev.get(key)
        cfgs += v if isinstance(v, list) else ([v] if v else [])
    return [c for c in cfgs if isinstance(c, dict)]


def chrome_getter_tasks(venv: Path) -> list[tuple[str, list[str]]]:
    """The chrome tasks of the committed no-internet list whose evaluator reads through a Chrome getter
    (a ``get_<type>`` of desktop-env's evaluators/getters/chrome.py): (id, getter types)."""
    _, chrome, _ = desktop_env_names(venv)
    out = []
    for key, entry in sorted(offline_catalog().items()):
        if entry["domain"] != "chrome" or not entry["offline"] or entry["infeasible"]:
            continue
        task = json.loads((OSWORLD_TASKS / f"{key}.json").read_text())
        types = {c["type"] for c in _getter_configs(task.get("evaluator", {})) if "type" in c}
        if types & chrome:
            out.append((entry["id"], sorted(types & chrome)))
    return out
