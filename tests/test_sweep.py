"""The sweep against real resources (root): a dead run's tagged process tree, a recorded pid, CRIU-like
processes found by their paths, a process of a foreign mount namespace holding a mount, a tmpfs and an
overlay, a veth pair, an nftables table, an X11 link, staged and leftover directories; plus decoys of
each kind that no ledger owns (or that a live run owns), which must survive. Also the sweep killed at
each of its own fault windows and rerun, and a mount that will not go keeping its directory.

Every name is prefixed (``drums-swt-*``, ``dvhT*``, ``drums_test_*``, ``Xdrumstest*``) and every test
removes what it made, even when it fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drums_core.host import linux, mounttable, ownedpaths, procs
from drums_core.config import X11_DIR
from drums_core.host.hoststate import ledger_claims, run_leaks, snapshot_host_state
from drums_core.sweep.ledger import Ledger
from drums_core.sweep import sweep
from drums_core.sweep.hostops import FAULT_WINDOWS, nft_tables

from tests.support import reaping
from tests.support.wait import wait_until

REPO = str(Path(__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def _need_root():
    if os.geteuid() != 0:
        pytest.fail("tests/test_sweep.py needs root (mounts, veth, nftables, killing processes)")
    for tool in ("nft", "ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            pytest.fail(f"tests/test_sweep.py needs {tool!r} on PATH")


def _sh(*argv: str) -> None:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")


def _ns_has_mount(pid: int, point: str) -> bool:
    try:
        return any(m.mountpoint == point for m in mounttable.read_mountinfo(pid))
    except (OSError, ValueError):
        return False


class World:
    """A dead run with real resources, and decoys. ``close()`` removes all of it, whatever state it is in."""

    def __init__(self) -> None:
        self.helpers_before = reaping.descendants()  # other tests' helpers this process holds are not ours
        self.hex = secrets.token_hex(3)
        self.base = Path(f"/tmp/drums-swt-{self.hex}")
        self.criu_tmp = Path(f"/tmp/.criu.swt{self.hex}")
        self.state = self.base / "state"
        self.ledger_root = self.state / "ledger"
        self.sessions = self.state / "sessions"
        self.run = f"swt{self.hex}-1"
        self.decoy_run = f"swt{self.hex}-10"  # run1 vs run10
        self.live_run = f"swt{self.hex}-live"
        self.D = self.sessions / "s1"
        self.D10 = self.sessions / "s10"  # s1 vs s10
        self.ifname = f"dvhT{self.hex}"
        self.decoy_ifname = f"dvhT{self.hex}d"
        self.table = f"drums_test_{self.hex}"
        self.decoy_table = f"drums_test_{self.hex}_d"
        self.x11 = X11_DIR / f"Xdrumstest{self.hex}"
        self.decoy_x11 = X11_DIR / f"Xdrumstest{self.hex}d"
        self.popens: list[subprocess.Popen] = []
        self.owned: dict[str, int] = {}
        self.decoys: dict[str, int] = {}
        self.made_x11_dir = False
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)

    # ------------------------------------------------------------------ helpers
    def spawn(self, argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, **kw)
        self.popens.append(p)
        return p

    def spawn_tagged(self, run: str, code: str = "import time; time.sleep(600)") -> subprocess.Popen:
        p = self.spawn([sys.executable, "-c", code, "--tag", procs.run_tag(run)])
        wait_until(lambda: procs.read_cmdline(p.pid)[-1:] == [procs.run_tag(run)], 10, f"tagged {p.pid}")
        return p

    def spawn_criu(self, cwd: Path, fd_file: Path) -> subprocess.Popen:
        """A process named ``criu`` with argv ``criu -c <code> swrk 3`` (no path in it), like pycriu's RPC."""
        code = f"import os, time; fd = os.open({str(fd_file)!r}, os.O_CREAT | os.O_WRONLY); time.sleep(600)"
        p = self.spawn([str(self.base / "bin" / "criu"), "-c", code, "swrk", "3"], cwd=str(cwd),
                       env={"PATH": "/usr/bin:/bin", "PYTHONHOME": "/usr"})
        wait_until(lambda: str(fd_file) in procs.proc_paths(p.pid).fds, 10, f"criu-like {p.pid} to open {fd_file}")
        assert procs.read_stat(p.pid).comm == "criu"
        return p

    def spawn_ns_holder(self, point: Path) -> subprocess.Popen:
        point.mkdir(parents=True, exist_ok=True)
        p = self.spawn(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                        f"mount -t tmpfs drums-swt-ns '{point}' && exec sleep 600"])
        wait_until(lambda: procs.read_stat(p.pid) and procs.read_stat(p.pid).comm == "sleep"
                   and _ns_has_mount(p.pid, str(point)), 10, f"mount namespace holder {p.pid}")
        return p

    def key(self, p: subprocess.Popen | int) -> int:
        return p if isinstance(p, int) else p.pid

    # ------------------------------------------------------------------ build
    def build(self) -> None:
        for d in (self.D, self.D10, self.base / "bin", self.sessions):
            d.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.realpath(sys.executable), self.base / "bin" / "criu")
        if not X11_DIR.exists():
            X11_DIR.mkdir(mode=0o1777)
            self.made_x11_dir = True

        owner = self.spawn(["sleep", "600"])
        led = Ledger.create(self.ledger_root, self.run, pid=owner.pid)
        owner.kill()
        owner.wait()
        self.led = led

        # write-ahead, as the engine does: record, then create
        led.record("dir", str(self.D), session="s1")
        t = self.D / "t"
        t.mkdir()
        led.record("mount", str(t), session="s1")
        _sh("mount", "-t", "tmpfs", "-o", "size=16m", "drums-swt", str(t))
        for sub in ("lower", "upper", "work", "root"):
            (t / sub).mkdir()
        (t / "lower" / "hello").write_text("hi")
        led.record("session", "s1", dir=str(self.D), root=str(t / "root"), slot=900, ifname=self.ifname,
                   init_pid=None, starttime=None, state="STARTING")
        _sh("mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={t}/lower,upperdir={t}/upper,workdir={t}/work", str(t / "root"))

        tree = self.spawn_tagged(self.run, "import os, subprocess, time\n"
                                           "if os.fork():\n    subprocess.Popen(['sleep', '600'])\n"
                                           "time.sleep(600)")
        kids = wait_until(lambda: len(procs.descendants(procs.scan_processes(), [tree.pid])) == 2 or None, 10,
                          "tagged tree")
        assert kids
        start = procs.starttime(tree.pid)
        led.update("session", "s1", init_pid=tree.pid, starttime=start, state="RUNNING")
        led.record("process", "s1", pid=tree.pid, starttime=start, tag=procs.run_tag(self.run))
        self.owned["tagged tree (3 processes)"] = tree.pid

        helper = self.spawn(["sleep", "601"])
        led.record("process", "helper", pid=helper.pid, starttime=procs.starttime(helper.pid))
        self.owned["recorded helper"] = helper.pid

        (self.D / "criu").mkdir()
        self.owned["criu by fd"] = self.spawn_criu(Path("/"), self.D / "criu" / "restore.log").pid
        self.criu_tmp.mkdir()
        (self.criu_tmp / "yard").mkdir()
        _sh("mount", "-t", "tmpfs", "-o", "size=1m", "drums-swt-criu", str(self.criu_tmp / "yard"))
        self.owned["criu in /tmp/.criu.*"] = self.spawn_criu(self.criu_tmp, self.D / "criu" / "dump.log").pid
        self.owned["mount namespace holder"] = self.spawn_ns_holder(self.D / "nsmnt").pid

        led.record("link", self.ifname, session="s1")
        _sh("ip", "link", "add", self.ifname, "type", "veth", "peer", "name", self.ifname + "p")
        led.record("nft", f"inet/{self.table}", family="inet", name=self.table)
        _sh("nft", "add", "table", "inet", self.table)
        led.record("x11link", str(self.x11), session="s1")
        os.symlink(f"/proc/{tree.pid}/root/tmp/.X11-unix/X0", self.x11)

        self.staging = self.state / "snapshots" / ".staging" / "snapA"
        led.record("dir", str(self.staging), snapshot="snapA")
        led.record("op", "checkpoint/snapA", session="s1", snapshot="snapA", phase="staging")
        (self.staging / "images").mkdir(parents=True)
        (self.staging / "images" / "core-1.img").write_bytes(b"\0" * 4096)
        self.published = self.state / "snapshots" / "snapB"
        (self.published / "images").mkdir(parents=True)
        (self.published / "manifest.json").write_text("{}")
        led.record("snapshot", "snapB", dir=str(self.published))
        self.seeded = self.sessions / ".rm-s1-0123456789abcdef"
        (self.seeded / "upper").mkdir(parents=True)

        # decoys: nothing here is owned by the dead run
        self.decoys["tagged other run"] = self.spawn_tagged(self.decoy_run).pid
        _sh("mount", "-t", "tmpfs", "-o", "size=1m", "drums-swt-decoy", str(self.D10))
        self.decoys["criu naming s10"] = self.spawn_criu(self.D10, self.D10 / "restore.log").pid
        self.decoys["ns holder under s10"] = self.spawn_ns_holder(self.D10 / "nsmnt").pid
        self.decoy_leftover = self.sessions / ".rm-s10-0123456789abcdef"
        self.decoy_leftover.mkdir()
        live_owner = self.spawn(["sleep", "600"])
        self.live = Ledger.create(self.ledger_root, self.live_run, pid=live_owner.pid)
        self.decoys["live run owner"] = live_owner.pid
        self.decoys["tagged live run"] = self.spawn_tagged(self.live_run).pid
        self.live_dir = self.sessions / "live1"
        self.live.record("dir", str(self.live_dir))
        self.live_dir.mkdir()
        _sh("ip", "link", "add", self.decoy_ifname, "type", "veth", "peer", "name", self.decoy_ifname + "p")
        _sh("nft", "add", "table", "inet", self.decoy_table)
        os.symlink("/proc/1/root/tmp/.X11-unix/X0", self.decoy_x11)

    # ------------------------------------------------------------------ checks
    def run_dirs(self) -> dict:
        return {self.run: [str(self.D), str(self.staging), str(self.criu_tmp)]}

    def assert_decoys_intact(self) -> None:
        for what, pid in self.decoys.items():
            assert procs.is_alive(pid), f"decoy {what} ({pid}) was killed"
        mounts = {m.mountpoint for m in mounttable.read_mountinfo()}
        assert str(self.D10) in mounts, "decoy tmpfs was unmounted"
        assert _ns_has_mount(self.decoys["ns holder under s10"], str(self.D10 / "nsmnt"))
        assert self.decoy_leftover.is_dir() and self.live_dir.is_dir() and self.live.path.is_dir()
        assert (self.published / "manifest.json").is_file()
        assert procs.is_alive(self.live.owner()["pid"])
        assert os.path.exists(f"/sys/class/net/{self.decoy_ifname}")
        assert ("inet", self.decoy_table) in nft_tables()
        assert os.path.islink(self.decoy_x11)

    def assert_run_gone(self) -> None:
        for what, pid in self.owned.items():
            assert not procs.is_alive(pid), f"{what} ({pid}) survived"
        assert not procs.find_tagged(procs.run_tag(self.run))
        state = snapshot_host_state(self.run_dirs())
        leaks = run_leaks(state, self.run, links=[self.ifname], nft_tables=[self.table], x11_links=[str(self.x11)])
        leaks = [x for x in leaks if "drums-swt" in x or self.hex in x or not x.startswith("criu mount")]
        assert leaks == [], leaks
        for p in (self.D, self.staging, self.seeded, self.criu_tmp):
            assert not os.path.lexists(p), f"{p} left"
        assert not self.led.path.exists(), f"ledger left: {os.listdir(self.led.path)}"
        assert not [n for n in os.listdir(self.sessions) if n.startswith(".rm-s1-")]

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        errors = []
        for p in self.popens:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in self.popens:
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                p.wait(timeout=0.05)
        reaping.kill_new_descendants(self.helpers_before)
        for tag in (self.run, self.decoy_run, self.live_run):
            for p in procs.find_tagged(procs.run_tag(tag)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for _ in range(5):
            try:
                hits = mounttable.mounts_within(mounttable.read_mountinfo(), [str(self.base), str(self.criu_tmp)])
            except (OSError, ValueError) as exc:
                errors.append(str(exc))
                break
            if not hits:
                break
            for m in hits:
                with contextlib.suppress(OSError):
                    mounttable.umount_detach(m.mountpoint)
        for name in (self.ifname, self.decoy_ifname):
            if os.path.exists(f"/sys/class/net/{name}"):
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        for table in (self.table, self.decoy_table):
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
        for link in (self.x11, self.decoy_x11):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(link)
        for d in (self.base, self.criu_tmp):
            shutil.rmtree(d, ignore_errors=True)
        if self.made_x11_dir:
            with contextlib.suppress(OSError):
                X11_DIR.rmdir()
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 0)
        assert not errors, errors


