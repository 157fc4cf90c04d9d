"""The session engine end to end: real namespaces, overlay roots, CRIU, X, LibreOffice Writer.

Each test states the acceptance item of the engine issue it shows.
"""
from __future__ import annotations

import threading
import time

import pytest

from drums_core.errors import Internal, NotFound
from drums_core.session.model import SETTLED_AGE

from tests.support.wait import wait_until

WRITER = {"programs": [{"name": "writer", "argv": ["libreoffice", "--writer", "--norestore", "--nologo"]}],
          "expect_window": "LibreOffice Writer", "ready_timeout": 120}

# A long-lived process that seeded its RNG before the checkpoint: each time ~/go appears it appends
# its next draw to ~/draws. Siblings must draw the same number (task state kept).
DRAWER = ("import os, random, time\n"
          "random.seed(1234); [random.random() for _ in range(5)]\n"
          "while True:\n"
          "    if os.path.exists('/home/user/go'):\n"
          "        os.remove('/home/user/go')\n"
          "        open('/home/user/draws', 'a').write(repr(random.random()) + '\\n')\n"
          "    time.sleep(0.05)\n")


def sh(client, sid, script, user="user", timeout=60):
    res = client.exec(sid, ["bash", "-c", script], user=user, timeout=timeout)
    assert res["returncode"] == 0, f"{script!r} failed in {sid}: {res}"
    return res["stdout"]


@pytest.fixture(scope="module")
def writer_snapshot(drums_instance):
    """A cold Writer desktop with the seeded drawer running, checkpointed (the session is consumed)."""
    from drums_core.client import Client

    from tests.support.suite import SUITE_DAEMON_ENV

    c = Client(drums_instance, daemon_env=SUITE_DAEMON_ENV)
    s = c.create(WRITER)
    try:
        c.exec(s["id"], ["bash", "-c", f"cat > /home/user/drawer.py <<'EOF'\n{DRAWER}EOF"], user="user")
        # the drawer must be a settled process (SETTLED_AGE old) for the liveness check to require it
        sh(c, s["id"], "setsid -f python /home/user/drawer.py >/dev/null 2>&1 < /dev/null; "
           f"sleep {SETTLED_AGE + 0.5}; pgrep -f drawer.py")
        sh(c, s["id"], "mkdir -p /home/user/lowerdir/sub && echo x > /home/user/lowerdir/sub/f")
        snap = c.checkpoint(s["id"], name="writer-base")
    except BaseException:
        c.destroy(s["id"])
        raise
    yield snap
    try:
        c.delete_snapshot(snap["id"])
    except Exception:  # noqa: BLE001 - the store goes with the state tmpfs at the end anyway
        pass


def test_two_writer_siblings_have_separate_clipboards(client, writer_snapshot):
    a, b = client.restore(writer_snapshot["id"], count=2)
    try:
        for s in (a, b):
            titles = [w["title"] for w in client.windows(s["id"]) if w["mapped"]]
            assert any("LibreOffice Writer" in t for t in titles), titles
        for me, other, token in ((a, b, "TOKEN_A_5813"), (b, a, "TOKEN_B_9274")):
            sh(client, me["id"], "xdotool search --name 'LibreOffice Writer' windowactivate --sync; "
               f"xdotool type --delay 20 '{token}'; sleep 0.3; xdotool key ctrl+a; sleep 0.2; xdotool key ctrl+c; "
               "sleep 0.5")
            mine = sh(client, me["id"], "xclip -o -selection clipboard 2>/dev/null || true")
            theirs = client.exec(other["id"], ["bash", "-c", "xclip -o -selection clipboard 2>/dev/null || true"],
                                 user="user")["stdout"]
            assert token in mine, f"{token} not in {me['id']}'s clipboard: {mine!r}"
            assert token not in theirs, f"{token} leaked into {other['id']}'s clipboard"
    finally:
        client.destroy(a["id"])
        client.destroy(b["id"])


def test_sharing_audit_siblings_and_cold_pairs(client, writer_snapshot):
    a, b = client.restore(writer_snapshot["id"], count=2)
    try:
        res = client.audit(a["id"], b["id"])
        assert res["unexpected"] == [], res["unexpected"]
        assert all(s["target"].startswith("/dev/") for s in res["shared"]), res["shared"]
        assert res["objects"]["a"] > 50
    finally:
        client.destroy(a["id"])
        client.destroy(b["id"])
    c1, c2 = client.create({}), client.create({})
    try:
        res = client.audit(c1["id"], c2["id"])
        assert res["unexpected"] == [], res["unexpected"]
    finally:
        client.destroy(c1["id"])
        client.destroy(c2["id"])


