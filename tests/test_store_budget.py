"""The snapshot store's byte budget (drums_core.store.budget): eviction order, what is never evicted,
spilling to disk, STORE_FULL, crashes in the middle of an eviction or a spill, and how it is reported.

Two levels:

* the keeper over a real :class:`SnapshotStore` whose snapshot directories the test writes itself
  (sizes and last uses chosen, so the expected order follows from them); crash windows there kill a
  real process with SIGKILL at the named point (``DRUMS_FAULT_AT``), then the store recovers;
* a real daemon with a budget derived from the size of a real desktop's snapshot: evictions,
  spills and refusals as a checkpoint meets them, the daemon's answer, ``drums snapshots``, and a
  daemon killed mid-eviction whose successor restores only what is whole.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from drums_core.config import Instance
from drums_core.errors import FailedPrecondition, NotFound, Unavailable
from drums_core.host.procs import boot_id, is_alive
from drums_core.store.snapshots import LAST_USED, MANIFEST, Snapshot, SnapshotStore, write_atomic
from drums_core.store.budget import BudgetConfig, StoreKeeper, parse_size

from tests.support.wait import wait_until
from tests.support.suite import instance_env
from tests.support.storelib import clear, store_daemon

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
XTERM = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", "budgetwin"]}],
         "expect_window": "budgetwin"}


# ------------------------------------------------------------------------------ a store written by hand
class Fab:
    """A real store (and spill directory) under ``root`` with snapshots written the way ``finish`` lays
    them out: images of a given size, a layer, the manifest, the commit marker, a last use."""

    def __init__(self, root: Path, budget_mib: int, spill: bool = True) -> None:
        self.root = root
        self.spill_root = root / "spill" if spill else None
        self.store = SnapshotStore(root / "snapshots", spill_root=self.spill_root)
        self.layers: set[str] = set()   # what "live sessions" stack on
        self.ids: set[str] = set()
        self.config = BudgetConfig(budget=budget_mib * MiB, source="test", spill_root=self.spill_root,
                                   mem_floor=0, disk_reserve=0)
        self.keeper = self.new_keeper()

    def new_keeper(self) -> StoreKeeper:
        return StoreKeeper(self.store, self.config, lambda: (set(self.layers), set(self.ids)),
                           self.root / "journal.jsonl")

    def snap(self, sid: str, mib: int, retention: str, last_used: float, parent: Snapshot | None = None) -> Snapshot:
        d = self.store.path(sid)
        (d / "images").mkdir(parents=True)
        (d / "layer" / "home").mkdir(parents=True)
        (d / "layer" / "home" / "note").write_text(sid)
        with open(d / "images" / "pages-1.img", "wb") as f:
            f.truncate(mib * MiB)
        (d / "images" / "core-1.img").write_bytes(sid.encode() * 10)
        files = {p.name: p.stat().st_size for p in (d / "images").iterdir()}
        snap = Snapshot(id=sid, name=f"name-{sid}", scope="test", session="s", image="default",
                        layers=[str(d / "layer")] + (parent.layers if parent else []),
                        parent=parent.id if parent else None, created=last_used - 1, boot_id=boot_id(),
                        size=mib * MiB + files["core-1.img"], params={}, files=files, retention=retention)
        write_atomic(d / MANIFEST, json.dumps(snap.to_dict()))
        self.store.commit(sid)
        (d / LAST_USED).touch()
        os.utime(d / LAST_USED, (last_used, last_used))
        return snap

    def listed(self) -> dict[str, str]:
        """id -> where (memory/disk) of every snapshot the store serves; each one verifies whole."""
        out = {}
        for s in self.store.list():
            self.store.verify(s)
            assert (self.store.path(s.id) / "layer" / "home" / "note").read_text() == s.id
            out[s.id] = "disk" if self.store.is_spilled(s.id) else "memory"
        return out

    def debris(self) -> list[str]:
        """Anything half-done left in the store or the spill directory."""
        left = [p.name for p in self.store.root.iterdir() if p.name.startswith((".rm-", ".spill-"))]
        if self.spill_root is not None and self.spill_root.exists():
            linked = {os.readlink(p) for p in self.store.root.iterdir() if p.is_symlink()}
            left += [f"spill/{p.name}" for p in self.spill_root.iterdir() if str(p) not in linked]
        return left


def test_parse_size():
    assert parse_size("400m") == 400 * MiB
    assert parse_size("1.5GiB") == 3 * 512 * MiB
    assert parse_size("123") == 123
    assert parse_size("75%", whole=1000) == 750
    for bad in ("", "lots", "-1m", "120%", "0%"):
        with pytest.raises(Exception) as exc:
            parse_size(bad, whole=1000)
        assert getattr(exc.value, "reason", None) == "BAD_SIZE", bad


def test_eviction_is_lru_and_cache_states_go_before_any_pinned_one_is_spilled(tmp_path):
    fab = Fab(tmp_path, budget_mib=100)
    now = time.time()
    ages = {"ca": 50, "cb": 10, "cc": 30, "pp": 100, "pq": 60}   # seconds since last use
    for sid, age in ages.items():
        fab.snap(sid, 10, "cache" if sid.startswith("c") else "pinned", now - age)
    # 50 MiB used, 65 more needed, budget 100: 15 MiB must go; the two least recently used cache
    # states, although a pinned one (pp) was used even longer ago
    moved = fab.keeper.make_room(65 * MiB, for_id="new1")
    cache_by_lru = sorted((s for s in ages if s.startswith("c")), key=lambda s: -ages[s])
    assert [(a["action"], a["id"]) for a in moved] == [("evicted", cache_by_lru[0]), ("evicted", cache_by_lru[1])]
    assert fab.listed() == {"cb": "memory", "pp": "memory", "pq": "memory"}
    assert fab.keeper.release("new1") == moved
    # 30 MiB left in memory and 95 needed: the last cache state goes, then pinned ones are spilled, LRU first
    moved = fab.keeper.make_room(95 * MiB, for_id="new2")
    pinned_by_lru = sorted((s for s in ages if s.startswith("p")), key=lambda s: -ages[s])
    assert [(a["action"], a["id"]) for a in moved] == [("evicted", "cb"), ("spilled", pinned_by_lru[0]),
                                                       ("spilled", pinned_by_lru[1])]
    assert fab.listed() == {"pp": "disk", "pq": "disk"}  # served from disk, whole
    assert fab.debris() == []
    journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [(e["action"], e["id"]) for e in journal] == [("evicted", "ca"), ("evicted", "cc"), ("evicted", "cb"),
                                                         ("spilled", "pp"), ("spilled", "pq")]
    status = fab.keeper.status()
    assert (status["used"], status["on_disk"], status["evicted"], status["spilled_total"]) == (
        0, sum(fab.store.get(s).size for s in ("pp", "pq")), 3, 2)
    # an evicted state: a lookup says it was evicted; a deleted spilled one leaves nothing on disk
    with pytest.raises(NotFound) as exc:
        with fab.keeper.hold("ca"):
            pass
    assert exc.value.detail["evicted"]["id"] == "ca" and "evicted" in exc.value.message
    fab.keeper.delete("pp")
    assert fab.listed() == {"pq": "disk"} and sorted(p.name for p in fab.spill_root.iterdir()) == ["pq"]


def test_never_evicted_held_used_parents_or_pinned_and_store_full_moves_nothing(tmp_path):
    fab = Fab(tmp_path, budget_mib=40, spill=False)
    now = time.time()
    parent = fab.snap("parent", 10, "cache", now - 100)
    fab.snap("child", 10, "cache", now - 5, parent=parent)    # stacks on parent's layer
    fab.snap("held", 10, "cache", now - 200)
    used = fab.snap("used", 10, "cache", now - 300)
    fab.snap("pinned", 10, "pinned", now - 400)
    fab.layers.add(used.layers[0])                              # a live session restored from "used"
    before = fab.listed()
    with fab.keeper.hold("held"):
        # 50 MiB used, budget 40, 30 needed: 40 MiB must go and only child + parent (20) may
        with pytest.raises(Unavailable) as exc:
            fab.keeper.make_room(30 * MiB, for_id="x")
        assert exc.value.reason == "STORE_FULL"
        kept = exc.value.detail["kept"]
        assert kept["held"]["why"] == "held by an operation"
        assert kept["used"]["why"] == "in use by a session"
        assert kept["pinned"]["why"] == "pinned, and spilling is off"
        assert kept["parent"]["why"].endswith("stack on it")
        assert exc.value.detail["freeable"] == fab.store.get("parent").size + fab.store.get("child").size
        assert fab.listed() == before and not (tmp_path / "journal.jsonl").exists()  # nothing moved
        assert fab.keeper.status()["store_full"] == 1
        # ~19 MiB to free: the child goes first, though the parent was used longer ago, then the parent
        moved = fab.keeper.make_room(9 * MiB, for_id="y")
        assert [a["id"] for a in moved] == ["child", "parent"]
    assert fab.listed() == {"held": "memory", "used": "memory", "pinned": "memory"}
    with pytest.raises(FailedPrecondition):
        fab.keeper.delete("used")
    with pytest.raises(FailedPrecondition) as exc:
        fab.keeper.spill_now("pinned")
    assert exc.value.reason == "SPILL_DISABLED"


CRASH_SCRIPT = textwrap.dedent('''\
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from drums_core.store.snapshots import SnapshotStore
    from drums_core.store.budget import BudgetConfig, StoreKeeper
    root = Path({root!r})
    store = SnapshotStore(root / "snapshots", spill_root=root / "spill")
    cfg = BudgetConfig(budget={budget}, source="test", spill_root=root / "spill", mem_floor=0, disk_reserve=0)
    keeper = StoreKeeper(store, cfg, lambda: (set(), set()), root / "journal.jsonl")
    print(json.dumps(keeper.make_room({need}, for_id="crash")))
''')

CRASH_WINDOWS = ["evict-before-retire", "evict-retired", "purge-mid-delete", "spill-mid-copy", "spill-copied",
                 "spill-swapped"]


@pytest.mark.parametrize("window", CRASH_WINDOWS)
def test_crash_mid_eviction_or_spill_leaves_a_consistent_store(tmp_path, window):
    """SIGKILL at each step of an eviction or a spill; then the store recovers: the victim is whole (in
    memory or on disk) or gone, never half there; nothing of the move is left; a further move works."""
    spilling = window.startswith("spill")
    fab = Fab(tmp_path, budget_mib=30)
    now = time.time()
    fab.snap("victim", 12, "pinned" if spilling else "cache", now - 100)
    fab.snap("other", 12, "pinned", now - 10)
    script = CRASH_SCRIPT.format(repo=str(REPO), root=str(tmp_path), budget=30 * MiB, need=10 * MiB)
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "DRUMS_FAULT_AT": window},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, f"not killed at {window}: rc {out.returncode} {out.stdout} {out.stderr[-2000:]}"
    report = SnapshotStore(fab.store.root, spill_root=fab.spill_root).recover()
    print(window, report)
    assert fab.debris() == []
    listed = fab.listed()  # every snapshot served verifies, its layer readable
    if spilling:
        assert set(listed) == {"victim", "other"}
        assert listed["victim"] == ("disk" if window == "spill-swapped" else "memory")
    else:
        assert set(listed) == ({"victim", "other"} if window == "evict-before-retire" else {"other"})
        if window != "evict-before-retire":
            with pytest.raises(NotFound):
                fab.store.resolve("victim")
    # the next daemon's keeper carries on: the eviction or spill happens now, completely
    keeper = fab.new_keeper()
    moved = keeper.make_room(10 * MiB, for_id="after")
    assert [a["id"] for a in moved] == ([] if listed.get("victim") == "disk" or "victim" not in listed
                                        else ["victim"])
    assert fab.debris() == []
    fab.listed()


def test_spilled_snapshot_packs_from_disk(tmp_path):
    """A bundle of a spilled snapshot (drums_core.store.transfer) carries its files from the spill directory."""
    from drums_core.store import transfer

    fab = Fab(tmp_path, budget_mib=100)
    fab.snap("ondisk", 2, "pinned", time.time())
    assert fab.keeper.spill_now("ondisk")["action"] == "spilled"
    bundle = transfer.pack(fab.store, "ondisk", tmp_path / "out" / "b.tar")
    names = subprocess.run(["tar", "--list", "--file", str(tmp_path / "out" / "b.tar")], capture_output=True,
                           text=True, check=True).stdout.split()
    assert "ondisk/images/pages-1.img" in names and "ondisk/layer/home/note" in names, names
    assert not any(n.endswith(LAST_USED) for n in names) and bundle.to_dict()["bytes"] > 0
    # the images' content travels (sparse files as their data and holes: this one is a 2 MiB hole)
    out = tmp_path / "out" / "x"
    out.mkdir()
    subprocess.run(["tar", "--extract", "--file", str(tmp_path / "out" / "b.tar"), "-C", str(out)], check=True)
    assert (out / "ondisk/images/pages-1.img").stat().st_size == 2 * MiB


# ------------------------------------------------------------------------------ a real daemon
@pytest.fixture(scope="module")
def budget_instance():
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, require_root, stop_instance

    require_root()
    inst = Instance(name=f"budget-{os.getpid()}", slot_base=SPARE_SLOTS[8], slot_count=8)
    spill = Path("/var/lib/drums/spill") / inst.name
    yield inst
    stop_instance(inst)
    shutil.rmtree(spill, ignore_errors=True)
    leaks = instance_leaks(inst)
    assert not any(leaks.values()), leaks


def _drums(inst: Instance, *argv: str) -> subprocess.CompletedProcess:
    env = instance_env(inst)
    return subprocess.run([sys.executable, "-m", "drums_core.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=True)


def _one_snapshot_size(inst: Instance) -> int:
    """The size of one xterm desktop's snapshot here (the budgets below are multiples of it)."""
    c = store_daemon(inst)
    clear(c)
    s = c.create(XTERM)
    size = c.checkpoint(s["id"], name="probe")["size"]
    clear(c)
    return size


