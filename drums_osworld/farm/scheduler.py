"""The scheduler behind :meth:`DrumsPool.map_rollouts <.pool.DrumsPool.map_rollouts>`, and its records.

A :class:`RolloutSchedule` is one ``map_rollouts`` call: branches wait in :attr:`~RolloutSchedule.pending`,
start on the first node (holders of the start state first) that is alive, usable and not full,
and are collected one at a time as Ray reports them done. A rollout that fails ``Unavailable`` goes
back to the front of the queue while it has retries left and another node could take it; every
other outcome becomes its :class:`RolloutResult`.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from drums_core.errors import DrumsError, Internal, InvalidArgument, Unavailable
from drums_core.reasons import Reason

if TYPE_CHECKING:
    from typing import Protocol

    class StateRef(Protocol):
        """What the scheduler reads of a pool's state (:class:`.pool.StateRef`)."""
        id: str
        copies: set[str]

    class DrumsPool(Protocol):
        """What the scheduler asks of the pool that runs it (:class:`.pool.DrumsPool`; the pool
        imports this module, never the other way round)."""
        def infos(self) -> dict[str, dict]: ...
        def alive(self, name: str) -> bool: ...
        def _order(self, state: StateRef, names: list[str]) -> list[str]: ...
        def ensure_copy(self, state: StateRef, target: str) -> dict | None: ...
        def _node(self, name: str) -> Any: ...
        def _get(self, name: str, ref: Any, timeout: float | None = None) -> Any: ...

log = logging.getLogger("drums.osworld.ray_pool")

__all__ = ["RolloutResult", "RolloutSchedule", "Rollouts", "scripts_for"]


# ------------------------------------------------------------------------------------------- records
@dataclass
class RolloutResult:
    """One rollout of :meth:`DrumsPool.map_rollouts`."""

    branch: int
    node: str | None
    session: str | None = None
    score: float | None = None
    actions_run: int = 0
    last_action: Any = None
    liveness: str | None = None
    reseed_draw: Any = None
    hostname: str | None = None
    attempts: int = 0
    error: dict | None = None
    action_errors: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Rollouts:
    """What :meth:`DrumsPool.map_rollouts` did, rollouts in branch order."""

    task: str
    state: str
    results: list[RolloutResult]
    transfers: list[dict]
    concurrency: int
    timings: dict

    @property
    def scores(self) -> list[float | None]:
        return [r.score for r in self.results]

    @property
    def ok(self) -> bool:
        return all(r.error is None and r.score is not None for r in self.results)

    @property
    def per_hour(self) -> float | None:
        done = sum(1 for r in self.results if r.score is not None)
        wall = self.timings.get("rollouts")
        return None if not wall else done / wall * 3600.0

    def table(self) -> str:
        cols = ["branch", "node", "score", "steps", "restore_s", "actions_s", "eval_s", "status"]
        rows = [{"branch": str(r.branch), "node": r.node or "-", "score": "-" if r.score is None else f"{r.score:g}",
                 "steps": str(r.actions_run), "restore_s": f"{r.timings.get('restore', 0.0):.2f}",
                 "actions_s": f"{r.timings.get('actions', 0.0):.2f}", "eval_s": f"{r.timings.get('evaluate', 0.0):.2f}",
                 "status": ("error: " + r.error.get("reason", "?")) if r.error else (r.liveness or "ok")}
                for r in self.results]
        widths = {c: max(len(c), *(len(x[c]) for x in rows)) for c in cols} if rows else {c: len(c) for c in cols}
        lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
        lines += ["  ".join(x[c].ljust(widths[c]) for c in cols) for x in rows]
        rate = self.per_hour
        lines.append(f"{len(self.results)} rollouts of {self.task} from {self.state[:12]}, "
                     f"{self.concurrency} at a time: "
                     f"{self.timings.get('rollouts', 0.0):.1f} s, "
                     f"{'-' if rate is None else f'{rate:.0f}'} rollouts/hour, {len(self.transfers)} transfers")
        return "\n".join(lines)


def scripts_for(actions: Any, branches: int) -> list[list]:
    """One action list per branch: ``actions`` is one script for all, or one script per branch."""
    if not isinstance(branches, int) or branches < 1:
        raise InvalidArgument(f"branches must be a positive integer, not {branches!r}", reason=Reason.BAD_COUNT)
    if not isinstance(actions, list):
        raise InvalidArgument("actions must be a list of actions or a list of per-branch lists",
                              reason=Reason.BAD_ACTION)
    if actions and all(isinstance(a, list) for a in actions):
        if len(actions) == 1:
            return [list(actions[0]) for _ in range(branches)]
        if len(actions) != branches:
            raise InvalidArgument(f"{len(actions)} scripts for {branches} branches", reason=Reason.BAD_ACTION)
        return [list(a) for a in actions]
    return [list(actions) for _ in range(branches)]


