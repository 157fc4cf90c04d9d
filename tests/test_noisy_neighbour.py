"""A hostile desktop user (uid 1000, no sudo) against the kernel's shared budgets, from a fresh
session and from a restored sibling: the victims (another session, host root, CRIU's restores)
keep working while the attacker holds all it can get.

* inotify instances and watches: the attacker stops at its session's cap (its own user namespace's
  ``max_inotify_*``), host root's ``inotify_init1`` succeeds, another session restores and its user
  makes inotify instances of its own;
* user namespaces: the attacker stops at its cap, another session's restore (which makes one) works;
* pids: a fork loop stops at the session's pids limit, and another session restores meanwhile;
* the caps are in force in fresh and restored sessions alike, and cannot be raised from inside.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time

import pytest

from drums_core.errors import Unavailable
from drums_core.host import kernel_budget
from drums_core.session import kernel_caps

from tests.support.wait import wait_until

BARE: dict = {}

# Runs in the session as the desktop user: takes every inotify instance (each with a watch) it can,
# says how many and why it stopped in ~/hog.out, then holds them until killed.
HOG = r"""
import ctypes, os, sys, time
kind = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
held, err = [], ""
if kind == "inotify":
    while len(held) < 100000:
        fd = libc.inotify_init1(0)
        if fd < 0:
            err = os.strerror(ctypes.get_errno()); break
        held.append(fd)
        libc.inotify_add_watch(fd, b"/tmp", 0x100)
elif kind == "userns":
    CLONE_NEWUSER = 0x10000000
    while len(held) < 100000:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # says whether its unshare worked, then holds its namespace
            os.close(r)
            os.write(w, b"1" if libc.unshare(CLONE_NEWUSER) == 0 else b"0")
            time.sleep(600)
            os._exit(0)
        os.close(w)
        answer = os.read(r, 1)
        os.close(r)
        if answer != b"1":
            os.kill(pid, 9); os.waitpid(pid, 0)
            err = "unshare refused"; break
        held.append(pid)
elif kind == "mqueue":
    class Attr(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                    ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Attr)]
    while len(held) < 100000:
        a = Attr(0, 1, 64, 0)
        fd = rt.mq_open(f"/hog{os.getpid()}-{len(held)}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
        if fd < 0:
            err = os.strerror(ctypes.get_errno()); break
        held.append(fd)
elif kind == "sigpending":
    import signal
    sig = signal.SIGRTMIN + 1
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    n = 0
    while n < 1000000:  # a blocked real-time signal queues one more each time
        if libc.sigqueue(os.getpid(), sig, None) != 0:
            err = os.strerror(ctypes.get_errno()); break
        n += 1
    held = [0] * n
    for _ in range(120000):  # kill() queues past the limit (the kernel lets SI_USER signals through)
        os.kill(os.getpid(), sig)
open(os.path.expanduser("~/hog.out.tmp"), "w").write(f"{len(held)} {err}\n")
os.rename(os.path.expanduser("~/hog.out.tmp"), os.path.expanduser("~/hog.out"))
time.sleep(600)
"""


def _start_hog(client, sid: str, kind: str) -> tuple[int, str]:
    client.exec(sid, ["sh", "-c", "rm -f ~/hog.out; cat > ~/hog.py"], user="user", input=HOG)
    client.exec(sid, ["sh", "-c", f"setsid python3 ~/hog.py {kind} </dev/null >/dev/null 2>&1 &"], user="user")
    out: dict = {}

    def done() -> bool:
        r = client.exec(sid, ["cat", "/home/user/hog.out"], user="user")
        out["text"] = r["stdout"]
        return r["returncode"] == 0 and bool(r["stdout"].strip())

    wait_until(done, 60, f"the {kind} hog to take all it can")
    count, _, why = out["text"].strip().partition(" ")
    return int(count), why


def _host_root_inotify_works() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        return False
    os.close(fd)
    return True


# Runs as a victim (host root here, the desktop user of another session): a small message queue and
# ten queued real-time signals; prints "ok" or what was refused.
VICTIM_QUEUES = r"""
import ctypes, os, signal
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Attr)]
name = f"/victim{os.getpid()}".encode()
fd = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 1, 64, 0)))
if fd < 0:
    print("mq_open refused:", os.strerror(ctypes.get_errno())); raise SystemExit
rt.mq_unlink(name); os.close(fd)
sig = signal.SIGRTMIN + 2
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
libc = ctypes.CDLL(None, use_errno=True)
libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
for _ in range(10):
    if libc.sigqueue(os.getpid(), sig, None) != 0:
        print("signal refused:", os.strerror(ctypes.get_errno())); raise SystemExit
