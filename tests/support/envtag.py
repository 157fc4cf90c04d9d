"""Processes marked by a variable in their environment (everything a test started, and what those
started, inherits it), and how to end them all."""
from __future__ import annotations

import contextlib
import os
import signal

from .wait import WaitTimeout, wait_until


def pids_with_env(var: str, value: str) -> list[int]:
    """The living processes (zombies have no environment left) whose environment has ``var=value``."""
    needle = f"{var}={value}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            continue
    return out


def kill_env_tagged(var: str, value: str, timeout: float) -> list[int]:
    """SIGTERM, then SIGKILL, every process whose environment has ``var=value``, waiting up to
    ``timeout`` seconds after each for them to go; returns the survivors (should be ``[]``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = pids_with_env(var, value)
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(WaitTimeout):  # the next signal; after SIGKILL, the survivors are returned
            wait_until(lambda: not pids_with_env(var, value), timeout, f"the processes with {var}={value} to exit",
                       every=0.1)
            return []
    return pids_with_env(var, value)
