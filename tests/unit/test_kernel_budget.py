"""The host's shared kernel budgets (drums_core/host/kernel_budget.py), without root or sessions:
what every slot's share needs, a CRIU failure named by the counter that ran out, and the record of
the host limits Drums raised being put back (and only those)."""
from __future__ import annotations

import json

import pytest

from drums_core.host import kernel_budget


def test_every_share_fits_the_need_it_is_counted_in():
    needs = kernel_budget.needs(slots=10, pids=4096, memory_max=1 << 30)
    caps = kernel_budget.SESSION_CAPS
    # per uid a session stops at its caps; the need covers both uids of every slot and the host's reserve
    assert needs["inotify_instances"][1] >= 10 * 2 * caps["max_inotify_instances"] + 512
    # in all, a session stops where its memory limit can pay no more: the need covers that too
    assert needs["inotify_instances"][1] >= 10 * ((1 << 30) // 512)
    assert needs["user_namespaces"][1] == 10 * 2 * caps["max_user_namespaces"] + 1024
    assert needs["pid_max"] == ("kernel/pid_max", 10 * 4096 + kernel_budget.PID_RESERVE)
    assert all(v <= kernel_budget.INT_MAX for _, v in needs.values())


@pytest.mark.parametrize("lines, counter, reason", [
    (["(00.012345) Error (criu/kerndat.c:1234): Can't create inotify: Too many open files"],
     "inotify_instances", "HOST_BUDGET"),
    (["Error (criu/fsnotify.c:500): Can't add inotify watch: No space left on device"], "inotify_watches",
     "HOST_BUDGET"),
    (["Error (criu/cr-restore.c:1400): Can't fork for 57: Resource temporarily unavailable"], "pid_max",
     "PID_BUDGET"),
])
def test_a_criu_failure_a_budget_explains_is_named(lines, counter, reason):
    err = kernel_budget.shortage(lines, slots=4)
    assert err is not None and err.reason == reason and err.code == "UNAVAILABLE"
    assert err.detail["counter"] == counter and err.detail["limit"] > 0
    assert "in use of" in err.message and counter.replace("_", " ") in err.message


def test_a_criu_failure_no_budget_explains_is_not_named():
    assert kernel_budget.shortage(["Error (criu/files.c:1200): Unable to open fd=31 id=0x2: Broken pipe"]) is None


def test_restore_puts_back_only_what_the_record_holds(tmp_path, monkeypatch):
    record = tmp_path / "host-limits.json"
    monkeypatch.setattr(kernel_budget, "RECORD", record)
    written = {}
    monkeypatch.setattr(kernel_budget, "_sysctl_path", lambda name: tmp_path / name.replace("/", "_"))
    (tmp_path / "fs_inotify_max_user_instances").write_text("8704\n")
    record.write_text(json.dumps({"fs/inotify/max_user_instances": 128}))
    out = kernel_budget.restore()
    assert out == [{"sysctl": "fs/inotify/max_user_instances", "to": 128}]
    assert (tmp_path / "fs_inotify_max_user_instances").read_text() == "128\n"
    assert not record.exists() and not written
    assert kernel_budget.restore() == []  # nothing recorded: nothing written


def test_apply_records_the_value_found_before_it_raises_it(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_budget, "RECORD", tmp_path / "host-limits.json")
    monkeypatch.setattr(kernel_budget, "_sysctl_path", lambda name: tmp_path / name.replace("/", "_"))
    needs = kernel_budget.needs(slots=2)
    for sysctl, need in needs.values():
        (tmp_path / sysctl.replace("/", "_")).write_text(f"{need}\n")
    (tmp_path / "fs_inotify_max_user_instances").write_text("128\n")
    changed = kernel_budget.apply(slots=2)
    assert [c["sysctl"] for c in changed] == ["fs/inotify/max_user_instances"]
    assert json.loads((tmp_path / "host-limits.json").read_text()) == {"fs/inotify/max_user_instances": 128}
    assert kernel_budget.apply(slots=2) == []  # idempotent
    assert json.loads((tmp_path / "host-limits.json").read_text()) == {"fs/inotify/max_user_instances": 128}


def test_a_limit_that_cannot_be_raised_is_not_recorded_and_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_budget, "RECORD", tmp_path / "host-limits.json")
    monkeypatch.setattr(kernel_budget, "_sysctl_path", lambda name: tmp_path / name.replace("/", "_"))
    for sysctl, need in kernel_budget.needs(slots=2).values():
        (tmp_path / sysctl.replace("/", "_")).write_text(f"{need}\n")
    target = tmp_path / "fs_inotify_max_user_instances"
    target.write_text("128\n")
    target.chmod(0o444)
    monkeypatch.setattr(kernel_budget, "_sysctl_path",
                        lambda name: (tmp_path / "ro") if name.startswith("fs/inotify/max_user_i")
                        else tmp_path / name.replace("/", "_"))
    (tmp_path / "ro").mkdir()  # writing a directory fails (IsADirectoryError), as a sysctl without the right does
    monkeypatch.setattr(kernel_budget, "read_sysctl", lambda name: 128 if name.startswith("fs/inotify/max_user_i")
                        else int((tmp_path / name.replace("/", "_")).read_text()))
    with pytest.raises(kernel_budget.Unavailable) as e:
        kernel_budget.apply(slots=2)
    assert e.value.reason == "HOST_BUDGET" and "fs.inotify.max_user_instances" in e.value.message
    assert not (tmp_path / "host-limits.json").exists() or json.loads((tmp_path / "host-limits.json").read_text()) == {}
