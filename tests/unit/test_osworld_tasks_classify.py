"""How ``drums bench osworld-tasks`` classifies a (task, mode) row of its worker, rule by rule."""
from __future__ import annotations

import copy

from drums_osworld import catalog
from drums_osworld.bench.osworld_tasks import classify, getter_failures, relevant_lacking, setup_flagged

OK_SETUP = {"ok": True, "issues": [], "missing_apps": {}, "read_error": None}
CLEAN = {"mode": "none", "resets": [{"seconds": 1.0, "error": None, "setup": OK_SETUP}], "score": 0.0,
         "calls": [{"kind": "getter", "name": "vm_command_line", "error": None, "none": False, "log_errors": []},
                   {"kind": "metric", "name": "exact_match", "error": None, "none": False, "log_errors": [],
                    "value": 0.0}]}


def row(**changes) -> dict:
    r = copy.deepcopy(CLEAN)
    r.update(changes)
    return r


def test_clean():
    assert classify(row(), {}) == ("clean", "")
    assert not setup_flagged(row())


def test_each_class_and_its_precedence():
    assert classify(row(timeout="budget ran out during evaluate (300 s)"), {"vlc": "x"})[0] == "timeout"
    assert classify(row(), {"vlc": "needs vlc"}) == ("needs app", "the image lacks vlc: needs vlc")
    bad = {"ok": False, "issues": [{"step": 0, "type": "launch", "error": "exited with status 127"}]}
    r = row(resets=[{"seconds": 1.0, "error": None, "setup": bad}])
    assert classify(r, {}) == ("setup error", "step 1 (launch): exited with status 127") and setup_flagged(r)
    assert classify(row(reset_error="Exception: Setup step 3 failed"), {})[0] == "setup error"
    assert classify(row(evaluate_error="TypeError: x"), {})[0] == "evaluator error"
    calls = copy.deepcopy(CLEAN["calls"])
    calls[1]["error"] = "KeyError: 'a'"
    assert classify(row(calls=calls), {}) == ("evaluator error", "metric exact_match raised KeyError: 'a'")
    assert classify(row(postconfig={"ok": False, "issues": [{"error": "launch failed"}]}), {})[0] == "evaluator error"
    assert classify(row(score=1.0), {})[0] == "scores untouched"


def test_getters_that_return_none_or_log_errors_fail():
    calls = copy.deepcopy(CLEAN["calls"])
    calls[0].update(none=True, log_errors=["desktopenv.pycontroller: Failed to get file."])
    assert getter_failures(calls) == ["getter vm_command_line returned None "
                                      "(desktopenv.pycontroller: Failed to get file.)"]
    assert classify(row(calls=calls), {})[0] == "evaluator error"
    calls[0].update(none=False)
    assert classify(row(calls=calls), {})[0] == "evaluator error"


def test_an_infeasible_task_needs_only_what_its_setup_starts():
    entries = {e.id[:8]: e for e in catalog.load_list()}
    vlc_inf, chrome_inf, vlc = entries["7882ed6e"], entries["ae78f875"], entries["215dfd39"]
    assert vlc_inf.infeasible and chrome_inf.infeasible and not vlc.infeasible
    lacking = {"vlc": "needs vlc", "chrome": "needs chromium"}
    assert relevant_lacking(vlc_inf, lacking) == {"vlc": "needs vlc"}  # its setup launches VLC
    assert relevant_lacking(chrome_inf, lacking) == {}                # no setup: scored without Chrome
    assert relevant_lacking(vlc, lacking) == lacking
