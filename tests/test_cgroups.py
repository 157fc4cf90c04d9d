"""Per-session cgroups (:mod:`drums_core.session.cgroups`) and the sweep of ``cgroup`` ledger entries.

Unit tests (no root): limits validation and the v1 mapping, names, parsing of ``memory.events`` /
``memory.oom_control`` on synthetic files, the sweep's shape checks (fail closed).

Root tests, real cgroups and real processes: a child allocating 200 MiB in a 64 MiB group is
OOM-killed; a fork loop stops at ``pids_max``; limits are written; create is idempotent; hostile
names change nothing; the v2 code path on whatever cgroup2 mount the host has (on a host whose
memory/pids/cpu are bound to v1 that is a v2 driver without those controllers: groups, membership,
``cgroup.freeze``, ``cgroup.kill``, ``cgroup.subtree_control``); the sweep reaps a recorded group
with live processes after a simulated crash (also when killed at its cgroup windows), spares a
protected process and refuses paths that are not cgroups. Every test removes what it made, also
when it fails.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drums_core.session import cgroups

from drums_core.host import linux, mounttable, procs
from drums_core.session.cgroups import GiB, MiB, Limits, SessionCgroup
from drums_core.errors import FailedPrecondition, InvalidArgument
from drums_core.sweep.ledger import Entry, Ledger
from drums_core.sweep import sweep
from drums_core.sweep.parts import parts_of
from tests.support import reaping
from tests.support.wait import wait_until

REPO = str(Path(__file__).resolve().parents[1])
pytestmark = pytest.mark.timeout(180)


def _run_id(label: str) -> str:
    return f"cgt{secrets.token_hex(4)}-{label}"


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it makes real cgroups and moves real processes into them")


class Host:
    """What a test made: groups and processes; ``close()`` kills and removes all of it."""

    def __init__(self) -> None:
        self.groups: list[SessionCgroup] = []
        self.popens: list[subprocess.Popen] = []
        self.runs: set[str] = set()
        self.helpers_before = reaping.descendants()  # other tests' helpers this process holds are not ours
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)

    def create(self, driver: cgroups.CgroupDriver, run: str, session: str = "s1",
               limits: Limits | None = None) -> SessionCgroup:
        self.runs.add(run)
        self.groups.append(driver.plan(run, session))
        return driver.create(run, session, limits)

    def spawn(self, argv: list[str], cg: SessionCgroup | None = None, **kw) -> subprocess.Popen:
        paths = cg.paths if cg is not None else None
        pre = (lambda: cgroups.enter(paths)) if paths else None
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=pre, **kw)
        self.popens.append(p)
        return p

    def close(self) -> None:
        errors = []
        for g in self.groups:
            with contextlib.suppress(FileNotFoundError):
                cgroups.kill_members(g.paths, 5.0)
        for p in self.popens:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=0.05)
        reaping.kill_new_descendants(self.helpers_before)
        for g in self.groups:
            try:
                g.remove(5.0)
            except Exception as exc:  # noqa: BLE001 - cleanup of a failed test: reported below
                errors.append(f"{g.name}: {exc}")
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 0)
        left = {r: paths for r, paths in cgroups.list_run_groups().items() if r in self.runs}
        assert not errors and not left, f"cleanup left cgroups: {errors} {left}"


@pytest.fixture
def host(request):
    _need_root()
    h = Host()
    request.addfinalizer(h.close)
    return h


@pytest.fixture
def driver():
    _need_root()
    return cgroups.detect()


def _v2_root() -> tuple[str, tuple[str, ...]]:
    """The host's cgroup2 mount and the required controllers it has (none where they are bound to v1)."""
    v2 = [h.mountpoint for h in cgroups.hierarchies() if h.version == 2]
    if not v2:
        pytest.fail("this host has no cgroup2 mount: the v2 code path cannot be exercised")
    root = sorted(v2, key=lambda m: m != "/sys/fs/cgroup")[0]
    have = set(Path(root, "cgroup.controllers").read_text().split())
    return root, tuple(c for c in cgroups.REQUIRED if c in have)


def _dead_ledger(root: Path, run: str, host: Host) -> Ledger:
    owner = host.spawn(["sleep", "600"])
    led = Ledger.create(root, run, pid=owner.pid)
    owner.kill()
    owner.wait()
    return led


# ---------------------------------------------------------------------------------------------
# unit: limits, names, parsing