for _ in range(10):
    signal.sigtimedwait([sig], 1)
print("ok")
"""


def _victim_user_inotify(client, sid: str) -> str:
    code = ("import ctypes; l = ctypes.CDLL(None, use_errno=True)\n"
            "fds = [l.inotify_init1(0) for _ in range(4)]\nprint('ok' if min(fds) >= 0 else 'refused')\n")
    return client.exec(sid, ["python3", "-c", code], user="user")["stdout"].strip()


@contextlib.contextmanager
def _session(client, origin: str, spec: dict | None = None):
    """A session made as ``origin`` says: ``fresh`` (created) or ``restored`` (a sibling restored from
    a checkpoint of a fresh one); destroyed, with its snapshot, however the test ends."""
    s = client.create(spec or BARE)
    snap = None
    try:
        if origin == "restored":
            snap = client.checkpoint(s["id"], name=f"attacker-{os.getpid()}")  # the fresh one ends with its dump
            [s] = client.restore(snap["id"])
        yield s
    finally:
        try:
            client.destroy(s["id"])
        finally:
            if snap is not None:
                client.delete_snapshot(snap["id"])


@contextlib.contextmanager
def _victim(client, snapshot: dict):
    """Another session, restored from ``snapshot`` while the attacker holds what it took."""
    [v] = client.restore(snapshot["id"])
    try:
        yield v
    finally:
        client.destroy(v["id"])


@pytest.fixture
def victim_snapshot(client):
    v = client.create(BARE)
    snap = client.checkpoint(v["id"], name=f"victim-{os.getpid()}")  # the session ends with its dump
    yield snap
    client.delete_snapshot(snap["id"])


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_inotify_hog_stops_at_its_share_and_the_host_and_others_go_on(client, victim_snapshot, origin):
    with _session(client, origin) as attacker:
        caps = kernel_caps.read(attacker["init_pid"])
        assert caps["max_inotify_instances"] == kernel_budget.SESSION_CAPS["max_inotify_instances"], caps
        held, why = _start_hog(client, attacker["id"], "inotify")
        cap = kernel_budget.SESSION_CAPS["max_inotify_instances"]
        print(f"\n{origin} attacker held {held} inotify instances ({why}); cap {cap} per uid; "
              f"host limit {kernel_budget.read_sysctl('fs/inotify/max_user_instances')}")
        assert 0 < held <= cap and why == "Too many open files", (held, why)
        # the victims: host root, a restore (CRIU's own inotify), the restored desktop user
        assert _host_root_inotify_works()
        with _victim(client, victim_snapshot) as victim:
            assert _victim_user_inotify(client, victim["id"]) == "ok"
        # the cap cannot be raised from inside, not even by session root
        r = client.exec(attacker["id"], ["sh", "-c", "echo 100000 > /proc/sys/user/max_inotify_instances"])
        assert r["returncode"] != 0, r
        assert kernel_caps.read(attacker["init_pid"])["max_inotify_instances"] == cap


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_user_namespace_hog_stops_at_its_share_and_restores_go_on(client, victim_snapshot, origin):
    with _session(client, origin) as attacker:
        held, why = _start_hog(client, attacker["id"], "userns")
        cap = kernel_budget.SESSION_CAPS["max_user_namespaces"]
        print(f"\n{origin} attacker held {held} user namespaces ({why}); cap {cap} per uid")
        assert 0 < held <= cap and why == "unshare refused", (held, why)
        with _victim(client, victim_snapshot):
            pass  # restored (CRIU made its namespaces and inotify) while the attacker holds its all


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_pid_hog_stops_at_its_limit_and_restores_go_on(client, victim_snapshot, origin):
    with _session(client, origin, {"limits": {"pids_max": 256}}) as attacker:
        code = ("import os, time\nn = 0\nwhile n < 100000:\n    try:\n        pid = os.fork()\n    except OSError:\n"
                "        break\n    if pid == 0:\n        os.closerange(0, 3)\n        time.sleep(120)\n"
                "        os._exit(0)\n    n += 1\nprint(n)\n")
        t0 = time.monotonic()
        out = client.exec(attacker["id"], ["python3", "-c", code], user="user", timeout=60)
        forked = int(out["stdout"].strip())
        print(f"\n{origin} attacker forked {forked} processes in {time.monotonic() - t0:.1f}s")
        assert 0 < forked < 256, out
        with _victim(client, victim_snapshot):
            pass  # restored (CRIU made its namespaces and inotify) while the attacker holds its all


@pytest.mark.parametrize("kind", ["mqueue", "sigpending"])
@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_queue_hogs_stop_at_their_share_and_the_host_and_others_go_on(client, victim_snapshot, origin, kind):
    with _session(client, origin) as attacker:
        held, why = _start_hog(client, attacker["id"], kind)
        print(f"\n{origin} attacker held {held} ({kind}: {why}); session rlimits {kernel_budget.session_rlimits()}")
        assert held > 0 and why, (held, why)
        host = subprocess.run([sys.executable, "-c", VICTIM_QUEUES], capture_output=True, text=True, timeout=60)
        assert host.stdout.strip() == "ok", host
        with _victim(client, victim_snapshot) as victim:
            r = client.exec(victim["id"], ["python3", "-c", VICTIM_QUEUES], user="user")
            assert r["stdout"].strip() == "ok", r


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_session_root_switching_among_uids_cannot_starve_the_host(client, victim_snapshot, origin):
    """Session root (the agent has sudo) takes every uid's cap in turn: the total is bounded by the
    memory its cgroup can pay, and host root and other sessions go on."""
    with _session(client, origin) as attacker:
        code = ("import os, sys, time\nfor uid in range(2000, 2040):\n    if os.fork() == 0:\n"
                "        os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
                "        os.environ['HOME'] = f'/tmp/h{uid}'; os.makedirs(os.environ['HOME'], exist_ok=True)\n"
                "        os.execv(sys.executable, [sys.executable, '/tmp/hog.py', 'inotify'])\n")
        client.exec(attacker["id"], ["sh", "-c", "cat > /tmp/hog.py"], input=HOG)
        client.exec(attacker["id"], ["sh", "-c", f"setsid python3 -c \"{code}\" </dev/null >/dev/null 2>&1 &"])
        total = {}

        def all_held() -> bool:
            r = client.exec(attacker["id"], ["sh", "-c", "cat /tmp/h*/hog.out 2>/dev/null"])
            lines = r["stdout"].split()
            total["n"] = sum(int(x) for x in lines if x.isdigit())
            return r["stdout"].count("\n") >= 40

        wait_until(all_held, 120, "40 uids to take their inotify caps")
        print(f"\n{origin} session root held {total['n']} inotify instances over 40 uids "
              f"(host limit {kernel_budget.read_sysctl('fs/inotify/max_user_instances')})")
        assert total["n"] > 128  # more than the host's old default for all of host root
        assert _host_root_inotify_works()
        with _victim(client, victim_snapshot) as victim:
            assert _victim_user_inotify(client, victim["id"]) == "ok"


def test_the_host_limits_fit_every_slot_and_the_daemon_refuses_what_cannot_fit(tmp_path):
    for b in kernel_budget.budgets(with_use=False):
        assert b.fits, f"{b.sysctl} = {b.limit} < {b.need}: scripts/provision should have raised it"
    too_many = (kernel_budget.read_sysctl("kernel/pid_max") // kernel_budget.SESSION_PIDS) + 1
    with pytest.raises(Unavailable) as e:
        kernel_budget.check_fits(too_many, kernel_budget.SESSION_PIDS)
    assert e.value.reason == "PID_BUDGET" and "kernel.pid_max" in e.value.message, e.value
    # a daemon asked for more slots than the host holds refuses to start, and says why
    name = f"budget-{os.getpid()}"
    env = {**os.environ, "DRUMS_STATE_ROOT": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "drums_core.daemon", "--instance", name, "--slot-base", "20000",
                        "--slot-count", str(too_many)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 4 and "PID_BUDGET" in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / name).exists(), "a refused daemon made its state directory"


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_what_a_session_can_mount_is_what_the_readme_says(client, origin):
    """README (Containment): in a user namespace of its own a session may mount a tmpfs (it lives in
    that namespace's own mount namespace, charged to the session's memory), never proc or sysfs."""
    with _session(client, origin) as s:
        script = ("mkdir -p /tmp/m; "
                  "mount -t tmpfs none /tmp/m && echo tmpfs:yes || echo tmpfs:no; "
                  "mount -t proc proc /tmp/m 2>/dev/null && echo proc:yes || echo proc:no; "
                  "mount -t sysfs sysfs /tmp/m 2>/dev/null && echo sysfs:yes || echo sysfs:no")
        nested = client.exec(s["id"], ["unshare", "-Urm", "sh", "-c", script], user="user")["stdout"].split()
        assert nested == ["tmpfs:yes", "proc:no", "sysfs:no"], nested
        direct = client.exec(s["id"], ["sh", "-c", script])["stdout"].split()  # session root, no new namespace
        assert direct == ["tmpfs:no", "proc:no", "sysfs:no"], direct


# Runs in the session as the desktop user: watches two directories of its overlay root, then holds.
WATCHER = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
for d in ("/home/user/watched/a", "/etc/dbus-1"):
    os.makedirs(d, exist_ok=True) if d.startswith("/home") else None
    assert libc.inotify_add_watch(fd, d.encode(), 0x100 | 0x200) > 0
open("/home/user/watching", "w").write(str(fd))
time.sleep(600)
"""


