"""``drums bench <suite> --quick`` for every suite: the JSON has the right shape and sane numbers.

Smoke tests, not measurements: nothing here asserts a time (these machines are noisy; the suites
report ratios measured side by side). Each suite runs on a daemon instance of its own
(``benchtest-<pid>``, on the 100 bench slots of this test process's block: tests/support/slots.py),
which it starts and stops itself; every suite must leave
nothing of it on the host, put KSM's settings back, and count no failure.
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


def run_quick(suite: str, out: Path, capsys, extra: list[str] | None = None) -> dict:
    from drums_osworld.bench import main

    rc = main([suite, "--quick", "--json", "--no-progress", "--out", str(out), "--instance", INSTANCE,
               "--slot-base", str(SLOT_BASE), *(extra or [])])
    printed = capsys.readouterr().out
    assert rc == 0, f"drums bench {suite} --quick exited {rc}"
    res = json.loads(printed)
    on_disk = json.loads((out / f"{suite}-quick.json").read_text())
    assert on_disk["suite"] == res["suite"] == suite
    assert res["quick"] is True
    for kind in ("json", "markdown", "png"):
        assert Path(res["files"][kind]).is_file(), f"{kind} file missing: {res['files']}"
    assert (out / f"{suite}-quick.md").read_text().startswith(f"# drums bench {suite}")
    host = res["host"]
    assert host["kernel"] and host["cpus"] >= 1 and "criu" in host
    assert isinstance(res["table"], list) and res["table"], "empty table"
    assert isinstance(res["summary"], dict) and res["summary"]
    assert res["plot"]["series"], "nothing to plot"
    return res


def positive(values) -> bool:
    values = list(values)
    return bool(values) and all(isinstance(v, (int, float)) and v > 0 for v in values)


@pytest.fixture
def out(tmp_path):
    require_root()
    return tmp_path


def test_branch(out, capsys):
    res = run_quick("branch", out, capsys)
    arms = res["arms"]
    assert set(arms) == {"cold+setup", "cold+launch", "restore"}
    for name, arm in arms.items():
        assert len(arm["samples"]) == res["params"]["rounds"] == 2, name
        assert positive(arm["samples"]), name
        assert arm["stats"]["n"] == 2 and arm["stats"]["p50"] > 0
        for d in arm["detail"]:
            assert d["nonblank"] > 0.10, f"{name}: agent-ready with a blank screen: {d}"
    for d in arms["restore"]["detail"]:
        assert d["daemon"]["criu"] > 0 and d["call"] <= d["ready"]
    for d in arms["cold+setup"]["detail"]:
        assert 0 < d["boot"] <= d["setup"] <= d["ready"]
    s = res["summary"]
    assert s["speedup cold+setup/restore (p50s)"] > 0
    assert isinstance(s["target restore <= cold+setup/8 and < 0.5 s"], bool)
    assert res["failures"] == [] and res["liveness_failures"] == []
    assert_clean(res)


def test_checkpoint(out, capsys):
    res = run_quick("checkpoint", out, capsys)
    assert set(res["arms"]) == {"dump", "dump+leave-running", "dump+restore"}
    for name, arm in res["arms"].items():
        assert len(arm["rows"]) == 1, name
        row = arm["rows"][0]
        assert 0 < row["dump"] <= row["call"], row
        assert 0 < row["images_mib"] <= row["size_mib"], row
        assert row["processes"] > 3
    for arm in ("dump+leave-running", "dump+restore"):
        assert res["arms"][arm]["rows"][0]["agent_ready_again"] > 0, arm
    assert res["failures"] == []
    assert_clean(res)


def test_memory(out, capsys):
    before = _ksm()
    res = run_quick("memory", out, capsys)
    assert _ksm() == before, "the memory suite did not put KSM's settings back"
    for arm in ("cold", "restored", "restored+ksm"):
        curves = res["curves"][arm]
        assert len(curves) == 1, arm
        pts = curves[0]
        assert [p["sessions"] for p in pts] == [1, 2], arm
        assert positive(p["pss"] for p in pts), arm
        assert all(p["processes"] > 3 * p["sessions"] for p in pts), arm
        assert isinstance(res["slopes_mib_per_session"][arm]["pss"][0], float)
    assert len(res["ksm_cost"]) == 1 and res["ksm_cost"][0]["ksmd_cpu_s"] >= 0
    assert res["failures"] == []
    assert_clean(res)


def test_fanout(out, capsys):
    res = run_quick("fanout", out, capsys)
    assert res["params"]["sizes"] == [1, 4]
    for n in ("1", "4"):
        rows = res["rows"][n]
        assert len(rows) == 1
        row = rows[0]
        # the daemon applied the agent-ready test; the bench confirmed every sibling at first look
        assert row["confirmed"] == int(n) and row["daemon_verdict_voided"] is False
        assert 0 < row["call"] == row["ready"] <= row["recheck"]
        assert len(row["each_ready"]) == len(row["daemon_ready"]) == int(n)
        assert row["incomplete_at_ready"] == [] and row["liveness_failures"] == []
    assert res["check_overhead"]["n"] == 3
    assert res["failures"] == []
    assert_clean(res)


def test_soak(out, capsys):
    res = run_quick("soak", out, capsys)
    s = res["summary"]
    assert s["restores attempted"] >= 8
    assert s["failed fan-outs"] == 0 and s["liveness failures"] == 0 and s["destroy errors"] == 0
    assert s["leaks between fan-outs"] == 0
    assert res["daemon_counters"]["restores"] >= 8
    assert len(res["fanout_walls"]) == res["params"]["fanouts"] == 2
    assert_clean(res)


def test_step(out, capsys):
    res = run_quick("step", out, capsys)
    for arm, st in res["stats_ms"].items():
        assert st["n"] == 3 and st["p50"] > 0, arm
    assert res["server_screenshot"]["png bytes p50"] > 1000
    assert res["failures"] == []
    assert_clean(res)


def test_profile(out, capsys):
    res = run_quick("profile", out, capsys)
    assert len(res["per_restore"]) == 2
    for row in res["per_restore"]:
        assert 0 < row["criu.restore"] < row["restore_call"], row
        assert row["display.wait_ready"] > 0
    tl = res["criu_timeline_ms"]
    assert tl["end"] > 0 and tl["last task restored"] <= tl["end"]
    assert res["readiness_side_by_side_s"]["lean_ready_state"]["n"] == 2
    assert_clean(res)


def test_floor(out, capsys):
    res = run_quick("floor", out, capsys)
    eager = res["rows"]["eager"]
    assert len(eager) == 2 and all(r["liveness"] == "ok" for r in eager), eager
    for row in eager:
        assert 0 < row["steps"]["criu"] < row["call"], row
        assert 0 < row["criu_cpu"] < row["cpu_at_return"] <= row["cpu_after_action"], row
        assert row["pss_mib"] > 50
    if res["host"]["unprivileged_userfaultfd"]:
        assert [r["liveness"] for r in res["rows"]["lazy"]] == ["ok", "ok"]
        assert all(r["all_pages_in"] > 0 for r in res["rows"]["lazy"])
    else:  # the containment's user namespace keeps the restorer from opening a userfaultfd
        assert res["rows"]["lazy"] == [] and "userfaultfd" in res["refused"]["lazy"]
    assert res["failures"] == []
    split = res["criu_dump_split_ms"]
    assert split["tasks"] >= 5 and 0 < split["floor without pages"] < split["end"]
    assert res["checkpoint_leave_running_s"]["n"] == 2 and res["criu_dump_s"]["n"] == 2
    assert res["criu_restore_timeline_ms"]["end"] > 0
    assert_clean(res)


def test_osworld(out, capsys, monkeypatch):
    from tests.support.osworld_harness import ensure_osworld_venv, stub_dir

    venv = ensure_osworld_venv()
    monkeypatch.setenv("DRUMS_OSWORLD_PYTHONPATH", str(stub_dir(venv)))
    res = run_quick("osworld", out, capsys, ["--osworld-python", str(venv / "bin/python")])
    rows = res["rollouts"]
    assert res["failures"] == [], res["failures"]
    assert len(rows) == 2 * 2 * 3, rows
    for r in rows:
        assert r["reset"] > 0 and r["mode"] in ("none", "post_setup")
    for key, st in res["stats"].items():
        assert st["steady"]["n"] == 2 and len(st["first"]) == 1, key
    assert_clean(res)


def test_images(out, capsys):
    res = run_quick("images", out, capsys)
    assert res["failures"] == [], res["failures"]
    facts = res["images"]
    assert set(facts) == {"default", "osworld"}
    for name, f in facts.items():
        assert f["size_bytes"] > 0 and f["packages"] > 100 and f["build_seconds"] > 0, (name, f)
        assert f["apps"]["libreoffice"], name
    assert facts["osworld"]["apps"]["google-chrome"] and not facts["default"]["apps"]["chromium"]
    assert facts["osworld"]["derived"] and facts["osworld"]["base"] == "default"
    assert facts["osworld"]["size_bytes"] > facts["default"]["size_bytes"]
    for name in ("default", "osworld"):
        (c,) = res["rows"]["cold"][name]
        assert 0 < c["create"] <= c["guest"] <= c["ready"], c
        assert c["nonblank"] > 0.10, c
        for when in ("pss_writer", "pss_windows_up", "pss_after_action"):
            assert c[when]["pss"] > 0 and c[when]["processes"] > 5, (name, when, c[when])
        (i,) = res["rows"]["restore init_state"][name]
        assert 0 < i["call"] <= i["ready"] and i["daemon"]["criu"] > 0, i
        assert i["nonblank_bare"] == 0.0, "a bare desktop's screen should be uniform"
        (a,) = res["rows"]["restore apps"][name]
        assert 0 < a["call"] <= a["ready"] and a["nonblank"] > 0.10, a
        assert a["pss_restored"]["pss"] > 0 and a["pss_after_action"]["pss"] > 0, a
        for kind in ("init_state", "apps"):
            assert res["snapshots"][kind][name]["size_mib"] > 0, (kind, name)
    # Chromium is open on osworld only: its desktop has Chromium's processes, and more of them
    assert "chrome_window_s" in res["rows"]["cold"]["osworld"][0]
    assert "chrome_window_s" not in res["rows"]["cold"]["default"][0]
    assert (res["rows"]["cold"]["osworld"][0]["pss_windows_up"]["processes"]
            > res["rows"]["cold"]["default"][0]["pss_windows_up"]["processes"])
    ratios = {r["figure"]: r["osworld/default"] for r in res["table"]}
    assert ratios["image size on disk, GiB"] > 1 and ratios["cold: + Writer to agent-ready, p50 s"] > 0
    assert_clean(res)
