"""Break-out attempts from inside a real session, as a hostile agent would make them (DESIGN.md, "Containment").

Every check runs inside a session, as session root (``exec`` with no user) and as ``user`` through
``sudo -S`` (password on stdin), on a FRESH session and on a RESTORED one (a bare session
checkpointed, then restored): both are shared by the tests of this module (module-scoped fixtures)
so the file stays fast. What could change the host is read from the host before and after and must
be unchanged; the probes are Python programs run with the image's ``/usr/bin/python3`` using ctypes
for mount, umount2 and raw syscalls (x86_64 numbers), so nothing depends on util-linux's ``mount``.

1. kernel knobs: writes to ``/proc/sys/kernel/{printk_ratelimit,core_pattern,panic}`` and
   ``/proc/sysrq-trigger`` fail; the host's values are unchanged;
2. mounts: no new proc (over ``/proc`` or anywhere, also from a nested user namespace), no sysfs,
   ``/proc/sys`` cannot be unmounted or remounted writable; a tmpfs on ``/mnt`` still works;
3. syscalls: mknod of a block device, module loading, clock setting, kexec, bpf, perf events and
   ``open_by_handle_at`` fail, keyctl/add_key fail with the filter's ``EPERM``; the host's clock is unchanged;
4. every session process (read from the host), and a process started by ``exec``, has a seccomp
   filter, a bounding set without the dropped capabilities and only unprivileged host ids;
5. ``/proc/keys`` is empty, ``/proc/timer_list`` and ``/proc/kcore`` return nothing;
6. files made by session root and by ``user`` belong on the host to ``ID_BASE`` and ``ID_BASE+1000``;
7. host files are nowhere in the session, not through any process's root, cwd or open files, and
   not after unmounting everything that can be unmounted (throwaway sessions: that is destructive);
8. the reseed after a restore does not follow symlinks the session planted on ``/etc/hosts``,
   ``/etc/hostname``, ``/etc/machine-id`` or ``/etc`` to host decoys;
9. the daemon does not follow a symlink the session planted on its X socket to a host socket
   (and Drums makes no ``/tmp/.X11-unix/X<display>`` link on the host that a host X client could follow);
10. ``sudo`` still works for ``user``.

Probes that would change a shared session's mounts (an unmount of ``/proc/sys``, a proc over
``/proc``) run in a private copy of the session's mount namespace made with ``unshare(CLONE_NEWNS)``
in the session's own user namespace: the kernel copies each mount's lock with it, so the result is
the one the session's own namespace would give, and a hole found does not spoil the other tests.
Everything a test makes (sessions, snapshots, host markers, decoys, sockets) is removed also when it fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from drums_core.config import ID_BASE, SESSION_PASSWORD, SESSION_UID, STATE_ROOT
from drums_core.errors import DrumsError
from drums_core.session.processes import session_processes

pytestmark = pytest.mark.timeout(180)

SPEC = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "cwin"]}],
        "expect_window": "cwin"}
WHO = ["root", "sudo"]

# Capabilities no session process may hold in its bounding set (numbers from linux/capability.h).
FORBIDDEN_CAPS = {"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_TIME": 25, "CAP_MAC_OVERRIDE": 32,
                  "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34}
KNOBS = ("/proc/sys/kernel/printk_ratelimit", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/panic")
SYSRQ = "/proc/sysrq-trigger"

# Shared by every probe: ctypes wrappers returning {"ret": ..., "errno": name or None}.
PRELUDE = r'''
import ctypes, errno, json, os, stat, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000

def call(fn, *args):
    ctypes.set_errno(0)
    r = fn(*args)
    e = ctypes.get_errno()
    return {"ret": r, "errno": (errno.errorcode.get(e, str(e)) if r < 0 else None)}

def mount(src, tgt, fstype, flags=0, data=None):
    return call(libc.mount, src.encode(), tgt.encode(), fstype.encode() if fstype else None, flags,
                data.encode() if data else None)

def umount(tgt, flags=0):
    return call(libc.umount2, tgt.encode(), flags)

def syscall(nr, *args):
    return call(libc.syscall, ctypes.c_long(nr), *[a if a is None or not isinstance(a, int) else ctypes.c_long(a)
                                                   for a in args])

def write(path, data):
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    try:
        os.write(fd, data.encode())
        return None
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    finally:
        os.close(fd)

def read(path):
    try:
        with open(path, "rb") as f:
            return {"bytes": len(f.read(65536)), "errno": None}
    except OSError as e:
        return {"bytes": 0, "errno": errno.errorcode.get(e.errno, str(e.errno))}

out = {}
'''


# ------------------------------------------------------------------------------------------ helpers
def run(c, sid: str, argv: list[str], who: str, timeout: float = 60) -> dict:
    """``argv`` in the session as session root (``who="root"``), as ``user`` (``"user"``), or as
    ``user`` through ``sudo -S`` (``"sudo"``)."""
    if who == "root":
        return c.exec(sid, argv, timeout=timeout)
    if who == "user":
        return c.exec(sid, argv, user="user", timeout=timeout)
    assert who == "sudo", who
    return c.exec(sid, ["sudo", "-S", "-p", "", *argv], user="user", input=SESSION_PASSWORD + "\n", timeout=timeout)


def probe(c, sid: str, body: str, who: str, args: list[str] = (), timeout: float = 60) -> dict:
    """Run PRELUDE + ``body`` with python3 in the session; the last stdout line is its JSON result."""
    res = run(c, sid, ["python3", "-c", PRELUDE + body, *args], who, timeout)
    assert res["returncode"] == 0, f"probe failed as {who} in {sid}: {res}"
    lines = res["stdout"].strip().splitlines()
    assert lines, f"probe printed nothing as {who} in {sid}: {res}"
    return json.loads(lines[-1])


def marker_name() -> str:
    return f"drumsct-{secrets.token_hex(8)}"


class Made:
    """Sessions and snapshots a test made; ``close()`` destroys/deletes whatever is still there."""

    def __init__(self, c) -> None:
        self.c = c
        self.sessions: list[str] = []
        self.of_sessions: list[str] = []  # snapshots taken of these sessions are ours too

    def session(self, s: dict) -> dict:
        self.sessions.append(s["id"])
        self.of_sessions.append(s["id"])
        return s

    def close(self) -> None:
        errors = []
        live = {s["id"] for s in self.c.list()}
        for sid in self.sessions:
            if sid in live:
                try:
                    self.c.destroy(sid)
                except DrumsError as exc:
                    errors.append(f"destroy {sid}: {exc}")
        for snap in self.c.snapshots():
            if snap.get("session") in self.of_sessions:
                try:
                    self.c.delete_snapshot(snap["id"])
                except DrumsError as exc:
                    errors.append(f"delete snapshot {snap['id']}: {exc}")
        assert not errors, errors


@contextlib.contextmanager
def made(c):
    m = Made(c)
    try:
        yield m
    finally:
        m.close()


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def drums(drums_instance):
    """A client of the suite's daemon for this module (the fresh/restored sessions here are shared)."""
    from tests.support.suite import module_client

    with module_client(drums_instance, "containment tests") as c:
        yield c


