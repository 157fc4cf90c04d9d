"""Ending what a test started: its children and their orphans (the test process is their subreaper),
and nothing else. A test process may hold long-lived helpers of other tests (a session-scoped guest
server, an X server) whose life is not the test's to end: under pytest-xdist one worker runs many
files, so "every descendant of this process" is not "what this test made"."""
from __future__ import annotations

import contextlib
import os
import signal
import time

from drums_core.host import procs


def descendants() -> set[tuple[int, int | None]]:
    """(pid, start time) of every living descendant of this process."""
    return {(pid, procs.starttime(pid)) for pid in procs.descendants(procs.scan_processes(), [os.getpid()])}


def kill_new_descendants(before: set[tuple[int, int | None]], tries: int = 100) -> list[int]:
    """SIGKILL and reap every descendant of this process that is not in ``before`` (taken when the
    test began), until none is left; returns the pids still living after ``tries`` rounds."""
    left: list[int] = []
    for _ in range(tries):
        left = [pid for pid, start in descendants() - before]
        if not left:
            return []
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        procs.reap_children()
        time.sleep(0.05)
    return left
