"""A restore that CRIU loses to a process ending while it lets go of the tasks is made again.

CRIU lets go of the restored tasks one thread after another (PTRACE_DETACH). A thread it has let go
of that ends its process makes a later detach meet a thread that is gone ("Unable to detach N: No
such process"); CRIU then kills the tree and waits, until it is killed, for an init that cannot end
while CRIU still traces its dying tasks. A process that was about to end when its desktop was dumped
does that (Chromium's start-up helpers; an OSWorld Chrome and an Impress task met it in the suite).
Here a program's main thread spins until a deadline that passes between the checkpoint and the
restores, then ends the process, while 1,000 other threads sleep: CRIU lets go of the main thread
first, and the process most often ends before CRIU gets to the others (not always: under load the
main thread may run only after CRIU is done). Over 5 restores the race is met; the daemon kills
CRIU soon after it gave up (never at its 60 s timeout), rolls the sibling back and restores it
again, RACE_ATTEMPTS times in all, then fails with CRIU's words (the third such failure in a row
is RETRIES_EXHAUSTED); a restore either succeeds or fails so, and nothing is left. (A real desktop's
process ending so has a few threads, not 1,000: it rarely beats CRIU, and a new restore most often
succeeds.)
"""
from __future__ import annotations

import re
import time

from drums_core.errors import Internal, Unavailable
from drums_core.session import criu
from drums_core.session.restoring import RACE_ATTEMPTS

RESTORES = 5

BARE = {"image": "default", "programs": []}

QUITTER = r"""
import os, sys, threading, time
deadline = float(sys.argv[1])
for _ in range(1000):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
open("/tmp/ready", "w").close()
while time.time() < deadline:
    pass
os._exit(0)
"""

def _log_since(client, offset: int) -> bytes:
    with client.instance.log_file.open("rb") as f:
        f.seek(offset)
        return f.read()


def test_a_restore_lost_to_a_process_ending_is_made_again_and_never_waits_for_the_timeout(client):
    s = client.create(BARE)
    snap = None
    try:
        client.exec(s["id"], ["bash", "-c", f"cat > /tmp/quitter.py <<'EOF'\n{QUITTER}EOF"])
        deadline = time.time() + 30  # passes after the checkpoint, before the restores
        r = client.exec(s["id"], ["bash", "-c", f"setsid -f python3 /tmp/quitter.py {deadline} >/dev/null 2>&1 "
                                                "</dev/null; for i in $(seq 1000); do [ -e /tmp/ready ] && exit 0; "
                                                "sleep 0.02; done; exit 1"])
        assert r["returncode"] == 0, f"quitter.py never got ready: {r}"
        snap = client.checkpoint(s["id"], leave_running=True)
        assert time.time() < deadline, "the checkpoint ended after the quitter's deadline: nothing to race"
    finally:
        client.destroy(s["id"])
    try:
        time.sleep(max(0.0, deadline - time.time()) + 0.5)  # the quitter ends at once in every restore
        seen = client.instance.log_file.stat().st_size
        failed = 0
        for _ in range(RESTORES):
            try:
                (sib,) = client.restore(snap["id"], wait_live=True)
            except Unavailable as exc:  # every attempt lost the race
                failed += 1
                assert exc.reason == "CRIU_FAILED", exc
                assert criu.lost_a_race_at_detach(exc), exc.detail
                assert "gave up" in exc.message, exc.message
            except Internal as exc:  # the third such failure in a row (the restore-streak rule)
                failed += 1
                assert exc.reason == "RETRIES_EXHAUSTED", exc
                assert criu.lost_a_race_at_detach(exc), exc.detail
            else:
                assert client.get(sib["id"])["state"] == "RUNNING"
                client.destroy(sib["id"])
        log = _log_since(client, seen)
        again = [int(a) for a in re.findall(rb"a restored process ended while CRIU let go of the tasks "
                                            rb"\(attempt (\d) of \d\)", log)]
        gave_up = log.count(b"waited on the tree it was killing until it was killed")
        assert gave_up >= 1, f"none of {RESTORES} restores met the race"
        assert gave_up == len(again) + failed, (gave_up, again, failed)  # each lost attempt but a last one is retried
        assert all(1 <= a < RACE_ATTEMPTS for a in again), again
        assert b"did not finish within" not in log, "a CRIU that gave up was left to its timeout"
        assert client.list() == []
    finally:
        if snap is not None:
            client.delete_snapshot(snap["id"])


def test_only_a_detach_that_met_a_gone_thread_is_the_race():
    def failed(*lines: str) -> Unavailable:
        return Unavailable("restore failed", reason="CRIU_FAILED", detail={"criu_log": list(lines), "step": "criu"})

    assert criu.lost_a_race_at_detach(failed("Error (criu/cr-restore.c:1924): Unable to detach 12420: No such process",
                                              "Error (criu/cr-restore.c:2304): Killing processes because of failure"))
    assert not criu.lost_a_race_at_detach(failed("Error (criu/cr-restore.c:1924): Unable to detach 12420: "
                                                 "Operation not permitted"))
    assert not criu.lost_a_race_at_detach(failed("Error (criu/files.c:1): Unable to open fd=3"))
    assert not criu.lost_a_race_at_detach(Unavailable("no log", reason="CRIU_TIMEOUT", detail=None))
