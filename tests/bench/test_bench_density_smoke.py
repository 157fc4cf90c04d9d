"""``drums bench density --quick --max 3``: the report's fields are real (no timing is asserted).

Three restored osworld desktops (Chromium, GIMP, VLC and Impress open), each alive and answering a
screenshot; their PSS with KSM off and on, inotify and pids per desktop; one round with and one
without a hostile desktop, whose attacks are capped here (the test runs beside others on this
host: 8 inotify instances and 512 tasks are enough to show the attacks ran; the full run takes
them until refused). Nothing of the instance may be left, and KSM's settings must be back.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.benchlib import INSTANCE, SLOT_BASE, assert_clean
from tests.support.suite import require_root

KSM_KEYS = ("run", "pages_to_scan", "sleep_millisecs")


def _ksm() -> dict:
    base = Path("/sys/kernel/mm/ksm")
    return {k: (base / k).read_text().strip() for k in KSM_KEYS} if base.is_dir() else {}


@pytest.fixture
def out(tmp_path):
    require_root()
    return tmp_path


def test_density_quick_reports_real_fields(out, capsys):
    from drums_osworld.bench import main

    before = _ksm()
    rc = main(["density", "--quick", "--max", "3", "--json", "--no-progress", "--out", str(out),
               "--instance", INSTANCE, "--slot-base", str(SLOT_BASE),
               "--hostile-inotify-cap", "8", "--hostile-pids-cap", "512"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0, f"drums bench density exited {rc}"
    assert _ksm() == before, "the density suite did not put KSM's settings back"
    assert json.loads((out / "density-quick.json").read_text())["suite"] == res["suite"] == "density"
    assert (out / "density-quick.md").read_text().startswith("# drums bench density")
    s = res["summary"]
    # filled to --max, every desktop restored, alive and answering a non-blank screenshot
    assert s["desktops held"] == 3 and s["stop reason"] == "max", res["stop"]
    fill = res["fill"]
    assert len(fill) == 3 and all("error" not in f and f["restore_s"] > 0 and f["nonblank"] > 0.10 for f in fill), fill
    # the desktop really has the four applications up
    titles = " ".join(res["desktop"]["windows"]).lower()
    for app in ("chromium", "gnu image manipulation program", "vlc media player", "impress"):
        assert app in titles, titles
    off, on = res["per_desktop"]["ksm_off"], res["per_desktop"]["ksm_on"]
    assert off["desktops"] == 3 and 100 < off["pss_mib"] < 4096, off
    assert off["processes"] > 10 and off["tasks"] >= off["processes"], off
    assert off["inotify_instances"] >= 1 and off["inotify_watches"] >= off["inotify_instances"], off
    if "skipped" not in res["ksm"]:  # another user's KSM run leaves it unmeasured, and says so
        assert on["desktops"] == 3 and 0 < on["pss_mib"] <= off["pss_mib"] * 1.05, (off, on)
        assert res["ksm"]["settings_back"] is True
    assert s["MemAvailable at start MiB"] > 0 and s["memory allows (MemAvailable at start / PSS)"] > 0
    # the hostile phase: both arms ran on the same held desktops; the hostile one really attacked
    rounds = res["hostile_phase"]["rounds"]
    assert {r["arm"] for r in rounds} == {"without", "with hostile"}
    for r in rounds:
        assert r["screenshots"] == res["hostile_phase"]["room"]["held"] and len(r["checkpoints"]) == 1, r
        assert r["restore_s"] and all(x > 0 for x in r["restore_s"]), r
    [h] = res["hostile_phase"]["hostile"]
    assert "error" not in h, h
    st = h["status"]
    assert st["inotify"]["instances"] >= 1 and st["pids"]["tasks"] >= 1, st
    assert st["sparse"]["ok"] and st["sparse"]["size"] == 20 << 40, st["sparse"]
    assert st["links"]["ok"] and st["links"]["nlink"] == 3001, st["links"]
    assert "argv" in st and "checkpoint" in h, h
    assert isinstance(s["restore p50 with/without"], float)
    assert s["failures among the others without hostile"] == 0, res["failures"]
    assert s["failures among the others with hostile"] == 0, res["failures"]
    assert_clean(res)
