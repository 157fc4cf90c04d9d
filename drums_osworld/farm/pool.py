"""A rollout farm across hosts, on Ray: one agent per node, a pool on the driver.

    import ray
    from drums_osworld.farm.pool import DrumsPool, NodeConfig

    ray.init(address="auto")
    pool = DrumsPool.per_node()                    # one agent per alive Ray node, instance "default"
    state = pool.prepare("tasks/os/drums-os-make-executable.json")   # boot + task setup + checkpoint
    branch = pool.branch(state, 8)                 # 8 siblings, where the checkpoint is first
    results = pool.map_rollouts(task, actions, branches=32, state=state)

Drums does not grow a cluster manager: Ray places one :class:`~drums_osworld.farm.node.NodeAgent`
per node (pinned with a hard node-affinity), and each agent starts or connects to its host's
``drumsd``. The pool on the driver keeps the books (which node holds which checkpoint, how full
each node is, which sessions live where) and places work:

* **branch(state, n)**: siblings go to the node that holds the checkpoint first, then to nodes
  that already have a copy; when those are full the checkpoint is shipped (its chain packed on the
  source, pulled by the target through Ray, sha256 verified, imported into the target's store;
  see :mod:`drums_core.store.transfer`) and restored there. Each transfer and each node's restore is
  timed (``Branch.transfers``, ``Branch.timings``).
* **map_rollouts(task, actions, branches)**: ``branches`` rollouts (restore a sibling, run its
  actions, score it with the task's evaluator, destroy it), at most ``concurrency`` at a time,
  placed as above; a rollout that fails ``Unavailable`` (its node died) is retried elsewhere
  (the scheduler and the rollouts' records: :mod:`.scheduler`).

Failure handling: a node whose actor or Ray node dies, or whose daemon dies, fails its calls in
flight with :class:`~drums_core.errors.Unavailable` (``NODE_DIED``, ``DAEMON_DIED``); the node is
marked down, its sessions are reported in :attr:`DrumsPool.lost`, and the pool goes on with the
others. :meth:`DrumsPool.sweep_node` runs the sweep there (what the dead daemon left goes) and
:meth:`DrumsPool.revive_node` starts a fresh daemon.

Needs the ``ray`` extra (``pip install drums[ray]``).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # pragma: no cover - depends on the install
    raise ImportError("drums_osworld.farm.pool needs Ray: pip install 'drums[ray]'") from _exc

from drums_core.config import Instance
from drums_core.errors import DrumsError, Internal, InvalidArgument, Unavailable, from_wire
from drums_core.reasons import Reason

from .node import NodeAgent
from .scheduler import RolloutResult, Rollouts, RolloutSchedule, scripts_for

log = logging.getLogger("drums.osworld.ray_pool")

DAEMON_GONE = (Reason.DAEMON_DIED, Reason.DAEMON_DOWN)
_RAY_NODE_GONE = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                  ray.exceptions.LocalRayletDiedError, ray.exceptions.ObjectLostError)

__all__ = ["Branch", "DrumsPool", "NodeConfig", "NodeFailure", "RolloutResult", "Rollouts", "SessionRef", "StateRef"]


# ------------------------------------------------------------------------------------------- records
@dataclass
class NodeConfig:
    """One node of the pool: the daemon instance its agent serves, and where the agent runs.

    ``ray_node_id`` pins the agent to that Ray node (hard affinity); ``None`` lets Ray choose
    (only sensible with one node). ``capacity`` caps the sessions the pool places there (default:
    the instance's slots). ``daemon_env`` is the environment of a daemon the agent starts.
    """

    name: str
    instance: Instance
    ray_node_id: str | None = None
    capacity: int | None = None
    daemon_env: dict = field(default_factory=dict)


@dataclass
class SessionRef:
    """A desktop in the pool: its id, its node, the daemon's record of it."""

    id: str
    node: str
    session: dict
    snapshot: str | None = None

    @property
    def hostname(self) -> str:
        return self.session.get("hostname", "")

    @property
    def reseed_draw(self) -> Any:
        return (self.session.get("timings") or {}).get("reseed_draw")


@dataclass
class StateRef:
    """A checkpoint in the pool: its snapshot id, the node that made it, the nodes holding a copy."""

    id: str
    home: str
    copies: set[str]
    name: str | None = None
    size: int = 0
    snapshot: dict = field(default_factory=dict, repr=False)


@dataclass
class NodeFailure:
    """Siblings a node could not give: which node, how many, at which stage, and the error."""

    node: str | None
    count: int
    stage: str
    error: DrumsError

    def to_json(self) -> dict:
        return {"node": self.node, "count": self.count, "stage": self.stage, "error": self.error.to_wire()}


@dataclass
class Branch:
    """What :meth:`DrumsPool.branch` did."""

    state: StateRef
    requested: int
    siblings: list[SessionRef]
    failures: list[NodeFailure]
    placement: dict[str, int]
    transfers: list[dict]
    timings: dict[str, dict]

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.siblings) == self.requested