# ------------------------------------------------------------------------------------------- the schedule
class RolloutSchedule:
    """One ``map_rollouts`` run over ``pool``'s nodes from ``state``: what waits, what runs where.

    Its state, by name:

    - ``pending``: branches waiting to start, the next one first (a retried one goes to the front);
    - ``inflight``: Ray reference of each running rollout -> (branch, node);
    - ``free``: sessions each node could take when the run began; ``busy``: rollouts running on each;
    - ``unusable``: nodes this run no longer places on (the start state could not be shipped there,
      or a rollout there failed because the node died or had no slot);
    - ``attempts`` and ``results``: per branch; ``transfers``: what was shipped for this run.
    """

    def __init__(self, pool: DrumsPool, state: StateRef, task: dict, scripts: list[list], *,
                 concurrency: int | None, pause: float, retries: int, verify_live: bool) -> None:
        self.pool, self.state, self.task, self.scripts = pool, state, task, scripts
        self.pause, self.retries, self.verify_live = pause, retries, verify_live
        branches = len(scripts)
        self.results: list[RolloutResult | None] = [None] * branches
        self.attempts = [0] * branches
        self.transfers: list[dict] = []
        self.free = {n: int(i["free"]) for n, i in pool.infos().items()}
        self.limit = max(1, min(concurrency or branches, sum(self.free.values()) or 1))
        self.pending: collections.deque[int] = collections.deque(range(branches))
        self.inflight: dict[Any, tuple[int, str]] = {}
        self.busy: collections.Counter[str] = collections.Counter()
        self.unusable: set[str] = set()

    def run(self) -> list[RolloutResult]:
        """Run every branch to a result; returns them in branch order."""
        while self.pending or self.inflight:
            self._start_what_fits()
            if not self.inflight:
                self._fail_pending()
                break
            done, _ = ray.wait(list(self.inflight), num_returns=1)
            for ref in done:
                self._collect(ref)
        return [r for r in self.results if r is not None]

    # ------------------------------------------------------------------ starting
    def _usable(self, name: str) -> bool:
        return self.pool.alive(name) and name not in self.unusable

    def _next_node(self) -> str | None:
        """The first node, holders first, that can take one more rollout now."""
        return next((x for x in self.pool._order(self.state, list(self.free))
                     if self._usable(x) and self.busy[x] < self.free[x]), None)

    def _ship_to(self, name: str) -> bool:
        """Make sure ``name`` holds the start state; False (and ``name`` unusable) when it cannot."""
        if name in self.state.copies:
            return True
        try:
            rec = self.pool.ensure_copy(self.state, name)
        except DrumsError as exc:
            log.warning("cannot ship %s to %s: %s", self.state.id, name, exc)
            self.unusable.add(name)
            return False
        if rec:
            self.transfers.append(rec)
        return True

    def _start_what_fits(self) -> None:
        while self.pending and len(self.inflight) < self.limit:
            name = self._next_node()
            if name is None:
                return
            if self._ship_to(name):
                self._start(self.pending.popleft(), name)

    def _start(self, i: int, name: str) -> None:
        self.attempts[i] += 1
        actor = self.pool._node(name).actor
        ref = actor.rollout.remote(self.state.id, self.task, self.scripts[i], self.pause, self.verify_live)
        self.inflight[ref] = (i, name)
        self.busy[name] += 1

    def _fail_pending(self) -> None:
        """Nothing runs and nothing can start: every waiting branch fails ``NO_CAPACITY``."""
        for i in self.pending:
            self.results[i] = RolloutResult(branch=i, node=None, attempts=self.attempts[i], error=Unavailable(
                "no node of the pool can take this rollout", reason=Reason.NO_CAPACITY).to_wire())
        self.pending.clear()

    # ------------------------------------------------------------------ collecting
    def _collect(self, ref: Any) -> None:
        i, name = self.inflight.pop(ref)
        self.busy[name] -= 1
        try:
            out = self.pool._get(name, ref)
        except Unavailable as exc:
            if not self._retry(i, name, exc):
                self._fail(i, name, exc)
        except DrumsError as exc:
            self._fail(i, name, exc)
        else:
            self.results[i] = self._result(i, name, out)

    def _retry(self, i: int, name: str, exc: Unavailable) -> bool:
        """Put branch ``i`` back at the front when it has retries left and another node could take it."""
        others = any(self._usable(x) for x in self.free)
        if self.attempts[i] > self.retries or not others:
            return False
        log.warning("rollout %d on %s failed (%s): retrying", i, name, exc)
        if not self.pool.alive(name) or exc.reason in (Reason.NO_SLOT,):
            self.unusable.add(name)
        self.pending.appendleft(i)
        return True

    def _fail(self, i: int, name: str, exc: DrumsError) -> None:
        self.results[i] = RolloutResult(branch=i, node=name, attempts=self.attempts[i], error=exc.to_wire())

    def _result(self, i: int, name: str, out: dict) -> RolloutResult:
        result = RolloutResult(
            branch=i, node=name, session=out.get("session"), score=out.get("score"),
            actions_run=out.get("actions_run", 0), last_action=out.get("last_action"),
            liveness=out.get("liveness"), reseed_draw=out.get("reseed_draw"),
            hostname=out.get("hostname"), attempts=self.attempts[i], action_errors=out.get("errors") or [],
            timings={k: round(v, 4) for k, v in (out.get("timings") or {}).items()})
        if out.get("liveness") not in (None, "ok"):
            result.error = Internal(f"session {out.get('session')} failed its liveness check",
                                    reason=Reason.LIVENESS_FAILED).to_wire()
        return result
