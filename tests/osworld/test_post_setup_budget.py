"""``post_setup`` reuse under a snapshot store of a few hundred MiB, through the real desktop-env 1.0.2.

Issue 15's acceptance: with a store budget of a few hundred MiB, 10 tasks run in ``post_setup`` mode
one after another all score as they should; the evictions are reported; ``drums snapshots`` shows
the budget and its use. The daemon is an instance of this test's own (the budget is the daemon's
setting); OSWorld runs in its own venv against it, unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from drums_core.config import Instance


from tests.support.osworldlib import OSWorld, watchdog_pids
from tests.support.wait import wait_until
from tests.support.suite import instance_env

BUDGET = "500m"  # the osworld image: init_state ~70 MiB, a LibreOffice task's post_setup ~300 MiB
TASKS = [
    "os/e0df059f-28a6-4169-924f-b9623e7184cc.json",
    "libreoffice_writer/drums-writer-type-and-save.json",
    "os/drums-os-move-dir-into.json",
    "libreoffice_calc/drums-calc-fruit-table.json",
    "os/drums-os-make-executable.json",
    "files/drums-files-create-greeting.json",
    "libreoffice_writer/drums-writer-txt-to-docx.json",
    "os/drums-os-delete-log.json",
    "libreoffice_calc/drums-calc-xlsx-to-csv.json",
    "files/drums-files-backup-copy.json",
]

RUN = f'''
    from drums_osworld.snapshot import set_reuse_mode
    TASK_FILES = {TASKS!r}
    env = DesktopEnv(provider_name="drums", action_space="pyautogui")
    set_reuse_mode(env, "post_setup")
    client = env.provider.client

    def rollout(rel):
        task = load_task(rel)
        seen = client.store()
        t0 = time.monotonic()
        env.reset(task_config=task)
        reset_s = time.monotonic() - t0
        timings = dict(env.provider.timings)
        after_reset = client.store()
        before = env.evaluate()
        for action in task["drums_solution"]:
            env.step(action, pause=0.5)
        after = env.evaluate()
        return {{"task": rel, "reset_s": reset_s, "before": before, "after": after,
                 "saved": "saved_post_setup" in timings, "unsaved": "post_setup_unsaved" in timings,
                 "reverted": timings.get("reverted"), "used": after_reset["used"], "budget": after_reset["budget"],
                 "evicted": after_reset["evicted"] - seen["evicted"],
                 "snapshots": after_reset["snapshots"], "session": env.provider.desktop.id}}

    first = [rollout(rel) for rel in TASK_FILES]
    # again: the newest task's state is still there (restored, no setup); the oldest one's was evicted
    second = [rollout(TASK_FILES[-1]), rollout(TASK_FILES[0])]
    env.close()
    emit({{"first": first, "second": second, "store": client.store(), "snapshots": client.snapshots()}})
'''


@pytest.fixture
def budget_osworld(osworld_venv):
    from drums_core.client import Client
    from drums_core.host.hoststate import instance_leaks

    from tests.support.suite import SPARE_SLOTS, SUITE_DAEMON_ENV, require_root, stop_instance

    require_root()
    inst = Instance(name=f"osbudget-{os.getpid()}", slot_base=SPARE_SLOTS[8], slot_count=8)
    spill = Path("/var/lib/drums/spill") / inst.name
    client = Client(inst, daemon_env={**SUITE_DAEMON_ENV, "DRUMS_STORE_BUDGET": BUDGET,
                                      "DRUMS_STORE_MEM_FLOOR": "0"})
    client.ping()
    ow = OSWorld(osworld_venv, inst)
    try:
        yield ow, client
        wait_until(lambda: not watchdog_pids(inst), 15, "the lease watchdogs to exit", every=0.2)
        assert not ow.lease_files(), f"lease files left behind: {ow.lease_files()}"
        assert client.list() == [], f"sessions left behind: {client.list()}"
    finally:
        for s in client.list():
            client.destroy(s["id"])
        for s in sorted(client.snapshots(), key=lambda s: -s["created"]):
            client.delete_snapshot(s["id"])
        stop_instance(inst)
        shutil.rmtree(ow.workdir, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)
        leaks = instance_leaks(inst)
        assert not any(leaks.values()), leaks


def _drums(inst: Instance, *argv: str) -> str:
    env = instance_env(inst)
    return subprocess.run([sys.executable, "-m", "drums_core.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=True).stdout


def test_ten_tasks_in_post_setup_mode_under_a_small_store_budget(budget_osworld):
    ow, client = budget_osworld
    out = ow.run(RUN, timeout=3000)
    first, second = out["first"], out["second"]
    budget = first[0]["budget"]
    print(f"store budget {budget >> 20} MiB ({BUDGET})")
    for r in first + second:
        print(f"{r['task']:55s} reset {r['reset_s']:6.2f}s score {r['before']} -> {r['after']} "
              f"{'saved' if r['saved'] else 'restored' if not r['unsaved'] else 'UNSAVED'} "
              f"store {r['used'] >> 20:4d} MiB, {r['snapshots']} snapshots, {r['evicted']} evicted")
    # every rollout scores as it should: 0 untouched, 1 after the task's reference solution
    for r in first + second:
        assert (r["before"], r["after"]) == (0.0, 1.0), r
    # every first rollout set up and saved its post_setup state, room made by evicting older ones
    assert all(r["saved"] and not r["unsaved"] for r in first), first
    assert all(r["used"] <= budget for r in first + second), [(r["task"], r["used"]) for r in first]
    evicted = sum(r["evicted"] for r in first + second)
    assert evicted >= 1 and out["store"]["evicted"] == evicted
    # the newest task's state was restored (no setup, no save); the oldest's had gone: set up again
    assert not second[0]["saved"] and second[0]["reverted"] == 1.0, second[0]
    assert second[1]["saved"], second[1]
    # the evictions are reported: the journal (through the daemon), drums snapshots, text and JSON
    recent = out["store"]["recent"]
    assert recent and all(e["action"] == "evicted" and e["retention"] == "cache"
                          and str(e["name"]).startswith("post_setup:") for e in recent), recent
    text = _drums(ow.instance, "snapshots")
    print(text)
    assert f"of {budget / 2**20:.0f} MiB budget" in text and f"{evicted} evicted" in text
    js = json.loads(_drums(ow.instance, "--json", "snapshots"))
    assert js["store"]["budget"] == budget and js["store"]["evicted"] == evicted
    assert {s["name"] for s in js["snapshots"]} >= {"init_state"}
    assert all(s["retention"] == "cache" for s in js["snapshots"])
