"""Drums' setup, getters, metrics and evaluate() against OSWorld's own code, on the same inputs.

OSWorld runs from the real ``desktop-env==1.0.2`` in the test venv of ``tests/support/osworld_harness.py``
(installed ``--no-deps``, heavy imports stubbed); Drums runs in this process. Compared:

- every metric Drums implements, on many cases (text, CSV, hand-made and LibreOffice-made
  .docx/.odt files, every option), value for value or exception type for exception type;
- the ``rule`` and ``cache_file`` getters;
- the setup steps: the HTTP requests OSWorld's ``SetupController`` and Drums' ``run_setup`` send
  to the same guest, request for request, and the files they leave in the cache;
- ``evaluate()``: OSWorld's ``DesktopEnv.evaluate`` (on a ``DesktopEnv`` wired to a local guest)
  and Drums' ``evaluate`` on the same guest states: the bundled tasks that need no display
  (before any action, after the wrong and the right solution, with ``FAIL``) and synthetic
  evaluators for the conj/list/postconfig/error rules.

The guest is ``tests/support/local_guest.LocalGuestServer``: the guest server's HTTP API, run on this host
in a scratch ``HOME``.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.docfiles import docx_cases, odt_cases
from tests.support.local_guest import LocalGuest, LocalGuestServer
from tests.support.osworld_harness import ensure_osworld_venv, run_osworld

from drums_osworld.evaluation import evaluate, run_setup
from drums_osworld.evaluation.getters import EvalContext, get_cache_file, get_rule
from drums_osworld.evaluation.metrics import METRICS
from drums_osworld.guest.client import GuestClient
from drums_osworld.tasks import list_tasks, load_task


@pytest.fixture(scope="module")
def osworld_venv() -> Path:
    return ensure_osworld_venv()


def _outcome(fn, *args, **kwargs) -> list[Any]:
    try:
        return ["ok", fn(*args, **kwargs)]
    except Exception as exc:  # noqa: BLE001 - the exception type is what is compared
        return ["err", type(exc).__name__]


def _same(ours: list[Any], theirs: list[Any]) -> bool:
    if ours[0] != theirs[0]:
        return False
    if ours[0] == "err":
        return ours[1] == theirs[1]
    a, b = ours[1], theirs[1]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-12)
    return json.loads(json.dumps(a, default=repr)) == b


def _assert_all_same(cases: list[Any], ours: list[list[Any]], theirs: list[list[Any]]) -> None:
    assert len(ours) == len(theirs) == len(cases)
    diffs = [(c, o, t) for c, o, t in zip(cases, ours, theirs, strict=True) if not _same(o, t)]
    assert not diffs, "Drums and OSWorld disagree:\n" + "\n".join(
        f"  {c!r:.300}: drums {o!r} osworld {t!r}" for c, o, t in diffs[:20])


# -- inputs -------------------------------------------------------------------------------------
def _soffice_convert(src: str, fmt: str, outdir: Path, home: Path) -> str | None:
    """Convert with LibreOffice (headless, private profile); None when LibreOffice is absent."""
    if shutil.which("soffice") is None:
        return None
    outdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["soffice", f"-env:UserInstallation=file://{home}/lo-profile", "--headless",
                    "--convert-to", fmt, "--outdir", str(outdir), src],
                   env={**os.environ, "HOME": str(home)}, capture_output=True, timeout=180, check=True)
    out = outdir / (Path(src).stem + "." + fmt.split(":")[0])
    return str(out) if out.exists() else None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("parity-inputs")
    t = {}
    for name, text in {
        "hello": "Hello from Drums\n", "hello_nonl": "Hello from Drums", "hello_caps": "  HELLO\tfrom\n\ndrums ",
        "lines4": "1\n2\n3\n4\n", "lines4b": "1\n2\n3\n5\n", "empty": "",
        "list": "org.openoffice.languagetool.oxt\nopenjdk-17-jre\nother\n",
        "csv": "Name,Score\nAda,91\nGrace,88\n", "csv_nonl": "Name,Score\nAda,91\nGrace,88",
        "csv_spaces": " Name,Score \nAda,91\nGrace,88\n", "csv_caps": "NAME,SCORE\nada,91\ngrace,88\n",
        "csv_semicolon": "Name;Score\nAda;91\nGrace;88\n",
    }.items():
        p = d / f"{name}.txt"
        p.write_text(text)
        t[name] = str(p)
    latin = d / "latin.txt"
    latin.write_bytes("Name,Score\nAd\u00e9,91\n".encode("latin-1"))
    t["latin"] = str(latin)
    t["missing"] = str(d / "missing.txt")
    docx = docx_cases(d / "docx")
    odt = odt_cases(d / "odt")
    lo_home = d / "lo-home"
    lo_home.mkdir()
    letter = d / "letter.txt"
    letter.write_text("Dear Ada,\nThank you for the notes on the Analytical Engine.\n\nYours sincerely,\n"
                      "Charles\n")
    for fmt, pool in (("docx:MS Word 2007 XML", docx), ("odt", odt)):
        made = _soffice_convert(str(letter), fmt, d / "lo" / fmt.split(":")[0], lo_home)
        if made:
            pool["lo_letter"] = made
    for src, fmt, pool, key in ((docx["inner"], "odt", odt, "lo_from_inner_docx"),
                                (odt["dropped"], "docx:MS Word 2007 XML", docx, "lo_from_dropped_odt"),
                                (odt["header"], "docx:MS Word 2007 XML", docx, "lo_from_header_odt"),
                                (docx["plain"], "odt", odt, "lo_from_plain_docx")):
        made = _soffice_convert(src, fmt, d / "lo" / key, lo_home)
        if made:
            pool[key] = made
    t["docx"], t["odt"] = docx, odt
    return t


def metric_cases(t: dict[str, Any]) -> list[tuple[str, list[Any], dict[str, Any]]]:
    c: list[tuple[str, list[Any], dict[str, Any]]] = []
    for result, rules in [("Directory exists.\n", {"expected": "Directory exists.\n"}),
                          ("Directory exists.", {"expected": "Directory exists.\n"}), (None, {"expected": None}),
                          ([1, "a"], {"expected": [1, "a"]}), (37, {"expected": "37"}), ("x", {"expect": "x"})]:
        c.append(("exact_match", [result, rules], {}))
    for result in ["executable\n", "not-executable\n", None, "", "abc"]:
        for rules in [{"include": ["executable"], "exclude": ["not-executable"]}, {}, {"include": ["a", "c"]},
                      {"exclude": ["b"]}]:
            c.append(("check_include_exclude", [result, rules], {}))
    for result, rules in [("a\nreport.txt\n", {"expected": "report.txt"}), (["a", "b"], {"expected": "b"}),
                          (["a", "b"], {"expected": "c"}), ("", {"expected": ""}), (None, {"expected": "x"})]:
        c.append(("is_in_list", [result, rules], {}))
        c.append(("match_in_list", [rules["expected"], {"expected": result}], {}))
    for a, b, opts in [(1, "1", {}), ("ABC", "abc", {"ignore_case": True}), ("ABC", "abc", {}),
                       (["A", 1], ["a", "1"], {"type": "list", "ignore_case": True}),
                       (["A"], ["A", "B"], {"type": "list"}), ("A", ["A"], {"type": "list"}), (1, 1, {"type": "x"})]:
        c.append(("literal_match", [a, b], opts))
    for a, b in [("", ""), ("a", ""), ("abc", "abd"), ("Drums was here", "Drums were here"),
                 ("kitten", "sitting"), ("\u00e9t\u00e9 \u2603", "ete \u2603"), ("x" * 300, "x" * 299 + "y")]:
        c.append(("fuzzy_match", [a, {"expected": b}], {}))
    texts = ["hello", "hello_nonl", "hello_caps", "empty", "lines4"]
    for a in texts + ["missing"]:
        for b in ["hello", "hello_nonl"]:
            for opts in [{}, {"ignore_blanks": True}, {"ignore_blanks": True, "ignore_case": True},
                         {"ignore_case": True}]:
                c.append(("compare_text_file", [t[a], t[b]], opts))
    c += [("compare_text_file", [None, t["hello"]], {}), ("compare_text_file", ["", t["hello"]], {}),
          ("compare_text_file", [t["hello"], None], {}), ("compare_text_file", [t["hello"], t["missing"]], {})]
    for a, b in [("lines4", "lines4"), ("lines4", "lines4b"), ("empty", "lines4"), ("empty", "empty")]:
        c.append(("diff_text_file", [t[a], t[b]], {}))
    c.append(("diff_text_file", [None, t["lines4"]], {}))
    for rules in [{"expect": [r"languagetool\.oxt"]}, {"expect": [r"openjdk-\d+-(jre|jdk)"], "unexpect": ["other"]},
                  {"expect": ["missing"]}, {}]:
        c.append(("check_list", [t["list"], rules], {}))
    c.append(("check_list", [None, {}], {}))
    for rules in [{"expect": [{"Name": "Ada", "Score": "91"}]}, {"expect": [{"Name": "Ada"}],
                                                                 "unexpect": [{"Name": "Grace"}]},
                  {"unexpect": [{"Name": "Linus"}]}, {"expect": [{"Nope": "x"}]}]:
        c.append(("check_csv", [t["csv"], rules], {}))
    c.append(("check_csv", [None, {}], {}))
    for f, cfg in [("hello", {"expected": ["Hello", "Drums"]}), ("hello", {"expected": ["nope"]}),
                   ("missing", {"expected": []}), ("hello", {})]:
        c.append(("file_contains", [t[f], cfg], {}))
    c.append(("file_contains", [None, {"expected": []}], {}))
    csvs = ["csv", "csv_nonl", "csv_spaces", "csv_caps", "csv_semicolon", "latin", "empty"]
    for a in csvs + ["missing"]:
        for b in ["csv", "latin"]:
            for opts in [{}, {"strict": False}, {"ignore_case": True}, {"strict": False, "ignore_case": True}]:
                c.append(("compare_csv", [t[a], t[b]], opts))
    c += [("compare_csv", [None, t["csv"]], {}), ("compare_csv", [t["csv"], [t["missing"], t["csv"]]], {}),
          ("compare_csv", [t["csv"], t["missing"]], {}), ("compare_csv", [t["csv"], []], {})]
    option_sets = [{}, {"ignore_blanks": False}, {"ignore_blanks": False, "fuzzy_match": True},
                   {"fuzzy_match": True}, {"content_only": True, "ignore_case": True},
                   {"ignore_order": True, "delete_empty_lines": True, "ignore_blanks": False},
                   {"ignore_case": True, "ignore_blanks": False}]
    for pool in ("docx", "odt"):
        files = t[pool]
        for a in files.values():
            for b in files.values():
                for opts in option_sets:
                    c.append(("compare_docx_files", [a, b], opts))
    c += [("compare_docx_files", [t["docx"]["plain"], t["odt"]["plain"]], {}),
          ("compare_docx_files", [None, t["docx"]["plain"]], {}),
          ("compare_docx_files", [t["docx"]["plain"], t["missing"] + ".docx"], {}),
          ("compare_docx_files", [t["odt"]["plain"], t["missing"] + ".odt"], {}),
          ("compare_docx_files", [t["hello"], t["hello"]], {})]
    return c


_METRIC_SNIPPET = """
import json
import desktop_env.evaluators.metrics as M
cases = json.loads(open(CASES_PATH).read())
out = []
for name, args, kwargs in cases:
    try:
        out.append(["ok", getattr(M, name)(*args, **kwargs)])
    except Exception as exc:
        out.append(["err", type(exc).__name__])
