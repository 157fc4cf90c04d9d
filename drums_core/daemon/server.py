"""``drumsd``: the per-host supervisor daemon, serving the Supervisor over a root-only unix socket.

Protocol: one JSON object per line each way. A request is ``{"op": NAME, "args": {...}}``; a reply
is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"code", "reason", "message",
"detail"}}``. An operation runs to completion even when its client goes away (a checkpoint in
flight commits, and a retry with the same snapshot id gets it).

Sessions do not die with the daemon: they are not its children once started. The daemon is a
child subreaper so the sessions' inits, orphaned by their launcher or by CRIU, are reaped here.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import json
import logging
import os
import signal
import socketserver
import sys
import threading
import time
from dataclasses import asdict

from ..session import faults
from ..host import linux
from ..config import Instance, check_name
from ..errors import DrumsError, Internal, InvalidArgument
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


def _jsonable(value):
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if hasattr(value, "public"):
        return value.public()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class Daemon:
    def __init__(self, instance: Instance, liveness_delay: float = 3.0) -> None:
        self.instance = instance
        self.sup = Supervisor(instance, liveness_delay=liveness_delay)
        self.sup.adopted_pids = set()
        self.started = time.time()
        self.server: socketserver.ThreadingUnixStreamServer | None = None

    def dispatch(self, op: str, args: dict):
        sup = self.sup
        if not isinstance(args, dict):
            raise InvalidArgument("args must be an object", reason="BAD_REQUEST")
        if op == "ping":
            return {"run": sup.run, "pid": os.getpid(), "instance": self.instance.name,
                    "uptime": time.time() - self.started}
        if op == "create":
            return sup.create(args.get("spec"))
        if op == "checkpoint":
            snap = sup.checkpoint(args["session"], name=args.get("name"), snapshot_id=args.get("snapshot_id"),
                                  leave_running=bool(args.get("leave_running", False)), scope=args.get("scope"),
                                  cache=bool(args.get("cache", False)))
            return {**snap.to_dict(), "store": getattr(snap, "store_report", None)}
        if op == "restore":
            return sup.restore(args["snapshot"], count=int(args.get("count", 1)),
                               wait_live=bool(args.get("wait_live", False)), expect_window=args.get("expect_window"),
                               min_nonblank=args.get("min_nonblank", 0.0), scope=args.get("scope"))
        if op == "destroy":
            return sup.destroy(args["session"])
        if op == "list":
            return sup.list_sessions()
        if op == "get":
            return sup.get(args["session"])
        if op == "wait_live":
            return sup.wait_live(args["session"], timeout=float(args.get("timeout", 30)))
        if op == "exec":
            return sup.exec(args["session"], list(args["argv"]), user=args.get("user"),
                            timeout=float(args.get("timeout", 120)), input=args.get("input"))
        if op == "screenshot":
            return sup.screenshot(args["session"])
        if op == "windows":
            return sup.windows(args["session"])
        if op == "memory":
            return sup.memory(args["session"])
        if op == "processes":
            return [asdict(p) for p in sup.processes(args["session"])]
        if op == "audit":
            from ..session.audit import sharing_audit

            layer_devs = {os.stat("/").st_dev, os.stat(self.instance.state_dir).st_dev}
            return sharing_audit(sup.get(args["a"]).init_pid, sup.get(args["b"]).init_pid, layer_devs)
        if op == "snapshots":
            return sup.keeper.describe()
        if op == "store":
            return sup.keeper.status()
        if op == "spill_snapshot":
            return sup.keeper.spill_now(sup.store.resolve(args["snapshot"], args.get("scope")).id)
        if op == "snapshot":
            return sup.store.resolve(args["snapshot"], args.get("scope"))
        if op == "delete_snapshot":
            snap = sup.store.resolve(args["snapshot"], args.get("scope"), any_boot=True)
            sup.keeper.delete(snap.id)
            return {"deleted": snap.id}
        if op == "stats":
            return {"counters": dict(sup.counters), "sessions": len(sup.sessions), "run": sup.run}
        if op in ("export_snapshot", "import_snapshot"):
            import contextlib

            from ..store import transfer

            with contextlib.ExitStack() as held:  # a chain being packed is neither evicted nor spilled meanwhile
                if op == "export_snapshot":
                    for snap in transfer.snapshot_chain(sup.store, check_name(args["snapshot"], "snapshot id")):
                        held.enter_context(sup.keeper.hold(snap.id))
                return transfer.dispatch(sup.store, op, args)
        if op == "inject" and faults.test_hooks_enabled():
            faults.inject(str(args["point"]), int(args.get("times", 1)))
            return {"injected": args["point"]}
        if op == "shutdown":
            destroy = bool(args.get("destroy_sessions", False))
            threading.Thread(target=self._shutdown, args=(destroy,), daemon=True).start()
            return {"shutting_down": True}
        raise InvalidArgument(f"unknown operation {op!r}", reason="UNKNOWN_OP")

    def _shutdown(self, destroy: bool) -> None:
        try:
            time.sleep(0.1)  # let the reply to the shutdown request go out first
            self.sup.shutdown(destroy_sessions=destroy)
        finally:
            if self.server is not None:
                self.server.shutdown()

    def handle_line(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise InvalidArgument("request must be an object with an 'op'", reason="BAD_REQUEST")
            result = self.dispatch(req["op"], req.get("args") or {})
            return {"ok": True, "result": _jsonable(result)}
        except DrumsError as exc:
            return {"ok": False, "error": exc.to_wire()}
        except KeyError as exc:
            return {"ok": False, "error": InvalidArgument(f"missing argument {exc}", reason="BAD_REQUEST").to_wire()}
        except json.JSONDecodeError as exc:
            bad = InvalidArgument(f"request is not JSON: {exc}", reason="BAD_REQUEST")
            return {"ok": False, "error": bad.to_wire()}
        except Exception as exc:  # noqa: BLE001 - anything unknown crosses the boundary as Internal
            log.exception("internal error")
            return {"ok": False, "error": Internal(f"internal error: {exc!r}").to_wire()}

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
                        self.wfile.write(json.dumps(reply).encode() + b"\n")
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
