"""tests/support: the slot blocks of test processes (one per pytest-xdist worker) and wait_until."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support import REPO
from tests.support.slots import BLOCK, FIRST, LAST, NBLOCKS, Block, claim_block, preferred_block, release_block
from tests.support.wait import WaitTimeout, wait_until


def test_blocks_are_disjoint_and_in_range():
    seen: set[int] = set()
    for i in range(NBLOCKS):
        b = Block(i)
        assert FIRST <= b.slots.start and b.slots.stop <= LAST
        assert not seen & set(b.slots)
        seen |= set(b.slots)
        parts = [b.suite, b.spare, b.orphans, b.bench, b.faults]
        assert sum(len(p) for p in parts) == BLOCK == len(set().union(*map(set, parts)))
        assert all(set(p) <= set(b.slots) for p in parts)


def test_the_block_holds_what_its_users_take():
    from drums_osworld.bench.common import SLOT_SPAN
    from tests.faults.harness import SLOTS_PER_WINDOW, WINDOWS

    b = Block(0)
    assert len(b.suite) == 32 and len(b.spare) == 16 and len(b.orphans) == 16
    assert len(b.bench) >= SLOT_SPAN
    assert len(b.faults) >= SLOTS_PER_WINDOW * len(WINDOWS)


def test_workers_of_a_run_prefer_distinct_blocks():
    for run in ("a1b2c3", "pid4242", ""):
        firsts = [preferred_block(run, f"gw{k}") for k in range(8)]
        assert len(set(firsts)) == 8, firsts
        assert preferred_block(run, "gw3") == firsts[3]  # stable
        assert preferred_block(run, "") == firsts[0]  # no xdist: like the first worker
    assert preferred_block("a1b2c3", "gw0") != preferred_block("ffee99", "gw0")


def test_a_held_block_is_not_claimed_again(tmp_path):
    first = claim_block("run-x", "gw0", lock_dir=tmp_path)
    assert first.index == preferred_block("run-x", "gw0")
    try:
        # another process (another run's worker preferring the same block) goes on to the next free one
        code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                "from tests.support.slots import claim_block; "
                "print(json.dumps(claim_block('run-x', 'gw0', lock_dir=Path(sys.argv[2])).index))")
        out = subprocess.run([sys.executable, "-c", code, str(REPO), str(tmp_path)], capture_output=True, text=True,
                             check=True).stdout
        assert json.loads(out) == (first.index + 1) % NBLOCKS
        second = claim_block("run-x", "gw0", lock_dir=tmp_path)  # this process: not its own block twice
        assert second.index != first.index
        release_block(second, tmp_path)
    finally:
        release_block(first, tmp_path)
    again = claim_block("run-x", "gw0", lock_dir=tmp_path)
    assert again.index == first.index
    release_block(again, tmp_path)


def _suite_of(env: dict) -> subprocess.Popen:
    code = ("import sys, json, time; sys.path.insert(0, sys.argv[1]); from tests.support.suite import INSTANCE; "
            "print(json.dumps([INSTANCE.name, INSTANCE.slot_base, INSTANCE.slot_count]), flush=True); time.sleep(3)")
    return subprocess.Popen([sys.executable, "-c", code, str(REPO)], env=env, stdout=subprocess.PIPE, text=True)


def test_each_xdist_worker_gets_its_own_instance_and_slots():
    """What the suite's conftest uses: workers gw0..gw2 of one run, alive together, have instances of
    their own on slot ranges that do not overlap."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    procs = [_suite_of({**env, "PYTEST_XDIST_TESTRUNUID": "unit-run", "PYTEST_XDIST_WORKER": f"gw{k}"})
             for k in range(3)]
    got = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(timeout=30)
    names = {name for name, _, _ in got}
    assert len(names) == 3 and all(n.startswith("pytest-") for n in names)
    ranges = [set(range(base, base + count)) for _, base, count in got]
    assert all(len(r) == 32 for r in ranges)
    assert not (ranges[0] & ranges[1] or ranges[0] & ranges[2] or ranges[1] & ranges[2]), got


def test_wait_until_returns_the_value():
    t0 = time.monotonic()
    calls = iter([0, None, [], "ready"])
    assert wait_until(lambda: next(calls), 5, "the fourth call", every=0.01) == "ready"
    assert time.monotonic() - t0 < 1


class _Shut(str):
    """A false value that shows as text (what the timeout message must name)."""

    def __bool__(self) -> bool:
        return False


def test_wait_until_names_what_and_the_last_value():
    with pytest.raises(WaitTimeout, match=r"timed out after 0.1s waiting for the door \(last: 'shut'\)") as exc:
        wait_until(lambda: _Shut("shut"), 0.1, "the door", every=0.01)
    assert isinstance(exc.value, AssertionError) and isinstance(exc.value, TimeoutError)


def test_wait_until_ignores_only_the_named_exceptions():
    def flaky():
        raise ConnectionError("not yet")

    with pytest.raises(WaitTimeout, match="not yet"):
        wait_until(flaky, 0.1, "the server", every=0.01, ignore=(ConnectionError,))
    with pytest.raises(ConnectionError):
        wait_until(flaky, 0.1, "the server", every=0.01)
