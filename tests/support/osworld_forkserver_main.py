"""The fork server's own process (run by tests/support/osworld_forkserver.py in the OSWorld test venv).

It imports desktop-env once, then runs each snippet in a fork of itself. Each fork gets the
request's stdin/stdout/stderr (passed as file descriptors), working directory, environment and
argv, runs the script as ``__main__`` and finishes as an interpreter does (threads joined, atexit
handlers run, output flushed, exit status from ``SystemExit`` or 1 after an uncaught exception's
traceback); the server reports its exit status, as ``subprocess`` would give it.

Protocol, over one SOCK_SEQPACKET connection per snippet: the client sends the request (JSON) with
three fds; the server answers ``{"pid": N}`` at once and ``{"returncode": N}`` when the fork is
reaped. The server exits, killing forks still running, when its stdin (the client's lifeline)
closes. Its stdout carries one line, ``ready``, once the imports are done.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import socket
import sys
import traceback
from typing import NoReturn

PRELOAD = ("json", "logging", "requests", "drums_osworld", "desktop_env.desktop_env")


def _child(sockets: list[socket.socket], req: dict, fds: list[int]) -> NoReturn:
    for sock in sockets:  # the server's: its listener and every request's connection (no snippet keeps one)
        sock.close()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["script"]
    sys.argv = [script, *req["argv"]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    if "numpy" in sys.modules:  # random streams are per process, as after an exec
        sys.modules["numpy"].random.seed()
    import runpy

    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    # finish as an interpreter does (threads joined, atexit handlers run, output flushed), without
    # tearing down the thousands of modules the server imported: that alone cost 0.5 CPU-s a fork
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def serve(path: str) -> int:
    server = os.getpid()
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:  # not on this server's path (run_osworld's snippets have no drums_osworld)
            pass
    gc.freeze()  # what the imports made stays out of the collector: forks do not copy its pages on a collection
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    running: dict[int, socket.socket] = {}
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                return 0
            if listener in ready:
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    _child([listener, conn, *running.values()], json.loads(msg), fds)  # never returns
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode())
                running[pid] = conn
            while running:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = running.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                    except OSError:
                        pass
                    conn.close()
    finally:
        if os.getpid() == server:  # the server, not a fork finishing its snippet
            for pid in running:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


if __name__ == "__main__":
    sys.path.pop(0)  # this file's directory: no test module may shadow one of the snippet's
    sys.exit(serve(sys.argv[1]))