def test_daemon_evicts_spills_refuses_and_reports(budget_instance):
    inst = budget_instance
    size = _one_snapshot_size(inst)
    spill_dir = Path("/var/lib/drums/spill") / inst.name
    budget = int(3.5 * size)
    c = store_daemon(inst, DRUMS_STORE_BUDGET=str(budget), DRUMS_SPILL_DIR=str(spill_dir))
    try:
        before = c.store()
        made = []
        answers = []
        for i in range(8):  # three cache states, then five pinned ones, each of its own desktop
            s = c.create(XTERM)
            snap = c.checkpoint(s["id"], name=f"b{i}", cache=i < 3)
            made.append(snap)
            answers.append(snap["store"]["actions"])
            status = c.store()
            print(i, snap["retention"], snap["size"] >> 20, "MiB;", [(a["action"], a["name"]) for a in
                                                                     snap["store"]["actions"]],
                  f"store {status['used'] >> 20}/{status['budget'] >> 20} MiB, {status['on_disk'] >> 20} on disk")
            assert status["used"] <= status["budget"], status
        moved = [(a["action"], a["name"]) for acts in answers for a in acts]
        # the cache states went first, oldest first, and only then were pinned ones spilled (oldest first)
        evicted = [n for act, n in moved if act == "evicted"]
        spilled = [n for act, n in moved if act == "spilled"]
        assert evicted == [f"b{i}" for i in range(len(evicted))] and evicted, moved
        assert len(evicted) == 3 and spilled and spilled == [f"b{3 + i}" for i in range(len(spilled))], moved
        listing = {s["name"]: s for s in c.snapshots()}
        assert set(listing) == {f"b{i}" for i in range(8)} - set(evicted)
        assert all(listing[n]["location"] == "disk" for n in spilled)
        # a spilled state restores, from disk, and runs
        target = spilled[0]
        (r,) = c.restore(target, wait_live=True)
        assert c.exec(r["id"], ["true"])["returncode"] == 0
        assert any("budgetwin" in w["title"] for w in c.windows(r["id"]) if w["mapped"])
        with pytest.raises(FailedPrecondition):  # in use now: neither evicted, spilled nor deleted
            c.delete_snapshot(target)
        c.destroy(r["id"])
        # an evicted one: restoring it says so
        with pytest.raises(NotFound) as exc:
            c.restore(made[0]["id"])
        assert exc.value.detail["evicted"]["name"] == "b0", exc.value
        # reported: drums snapshots (budget, use, evictions) as text and JSON
        text = _drums(inst, "snapshots").stdout
        print(text)
        assert f"of {budget / MiB:.0f} MiB budget" in text and "evicted" in text and "b0" in text
        js = json.loads(_drums(inst, "--json", "snapshots").stdout)
        assert js["store"]["budget"] == budget and js["store"]["evicted"] - before["evicted"] == len(evicted)
        assert js["store"]["spilled_total"] - before["spilled_total"] == len(spilled)
        assert [(e["action"], e["name"]) for e in js["store"]["recent"][-len(moved):]] == moved
        assert {s["name"] for s in js["snapshots"]} == set(listing)
    finally:
        clear(c)
    assert not spill_dir.exists() or list(spill_dir.iterdir()) == []