emit(out)
"""


def _run_osworld_with(payload: Any, snippet: str, tmp_dir: Path) -> Any:
    path = tmp_dir / f"payload-{os.getpid()}-{id(payload)}.json"
    path.write_text(json.dumps(payload))
    return run_osworld(f"CASES_PATH = {str(path)!r}\n" + snippet, timeout=900)


def test_metrics_agree_with_osworld(osworld_venv, inputs, tmp_path):
    cases = metric_cases(inputs)
    assert "lo_letter" in inputs["docx"] or shutil.which("soffice") is None
    theirs = _run_osworld_with(cases, _METRIC_SNIPPET, tmp_path)
    ours = [_outcome(METRICS[name], *args, **kwargs) for name, args, kwargs in cases]
    _assert_all_same(cases, ours, theirs)
    names = {name for name, _, _ in cases}
    assert names == set(METRICS) - {"infeasible"}, "every Drums metric is compared"


def test_rule_and_cache_file_getters_agree_with_osworld(osworld_venv, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "present.txt").write_text("x")
    (cache / "sub").mkdir()
    cases = [["rule", {"type": "rule", "rules": {"expected": "Directory exists.\n"}}],
             ["rule", {"type": "rule", "rules": [1, {"a": None}]}],
             ["rule", {"type": "rule"}],
             ["cache_file", {"type": "cache_file", "path": "present.txt"}],
             ["cache_file", {"type": "cache_file", "path": "sub"}],
             ["cache_file", {"type": "cache_file", "path": "missing.txt"}],
             ["cache_file", {"type": "cache_file"}]]
    snippet = f"""