def test_limits_defaults_and_v1_shares():
    lim = Limits()
    assert (lim.memory_max, lim.memory_high, lim.pids_max, lim.cpu_weight) == (4 * GiB, 3 * GiB, 2048, 100)
    assert lim.cpu_shares == 1024
    assert Limits(cpu_weight=1).cpu_shares == 10 and Limits(cpu_weight=10000).cpu_shares == 102400
    assert Limits(memory_max=64 * MiB).memory_high == 48 * MiB


@pytest.mark.parametrize("kw", [
    {"memory_max": 0}, {"memory_max": -1}, {"memory_max": True}, {"memory_max": "4G"}, {"memory_max": 1.5e9},
    {"memory_max": 1 * MiB}, {"memory_max": 64 * MiB, "memory_high": 128 * MiB}, {"memory_high": 0},
    {"pids_max": 0}, {"pids_max": 10 ** 9}, {"cpu_weight": 0}, {"cpu_weight": 10001}, {"cpu_weight": None},
])
def test_nonsense_limits_are_refused(kw):
    with pytest.raises(InvalidArgument) as ei:
        Limits(**kw)
    assert ei.value.reason == "BAD_LIMITS"


@pytest.mark.parametrize("run,session", [
    ("..", "s"), ("r", ".."), ("a/b", "s"), ("r", "x/../y"), ("", "s"), ("r", ""), ("r", "s\n"), (".r", "s"),
    ("r", "a" * 200),
])
def test_hostile_names_are_refused_without_root(run, session):
    with pytest.raises(InvalidArgument) as ei:
        cgroups.group_name(run, session)
    assert ei.value.reason == "INVALID_NAME"
    for bad in (f"drums/{run}/{session}", "drums/r", "other/r/s", "drums/r/s/t"):
        if bad != "drums/r/s":
            with pytest.raises(InvalidArgument):
                cgroups.parse_group_name(bad)
    assert cgroups.parse_group_name("drums/r-1/s.2") == ("r-1", "s.2")


def test_entering_a_group_that_does_not_exist_fails_the_spawn(host, driver):
    cg = driver.plan(_run_id("none"), "s1")
    with pytest.raises(subprocess.SubprocessError):
        host.spawn(["true"], cg)
    assert not cg.exists()


