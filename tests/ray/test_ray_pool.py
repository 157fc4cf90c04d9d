"""The Ray rollout farm on a local two-node Ray cluster with a Drums daemon per node (see conftest.py).

Acceptance (issue 10):
* a checkpoint made on node A is branched 4 ways, 2 of them on node B after a transfer; all 4
  siblings are ready, alive, reseeded and scored by the task's evaluator; the checksum is
  verified on B;
* killing node B's daemon mid-branch fails those calls with Unavailable, the other branches
  finish, and a later sweep on B leaves nothing behind.
Plus: map_rollouts across both nodes, and the pool going on after node B is revived.

Nothing is mocked: real Ray actors, real daemons, CRIU, guest servers and the task's evaluator.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from tests.support.raylib import TASK, node_leftovers
from tests.support.wait import WaitTimeout, wait_until

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def state(ray_cluster):
    """The task's post-setup checkpoint, made on node a (the desktop is consumed)."""
    _, pool, _ = ray_cluster
    st = pool.prepare(TASK, node="a")
    yield st
    pool.delete_state(st)


def _task():
    from drums_osworld.tasks import load_task

    return load_task(TASK)


def _no_sessions(pool) -> None:
    for name in pool.node_names:
        if pool.alive(name):
            left = pool._call(name, "list")
            assert not left, f"node {name} has sessions left: {[s['id'] for s in left]}"


def test_branch_four_ways_two_on_node_b_after_a_transfer(ray_cluster, state):
    _, pool, insts = ray_cluster
    task = _task()
    assert state.home == "a" and state.copies == {"a"}
    b = pool.branch(state, 4)
    try:
        assert b.ok, [f.to_json() for f in b.failures]
        assert b.placement == {"a": 2, "b": 2}, b.placement
        assert [s.node for s in b.siblings] == ["a", "a", "b", "b"]
        # one transfer, to b, its sha256 recomputed there and equal to the sender's
        assert len(b.transfers) == 1, b.transfers
        tr = b.transfers[0]
        print("transfer", json.dumps(tr, indent=1))
        print("timings", b.timings)
        assert (tr["source"], tr["target"], tr["snapshot"]) == ("a", "b", state.id)
        assert tr["verified"] and tr["received_sha256"] == tr["sha256"] and len(tr["sha256"]) == 64
        assert tr["imported"] == [state.id] and tr["bytes"] > 1 << 20
        assert set(tr["seconds"]) >= {"pack", "pull", "import", "total"}
        assert "transfer" in b.timings["b"] and "restore" in b.timings["b"] and "restore" in b.timings["a"]
        imported = json.loads(pool._call("b", "store_file", state.id, "IMPORTED"))
        assert imported["sha256"] == tr["sha256"] and imported["source_layers"][0].startswith(
            str(insts["a"].snapshots_dir))
        manifest = json.loads(pool._call("b", "store_file", state.id, "manifest.json"))
        assert manifest["layers"] == [str(insts["b"].snapshots_dir / state.id / "layer")]
        assert state.copies == {"a", "b"}

        # ready (restored and running), alive (the checkpointed process set still there), reseeded
        for s in b.siblings:
            assert s.session["state"] == "RUNNING", s.session
            assert pool.wait_live(s)["liveness"] == "ok", s.session
        assert len({s.hostname for s in b.siblings}) == 4
        draws = [s.reseed_draw for s in b.siblings]
        assert None not in draws and len(set(draws)) == 4, draws
        assert len({s.session["address"] for s in b.siblings if s.node == "a"}) == 2

        # scored by the task's evaluator: the solution scores 1, the wrong solution 0, on both nodes
        scores = {}
        for i, s in enumerate(b.siblings):
            actions = task.solution if i % 2 == 0 else task.wrong_solution
            ran = pool.run_actions(s, actions)
            assert not ran["errors"], ran
            scores[(s.node, i % 2)] = pool.evaluate(s, task, ran["last_action"])
        print("scores", scores)
        assert scores == {("a", 0): 1.0, ("a", 1): 0.0, ("b", 0): 1.0, ("b", 1): 0.0}
    finally:
        for s in b.siblings:
            pool._destroy_quietly(s)
    _no_sessions(pool)

    # a second branch onto b ships nothing: the copy is there
    again = pool.branch(state, 1, nodes=["b"])
    try:
        assert again.ok and again.transfers == [] and again.placement == {"b": 1}
    finally:
        for s in again.siblings:
            pool._destroy_quietly(s)


