"""``drums exec`` into a restored session: what it starts belongs to the session.

A restored session runs in a time namespace CRIU made for it, and the daemon's stdin is a host file.
A command started with ``exec`` that outlives the exec (a background program) must be inside the
session's time namespace and hold no host file: otherwise the session's next checkpoint fails
(``Can't lookup mount ... path=/dev/null``) or its snapshot never restores (``Can't restore
sub-task in NS (cflags 80)``: CLONE_NEWTIME). Both were the case before; this shows neither is.
"""
from __future__ import annotations

import os

from tests.support.wait import wait_until

def _sh(client, sid: str, script: str) -> str:
    res = client.exec(sid, ["bash", "-c", script], user="user", timeout=60)
    assert res["returncode"] == 0, f"{script!r} failed in {sid}: {res}"
    return res["stdout"]

def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")

def test_a_program_exec_starts_in_a_restored_session_is_checkpointed_and_restored_with_it(client) -> None:
    base = client.create()
    try:
        first = client.checkpoint(base["id"])           # the session is consumed: its sibling is restored
    except BaseException:
        client.destroy(base["id"])
        raise
    made: list[str] = []
    try:
        (s,) = client.restore(first["id"])
        made.append(s["id"])
        # stdin is not redirected on purpose: the program keeps whatever exec gave it
        _sh(client, s["id"], "setsid -f sleep 1000 >/dev/null 2>&1")
        procs = wait_until(lambda: [p for p in client.processes(s["id"]) if p["comm"] == "sleep"],
                           10, "the background sleep to run")
        pid = procs[0]["pid"]
        assert _ns(pid, "time") == _ns(s["init_pid"], "time"), "exec's program is outside the session's time ns"
        stdin = os.readlink(f"/proc/{pid}/fd/0")
        assert stdin.startswith("pipe:"), f"exec's program holds {stdin} as its stdin"
        second = client.checkpoint(s["id"], leave_running=True)
        try:
            (sib,) = client.restore(second["id"], wait_live=True)
            made.append(sib["id"])
            assert _sh(client, sib["id"], "pgrep -x sleep").strip(), "the sleep did not come back in the sibling"
        finally:
            for sid in made:
                client.destroy(sid)
            made.clear()
            client.delete_snapshot(second["id"])
    finally:
        for sid in made:
            client.destroy(sid)
        client.delete_snapshot(first["id"])
