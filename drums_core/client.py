"""The client library: talks to ``drumsd`` over its unix socket, starting it when none is running.

    >>> c = Client()
    >>> s = c.create()                    # a cold desktop: a Session record
    >>> snap = c.checkpoint(s.id)         # CRIU dump + frozen layer: a Snapshot record
    >>> sibs = c.restore(snap.id, count=4)

Results are the typed records of :mod:`drums_core.records` (which also read as the daemon's JSON
objects: ``s["id"]``, ``s.get("address")``). Errors arrive as the same classes the daemon raised
(see :mod:`drums_core.errors`).
"""
from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import protocol
from .config import VENV, Instance, instance_from_env
from .errors import DrumsError, Unavailable
from .reasons import Reason
from .records import ExecResult, Process, Session, Snapshot, Window


__all__ = ["Client"]


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
                              reason=Reason.DAEMON_START_FAILED)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _answers(instance):
                return
            if not detach and proc.poll() is not None:
                raise Unavailable(f"drumsd exited with {proc.returncode}: {_stderr_tail(instance)}",
                                  reason=Reason.DAEMON_START_FAILED)
            time.sleep(0.05)
        raise Unavailable(f"drumsd ({instance.name}) did not answer within {wait}s; stderr: {_stderr_tail(instance)}",
                          reason=Reason.DAEMON_START_FAILED)
    finally:
        os.close(lock)


def _stderr_tail(instance: Instance) -> str:
    try:
        return instance.stderr_file.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


