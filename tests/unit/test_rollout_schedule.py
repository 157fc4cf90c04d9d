"""RolloutSchedule (drums_osworld.farm.scheduler), the scheduler behind DrumsPool.map_rollouts, on a
pool stand-in: placement (holders first, a node's free slots), the start state shipped once per
node, a rollout whose node died retried elsewhere, and a run that has no node left.

No Ray cluster: ``ray.wait`` is replaced by one that reports the oldest rollout in flight done.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from drums_core.errors import InvalidArgument, Unavailable
from drums_osworld.farm import scheduler
from drums_osworld.farm.scheduler import RolloutSchedule, scripts_for


@dataclass
class _State:
    id: str = "snap"
    home: str = "a"
    copies: set[str] = field(default_factory=lambda: {"a"})


class _Actor:
    def __init__(self, pool: "_Pool", node: str) -> None:
        self.pool, self.node = pool, node
        self.rollout = self  # ``actor.rollout.remote(...)``

    def remote(self, state_id: str, task: dict, script: list, pause: float, verify_live: bool) -> tuple:
        ref = (self.node, len(self.pool.started))
        self.pool.started.append((self.node, script[0]))
        return ref


@dataclass
class _Node:
    actor: Any


class _Pool:
    """What RolloutSchedule asks of a DrumsPool; ``outcomes[node]`` is a list of results or errors, in order."""

    def __init__(self, free: dict[str, int], outcomes: dict[str, list]) -> None:
        self.free, self.outcomes = free, outcomes
        self.down: set[str] = set()
        self.started: list[tuple[str, Any]] = []
        self.shipped: list[str] = []

    def infos(self) -> dict:
        return {n: {"free": f} for n, f in self.free.items() if n not in self.down}

    def alive(self, name: str) -> bool:
        return name not in self.down

    def _order(self, state: _State, names: list[str]) -> list[str]:
        holders = [state.home] + sorted(state.copies - {state.home})
        return [n for n in holders if n in names] + [n for n in names if n not in state.copies]

    def ensure_copy(self, state: _State, target: str) -> dict | None:
        self.shipped.append(target)
        state.copies.add(target)
        return {"target": target}

    def _node(self, name: str) -> _Node:
        return _Node(_Actor(self, name))

    def _get(self, name: str, ref: tuple) -> dict:
        out = self.outcomes[name].pop(0)
        if isinstance(out, Exception):
            if getattr(out, "reason", None) == "NODE_DIED":
                self.down.add(name)
            raise out
        return out


@pytest.fixture(autouse=True)
def _oldest_done(monkeypatch):
    monkeypatch.setattr(scheduler.ray, "wait", lambda refs, num_returns=1: (refs[:1], refs[1:]))


def _run(pool: _Pool, branches: int, **kw) -> tuple[RolloutSchedule, list]:
    sched = RolloutSchedule(pool, _State(), {"id": "t"}, [[f"step{i}"] for i in range(branches)],
                            concurrency=kw.pop("concurrency", None), pause=0.0,
                            retries=kw.pop("retries", 1), verify_live=True)
    return sched, sched.run()


def test_holders_first_then_shipped_once_and_scored():
    ok = {"score": 1.0, "liveness": "ok", "timings": {"restore": 0.123456}}
    pool = _Pool({"a": 1, "b": 2}, {"a": [ok, ok], "b": [ok, ok]})
    sched, results = _run(pool, 4)
    assert [r.branch for r in results] == [0, 1, 2, 3]
    assert all(r.score == 1.0 and r.error is None and r.attempts == 1 for r in results)
    assert results[0].timings == {"restore": 0.1235}
    assert pool.started[0] == ("a", "step0")  # the home first
    assert pool.shipped == ["b"] and sched.transfers == [{"target": "b"}]
    assert sched.limit == 3


def test_a_rollout_whose_node_died_is_retried_on_another():
    ok = {"score": 0.5, "liveness": "ok"}
    died = Unavailable("node a is gone", reason="NODE_DIED")
    pool = _Pool({"a": 1, "b": 1}, {"a": [died], "b": [ok, ok]})
    sched, results = _run(pool, 2)
    assert [(r.branch, r.node, r.attempts, r.error) for r in results] == [(0, "b", 2, None), (1, "b", 1, None)]
    assert "a" in sched.unusable


def test_no_retry_left_or_no_node_left():
    died = Unavailable("node a is gone", reason="NODE_DIED")
    pool = _Pool({"a": 2}, {"a": [died, died]})
    _, results = _run(pool, 3, retries=1)
    assert [r.error["reason"] for r in results] == ["NODE_DIED", "NODE_DIED", "NO_CAPACITY"]
    assert results[2].node is None and results[2].attempts == 0


def test_a_failed_liveness_check_is_an_error():
    pool = _Pool({"a": 1}, {"a": [{"score": 1.0, "liveness": "failed", "session": "s1"}]})
    _, results = _run(pool, 1)
    assert results[0].score == 1.0 and results[0].error["reason"] == "LIVENESS_FAILED"


def test_scripts_for():
    assert scripts_for(["x"], 2) == [["x"], ["x"]]
    assert scripts_for([["x"], ["y"]], 2) == [["x"], ["y"]]
    with pytest.raises(InvalidArgument):
        scripts_for([["x"], ["y"]], 3)