def test_siblings_differ_in_identity_but_keep_task_state(client, writer_snapshot):
    a, b = client.restore(writer_snapshot["id"], count=2)
    try:
        ids = {}
        for s in (a, b):
            out = sh(client, s["id"], "hostname; cat /etc/machine-id; ip -4 -o addr show eth0 | awk '{print $4}'; "
                     "getent hosts $(hostname) | awk '{print $1}'")
            ids[s["id"]] = out.split()
        va, vb = ids[a["id"]], ids[b["id"]]
        assert va[0] != vb[0] and va[1] != vb[1] and va[2] != vb[2], (va, vb)
        assert va[0] == f"drums-{a['id']}" and va[2].split("/")[0] == a["address"]
        draws = []
        for s in (a, b):
            sh(client, s["id"], "touch /home/user/go; for i in $(seq 100); do [ -s /home/user/draws ] && break; "
               "sleep 0.05; done")
            draws.append(sh(client, s["id"], "cat /home/user/draws").strip())
        assert draws[0] and draws[0] == draws[1], draws
    finally:
        client.destroy(a["id"])
        client.destroy(b["id"])


def test_rename_lower_dir_and_fast_sudo(client, writer_snapshot):
    (s,) = client.restore(writer_snapshot["id"])
    try:
        sh(client, s["id"], "mv /home/user/lowerdir /home/user/renamed && cat /home/user/renamed/sub/f")
        t0 = time.monotonic()
        out = client.exec(s["id"], ["bash", "-c", "echo password | sudo -S true && echo ok"], user="user")
        took = time.monotonic() - t0
        assert out["returncode"] == 0 and "ok" in out["stdout"], out
        assert took < 1.0, f"sudo took {took:.2f}s (hostname resolution?)"
    finally:
        client.destroy(s["id"])


def test_a_young_process_that_ends_after_restore_is_not_a_death(client):
    """A process younger than SETTLED_AGE at the checkpoint (a Chromium start-up helper, here a
    sleep) may end by itself after a restore: the sibling passes its liveness check."""
    s = client.create(WRITER)
    try:
        # setsid -f returns before its child has become sleep: wait for it to have
        sh(client, s["id"], "setsid -f sleep 2 >/dev/null 2>&1 < /dev/null; "
                            "for i in $(seq 100); do pgrep -x sleep && exit 0; sleep 0.02; done; exit 1")
        snap = client.checkpoint(s["id"], leave_running=False)
    except BaseException:
        client.destroy(s["id"])
        raise
    try:
        (sib,) = client.restore(snap["id"], wait_live=True)
        try:
            assert client.get(sib["id"])["liveness"] == "ok"
            assert sh(client, sib["id"], "pgrep -x sleep || echo gone").strip() == "gone"
        finally:
            client.destroy(sib["id"])
    finally:
        client.delete_snapshot(snap["id"])


def test_liveness_kill_marks_broken_and_wait_live_rolls_back(client, writer_snapshot, drums_instance):
    from tests.support.leaks import host_leaks

    (s,) = client.restore(writer_snapshot["id"])
    try:
        client.exec(s["id"], ["bash", "-c", "pkill -9 -f drawer.py"], user="root")
        wait_until(lambda: client.get(s["id"])["state"] == "BROKEN", 15, "the session to be BROKEN", every=0.2)
        info = client.get(s["id"])
        assert "python" in info["broken"], info["broken"]
        with pytest.raises(Internal) as exc:
            client.exec(s["id"], ["true"])
        assert exc.value.reason == "SESSION_BROKEN" and "python" in str(exc.value)
    finally:
        client.destroy(s["id"])
    mine = str(drums_instance.state_dir) + "/"
    mounts_before = len([m for m in host_leaks()["mounts"] if m.startswith(mine)])
    killer_stop = threading.Event()

    def killer():
        # Kill the drawer of whatever restored session appears, inside the liveness window.
        while not killer_stop.is_set():
            for sess in client.list():
                try:
                    client.exec(sess["id"], ["bash", "-c", "pkill -9 -f drawer.py || true"])
                except Exception:  # noqa: BLE001 - the session may be torn down under us
                    pass
            time.sleep(0.1)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        with pytest.raises(Internal) as exc:
            client.restore(writer_snapshot["id"], wait_live=True)
        assert exc.value.reason == "LIVENESS_FAILED" and "python" in str(exc.value)
    finally:
        killer_stop.set()
        t.join()
    assert client.list() == []
    leaks = host_leaks()
    assert len([m for m in leaks["mounts"] if m.startswith(mine)]) == mounts_before, leaks