class Client:
    """A connection to the Drums daemon (``drumsd``) of one instance; it starts the daemon on first use.

    Args:
        instance: which daemon (name, slot range, state directory); default: ``DRUMS_INSTANCE``
            and friends from the environment (see :func:`drums_core.config.instance_from_env`).
        autostart: start the daemon when none answers (else calls raise ``Unavailable``
            ``DAEMON_DOWN``).
        timeout: seconds to wait for each reply.
        daemon_env: environment variables added to a daemon this client starts.

    Each method is one request; the daemon runs it to completion even if the client goes away.
    Errors are :class:`~drums_core.errors.DrumsError` subclasses with a stable ``reason``:
    ``Unavailable`` (nothing happened or all was rolled back: retry), ``Busy``,
    ``FailedPrecondition``, ``NotFound``, ``InvalidArgument`` (nothing changed) and ``Internal``
    (the session or snapshot is marked broken: do not retry blindly). Every call can also raise
    ``Unavailable`` ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED`` or ``TIMEOUT``, and
    ``InvalidArgument`` ``BAD_REQUEST`` for a malformed request.
    """

    def __init__(self, instance: Instance | None = None, autostart: bool = True, timeout: float = 900.0,
                 daemon_env: dict | None = None) -> None:
        self.instance = instance or instance_from_env()
        self.autostart = autostart
        self.timeout = timeout
        self.daemon_env = daemon_env or {}

    def __repr__(self) -> str:
        return f"Client(instance={self.instance.name!r})"

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

    def call(self, op: str, **args: Any) -> Any:
        """Send one raw request ``{"op": op, "args": args}`` and return the daemon's decoded result.

        The low-level door under every other method: results are plain JSON values (dicts and
        lists; ``bytes`` where the daemon sent bytes), not records.

        Raises:
            DrumsError: whatever the operation raised in the daemon, as the same class and reason
                (``InvalidArgument`` ``UNKNOWN_OP`` for an unknown ``op``, ``BAD_REQUEST`` for a
                missing argument).
            Unavailable: ``DAEMON_DOWN`` (no daemon and ``autostart`` off), ``DAEMON_START_FAILED``,
                ``DAEMON_DIED`` (the connection closed mid-call), ``TIMEOUT`` (no reply within
                ``timeout`` seconds; the operation may still complete in the daemon).
        """
        try:
            sk = self._connect()
        except (FileNotFoundError, ConnectionRefusedError):
            if not self.autostart:
                raise Unavailable(f"drumsd ({self.instance.name}) is not running", reason=Reason.DAEMON_DOWN) from None
            self.start_daemon()
            sk = self._connect()
        try:
            sk.sendall(protocol.encode_request(op, args))
            buf = b""
            while not buf.endswith(protocol.FRAME_END):
                chunk = sk.recv(1 << 20)
                if not chunk:
                    raise Unavailable(f"drumsd closed the connection during {op}", reason=Reason.DAEMON_DIED)
                buf += chunk
        except socket.timeout as exc:
            raise Unavailable(f"drumsd did not answer {op} within {self.timeout}s", reason=Reason.TIMEOUT) from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Unavailable(f"drumsd connection lost during {op}: {exc}", reason=Reason.DAEMON_DIED) from exc
        finally:
            sk.close()
        return protocol.decode_reply(buf)

    def _send(self, op: str, *values: Any) -> Any:
        """Send ``op`` with its arguments in the table's order (:data:`drums_core.protocol.OPS`),
        checked there first: a mistyped one raises InvalidArgument without a request."""
        return self.call(op, **protocol.OPS[op].request(*values))

    def ping(self) -> dict:
        """Whether the daemon answers, and who it is.

        Returns:
            ``{"run", "pid", "instance", "uptime"}``: its run id, process id, instance name and
            seconds since it started.

        Raises:
            Unavailable: ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED``, ``TIMEOUT`` (see :meth:`call`).
        """
        return self._send("ping")

    def start_daemon(self, wait: float = 60.0) -> None:
        """Start drumsd for this instance (once, even with racing clients) and wait until it answers.

        Args:
            wait: seconds to wait for the daemon to answer a ping.

        Raises:
            Unavailable: ``DAEMON_START_FAILED`` when the daemon exits (its stderr's tail is in the
                message) or does not answer within ``wait`` seconds.
        """
        start_daemon(self.instance, self.daemon_env, wait=wait)

    def daemon_pid(self) -> int | None:
        """The daemon's process id, or None when it does not answer (never raises a DrumsError;
        with ``autostart`` on, asking starts it)."""
        try:
            return self.call("ping")["pid"]
        except DrumsError:
            return None

    # -------------------------------------------------------------- operations
    def create(self, spec: dict | None = None) -> Session:
        """Boot a cold desktop session and return it once it is ready.

        Args:
            spec: the session spec (fields of ``drums_core.session.model.SessionSpec``: ``image``,
                ``screen``, ``programs``, ``wait_port``, ``expect_window``, ``network``,
                ``limits``, ...); default: a bare desktop of the ``default`` image.

        Returns:
            The new :class:`~drums_core.records.Session` (``state`` ``RUNNING``).

        Raises:
            InvalidArgument: ``BAD_SPEC`` (unknown field, bad size, screen, env, limits or
                program), ``INVALID_NAME``, ``BAD_NETWORK``, ``BAD_LIMITS``.
            NotFound: ``IMAGE_NOT_FOUND`` (the image is not built).
            Unavailable: ``NO_SLOT`` (every slot of the instance in use), ``START_FAILED``,
                ``LAUNCH_FAILED``, ``SESSION_DIED``, ``NOT_READY`` (the desktop did not get ready
                within ``ready_timeout``); all rolled back, nothing is left.
            FailedPrecondition: ``CGROUP_UNAVAILABLE``, ``CONTROLLER_NOT_ENABLED`` (the host
                cannot apply the limits); ``PROGRAM_MISSING``, ``DESKTOP_MISSING`` (the image has
                no such program: the window manager, a program or the desktop session the spec
                names; the message and ``detail["program"]`` name it).
        """
        return Session.from_dict(self._send("create", spec or {}))

    def checkpoint(self, session: str, name: str | None = None, snapshot_id: str | None = None,
                   leave_running: bool = False, scope: str | None = None, cache: bool = False) -> Snapshot:
        """CRIU-dump a session and freeze its writable layer into a snapshot.

        Idempotent on (``session``, ``snapshot_id``): a retry with the same id returns the
        committed snapshot instead of dumping again.

        Args:
            session: the session's id.
            name: a name to find the snapshot by (``restore(name)``); names need not be unique
                (the newest wins).
            snapshot_id: the id to give it (default: a fresh one); reuse it to retry safely.
            leave_running: keep the session running (same id and address) after the dump;
                otherwise it is gone.
            scope: the namespace ``name`` is looked up in (default: the session's id).
            cache: the store may evict it when nothing uses it (a state the caller can make
                again); otherwise it is pinned.

        Returns:
            The :class:`~drums_core.records.Snapshot`; its ``store["actions"]`` list what was
            evicted or spilled to make room.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            InvalidArgument: ``INVALID_NAME`` (a hostile name or id).
            Busy: ``SESSION_BUSY`` (another operation holds the session).
            FailedPrecondition: ``SNAPSHOT_ID_CONFLICT`` (the id is taken with other parameters).
            Unavailable: ``STORE_FULL`` (no room even after evicting and spilling); nothing happened.
                ``SNAPSHOT_TOO_LARGE`` (it may add more than one checkpoint may, ``DRUMS_SNAPSHOT_MAX``;
                refused before anything was written, evicted or spilled).
                ``CRIU_FAILED`` (CRIU refused the dump; its error lines in ``detail``) and
                ``SOCKET_IN_FLIGHT`` (the images held a socket passed in a message not yet read,
                which CRIU cannot reliably restore): a state usually transient (a message in a
                queue, a thread still exiting) is tried again up to 5 times over 1.5 s first; the
                session runs on untouched and no snapshot is left.
            Internal: ``SESSION_BROKEN`` (the session was already broken), ``CHECKPOINT_FAILED``
                (CRIU's lines in ``detail``; the session is marked broken).
        """
        return Snapshot.from_dict(self._send("checkpoint", session, name, snapshot_id, leave_running, scope, cache))

    def restore(self, snapshot: str, count: int = 1, wait_live: bool = False, expect_window: str | None = None,
                scope: str | None = None, min_nonblank: float = 0.0) -> list[Session]:
        """Restore ``count`` sibling sessions of a snapshot at once (a branch); all or nothing.

        Each sibling gets its own address, hostname and writable layer, and is returned once its
        desktop is ready: ``expect_window`` is mapped and the screen is not blank. Its liveness
        (the checkpointed processes still there a few seconds later) is checked afterwards
        without holding the caller, unless ``wait_live``.

        Args:
            snapshot: the snapshot's id or name (a name resolves within ``scope``; the newest wins).
            count: how many siblings, 1 .. the instance's slot count.
            wait_live: return only after the liveness check passed.
            expect_window: the window title to wait for (default: the snapshot's first window).
            scope: where to resolve a name (default: any scope).
            min_nonblank: the fraction of the screen's pixels, in [0, 1), that must differ from
                the top-left one (0.0: any pixel).

        Returns:
            The :class:`~drums_core.records.Session` of each sibling, in no particular order.

        Raises:
            InvalidArgument: ``BAD_COUNT``, ``BAD_NONBLANK``, ``BAD_WINDOW``, ``INVALID_NAME``.
            NotFound: ``SNAPSHOT_NOT_FOUND`` (unknown, or evicted: ``detail["evicted"]`` says when).
            FailedPrecondition: ``SNAPSHOT_OTHER_BOOT`` (taken before the host rebooted),
                ``IMAGE_MISMATCH``, ``SNAPSHOT_PREDATES_IMAGES``, ``ID_BASE_MISMATCH`` (its image
                is gone or changed).
            Unavailable: ``NO_SLOT``, ``RESTORE_FAILED``, ``RESEED_FAILED``, ``NOT_READY``,
                ``SESSION_DIED``: every sibling was rolled back; retrying is safe.
            Internal: ``SNAPSHOT_BROKEN``, ``IMAGES_CORRUPT``, ``RETRIES_EXHAUSTED`` (3 retryable
                failures in a row), ``LIVENESS_FAILED`` (with ``wait_live``: a process died).
        """
        return [Session.from_dict(s) for s in self._send(
            "restore", snapshot, count, wait_live, expect_window, scope, min_nonblank)]

    def destroy(self, session: str) -> dict:
        """Stop a session and remove everything it holds (processes, mounts, links, cgroup).

        Returns:
            What was removed: ``{"processes": n, "mounts": n, "links": n}``.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            InvalidArgument: ``INVALID_NAME``.
            Busy: ``SESSION_BUSY`` (another operation held it for 30 s).
        """
        return self._send("destroy", session)

    def list(self) -> list[Session]:
        """Every session of this daemon, broken ones included.

        Returns:
            A :class:`~drums_core.records.Session` for each.

        Raises:
            Unavailable: only the transport's ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED``,
                ``TIMEOUT`` (see :meth:`call`).
        """
        return [Session.from_dict(s) for s in self._send("list")]

    def get(self, session: str) -> Session:
        """One session's current record (broken ones too: ``state`` ``BROKEN``, ``broken`` says why).

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            InvalidArgument: ``INVALID_NAME``.
        """
        return Session.from_dict(self._send("get", session))

    def wait_live(self, session: str, timeout: float = 30.0) -> Session:
        """Wait (up to ``timeout`` seconds) for a restored session's liveness verdict.

        Returns:
            The :class:`~drums_core.records.Session`; ``liveness`` is ``ok``, or still
            ``unchecked`` when the timeout passed first.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            Internal: ``SESSION_BROKEN`` (the check failed: the message names the dead process).
        """
        return Session.from_dict(self._send("wait_live", session, timeout))

    def exec(self, session: str, argv: list[str], user: str | None = None, timeout: float = 120.0,
             input: str | None = None) -> ExecResult:
        """Run a command inside a session (its namespaces, root and cgroup; ``DISPLAY=:0``).

        Args:
            session: the session's id.
            argv: the command and its arguments (no shell).
            user: ``None`` or ``"root"`` for root, ``"user"`` for the desktop user (uid 1000,
                its home, D-Bus and runtime directory).
            timeout: seconds before the command is killed.
            input: text fed to its stdin.

        Returns:
            An :class:`~drums_core.records.ExecResult`: ``returncode``, ``stdout``, ``stderr``
            (a failing command is a result, not an error).

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            InvalidArgument: ``BAD_COMMAND`` (empty or non-string argv), ``BAD_USER``.
            Unavailable: ``EXEC_TIMEOUT``.
            Internal: ``SESSION_BROKEN``.
        """
        return ExecResult.from_dict(self._send("exec", session, argv, user, timeout, input))

    def screenshot(self, session: str) -> bytes:
        """The session's whole screen as PNG bytes.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            Unavailable: ``X_UNREACHABLE`` (its X server does not answer).
            Internal: ``SESSION_BROKEN``.
        """
        return self._send("screenshot", session)

    def windows(self, session: str) -> list[Window]:
        """The session's top-level X windows.

        Returns:
            A :class:`~drums_core.records.Window` (``id``, ``title``, ``wm_class``, ``mapped``) each.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
            Unavailable: ``X_UNREACHABLE``.
            Internal: ``SESSION_BROKEN``.
        """
        return [Window.from_dict(w) for w in self._send("windows", session)]

    def memory(self, session: str) -> dict:
        """The session's memory: ``{"pss_kib": total proportional set size, "processes": n}``.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
        """
        return self._send("memory", session)

    def processes(self, session: str) -> list[Process]:
        """The processes in the session's pid namespace, as :class:`~drums_core.records.Process` records.

        Raises:
            NotFound: ``SESSION_NOT_FOUND``.
        """
        return [Process.from_dict(p) for p in self._send("processes", session)]

    def audit(self, a: str, b: str) -> dict:
        """What two sessions share (files, pipes, sockets, devices): ``{"shared": [{"kind",
        "target", "harmless", ...}], ...}``; siblings of a branch should share only harmless ones.

        Raises:
            NotFound: ``SESSION_NOT_FOUND`` (either session).
        """
        return self._send("audit", a, b)

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot in the store, oldest first.

        Returns:
            A :class:`~drums_core.records.Snapshot` each, with ``location`` (``memory`` or
            ``disk``), ``last_used``, ``children`` and ``in_use`` (what holds it, or None).

        Raises:
            Unavailable: only the transport's ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED``,
                ``TIMEOUT`` (see :meth:`call`).
        """
        return [Snapshot.from_dict(s) for s in self._send("snapshots")]

    def store(self) -> dict:
        """The snapshot store's budget and use (``budget``, ``used``, ``on_disk``, ``snapshots``,
        ``spilled``, ...) and its ``recent`` evictions and spills (see drums_core.store.budget).

        Raises:
            Unavailable: only the transport's ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED``,
                ``TIMEOUT`` (see :meth:`call`).
        """
        return self._send("store")

    def snapshot(self, ref: str, scope: str | None = None) -> Snapshot:
        """One snapshot, by id or by name (the newest of that name within ``scope``, or anywhere).

        Raises:
            NotFound: ``SNAPSHOT_NOT_FOUND``.
            FailedPrecondition: ``SNAPSHOT_OTHER_BOOT`` (taken before the host rebooted).
            InvalidArgument: ``INVALID_NAME``.
        """
        return Snapshot.from_dict(self._send("snapshot", ref, scope))

    def spill_snapshot(self, ref: str) -> dict:
        """Move a snapshot nothing uses to the instance's spill directory on disk now.

        Returns:
            The store journal's entry: ``action`` (``spilled`` or ``already on disk``), ``id``,
            ``name``, ``size``, ...

        Raises:
            NotFound: ``SNAPSHOT_NOT_FOUND``.
            FailedPrecondition: ``SPILL_DISABLED``, ``SNAPSHOT_IN_USE``, ``SPILL_FAILED``.
        """
        return self._send("spill_snapshot", ref)

    def delete_snapshot(self, ref: str) -> dict:
        """Delete a snapshot (by id or name) that nothing uses.

        Returns:
            ``{"deleted": id}``.

        Raises:
            NotFound: ``SNAPSHOT_NOT_FOUND``.
            FailedPrecondition: ``SNAPSHOT_IN_USE`` (a session runs on it, or a snapshot stacks on it).
            InvalidArgument: ``INVALID_NAME``.
        """
        return self._send("delete_snapshot", ref)

    def stats(self) -> dict:
        """The daemon's counters: ``{"counters": {...}, "sessions": n, "run": id}``.

        Raises:
            Unavailable: only the transport's ``DAEMON_DOWN``, ``DAEMON_START_FAILED``, ``DAEMON_DIED``,
                ``TIMEOUT`` (see :meth:`call`).
        """
        return self._send("stats")

    def shutdown(self, destroy_sessions: bool = False, wait: float = 30.0) -> None:
        """Stop the daemon (nothing to do when none runs) and wait up to ``wait`` seconds for it to exit.

        Args:
            destroy_sessions: destroy every session first; otherwise sessions outlive the daemon
                and the next daemon adopts them.

        Raises:
            Unavailable: the transport's reasons other than ``DAEMON_DIED`` (a daemon that exits
                before its reply is flushed is a success).
        """
        try:
            pid = self.call("ping")["pid"]
        except DrumsError:
            return
        try:
            self._send("shutdown", destroy_sessions)
        except Unavailable as exc:
            if exc.reason != Reason.DAEMON_DIED:  # it may exit before its reply is flushed
                raise
        deadline = time.monotonic() + wait
        from .session.processes import is_alive

        while time.monotonic() < deadline and is_alive(pid):
            time.sleep(0.02)