def test_map_rollouts_across_both_nodes(ray_cluster):
    """map_rollouts makes its own start state, places 4 rollouts (2 per node, shipping to b), scores
    each with the evaluator, and deletes the state from both stores afterwards."""
    _, pool, _ = ray_cluster
    task = _task()
    before = {n: {s["id"] for s in pool._call(n, "snapshots")} for n in pool.node_names}
    ro = pool.map_rollouts(TASK, task.solution, branches=4, concurrency=4)
    print(ro.table())
    assert ro.ok, [r.to_json() for r in ro.results if r.error]
    assert ro.scores == [1.0] * 4
    assert sorted(r.node for r in ro.results) == ["a", "a", "b", "b"]
    assert len(ro.transfers) == 1 and ro.transfers[0]["verified"]
    assert all(r.liveness == "ok" for r in ro.results)
    assert len({r.reseed_draw for r in ro.results}) == 4
    after = {n: {s["id"] for s in pool._call(n, "snapshots")} for n in pool.node_names}
    assert after == before, "map_rollouts left its start state behind"
    _no_sessions(pool)


def _kill_when_restoring(inst, pid: int, known: set[str], fired: dict, timeout: float = 120.0) -> None:
    """SIGKILL the daemon ``pid`` as soon as a new session directory appears under ``inst`` (mid-restore)."""
    def new_sessions() -> list[str]:
        try:
            return sorted(set(os.listdir(inst.sessions_dir)) - known)
        except FileNotFoundError:
            return []

    with contextlib.suppress(WaitTimeout):  # the test checks that it fired
        new = wait_until(new_sessions, timeout, "a new session directory", every=0.005)
        os.kill(pid, signal.SIGKILL)
        fired.update(at=time.monotonic(), sessions=new)


def test_killing_node_b_daemon_mid_branch(ray_cluster, state):
    _, pool, insts = ray_cluster
    task = _task()
    # one sibling already on b: it is reported lost when b's daemon dies
    first = pool.branch(state, 1, nodes=["b"])
    assert first.ok, [f.to_json() for f in first.failures]
    early = first.siblings[0]
    pid = pool.node_info("b")["daemon_pid"]
    known = set(os.listdir(insts["b"].sessions_dir))
    fired: dict = {}
    killer = threading.Thread(target=_kill_when_restoring, args=(insts["b"], pid, known, fired), daemon=True)
    killer.start()
    b = pool.branch(state, 3)
    killer.join(timeout=5)
    try:
        assert fired, "the killer never saw node b start a restore"
        print("branch", b.placement, b.timings, [f.to_json() for f in b.failures], "killed", fired)
        assert b.placement == {"a": 2, "b": 1}
        # b's share failed Unavailable; a's siblings are there
        assert len(b.failures) == 1, [f.to_json() for f in b.failures]
        f = b.failures[0]
        assert f.node == "b" and f.count == 1 and f.stage == "restore"
        from drums_core.errors import Unavailable

        assert isinstance(f.error, Unavailable) and f.error.reason in ("DAEMON_DIED", "DAEMON_DOWN"), f.error
        assert [s.node for s in b.siblings] == ["a", "a"]
        assert not pool.alive("b")
        assert [s.id for s in pool.lost] == [early.id]
        # calls to b now fail Unavailable at once, and placement leaves b out; the pool goes on with a
        with pytest.raises(Unavailable) as down:
            pool._call("b", "list")
        assert down.value.reason == "NODE_DOWN"
        none = pool.branch(state, 1, nodes=["b"])
        assert not none.siblings and none.failures[0].error.reason == "NO_CAPACITY"
        for s in b.siblings:  # the other branches finish: acted on and scored
            ran = pool.run_actions(s, task.solution)
            assert pool.evaluate(s, task, ran["last_action"]) == 1.0
    finally:
        for s in b.siblings:
            pool._destroy_quietly(s)

    # a later sweep on b leaves nothing behind: no process (tagged, or living in a root under b's
    # state), mount, link, nftables table, X11 link or ledger of the dead run
    before = node_leftovers(insts["b"])
    print("left by the killed daemon:", before)
    assert before["processes"] and before["ledger_runs"], "the kill left nothing to sweep: not mid-branch?"
    report = pool.sweep_node("b")
    print("sweep", json.dumps(report)[:3000])
    after = node_leftovers(insts["b"])
    assert not any(after.values()), f"the sweep on b left: {after}"

    # revived, b serves again (from its copy of the checkpoint: no second transfer)
    pool.revive_node("b")
    again = pool.branch(state, 1, nodes=["b"])
    try:
        assert again.ok and again.transfers == [], [f.to_json() for f in again.failures]
    finally:
        for s in again.siblings:
            pool._destroy_quietly(s)
    _no_sessions(pool)