@pytest.fixture(scope="module")
def fresh(drums):
    s = drums.create(SPEC)
    yield s
    drums.destroy(s["id"])


@pytest.fixture(scope="module")
def base_snapshot(drums):
    """A bare session, checkpointed (the session is consumed)."""
    s = drums.create(SPEC)
    try:
        snap = drums.checkpoint(s["id"], name="containment-base")
    except BaseException:
        with contextlib.suppress(DrumsError):
            drums.destroy(s["id"])
        raise
    yield snap
    drums.delete_snapshot(snap["id"])


@pytest.fixture(scope="module")
def restored(drums, base_snapshot):
    (s,) = drums.restore(base_snapshot["id"])
    yield s
    drums.destroy(s["id"])


@pytest.fixture(params=["fresh", "restored"])
def session(request):
    """The shared fresh session, then the shared restored one."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def throwaway(drums, base_snapshot):
    """Makes sessions that a test may break: ``throwaway("fresh")`` or ``throwaway("restored")``."""
    with made(drums) as m:
        def make(kind: str, spec: dict | None = None) -> dict:
            if kind == "fresh":
                return m.session(drums.create(spec or SPEC))
            (s,) = drums.restore(base_snapshot["id"])
            return m.session(s)
        yield make


def host_knobs() -> dict:
    return {p: Path(p).read_text() for p in KNOBS}


def host_clock_offset() -> float:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC: constant unless somebody sets the clock."""
    return time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)