def test_store_full_when_nothing_can_be_evicted_leaves_the_session_running(budget_instance):
    inst = budget_instance
    size = _one_snapshot_size(inst)
    c = store_daemon(inst, DRUMS_STORE_BUDGET=str(int(2.5 * size)), DRUMS_SPILL_DIR="off")
    try:
        evicted_before = c.store()["evicted"]
        a = c.create(XTERM)
        c.checkpoint(a["id"], name="pinned-a")      # pinned, and spilling is off
        b = c.create(XTERM)
        kept = c.checkpoint(b["id"], name="cache-b", cache=True)
        (b,) = c.restore(kept["id"])
        # b runs on from cache-b (in use), pinned-a is pinned: nothing can go
        with pytest.raises(Unavailable) as exc:
            c.checkpoint(b["id"], name="third")
        assert exc.value.reason == "STORE_FULL", exc.value
        assert {v["why"] for v in exc.value.detail["kept"].values()} == {"in use by a session",
                                                                         "pinned, and spilling is off"}
        assert kept["id"] in exc.value.detail["kept"]
        print(exc.value.message)
        # nothing happened: the session runs on, no snapshot went, none was half made
        assert c.get(b["id"])["state"] == "RUNNING" and c.exec(b["id"], ["true"])["returncode"] == 0
        assert sorted(s["name"] for s in c.snapshots()) == ["cache-b", "pinned-a"]
        assert list((inst.snapshots_dir / ".staging").iterdir()) == []
        assert c.store()["store_full"] == 1 and c.store()["evicted"] == evicted_before
        # once the session is gone its cache state may go, and the next checkpoint fits
        c.destroy(b["id"])
        d = c.create(XTERM)
        snap = c.checkpoint(d["id"], name="fourth")
        assert [(x["action"], x["name"]) for x in snap["store"]["actions"]] == [("evicted", "cache-b")]
    finally:
        clear(c)


