"""``drumsd``: the per-host supervisor daemon, serving the Supervisor over a root-only unix socket.

Protocol: one JSON object per line each way, the operations of the table in :mod:`drums_core.protocol`
(which also holds the codec). An operation runs to completion even when its client goes away (a
checkpoint in flight commits, and a retry with the same snapshot id gets it).

Sessions do not die with the daemon: they are not its children once started. The daemon is a
child subreaper so the sessions' inits, orphaned by their launcher or by CRIU, are reaped here.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socketserver
import sys
import threading
import time

from .. import protocol
from ..config import Instance, check_name
from ..errors import DrumsError
from ..host import kernel_budget, linux
from ..host.kernel_budget import SESSION_PIDS
from ..session import containment, faults
from ..session.supervisor import Supervisor

log = logging.getLogger("drums.daemon")


class _Reaper(threading.Thread):
    """Reaps orphans adopted as subreaper, leaving the daemon's own subprocesses to their owners."""

    def __init__(self, sup: Supervisor) -> None:
        super().__init__(daemon=True, name="reaper")
        self.sup = sup
        self.first_seen: dict[int, float] = {}

    def run(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                time.sleep(0.2)
                continue
            if info is None:
                time.sleep(0.05)
                continue
            pid = info.si_pid
            if pid in self.sup.init_pids_seen or pid in self.sup.adopted_pids:
                self._reap(pid)
                continue
            seen = self.first_seen.setdefault(pid, time.monotonic())
            # Anything else is a child the daemon itself waits for (pycriu's swrk, pyroute2, a
            # subprocess): reaping it first makes their waitpid fail. Only a stray long unclaimed goes.
            if time.monotonic() - seen > 120.0:
                self._reap(pid)
            else:
                time.sleep(0.02)

    def _reap(self, pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        self.first_seen.pop(pid, None)


class Daemon:
    """Serves the operations of :data:`drums_core.protocol.OPS`: each request is checked against the
    table, then handled by ``Supervisor.<serves>`` (arguments in table order) or by the daemon's own
    ``op_<name>`` (arguments by name)."""

    def __init__(self, instance: Instance, liveness_delay: float = 3.0) -> None:
        self.instance = instance
        self.sup = Supervisor(instance, liveness_delay=liveness_delay)
        self.sup.adopted_pids = set()
        self.started = time.time()
        self.server: socketserver.ThreadingUnixStreamServer | None = None

    def dispatch(self, op: protocol.Op, args: dict):
        """Run ``op`` with ``args`` as :meth:`protocol.Op.check` returned them."""
        if op.in_daemon:
            return getattr(self, f"op_{op.name}")(**args)
        return getattr(self.sup, op.serves)(*args.values())

    def handle_line(self, line: bytes) -> bytes:
        """The reply line to one request line."""
        try:
            op, args = protocol.decode_request(line, hooks=faults.test_hooks_enabled())
            if not op.long_running:
                return protocol.encode_reply(self.dispatch(op, args))
            t0, outcome = time.monotonic(), "failed"
            try:
                result = self.dispatch(op, args)
                outcome = "done"
            finally:  # one line for each long operation: what, how it ended, how long it took
                log.info("op %s %s in %.3fs", op.name, outcome, time.monotonic() - t0)
            return protocol.encode_reply(result)
        except Exception as exc:  # noqa: BLE001 - anything unknown crosses the boundary as Internal
            if not isinstance(exc, (DrumsError, KeyError)):
                log.exception("internal error")
            return protocol.encode_error(exc)

    # ---------------------------------------------------------- the operations the daemon handles itself
    def op_ping(self) -> dict:
        return {"run": self.sup.run, "pid": os.getpid(), "instance": self.instance.name,
                "uptime": time.time() - self.started}

    def op_checkpoint(self, **args) -> dict:
        snap = self.sup.checkpoint(*args.values())
        return {**snap.to_dict(), "store": getattr(snap, "store_report", None)}

    def op_audit(self, a: str, b: str) -> dict:
        from ..session.audit import sharing_audit

        layer_devs = {os.stat("/").st_dev, os.stat(self.instance.state_dir).st_dev}
        return sharing_audit(self.sup.get(a).init_pid, self.sup.get(b).init_pid, layer_devs)

    def op_snapshots(self) -> list:
        return self.sup.keeper.describe()

    def op_store(self) -> dict:
        return self.sup.keeper.status()

    def op_snapshot(self, snapshot: str, scope: str | None):
        return self.sup.store.resolve(snapshot, scope)

    def op_spill_snapshot(self, snapshot: str, scope: str | None) -> dict:
        return self.sup.keeper.spill_now(self.sup.store.resolve(snapshot, scope).id)

    def op_delete_snapshot(self, snapshot: str, scope: str | None) -> dict:
        snap = self.sup.store.resolve(snapshot, scope, any_boot=True)
        self.sup.keeper.delete(snap.id)
        return {"deleted": snap.id}

    def op_stats(self) -> dict:
        return {"counters": dict(self.sup.counters), "sessions": len(self.sup.sessions), "run": self.sup.run}

    def op_export_snapshot(self, **args) -> dict:
        from ..store import transfer

        with contextlib.ExitStack() as held:  # a chain being packed is neither evicted nor spilled meanwhile
            for snap in transfer.snapshot_chain(self.sup.store, check_name(args["snapshot"], "snapshot id")):
                held.enter_context(self.sup.keeper.hold(snap.id))
            return transfer.dispatch(self.sup.store, "export_snapshot", args)

    def op_import_snapshot(self, **args) -> dict:
        from ..store import transfer

        return transfer.dispatch(self.sup.store, "import_snapshot", args)

    def op_inject(self, point: str, times: int) -> dict:
        faults.inject(point, times)
        return {"injected": point}

    def op_shutdown(self, destroy_sessions: bool) -> dict:
        threading.Thread(target=self._shutdown, args=(destroy_sessions,), daemon=True).start()
        return {"shutting_down": True}

    def _shutdown(self, destroy: bool) -> None:
        try:
            time.sleep(0.1)  # let the reply to the shutdown request go out first
            self.sup.shutdown(destroy_sessions=destroy)
        finally:
            if self.server is not None:
                self.server.shutdown()

    def serve(self) -> None:
        daemon = self
        sock_path = str(self.instance.socket)
        if os.path.exists(sock_path):
            os.unlink(sock_path)

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    reply = daemon.handle_line(line)
                    try:
                        self.wfile.write(reply)
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        return

        class Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True
            request_queue_size = 128  # a 16-way branch's clients connect at once (the default is 5)

        old = os.umask(0o177)
        try:
            self.server = Server(sock_path, Handler)
        finally:
            os.umask(old)
        os.chmod(sock_path, 0o600)
        log.info("drumsd run %s serving on %s", self.sup.run, sock_path)
        self.server.serve_forever(poll_interval=0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drumsd", description="Drums supervisor daemon")
    parser.add_argument("--instance", default=os.environ.get("DRUMS_INSTANCE", "default"))
    parser.add_argument("--slot-base", type=int, default=int(os.environ.get("DRUMS_SLOT_BASE", "0")))
    parser.add_argument("--slot-count", type=int, default=int(os.environ.get("DRUMS_SLOT_COUNT", "64")))
    parser.add_argument("--liveness-delay", type=float, default=float(os.environ.get("DRUMS_LIVENESS_DELAY", "3")))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("drumsd must run as root", file=sys.stderr)
        return 2
    instance = Instance(name=check_name(args.instance, "instance"), slot_base=args.slot_base,
                        slot_count=args.slot_count)
    try:  # every slot's share of the pid space and of the kernel's per-user counts must fit the host
        kernel_budget.check_fits(instance.slot_count, SESSION_PIDS)
    except DrumsError as exc:
        print(f"drumsd: {exc}", file=sys.stderr)
        return 4
    instance.state_root.mkdir(parents=True, exist_ok=True)
    os.chmod(instance.state_root, 0o700)
    lock_fd = os.open(instance.run_lock, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"drumsd for instance {instance.name} is already running", file=sys.stderr)
        return 3
    instance.state_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, filename=str(instance.log_file),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
    # out of memory, the host kills a desktop's process first, the daemon last (containment.py);
    # what it starts (CRIU, a session's launch) sets its own score
    try:
        containment.set_oom_score_adj(containment.DAEMON_OOM_SCORE_ADJ)
    except PermissionError:  # root without CAP_SYS_RESOURCE (some VMs' init): no score below 0 for anyone
        log.warning("drumsd runs at out-of-memory score 0, not %d: this root lacks CAP_SYS_RESOURCE",
                    containment.DAEMON_OOM_SCORE_ADJ)
    if os.environ.get("DRUMS_KSM") == "1":
        # Inherited over fork and exec: every session this daemon launches and every task CRIU
        # restores (forked from its criu swrk child) is KSM-mergeable. Whether ksmd runs
        # (/sys/kernel/mm/ksm/run) stays the operator's choice.
        linux.prctl(linux.PR_SET_MEMORY_MERGE, 1)
    for sig in (signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    d = Daemon(instance, liveness_delay=args.liveness_delay)
    from .recovery import recover

    report = recover(d.sup)
    log.info("recovery: %s", json.dumps(report))
    _Reaper(d.sup).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=d._shutdown, args=(False,)).start())
    d.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