# ------------------------------------------------------------------------------------------ 1. knobs
@pytest.mark.parametrize("who", WHO)
def test_kernel_knobs_are_not_writable(drums, session, who):
    before = host_knobs()
    hostile = {
        "/proc/sys/kernel/printk_ratelimit": str(int(before["/proc/sys/kernel/printk_ratelimit"]) + 7),
        "/proc/sys/kernel/core_pattern": "|/bin/false drumsct-%p",
        "/proc/sys/kernel/panic": str(int(before["/proc/sys/kernel/panic"]) + 3),
        SYSRQ: "h",  # sysrq help: harmless even if it went through
    }
    body = ("vals = json.loads(sys.argv[1])\n"
            "for p, v in vals.items():\n"
            "    out[p] = write(p, v)\n"
            "print(json.dumps(out))\n")
    res = probe(drums, session["id"], body, who, [json.dumps(hostile)])
    after = host_knobs()
    assert after == before, f"host sysctls changed by a session ({who}): {before} -> {after}"
    written = [p for p, e in res.items() if e is None]
    assert not written, f"session {who} could write {written} (results {res})"


# ------------------------------------------------------------------------------------------ 2. mounts
MOUNTS = r'''
targets = ("/mnt/ct-proc-%d" % os.getpid(), "/mnt/ct-sys-%d" % os.getpid())
for d in targets:
    os.makedirs(d, exist_ok=True)

def in_child(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = fn()
        except BaseException as e:
            res = {"error": repr(e)}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"error": "the child printed nothing"}

def nested():
    # a nested user namespace with its own pid namespace, made from the session's mount namespace
    res = {"unshare": call(libc.unshare, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID)}
    def pid1():
        return {"nested proc": mount("proc", targets[0], "proc"),
                "nested sysfs": mount("sysfs", targets[1], "sysfs"),
                "nested umount /proc/sys": umount("/proc/sys", MNT_DETACH)}
    res.update(in_child(pid1))
    return res

def private():
    # a private copy of the session's mount namespace (same user namespace: every lock is copied);
    # without CAP_SYS_ADMIN the copy itself is refused, and every attempt below then runs in the
    # session's own namespace (each must fail anyway)
    res = {"unshare": call(libc.unshare, CLONE_NEWNS)}
    res["remount /proc/sys writable"] = mount("none", "/proc/sys", None, MS_REMOUNT | MS_BIND)
    res["umount /proc/sys"] = umount("/proc/sys")
    res["umount /proc/sys (detach)"] = umount("/proc/sys", MNT_DETACH)
    # the other masks and the sized tmpfs mounts are locked the same way
    for p in ("/proc/irq", "/proc/bus", "/proc/fs", "/tmp", "/run", "/dev/shm"):
        res["umount " + p] = umount(p, MNT_DETACH)
    res["proc on " + targets[0]] = mount("proc", targets[0], "proc")
    res["sysfs on " + targets[1]] = mount("sysfs", targets[1], "sysfs")
    res["sysfs on /sys"] = mount("sysfs", "/sys", "sysfs")
    res["proc over /proc"] = mount("proc", "/proc", "proc")
    # whatever of the above went through: the knob behind it must still refuse a write
    res["write printk_ratelimit via /proc"] = write("/proc/sys/kernel/printk_ratelimit", "17")
    res["write printk_ratelimit via new proc"] = write(targets[0] + "/sys/kernel/printk_ratelimit", "17")
    return res

out["nested"] = in_child(nested)
out["private"] = in_child(private)
for d in targets:
    os.rmdir(d)
print(json.dumps(out))
'''