import json, types
import desktop_env.evaluators.getters as G
env = types.SimpleNamespace(cache_dir={str(cache)!r})
out = []
for kind, cfg in json.loads(open(CASES_PATH).read()):
    try:
        out.append(["ok", getattr(G, "get_" + kind)(env, cfg)])
    except Exception as exc:
        out.append(["err", type(exc).__name__])
emit(out)
"""
    theirs = _run_osworld_with(cases, snippet, tmp_path)
    env = EvalContext(guest=None, cache_dir=str(cache))
    fns = {"rule": get_rule, "cache_file": get_cache_file}
    ours = [_outcome(fns[kind], env, cfg) for kind, cfg in cases]
    _assert_all_same(cases, ours, theirs)


# -- a local guest over HTTP -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub_pyautogui(tmp_path_factory) -> Path:
    """A directory with a stub ``pyautogui`` (actions here need no display)."""
    d = tmp_path_factory.mktemp("stub-pyautogui")
    (d / "pyautogui.py").write_text("FAILSAFE = True\n")
    return d


class Guests:
    def __init__(self, root: Path, stub: Path) -> None:
        self.root, self.stub = root, stub
        self.items: list[tuple[LocalGuest, LocalGuestServer]] = []

    def new(self) -> tuple[LocalGuest, LocalGuestServer]:
        home = Path(tempfile.mkdtemp(prefix="guest-", dir=self.root))
        guest = LocalGuest(None, sys.executable, home, extra_env={"PYTHONPATH": str(self.stub)})
        server = LocalGuestServer(guest)
        self.items.append((guest, server))
        return guest, server

    def close(self) -> None:
        for guest, server in self.items:
            server.close()
            guest.kill_all()


@pytest.fixture
def guests(tmp_path, stub_pyautogui) -> Iterator[Guests]:
    g = Guests(tmp_path, stub_pyautogui)
    try:
        yield g
    finally:
        g.close()


def test_setup_steps_send_the_same_requests_as_osworld(osworld_venv, guests, tmp_path):
    local = tmp_path / "local-upload.bin"
    local.write_bytes(b"\x00upload\xffdata")
    url = "https://example.invalid/files/report.docx"
    config = [
        {"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD} {SCREEN_WIDTH} {SCREEN_HEIGHT}"
                                           " {SCREEN_WIDTH_HALF}x{SCREEN_HEIGHT_HALF} > ~/ph.txt", "shell": True}},
        {"type": "execute", "parameters": {"command": ["python", "-c", "print({SCREEN_WIDTH_HALF})"]}},
        {"type": "execute", "parameters": {"command": "ls ~/ph.txt ~/nope", "shell": True,
                                           "stdout": "out.txt", "stderr": "err.txt"}},
        {"type": "command", "parameters": {"command": ["cat", "~/ph.txt"], "stdout": "cat.txt"}},
        {"type": "execute", "parameters": {"command": "test -e ~/ph.txt && echo ready", "shell": True,
                                           "until": {"stdout": "ready"}}},
        {"type": "launch", "parameters": {"command": "true --flag {CLIENT_PASSWORD}"}},
        {"type": "launch", "parameters": {"command": ["true", "~/x"]}},
        {"type": "launch", "parameters": {"command": "true && true", "shell": True}},
        {"type": "sleep", "parameters": {"seconds": 0.1}},
        {"type": "activate_window", "parameters": {"window_name": "LibreOffice Writer"}},
        {"type": "activate_window", "parameters": {"window_name": "Writer", "strict": True, "by_class": True}},
        {"type": "close_window", "parameters": {"window_name": "Tip of the Day"}},
        {"type": "open", "parameters": {"path": "~/Documents/x.odt"}},
        {"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "~/up/local.bin"}]}},
        {"type": "download", "parameters": {"files": [{"url": url, "path": "~/Downloads/report.docx"}]}},
    ]
    results = {}
    for side in ("osworld", "drums"):
        guest, server = guests.new()
        cache = tmp_path / f"cache-{side}"
        cache.mkdir()
        # the download step's file, pre-seeded where OSWorld caches it
        (cache / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_report.docx").write_bytes(b"PK-not-really")
        if side == "osworld":
            snippet = f"""