def _watch_lines(init_pid: int) -> list[str]:
    from drums_core.session.processes import session_processes

    lines = []
    for p in session_processes(init_pid):
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            try:
                if os.readlink(f"/proc/{p.pid}/fd/{fd}") == "anon_inode:inotify":
                    lines += [x for x in open(f"/proc/{p.pid}/fdinfo/{fd}").read().splitlines() if "inotify wd" in x]
            except OSError:
                continue
    return lines


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_a_dump_after_the_kernel_dropped_the_watched_directories_succeeds(client, origin):
    """A host full of desktops reclaims dentries: a watch then shows no file handle and CRIU failed
    every dump of that desktop (the density benchmark met it at 29 desktops). Dropping the dentry
    cache makes the same state here; the checkpoint looks the directories up again and succeeds."""
    with _session(client, origin) as s:
        client.exec(s["id"], ["sh", "-c", "cat > ~/watcher.py"], user="user", input=WATCHER)
        client.exec(s["id"], ["sh", "-c", "setsid python3 ~/watcher.py </dev/null >/dev/null 2>&1 &"], user="user")
        wait_until(lambda: client.exec(s["id"], ["test", "-e", "/home/user/watching"])["returncode"] == 0, 30,
                   "the watcher to watch")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        lines = _watch_lines(s["init_pid"])
        print(f"\n{origin}: after the drop: {lines}")
        assert any("fhandle-bytes" not in x for x in lines), f"the kernel kept every watch's handle: {lines}"
        snap = client.checkpoint(s["id"], name=f"watched-{os.getpid()}", leave_running=True)
        try:
            [r] = client.restore(snap["id"])
            client.destroy(r["id"])
        finally:
            client.delete_snapshot(snap["id"])


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_a_session_goes_first_to_the_oom_killer_and_cannot_step_back(client, origin):
    """A host out of memory kills a desktop's process before the daemon: every session process
    carries OOM_SCORE_ADJ, fresh and restored (and what ``drums exec`` starts); neither the desktop
    user nor session root (sudo) can take its score below 0, and the daemon runs below that."""
    from drums_core.session.containment import DAEMON_OOM_SCORE_ADJ, OOM_SCORE_ADJ
    from drums_core.session.processes import session_processes

    def score(pid: int) -> int:
        return int(open(f"/proc/{pid}/oom_score_adj").read())

    daemon = client.ping()["pid"]
    cap_sys_resource = bool(int(next(line.split()[1] for line in open(f"/proc/{daemon}/status")
                                     if line.startswith("CapEff:")), 16) & (1 << 24))
    # where root lacks CAP_SYS_RESOURCE (this kind of VM) nothing goes below 0, the daemon included
    assert score(daemon) == (DAEMON_OOM_SCORE_ADJ if cap_sys_resource else 0) <= 0
    with _session(client, origin) as s:
        client.exec(s["id"], ["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"], user="user")
        scores = {p.pid: score(p.pid) for p in session_processes(s["init_pid"])}
        assert len(scores) >= 2 and set(scores.values()) == {OOM_SCORE_ADJ}, scores
        lower = ("echo -1 > /proc/self/oom_score_adj && echo below-zero || echo refused; "
                 "echo 0 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj")
        for user in ("user", "root"):
            out = client.exec(s["id"], ["sh", "-c", lower], user=user)["stdout"].split()
            assert out == ["refused", "0"], (user, out)  # 0 at the least: still above the daemon


def test_a_restored_session_runs_at_its_own_cpu_weight_once_ready(client, victim_snapshot):
    """A restore runs at a boosted CPU weight (restoring.RESTORE_BOOST) until the desktop is ready,
    then the session has its own weight, like any other: the boost is no lasting advantage."""
    from drums_core.session import cgroups

    with _victim(client, victim_snapshot) as v:
        group = client.get(v["id"])["cgroup"]
        dirs = [p for paths in cgroups.list_run_groups().values() for p in paths if p.endswith("/" + group)]
        cpu = [d for d in dirs if os.path.exists(os.path.join(d, "cpu.shares"))
               or os.path.exists(os.path.join(d, "cpu.weight"))]
        assert cpu, f"no cpu group among {dirs}"
        name = "cpu.shares" if os.path.exists(os.path.join(cpu[0], "cpu.shares")) else "cpu.weight"
        with open(os.path.join(cpu[0], name)) as f:
            assert int(f.read()) == (1024 if name == "cpu.shares" else 100)