TMPFS = r'''
out["mount tmpfs /mnt"] = mount("tmpfs", "/mnt", "tmpfs", 0, "size=1m")
out["on tmpfs"] = any(l.split()[4] == "/mnt" and " - tmpfs " in l for l in open("/proc/self/mountinfo"))
out["umount /tmp"] = umount("/tmp", MNT_DETACH)
print(json.dumps(out))
'''


@pytest.mark.parametrize("who", WHO)
def test_no_proc_or_sysfs_mount_and_proc_sys_stays(drums, session, who):
    before = host_knobs()
    res = probe(drums, session["id"], MOUNTS, who)
    assert host_knobs() == before, "host sysctls changed"
    for part in ("nested", "private"):
        assert "error" not in res[part], res
    assert res["nested"]["unshare"]["ret"] == 0, res  # a user namespace of its own is allowed
    assert res["private"]["unshare"]["ret"] == 0 or res["private"]["unshare"]["errno"] == "EPERM", res
    went_through = sorted(f"{part}: {k}" for part in ("nested", "private") for k, v in res[part].items()
                          if k != "unshare" and (v is None or (isinstance(v, dict) and v["errno"] is None)))
    assert not went_through, (
        f"{'restored' if session.get('snapshot') else 'fresh'} session, as {who}: these went through: "
        f"{went_through} (all results {res})")


@pytest.mark.parametrize("who", WHO)
def test_no_mount_at_all_fresh_or_restored(drums, session, who):
    """Session root has no CAP_SYS_ADMIN (CRIU restores a session's mounts unlocked, so only the
    missing capability keeps a restored session from unmounting its hardening): not even a tmpfs."""
    res = probe(drums, session["id"], TMPFS, who)
    assert res["mount tmpfs /mnt"]["errno"] == "EPERM" and not res["on tmpfs"], res
    assert res["umount /tmp"]["errno"] == "EPERM", res


# ------------------------------------------------------------------------------------------ 3. syscalls
SYSCALLS = r'''
name = "/tmp/ct-blk-%d" % os.getpid()
try:
    os.mknod(name, 0o600 | stat.S_IFBLK, os.makedev(8, 0))
    out["mknod block"] = None
    os.unlink(name)
except OSError as e:
    out["mknod block"] = errno.errorcode.get(e.errno)
class TS(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
class TV(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]
later = int(time.time()) + 3600  # an hour ahead: unmistakable on the host, and put back by the test
calls = {
    "init_module": (175, None, 0, b""),
    "finit_module": (313, 0, b"", 0),
    "delete_module": (176, b"drumsct_none", 0),
    "settimeofday": (164, ctypes.byref(TV(later, 0)), None),
    "clock_settime": (227, 0, ctypes.byref(TS(later, 0))),
    "kexec_load": (246, 0, 0, None, 0),
    "kexec_file_load": (320, -1, -1, 0, None, 0),
    "bpf": (321, 0, None, 0),
    "perf_event_open": (298, None, 0, -1, -1, 0),
    "open_by_handle_at": (304, -100, None, 0),
    "keyctl": (250, 0, -3, 1),  # KEYCTL_GET_KEYRING_ID of the session keyring, create it
    "add_key": (248, b"user", b"drumsct", b"secret", 6, -2),
    "request_key": (249, b"user", b"drumsct", None, 0),
    "pkey_alloc": (330, 0, 0),  # a key CRIU could not carry to a restored process
}
for n, a in calls.items():
    out[n] = syscall(*a)
print(json.dumps(out))
'''