import json
from desktop_env.controllers.setup import SetupController
sc = SetupController(vm_ip="127.0.0.1", server_port={server.port}, cache_dir={str(cache)!r},
                     client_password="password", screen_width=1280, screen_height=800)
emit(sc.setup(json.loads(open(CASES_PATH).read())))
"""
            assert _run_osworld_with(config, snippet, tmp_path) is True
        else:
            with GuestClient(base_url=server.url) as client:
                run_setup(config, client, task_cache_dir=cache, client_password="password",
                          screen_size=(1280, 800))
        files = {p.name: p.read_bytes().replace(str(guest.home).encode(), b"$HOME")
                 for p in sorted(cache.iterdir())}
        results[side] = (server.requests, files, (guest.home / "ph.txt").read_text(),
                         (guest.home / "up" / "local.bin").read_bytes(),
                         (guest.home / "Downloads" / "report.docx").read_bytes())
    theirs, ours = results["osworld"], results["drums"]
    assert ours[0] == theirs[0], "request sequences differ:\n" + "\n".join(
        f"  drums {o!r}\n  osw   {t!r}" for o, t in zip(ours[0], theirs[0], strict=False) if o != t)
    assert ours[1:] == theirs[1:]
    assert ours[2] == "password 1280 800 640x400\n"
    assert ours[1]["out.txt"] == b"$HOME/ph.txt\n" and b"$HOME/nope" in ours[1]["err.txt"]


# -- evaluate() ----------------------------------------------------------------------------------
_EVAL_SNIPPET = """
import json
from desktop_env.desktop_env import DesktopEnv
from desktop_env.controllers.python import PythonController
from desktop_env.controllers.setup import SetupController
out = []
for item in json.loads(open(CASES_PATH).read()):
    env = DesktopEnv.__new__(DesktopEnv)
    env.vm_ip, env.server_port = "127.0.0.1", item["port"]
    env.cache_dir_base = item["cache"]
    env.enable_proxy, env.is_environment_used = False, False
    env.controller = PythonController(vm_ip="127.0.0.1", server_port=item["port"])
    env.controller.retry_interval = 0   # a missing /file is retried 3 times; no need to wait 5 s each
    env.setup_controller = SetupController(vm_ip="127.0.0.1", server_port=item["port"], cache_dir=item["cache"],
                                           client_password="password", screen_width=1920, screen_height=1080)
    try:
        env._set_task_info(item["task"])
        env.setup_controller.reset_cache_dir(env.cache_dir)
        env.action_history = list(item["history"])
        out.append(["ok", env.evaluate()])
    except Exception as exc:
        out.append(["err", type(exc).__name__])