@pytest.mark.parametrize("window", ["evict-retired", "purge-mid-delete"])
def test_daemon_killed_mid_eviction_then_its_successor_serves_only_whole_snapshots(budget_instance, window):
    inst = budget_instance
    size = _one_snapshot_size(inst)
    budget = str(int(2.5 * size))
    c = store_daemon(inst, DRUMS_STORE_BUDGET=budget, DRUMS_SPILL_DIR="off")
    try:
        old = c.create(XTERM)
        victim = c.checkpoint(old["id"], name="victim", cache=True)
        keep = c.checkpoint(c.create(XTERM)["id"], name="keep")
        faulty = store_daemon(inst, DRUMS_STORE_BUDGET=budget, DRUMS_SPILL_DIR="off", DRUMS_FAULT_AT=window)
        pid = faulty.ping()["pid"]
        s = faulty.create(XTERM)
        with pytest.raises(Unavailable) as exc:
            faulty.checkpoint(s["id"], name="needs-room")
        assert exc.value.reason == "DAEMON_DIED", exc.value
        # dead, not gone: the daemon is this process's child, a zombie until reaped
        wait_until(lambda: not is_alive(pid), 15, f"daemon {pid} to die")
        retired = inst.snapshots_dir / f".rm-{victim['id']}"
        assert retired.exists() and not (inst.snapshots_dir / victim["id"]).exists()
        if window == "purge-mid-delete":
            assert not (retired / "images").exists() and (retired / "layer").exists()  # really half deleted
        c = store_daemon(inst, DRUMS_STORE_BUDGET=budget, DRUMS_SPILL_DIR="off")  # recovers and adopts the session
        assert not retired.exists()
        assert sorted(x["name"] for x in c.snapshots()) == ["keep"]
        with pytest.raises(NotFound):
            c.restore("victim")
        (r,) = c.restore(keep["id"], wait_live=True)
        assert c.exec(r["id"], ["true"])["returncode"] == 0
        # the checkpoint that was cut short can be made now (the adopted session ran on)
        assert [x["id"] for x in c.list()] and c.get(s["id"])["state"] == "RUNNING"
        snap = c.checkpoint(s["id"], name="needs-room")
        assert snap["state"] == "committed"
    finally:
        clear(c)


