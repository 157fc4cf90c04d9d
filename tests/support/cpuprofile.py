"""CPU-seconds per test, for deciding what to make cheaper (opt-in: ``DRUMS_TEST_CPU=<file.jsonl>``).

The desktop lane is CPU-bound, so wall seconds per test say little about what a test costs the
run: a test waiting on a timer takes wall time and no CPU. With ``DRUMS_TEST_CPU`` set, each test
process moves itself into a cgroup-v1 ``cpuacct`` group of its own (``drums-testcpu/<pid>``, a
hierarchy Drums itself never places tasks in) before its first test. Everything it starts joins
that group and stays in it: its daemons, their CRIU and every session's processes (Drums' own
cgroups are in other hierarchies). Each test's row is that group's CPU during the test:
``{"test", "cpu_s", "wall_s", "end", "pid"}`` (``end``: the wall clock at its end; ``pid``:
the test process), one JSON line per test, appended. A daemon's work for a test is
done during that test; the few seconds a daemon spends after a test (liveness checks of siblings
a test destroyed) land on the next test of the same process.

Without the variable, or on a host without a cgroup-v1 ``cpuacct`` hierarchy of its own (one
mounted with ``cpu``, where Drums places sessions, would not count them), nothing is measured.
At the end of each test process, the process and whatever it started that still runs move back to
the root group, and the group is removed.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ENV = "DRUMS_TEST_CPU"
ROOT = Path("/sys/fs/cgroup/cpuacct")
PARENT = ROOT / "drums-testcpu"


def _usage(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


class CpuPerTest:
    """The plugin: registered by tests/conftest.py when :data:`ENV` is set."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.group: Path | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session) -> None:
        if not (ROOT / "cgroup.procs").is_file() or (ROOT / "cpu.shares").exists():
            print(f"\n{ENV}: no cgroup-v1 cpuacct hierarchy of its own at {ROOT}; nothing is measured",
                  file=sys.stderr)
            return
        group = PARENT / str(os.getpid())
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        self.group = group

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.group is None:
            yield
            return
        cpu0, t0 = _usage(self.group), time.monotonic()
        yield
        row = {"test": item.nodeid, "cpu_s": round(_usage(self.group) - cpu0, 2),
               "wall_s": round(time.monotonic() - t0, 2), "end": round(time.time(), 1), "pid": os.getpid()}
        with self.out.open("a") as f:
            f.write(json.dumps(row) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        if self.group is None:
            return
        # The process and what still runs of what it started (multiprocessing's resource tracker
        # lives until this process exits) go back to the root group: the group only counted.
        for attempt in range(5):  # again if one of them started another meanwhile
            for pid in [str(os.getpid()), *(self.group / "cgroup.procs").read_text().split()]:
                try:
                    (ROOT / "cgroup.procs").write_text(pid)
                except ProcessLookupError:
                    pass  # it ended meanwhile
            try:
                self.group.rmdir()
                break
            except OSError as exc:
                if attempt == 4:
                    print(f"\n{self.group} is left ({exc})", file=sys.stderr)
                    return
        try:
            PARENT.rmdir()
        except OSError:
            pass  # another test process's group is still there


def register(config) -> None:
    """Register the plugin on ``config`` when :data:`ENV` names an output file."""
    out = os.environ.get(ENV)
    if out:
        config.pluginmanager.register(CpuPerTest(Path(out)), "drums-cpu-per-test")