@pytest.mark.parametrize("who", WHO)
def test_denied_syscalls_and_the_host_clock(drums, session, who):
    offset = host_clock_offset()
    try:
        res = probe(drums, session["id"], SYSCALLS, who)
    finally:
        skew = host_clock_offset() - offset
        if abs(skew) > 1:  # the clock was set from the session: put it back before failing
            time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_MONOTONIC) + offset)
    assert abs(skew) <= 1, f"the host clock moved by {skew:.1f}s while a session ({who}) tried to set it"
    assert res["mknod block"] is not None, f"mknod of a block device worked in the session ({who})"
    through = {k: v for k, v in res.items() if k != "mknod block" and v["errno"] is None}
    assert not through, f"these syscalls succeeded in the session ({who}): {through}"
    for name in ("keyctl", "add_key", "request_key"):
        assert res[name]["errno"] == "EPERM", f"{name} failed with {res[name]} instead of the filter's EPERM"
    # "no key free": what callers handle (Chromium then protects its pages without keys)
    assert res["pkey_alloc"]["errno"] == "ENOSPC", res["pkey_alloc"]


# ------------------------------------------------------------------------------------------ 4. caps and seccomp
def status_fields(text: str) -> dict:
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def containment_problems(fields: dict) -> list[str]:
    problems = []
    if fields.get("Seccomp") != "2":
        problems.append(f"Seccomp {fields.get('Seccomp')!r}")
    bnd = int(fields.get("CapBnd", "f" * 16), 16)
    held = [name for name, bit in FORBIDDEN_CAPS.items() if bnd & (1 << bit)]
    if held:
        problems.append(f"bounding set holds {held}")
    return problems