@pytest.fixture
def world(request):
    w = World()
    request.addfinalizer(w.close)
    w.build()
    return w


EXPECTED = {"processes_killed": 7, "mounts_unmounted": 3, "links_deleted": 1, "nft_deleted": 1,
            "x11links_removed": 1, "dirs_removed": 4}


def test_sweep_reaps_a_dead_run_and_spares_decoys(world):
    run_dirs = world.run_dirs()
    before = snapshot_host_state(run_dirs)
    # O1: every mount under the run's directories is one the ledger recorded (or lies under a recorded dir)
    claims = ledger_claims(world.ledger_root, world.run)
    assert {m["mountpoint"] for m in before["mounts"][world.run]} >= {str(world.D / "t"), str(world.D / "t/root")}
    for m in before["mounts"][world.run]:
        assert (ownedpaths.within_any(m["mountpoint"], claims["paths"])
                or m["mountpoint"].startswith(str(world.criu_tmp)))
    assert len(before["tagged"][world.run]) == 2  # the tree's parent and its forked child
    assert world.ifname in before["links"] and {"family": "inet", "name": world.table} in before["nft_tables"]

    dry = sweep(world.ledger_root, dry_run=True)
    d = {r.run: r for r in dry.runs}[world.run]
    assert d.status == "dry-run" and dry.processes_killed >= 7 and dry.mounts_unmounted >= 2
    assert all(procs.is_alive(pid) for pid in world.owned.values())
    assert world.D.is_dir() and world.led.path.is_dir() and os.path.islink(world.x11)
    world.assert_decoys_intact()

    report = sweep(world.ledger_root)
    by_run = {r.run: r for r in report.runs}
    rr = by_run[world.run]
    assert rr.status == "swept", rr
    assert by_run[world.live_run].status == "skipped-alive"
    got = {k: report.counts()[k] for k in EXPECTED}
    assert got == EXPECTED, (got, rr.notes, rr.errors)
    assert report.errors == 0 and report.survivors == 0 and report.ledgers_removed == 1
    world.assert_run_gone()
    world.assert_decoys_intact()
    json.loads(report.to_json())

    again = sweep(world.ledger_root)
    assert again.is_noop(), again.to_json()
    assert all(v == 0 for v in again.counts().values())
    world.assert_decoys_intact()