RLIMIT_PROC = ("import resource, threading, time\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
               "def spin():\n"
               "    while True: time.sleep(0.1)\n"
               "for _ in range(2): threading.Thread(target=spin, daemon=True).start()\n"
               "while True: time.sleep(0.1)\n")


def test_rlimit_fsize_zero_threads_survive_ten_restores(client):
    s = client.create({})
    try:
        client.exec(s["id"], ["bash", "-c", f"cat > /root/rl.py <<'EOF'\n{RLIMIT_PROC}EOF"])
        client.exec(s["id"], ["bash", "-c", "setsid -f python /root/rl.py >/dev/null 2>&1 </dev/null; sleep 0.3"])
        procs = [p for p in client.processes(s["id"]) if p["comm"] == "python"]
        assert procs, "rlimit process did not start"
        snap = client.checkpoint(s["id"])
    except BaseException:
        client.destroy(s["id"])
        raise
    ok = 0
    for _ in range(10):
        (r,) = client.restore(snap["id"], wait_live=True)
        try:
            count = "ls /proc/$(pgrep -f '^python /root/rl.py')/task | wc -l"
            threads = client.exec(r["id"], ["bash", "-c", count])["stdout"]
            assert threads.strip() == "3", threads
        finally:
            client.destroy(r["id"])
        ok += 1
    assert ok == 10
    client.delete_snapshot(snap["id"])


def test_25_chained_cycles_return_mounts_and_links(client, drums_instance):
    from tests.support.leaks import host_leaks, instance_links

    base = host_leaks()
    s = client.create({"programs": [{"name": "xterm",
                                     "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "chain"]}],
                       "expect_window": "chain"})
    snap = client.checkpoint(s["id"])
    made = [snap["id"]]
    for i in range(25):
        (r,) = client.restore(snap["id"])
        client.exec(r["id"], ["bash", "-c", f"echo {i} >> /home/user/chain"], user="user")
        nxt = client.checkpoint(r["id"])
        made.append(nxt["id"])
        (r2,) = client.restore(nxt["id"])
        out = client.exec(r2["id"], ["bash", "-c", "wc -l < /home/user/chain"], user="user")["stdout"].strip()
        assert out == str(i + 1), out
        client.destroy(r2["id"])
        snap = nxt
    assert len(snap["layers"]) == 26
    after = host_leaks()
    mine = str(drums_instance.state_dir)
    assert [m for m in after["mounts"] if m.startswith(mine)] == [m for m in base["mounts"] if m.startswith(mine)]
    assert instance_links(drums_instance) == []
    for sid in reversed(made):
        client.delete_snapshot(sid)


def test_sixteen_concurrent_restores(client, writer_snapshot, drums_instance):
    from tests.support.leaks import host_leaks

    sibs = client.restore(writer_snapshot["id"], count=16)
    try:
        assert len(sibs) == 16 and len({s["address"] for s in sibs}) == 16
        for s in sibs:
            client.wait_live(s["id"], timeout=60)
            assert client.get(s["id"])["liveness"] == "ok"
    finally:
        for s in sibs:
            client.destroy(s["id"])
    from tests.support.leaks import instance_links

    assert not instance_links(drums_instance)
    leaks = host_leaks()
    base = drums_instance.slot_base + 100
    mine = [x for x in leaks["x11links"]  # other tests' displays (names not X<number>) are not ours
            if x[1:].isdigit() and base <= int(x[1:]) < base + drums_instance.slot_count]
    assert not mine, leaks


def test_bad_input_changes_nothing(client):
    from drums_core.errors import InvalidArgument

    with pytest.raises(NotFound):
        client.restore("0" * 32)
    for bad in ("../x", "a/b", "..", ""):
        with pytest.raises((InvalidArgument, NotFound)):
            client.restore(bad)
    with pytest.raises(NotFound):
        client.destroy("nosuchsession")
    with pytest.raises(InvalidArgument):
        client.create({"screen": [1, 1]})
    with pytest.raises(InvalidArgument):
        client.create({"image": "../etc"})
    assert client.list() == []
