"""The guest's setup log (/drums/setup_log): every /setup/* call's outcome, read back by the host.

A launch of a program that does not exist is an error whether it fails at once (a list command:
the guest answers 500) or only once the shell ran it (shell=True: the guest answered 200 and the
program exited 127); an execute that finds no program or raises a Python traceback is an error; a
command that merely exits non-zero is not.
"""
from __future__ import annotations


from tests.support.wait import wait_until


def _read(guest, **params) -> dict:
    r = guest.get("/drums/setup_log", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _mark(guest, label: str = "test") -> int:
    r = guest.post("/drums/setup_log/mark", json={"label": label})
    assert r.status_code == 200, r.text
    return r.json()["mark"]


def test_failures_are_recorded_per_step(guest):
    _mark(guest, "reset")
    assert _read(guest)["entries"] == []
    steps = [
        ("launch", {"command": ["drums-no-such-program", "--x"]}),            # 500 from the guest
        ("launch", {"command": "VLC_VERBOSE=-1 drums-no-such-vlc --no-audio", "shell": True}),  # 200, then 127
        ("execute", {"command": ["sh", "-c", "exit 3"]}),                      # non-zero: not an error
        ("execute", {"command": "drums-no-such-tool --get x", "shell": True}),  # 127
        ("execute", {"command": ["python", "-c", "import drums_no_such_module"]}),  # traceback
        ("launch", {"command": ["sleep", "30"]}),                              # fine, still running
    ]
    for i, (stype, body) in enumerate(steps):
        assert guest.post("/drums/setup_log/step", json={"index": i, "type": stype}).status_code == 200
        guest.post(f"/setup/{stype}", json=body)
    # the shell launch (step 1) exits right away; its exit status is logged when the guest sees it exit
    wait_until(lambda: any(e["step"]["index"] == 1 and e.get("exit_status") is not None
                           for e in _read(guest)["entries"]), 10, "the shell launch's exit status in the setup log",
               every=0.1)
    log = _read(guest)
    assert log["label"] == "reset"
    entries = log["entries"]
    assert [e["step"]["index"] for e in entries] == [0, 1, 2, 3, 4, 5]
    by_step = {e["step"]["index"]: e for e in entries}
    assert by_step[0]["status"] == 500 and not by_step[0]["ok"] and "drums-no-such-program" in by_step[0]["error"]
    assert by_step[1]["status"] == 200 and by_step[1]["exit_status"] == 127 and not by_step[1]["ok"]
    assert "not found" in by_step[1]["error"]
    assert by_step[2]["ok"] and by_step[2]["returncode"] == 3
    assert not by_step[3]["ok"] and by_step[3]["returncode"] == 127
    assert not by_step[4]["ok"] and "ModuleNotFoundError" in by_step[4]["error"]
    assert by_step[5]["ok"] and by_step[5]["exit_status"] == "running"
    assert [e["step"]["index"] for e in log["errors"]] == [0, 1, 3, 4]
    # this server's own child only: the server runs on the host, where another test's `sleep 30`
    # (tests/guest/test_server.py, on another worker) was killed by a host-wide pkill
    guest.post("/setup/execute", json={"command": ["pkill", "-P", str(guest.proc.pid), "-f", "^sleep 30$"]})


def test_a_new_mark_starts_a_new_section_and_since_reads_older_ones(guest):
    first = _mark(guest, "one")
    guest.post("/setup/launch", json={"command": ["drums-no-such-program"]})
    second = _mark(guest, "two")
    assert second > first
    assert _read(guest)["entries"] == [] and _read(guest)["label"] == "two"
    older = _read(guest, since=first)
    assert len(older["errors"]) == 1 and older["errors"][0]["endpoint"] == "/setup/launch"


def test_host_side_failures_are_noted(guest):
    _mark(guest, "reset")
    r = guest.post("/drums/setup_log/note", json={"index": 2, "type": "chrome_open_tabs",
                                                  "error": "connect_over_cdp: connection refused"})
    assert r.status_code == 200
    log = _read(guest)
    assert log["errors"][0]["step"] == {"index": 2, "type": "chrome_open_tabs"}
    assert log["errors"][0]["endpoint"] == "(host)"


def test_bad_input_is_refused_and_changes_nothing(guest):
    _mark(guest, "bad")
    for body in ({"index": -1}, {"index": "x"}, {"index": True}):
        assert guest.post("/drums/setup_log/step", json=body).status_code == 400
    assert guest.post("/drums/setup_log/note", json={"index": 1}).status_code == 400
    assert guest.get("/drums/setup_log", params={"since": "zero"}).status_code == 400
    assert _read(guest)["entries"] == []


def test_the_log_stays_bounded(guest):
    _mark(guest, "flood")
    huge = "x" * 100_000
    for _ in range(3):
        guest.post("/drums/setup_log/note", json={"index": 0, "type": "t", "error": huge})
    log = _read(guest)
    assert all(len(e["error"]) <= 600 for e in log["errors"])
    from drums_osworld.guest.setup_log import MAX_ENTRIES

    for _ in range(MAX_ENTRIES + 5):
        guest.post("/setup/activate_window", json={"window_name": "drums-no-such-window"})
    assert len(_read(guest, since=0)["entries"]) <= MAX_ENTRIES


def test_a_section_is_found_by_its_label(guest):
    _mark(guest, "setup")
    guest.post("/setup/launch", json={"command": ["drums-no-such-program"]})
    _mark(guest, "postconfig")
    guest.post("/setup/activate_window", json={"window_name": "drums-no-such-window"})
    setup = _read(guest, label="setup")
    assert setup["label"] == "setup" and [e["endpoint"] for e in setup["entries"]] == ["/setup/launch"]
    post = _read(guest, label="postconfig")
    assert [e["endpoint"] for e in post["entries"]] == ["/setup/activate_window"]
    assert _read(guest, label="never")["entries"] == []


def test_a_window_not_found_is_a_warning_not_a_failed_setup(guest):
    """OSWorld's guest never fails activate_window/close_window on Linux; tasks rely on that."""
    _mark(guest, "setup")
    guest.post("/setup/activate_window", json={"window_name": "drums-no-such-window"})
    log = _read(guest, label="setup")
    (entry,) = log["entries"]
    assert entry["ok"] and "not found" in entry["warning"] and log["errors"] == []
