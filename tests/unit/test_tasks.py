"""Task loading and validation: every bundled task validates; malformed tasks fail clearly."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from drums_core.errors import InvalidArgument
from tests.support.taskset import osworld_tasks_dir
from drums_osworld.tasks import (
    OSWORLD_GETTERS,
    OSWORLD_METRICS,
    Task,
    TaskError,
    find_task,
    list_tasks,
    load_task,
    load_tasks,
    tasks_dir,
    validate_task,
)

REPO = Path(__file__).resolve().parents[2]
E0DF = REPO / "tasks" / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
SHARED_E0DF = osworld_tasks_dir() / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"

GOOD: dict = {
    "id": "t-1",
    "instruction": "Do the thing.",
    "config": [
        {"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD}", "shell": True}},
        {"type": "launch", "parameters": {"command": ["libreoffice", "--writer"]}},
        {"type": "sleep", "parameters": {"seconds": 1}},
    ],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "cat ~/x", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": "x\n"}},
    },
    "drums_solution": ["import subprocess; subprocess.run('echo x > ~/x', shell=True)", "DONE"],
}


def bad(**changes) -> dict:
    task = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is _DELETE:
            del task[key]
        else:
            task[key] = value
    return task


_DELETE = object()


def problems_of(task, **kw) -> list[str]:
    with pytest.raises(TaskError) as info:
        load_task(task, **kw)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, InvalidArgument)
    assert err.problems and all(p in str(err) for p in err.problems)
    return err.problems


def one_problem(task, needle: str, **kw) -> None:
    problems = problems_of(task, **kw)
    assert any(needle in p for p in problems), problems


# -- the bundled tasks ---------------------------------------------------------------------------
def test_tasks_dir_is_the_repo_tasks_directory():
    assert tasks_dir() == REPO / "tasks"


def test_there_are_enough_bundled_tasks_across_domains():
    files = list_tasks()
    assert len(files) >= 9
    domains = {p.parent.name for p in files}
    assert {"os", "libreoffice_writer", "libreoffice_calc"} <= domains


@pytest.mark.parametrize("path", list_tasks(), ids=lambda p: p.stem)
def test_every_bundled_task_validates_with_drums_support(path: Path):
    task = load_task(path, require_drums_support=True)
    assert isinstance(task, Task)
    assert path.name == f"{task.id}.json", "a task file is named after its id"
    assert task.solution, "every bundled task has a drums_solution"
    assert task.domain == path.parent.name
    assert validate_task(json.loads(path.read_text()), require_drums_support=True) == []


def test_load_tasks_and_unique_ids():
    tasks = load_tasks()
    ids = [t.id for t in tasks]
    assert len(ids) == len(set(ids))


def test_e0df059f_is_osworlds_task_verbatim_plus_solutions():
    ours = json.loads(E0DF.read_text())
    assert {"drums_solution", "drums_wrong_solution"} <= set(ours)
    if SHARED_E0DF.exists():
        theirs = json.loads(SHARED_E0DF.read_text())
        stripped = {k: v for k, v in ours.items() if not k.startswith("drums_")}
        assert stripped == theirs


def test_writer_task_launches_writer():
    task = load_task(find_task("drums-writer-type-and-save"))
    assert {"type": "launch", "parameters": {"command": ["libreoffice", "--writer"]}} in task.config


def test_find_task_by_id_domain_and_prefix():
    assert find_task("e0df059f-28a6-4169-924f-b9623e7184cc") == E0DF
    assert find_task("os/e0df059f-28a6-4169-924f-b9623e7184cc") == E0DF
    assert find_task("e0df059f") == E0DF
    with pytest.raises(TaskError, match="no task named"):
        find_task("no-such-task")
    with pytest.raises(TaskError, match="ambiguous"):
        find_task("drums-")


def test_task_object_round_trips():
    task = load_task(GOOD)
    assert task.id == "t-1" and task.instruction == "Do the thing."
    assert task.to_dict() == GOOD and task.to_dict() is not task.raw
    assert load_task(task) is task
    assert task.path is None and task.solution == GOOD["drums_solution"]


def test_loading_a_dict_does_not_alias_it():
    raw = copy.deepcopy(GOOD)
    task = load_task(raw)
    raw["id"] = "changed"
    assert task.id == "t-1"


# -- malformed tasks -----------------------------------------------------------------------------
def test_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    one_problem(path, "a task must be a JSON object, got list")


@pytest.mark.parametrize("field", ["id", "instruction", "config", "evaluator"])
def test_missing_required_field(field):
    one_problem(bad(**{field: _DELETE}), f"missing required field {field!r}")


def test_bad_id_and_instruction():
    one_problem(bad(id="a/b"), "'id' must be a non-empty string without '/'")
    one_problem(bad(id=""), "'id' must be")
    one_problem(bad(instruction=" "), "'instruction' must be a non-empty string")


def test_all_problems_are_reported_at_once():
    problems = problems_of(bad(id=5, instruction=_DELETE, config="nope"))
    assert len(problems) == 3


def test_unreadable_and_invalid_json_files(tmp_path):
    with pytest.raises(TaskError, match="cannot read the task file") as info:
        load_task(tmp_path / "missing.json")
    assert info.value.reason == "TASK_UNREADABLE" and str(tmp_path) in str(info.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"id": "x",')
    with pytest.raises(TaskError, match="not valid JSON") as info:
        load_task(broken)
    assert info.value.reason == "TASK_NOT_JSON" and "broken.json" in str(info.value)


def test_not_a_task_source():
    with pytest.raises(TaskError, match="a task is a path, a dict or a Task"):
        load_task(42)  # type: ignore[arg-type]


def test_unknown_step_type():
    one_problem(bad(config=[{"type": "teleport", "parameters": {}}]), "unknown step type 'teleport'")


def test_step_needs_parameters_and_known_names():
    one_problem(bad(config=[{"type": "sleep"}]), "missing 'parameters'")
    one_problem(bad(config=[{"type": "sleep", "parameters": {}}]), "missing parameter 'seconds'")
    one_problem(bad(config=[{"type": "sleep", "parameters": {"seconds": 1, "minutes": 2}}]),
                "unknown parameter 'minutes'")
    one_problem(bad(config=[{"type": "sleep", "parameters": {"seconds": -1}}]), "non-negative number")
    one_problem(bad(config=["execute"]), "a step must be an object")


@pytest.mark.parametrize("command", [None, 3, [], ["ok", 4], ""])
def test_step_command_must_be_string_or_list_of_strings(command):
    params = {} if command is None else {"command": command}
    problems = problems_of(bad(config=[{"type": "execute", "parameters": params}]))
    assert any("command" in p for p in problems), problems


def test_step_stdout_must_stay_in_the_cache_dir():
    one_problem(bad(config=[{"type": "execute", "parameters": {"command": "ls", "stdout": "../x"}}]),
                "relative name inside the cache directory")


def test_upload_and_download_file_lists():
    one_problem(bad(config=[{"type": "download", "parameters": {"files": []}}]), "non-empty list")
    one_problem(bad(config=[{"type": "download", "parameters": {"files": [{"url": "u"}]}}]),
                "files[0] must be an object with non-empty 'url' and 'path'")
    one_problem(bad(config=[{"type": "upload_file", "parameters": {"files": [{"path": "/x"}]}}]),
                "'local_path' and 'path'")


def test_window_steps():
    one_problem(bad(config=[{"type": "activate_window", "parameters": {"window_name": ""}}]),
                "'window_name' must be a non-empty string")
    one_problem(bad(config=[{"type": "close_window", "parameters": {"window_name": "x", "strict": "yes"}}]),
                "'strict' must be true or false")


def test_osworld_steps_drums_cannot_run_are_rejected_only_when_asked():
    task = bad(config=[{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://x"]}}])
    load_task(task)  # valid OSWorld
    one_problem(task, "step type 'chrome_open_tabs' is OSWorld's but Drums' offline setup does not",
                require_drums_support=True)


def test_unknown_metric_and_getter():
    ev = dict(GOOD["evaluator"], func="exact_matches")
    one_problem(bad(evaluator=ev), "unknown metric 'exact_matches'")
    ev = dict(GOOD["evaluator"], result={"type": "vm_command"})
    one_problem(bad(evaluator=ev), "unknown getter type 'vm_command'")
    ev = dict(GOOD["evaluator"], result={"command": "ls"})
    one_problem(bad(evaluator=ev), "missing getter 'type'")


def test_osworld_metrics_drums_lacks_are_rejected_only_when_asked():
    ev = {"func": "compare_table", "result": {"type": "vm_file", "path": "/a.xlsx", "dest": "a.xlsx"},
          "expected": {"type": "cloud_file", "path": "https://x/a.xlsx", "dest": "b.xlsx"}}
    load_task(bad(evaluator=ev))
    problems = problems_of(bad(evaluator=ev), require_drums_support=True)
    assert any("metric 'compare_table' is OSWorld's but Drums does not implement it" in p for p in problems)
    assert any("getter 'cloud_file' is OSWorld's but Drums does not implement it" in p for p in problems)


def test_evaluator_shape():
    one_problem(bad(evaluator="exact_match"), "'evaluator' must be an object")
    one_problem(bad(evaluator={"result": {"type": "rule", "rules": {}}}), "missing 'func'")
    one_problem(bad(evaluator={"func": "exact_match"}), "missing 'result' getter config")
    one_problem(bad(evaluator=dict(GOOD["evaluator"], options=[{}])),
                "options must be an object when func is a single name")
    one_problem(bad(evaluator=dict(GOOD["evaluator"], result=[GOOD["evaluator"]["result"]])),
                "must be one getter config when func is a single name")
    one_problem(bad(evaluator=dict(GOOD["evaluator"], postconfig={"type": "sleep"})),
                "postconfig must be a list")
    one_problem(bad(evaluator=dict(GOOD["evaluator"], postconfig=[{"type": "nap", "parameters": {}}])),
                "evaluator.postconfig[0]: unknown step type 'nap'")


def test_getter_configs():
    ev = dict(GOOD["evaluator"], result={"type": "vm_file", "path": "/x"})
    one_problem(bad(evaluator=ev), "vm_file needs 'dest'")
    ev = dict(GOOD["evaluator"], result={"type": "vm_file", "path": "/x", "dest": "/abs"})
    one_problem(bad(evaluator=ev), "must be a relative name in the cache dir")
    ev = dict(GOOD["evaluator"], result={"type": "vm_file", "path": ["/x"], "dest": ["a", "b"], "multi": True})
    one_problem(bad(evaluator=ev), "lists of strings of the same length")
    ev = dict(GOOD["evaluator"], expected={"type": "rule"})
    one_problem(bad(evaluator=ev), "rule needs 'rules'")
    ev = dict(GOOD["evaluator"], expected={"type": "cache_file"})
    one_problem(bad(evaluator=ev), "cache_file needs a 'path'")
    ev = dict(GOOD["evaluator"], result={"type": "vm_command_line"})
    one_problem(bad(evaluator=ev), "vm_command_line needs 'command'")


def test_list_evaluators_must_be_consistent():
    rule = {"type": "rule", "rules": {"expected": "x"}}
    base = {"func": ["exact_match", "exact_match"], "result": [rule, rule], "expected": [rule, rule]}
    load_task(bad(evaluator=base), require_drums_support=True)
    one_problem(bad(evaluator=dict(base, result=[rule])), "evaluator.result must be a list of 2 getter configs")
    one_problem(bad(evaluator=dict(base, expected=rule)), "evaluator.expected must be a list of 2")
    one_problem(bad(evaluator=dict(base, expected=[rule, None])),
                "evaluator.expected[1] is empty: OSWorld 1.0.2 calls the expected getter")
    one_problem(bad(evaluator=dict(base, options={})), "options must be a list of 2 objects")
    one_problem(bad(evaluator=dict(base, options=[{}, 3])), "entries must be objects or null")
    one_problem(bad(evaluator=dict(base, conj="xor")), "conj must be 'and' or 'or'")
    one_problem(bad(evaluator=dict(base, func=[])), "non-empty list of names")


def test_infeasible_needs_no_getters():
    task = load_task(bad(config=[], evaluator={"func": "infeasible"}, drums_solution=["FAIL"]),
                     require_drums_support=True)
    assert task.evaluator == {"func": "infeasible"}


def test_solutions_are_checked():
    one_problem(bad(drums_solution=[]), "drums_solution: must be a non-empty list")
    one_problem(bad(drums_solution="DONE"), "drums_solution: must be a non-empty list")
    one_problem(bad(drums_solution=[{"action_type": "DONE"}]), "drums_solution[0]: must be a string")
    one_problem(bad(drums_wrong_solution=["pyautogui.click("]),
                "drums_wrong_solution[0]: not valid Python after OSWorld's pyautogui prefix")
    # a compound statement cannot follow the prefix's "; " on the same line
    one_problem(bad(drums_solution=["for i in range(3): pass"]), "not valid Python")
    load_task(bad(drums_solution=["import os\nfor i in range(3):\n    pass", "WAIT", "FAIL"]))


def test_known_name_lists_match_osworld_1_0_2():
    assert len(OSWORLD_METRICS) == 137 and len(OSWORLD_GETTERS) == 54
    assert {"exact_match", "compare_table", "infeasible"} <= OSWORLD_METRICS
    assert {"vm_command_line", "vm_file", "rule", "cache_file", "cloud_file"} <= OSWORLD_GETTERS
