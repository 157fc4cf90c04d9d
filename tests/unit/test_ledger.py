"""The ledger and the sweep's rules, without root: atomic writes, key encoding, owners, fail-closed
reading, the survivors rule, two-phase directory removal, and that a second sweep is a no-op."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from drums_core.host import linux, procs
from drums_core.errors import FailedPrecondition, InvalidArgument, NotFound
from drums_core.sweep.ledger import OWNER, Ledger, LedgerCorrupt, decode_key, encode_key, entry_filename, write_atomic
from drums_core.sweep import hostops, session_selector, sweep
from drums_core.sweep.report import COUNTS
from drums_core.sweep.step_dirs import RETIRE_KEY

from tests.support import reaping
from tests.support.wait import wait_until

REPO = str(Path(__file__).resolve().parents[2])


def _run_id(label: str = "u") -> str:
    return f"utest-{label}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kids():
    """Start children; this test is their subreaper, and every one is killed and reaped at the end."""
    helpers_before = reaping.descendants()  # other tests' helpers this process holds are not ours
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
    started: list[subprocess.Popen] = []

    def start(argv, **kw):
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    for p in started:
        with contextlib.suppress(ChildProcessError):
            p.wait(timeout=10)
    reaping.kill_new_descendants(helpers_before, tries=50)  # and their orphans, reparented to us
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 0)


def _wait_argv(pid: int, last: str, timeout: float = 5.0) -> None:
    wait_until(lambda: procs.read_cmdline(pid)[-1:] == [last], timeout, f"pid {pid} to show argv ending {last!r}",
               every=0.01)


def _tagged(kids, run: str, code: str = "import time; time.sleep(600)"):
    p = kids([sys.executable, "-c", code, "--tag", procs.run_tag(run)])
    _wait_argv(p.pid, procs.run_tag(run))
    return p


def _dead_ledger(root: Path, run: str, kids) -> Ledger:
    """A ledger whose owner really existed and is now dead (and reaped)."""
    owner = kids(["sleep", "600"])
    led = Ledger.create(root, run, pid=owner.pid)
    owner.kill()
    owner.wait()
    assert not led.owner_alive()
    return led


# ================================================================== ledger basics
def test_create_record_get_update_forget_remove(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    assert Ledger.runs(tmp_path) == ["r1"]
    assert led.owner_alive()
    e = led.record("session", "s1", dir="/x/r1/s1", slot=3, state="STARTING")
    assert e.kind == "session" and e.key == "s1" and e.data["slot"] == 3 and e.created > 0
    assert led.get("session", "s1") == e
    u = led.update("session", "s1", state="RUNNING", init_pid=42)
    assert u.data == {"dir": "/x/r1/s1", "slot": 3, "state": "RUNNING", "init_pid": 42}
    assert u.created == e.created
    again = led.record("session", "s1", dir="/x/r1/s1")
    assert again.data == {"dir": "/x/r1/s1"} and again.created == e.created
    led.record("nft", "inet/drums_r1", family="inet", name="drums_r1")
    assert [x.kind for x in led.entries()] == ["session", "nft"]
    assert [x.key for x in led.entries("nft")] == ["inet/drums_r1"]
    assert not led.remove_if_empty()
    led.forget("session", "s1")
    led.forget("session", "s1")  # absent: no error
    led.forget("nft", "inet/drums_r1")
    assert led.entries() == []
    assert led.remove_if_empty()
    assert not led.path.exists()
    assert Ledger.runs(tmp_path) == []
    assert led.remove_if_empty()  # idempotent


def test_open_does_not_claim(tmp_path, kids):
    led = _dead_ledger(tmp_path, "r1", kids)
    before = (led.path / OWNER).read_bytes()
    again = Ledger.open(tmp_path, "r1")
    assert not again.owner_alive()
    assert (led.path / OWNER).read_bytes() == before
    with pytest.raises(NotFound):
        Ledger.open(tmp_path, "nope")


def test_create_twice_refused_and_leaves_no_temp(tmp_path):
    Ledger.create(tmp_path, "r1")
    with pytest.raises(FailedPrecondition):
        Ledger.create(tmp_path, "r1")
    assert sorted(os.listdir(tmp_path)) == ["r1"]


@pytest.mark.parametrize("run", ["", "../x", "a/b", ".hidden", "..", "a..b", "x" * 200, "a b"])
def test_bad_run_ids(tmp_path, run):
    with pytest.raises(InvalidArgument):
        Ledger(tmp_path, run)


def test_bad_kind_key_and_data_write_nothing(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    with pytest.raises(InvalidArgument):
        led.record("bogus", "k")
    with pytest.raises(InvalidArgument):
        led.record("dir", "")
    with pytest.raises(InvalidArgument):
        led.record("dir", "a\0b")
    with pytest.raises(InvalidArgument):
        led.record("dir", "/x/y", blob=object())
    with pytest.raises(NotFound):
        led.update("dir", "/x/never")
    assert sorted(os.listdir(led.path)) == [OWNER]


def test_path_values_are_stored_as_strings(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    e = led.record("dir", Path("/x/r1/s1"), path=Path("/x/r1/s1"), layers=(Path("/a"), "/b"))
    assert e.key == "/x/r1/s1" and e.data == {"path": "/x/r1/s1", "layers": ["/a", "/b"]}
    assert led.get("dir", "/x/r1/s1").data == e.data


def test_kind_data_may_be_called_kind_or_key(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    e = led.record("op", "o1", kind="restore", key="k")
    assert e.data == {"kind": "restore", "key": "k"}


def test_threads_record_concurrently(tmp_path):
    led = Ledger.create(tmp_path, "r1")

    def work(t):
        for i in range(40):
            led.record("process", f"t{t}/{i}", pid=1000 + i, starttime=t)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(led.entries()) == 240
    assert not [n for n in os.listdir(led.path) if n.startswith(".")]


# ================================================================== key encoding
@pytest.mark.parametrize("key", ["/run/drums/default/sessions/abc/root", "..", "../..", "/x/../../etc/passwd",
                                 "a/b/../c", ".", "/", "dvh3", "inet/drums_x", "é/ü/漢字", "with space\tand\nnewline",
                                 "x" * 1000, "/" * 300])
def test_keys_with_slashes_and_dots_stay_inside(tmp_path, key):
    led = Ledger.create(tmp_path / "ledger", "r1")
    led.record("mount", key, n=1)
    names = [n for n in os.listdir(led.path) if n != OWNER]
    assert len(names) == 1
    name = names[0]
    assert "/" not in name and name not in (".", "..") and not name.startswith(".") and len(name) <= 255
    assert sorted(os.listdir(tmp_path)) == ["ledger"]
    assert sorted(os.listdir(tmp_path / "ledger")) == ["r1"]
    assert led.get("mount", key).key == key
    assert [e.key for e in led.entries()] == [key]
    led.forget("mount", key)
    assert led.entries() == []


def test_encoding_roundtrip_and_hashing():
    for key in ["..", "/a/b", "é"]:
        enc = encode_key(key)
        assert enc.startswith("b") and decode_key(enc) == key
    long = "/x/" + "y" * 500
    enc = encode_key(long)
    assert enc.startswith("h") and len(enc) == 65 and decode_key(enc) is None
    assert encode_key("a") != encode_key("b")
    assert entry_filename("dir", "/x") != entry_filename("mount", "/x")


# ================================================================== atomicity and corruption
def _crash_in_child(root: Path, run: str, body: str) -> int:
    code = (f"import os, sys\nsys.path.insert(0, {REPO!r})\nfrom drums_core.sweep.ledger import Ledger\n"
            f"led = Ledger.open({str(root)!r}, {run!r})\n"
            "os.replace = lambda *a, **k: os._exit(9)\n" + body)
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_crash_between_temp_write_and_rename_is_not_an_entry(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    led.record("mount", "/x/r1/root", v=1)
    assert _crash_in_child(tmp_path, "r1", "led.record('dir', '/x/r1/new', v=1)\n") == 9
    assert _crash_in_child(tmp_path, "r1", "led.update('mount', '/x/r1/root', v=2)\n") == 9
    temps = [n for n in os.listdir(led.path) if n.startswith(".tmp.")]
    assert len(temps) == 2  # the torn writes are there, complete, under temp names
    assert all(json.loads((led.path / t).read_text())["data"] for t in temps)
    assert [(e.kind, e.key, e.data) for e in led.entries()] == [("mount", "/x/r1/root", {"v": 1})]
    assert led.get("dir", "/x/r1/new") is None
    led.forget("mount", "/x/r1/root")
    assert led.remove_if_empty()  # temp files do not keep a ledger alive


def test_partial_temp_file_is_ignored(tmp_path):
    led = Ledger.create(tmp_path, "r1")
    (led.path / ".tmp.dir.bL3gvcjE.json.123.456.abcd").write_text('{"v": 1, "kind": "dir", "ke')
    assert led.entries() == []


def test_write_atomic_cleans_its_temp_on_error(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(tmp_path, "x.json", b"{}")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage", ["torn", "empty", "wrong-key", "wrong-kind", "unknown-file", "not-object"])
def test_corrupt_entry_raises(tmp_path, damage):
    led = Ledger.create(tmp_path, "r1")
    led.record("dir", "/x/r1/a")
    f = led.path / entry_filename("dir", "/x/r1/a")
    doc = json.loads(f.read_text())
    if damage == "torn":
        f.write_text(f.read_text()[:20])
    elif damage == "empty":
        f.write_text("")
    elif damage == "wrong-key":
        doc["key"] = "/x/r1/b"
        f.write_text(json.dumps(doc))
    elif damage == "wrong-kind":
        f.rename(led.path / entry_filename("mount", "/x/r1/a"))
    elif damage == "unknown-file":
        (led.path / "notes.txt").write_text("hello")
    elif damage == "not-object":
        f.write_text("[1, 2]")
    with pytest.raises(LedgerCorrupt):
        led.entries()


# ================================================================== owners
def test_owner_states(tmp_path, kids):
    led = Ledger.create(tmp_path, "me")
    assert led.owner_status() == "alive"
    owner = kids(["sleep", "600"])
    z = Ledger.create(tmp_path, "zombie", pid=owner.pid)
    assert z.owner_alive()
    os.kill(owner.pid, signal.SIGKILL)
    wait_until(lambda: procs.read_stat(owner.pid).zombie, 5, "the killed owner to be a zombie", every=0.01)
    assert not z.owner_alive()  # a zombie owner is dead
    owner.wait()
    assert not z.owner_alive()
    rec = json.loads((led.path / OWNER).read_text())
    write_atomic(led.path, OWNER, json.dumps({**rec, "starttime": rec["starttime"] + 1}).encode())
    assert not led.owner_alive()  # pid reused by someone else
    write_atomic(led.path, OWNER, json.dumps({**rec, "boot_id": "another-boot"}).encode())
    assert not led.owner_alive()
    os.unlink(led.path / OWNER)
    assert led.owner_status() == "missing" and not led.owner_alive()
    (led.path / OWNER).write_text("{garbage")
    with pytest.raises(LedgerCorrupt):
        led.owner_alive()


def test_adopt(tmp_path, kids):
    led = _dead_ledger(tmp_path, "r1", kids)
    old = led.owner()
    led.adopt()
    assert led.owner_alive()
    assert led.owner()["pid"] == os.getpid() and led.owner()["previous"]["pid"] == old["pid"]
    with pytest.raises(InvalidArgument):
        led.adopt(10**9)


def test_runs_ignores_temps_and_files(tmp_path):
    Ledger.create(tmp_path, "b")
    Ledger.create(tmp_path, "a")
    (tmp_path / ".tmp.c.0123").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    assert Ledger.runs(tmp_path) == ["a", "b"]
    assert Ledger.runs(tmp_path / "missing") == []


# ================================================================== the sweep, without root
def test_sweep_kills_by_tag_record_and_descent_and_spares_decoys(tmp_path, kids):
    run = _run_id("k")
    led = _dead_ledger(tmp_path / "ledger", run, kids)
    parent = _tagged(kids, run, "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)")
    recorded = kids(["sleep", "601"])
    led.record("process", "helper", pid=recorded.pid, starttime=procs.starttime(recorded.pid))
    decoy = _tagged(kids, run + "0")  # drums:<run>0 is another run
    decoy_substring = kids([sys.executable, "-c", "import time; time.sleep(600)", f"--tag=x{procs.run_tag(run)}"])
    wait_until(lambda: procs.descendants(procs.scan_processes(), [parent.pid]), 5, "the parent's child", every=0.01)
    grandchild = next(iter(procs.descendants(procs.scan_processes(), [parent.pid])))

    rep = sweep(tmp_path / "ledger")
    rr = rep.runs[0]
    assert rr.status == "swept", rr
    assert rep.processes_killed == 3
    for p in (parent.pid, recorded.pid, grandchild):
        assert not procs.is_alive(p)
    assert procs.is_alive(decoy.pid) and procs.is_alive(decoy_substring.pid)
    assert not led.path.exists()
    assert sweep(tmp_path / "ledger").is_noop()


def test_survivor_keeps_its_entry_and_the_ledger(tmp_path, kids, monkeypatch):
    run = _run_id("s")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    stuck = _tagged(kids, run)
    led.record("process", "init", pid=stuck.pid, starttime=procs.starttime(stuck.pid), tag=procs.run_tag(run))
    untracked = _tagged(kids, run)  # found by tag only
    sdir = tmp_path / "sessions" / "s1"
    sdir.mkdir(parents=True)
    led.record("dir", str(sdir))
    led.record("op", "restore/s1", phase="criu")

    # Simulate processes that cannot be reaped (e.g. stuck in D state): "killed" but still alive.
    monkeypatch.setattr(hostops, "kill_processes", lambda handles, timeout: list(handles))
    rep = sweep(root, kill_timeout=0.1)
    rr = rep.runs[0]
    assert rr.status == "survivors", rr
    assert rep.survivors == 2 and rep.processes_killed == 0
    assert {s["pid"] for s in rr.survivors} == {stuck.pid, untracked.pid}
    assert led.path.is_dir()
    kept = led.entries()
    assert {e.kind for e in kept} == {"process"}  # only survivors are left
    assert {e.data["pid"] for e in kept} == {stuck.pid, untracked.pid}
    assert not sdir.exists()
    assert procs.is_alive(stuck.pid) and procs.is_alive(untracked.pid)

    monkeypatch.undo()
    rep2 = sweep(root)
    assert rep2.processes_killed == 2 and rep2.survivors == 0
    assert rep2.runs[0].status == "swept" and not led.path.exists()
    assert sweep(root).is_noop()


def test_corrupt_ledger_fails_closed(tmp_path, kids):
    run = _run_id("c")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    victim = _tagged(kids, run)
    sdir = tmp_path / "sessions" / "s1"
    sdir.mkdir(parents=True)
    led.record("dir", str(sdir))
    led.record("mount", str(sdir / "root"))
    f = led.path / entry_filename("mount", str(sdir / "root"))
    good = f.read_bytes()
    f.write_bytes(good[: len(good) // 2])

    rep = sweep(root)
    rr = rep.runs[0]
    assert rr.status == "failed-closed" and rep.errors == 1
    assert rep.processes_killed == 0 and rep.dirs_removed == 0
    assert procs.is_alive(victim.pid) and sdir.is_dir() and led.path.is_dir()

    f.write_bytes(good)
    rep = sweep(root)
    assert rep.runs[0].status == "swept" and rep.processes_killed == 1 and rep.dirs_removed == 1


def test_entry_naming_a_forbidden_path_fails_closed(tmp_path, kids):
    run = _run_id("f")
    led = _dead_ledger(tmp_path / "ledger", run, kids)
    victim = _tagged(kids, run)
    led.record("dir", "/tmp")
    rep = sweep(tmp_path / "ledger")
    assert rep.runs[0].status == "failed-closed"
    assert procs.is_alive(victim.pid) and os.path.isdir("/tmp")


def test_dirs_retire_in_two_phases_and_leftovers_are_finished(tmp_path, kids, monkeypatch):
    run = _run_id("d")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    parent = tmp_path / "sessions"
    sdir = parent / "s1"
    (sdir / "upper" / "deep").mkdir(parents=True)
    (sdir / "upper" / "deep" / "f").write_text("x")
    os.symlink("/etc", sdir / "upper" / "etc-link")  # must be unlinked, never followed
    led.record("dir", str(sdir))
    seeded = parent / ".rm-s1-0123456789abcdef"  # debris of an earlier killed sweep
    (seeded / "x").mkdir(parents=True)
    decoys = [parent / ".rm-s10-0123456789abcdef", parent / ".rm-s1-d-0123456789abcdef", parent / ".rm-s1-xyz",
              parent / "s10"]
    for d in decoys:
        d.mkdir()

    # the sweep dies between the rename and the delete ...
    def killed(*a, **k):
        raise SystemExit("killed")

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(SystemExit):
        sweep(root)
    monkeypatch.undo()
    assert not sdir.exists()
    retiring = led.get("dir", str(sdir)).data[RETIRE_KEY]
    assert os.path.isdir(retiring) and os.path.basename(retiring).startswith(".rm-s1-")

    # ... and the next one finishes both leftovers
    rep = sweep(root)
    assert rep.runs[0].status == "swept", rep.runs[0]
    assert rep.dirs_removed == 2
    assert not os.path.exists(retiring) and not seeded.exists()
    assert all(d.is_dir() for d in decoys)
    assert os.path.isdir("/etc") and os.listdir("/etc")
    assert sweep(root).is_noop()


def test_x11_links_only_if_still_ours(tmp_path, kids):
    run = _run_id("x")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    xdir = tmp_path / "x11"
    xdir.mkdir()
    ours = xdir / "X103"
    os.symlink("/proc/1/root/tmp/.X11-unix/X0", ours)
    moved = xdir / "X104"
    os.symlink("/proc/2/root/tmp/.X11-unix/X0", moved)
    real = xdir / "X105"
    real.write_text("a real socket stand-in")
    led.record("x11link", str(ours))
    led.record("x11link", str(moved), target="/proc/999/root/tmp/.X11-unix/X0")
    led.record("x11link", str(real))
    rep = sweep(root)
    assert rep.x11links_removed == 1 and rep.runs[0].status == "swept"
    assert not os.path.lexists(ours) and os.path.islink(moved) and real.is_file()


def test_dry_run_changes_nothing(tmp_path, kids):
    run = _run_id("n")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    victim = _tagged(kids, run)
    sdir = tmp_path / "sessions" / "s1"
    sdir.mkdir(parents=True)
    led.record("dir", str(sdir))
    before = sorted(os.listdir(led.path))
    rep = sweep(root, dry_run=True)
    assert rep.dry_run and rep.runs[0].status == "dry-run"
    assert rep.processes_killed == 1 and rep.dirs_removed == 1
    assert procs.is_alive(victim.pid) and procs.read_stat(victim.pid).state != "T"
    assert sdir.is_dir() and sorted(os.listdir(led.path)) == before


def test_live_runs_are_skipped_and_their_claims_respected(tmp_path, kids):
    root = tmp_path / "ledger"
    live_owner = kids(["sleep", "600"])
    live_run, dead_run = _run_id("live"), _run_id("dead")
    live = Ledger.create(root, live_run, pid=live_owner.pid)
    live_proc = _tagged(kids, live_run)
    shared = tmp_path / "sessions" / "shared"
    (shared / "inner").mkdir(parents=True)
    live.record("dir", str(shared / "inner"))
    dead = _dead_ledger(root, dead_run, kids)
    dead.record("dir", str(shared))  # holds what a live run recorded: must be left alone
    dead.record("process", "p", pid=live_proc.pid, starttime=procs.starttime(live_proc.pid))

    rep = sweep(root)
    by_run = {r.run: r for r in rep.runs}
    assert by_run[live_run].status == "skipped-alive"
    assert by_run[dead_run].status == "incomplete"  # the live run's process was spared, its entry kept
    assert by_run[dead_run].spared and by_run[dead_run].spared[0]["pid"] == live_proc.pid
    assert procs.is_alive(live_proc.pid) and shared.is_dir() and (shared / "inner").is_dir()
    assert any("live run" in n for n in by_run[dead_run].notes)
    assert live.path.is_dir()

    rep = sweep(root, run=live_run)
    assert rep.runs[0].status == "skipped-alive" and procs.is_alive(live_proc.pid)


def test_ledger_root_is_never_swept_away(tmp_path, kids):
    state = tmp_path / "state"
    root = state / "ledger"
    led = _dead_ledger(root, _run_id("r"), kids)
    led.record("dir", str(state))
    rep = sweep(root)
    assert rep.runs[0].status == "swept"
    assert state.is_dir() and root.is_dir()
    assert any("ledger root" in n for n in rep.runs[0].notes)


def test_busy_and_absent_runs(tmp_path, kids):
    root = tmp_path / "ledger"
    run = _run_id("b")
    led = _dead_ledger(root, run, kids)
    led.record("op", "x")
    with led.locked():
        rep = sweep(root)
    assert rep.runs[0].status == "busy" and led.get("op", "x")
    rep = sweep(root, run="no-such-run")
    assert rep.runs[0].status == "absent" and rep.errors == 0


def test_stale_create_temp_dirs_are_cleaned(tmp_path, kids):
    root = tmp_path / "ledger"
    owner = kids(["sleep", "600"])
    tmp = root / ".tmp.r9.0123456789ab"
    tmp.mkdir(parents=True)
    (tmp / OWNER).write_text(json.dumps({"pid": owner.pid, "starttime": procs.starttime(owner.pid)}))
    sweep(root)
    assert tmp.exists()  # its creator is alive
    owner.kill()
    owner.wait()
    sweep(root)
    assert not tmp.exists()


def test_cli_json(tmp_path, kids):
    root = tmp_path / "ledger"
    run = _run_id("cli")
    led = _dead_ledger(root, run, kids)
    victim = _tagged(kids, run)
    led.record("process", "v", pid=victim.pid, starttime=procs.starttime(victim.pid))
    env = {**os.environ, "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-m", "drums_core.sweep", "--ledger", str(root), "--json"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["processes_killed"] == 1 and doc["ledgers_removed"] == 1 and doc["errors"] == 0
    assert doc["runs"][0]["run"] == run and doc["runs"][0]["status"] == "swept"
    assert f"sweep run={run} status=swept" in out.stderr
    out = subprocess.run([sys.executable, "-m", "drums_core.sweep", "--ledger", str(root), "--json"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and all(doc[k] == 0 for k in COUNTS)
    with contextlib.suppress(OSError):
        shutil.rmtree(root)


def test_lock_is_reentrant_for_adopt(tmp_path, kids):
    led = _dead_ledger(tmp_path, "r1", kids)
    with led.locked():
        if not led.owner_alive():
            led.adopt()
    assert led.owner_alive()


def test_selective_sweep_of_one_session_spares_the_adopted_ones(tmp_path, kids):
    """Restart recovery: adopt a dead run, keep its live session s1, sweep its half-restored s2."""
    run = _run_id("sel")
    root = tmp_path / "ledger"
    led = _dead_ledger(root, run, kids)
    dirs = {}
    inits = {}
    for sid in ("s1", "s2"):
        dirs[sid] = tmp_path / "sessions" / sid
        dirs[sid].mkdir(parents=True)
        inits[sid] = _tagged(kids, run)  # both carry the run's tag
        start = procs.starttime(inits[sid].pid)
        led.record("session", sid, dir=str(dirs[sid]), init_pid=inits[sid].pid, starttime=start, state="RUNNING")
        led.record("process", sid, pid=inits[sid].pid, starttime=start, tag=procs.run_tag(run))
        led.record("dir", str(dirs[sid]), session=sid)
    led.record("op", "restore/s2", session="s2", phase="criu")
    stray = _tagged(kids, run)  # tagged but in no selected entry: the tag alone must not doom it

    led.adopt()
    rep = sweep(root, run=run, only_dead=False, select=session_selector("s2"))
    rr = rep.runs[0]
    assert rr.status == "swept", rr
    assert rep.processes_killed == 1 and rep.dirs_removed == 1 and not rr.ledger_removed
    assert not procs.is_alive(inits["s2"].pid) and not dirs["s2"].exists()
    assert procs.is_alive(inits["s1"].pid) and dirs["s1"].is_dir() and procs.is_alive(stray.pid)
    assert {(e.kind, e.key) for e in led.entries()} == {("session", "s1"), ("process", "s1"), ("dir", str(dirs["s1"]))}
    with pytest.raises(InvalidArgument):
        sweep(root, select=session_selector("s1"))
