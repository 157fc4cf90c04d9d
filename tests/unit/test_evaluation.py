"""Drums' setup runner and evaluate() semantics, against a scripted fake guest."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from drums_osworld.evaluation import (
    DownloadNotCached,
    SetupError,
    download_cache_path,
    evaluate,
    run_setup,
    run_task_setup,
    substitute_placeholders,
)
from drums_osworld.evaluation import getters as G
from drums_osworld.guest.client import ExecResult, GuestHTTPError, GuestUnavailable
from drums_osworld.tasks import TaskError


class FakeGuest:
    """Answers like the guest server; ``outputs`` maps a command (str or tuple) to stdout."""

    def __init__(self, outputs: dict[Any, str] | None = None, files: dict[str, bytes] | None = None) -> None:
        self.outputs = outputs or {}
        self.files = dict(files or {})
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, Exception] = {}
        self.exec_results: list[str] = []

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]

    def wait_ready(self, timeout: float = 100.0, interval: float = 1.0) -> None:
        self.calls.append(("wait_ready", timeout))
        self._maybe_fail("wait_ready")

    def execute(self, command, shell=False, *, setup=False, timeout=None) -> ExecResult:
        self.calls.append(("setup/execute" if setup else "execute", (command, shell)))
        self._maybe_fail("execute")
        key = tuple(command) if isinstance(command, list) else command
        out = self.exec_results.pop(0) if self.exec_results else self.outputs.get(key, "")
        return ExecResult.from_json({"status": "success", "output": out, "error": f"err:{key}", "returncode": 0})

    def launch(self, command, shell=False) -> str:
        self.calls.append(("launch", (command, shell)))
        self._maybe_fail("launch")
        return "launched"

    def upload(self, path: str, data: bytes) -> str:
        self.calls.append(("upload", path))
        self._maybe_fail("upload")
        self.files[path] = data
        return "ok"

    def get_file(self, path: str) -> bytes | None:
        self.calls.append(("file", path))
        self._maybe_fail("file")
        return self.files.get(path)

    def open_file(self, path: str) -> str:
        self.calls.append(("open", path))
        self._maybe_fail("open")
        return "ok"

    def activate_window(self, window_name, strict=False, by_class=False) -> str:
        self.calls.append(("activate_window", (window_name, strict, by_class)))
        self._maybe_fail("activate_window")
        return "ok"

    def close_window(self, window_name, strict=False, by_class=False) -> str:
        self.calls.append(("close_window", (window_name, strict, by_class)))
        self._maybe_fail("close_window")
        return "ok"


def http_error(status: int = 500) -> GuestHTTPError:
    return GuestHTTPError("boom", status_code=status, body="boom")


# -- setup ---------------------------------------------------------------------------------------
def test_placeholders_follow_osworld():
    cmd = "echo {CLIENT_PASSWORD} {SCREEN_WIDTH}x{SCREEN_HEIGHT} {SCREEN_WIDTH_HALF},{SCREEN_HEIGHT_HALF}"
    assert substitute_placeholders(cmd, client_password="pw", screen_width=1921, screen_height=1081) == \
        "echo pw 1921x1081 960,540"
    assert substitute_placeholders(["a{CLIENT_PASSWORD}", "{SCREEN_HEIGHT_HALF}"], client_password="p",
                                   screen_width=10, screen_height=20) == ["ap", "10"]


def test_execute_and_command_substitute_and_write_cache_files(tmp_path):
    guest = FakeGuest(outputs={"echo password 960": "password 960\n"})
    steps = [{"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD} {SCREEN_WIDTH_HALF}",
                                                "shell": True, "stdout": "out.txt", "stderr": "err.txt"}},
             {"type": "command", "parameters": {"command": ["x", "{SCREEN_HEIGHT}"], "stdout": "c.txt"}},
             {"type": "launch", "parameters": {"command": ["app", "{CLIENT_PASSWORD}"]}}]
    run_setup(steps, guest, task_cache_dir=tmp_path / "c")
    assert guest.calls[0] == ("wait_ready", 100.0)
    assert guest.calls[1] == ("setup/execute", ("echo password 960", True))
    assert guest.calls[2] == ("setup/execute", (["x", "1080"], False))
    assert guest.calls[3] == ("launch", (["app", "{CLIENT_PASSWORD}"], False)), "launch is not substituted"
    assert (tmp_path / "c" / "out.txt").read_text() == "password 960\n"
    assert (tmp_path / "c" / "err.txt").read_text() == "err:echo password 960"
    assert (tmp_path / "c" / "c.txt").read_text() == ""


def test_empty_setup_probes_nothing(tmp_path):
    guest = FakeGuest()
    run_setup([], guest, task_cache_dir=tmp_path / "c")
    assert guest.calls == [] and (tmp_path / "c").is_dir()


def test_unreachable_guest_runs_nothing(tmp_path):
    guest = FakeGuest()
    guest.fail["wait_ready"] = GuestUnavailable("down")
    with pytest.raises(GuestUnavailable):
        run_setup([{"type": "sleep", "parameters": {"seconds": 0}}], guest, task_cache_dir=tmp_path)


def test_unknown_step_type_rejected_before_anything_runs(tmp_path):
    guest = FakeGuest()
    steps = [{"type": "execute", "parameters": {"command": "ls"}},
             {"type": "chrome_open_tabs", "parameters": {"urls_to_open": []}}]
    with pytest.raises(SetupError, match="Drums cannot run step type 'chrome_open_tabs'") as info:
        run_setup(steps, guest, task_cache_dir=tmp_path)
    assert info.value.step_index == 1 and info.value.reason == "SETUP_STEP_UNSUPPORTED"
    assert guest.calls == []


def test_launch_string_is_split_like_osworld(tmp_path):
    guest = FakeGuest()
    run_setup([{"type": "launch", "parameters": {"command": "libreoffice --writer"}},
               {"type": "launch", "parameters": {"command": "a && b", "shell": True}}], guest,
              task_cache_dir=tmp_path)
    assert guest.calls[1:] == [("launch", (["libreoffice", "--writer"], False)), ("launch", ("a && b", True))]


@pytest.mark.parametrize("step_type,params", [
    ("launch", {"command": ["x"]}),
    ("execute", {"command": "x"}),
    ("activate_window", {"window_name": "x"}),
    ("close_window", {"window_name": "x"}),
])
def test_failures_osworld_only_logs_are_logged_unless_strict(tmp_path, step_type, params):
    guest = FakeGuest()
    guest.fail[{"execute": "execute"}.get(step_type, step_type)] = http_error()
    step = {"type": step_type, "parameters": params}
    run_setup([step], guest, task_cache_dir=tmp_path)
    with pytest.raises(SetupError) as info:
        run_setup([step], guest, task_cache_dir=tmp_path, strict=True)
    assert info.value.step_index == 0 and info.value.step_type == step_type
    assert isinstance(info.value.__cause__, GuestHTTPError)


def test_open_failure_fails_the_setup(tmp_path):
    guest = FakeGuest()
    guest.fail["open"] = http_error(404)
    with pytest.raises(SetupError, match="setup step 2 \\(open\\) failed") as info:
        run_setup([{"type": "sleep", "parameters": {"seconds": 0}},
                   {"type": "open", "parameters": {"path": "~/x.odt"}}], guest, task_cache_dir=tmp_path)
    assert info.value.step_index == 1


def test_execute_until_polls_and_times_out(tmp_path):
    guest = FakeGuest()
    guest.exec_results = ["", "", "ready\n"]
    run_setup([{"type": "execute", "parameters": {"command": "check", "until": {"stdout": "ready"}}}], guest,
              task_cache_dir=tmp_path)
    assert sum(1 for c in guest.calls if c[0] == "setup/execute") == 3
    guest = FakeGuest()
    with pytest.raises(SetupError, match="not met within") as info:
        run_setup([{"type": "execute", "parameters": {"command": "check", "until": {"returncode": 1}}}], guest,
                  task_cache_dir=tmp_path, until_timeout=0.5)
    assert info.value.reason == "SETUP_UNTIL_TIMEOUT"


def test_execute_until_gives_up_after_five_failures(tmp_path):
    guest = FakeGuest()
    guest.fail["execute"] = http_error()
    run_setup([{"type": "execute", "parameters": {"command": "x", "until": {"stdout": "y"}}}], guest,
              task_cache_dir=tmp_path)
    assert sum(1 for c in guest.calls if c[0] == "setup/execute") == 5


def test_upload_file(tmp_path):
    local = tmp_path / "local.bin"
    local.write_bytes(b"data")
    guest = FakeGuest()
    run_setup([{"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/a.bin"}]}}],
              guest, task_cache_dir=tmp_path / "c")
    assert guest.files["~/a.bin"] == b"data"
    with pytest.raises(SetupError, match="Invalid local path"):
        run_setup([{"type": "upload_file", "parameters": {"files": [{"local_path": str(tmp_path / "no"),
                                                                     "path": "~/b"}]}}],
                  guest, task_cache_dir=tmp_path / "c")


def test_upload_file_retries_three_times(tmp_path, monkeypatch):
    monkeypatch.setattr("drums_osworld.evaluation.setup.time.sleep", lambda s: None)
    local = tmp_path / "local.bin"
    local.write_bytes(b"data")
    guest = FakeGuest()
    guest.fail["upload"] = http_error()
    with pytest.raises(SetupError) as info:
        run_setup([{"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/a"}]}}],
                  guest, task_cache_dir=tmp_path / "c")
    assert sum(1 for c in guest.calls if c[0] == "upload") == 3
    assert isinstance(info.value.__cause__, GuestHTTPError)


def test_download_comes_from_the_cache_only(tmp_path):
    url = "https://example.org/data/report.xlsx"
    guest = FakeGuest()
    step = {"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/report.xlsx"}]}}
    with pytest.raises(DownloadNotCached) as info:
        run_setup([step], guest, task_cache_dir=tmp_path / "c")
    expected = tmp_path / "c" / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_report.xlsx"
    assert download_cache_path(tmp_path / "c", url, "/home/user/report.xlsx") == expected
    assert str(expected) in str(info.value) and url in str(info.value)
    assert info.value.reason == "DOWNLOAD_NOT_CACHED" and info.value.step_index == 0
    assert not any(c[0] == "upload" for c in guest.calls)
    expected.write_bytes(b"xlsx")
    run_setup([step], guest, task_cache_dir=tmp_path / "c")
    assert guest.files["/home/user/report.xlsx"] == b"xlsx"


def test_windows_and_sleep(tmp_path):
    guest = FakeGuest()
    run_setup([{"type": "activate_window", "parameters": {"window_name": "W", "strict": True}},
               {"type": "close_window", "parameters": {"window_name": "Tip", "by_class": True}},
               {"type": "sleep", "parameters": {"seconds": 0.01}}], guest, task_cache_dir=tmp_path)
    assert guest.calls[1:] == [("activate_window", ("W", True, False)), ("close_window", ("Tip", False, True))]


def test_bad_parameters_become_setup_errors(tmp_path):
    with pytest.raises(SetupError, match="setup step 1 \\(sleep\\) failed"):
        run_setup([{"type": "sleep", "parameters": {"second": 1}}], FakeGuest(), task_cache_dir=tmp_path)


# -- getters -------------------------------------------------------------------------------------
def test_vm_command_getters(tmp_path):
    guest = FakeGuest(outputs={"ls": "a\n"})
    env = G.EvalContext(guest, str(tmp_path))
    assert G.get_vm_command_line(env, {"command": "ls"}) == "a\n"
    assert G.get_vm_command_error(env, {"command": "ls", "shell": True}) == "err:ls"
    assert guest.calls[-1] == ("execute", ("ls", True))
    guest.fail["execute"] = http_error()
    assert G.get_vm_command_line(env, {"command": "ls"}) is None
    guest.fail["execute"] = GuestUnavailable("down")
    with pytest.raises(GuestUnavailable):
        G.get_vm_command_line(env, {"command": "ls"})


def test_vm_file_getter(tmp_path):
    guest = FakeGuest(files={"/a": b"A", "/b": b"B"})
    env = G.EvalContext(guest, str(tmp_path / "cache"))
    path = G.get_vm_file(env, {"path": "/a", "dest": "a.txt"})
    assert path == str(tmp_path / "cache" / "a.txt") and Path(path).read_bytes() == b"A"
    assert G.get_vm_file(env, {"path": "/missing", "dest": "m.txt"}) is None
    multi = {"multi": True, "path": ["/a", "/missing", "/b"], "dest": ["1", "2", "3"], "gives": [0, 1, 2]}
    assert G.get_vm_file(env, multi) == [str(tmp_path / "cache" / "1"), None, str(tmp_path / "cache" / "3")]
    assert G.get_vm_file(env, dict(multi, gives=[2])) == str(tmp_path / "cache" / "3")
    assert G.get_vm_file(env, dict(multi, gives=[])) == []
    stamped = G.get_vm_file(env, {"path": "/a", "dest": "s.txt", "time_suffix": True, "time_format": "%Y"})
    assert Path(stamped).name.startswith("s_") and stamped.endswith(".txt")
    guest.fail["file"] = http_error(500)
    assert G.get_vm_file(env, {"path": "/a", "dest": "x"}) is None


def test_rule_and_cache_file_getters(tmp_path):
    env = G.EvalContext(None, str(tmp_path))
    assert G.get_rule(env, {"rules": {"expected": 1}}) == {"expected": 1}
    (tmp_path / "f").write_text("x")
    assert G.get_cache_file(env, {"path": "f"}) == str(tmp_path / "f")
    with pytest.raises(AssertionError):
        G.get_cache_file(env, {"path": "nope"})


# -- evaluate ------------------------------------------------------------------------------------
def make_task(evaluator: dict, config: list | None = None, task_id: str = "t") -> dict:
    return {"id": task_id, "instruction": "x", "config": config or [], "evaluator": evaluator}


CMD = {"type": "vm_command_line", "command": "probe", "shell": True}


def rule(value):
    return {"type": "rule", "rules": {"expected": value}}


def test_single_metric(tmp_path):
    guest = FakeGuest(outputs={"probe": "yes\n"})
    task = make_task({"func": "exact_match", "result": CMD, "expected": rule("yes\n")})
    assert evaluate(task, guest, cache_dir=tmp_path) == 1.0
    assert evaluate(task, guest, "DONE", cache_dir=tmp_path) == 1.0
    assert evaluate(task, guest, "FAIL", cache_dir=tmp_path) == 0.0
    assert evaluate(task, guest, {"action_type": "FAIL"}, cache_dir=tmp_path) == 1.0, "only the string counts"
    assert (tmp_path / "t").is_dir()


def test_infeasible(tmp_path):
    task = make_task({"func": "infeasible"})
    assert evaluate(task, FakeGuest(), "FAIL", cache_dir=tmp_path) == 1.0
    assert evaluate(task, FakeGuest(), "DONE", cache_dir=tmp_path) == 0.0
    assert evaluate(task, FakeGuest(), None, cache_dir=tmp_path) == 0.0


def test_postconfig_runs_first_even_when_the_answer_is_fail(tmp_path):
    guest = FakeGuest()
    task = make_task({"func": "infeasible",
                      "postconfig": [{"type": "execute", "parameters": {"command": "post", "stdout": "p.txt"}}]})
    assert evaluate(task, guest, "FAIL", cache_dir=tmp_path) == 1.0
    assert ("setup/execute", ("post", False)) in guest.calls
    assert (tmp_path / "t" / "p.txt").exists()


def test_list_and_or(tmp_path):
    guest = FakeGuest(outputs={"probe": "yes\n"})
    one = rule("yes\n")
    zero = rule("no\n")
    partial_files = {"/a": b"1\n2\n3\n4\n", "/b": b"1\n2\n3\n5\n"}
    guest.files.update(partial_files)
    partial = ({"type": "vm_file", "path": "/a", "dest": "a"}, {"type": "vm_file", "path": "/b", "dest": "b"})

    def ev(funcs, results, expecteds, conj=None):
        e = {"func": funcs, "result": results, "expected": expecteds}
        if conj:
            e["conj"] = conj
        return make_task(e)

    assert evaluate(ev(["exact_match", "exact_match"], [CMD, CMD], [one, one]), guest, cache_dir=tmp_path) == 1.0
    assert evaluate(ev(["exact_match", "exact_match"], [CMD, CMD], [one, zero]), guest, cache_dir=tmp_path) == 0.0
    assert evaluate(ev(["diff_text_file", "exact_match"], [partial[0], CMD], [partial[1], one]), guest,
                    cache_dir=tmp_path) == 0.875
    assert evaluate(ev(["exact_match", "exact_match"], [CMD, CMD], [zero, one], "or"), guest,
                    cache_dir=tmp_path) == 1.0
    assert evaluate(ev(["diff_text_file", "exact_match"], [partial[0], CMD], [partial[1], zero], "or"), guest,
                    cache_dir=tmp_path) == 0.75


def test_options_single_and_list(tmp_path):
    guest = FakeGuest(files={"/a": b"HELLO  there"}, outputs={"gold": "hello there"})
    post = [{"type": "execute", "parameters": {"command": "gold", "stdout": "gold.txt"}}]
    vm = {"type": "vm_file", "path": "/a", "dest": "a.txt"}
    gold = {"type": "cache_file", "path": "gold.txt"}
    single = make_task({"func": "compare_text_file", "result": vm, "expected": gold, "postconfig": post,
                        "options": {"ignore_case": True, "ignore_blanks": True}})
    assert evaluate(single, guest, cache_dir=tmp_path) == 1.0
    listed = make_task({"func": ["compare_text_file", "compare_text_file"], "result": [vm, vm],
                        "expected": [gold, gold], "postconfig": post, "conj": "or",
                        "options": [None, {"ignore_case": True, "ignore_blanks": True}]})
    assert evaluate(listed, guest, cache_dir=tmp_path) == 1.0


def test_file_not_found_from_the_result_getter_scores_zero(tmp_path, monkeypatch):
    def missing(env, config):
        raise FileNotFoundError(config.get("path"))

    monkeypatch.setitem(G.GETTERS, "vm_file", missing)
    vm = {"type": "vm_file", "path": "/a", "dest": "a"}
    assert evaluate(make_task({"func": "compare_text_file", "result": vm}), FakeGuest(), cache_dir=tmp_path) == 0.0
    listed = make_task({"func": ["exact_match", "exact_match"], "result": [CMD, vm], "expected": [rule(""), rule("")]})
    assert evaluate(listed, FakeGuest(), cache_dir=tmp_path) == 0.0
    # OSWorld quirk, kept: with "or" the failed getter leaves the previous result in place ...
    listed_or = make_task({"func": ["exact_match", "exact_match"], "conj": "or", "result": [CMD, vm],
                           "expected": [rule("x"), rule("")]})
    assert evaluate(listed_or, FakeGuest(), cache_dir=tmp_path) == 1.0
    # ... and with no previous result it fails as OSWorld does
    first_or = make_task({"func": ["exact_match", "exact_match"], "conj": "or", "result": [vm, CMD],
                          "expected": [rule(""), rule("")]})
    with pytest.raises(UnboundLocalError):
        evaluate(first_or, FakeGuest(), cache_dir=tmp_path)


def test_other_errors_propagate(tmp_path):
    vm = {"type": "vm_file", "path": "/a", "dest": "a"}
    task = make_task({"func": "compare_text_file", "result": vm, "expected": {"type": "cache_file", "path": "no"}})
    with pytest.raises(AssertionError):
        evaluate(task, FakeGuest(files={"/a": b"x"}), cache_dir=tmp_path)
    guest = FakeGuest()
    guest.fail["execute"] = GuestUnavailable("down")
    with pytest.raises(GuestUnavailable):
        evaluate(make_task({"func": "exact_match", "result": CMD, "expected": rule("")}), guest, cache_dir=tmp_path)


def test_tasks_drums_cannot_evaluate_are_rejected(tmp_path):
    task = make_task({"func": "compare_table", "result": {"type": "vm_file", "path": "/a", "dest": "a"}})
    with pytest.raises(TaskError, match="compare_table"):
        evaluate(task, FakeGuest(), cache_dir=tmp_path)


def test_run_task_setup(tmp_path):
    guest = FakeGuest()
    task = run_task_setup(make_task({"func": "infeasible"},
                                    [{"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD}",
                                                                        "shell": True}}], task_id="abc"),
                          guest, cache_dir=tmp_path, client_password="s3cret")
    assert task.id == "abc" and (tmp_path / "abc").is_dir()
    assert ("setup/execute", ("echo s3cret", True)) in guest.calls
