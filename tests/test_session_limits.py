"""Per-session limits and who may talk to a session, tried from inside real sessions.

* memory: a session allocating past its limit is killed whole and marked broken with reason OOM,
  while a sibling keeps serving; its cgroup is gone after destroy;
* pids: a fork loop stops at the pids limit and the host stays responsive;
* a restored session's processes are born in its own cgroup;
* only host root reaches a session's address (nftables by socket uid);
* a snapshot restores only over the image version it was made on.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from drums_core.session import cgroups
from drums_core.errors import FailedPrecondition, InvalidArgument

from tests.support.wait import wait_until

BARE: dict = {}
MiB = 1 << 20


def _cgroup_dirs(name: str) -> list[str]:
    return [p for paths in cgroups.list_run_groups().values() for p in paths if p.endswith("/" + name)]


def test_memory_limit_kills_the_session_not_its_sibling(client):
    a = client.create({"limits": {"memory_max": 256 * MiB}})
    b = client.create(BARE)
    try:
        out = client.exec(a["id"], ["python3", "-c", "x = bytearray(600 << 20); print('survived', len(x))"])
        assert "survived" not in out["stdout"], out
        wait_until(lambda: client.get(a["id"])["state"] == "BROKEN", 10, "the session to be BROKEN", every=0.1)
        broken = client.get(a["id"])
        assert broken["state"] == "BROKEN" and broken["broken"].startswith("OOM"), broken
        assert client.exec(b["id"], ["echo", "still here"])["stdout"] == "still here\n"
        group = broken["cgroup"]
    finally:
        client.destroy(a["id"])
        client.destroy(b["id"])
    assert not _cgroup_dirs(group), f"cgroup {group} outlived its session"


def test_fork_loop_stops_at_the_pids_limit_and_the_host_stays_responsive(client):
    s = client.create({"limits": {"pids_max": 64}})
    try:
        # the children let go of the exec's pipes: the exec ends with the loop, not 30 s later
        code = ("import os, time\nn = 0\nwhile n < 5000:\n    try:\n        pid = os.fork()\n    except OSError:\n"
                "        break\n    if pid == 0:\n        os.closerange(0, 3)\n        time.sleep(30)\n"
                "        os._exit(0)\n    n += 1\nprint(n)\n")
        out = client.exec(s["id"], ["python3", "-c", code], timeout=60)
        forked = int(out["stdout"].strip())
        assert 0 < forked < 64, out
        t0 = time.monotonic()
        subprocess.run(["true"], check=True)
        assert time.monotonic() - t0 < 5
    finally:
        client.destroy(s["id"])


def test_restored_tasks_are_born_in_their_own_cgroup(client):
    s = client.create(BARE)
    snap = client.checkpoint(s["id"], name=f"limits-{os.getpid()}")
    try:
        [r] = client.restore(snap["id"])
        try:
            procs = {p["pid"] for p in client.processes(r["id"])}
            [path] = [p for p in _cgroup_dirs(r["cgroup"]) if "/pids/" in p]
            with open(os.path.join(path, "cgroup.procs")) as f:
                members = {int(x) for x in f.read().split()}
            assert procs and procs <= members, (procs, members)
        finally:
            client.destroy(r["id"])
    finally:
        client.delete_snapshot(snap["id"])


def test_only_host_root_reaches_a_session(client):
    s = client.create({"programs": [{"name": "srv", "argv": ["python3", "-m", "http.server", "5000"]}],
                       "wait_port": 5000})
    try:
        code = (f"import socket; socket.create_connection(('{s['address']}', 5000), timeout=5).close(); "
                "print('connected')")
        root = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=30)
        assert root.stdout.strip() == "connected", root.stderr
        nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", code], capture_output=True, text=True, timeout=30)
        assert nobody.returncode != 0 and "Connection refused" in nobody.stderr, (nobody.stdout, nobody.stderr)
    finally:
        client.destroy(s["id"])


def test_snapshot_restores_only_over_its_image_version(client, drums_instance):
    s = client.create(BARE)
    snap = client.checkpoint(s["id"], name=f"imgver-{os.getpid()}")
    manifest = drums_instance.snapshots_dir / snap["id"] / "manifest.json"
    original = manifest.read_text()
    try:
        for tampered, reason in (("0" * 64, "IMAGE_MISMATCH"), (None, "SNAPSHOT_PREDATES_IMAGES")):
            data = json.loads(original)
            data["image_hash"] = tampered
            manifest.write_text(json.dumps(data))
            before = client.list()
            with pytest.raises(FailedPrecondition) as err:
                client.restore(snap["id"])
            assert err.value.reason == reason, err.value
            assert "re-create" in err.value.message or "build" in err.value.message
            assert client.list() == before
    finally:
        manifest.write_text(original)
        client.delete_snapshot(snap["id"])


@pytest.mark.parametrize("bad", [{"limits": {"memory_max": 1}}, {"limits": {"nope": 1}},
                                 {"limits": {"pids_max": "many"}}, {"tmp_size": "1g,uid=0"}, {"shm_size": "-1"}])
def test_bad_limits_are_refused_and_change_nothing(client, bad):
    before = client.list()
    with pytest.raises(InvalidArgument):
        client.create(bad)
    assert client.list() == before


def test_writing_past_the_writable_layer_gets_enospc_and_a_sibling_still_checkpoints(client, drums_instance):
    a = client.create({"writable_size": "64m", "tmp_size": "16m"})
    b = client.create(BARE)
    snap = None
    try:
        before = os.statvfs(drums_instance.state_dir)
        fill = ("import errno, sys\ntry:\n    with open(sys.argv[1], 'wb') as f:\n        for _ in range(200):\n"
                "            f.write(b'x' * (1 << 20))\n            f.flush()\n    print('wrote it all')\n"
                "except OSError as e:\n    print(errno.errorcode[e.errno])\n")
        for path in ("/home/user/big", "/var/tmp/big", "/tmp/big"):
            out = client.exec(a["id"], ["python3", "-c", fill, path], user="user" if path.startswith("/home") else None)
            assert out["stdout"].strip() == "ENOSPC", (path, out)
        after = os.statvfs(drums_instance.state_dir)
        grew = (before.f_bfree - after.f_bfree) * after.f_frsize
        assert grew < 16 * MiB, f"the instance's store lost {grew >> 20} MiB to a session's writes"
        snap = client.checkpoint(b["id"], name=f"sibling-{os.getpid()}")
        assert snap["id"]
    finally:
        client.destroy(a["id"])
        if snap is not None:
            client.delete_snapshot(snap["id"])
        else:
            client.destroy(b["id"])
