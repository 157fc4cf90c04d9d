"""The ``drums`` CLI against the suite's daemon: every command, JSON for scripts, exit codes passed through."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.suite import DRUMS_CLI, instance_env
from tests.support import REPO


def drums(instance, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = instance_env(instance)
    out = subprocess.run([*DRUMS_CLI, *args], capture_output=True, text=True, env=env,
                         timeout=300)
    if check:
        assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out


def test_cli_round_trip(client, drums_instance, tmp_path):
    up = json.loads(drums(drums_instance, "--json", "up", "--program",
                                 "xterm -xrm '*allowTitleOps: false' -title clitest",
                          "--expect-window", "clitest").stdout)
    sid = up["id"]
    assert up["address"].startswith("169.254.")
    table = drums(drums_instance, "ls").stdout
    assert sid in table and "RUNNING" in table
    ex = drums(drums_instance, "exec", sid, "--user", "user", "--", "sh", "-c", "id -un; exit 7", check=False)
    assert ex.returncode == 7 and ex.stdout.strip() == "user"
    png = tmp_path / "shot.png"
    drums(drums_instance, "screenshot", sid, "-o", str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    snap_id = drums(drums_instance, "checkpoint", sid, "--name", "cli-snap").stdout.strip()
    assert len(snap_id) == 32
    sibs = json.loads(drums(drums_instance, "--json", "restore", "cli-snap", "--count", "2").stdout)
    assert len(sibs) == 2
    listing = json.loads(drums(drums_instance, "--json", "snapshots").stdout)
    assert any(s["id"] == snap_id and s["name"] == "cli-snap" for s in listing["snapshots"])
    assert listing["store"]["budget"] > 0 and listing["store"]["used"] >= listing["snapshots"][0]["size"]
    assert "cli-snap" in drums(drums_instance, "snapshots").stdout
    audit = json.loads(drums(drums_instance, "--json", "audit", sibs[0]["id"], sibs[1]["id"]).stdout)
    assert audit["unexpected"] == []
    bad = drums(drums_instance, "--json", "restore", "../etc", check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"]["code"] == "INVALID_ARGUMENT"
    for s in sibs:
        drums(drums_instance, "destroy", s["id"])
    drums(drums_instance, "delete-snapshot", snap_id)
    assert json.loads(drums(drums_instance, "--json", "ls").stdout) == []


def test_global_options_before_or_after_the_command(client, drums_instance):
    sid = client.create({"image": "default", "programs": []})["id"]
    try:
        after = drums(drums_instance, "ls", "--json")
        before = drums(drums_instance, "--json", "ls")
        assert after.stdout == before.stdout and [s["id"] for s in json.loads(after.stdout)] == [sid]
        # --instance after the command names the instance as well as before it
        named = drums(drums_instance, "ls", "--instance", drums_instance.name, "--json")
        assert json.loads(named.stdout) == json.loads(before.stdout)
        bad = drums(drums_instance, "restore", "../etc", "--json", check=False)
        assert bad.returncode == 1 and json.loads(bad.stdout)["error"]["code"] == "INVALID_ARGUMENT"
        missing = drums(drums_instance, "destroy", "no-such-session", check=False)
        assert missing.returncode == 1 and missing.stderr.strip().startswith("drums destroy: NOT_FOUND:")
        assert len(missing.stderr.splitlines()) == 1
    finally:
        client.destroy(sid)


def test_exec_exit_codes_keep_the_commands_own(client, drums_instance):
    """The command's status passes through; Drums' own failures are 125, a command that cannot be
    run 126, one that is not there 127 (as `docker run` and `env`)."""
    sid = client.create({"image": "default", "programs": []})["id"]
    try:
        assert drums(drums_instance, "exec", sid, "--", "sh", "-c", "exit 3", check=False).returncode == 3
        assert drums(drums_instance, "exec", sid, "--", "true").returncode == 0
        nf = drums(drums_instance, "exec", sid, "--", "no-such-command-here", check=False)
        assert nf.returncode == 127 and "no-such-command-here" in nf.stderr
        assert drums(drums_instance, "exec", sid, "--", "/etc/hostname", check=False).returncode == 126
        gone = drums(drums_instance, "exec", "no-such-session", "--", "true", check=False)
        assert gone.returncode == 125 and "NOT_FOUND" in gone.stderr and len(gone.stderr.splitlines()) == 1
        gone_json = drums(drums_instance, "exec", "no-such-session", "--json", "--", "true", check=False)
        assert gone_json.returncode == 125 and json.loads(gone_json.stdout)["error"]["reason"] == "SESSION_NOT_FOUND"
        slow = drums(drums_instance, "exec", sid, "--timeout", "1", "--", "sleep", "30", check=False)
        assert slow.returncode == 125 and "EXEC_TIMEOUT" in slow.stderr
        ran = json.loads(drums(drums_instance, "exec", sid, "--json", "--", "sh", "-c", "echo hi; exit 4",
                               check=False).stdout)
        assert ran == {"returncode": 4, "stdout": "hi\n", "stderr": ""}
    finally:
        client.destroy(sid)


def test_up_boots_an_osworld_desktop_and_prints_its_guest_url(client, drums_instance):
    import re
    import urllib.request

    out = drums(drums_instance, "up").stdout.strip()
    m = re.fullmatch(r"(\S+) (169\.254\.\d+\.\d+) (http://169\.254\.\d+\.\d+:5000) \(ready in [\d.]+s\)", out)
    assert m, out
    sid, address, url = m.groups()
    try:
        assert url == f"http://{address}:5000"
        with urllib.request.urlopen(f"{url}/platform", timeout=30) as r:
            assert r.status == 200 and r.read().decode().strip() == "Linux"
        assert client.get(sid)["spec"]["image"] == "osworld"
    finally:
        client.destroy(sid)
    bare = json.loads(drums(drums_instance, "up", "--bare", "--json").stdout)
    try:
        assert bare["spec"]["image"] == "default" and "guest_url" not in bare
    finally:
        client.destroy(bare["id"])


def test_sweep_reports_what_it_cleaned(client, drums_instance):
    doc = json.loads(drums(drums_instance, "sweep", "--json").stdout)
    assert doc["ledger_root"] == str(drums_instance.ledger_root) and doc["errors"] == 0
    assert [r["status"] for r in doc["runs"]] and all(r["status"] == "skipped-alive" for r in doc["runs"])
    text = drums(drums_instance, "sweep").stdout
    assert text.startswith(f"sweep of {drums_instance.ledger_root}: nothing to clean")
    dry = json.loads(drums(drums_instance, "--json", "sweep", "--dry-run").stdout)
    assert dry["dry_run"] is True


def test_shutdown_purge_leaves_nothing_of_the_instance(tmp_path):
    """A daemon of its own with a session, a snapshot in the store and one spilled to disk whose
    layer holds a symbolic link the session planted: --dry-run changes nothing, --purge leaves
    nothing under /run/drums, no mount, no process, link or table, and follows no link."""
    from drums_core.config import STATE_ROOT, Instance
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, require_root, stop_instance

    require_root()
    inst = Instance(name=f"clipurge-{os.getpid()}", slot_base=SPARE_SLOTS[10], slot_count=2)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep").write_text("precious")
    spill = tmp_path / "spill"

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(REPO), DRUMS_SPILL_DIR=str(spill))
        out = subprocess.run([sys.executable, "-m", "drums_core.cli", "--instance", inst.name,
                              "--slot-base", str(inst.slot_base), "--slot-count", str(inst.slot_count), *args],
                             capture_output=True, text=True, env=env, timeout=300, cwd="/")
        if check:
            assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out

    try:
        planter = json.loads(run("up", "--bare", "--json").stdout)["id"]
        run("exec", planter, "--", "ln", "-s", str(canary), "/root/escape")
        run("exec", planter, "--", "ln", "-s", str(canary / "keep"), "/root/escape-file")
        spilled = run("checkpoint", planter, "--name", "spilled").stdout.strip()  # the session goes
        run("spill", "spilled")
        sid = json.loads(run("up", "--bare", "--json").stdout)["id"]
        run("checkpoint", sid, "--name", "kept", "--leave-running")
        assert (spill / spilled).is_dir()
        planted = [os.path.join(d, n) for d, dirs, files in os.walk(spill / spilled) for n in dirs + files
                   if n in ("escape", "escape-file")]
        assert len(planted) == 2 and all(os.path.islink(p) for p in planted), planted  # what rmtree must not follow
        dry = run("shutdown", "--purge", "--dry-run").stdout
        assert "would" in dry and str(inst.state_dir) in dry and str(spill) in dry and sid in dry
        assert json.loads(run("ls", "--json").stdout)[0]["id"] == sid  # the dry run changed nothing
        out = run("shutdown", "--purge")
        plan_end = out.stdout.index("purged instance")
        assert f"remove {inst.state_dir} (its tmpfs unmounted)" in out.stdout[:plan_end]
        assert f"destroy 1 session(s): {sid}" in out.stdout[:plan_end]
        assert "delete 2 snapshot(s)" in out.stdout[:plan_end]
        assert sorted(p.name for p in STATE_ROOT.glob(f"{inst.name}*")) == []
        with open("/proc/self/mountinfo") as f:
            assert not [ln for ln in f if inst.name in ln]
        assert not spill.exists()
        assert (canary / "keep").read_text() == "precious"
        leaks = instance_leaks(inst)
        assert not any(v for k, v in leaks.items() if k != "probe_errors"), leaks
        again = run("shutdown", "--purge")  # nothing left: says so, exits 0
        assert "nothing of instance" in again.stdout
    finally:
        stop_instance(inst)
        assert (canary / "keep").exists()


def test_shutdown_destroy_and_a_purge_after_the_daemon_is_gone():
    """`shutdown --destroy` stops the daemon and its sessions and keeps the state; a plain `shutdown`
    leaves the sessions running, and a purge then sweeps them (no daemon to ask) and removes it all."""
    from drums_core.config import STATE_ROOT, Instance
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, require_root, stop_instance

    require_root()
    inst = Instance(name=f"clipurge2-{os.getpid()}", slot_base=SPARE_SLOTS[11], slot_count=1)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = instance_env(inst)
        out = subprocess.run([sys.executable, "-m", "drums_core.cli", *args], capture_output=True, text=True,
                             env=env, timeout=300, cwd="/")
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out

    try:
        run("up", "--bare")
        assert run("shutdown", "--destroy").stdout.strip() == "drumsd stopped, its sessions destroyed"
        leaks = instance_leaks(inst)
        assert not leaks["processes"] and not leaks["links"] and not leaks["nft"], leaks
        assert inst.state_dir.is_dir()  # --destroy keeps the state
        sid = json.loads(run("up", "--bare", "--json").stdout)["id"]
        run("shutdown")  # the session survives its daemon
        assert instance_leaks(inst)["processes"], "a plain shutdown keeps the sessions running"
        out = run("shutdown", "--purge").stdout
        assert "stop drumsd" not in out and "sweep 1 run(s) of a daemon no longer running" in out, out
        assert sorted(p.name for p in STATE_ROOT.glob(f"{inst.name}*")) == []
        leaks = instance_leaks(inst)
        assert not any(v for k, v in leaks.items() if k != "probe_errors"), (sid, leaks)
    finally:
        stop_instance(inst)
