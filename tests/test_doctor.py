"""`drums doctor` on this machine, and with the CRIU binary missing.

Every test that runs the doctor lives in this file: its checks make links and mounts on the host
that the first test counts before and after, so the file runs on one pytest-xdist worker
(``--dist loadfile``) and no other worker's doctor can run meanwhile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "root", "kernel", "namespace-user", "namespace-pid", "namespace-net", "namespace-mount",
    "namespace-uts", "namespace-ipc", "overlayfs-redirect-dir", "criu-binary", "criu-version",
    "criu-check", "pycriu", "xvfb", "window-manager", "nftables", "veth", "state-dir", "ksm",
    "cgroups", "seccomp", "images", "criu-kdat-cache",
    # the host's shared kernel budgets (host/kernel_budget.py): limit, use, what the slots need
    "budget-inotify-instances", "budget-inotify-watches", "budget-fanotify-groups", "budget-fanotify-marks",
    "budget-user-namespaces", "budget-mnt-namespaces", "budget-net-namespaces", "budget-pid-max",
    "budget-threads-max",
}


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "drums_core.host.doctor", *args], cwd=CHECKOUT,
                          env=full_env, capture_output=True, text=True, timeout=180, check=False)


def _links() -> set[str]:
    return {n for n in os.listdir("/sys/class/net") if "doc" in n}  # the doctor's dvhdoc*/dvpdoc*


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if "drums-doctor" in line]  # the doctor's overlay probe


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("drums doctor's checks need root (mounts, namespaces, veth, criu check)")


@pytest.mark.timeout(300)
def test_doctor_json_all_required_ok_on_this_machine() -> None:
    links_before, mounts_before = _links(), _mounts()
    res = _doctor("--json")
    report = json.loads(res.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert EXPECTED <= set(checks), f"missing checks: {EXPECTED - set(checks)}"
    for c in report["checks"]:
        assert set(c) == {"name", "ok", "required", "detail", "fix"}
        assert isinstance(c["ok"], bool) and isinstance(c["required"], bool)
    failed = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["required"] and not c["ok"]]
    assert not failed, f"required checks failed: {failed}"
    assert report["ok"] is True
    assert res.returncode == 0, res.stderr
    assert checks["criu-version"]["detail"].startswith("4.2."), checks["criu-version"]
    assert checks["ksm"]["required"] is False
    # The checks that touch the system leave nothing behind.
    assert _links() == links_before
    assert _mounts() == mounts_before == []


@pytest.mark.timeout(300)
def test_doctor_names_a_missing_criu_and_fails(tmp_path: Path) -> None:
    missing = tmp_path / "moved-away" / "usr/sbin/criu"
    res = _doctor("--json", env={"DRUMS_CRIU": str(missing)})
    assert res.returncode != 0
    report = json.loads(res.stdout)
    assert report["ok"] is False
    checks = {c["name"]: c for c in report["checks"]}
    binary = checks["criu-binary"]
    assert binary["ok"] is False and binary["required"] is True
    assert str(missing) in binary["detail"] and "missing" in binary["detail"]
    assert "provision" in binary["fix"]
    assert checks["criu-version"]["ok"] is False
    assert checks["criu-check"]["ok"] is False
    # Only the CRIU checks fail: the report points at the missing piece, not at everything.
    failed = {c["name"] for c in report["checks"] if not c["ok"] and c["required"]}
    assert failed == {"criu-binary", "criu-version", "criu-check"}


def test_doctor_human_output_one_line_per_check() -> None:
    res = _doctor(env={"DRUMS_CRIU": "/nonexistent/criu"})
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert len(lines) == len(EXPECTED)
    for line in lines:
        assert line.split(" ", 1)[0] in {"ok", "FAIL", "warn"}, line
    fail = [line for line in lines if line.startswith("FAIL criu-binary:")]
    assert fail and "/nonexistent/criu" in fail[0] and "(fix: " in fail[0]


def test_doctor_runs_from_any_directory(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(CHECKOUT))
    for args in (["doctor", "--json"], ["--json", "doctor"]):
        out = subprocess.run([sys.executable, "-m", "drums_core.cli", *args], capture_output=True, text=True,
                             env=env, timeout=300, cwd=str(tmp_path))
        assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr
        report = json.loads(out.stdout)
        assert report["checks"] and report["ok"] is (out.returncode == 0)
