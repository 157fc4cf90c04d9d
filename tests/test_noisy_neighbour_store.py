"""A noisy neighbour in the snapshot store: what a desktop's files cost there, and what one session's
checkpoint may push out (drums_core.store.usage, drums_core.store.budget; issue 31, part 3).

Real daemon, real desktops, real CRIU. The attacker is the desktop user (uid 1000, no sudo) of a fresh
session or of a restored sibling; the victims are another session's pinned snapshot, another session's
cache state a running sibling stands on, and those sessions themselves. In order, per origin:

1. a 20 TiB sparse file and a 64 MiB file with 3,000 hard links: the attacker's checkpoint changes the
   store's use by what they occupy (< 2x their blocks, each inode once), which is what the copy really
   occupies on the store's tmpfs (statvfs before/after); nothing is evicted or spilled; a restore of it
   still has the sparse file and the links;
2. real data over the per-checkpoint cap: SNAPSHOT_TOO_LARGE, and nothing was written (staging, store
   tmpfs, snapshot list), evicted or spilled (journal, spill directory); the attacker runs on;
3. a big checkpoint under the cap (a quarter of the budget) that does not fit the budget: cache states
   of desktops that are gone are evicted; the victims' pinned and in-use snapshots stay in memory, the
   sibling on the in-use one runs on;
4. later checkpoints of the other sessions work, and their snapshots restore.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from drums_core.config import Instance
from drums_core.errors import Unavailable
from tests.support.storelib import clear, store_daemon

MiB = 1 << 20
TITLE = "noisywin"
XTERM = {"programs": [{"name": "xterm", "argv": ["xterm", "-xrm", "*allowTitleOps: false", "-title", TITLE]}],
         "expect_window": TITLE}
ATTACK_DIR = "/home/user/.cache/noisy"
SPARSE_AT = 10 << 40  # one block of data 10 TiB into the 20 TiB file
ATTACK = f"""set -e
mkdir -p {ATTACK_DIR}
cd {ATTACK_DIR}
truncate -s 20T sparse
printf 'data' | dd of=sparse bs=4096 seek={SPARSE_AT // 4096} conv=notrunc status=none
head -c 64M /dev/urandom > linked
python3 -c "import os; [os.link('linked', 'link%d' % i) for i in range(3000)]"
echo "$(du -s -B1 . | cut -f1) $(du -s -B1 --apparent-size --count-links . | cut -f1)"
"""
LOOK = f"stat -c '%s %b %h' {ATTACK_DIR}/sparse {ATTACK_DIR}/linked"


@pytest.fixture(scope="module")
def noisy_instance():
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import SPARE_SLOTS, require_root, stop_instance

    require_root()
    inst = Instance(name=f"noisy-{os.getpid()}", slot_base=SPARE_SLOTS[0], slot_count=8)
    spill = Path("/var/lib/drums/spill") / inst.name
    try:
        yield inst
    finally:
        stop_instance(inst)
        shutil.rmtree(spill, ignore_errors=True)
    leaks = instance_leaks(inst)
    assert not any(leaks.values()), leaks


def _user(c, sid: str, script: str, timeout: float = 120.0) -> str:
    """``script`` in the session as the desktop user (uid 1000, no sudo); its stdout."""
    r = c.exec(sid, ["sh", "-c", script], user="user", timeout=timeout)
    assert r["returncode"] == 0, (script, r["returncode"], r["stdout"][-2000:], r["stderr"][-2000:])
    return r["stdout"]


def _occupied(inst: Instance) -> int:
    """Bytes really in use on the instance's state tmpfs, which holds the store."""
    st = os.statvfs(inst.state_dir)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("origin", ["fresh", "restored"])
def test_a_noisy_desktop_costs_what_it_occupies_and_pushes_out_no_one(noisy_instance, origin):
    inst = noisy_instance
    spill = Path("/var/lib/drums/spill") / inst.name
    # one checkpoint may add a quarter of the budget (the default share; the default's 1 GiB floor is
    # for budgets this small)
    budget, cap = 1024 * MiB, 256 * MiB
    c = store_daemon(inst, DRUMS_STORE_BUDGET="1g", DRUMS_SNAPSHOT_MAX="25%", DRUMS_SPILL_DIR=str(spill))
    try:
        store0 = c.store()
        assert (store0["budget"], store0["snapshot_max"]) == (budget, cap), store0
        # the victims: a pinned state of V, and a cache state of V that a running sibling R stands on
        v = c.create(XTERM)
        victim_pinned = c.checkpoint(v["id"], name="victim-pinned", leave_running=True)
        victim_cache = c.checkpoint(v["id"], name="victim-cache", leave_running=True, cache=True)
        (r,) = c.restore(victim_cache["id"], wait_live=True)
        # what the store may take back: cache states of desktops that are gone (190 MiB of files each)
        for i in range(3):
            f = c.create(XTERM)
            _user(c, f["id"], "head -c 190M /dev/zero > /home/user/filler")
            c.checkpoint(f["id"], name=f"filler-{i}", cache=True)
        # the attacker
        if origin == "fresh":
            a = c.create(XTERM)
        else:
            base = c.create(XTERM)
            attacker_base = c.checkpoint(base["id"], name="attacker-base")
            (a,) = c.restore(attacker_base["id"], wait_live=True)
        baseline = c.checkpoint(a["id"], name="a-baseline", leave_running=True)

        # 1. the sparse file and the hard links
        blocks, apparent = map(int, _user(c, a["id"], ATTACK).split())
        print(f"attack files: {blocks / MiB:.1f} MiB of blocks, {apparent / MiB:.0f} MiB of st_size")
        assert apparent > 20 << 40 and blocks < 70 * MiB
        before, occupied_before = c.store(), _occupied(inst)
        attack = c.checkpoint(a["id"], name="a-attack", leave_running=True)
        after, occupied_after = c.store(), _occupied(inst)
        layer0, layer1 = baseline["usage"]["layer"], attack["usage"]["layer"]
        print(f"store use {before['used'] / MiB:.1f} -> {after['used'] / MiB:.1f} MiB "
              f"(+{(after['used'] - before['used']) / MiB:.1f}); tmpfs really occupied "
              f"+{(occupied_after - occupied_before) / MiB:.1f} MiB; snapshot {attack['size'] / MiB:.1f} MiB "
              f"(baseline {baseline['size'] / MiB:.1f}); layer charged {layer0['charged'] / MiB:.2f} -> "
              f"{layer1['charged'] / MiB:.2f} MiB, blocks {layer1['blocks'] / MiB:.2f} MiB, {layer1['inodes']} "
              f"inodes, {layer1['entries']} names, st_size {layer1['apparent'] / MiB:.0f} MiB")
        assert attack["store"]["actions"] == [], attack["store"]   # nothing evicted or spilled for it
        assert after["used"] - before["used"] == attack["size"]
        assert layer1["apparent"] > 20 << 40 and layer1["complete"]  # what st_size would have claimed
        assert layer1["charged"] - layer0["charged"] < 2 * blocks
        assert attack["size"] - baseline["size"] < 2 * blocks + 16 * MiB  # images of one desktop vary a little
        # what the store counts is what the copy really occupies on the store's tmpfs
        real = occupied_after - occupied_before
        assert abs(attack["size"] - real) < 0.1 * real + 8 * MiB, (attack["size"], real)
        # the copy kept the hole and the links: a restore of it has both, as the desktop user sees them
        (seen,) = c.restore(attack["id"], wait_live=True)
        sparse_st, linked_st = (line.split() for line in _user(c, seen["id"], LOOK).splitlines())
        assert int(sparse_st[0]) == 20 << 40 and int(sparse_st[1]) * 512 < 1 * MiB, sparse_st
        assert int(linked_st[0]) == 64 * MiB and int(linked_st[2]) == 3001, linked_st
        c.destroy(seen["id"])

        # 2. over the per-checkpoint cap: refused before anything is written, evicted or spilled
        _user(c, a["id"], f"head -c {(cap + 32 * MiB) // MiB}M /dev/zero > {ATTACK_DIR}/fill")
        snaps = sorted(s["id"] for s in c.snapshots())
        before, occupied_before = c.store(), _occupied(inst)
        spilled_before = _files(spill)
        with pytest.raises(Unavailable) as exc:
            c.checkpoint(a["id"], name="a-too-large", leave_running=True)
        assert exc.value.reason == "SNAPSHOT_TOO_LARGE", exc.value
        print(exc.value.message, exc.value.detail)
        assert exc.value.detail["need"] > cap == exc.value.detail["snapshot_max"]
        after = c.store()
        assert sorted(s["id"] for s in c.snapshots()) == snaps
        assert list((inst.snapshots_dir / ".staging").iterdir()) == []
        assert abs(_occupied(inst) - occupied_before) < 2 * MiB
        assert _files(spill) == spilled_before
        assert (after["recent"], after["evicted"], after["spilled_total"], after["used"]) == (
            before["recent"], before["evicted"], before["spilled_total"], before["used"])
        assert after["too_large"] == before["too_large"] + 1
        assert c.get(a["id"])["state"] == "RUNNING" and c.exec(a["id"], ["true"])["returncode"] == 0

        # 3. a big checkpoint under the cap that does not fit: what nothing uses and the caller can make
        # again goes (the fillers), the victims' states stay
        status = c.store()
        fill = min(cap - attack["size"] - 64 * MiB, status["budget"] - status["used"] + 32 * MiB)
        assert fill > 32 * MiB, (fill, status)
        _user(c, a["id"], f"rm -f {ATTACK_DIR}/fill && head -c {fill // MiB}M /dev/zero > {ATTACK_DIR}/fill")
        big = c.checkpoint(a["id"], name="a-big", leave_running=True)
        moved = [(x["action"], x["name"]) for x in big["store"]["actions"]]
        listing = {s["name"]: s for s in c.snapshots()}
        print(f"big checkpoint {big['size'] / MiB:.0f} MiB (fill {fill / MiB:.0f} MiB): moved {moved}; now",
              {n: x["location"] for n, x in listing.items()})
        assert moved and all(act == "evicted" and name.startswith("filler-") for act, name in moved), moved
        assert listing["victim-cache"]["location"] == "memory" and listing["victim-cache"]["in_use"]
        assert listing["victim-pinned"]["location"] == "memory"
        assert c.store()["used"] <= budget

        # 4. the others go on: their later checkpoints work and restore
        assert c.exec(r["id"], ["true"])["returncode"] == 0 and c.exec(v["id"], ["true"])["returncode"] == 0
        later_v = c.checkpoint(v["id"], name="victim-later", leave_running=True)
        later_r = c.checkpoint(r["id"], name="sibling-later", leave_running=True)
        assert later_v["state"] == later_r["state"] == "committed"
        for snap in (victim_pinned, later_r):
            (back,) = c.restore(snap["id"], wait_live=True)
            assert any(TITLE in w["title"] for w in c.windows(back["id"]) if w["mapped"])
            c.destroy(back["id"])
        journal = [json.loads(line) for line in (inst.state_dir / "store-journal.jsonl").read_text().splitlines()]
        victims = {victim_pinned["id"], victim_cache["id"]}
        assert not [e for e in journal if e["id"] in victims], journal
    finally:
        clear(c)
    assert _files(spill) == []
