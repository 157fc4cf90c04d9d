"""OSWorld's ``scripts/python/run_multienv.py`` with 2 workers against one host's daemon (issue 10).

The real script is not in the desktop-env wheel; the stand-in is the provider tests' MIMIC_RUNNER
(tests/osworld/test_provider.py: run_multienv's argparse choices for ``--provider_name``, its
DesktopEnv call, one DesktopEnv per worker process, tasks from a queue), extended here to report
each task's desktop. It runs through ``python -m drums_osworld.apps.run`` with the real desktop-env
1.0.2 (tests/support/osworld_harness.py) against the suite's daemon, with the default reuse mode
(``none``): 4 tasks from ``tasks/``, each scored 0 before and 1 after its solution, each on a
desktop of its own, no desktop shared between the workers, nothing left afterwards.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.wait import WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[2]
OSW = REPO / "tests" / "osworld"

pytestmark = pytest.mark.timeout(900)


def _stand_in() -> str:
    spec = importlib.util.spec_from_file_location("drums_tests_osworld_provider", OSW / "test_provider.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MIMIC_RUNNER


def test_run_multienv_two_workers_four_tasks(drums_instance, client):
    from tests.support.osworldlib import OSWorld, _venv, watchdog_pids

    runner = _stand_in()
    mine = runner.replace("env.provider.reuse_mode])", "env.provider.reuse_mode, env.provider.desktop.id])")
    assert mine != runner, "the run_multienv stand-in in tests/osworld/test_provider.py changed: update this test"
    ow = OSWorld(_venv(), drums_instance)
    before = {s["id"] for s in client.snapshots()}
    try:
        script = ow.workdir / "run_multienv.py"
        script.write_text(mine)
        cmd = [str(ow.venv / "bin/python"), "-m", "drums_osworld.apps.run", str(script), "--provider_name", "drums",
               "--num_envs", "2", "--test_config_base_dir", str(REPO / "tasks")]
        t0 = time.monotonic()
        r = subprocess.run(cmd, cwd=ow.workdir, env=ow.env(), capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
        assert r.returncode == 0, r.stderr[-4000:]
        scores = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("SCORES ")][-1].split(" ", 1)[1])
        print(f"run_multienv, 2 workers, {wall:.1f} s:", json.dumps(scores))
        assert len(scores) == 4, scores
        assert all(s[1] == 0.0 and s[2] == 1.0 and s[3] == "drums" and s[5] == "none" for s in scores), scores
        desktops = [s[6] for s in scores]
        assert len(set(desktops)) == 4, f"a desktop served two tasks: {desktops}"
        by_worker: dict[int, set] = {}
        for s in scores:
            by_worker.setdefault(s[4], set()).add(s[6])
        assert 1 <= len(by_worker) <= 2, by_worker
        assert client.list() == []
    finally:
        with contextlib.suppress(WaitTimeout):  # reported below, after the clean-up
            wait_until(lambda: not watchdog_pids(drums_instance), 15, "the lease watchdogs to exit", every=0.2)
        leftover_watchdogs = watchdog_pids(drums_instance)
        leftover_leases = ow.lease_files()
        made = [s for s in client.snapshots() if s["id"] not in before and s.get("name") != "init_state"]
        for s in sorted(made, key=lambda s: -s["created"]):
            try:
                client.delete_snapshot(s["id"])
            except Exception:  # noqa: BLE001 - reported below
                pass
        shutil.rmtree(ow.workdir, ignore_errors=True)
    assert not leftover_watchdogs, f"lease watchdogs still running: {leftover_watchdogs}"
    assert not leftover_leases, f"lease files left behind: {leftover_leases}"
    assert not [s for s in made if ":env:" in str(s.get("scope"))], "private snapshots left behind"
