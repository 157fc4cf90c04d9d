"""``drums bench osworld-tasks`` on three of OSWorld's own tasks, on real desktops.

- os/e0df059f (rename a directory): setup by execute steps, scored by ``exact_match``: clean.
- os/b3d4a89c (switch on Bluetooth): infeasible, no setup: scored without any application.
- a VLC task (vlc/215dfd39, setup ``VLC_VERBOSE=-1 vlc ...`` through a shell): on an image without
  VLC it is ``needs app`` and its setup report names the launch that exited 127; with VLC it runs.

Both reuse modes; the real ``DesktopEnv`` in OSWorld's interpreter without the test stubs (the
venv gets the real evaluator dependencies first). A smoke test: no time is asserted.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.benchlib import INSTANCE, SLOT_BASE, assert_clean
from tests.support.suite import require_root
from tests.support.taskset import osworld_tasks_dir

REPO = Path(__file__).resolve().parents[2]
TASKS = osworld_tasks_dir()
IMAGE = os.environ.get("DRUMS_BENCH_IMAGE", "default")


def test_osworld_tasks_three(tmp_path, capsys):
    require_root()
    if not (TASKS / "examples").is_dir():
        pytest.fail(f"OSWorld's task set is missing at {TASKS}")
    from tests.support.osworld_harness import ensure_evaluators

    venv = ensure_evaluators()
    from drums_osworld.bench import main
    from drums_osworld.catalog.apps import image_packages

    has_vlc = "vlc" in image_packages(IMAGE)
    rc = main(["osworld-tasks", "--json", "--no-progress", "--out", str(tmp_path), "--instance", INSTANCE,
               "--slot-base", str(SLOT_BASE), "--osworld-python", str(venv / "bin/python"), "--tasks", str(TASKS),
               "--image", IMAGE, "--only", "e0df059f,b3d4a89c,215dfd39", "--task-timeout", "300"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0
    for kind in ("json", "markdown", "png"):
        assert Path(res["files"][kind]).is_file(), res["files"]
    rows = {(r["key"].split("/")[1][:8], r["mode"]): r for r in res["rows"]}
    assert set(rows) == {(t, m) for t in ("e0df059f", "b3d4a89c", "215dfd39") for m in ("none", "post_setup")}
    for mode in ("none", "post_setup"):
        rename = rows[("e0df059f", mode)]
        assert rename["class"] == "clean", rename
        assert rename["score"] == 0.0 and rename["resets"][-1]["setup"]["ok"] is True
        assert [c["name"] for c in rename["calls"] if c["kind"] == "getter"] == ["vm_command_line", "rule"]
        bt = rows[("b3d4a89c", mode)]
        assert bt["infeasible"] and bt["class"] == "clean" and bt["score"] == 0.0
        vlc = rows[("215dfd39", mode)]
        if has_vlc:
            assert vlc["class"] != "needs app", vlc
        else:
            assert vlc["class"] == "needs app" and "vlc" in vlc["reason"], vlc
            setup = vlc["resets"][0]["setup"]
            assert setup["ok"] is False and setup["issues"][0]["step"] == 0, setup
            assert "127" in setup["issues"][0]["error"]
            assert "score" not in vlc or vlc["class"] != "clean"
    # post_setup: the rename's second reset is served from the state its first one saved
    ps = rows[("e0df059f", "post_setup")]
    assert [r["from_saved_state"] for r in ps["resets"]] == [False, True]
    assert ps["resets"][0]["saved_post_setup"] is True and ps["served_from_saved_state"]
    # a failed setup is never saved as a state to start from
    if not has_vlc:
        assert rows[("215dfd39", "post_setup")]["resets"][0]["saved_post_setup"] is False
    table = {(t["domain"], t["mode"]): t for t in res["table"]}
    assert table[("os", "none")]["clean"] == 1 and table[("os", "none")]["infeasible clean"] == "1/1"
    assert res["summary"]["skipped: need the internet or a newer desktop-env"] > 250
    assert res["summary"]["stand-ins (absent, reached by no benchmarked task)"] == ["easyocr", "torch"]
    assert (tmp_path / "osworld-tasks.md").read_text().startswith("# drums bench osworld-tasks")
    assert_clean(res)