def test_every_session_process_is_filtered_and_capped(drums, session):
    info = drums.get(session["id"])
    procs = session_processes(info["init_pid"])
    assert len(procs) >= 4, f"too few processes in {session['id']}: {procs}"  # init, Xvfb, openbox, xterm...
    bad = {}
    seen = 0
    for p in procs:
        try:
            text = Path(f"/proc/{p.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited meanwhile
        seen += 1
        fields = status_fields(text)
        problems = containment_problems(fields)
        for key in ("Uid", "Gid"):
            ids = [int(x) for x in fields[key].split()]
            if not all(ID_BASE <= i < ID_BASE + 65536 for i in ids):
                problems.append(f"{key} {ids} outside the session's host range")
        if problems:
            bad[f"{p.pid}/{p.comm}"] = problems
    assert seen >= 4, procs
    assert not bad, f"session processes not contained: {bad}"


@pytest.mark.parametrize("who", ["root", "sudo", "user"])
def test_exec_process_is_filtered_and_capped(drums, session, who):
    res = run(drums, session["id"], ["cat", "/proc/self/status"], who)
    assert res["returncode"] == 0, res
    problems = containment_problems(status_fields(res["stdout"]))
    assert not problems, f"a process started by exec as {who}: {problems}"


# ------------------------------------------------------------------------------------------ 5. /proc leaks
PROCREAD = r'''
for p in ("/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/kcore"):
    out[p] = read(p)
print(json.dumps(out))
'''


@pytest.mark.parametrize("who", WHO)
def test_proc_keys_timer_list_kcore_reveal_nothing(drums, session, who):
    res = probe(drums, session["id"], PROCREAD, who)
    assert res["/proc/keys"] == {"bytes": 0, "errno": None}, res
    for p in ("/proc/timer_list", "/proc/kcore"):
        assert res[p]["bytes"] == 0, f"{p} returned {res[p]['bytes']} bytes in the session ({who})"


# ------------------------------------------------------------------------------------------ 6. ownership
def session_upper(s: dict) -> Path:
    """The upper directory of the session's overlay root, as the host's mount table has it."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[4] == s["root"] and fields[sep + 1] == "overlay":
                for opt in fields[sep + 3].split(","):
                    if opt.startswith("upperdir="):
                        return Path(opt[len("upperdir="):].replace("\\040", " "))
    raise AssertionError(f"no overlay mounted at {s['root']} on the host")


def test_files_belong_to_unprivileged_host_ids(drums, session):
    sid, upper = session["id"], session_upper(session)
    names = {who: marker_name() for who in ("root", "sudo", "user")}
    paths = {"root": f"/root/{names['root']}", "sudo": f"/root/{names['sudo']}",
             "user": f"/home/user/{names['user']}"}
    expected = {"root": ID_BASE, "sudo": ID_BASE, "user": ID_BASE + SESSION_UID}
    try:
        for who, path in paths.items():
            res = run(drums, sid, ["touch", path], who)
            assert res["returncode"] == 0, res
        for who, path in paths.items():
            st = os.lstat(upper / path.lstrip("/"))
            assert (st.st_uid, st.st_gid) == (expected[who], expected[who]), (
                f"a file made by {who} in the session is owned by {st.st_uid}:{st.st_gid} on the host")
            assert st.st_uid not in (0, SESSION_UID)
    finally:
        drums.exec(sid, ["rm", "-f", *paths.values()])


# ------------------------------------------------------------------------------------------ 7. host files
SEARCH = r'''
names = set(sys.argv[1:])
found, seen, errors = [], 0, 0
def onerror(e):
    global errors
    errors += 1
for top, dirs, files in os.walk("/", onerror=onerror):
    if top == "/":
        dirs[:] = [d for d in dirs if d != "proc"]
    for n in dirs + files:
        seen += 1
        if n in names:
            found.append(os.path.join(top, n))
out.update(found=found, seen=seen, errors=errors)
# roots, cwds and open files of every process: each must be the session's own
escapes = []
if os.path.isdir("/proc/self"):
    me = os.stat("/")
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        base = "/proc/" + p
        try:
            st = os.stat(base + "/root")
            if (st.st_dev, st.st_ino) != (me.st_dev, me.st_ino):
                escapes.append([p, "root", os.readlink(base + "/root")])
            links = [base + "/cwd"] + [base + "/fd/" + n for n in os.listdir(base + "/fd")]
        except OSError:
            continue
        for link in links:
            try:
                st, target = os.stat(link), os.readlink(link)
            except OSError:
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue
            if not target.startswith("/") or target.endswith(" (deleted)"):
                continue
            try:
                there = os.stat(target)
                if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino):
                    continue
            except OSError:
                pass
            escapes.append([p, link, target])
out["escapes"] = escapes
out["procs_checked"] = os.path.isdir("/proc/self")
print(json.dumps(out))
'''

UMOUNT_ALL = r'''
done, refused = [], {}
for _ in range(5):
    try:
        points = [l.split()[4] for l in open("/proc/self/mountinfo")]
    except OSError:
        break
    points = [p.encode().decode("unicode_escape") for p in points]
    progress = False
    for p in sorted(set(points), key=lambda p: (p.count("/"), len(p)), reverse=True):
        r = umount(p, MNT_DETACH)
        if r["errno"] is None:
            done.append(p)
            progress = True
        else:
            refused[p] = r["errno"]
    if not progress:
        break
out.update(unmounted=done, refused=refused)
print(json.dumps(out))
'''


# the session's long-lived processes (the init is the session init's python)
LASTING = ("python", "Xvfb", "openbox", "xterm", "dbus-daemon", "bash")


@pytest.fixture
def host_markers(drums_instance):
    """Marker files with unique names in host places a session must never see."""
    places = [Path("/root"), Path("/opt"), Path("/var/tmp"), Path(__file__).resolve().parents[1], Path("/tmp"),
              Path("/tmp/.X11-unix"), STATE_ROOT, drums_instance.state_dir, drums_instance.state_dir / "sessions"]
    made_paths = []
    try:
        for place in places:
            if place.is_dir():
                p = place / marker_name()
                p.write_text("host marker\n")
                made_paths.append(p)
        yield made_paths
    finally:
        for p in made_paths:
            p.unlink(missing_ok=True)


@pytest.mark.parametrize("kind", ["fresh", "restored"])
def test_no_host_file_is_visible_even_after_unmounting(drums, throwaway, host_markers, kind):
    s = throwaway(kind)
    sid = s["id"]
    # a marker beside the session's own upper (its closest host directory)
    beside = Path(s["dir"]) / marker_name()
    beside.write_text("host marker\n")
    try:
        names = [p.name for p in host_markers] + [beside.name]
        first = probe(drums, sid, SEARCH, "root", names, timeout=120)
        assert first["seen"] > 10000, f"the search saw too little of the session's tree: {first['seen']}"
        assert first["found"] == [], f"host files visible in the {kind} session: {first['found']}"
        assert first["escapes"] == [], f"session processes hold host paths: {first['escapes']}"
        lasting = {(p.pid, p.comm) for p in session_processes(s["init_pid"]) if p.comm in LASTING}
        assert {"Xvfb", "openbox", "xterm"} <= {comm for _, comm in lasting}, lasting
        umounts = probe(drums, sid, UMOUNT_ALL, "root", timeout=60)
        second = probe(drums, sid, SEARCH, "root", names, timeout=120)
        assert second["found"] == [], (f"host files visible in the {kind} session after unmounting "
                                        f"{umounts['unmounted']}: {second['found']}")
        assert second["escapes"] == [], second["escapes"]
        info = drums.get(sid)
        assert info["state"] == "RUNNING", info
        alive = {(p.pid, p.comm) for p in session_processes(info["init_pid"])}
        assert lasting <= alive, f"session processes died after the unmounts: {lasting - alive}"
    finally:
        beside.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ 8. reseed
def file_facts(p: Path) -> tuple:
    st = os.lstat(p)
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
            p.read_bytes() if stat.S_ISREG(st.st_mode) else None)


def tree_facts(top: Path) -> dict:
    facts = {".": file_facts(top)}
    for dirpath, dirs, files in os.walk(top):
        for n in dirs + files:
            p = Path(dirpath) / n
            facts[str(p.relative_to(top))] = file_facts(p)
    return facts


@pytest.mark.parametrize("leave_running", [False, True], ids=["restore", "leave-running"])
@pytest.mark.parametrize("target", ["etc/hosts", "etc/hostname", "etc/machine-id", "etc"])
def test_reseed_does_not_follow_planted_symlinks(drums, target, leave_running):
    decoy = Path("/var/tmp") / marker_name()
    if target == "etc":
        decoy.mkdir(mode=0o755)
        for n in ("hosts", "hostname", "machine-id"):
            (decoy / n).write_text(f"host decoy {n} {secrets.token_hex(8)}\n")
        plant = f"mv /etc /etc.session && ln -s {decoy} /etc"  # ln: /usr/bin, found without /etc
    else:
        decoy.write_text(f"host decoy {secrets.token_hex(8)}\n")
        decoy.chmod(0o640)
        plant = f"rm -f /{target} && ln -s {decoy} /{target}"
    before = tree_facts(decoy)
    try:
        with made(drums) as m:
            # no dbus: its inotify watch on /etc/dbus-1 makes CRIU refuse the dump once /etc is moved
            s = m.session(drums.create(dict(SPEC, dbus=False)))
            res = drums.exec(s["id"], ["bash", "-c", plant])
            assert res["returncode"] == 0, res
            outcome = None
            try:
                snap = drums.checkpoint(s["id"], leave_running=leave_running)
                if leave_running:
                    outcome = "checkpoint (leave running) succeeded"
                else:
                    (r,) = drums.restore(snap["id"])
                    m.sessions.append(r["id"])
                    outcome = f"restore succeeded as {r['id']}"
            except DrumsError as exc:
                msg = str(exc)
                assert "etc/" in msg and (exc.reason == "UNSAFE_PATH" or "symlink" in msg or "unsafe" in msg), (
                    f"the {'checkpoint' if leave_running else 'restore'} failed without naming the unsafe path: "
                    f"{exc!r}")
                outcome = f"refused: {msg}"
            assert tree_facts(decoy) == before, f"the host decoy {decoy} changed ({outcome})"
        assert tree_facts(decoy) == before, f"the host decoy {decoy} changed after teardown"
    finally:
        if decoy.is_dir() and not decoy.is_symlink():
            shutil.rmtree(decoy)
        else:
            decoy.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ 9. X socket
class Listener:
    """A unix socket on the host that records every connection made to it."""

    def __init__(self) -> None:
        self.path = Path("/var/tmp") / f"{marker_name()}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def listener():
    lst = Listener()
    try:
        yield lst
    finally:
        lst.close()


def plant_x_socket(drums, sid: str, target: Path) -> None:
    res = drums.exec(sid, ["bash", "-c", "mv /tmp/.X11-unix/X0 /tmp/.X11-unix/X0.real && "
                                         f"ln -s {target} /tmp/.X11-unix/X0 && test -L /tmp/.X11-unix/X0"])
    assert res["returncode"] == 0, res


def test_daemon_does_not_follow_a_planted_x_socket(drums, throwaway, listener):
    s = throwaway("fresh", dict(SPEC, ready_timeout=10))
    sid = s["id"]
    plant_x_socket(drums, sid, listener.path)
    outcomes = {}
    for name, op in (("windows", drums.windows), ("screenshot", drums.screenshot)):
        try:
            op(sid)
            outcomes[name] = "returned"
        except DrumsError as exc:
            outcomes[name] = f"{exc.reason}: {exc}"
    # the checkpoint reads the window titles and the restore waits for the window, both through the
    # X socket (the restore may find the server's own socket again: CRIU binds it anew at its name)
    snap = drums.checkpoint(sid)
    try:
        (r,) = drums.restore(snap["id"])
        drums.destroy(r["id"])
        outcomes["restore"] = "returned"
    except DrumsError as exc:
        outcomes["restore"] = f"{exc.reason}: {exc}"
    finally:
        drums.delete_snapshot(snap["id"])
    time.sleep(0.3)  # an absence, nothing to wait on: a connection in flight would show by now
    assert listener.connections == 0, f"the daemon connected to a host socket the session pointed at: {outcomes}"
    assert stat.S_ISSOCK(os.lstat(listener.path).st_mode), f"the host socket {listener.path} was replaced"
    for name, outcome in outcomes.items():
        assert outcome == "returned" or "X_UNREACHABLE" in outcome or "symlink" in outcome, (name, outcome)


def test_host_display_link_does_not_reach_a_host_socket(drums, throwaway, listener):
    """An X client on the host (``DISPLAY=:<display> xdotool ...``) connects through
    ``/tmp/.X11-unix/X<display>``: Drums makes no such link (one through ``/proc/<pid>/root`` would
    follow the planted symlink); whatever is there, it must not lead to the host socket."""
    s = throwaway("fresh")
    plant_x_socket(drums, s["id"], listener.path)
    link = f"/tmp/.X11-unix/X{s['display']}"
    assert not os.path.lexists(link), f"{link} exists on the host"
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(5)
    try:
        client.connect(link)
        how = "connected"
    except OSError as exc:
        how = f"refused: {exc}"
    finally:
        client.close()
    time.sleep(0.3)  # an absence, nothing to wait on: a connection in flight would show by now
    assert listener.connections == 0, (
        f"an X client on the host following {link} reached the host socket "
        f"{listener.path} the session's root planted as /tmp/.X11-unix/X0 ({how})")


# ------------------------------------------------------------------------------------------ 10. sudo
def test_sudo_still_works(drums, session):
    res = run(drums, session["id"], ["id", "-u"], "sudo")
    assert res["returncode"] == 0 and res["stdout"].strip() == "0", res
    res = run(drums, session["id"], ["apt-get", "--version"], "sudo")
    assert res["returncode"] == 0 and res["stdout"].startswith("apt "), res