def test_gym_env_goes_on_unsaved_when_the_store_is_full(budget_instance):
    """The gym env in post_setup mode: a store with no room (STORE_FULL) leaves the episode going on
    unsaved (it scores as it should) and the next reset sets the task up again."""
    from drums_osworld.gym.env import DrumsDesktopEnv
    from drums_osworld.tasks import load_task

    c = store_daemon(budget_instance, DRUMS_STORE_BUDGET="8m", DRUMS_SPILL_DIR="off")  # below any desktop's need
    path = REPO / "tasks" / "os" / "drums-os-make-executable.json"
    env = DrumsDesktopEnv(task=path, reuse="post_setup", client=c, pause=0.2)
    try:
        for _ in range(2):
            _obs, info = env.reset(seed=0)
            assert (info["source"], info.get("post_setup_unsaved")) == ("setup", "STORE_FULL"), info
            assert env.evaluate() == 0.0
            for action in [*load_task(path).solution, "DONE"]:
                _obs, reward, terminated, _truncated, info = env.step(action)
            assert terminated and reward == 1.0, info
        assert c.snapshots() == [] and c.store()["store_full"] == 2
    finally:
        env.close()
        clear(c)


def test_recover_drops_a_spilled_link_only_when_its_copy_is_gone_from_a_spill_dir_that_is_there(tmp_path):
    fab = Fab(tmp_path, budget_mib=100)
    now = time.time()
    fab.snap("kept", 2, "pinned", now)
    fab.snap("lost", 2, "pinned", now)
    for sid in ("kept", "lost"):
        fab.keeper.spill_now(sid)
    away = tmp_path / "spill-away"
    fab.spill_root.rename(away)  # the spill disk is not there (not mounted yet, say)
    SnapshotStore(fab.store.root, spill_root=fab.spill_root).recover()
    assert sorted(p.name for p in fab.store.root.iterdir() if p.is_symlink()) == ["kept", "lost"]
    away.rename(fab.spill_root)
    shutil.rmtree(fab.spill_root / "lost")  # this copy really is gone
    report = SnapshotStore(fab.store.root, spill_root=fab.spill_root).recover()
    assert report["dangling"] == 1 and fab.listed() == {"kept": "disk"} and fab.debris() == []