emit(out)
"""


def _compare_evaluations(items: list[dict[str, Any]], tmp_path: Path) -> None:
    """Score each item with OSWorld, then with Drums, on the same guest; compare."""
    theirs = _run_osworld_with(
        [{"task": i["task"], "port": i["server"].port, "cache": str(tmp_path / "osw-cache"),
          "history": i["history"]} for i in items], _EVAL_SNIPPET, tmp_path)
    ours = []
    for i in items:
        with GuestClient(base_url=i["server"].url) as client:
            last = i["history"][-1] if i["history"] else None
            ours.append(_outcome(evaluate, i["task"], client, last, cache_dir=tmp_path / "drums-cache"))
    labels = [f"{i['task']['id']} [{i['label']}]" for i in items]
    _assert_all_same(labels, ours, theirs)
    for i, o in zip(items, ours, strict=True):
        if "expect" in i:
            assert o == ["ok", i["expect"]], f"{i['task']['id']} [{i['label']}]: {o}"


def _apply(guest: LocalGuest, actions: list[str]) -> None:
    for action in actions:
        if action in ("WAIT", "DONE", "FAIL"):
            continue
        res = guest.run_python(action)
        assert res.returncode == 0, res.error


def _needs_display(task) -> bool:
    steps = task.config + task.evaluator.get("postconfig", [])
    return any(s["type"] in ("launch", "open", "activate_window", "close_window") for s in steps) or any(
        "pyautogui." in a for a in (task.solution or []) + (task.wrong_solution or []))


HEADLESS_TASKS = [t for t in (load_task(p, require_drums_support=True) for p in list_tasks())
                  if not _needs_display(t)]


def test_bundled_tasks_score_the_same_as_osworld(osworld_venv, guests, tmp_path):
    assert len(HEADLESS_TASKS) >= 6
    items = []
    for task in HEADLESS_TASKS:
        raw = task.to_dict()
        states = [("before", [], None)]
        if task.wrong_solution:
            states.append(("wrong", task.wrong_solution, None))
        states.append(("right", task.solution, None))
        for label, actions, _ in states:
            guest, server = guests.new()
            with GuestClient(base_url=server.url) as client:
                run_setup(task.config, client, task_cache_dir=tmp_path / "setup-cache" / task.id)
            _apply(guest, actions)
            expect = 1.0 if label == "right" else 0.0
            items.append({"task": raw, "server": server, "history": list(actions), "label": label,
                          "expect": expect})
            if label == "right" and task.evaluator["func"] != "infeasible":
                items.append({"task": raw, "server": server, "history": list(actions) + ["FAIL"],
                              "label": "right then FAIL", "expect": 0.0})
    _compare_evaluations(items, tmp_path)


def test_evaluator_rules_agree_with_osworld(osworld_venv, guests, tmp_path):
    guest, server = guests.new()
    for name, text in {"a.txt": "1\n2\n3\n4\n", "b.txt": "1\n2\n3\n5\n", "hello.txt": "hello\n"}.items():
        (guest.home / name).write_text(text)

    def cmd(c, shell=True):
        return {"type": "vm_command_line", "command": c, "shell": shell}

    def rule(v):
        return {"type": "rule", "rules": {"expected": v}}

    def vm_file(path, dest):
        return {"type": "vm_file", "path": path, "dest": dest}

    partial = {"func": "diff_text_file", "result": vm_file("~/a.txt", "a.txt"), "expected": vm_file("~/b.txt", "b.txt")}
    base = {"instruction": "synthetic", "config": []}
    evaluators = {
        "single-1": {"func": "exact_match", "result": cmd("cat ~/hello.txt"), "expected": rule("hello\n")},
        "single-0": {"func": "exact_match", "result": cmd("cat ~/hello.txt"), "expected": rule("bye\n")},
        "single-partial": partial,
        "list-str-command": {"func": "exact_match", "result": cmd("cat ~/hello.txt", shell=False),
                             "expected": rule("hello\n")},
        "list-argv-command": {"func": "exact_match", "result": cmd(["cat", "~/hello.txt"], shell=False),
                              "expected": rule("hello\n")},
        "stderr": {"func": "check_include_exclude", "result": {"type": "vm_command_error", "command": "ls ~/nope",
                                                               "shell": True},
                   "expected": {"type": "rule", "rules": {"include": ["No such file"]}}},
        "no-expected": {"func": "compare_text_file", "result": vm_file("~/nope.txt", "nope.txt")},
        "and-mean": {"func": ["diff_text_file", "exact_match"],
                     "result": [partial["result"], cmd("cat ~/hello.txt")],
                     "expected": [partial["expected"], rule("hello\n")]},
        "and-zero": {"func": ["exact_match", "diff_text_file"], "conj": "and",
                     "result": [cmd("cat ~/hello.txt"), partial["result"]],
                     "expected": [rule("bye\n"), partial["expected"]]},
        "or-one": {"func": ["exact_match", "exact_match"], "conj": "or",
                   "result": [cmd("cat ~/nope"), cmd("cat ~/hello.txt")],
                   "expected": [rule("bye\n"), rule("hello\n")]},
        "or-max": {"func": ["diff_text_file", "exact_match"], "conj": "or",
                   "result": [partial["result"], cmd("cat ~/hello.txt")],
                   "expected": [partial["expected"], rule("bye\n")]},
        "options-list": {"func": ["compare_text_file", "compare_text_file"],
                         "result": [vm_file("~/hello.txt", "h1.txt"), vm_file("~/hello.txt", "h2.txt")],
                         "expected": [{"type": "cache_file", "path": "gold_caps.txt"},
                                      {"type": "cache_file", "path": "gold_caps.txt"}],
                         "options": [{"ignore_case": True}, None],
                         "postconfig": [{"type": "execute", "parameters": {
                             "command": "echo HELLO", "shell": True, "stdout": "gold_caps.txt"}}]},
        "vm-file-gives": {"func": "compare_text_file",
                          "result": {"type": "vm_file", "multi": True, "path": ["~/a.txt", "~/hello.txt"],
                                     "dest": ["m_a.txt", "m_hello.txt"], "gives": [1]},
                          "expected": vm_file("~/hello.txt", "hello_copy.txt")},
        "vm-file-gives-missing": {"func": "compare_text_file",
                                  "result": {"type": "vm_file", "multi": True, "path": ["~/a.txt", "~/nope"],
                                             "dest": ["g_a.txt", "g_nope.txt"], "gives": [0, 1]},
                                  "expected": vm_file("~/hello.txt", "hello_copy2.txt")},
        "cache-file-missing": {"func": "compare_text_file", "result": vm_file("~/hello.txt", "h3.txt"),
                               "expected": {"type": "cache_file", "path": "never-written.txt"}},
        "metric-raises": {"func": "is_in_list", "result": vm_file("~/nope", "nope2"),
                          "expected": rule("x")},
        "postconfig-command": {"func": "check_include_exclude",
                               "postconfig": [{"type": "command", "parameters": {
                                   "command": ["sh", "-c", "echo {SCREEN_WIDTH_HALF} {CLIENT_PASSWORD}"],
                                   "stdout": "pc.txt"}}],
                               "result": {"type": "cache_file", "path": "pc.txt"},
                               "expected": {"type": "rule", "rules": {"include": ["pc.txt"]}}},
        "infeasible": {"func": "infeasible"},
    }
    expected = {("single-1", ()): 1.0, ("single-partial", ()): 0.75, ("and-mean", ()): 0.875,
                ("or-max", ()): 0.75, ("or-one", ()): 1.0, ("and-zero", ()): 0.0,
                ("infeasible", ("FAIL",)): 1.0, ("infeasible", ()): 0.0, ("single-1", ("FAIL",)): 0.0}
    items = []
    for label, ev in evaluators.items():
        task = dict(base, id=f"synthetic-{label}", evaluator=ev)
        for history in ([], ["pyautogui.click(1, 1)", "DONE"], ["FAIL"]):
            item = {"task": task, "server": server, "history": history, "label": repr(history)}
            if (label, tuple(history)) in expected:
                item["expect"] = expected[(label, tuple(history))]
            items.append(item)
    _compare_evaluations(items, tmp_path)