@pytest.mark.parametrize("window", FAULT_WINDOWS)
def test_sweep_killed_at_its_own_windows_then_rerun(world, window):
    env = {**os.environ, "DRUMS_FAULT_AT": window, "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-m", "drums_core.sweep", "--ledger", str(world.ledger_root),
                          "--run", world.run, "--json"], capture_output=True, text=True, timeout=120, env=env,
                         cwd=REPO)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr)
    assert world.led.path.is_dir()
    assert all(not procs.is_alive(pid) for pid in world.owned.values())
    mounts = {m.mountpoint for m in mounttable.read_mountinfo()}
    if window == "sweep-after-kill":
        assert str(world.D / "t" / "root") in mounts
    else:
        assert str(world.D / "t") not in mounts and str(world.D / "t" / "root") not in mounts
    assert os.path.exists(f"/sys/class/net/{world.ifname}") == (window != "sweep-after-links")
    world.assert_decoys_intact()

    report = sweep(world.ledger_root)
    rr = {r.run: r for r in report.runs}[world.run]
    assert rr.status == "swept", rr
    assert report.errors == 0 and report.survivors == 0
    world.assert_run_gone()
    world.assert_decoys_intact()
    assert sweep(world.ledger_root).is_noop()


def test_a_mount_that_will_not_go_keeps_its_directory(world, monkeypatch):
    stuck = str(world.D / "t")  # a deeper mount that fails would go with its parent (MNT_DETACH)
    real = mounttable.umount_detach

    def refuse(path):
        if path == stuck:
            raise OSError(16, "Device or resource busy")
        return real(path)

    monkeypatch.setattr(mounttable, "umount_detach", refuse)
    report = sweep(world.ledger_root)
    rr = {r.run: r for r in report.runs}[world.run]
    assert rr.status == "incomplete" and any(stuck in e for e in rr.errors)
    assert world.D.is_dir() and world.led.path.is_dir()
    assert world.led.get("dir", str(world.D)) and world.led.get("mount", stuck)
    assert not world.staging.exists()  # what could go, went
    assert all(not procs.is_alive(pid) for pid in world.owned.values())

    monkeypatch.undo()
    report = sweep(world.ledger_root)
    assert {r.run: r for r in report.runs}[world.run].status == "swept"
    world.assert_run_gone()
    world.assert_decoys_intact()
    assert sweep(world.ledger_root).is_noop()