def test_oom_kills_and_memory_read_from_synthetic_files(tmp_path):
    v2 = tmp_path / "drums" / "r" / "s"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 12\nmax 40\noom 3\noom_kill 2\noom_group_kill 0\n")
    (v2 / "memory.current").write_text("73400320\n")
    g = SessionCgroup("drums/r/s", "v2", {"unified": str(v2)})
    assert g.oom_kills() == 2 and g.memory_current() == 73400320
    (v2 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    (v2 / "memory.usage_in_bytes").write_text("1048576\n")
    g1 = SessionCgroup("drums/r/s", "v1", {"memory": str(v2)})
    assert g1.oom_kills() == 5 and g1.memory_current() == 1 << 20
    assert cgroups.parse_keyed("populated 1\nfrozen 0\nbogus\nx y\n") == {"populated": 1, "frozen": 0}
    no_mem = SessionCgroup("drums/r/s", "v2", {"unified": str(v2)}, frozenset({"pids"}))
    with pytest.raises(FailedPrecondition):
        no_mem.oom_kills()


def test_check_group_dir_only_accepts_drums_groups_directly_under_a_cgroup_mount():
    from drums_core.host.mounttable import parse_mountinfo

    table = parse_mountinfo(
        "1 0 0:1 / / rw - ext4 /dev/root rw\n"
        "2 1 0:2 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "3 2 0:3 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "4 2 0:4 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "5 3 0:5 / /sys/fs/cgroup/memory/drums/r2 rw - tmpfs tmpfs rw\n")
    ok = cgroups.check_group_dir
    assert ok("/sys/fs/cgroup/memory/drums/r/s", table) is None
    assert ok("/sys/fs/cgroup/unified/drums/r/s", table) is None
    assert ok("/sys/fs/cgroup/drums/r/s", table)                 # tmpfs, not a cgroup
    assert ok("/sys/fs/cgroup/memory/x/drums/r/s", table)        # not directly under the mount
    assert ok("/sys/fs/cgroup/memory/drums/r2/s", table)         # something is mounted over it
    assert ok("/sys/fs/cgroup/memory/drums/../s", table)
    assert ok("/tmp/drums/r/s", table)
    h = cgroups.hierarchies(table)
    assert [(x.mountpoint, x.version, x.controllers) for x in h] == [
        ("/sys/fs/cgroup/memory", 1, frozenset({"memory"})), ("/sys/fs/cgroup/unified", 2, frozenset())]
    with pytest.raises(InvalidArgument):
        cgroups.detect(prefer="v3")


@pytest.mark.parametrize("key,data", [
    ("drums/r/s", {"driver": "v1", "paths": ["/sys/fs/cgroup/memory/drums/r/other"]}),
    ("drums/r/s", {"driver": "v3", "paths": ["/sys/fs/cgroup/memory/drums/r/s"]}),
    ("drums/r/s", {"driver": "v1", "paths": []}),
    ("drums/r/s", {"driver": "v1", "paths": "/sys/fs/cgroup/memory/drums/r/s"}),
    ("drums/r/s", {"driver": "v1", "paths": ["/sys/fs/cgroup/memory/../drums/r/s"]}),
    ("drums/r/s", {"driver": "v1", "paths": ["drums/r/s"]}),
    ("drums/../s", {"driver": "v1", "paths": ["/sys/fs/cgroup/memory/drums/../s"]}),
    ("r/s", {"driver": "v1", "paths": ["/sys/fs/cgroup/memory/r/s"]}),
])
def test_malformed_cgroup_entries_are_not_acted_on(key, data):
    with pytest.raises(ValueError):
        parts_of(Entry("cgroup", key, data))


def test_sweep_fails_closed_on_a_group_of_another_run_or_a_path_that_is_no_cgroup(tmp_path):
    """No root needed: nothing here is a real cgroup, and the sweep must not act on any of it."""
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
    kids: list[subprocess.Popen] = []
    try:
        root = tmp_path / "ledger"
        fake = tmp_path / "fake"
        run, other = _run_id("fc"), _run_id("fo")
        for r in (run, other):
            owner = subprocess.Popen(["sleep", "600"])
            Ledger.create(root, r, pid=owner.pid)
            owner.kill()
            owner.wait()
        # (1) a group named for another run: the whole run fails closed, its recorded process lives
        led = Ledger.open(root, other)
        victim = subprocess.Popen(["sleep", "600"])
        kids.append(victim)
        led.record("process", "p", pid=victim.pid, starttime=procs.starttime(victim.pid))
        led.record("cgroup", f"drums/{run}/s1", driver="v1", paths=[f"/sys/fs/cgroup/memory/drums/{run}/s1"])
        # (2) a well-formed entry whose directory is on a plain filesystem: reported, kept, not removed
        d = fake / "drums" / run / "s1"
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text(f"{os.getpid()}\n")
        Ledger.open(root, run).record("cgroup", f"drums/{run}/s1", driver="v1", paths=[str(d)], session="s1")

        report = sweep(root)
        by_run = {r.run: r for r in report.runs}
        assert by_run[other].status == "failed-closed", by_run[other]
        assert procs.is_alive(victim.pid)
        assert by_run[run].status == "incomplete", by_run[run]
        assert any("not directly under a cgroup mount" in e for e in by_run[run].errors), by_run[run].errors
        assert d.is_dir() and Ledger.open(root, run).get("cgroup", f"drums/{run}/s1") is not None
        assert by_run[run].processes_killed == 0 and by_run[run].cgroups_removed == 0
    finally:
        for p in kids:
            p.kill()
            p.wait()
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 0)


# ---------------------------------------------------------------------------------------------
# root: real groups, real processes


def test_detect_on_this_host(driver):
    assert driver.version in ("v1", "v2")
    for r in driver.roots():
        assert r in cgroups.cgroup_mountpoints(mounttable.read_mountinfo())
    if driver.version == "v1":
        assert set(cgroups.REQUIRED) <= set(driver.mounts)
        root, have = _v2_root()
        if set(have) != set(cgroups.REQUIRED):
            with pytest.raises(FailedPrecondition) as ei:
                cgroups.detect(prefer="v2")
            assert ei.value.reason == "CGROUP_UNAVAILABLE"
            assert all(c in ei.value.message for c in set(cgroups.REQUIRED) - set(have)), ei.value.message
    assert cgroups.detect(prefer=driver.version).version == driver.version


def test_a_child_over_its_memory_limit_is_oom_killed(host, driver):
    cg = host.create(driver, _run_id("oom"), limits=Limits(memory_max=64 * MiB, memory_high=48 * MiB))
    assert cg.oom_kills() == 0
    t0 = time.monotonic()
    child = host.spawn([sys.executable, "-c", "x = b'\\x01' * (200 << 20); print('survived', len(x))"], cg,
                       stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    seconds = time.monotonic() - t0
    assert child.returncode == -signal.SIGKILL, (child.returncode, out)
    assert b"survived" not in out
    assert cg.oom_kills() >= 1
    print(f"\nOOM: child killed {seconds:.3f}s after start, oom_kills={cg.oom_kills()}")
    assert cg.pids() == []
    cg.remove()
    assert not any(os.path.lexists(p) for p in cg.paths)


FORK_LOOP = r"""
import errno, os, sys, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as exc:
        print(n, errno.errorcode[exc.errno], flush=True)
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    n += 1
time.sleep(600)
"""


def test_a_fork_loop_stops_at_pids_max_and_the_host_stays_responsive(host, driver):
    cg = host.create(driver, _run_id("fork"), limits=Limits(pids_max=32))
    loop = host.spawn([sys.executable, "-c", FORK_LOOP], cg, stdout=subprocess.PIPE, text=True)
    line = wait_until(lambda: loop.stdout.readline(), 30, "the fork loop to hit its limit")
    forks, err = line.split()
    assert err == "EAGAIN" and int(forks) == 31, line     # 32 tasks: the loop and its 31 children
    assert len(cg.pids()) == 32
    t0 = time.monotonic()
    subprocess.run(["true"], check=True, timeout=10)      # the host still forks
    print(f"\nfork loop: {forks} forks then {err}; host fork+exec took {time.monotonic() - t0:.3f}s")
    killed = cg.kill_all(10)
    assert killed == 32 and cg.pids() == []
    loop.wait(timeout=10)
    cg.remove()
    assert not any(os.path.lexists(p) for p in cg.paths)
    assert cg.run not in cgroups.list_run_groups()
    assert not any(os.path.lexists(os.path.dirname(p)) for p in cg.paths), "empty drums/<run> left"


def _limit_files(cg: SessionCgroup) -> dict[str, str]:
    if cg.driver == "v1":
        files = {"memory": ["memory.limit_in_bytes", "memory.soft_limit_in_bytes", "memory.use_hierarchy"],
                 "pids": ["pids.max"], "cpu": ["cpu.shares"]}
        out = {f: Path(cg.dirs[role], f).read_text().strip() for role, fs in files.items() for f in fs}
        out["oom_kill_disable"] = str(cgroups.parse_keyed(Path(cg.dirs["memory"], "memory.oom_control")
                                                          .read_text())["oom_kill_disable"])
        return out
    d = cg.dirs["unified"]
    return {f: Path(d, f).read_text().strip() for f in ("memory.max", "memory.high", "pids.max", "cpu.weight")}


def test_limits_are_written_and_create_is_idempotent(host, driver):
    run = _run_id("lim")
    lim = Limits(memory_max=128 * MiB, memory_high=96 * MiB, pids_max=100, cpu_weight=250)
    cg = host.create(driver, run, limits=lim)
    want = ({"memory.limit_in_bytes": str(128 * MiB), "memory.soft_limit_in_bytes": str(96 * MiB),
             "memory.use_hierarchy": "1", "pids.max": "100", "cpu.shares": "2560", "oom_kill_disable": "0"}
            if cg.driver == "v1" else
            {"memory.max": str(128 * MiB), "memory.high": str(96 * MiB), "pids.max": "100", "cpu.weight": "250"})
    assert _limit_files(cg) == want
    sleeper = host.spawn(["sleep", "600"])
    cg.attach(sleeper.pid)
    assert cg.pids() == [sleeper.pid]
    again = driver.create(run, "s1", lim)
    assert again == cg and again.paths == cg.paths and _limit_files(cg) == want
    assert cg.pids() == [sleeper.pid]                    # a second create moves nobody out
    driver.create(run, "s1", Limits(memory_max=256 * MiB, pids_max=200, cpu_weight=50))
    assert _limit_files(cg)["pids.max"] == "200"
    assert cgroups.SessionCgroup.from_record(cg.name, cg.ledger_data()).paths == cg.paths
    assert cg.kill_all() == 1
    sleeper.wait(timeout=10)
    cg.remove()
    assert not cg.exists()


def _groups_but_the_suites() -> dict[str, list[str]]:
    """The host's Drums groups but those of the suite's daemons (runs named pytest-<pid>-..., which
    the other xdist workers create and remove while this test runs)."""
    return {run: paths for run, paths in cgroups.list_run_groups().items() if not run.startswith("pytest-")}


@pytest.mark.parametrize("run,session", [("..", "s"), ("r", ".."), ("a/b", "s"), ("r", "x/../y"), ("", "s")])
def test_hostile_names_create_nothing(driver, run, session):
    before = _groups_but_the_suites()
    for call in (driver.plan, driver.create):
        with pytest.raises(InvalidArgument) as ei:
            call(run, session)
        assert ei.value.reason == "INVALID_NAME"
    assert _groups_but_the_suites() == before


def test_v2_code_path_on_the_hosts_cgroup2_mount(host):
    """What of v2 runs for real here depends on the host: on a v2 host everything, limits included;
    on a hybrid host (memory/pids/cpu bound to v1) groups, membership, freeze, kill, subtree_control
    (with the one controller the mount has, if any), from_record and removal."""
    _need_root()
    root, have = _v2_root()
    spare = sorted(set(Path(root, "cgroup.controllers").read_text().split()) - set(cgroups.REQUIRED))
    extra = tuple(spare[:1]) if not have else ()      # e.g. hugetlb: exercises subtree_control for real
    before = Path(root, "cgroup.subtree_control").read_text().split()
    drv = cgroups.CgroupV2Driver(root, controllers=have + extra)
    run = _run_id("v2")
    try:
        cg = host.create(drv, run, limits=Limits(memory_max=64 * MiB, pids_max=64))
        assert cg.paths == [f"{root}/drums/{run}/s1"] and cg.driver == "v2"
        for d in (root, f"{root}/drums", f"{root}/drums/{run}"):
            assert set(have + extra) <= set(Path(d, "cgroup.subtree_control").read_text().split()), d
        tree = host.spawn(["sh", "-c", "sleep 600 & sleep 600 & wait"], cg)
        wait_until(lambda: len(cg.pids()) == 3, 10, "sh and two sleeps in the v2 group")
        late = host.spawn(["sleep", "600"])
        cg.attach(late.pid)
        assert late.pid in cg.pids() and tree.pid in cg.pids()
        nested = Path(cg.paths[0], "inner")       # a group the session made itself
        nested.mkdir()
        Path(nested, "cgroup.procs").write_text(str(late.pid))
        assert late.pid in cg.pids()
        same = SessionCgroup.from_record(cg.name, cg.ledger_data())
        assert same.paths == cg.paths and same.driver == "v2"
        assert same.controllers == frozenset(have)
        assert cg.kill_all(10) == 4 and cg.pids() == []
        tree.wait(timeout=10)
        late.wait(timeout=10)
        cg.remove()
        assert not os.path.lexists(cg.paths[0]) and not os.path.lexists(f"{root}/drums/{run}")
        if not have:
            with pytest.raises(FailedPrecondition):
                cg.memory_current()
    finally:
        for c in extra:   # give the host its subtree_control back where this test changed it
            if c not in before:
                for d in (f"{root}/drums", root):
                    with contextlib.suppress(OSError):
                        Path(d, "cgroup.subtree_control").write_text("-" + c)
    assert Path(root, "cgroup.subtree_control").read_text().split() == before or not extra


# ---------------------------------------------------------------------------------------------
# the sweep


def _drivers() -> list[str]:
    return ["detected", "v2-mount"]


def _driver(kind: str) -> cgroups.CgroupDriver:
    if kind == "detected":
        return cgroups.detect()
    root, have = _v2_root()
    return cgroups.CgroupV2Driver(root, controllers=have)


class Crash:
    """A dead run whose ledger recorded a cgroup (as the supervisor does: record, then create), with a
    process tree in it; plus a decoy outside any group and a live run with its own group."""

    def __init__(self, host: Host, tmp: Path, kind: str) -> None:
        self.host = host
        self.root = tmp / "ledger"
        self.driver = _driver(kind)
        self.run = _run_id("dead")
        self.led = _dead_ledger(self.root, self.run, host)
        self.cg = self.driver.plan(self.run, "s1")
        self.led.record("cgroup", self.cg.name, **self.cg.ledger_data())
        host.create(self.driver, self.run, "s1", Limits(memory_max=128 * MiB, pids_max=64))
        self.tree = host.spawn(["sh", "-c", "sleep 600 & sleep 600 & wait"], self.cg)
        wait_until(lambda: len(self.cg.pids()) == 3, 10, "three processes in the dead run's group")
        self.members = self.cg.pids()
        self.decoy = host.spawn(["sleep", "600"])
        self.live_run = _run_id("live")
        live_owner = host.spawn(["sleep", "600"])
        self.live = Ledger.create(self.root, self.live_run, pid=live_owner.pid)
        self.live_cg = self.driver.plan(self.live_run, "s1")
        self.live.record("cgroup", self.live_cg.name, **self.live_cg.ledger_data())
        host.create(self.driver, self.live_run, "s1")
        self.live_proc = host.spawn(["sleep", "600"], self.live_cg)
        wait_until(lambda: self.live_cg.pids() == [self.live_proc.pid], 10, "the live run's process in its group")

    def assert_gone(self) -> None:
        assert not any(procs.is_alive(pid) for pid in self.members), "a process of the dead run's group survived"
        for p in self.cg.paths:
            assert not os.path.lexists(p) and not os.path.lexists(os.path.dirname(p)), p
        assert self.run not in cgroups.list_run_groups()
        assert not self.led.path.exists()

    def assert_decoys(self, *also_live: int) -> None:
        assert procs.is_alive(self.decoy.pid) and procs.is_alive(self.live_proc.pid)
        assert self.live_cg.pids() == sorted([self.live_proc.pid, *also_live])
        assert self.live.get("cgroup", self.live_cg.name) is not None


@pytest.mark.parametrize("kind", _drivers())
def test_sweep_reaps_a_recorded_cgroup_after_a_crash(host, tmp_path, kind):
    _need_root()
    w = Crash(host, tmp_path, kind)
    dry = sweep(w.root, dry_run=True)
    d = {r.run: r for r in dry.runs}[w.run]
    assert d.status == "dry-run" and d.processes_killed == 3 and d.cgroups_removed == len(w.cg.paths), d
    assert w.cg.pids() == w.members and all(os.path.isdir(p) for p in w.cg.paths)
    report = sweep(w.root)
    rr = {r.run: r for r in report.runs}[w.run]
    assert rr.status == "swept", rr
    assert rr.processes_killed == 3 and rr.cgroups_removed == len(w.cg.paths), rr
    assert report.errors == 0 and report.survivors == 0
    w.tree.wait(timeout=10)
    w.assert_gone()
    w.assert_decoys()
    assert sweep(w.root).is_noop()


@pytest.mark.parametrize("window", ["sweep-before-cgroup-remove", "sweep-after-cgroup-remove"])
def test_sweep_killed_at_its_cgroup_windows_then_rerun(host, tmp_path, window):
    _need_root()
    w = Crash(host, tmp_path, "detected")
    env = {**os.environ, "DRUMS_FAULT_AT": window, "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-m", "drums_core.sweep", "--ledger", str(w.root), "--run", w.run,
                          "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr)
    w.tree.wait(timeout=10)
    assert not any(procs.is_alive(pid) for pid in w.members)
    assert all(os.path.isdir(p) for p in w.cg.paths) == (window == "sweep-before-cgroup-remove")
    assert w.led.get("cgroup", w.cg.name) is not None
    report = sweep(w.root)
    rr = {r.run: r for r in report.runs}[w.run]
    assert rr.status == "swept" and report.errors == 0, rr
    assert rr.cgroups_removed == (len(w.cg.paths) if window == "sweep-before-cgroup-remove" else 0)
    w.assert_gone()
    w.assert_decoys()
    assert sweep(w.root).is_noop()


def test_sweep_leaves_a_protected_process_and_its_group_alone(host, tmp_path):
    """The live run's owner moved into the dead run's group: the sweep must not kill it, so the group
    cannot go; the entry stays and the run is reported, then a later sweep finishes the job."""
    _need_root()
    w = Crash(host, tmp_path, "detected")
    owner = w.live.owner()["pid"]
    w.cg.attach(owner)
    report = sweep(w.root)
    rr = {r.run: r for r in report.runs}[w.run]
    assert rr.status == "incomplete", rr
    assert any(f"protected process {owner}" in e for e in rr.errors), rr.errors
    assert procs.is_alive(owner) and owner in w.cg.pids()
    assert all(os.path.isdir(p) for p in w.cg.paths) and w.led.get("cgroup", w.cg.name) is not None
    assert not any(procs.is_alive(pid) for pid in w.members)   # the others went
    w.live_cg.attach(owner)
    report = sweep(w.root)
    assert {r.run: r for r in report.runs}[w.run].status == "swept"
    w.tree.wait(timeout=10)
    w.assert_gone()
    w.assert_decoys(owner)