# ------------------------------------------------------------------------------------------- the pool
@dataclass
class _Node:
    config: NodeConfig
    actor: Any
    info: dict = field(default_factory=dict)
    alive: bool = True
    down_reason: str | None = None
    sessions: dict[str, SessionRef] = field(default_factory=dict)


class DrumsPool:
    """The driver side: agents on the nodes, the books, placement, transfers and failure handling."""

    def __init__(self, nodes: list[NodeConfig], *, call_timeout: float = 900.0, max_concurrency: int = 32) -> None:
        if not ray.is_initialized():
            raise Unavailable("Ray is not initialised: ray.init(...) first", reason=Reason.RAY_NOT_INITIALISED)
        names = [n.name for n in nodes]
        if not nodes or len(set(names)) != len(names):
            raise InvalidArgument(f"node names must be given and distinct: {names}", reason=Reason.BAD_NODES)
        self.call_timeout = call_timeout
        self.lost: list[SessionRef] = []
        self.transfers: list[dict] = []
        self._lock = threading.RLock()
        self._transfer_locks: dict[tuple[str, str], threading.Lock] = {}
        self._states: dict[str, StateRef] = {}
        self._nodes: dict[str, _Node] = {}
        agent_cls = ray.remote(NodeAgent)
        tag = uuid.uuid4().hex[:8]
        for cfg in nodes:
            opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": max_concurrency, "max_restarts": 0,
                                    "name": f"drums-node-{cfg.name}-{tag}"}
            if cfg.ray_node_id:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=cfg.ray_node_id, soft=False)
            inst = {"name": cfg.instance.name, "slot_base": cfg.instance.slot_base,
                    "slot_count": cfg.instance.slot_count}
            actor = agent_cls.options(**opts).remote(cfg.name, inst, cfg.daemon_env, cfg.capacity,
                                                     None, call_timeout)
            self._nodes[cfg.name] = _Node(config=cfg, actor=actor)
        for name in names:  # agents start their daemons in parallel; wait for each
            node = self._nodes[name]
            try:
                node.info = self._call(name, "info", timeout=180)
            except DrumsError as exc:
                self.close(destroy_sessions=False)
                raise Unavailable(f"node {name}: agent did not start: {exc.message}", reason=Reason.NODE_START_FAILED,
                                  detail=exc.detail) from exc
            want = node.config.ray_node_id
            if want and node.info.get("ray_node_id") != want:
                self.close(destroy_sessions=False)
                raise Internal(f"node {name}: agent runs on {node.info.get('ray_node_id')}, not {want}",
                               reason=Reason.NODE_MISPLACED)

    @classmethod
    def per_node(cls, instance: Instance | None = None, capacity: int | None = None, **kw) -> "DrumsPool":
        """One agent on every alive Ray node, each serving that host's daemon ``instance`` (default: "default")."""
        inst = instance or Instance()
        nodes = [NodeConfig(name=f"{n['NodeManagerAddress']}-{i}", instance=inst, ray_node_id=n["NodeID"],
                            capacity=capacity)
                 for i, n in enumerate(sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"]))]
        return cls(nodes, **kw)

    # ------------------------------------------------------------------ calls
    def _get(self, name: str, ref, timeout: float | None = None):
        try:
            env = ray.get(ref, timeout=timeout or self.call_timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise Unavailable(f"node {name} did not answer within {timeout or self.call_timeout}s",
                              reason=Reason.TIMEOUT) from exc
        except _RAY_NODE_GONE as exc:
            self._mark_down(name, f"Ray: {type(exc).__name__}")
            raise Unavailable(f"node {name} is gone ({type(exc).__name__}): {str(exc)[:500]}",
                              reason=Reason.NODE_DIED) from exc
        except ray.exceptions.RayError as exc:
            raise Internal(f"node {name}: {type(exc).__name__}: {str(exc)[:1000]}", reason=Reason.RAY_ERROR) from exc
        if env.get("ok"):
            return env["result"]
        err = from_wire(env.get("error") or {})
        if isinstance(err, Unavailable) and err.reason in DAEMON_GONE:
            self._check_daemon(name, err)
        raise err

    def _call(self, name: str, method: str, *args, timeout: float | None = None, force: bool = False):
        node = self._node(name)
        if not node.alive and not force:
            raise Unavailable(f"node {name} is down: {node.down_reason}", reason=Reason.NODE_DOWN)
        return self._get(name, getattr(node.actor, method).remote(*args), timeout)

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise InvalidArgument(f"no node {name!r} in the pool (nodes: {sorted(self._nodes)})",
                                  reason=Reason.UNKNOWN_NODE) from None

    def _check_daemon(self, name: str, err: DrumsError) -> None:
        node = self._nodes[name]
        try:
            env = ray.get(node.actor.ping_daemon.remote(), timeout=30)
            if env.get("ok"):
                return
        except ray.exceptions.RayError:
            pass
        self._mark_down(name, f"daemon: {err.message}")

    def _mark_down(self, name: str, reason: str) -> None:
        with self._lock:
            node = self._nodes[name]
            if not node.alive:
                return
            node.alive = False
            node.down_reason = reason
            lost = list(node.sessions.values())
            node.sessions.clear()
            self.lost.extend(lost)
            for st in self._states.values():
                st.copies.discard(name)
        log.error("node %s is down (%s); %d sessions lost: %s", name, reason, len(lost), [s.id for s in lost])

    def _track(self, node: str, sessions: list[dict], snapshot: str | None = None) -> list[SessionRef]:
        refs = [SessionRef(id=s["id"], node=node, session=s, snapshot=snapshot) for s in sessions]
        with self._lock:
            for r in refs:
                self._nodes[node].sessions[r.id] = r
        return refs

    # ------------------------------------------------------------------ nodes
    @property
    def node_names(self) -> list[str]:
        return list(self._nodes)

    def alive(self, name: str) -> bool:
        return self._node(name).alive

    def node_info(self, name: str) -> dict:
        info = self._call(name, "info")
        self._nodes[name].info = info
        return info

    def infos(self) -> dict[str, dict]:
        """Fresh ``info`` of every alive node (asked in parallel); a node that fails is marked down."""
        refs = {n: node.actor.info.remote() for n, node in self._nodes.items() if node.alive}
        out = {}
        for n, ref in refs.items():
            try:
                out[n] = self._get(n, ref, timeout=60)
                self._nodes[n].info = out[n]
            except DrumsError as exc:
                log.warning("node %s: %s", n, exc)
        return out

    def sweep_node(self, name: str) -> dict:
        """Run the sweep on ``name`` (its dead daemon runs' processes, mounts, links, tables go)."""
        return self._call(name, "sweep", force=True, timeout=600)

    def revive_node(self, name: str, daemon_env: dict | None = None) -> dict:
        """Start a fresh daemon on ``name`` (recovery runs first) and use the node again."""
        res = self._call(name, "restart_daemon", daemon_env, force=True, timeout=180)
        node = self._nodes[name]
        with self._lock:
            node.alive, node.down_reason = True, None
        node.info = self._call(name, "info")
        return res

    # ------------------------------------------------------------------ sessions and states
    def create(self, spec: dict | None = None, node: str | None = None) -> SessionRef:
        """A cold desktop (an OSWorld desktop by default) on ``node`` or on the freest node."""
        name = node or self._freest()
        return self._track(name, [self._call(name, "create", spec)])[0]

    def setup_task(self, session: SessionRef, task: Any) -> dict:
        return self._call(session.node, "setup_task", session.id, self._task_dict(task))

    def checkpoint(self, session: SessionRef, name: str | None = None, leave_running: bool = False) -> StateRef:
        snap = self._call(session.node, "checkpoint", session.id, name, leave_running)
        if not leave_running:
            with self._lock:
                self._nodes[session.node].sessions.pop(session.id, None)
        st = StateRef(id=snap["id"], home=session.node, copies={session.node}, name=snap.get("name"),
                      size=int(snap.get("size") or 0), snapshot=snap)
        with self._lock:
            self._states[st.id] = st
        return st

    def prepare(self, task: Any, node: str | None = None, name: str | None = None) -> StateRef:
        """Boot a desktop, run the task's setup, checkpoint it (the desktop is consumed): the start state."""
        t = self._task_dict(task)
        s = self.create(node=node)
        try:
            self.setup_task(s, t)
        except BaseException:
            self._destroy_quietly(s)
            raise
        return self.checkpoint(s, name=name or f"rollout-start:{t['id']}"[:120], leave_running=False)

    def destroy(self, session: SessionRef) -> dict:
        res = self._call(session.node, "destroy", session.id)
        with self._lock:
            self._nodes[session.node].sessions.pop(session.id, None)
        return res

    def _destroy_quietly(self, session: SessionRef) -> None:
        try:
            self.destroy(session)
        except DrumsError as exc:
            log.warning("destroy of %s on %s failed: %s", session.id, session.node, exc)

    def wait_live(self, session: SessionRef, timeout: float = 30.0) -> dict:
        s = self._call(session.node, "wait_live", session.id, timeout)
        session.session = s
        return s

    def run_actions(self, session: SessionRef, actions: list, pause: float = 0.2) -> dict:
        return self._call(session.node, "run_actions", session.id, actions, pause)

    def evaluate(self, session: SessionRef, task: Any, last_action: Any = None) -> float:
        return self._call(session.node, "evaluate", session.id, self._task_dict(task), last_action)

    def sessions(self) -> list[SessionRef]:
        with self._lock:
            return [s for n in self._nodes.values() for s in n.sessions.values()]

    def delete_state(self, state: StateRef) -> list[str]:
        """Delete the checkpoint on every node holding it; returns the nodes where that failed."""
        failed = []
        for name in sorted(state.copies):
            try:
                self._call(name, "delete_snapshot", state.id)
            except DrumsError as exc:
                log.warning("delete of %s on %s failed: %s", state.id, name, exc)
                failed.append(name)
        state.copies = set(failed)
        return failed

    def forget_copy(self, state: StateRef, node: str) -> None:
        """Delete the copy of ``state`` on ``node`` (not its home): the next branch there ships it again."""
        if node == state.home:
            raise InvalidArgument(f"{node} is the home of {state.id}, not a copy", reason=Reason.BAD_NODES)
        self._call(node, "delete_snapshot", state.id)
        with self._lock:
            state.copies.discard(node)

    @staticmethod
    def _task_dict(task: Any) -> dict:
        from ..tasks import load_task

        return load_task(task, require_drums_support=True).to_dict()

    # ------------------------------------------------------------------ placement and transfer
    def _freest(self, infos: dict | None = None) -> str:
        infos = infos if infos is not None else self.infos()
        if not infos:
            raise Unavailable("no node of the pool is up", reason=Reason.NO_NODE)
        name = max(infos, key=lambda n: (infos[n]["free"], -self.node_names.index(n)))
        if infos[name]["free"] < 1:
            raise Unavailable("every node of the pool is full", reason=Reason.NO_CAPACITY)
        return name

    def _order(self, state: StateRef, names: list[str]) -> list[str]:
        """Holders first (the home, then copies), then the rest in the pool's order."""
        holders = [state.home] + sorted(state.copies - {state.home})
        return [n for n in holders if n in names] + [n for n in names if n not in state.copies]

    def ensure_copy(self, state: StateRef, target: str) -> dict | None:
        """Ship ``state`` (and what of its chain ``target`` lacks) to ``target``. None when it is there."""
        with self._lock:
            lock = self._transfer_locks.setdefault((state.id, target), threading.Lock())
        with lock:
            if target in state.copies:
                return None
            sources = [n for n in self._order(state, list(self._nodes)) if n in state.copies and self._nodes[n].alive]
            if not sources:
                raise Unavailable(f"no node holding {state.id} is up", reason=Reason.NO_SOURCE)
            source = sources[0]
            t0 = time.monotonic()
            chain = self._call(source, "chain", state.id)
            have = self._call(target, "have", chain)
            if state.id in have:
                with self._lock:
                    state.copies.add(target)
                return None
            bundle = self._call(source, "export", state.id, have)
            try:
                rec = self._call(target, "receive", self._nodes[source].actor, bundle)
            finally:
                try:
                    self._call(source, "release", bundle["token"], timeout=60)
                except DrumsError as exc:
                    log.warning("release of bundle %s on %s: %s", bundle["token"], source, exc)
            record = {"snapshot": state.id, "source": source, "target": target, "chain": chain, "skipped": have,
                      "imported": rec["imported"], "bytes": bundle["bytes"], "files": bundle.get("files"),
                      "sha256": bundle["sha256"], "received_sha256": rec["sha256"],
                      "verified": bool(rec["verified"] and rec["sha256"] == bundle["sha256"]),
                      "via": {"export": bundle.get("via"), "import": rec.get("via")},
                      "seconds": {"pack": round(bundle["seconds"], 4), "pull": round(rec["pull_seconds"], 4),
                                  "import": round(rec["import_seconds"], 4),
                                  "total": round(time.monotonic() - t0, 4)}}
            with self._lock:
                state.copies.add(target)
                self.transfers.append(record)
            log.info("shipped %s %s -> %s: %d MiB in %.2fs (verified %s)", state.id, source, target,
                     record["bytes"] >> 20, record["seconds"]["total"], record["verified"])
            return record

    def branch(self, state: StateRef, n: int, wait_live: bool = False, nodes: list[str] | None = None) -> Branch:
        """``n`` siblings of ``state``: on its holders first, shipped to others when those are full.

        Never raises for a node's failure: the siblings that could be made are in ``siblings``, the
        rest in ``failures`` (with each node's error: ``Unavailable`` when its daemon or node died).
        """
        if not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"n must be a positive integer, not {n!r}", reason=Reason.BAD_COUNT)
        t0 = time.monotonic()
        names = [x for x in (nodes or self.node_names) if self._node(x).alive]
        infos = self.infos()
        plan: list[tuple[str, int]] = []
        left = n
        for name in self._order(state, [x for x in names if x in infos]):
            k = min(left, int(infos[name]["free"]))
            if k > 0:
                plan.append((name, k))
                left -= k
        failures: list[NodeFailure] = []
        if left:
            failures.append(NodeFailure(node=None, count=left, stage="placement",
                                        error=Unavailable(f"no room for {left} of {n} siblings on the pool's nodes",
                                                          reason=Reason.NO_CAPACITY)))
        siblings: list[SessionRef] = []
        transfers: list[dict] = []
        timings: dict[str, dict] = {}

        def run(name: str, k: int) -> None:
            tm: dict[str, Any] = {"count": k}
            timings[name] = tm
            stage = "transfer"
            try:
                ts = time.monotonic()
                rec = self.ensure_copy(state, name)
                tm["transfer"] = round(time.monotonic() - ts, 4) if rec else 0.0
                if rec:
                    transfers.append(rec)
                stage = "restore"
                ts = time.monotonic()
                sessions = self._call(name, "restore", state.id, k, wait_live)
                tm["restore"] = round(time.monotonic() - ts, 4)
                tm["criu"] = [round(s.get("timings", {}).get("criu", 0.0), 4) for s in sessions]
                siblings.extend(self._track(name, sessions, state.id))
            except DrumsError as exc:
                tm["error"] = exc.reason
                failures.append(NodeFailure(node=name, count=k, stage=stage, error=exc))

        with ThreadPoolExecutor(max_workers=max(1, len(plan))) as ex:
            list(ex.map(lambda p: run(*p), plan))
        order = {name: i for i, (name, _) in enumerate(plan)}
        siblings.sort(key=lambda s: order.get(s.node, 99))
        b = Branch(state=state, requested=n, siblings=siblings, failures=failures,
                   placement={name: k for name, k in plan}, transfers=transfers, timings=timings)
        b.timings["total"] = {"seconds": round(time.monotonic() - t0, 4)}
        return b

    # ------------------------------------------------------------------ rollouts
    def map_rollouts(self, task: Any, actions: list, branches: int, state: StateRef | None = None,
                     concurrency: int | None = None, pause: float = 0.2, retries: int = 1,
                     verify_live: bool = True) -> Rollouts:
        """``branches`` rollouts of ``task`` from ``state``, each scored by the task's evaluator.

        ``actions``: one script for every branch, or one per branch. Without ``state`` the start
        state is made here (:meth:`prepare`) and deleted afterwards. At most ``concurrency``
        rollouts run at once (default: all that fit). A rollout failing ``Unavailable`` is retried
        on another node up to ``retries`` times; other errors are recorded in its result.
        """
        t_all = time.monotonic()
        tdict = self._task_dict(task)
        scripts = scripts_for(actions, branches)
        own = state is None
        timings: dict[str, float] = {}
        if own:
            t = time.monotonic()
            state = self.prepare(tdict)
            timings["prepare"] = time.monotonic() - t
        assert state is not None
        try:
            schedule = RolloutSchedule(self, state, tdict, scripts, concurrency=concurrency, pause=pause,
                                       retries=retries, verify_live=verify_live)
            t_roll = time.monotonic()
            results = schedule.run()
            timings["rollouts"] = time.monotonic() - t_roll
        finally:
            if own:
                self.delete_state(state)
        timings["total"] = time.monotonic() - t_all
        return Rollouts(task=tdict["id"], state=state.id, results=results, transfers=schedule.transfers,
                        concurrency=schedule.limit, timings={k: round(v, 4) for k, v in timings.items()})

    # ------------------------------------------------------------------ the end
    def close(self, destroy_sessions: bool = True, stop_daemons: bool = False) -> None:
        """Destroy the pool's sessions (best effort), optionally stop the daemons, end the agents."""
        for name, node in self._nodes.items():
            if node.alive and destroy_sessions:
                for s in list(node.sessions.values()):
                    self._destroy_quietly(s)
            if stop_daemons:
                try:
                    self._call(name, "shutdown_daemon", True, force=True, timeout=120)
                except DrumsError as exc:
                    log.warning("stopping the daemon of %s: %s", name, exc)
        for node in self._nodes.values():
            try:
                ray.get(node.actor.close.remote(), timeout=30)
            except ray.exceptions.RayError:
                pass
            try:
                ray.kill(node.actor)
            except (ValueError, ray.exceptions.RayError):
                pass