def test_real_criu_swrk_found_by_its_working_directory(world):
    """pycriu's RPC runs ``criu swrk <fd>``: no path in argv; the run's directory shows in cwd/fds only."""
    criu_bin = os.environ.get("DRUMS_CRIU", "/opt/drums/criu/usr/sbin/criu")
    if not os.access(criu_bin, os.X_OK):
        pytest.fail(f"this test needs the CRIU binary at {criu_bin} (scripts/provision installs it)")
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        work = world.D / "criu"
        swrk = world.spawn([criu_bin, "swrk", str(theirs.fileno())], pass_fds=(theirs.fileno(),), cwd=str(work))
        decoy = world.spawn([criu_bin, "swrk", str(theirs.fileno())], pass_fds=(theirs.fileno(),), cwd=str(world.D10))
        theirs.close()
        for p in (swrk, decoy):
            wait_until(lambda p=p: procs.read_stat(p.pid) and procs.read_stat(p.pid).comm == "criu"
                       and procs.read_cmdline(p.pid)[1:2] == ["swrk"], 10, f"criu swrk {p.pid}")
        assert procs.proc_paths(swrk.pid).cwd == str(work)
        report = sweep(world.ledger_root)
        assert {r.run: r for r in report.runs}[world.run].status == "swept"
        assert not procs.is_alive(swrk.pid), "criu swrk of the dead run survived"
        assert procs.is_alive(decoy.pid), "criu swrk naming s10 was killed"
        world.assert_run_gone()
        world.assert_decoys_intact()
    finally:
        ours.close()
        with contextlib.suppress(OSError):
            theirs.close()


def test_copies_of_mounts_the_engine_unmounted_itself_are_not_holders(world):
    """Destroy after root unmount: the daemon unmounted the run's mounts, then died. A mount namespace
    cloned while they existed (the s10 decoy) still holds private copies; recorded ``mount_key``s let the
    sweep know them for copies, so the decoy lives."""
    t = world.D / "t"
    for point in (t / "root", t):
        world.led.update("mount" if point == t else "session", str(point) if point == t else "s1",
                         mount_key=mounttable.mount_key(str(point)))
        mounttable.umount_detach(str(point))
    decoy = world.decoys["ns holder under s10"]
    assert _ns_has_mount(decoy, str(t))  # its private copy outlives the host's mount
    report = sweep(world.ledger_root)
    assert {r.run: r for r in report.runs}[world.run].status == "swept"
    assert report.mounts_unmounted == 1  # only /tmp/.criu.*/yard was left for the sweep
    world.assert_run_gone()
    world.assert_decoys_intact()
    assert sweep(world.ledger_root).is_noop()
