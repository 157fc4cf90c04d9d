"""The node side of the Ray rollout farm: one agent per host, serving that host's Drums daemon.

A :class:`NodeAgent` runs as a Ray actor pinned to its node (see :mod:`drums_osworld.farm.pool`).
It starts that node's ``drumsd`` (or connects to the one running) and does everything that must
happen on the host itself: the daemon calls, the guest server calls (a desktop's guest server is
reachable only from its host, on a link-local address), task setup and scoring, packing a
snapshot chain for another node and receiving one.

Contracts:

* Every method returns an envelope, ``{"ok": True, "result": ...}`` or ``{"ok": False, "error":
  <DrumsError wire form>}``, so the driver rebuilds the same error classes (``Unavailable``,
  ``Internal``...) whatever Ray does with exceptions. Anything that is not a ``DrumsError``
  crosses as ``Internal``.
* The daemon is started once, *detached* (:func:`drums_core.client.start_daemon` with
  ``detach=True``, a double fork: a Ray worker kills its own children when it exits, and the
  daemon is the host's, not the actor's). After that the agent never restarts it
  behind the caller's back: a dead daemon fails calls with ``Unavailable`` (``DAEMON_DIED`` for the
  calls in flight, ``DAEMON_DOWN`` after), until :meth:`NodeAgent.restart_daemon`.
* Transfers: :meth:`export` packs a chain into this agent's spool (``DRUMS_TRANSFER_DIR``, default
  /var/tmp/drums-transfer, ``<instance>/agent-<pid>/``, mode 0700) and hands out a token; the receiving agent pulls it
  chunk by chunk with :meth:`read_chunk` (Ray moves the bytes), verifies the sender's sha256 and
  imports it (:func:`drums_core.store.transfer.import_snapshot`; through the daemon's
  ``import_snapshot`` operation when the daemon has it, else in this process, which runs as root
  on the same host and follows the store's stage/publish/commit protocol).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from drums_core.client import Client, start_daemon
from drums_core.config import Instance
from drums_core.errors import DrumsError, Internal, InvalidArgument, NotFound, Unavailable
from drums_core.reasons import Reason

from ..actions import run_script

log = logging.getLogger("drums.osworld.ray_node")

CHUNK_BYTES = 8 << 20

__all__ = ["CHUNK_BYTES", "NodeAgent"]


def _envelope(fn):
    """Run ``fn``; its result or its error as data (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return {"ok": True, "result": fn(self, *args, **kwargs)}
        except DrumsError as exc:
            return {"ok": False, "error": exc.to_wire()}
        except Exception as exc:  # noqa: BLE001 - everything else crosses the boundary as Internal
            log.exception("%s failed on node %s", fn.__name__, getattr(self, "name", "?"))
            return {"ok": False, "error": Internal(f"{fn.__name__} on node {getattr(self, 'name', '?')}: "
                                                   f"{type(exc).__name__}: {exc}",
                                                   reason=Reason.NODE_INTERNAL).to_wire()}

    wrapper.__drums_envelope__ = True
    return wrapper


class NodeAgent:
    """One node's agent (a Ray actor; a plain class, usable without Ray for tests)."""

    def __init__(self, name: str, instance: dict, daemon_env: dict | None = None, capacity: int | None = None,
                 spool_root: str | None = None, call_timeout: float = 900.0) -> None:
        from drums_core.store.transfer import SPOOL_ROOT

        self.name = name
        self.instance = Instance(name=instance["name"], slot_base=int(instance["slot_base"]),
                                 slot_count=int(instance["slot_count"]))
        self.daemon_env = dict(daemon_env or {})
        self.capacity = int(capacity or self.instance.slot_count)
        # this agent's spool: <root>/<instance>/agent-<pid>; spools of dead agents go
        self.spool = Path(spool_root or SPOOL_ROOT) / self.instance.name / f"agent-{os.getpid()}"
        self.client = Client(self.instance, autostart=False, timeout=call_timeout)
        self._exports: dict[str, str] = {}
        self._imports: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._daemon_has_transfer: bool | None = None
        self._drop_dead_spools()
        self.spool.mkdir(parents=True, mode=0o700, exist_ok=True)
        start_daemon(self.instance, self.daemon_env, detach=True)
        self.daemon_pid = self.client.ping()["pid"]

    def _drop_dead_spools(self) -> None:
        parent = self.spool.parent
        if not parent.is_dir():
            return
        for d in parent.glob("agent-*"):
            pid = d.name.removeprefix("agent-")
            if d == self.spool or not pid.isdigit() or not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(d, ignore_errors=True)  # a dead agent's transfers died with it

    # ------------------------------------------------------------------ node
    @_envelope
    def info(self) -> dict:
        sessions = self.client.list()
        node_id = None
        try:
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return {"node": self.name, "ray_node_id": node_id, "host": socket.gethostname(), "pid": os.getpid(),
                "instance": {"name": self.instance.name, "slot_base": self.instance.slot_base,
                             "slot_count": self.instance.slot_count},
                "daemon_pid": self.client.ping()["pid"], "capacity": self.capacity, "sessions": len(sessions),
                "free": max(0, min(self.capacity, self.instance.slot_count) - len(sessions))}

    @_envelope
    def ping_daemon(self) -> dict:
        return self.client.ping()

    @_envelope
    def restart_daemon(self, env: dict | None = None) -> dict:
        """Start a fresh daemon (its recovery adopts live sessions and sweeps the dead run's rest)."""
        if env is not None:
            self.daemon_env = dict(env)
        start_daemon(self.instance, self.daemon_env, detach=True)
        self.daemon_pid = self.client.ping()["pid"]
        return {"daemon_pid": self.daemon_pid}

    @_envelope
    def sweep(self) -> dict:
        """Sweep this node's dead daemon runs (what a dead daemon left: processes, mounts, links, tables)."""
        from drums_core.sweep import sweep

        return sweep(self.instance.ledger_root).to_dict()

    @_envelope
    def close(self) -> dict:
        """Drop this agent's spool (exports not yet pulled, partial receives)."""
        with self._lock:
            self._exports.clear()
        shutil.rmtree(self.spool, ignore_errors=True)
        try:
            self.spool.parent.rmdir()  # the instance's spool, when no other agent uses it
        except OSError:
            pass
        return {"closed": True}

    @_envelope
    def shutdown_daemon(self, destroy_sessions: bool = True) -> dict:
        Client(self.instance, autostart=False).shutdown(destroy_sessions=destroy_sessions)
        return {"stopped": True}

    # ------------------------------------------------------------------ sessions
    @_envelope
    def create(self, spec: dict | None = None) -> dict:
        from ..desktop import desktop_spec

        return self.client.create(spec or desktop_spec())

    @_envelope
    def setup_task(self, sid: str, task: dict) -> dict:
        """Run the task's ``config`` steps in the session's desktop (``DesktopEnv.reset``'s setup)."""
        from ..evaluation import run_task_setup

        t0 = time.monotonic()
        with self._guest(sid) as guest:
            run_task_setup(task, guest)
        return {"seconds": time.monotonic() - t0}

    @_envelope
    def checkpoint(self, sid: str, name: str | None = None, leave_running: bool = False,
                   snapshot_id: str | None = None) -> dict:
        return self.client.checkpoint(sid, name=name, leave_running=leave_running, snapshot_id=snapshot_id)

    @_envelope
    def restore(self, snapshot: str, count: int = 1, wait_live: bool = False) -> list[dict]:
        return self.client.restore(snapshot, count=count, wait_live=wait_live)

    @_envelope
    def wait_live(self, sid: str, timeout: float = 30.0) -> dict:
        return self.client.wait_live(sid, timeout=timeout)

    @_envelope
    def get(self, sid: str) -> dict:
        return self.client.get(sid)

    @_envelope
    def destroy(self, sid: str) -> dict:
        return self.client.destroy(sid)

    @_envelope
    def list(self) -> list[dict]:
        return self.client.list()

    @_envelope
    def run_actions(self, sid: str, actions: list, pause: float = 0.2) -> dict:
        with self._guest(sid) as guest:
            return run_script(guest, actions, pause)

    @_envelope
    def evaluate(self, sid: str, task: dict, last_action: Any = None) -> float:
        from ..evaluation import evaluate

        with self._guest(sid) as guest:
            return evaluate(task, guest, last_action=last_action)

    @_envelope
    def rollout(self, snapshot: str, task: dict, actions: list, pause: float = 0.2, verify_live: bool = True,
                keep: bool = False) -> dict:
        """Restore one sibling of ``snapshot``, run ``actions``, score it with the task's evaluator, destroy it."""
        from ..evaluation import evaluate

        out: dict[str, Any] = {"node": self.name, "session": None, "timings": {}}
        t0 = time.monotonic()
        s = self.client.restore(snapshot, count=1)[0]
        out["session"] = s["id"]
        out["timings"]["restore"] = time.monotonic() - t0
        out["reseed_draw"] = s.get("timings", {}).get("reseed_draw")
        out["hostname"] = s.get("hostname")
        try:
            with self._guest_for(s) as guest:
                t = time.monotonic()
                ran = run_script(guest, actions, pause)
                out["timings"]["actions"] = time.monotonic() - t
                out.update(actions_run=ran["actions_run"], last_action=ran["last_action"], errors=ran["errors"])
                t = time.monotonic()
                out["score"] = evaluate(task, guest, last_action=ran["last_action"])
                out["timings"]["evaluate"] = time.monotonic() - t
            if verify_live:
                t = time.monotonic()
                out["liveness"] = self.client.wait_live(s["id"], timeout=30)["liveness"]
                out["timings"]["liveness_wait"] = time.monotonic() - t
        finally:
            if not keep:
                try:
                    self.client.destroy(s["id"])
                except DrumsError as exc:
                    out["destroy_error"] = str(exc)
        out["timings"]["total"] = time.monotonic() - t0
        return out

    def _guest(self, sid: str):
        return self._guest_for(self.client.get(sid))

    @staticmethod
    def _guest_for(session: dict):
        from ..desktop import GUEST_PORT
        from ..guest.client import GuestClient

        return GuestClient(session["address"], GUEST_PORT, timeout=180.0)

    # ------------------------------------------------------------------ snapshots
    @_envelope
    def snapshots(self) -> list[dict]:
        return self.client.snapshots()

    @_envelope
    def have(self, ids: list[str]) -> list[str]:
        """Which of ``ids`` this node's store holds, committed."""
        have = {s["id"] for s in self.client.snapshots() if s.get("state") == "committed"}
        return [i for i in ids if i in have]

    @_envelope
    def chain(self, snapshot: str) -> list[str]:
        """The ids of ``snapshot`` and its ancestors, oldest first."""
        from drums_core.store.transfer import snapshot_chain

        return [s.id for s in snapshot_chain(self._store(), snapshot)]

    @_envelope
    def delete_snapshot(self, snapshot: str) -> dict:
        return self.client.delete_snapshot(snapshot)

    def _store(self):
        from drums_core.store.snapshots import SnapshotStore

        return SnapshotStore(self.instance.snapshots_dir)

    def _daemon_op(self, op: str, **args):
        """The daemon's transfer operation, or None when this daemon does not have it."""
        if self._daemon_has_transfer is False:
            return None
        try:
            res = self.client.call(op, **args)
        except InvalidArgument as exc:
            if exc.reason == Reason.UNKNOWN_OP:
                self._daemon_has_transfer = False
                return None
            raise
        self._daemon_has_transfer = True
        return res

    @_envelope
    def export(self, snapshot: str, skip: list[str] | None = None) -> dict:
        """Pack ``snapshot``'s chain (minus ``skip``) into the spool; returns the bundle and its token."""
        from drums_core.store.transfer import pack

        self.client.ping()  # a node whose daemon is down does not ship
        token = uuid.uuid4().hex
        dest = self.spool / f"out-{token}.tar"
        res = self._daemon_op("export_snapshot", snapshot=snapshot, dest=str(dest), skip=list(skip or []))
        via = "daemon"
        if res is None:
            res = pack(self._store(), snapshot, dest, skip=skip or ()).to_dict()
            via = "agent"
        with self._lock:
            self._exports[token] = str(dest)
        res.update(token=token, node=self.name, via=via)
        return res

    def read_chunk(self, token: str, offset: int, size: int = CHUNK_BYTES) -> bytes:
        """Bytes ``offset..offset+size`` of an export (raw bytes, not an envelope: the bulk path)."""
        with self._lock:
            path = self._exports.get(token)
        if path is None:
            raise KeyError(f"no export {token!r} on node {self.name}")
        with open(path, "rb") as f:
            f.seek(int(offset))
            return f.read(max(0, min(int(size), 64 << 20)))

    @_envelope
    def release(self, token: str) -> dict:
        with self._lock:
            path = self._exports.pop(token, None)
        if path:
            Path(path).unlink(missing_ok=True)
        return {"released": bool(path)}

    @_envelope
    def receive(self, source, bundle: dict) -> dict:
        """Pull ``bundle`` from the ``source`` agent (a Ray actor handle), verify its sha256, import it."""
        import hashlib

        import ray

        from drums_core.store.transfer import import_snapshot

        self.client.ping()
        top = bundle["top"]
        with self._lock:
            lock = self._imports.setdefault(top, threading.Lock())
        with lock:
            t0 = time.monotonic()
            path = self.spool / f"in-{uuid.uuid4().hex}.tar"
            h = hashlib.sha256()
            got = 0
            try:
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    while got < int(bundle["bytes"]):
                        chunk = ray.get(source.read_chunk.remote(bundle["token"], got, CHUNK_BYTES))
                        if not chunk:
                            raise Unavailable(f"bundle of {top} ended at {got} of {bundle['bytes']} bytes",
                                              reason=Reason.TRANSFER_TRUNCATED)
                        h.update(chunk)
                        f.write(chunk)
                        got += len(chunk)
                pull_s = time.monotonic() - t0
                t1 = time.monotonic()
                res = self._daemon_op("import_snapshot", path=str(path), sha256=bundle["sha256"])
                via = "daemon"
                if res is None:
                    res = import_snapshot(self._store(), path, bundle["sha256"])
                    via = "agent"
                res.update(node=self.name, via=via, pulled_bytes=got, pulled_sha256=h.hexdigest(),
                           pull_seconds=pull_s, import_seconds=time.monotonic() - t1)
                return res
            except ray.exceptions.RayError as exc:
                raise Unavailable(f"pulling the bundle of {top} from {bundle.get('node')} failed: {exc}",
                                  reason=Reason.SOURCE_UNAVAILABLE) from exc
            finally:
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ tests and benchmarks
    @_envelope
    def store_file(self, snapshot: str, name: str) -> str:
        """The path of a file of a committed snapshot in this node's store (IMPORTED, manifest.json)."""
        if name not in ("IMPORTED", "manifest.json", "COMMITTED"):
            raise InvalidArgument(f"not a store file: {name!r}", reason=Reason.BAD_REQUEST)
        p = self.instance.snapshots_dir / snapshot / name
        if not p.exists():
            raise NotFound(f"{p} does not exist", reason=Reason.NOT_FOUND)
        return p.read_text()
