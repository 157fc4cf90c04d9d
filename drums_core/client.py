"""The client library: talks to ``drumsd`` over its unix socket, starting it when none is running.

    >>> c = Client()
    >>> s = c.create()                    # a cold desktop
    >>> snap = c.checkpoint(s["id"])      # CRIU dump + frozen layer
    >>> sibs = c.restore(snap["id"], count=4)

Errors arrive as the same classes the daemon raised (see :mod:`drums_core.errors`).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .config import VENV, Instance, instance_from_env
from .errors import DrumsError, Unavailable, from_wire


def _decode(value):
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _answers(instance: Instance) -> bool:
    try:
        Client(instance, autostart=False, timeout=10).ping()
    except (DrumsError, OSError):
        return False
    return True


def start_daemon(instance: Instance, env: dict | None = None, *, wait: float = 60.0, detach: bool = False) -> None:
    """Start ``drumsd`` for ``instance`` unless one answers, and wait until it answers a ping.

    Racing starters (clients, Ray node agents, the demo) start one daemon: they take
    ``instance.start_lock`` in turn and the later ones find it answering. The daemon runs with
    Drums' own venv (it needs pycriu and pyroute2, whatever interpreter the caller runs in), this
    checkout first on its ``PYTHONPATH``, ``env`` over this process's environment, in a session of
    its own, with its stdout and stderr appended to ``instance.stderr_file`` (its log is
    ``instance.log_file``). ``detach=True`` double-forks it (``setsid --fork``) so that it is not
    this process's child: a Ray worker kills its children when it exits, and the daemon is the
    host's. A detached daemon that exits early is seen only as no answer within ``wait``.
    :class:`Unavailable` (``DAEMON_START_FAILED``) with the tail of its stderr when it does not answer.
    """
    root = instance.state_root
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(instance.start_lock, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(instance):
            return
        full_env = dict(os.environ)
        full_env.update(env or {})
        pkg_parent = str(Path(__file__).resolve().parent.parent)
        paths = [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p and p != pkg_parent]
        full_env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *paths])
        python = str(VENV / "bin/python") if (VENV / "bin/python").exists() else sys.executable
        argv = [python, "-m", "drums_core.daemon", "--instance", instance.name,
                "--slot-base", str(instance.slot_base), "--slot-count", str(instance.slot_count)]
        if detach:
            argv = ["setsid", "--fork", *argv]
        with open(instance.stderr_file, "ab") as errlog:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog, env=full_env,
                                    start_new_session=True, cwd="/")
        if detach and proc.wait(timeout=30) != 0:
            raise Unavailable(f"could not start drumsd for {instance.name}: setsid exited {proc.returncode}",
                              reason="DAEMON_START_FAILED")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _answers(instance):
                return
            if not detach and proc.poll() is not None:
                raise Unavailable(f"drumsd exited with {proc.returncode}: {_stderr_tail(instance)}",
                                  reason="DAEMON_START_FAILED")
            time.sleep(0.05)
        raise Unavailable(f"drumsd ({instance.name}) did not answer within {wait}s; stderr: {_stderr_tail(instance)}",
                          reason="DAEMON_START_FAILED")
    finally:
        os.close(lock)


def _stderr_tail(instance: Instance) -> str:
    try:
        return instance.stderr_file.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


class Client:
    def __init__(self, instance: Instance | None = None, autostart: bool = True, timeout: float = 900.0,
                 daemon_env: dict | None = None) -> None:
        self.instance = instance or instance_from_env()
        self.autostart = autostart
        self.timeout = timeout
        self.daemon_env = daemon_env or {}

    # -------------------------------------------------------------- transport
    def _connect(self) -> socket.socket:
        sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Connect blocking: with a timeout set, a full listen backlog makes an AF_UNIX connect
            # fail at once with EAGAIN (BlockingIOError) instead of waiting for the daemon to accept.
            sk.connect(str(self.instance.socket))
        except OSError:
            sk.close()
            raise
        sk.settimeout(self.timeout)
        return sk

    def call(self, op: str, **args):
        try:
            sk = self._connect()
        except (FileNotFoundError, ConnectionRefusedError):
            if not self.autostart:
                raise Unavailable(f"drumsd ({self.instance.name}) is not running", reason="DAEMON_DOWN") from None
            self.start_daemon()
            sk = self._connect()
        try:
            sk.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = sk.recv(1 << 20)
                if not chunk:
                    raise Unavailable(f"drumsd closed the connection during {op}", reason="DAEMON_DIED")
                buf += chunk
        except socket.timeout as exc:
            raise Unavailable(f"drumsd did not answer {op} within {self.timeout}s", reason="TIMEOUT") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Unavailable(f"drumsd connection lost during {op}: {exc}", reason="DAEMON_DIED") from exc
        finally:
            sk.close()
        reply = json.loads(buf)
        if not reply.get("ok"):
            raise from_wire(reply.get("error") or {})
        return _decode(reply.get("result"))

    def ping(self) -> dict:
        return self.call("ping")

    def start_daemon(self, wait: float = 60.0) -> None:
        """Start drumsd for this instance (once, even with racing clients) and wait for its socket."""
        start_daemon(self.instance, self.daemon_env, wait=wait)

    def daemon_pid(self) -> int | None:
        try:
            return self.call("ping")["pid"]
        except DrumsError:
            return None

    # -------------------------------------------------------------- operations
    def create(self, spec: dict | None = None) -> dict:
        return self.call("create", spec=spec or {})

    def checkpoint(self, session: str, name: str | None = None, snapshot_id: str | None = None,
                   leave_running: bool = False, scope: str | None = None, cache: bool = False) -> dict:
        """The snapshot's record; ``store.actions`` lists what was evicted or spilled to make room.
        ``cache``: the store may evict it when nothing uses it (a state the caller can make again)."""
        args = {"cache": True} if cache else {}  # a daemon of an older version accepts the call unchanged
        return self.call("checkpoint", session=session, name=name, snapshot_id=snapshot_id,
                         leave_running=leave_running, scope=scope, **args)

    def restore(self, snapshot: str, count: int = 1, wait_live: bool = False, expect_window: str | None = None,
                scope: str | None = None, min_nonblank: float = 0.0) -> list[dict]:
        """Restore ``count`` siblings; each is returned once its ``expect_window`` (default: the
        snapshot's first window) is mapped and more than ``min_nonblank`` of the screen's pixels
        differ from the top-left one (0.0: the screen is not blank)."""
        return self.call("restore", snapshot=snapshot, count=count, wait_live=wait_live,
                         expect_window=expect_window, scope=scope, min_nonblank=min_nonblank)

    def destroy(self, session: str) -> dict:
        return self.call("destroy", session=session)

    def list(self) -> list[dict]:
        return self.call("list")

    def get(self, session: str) -> dict:
        return self.call("get", session=session)

    def wait_live(self, session: str, timeout: float = 30.0) -> dict:
        return self.call("wait_live", session=session, timeout=timeout)

    def exec(self, session: str, argv: list[str], user: str | None = None, timeout: float = 120.0,
             input: str | None = None) -> dict:
        return self.call("exec", session=session, argv=argv, user=user, timeout=timeout, input=input)

    def screenshot(self, session: str) -> bytes:
        return self.call("screenshot", session=session)

    def windows(self, session: str) -> list[dict]:
        return self.call("windows", session=session)

    def memory(self, session: str) -> dict:
        return self.call("memory", session=session)

    def processes(self, session: str) -> list[dict]:
        return self.call("processes", session=session)

    def audit(self, a: str, b: str) -> dict:
        return self.call("audit", a=a, b=b)

    def snapshots(self) -> list[dict]:
        """Every snapshot, with ``location`` (memory/disk), ``last_used``, ``children`` and ``in_use``."""
        return self.call("snapshots")

    def store(self) -> dict:
        """The store's budget and use, and its recent evictions and spills (see drums_core.storebudget)."""
        return self.call("store")

    def snapshot(self, ref: str, scope: str | None = None) -> dict:
        return self.call("snapshot", snapshot=ref, scope=scope)

    def spill_snapshot(self, ref: str) -> dict:
        """Move a snapshot nothing uses to the instance's spill directory on disk now."""
        return self.call("spill_snapshot", snapshot=ref)

    def delete_snapshot(self, ref: str) -> dict:
        return self.call("delete_snapshot", snapshot=ref)

    def stats(self) -> dict:
        return self.call("stats")

    def shutdown(self, destroy_sessions: bool = False, wait: float = 30.0) -> None:
        try:
            pid = self.call("ping")["pid"]
        except DrumsError:
            return
        try:
            self.call("shutdown", destroy_sessions=destroy_sessions)
        except Unavailable as exc:
            if exc.reason != "DAEMON_DIED":  # it may exit before its reply is flushed
                raise
        deadline = time.monotonic() + wait
        from .sessionprocs import is_alive

        while time.monotonic() < deadline and is_alive(pid):
            time.sleep(0.02)
