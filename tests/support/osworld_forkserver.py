"""Snippets in the OSWorld test venv without importing desktop-env again each time.

Importing ``desktop_env.desktop_env`` costs about 2 CPU-seconds (its evaluators pull in most of the
venv); the suite runs some 45 snippets, on a CPU-bound lane. One server per test process and venv
(:mod:`tests.support.osworld_forkserver_main`) imports it once and forks for each snippet: a fork
gets the snippet's environment, working directory, argv and output files, runs it as ``__main__``
and exits as an interpreter does. What differs from a fresh ``python snippet.py``: the modules
desktop-env imports are already imported (in the order above, before the snippet's own imports),
and the snippet's parent is the server. Snippets whose PYTHONPATH is not the server's run as a
process of their own, as before. The server ends with the test process (its stdin is the lifeline).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

MAIN = Path(__file__).with_name("osworld_forkserver_main.py")
START_TIMEOUT = 300.0

_servers: dict[tuple[str, str], "ForkServer"] = {}
_lock = threading.Lock()


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.python = python
        self.pythonpath = env.get("PYTHONPATH", "")
        self.dir = tempfile.mkdtemp(prefix="drums-osworld-forkserver-")
        self.path = os.path.join(self.dir, "sock")
        self.log = open(os.path.join(self.dir, "server.log"), "w+")
        self.proc = subprocess.Popen([python, str(MAIN), self.path], env=env, cwd=self.dir, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.log.seek(0)
            why = self.log.read()[-3000:]
            self.close()
            raise ForkServerError(f"the OSWorld fork server did not start: {why}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, script: str, argv: list[str], cwd: str, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        """As ``subprocess.run([python, script, *argv], capture_output=True, text=True, timeout=...)``."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
                open(os.devnull) as devnull, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(self.path)
            req = {"script": script, "argv": argv, "cwd": cwd, "env": env}
            socket.send_fds(conn, [json.dumps(req).encode()], [devnull.fileno(), out.fileno(), err.fileno()])
            pid = json.loads(conn.recv(4096))["pid"]
            conn.settimeout(timeout)
            try:
                reply: bytes | None = conn.recv(4096)
            except TimeoutError:
                reply = None
                os.kill(pid, signal.SIGKILL)
                conn.settimeout(30)
                with contextlib.suppress(TimeoutError):
                    conn.recv(4096)  # reaped
            out.seek(0)
            err.seek(0)
            cmd, stdout, stderr = [self.python, script, *argv], out.read(), err.read()
            if reply is None:
                raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
            if not reply:
                raise ForkServerError(f"the OSWorld fork server went away while pid {pid} ran {script}")
            return subprocess.CompletedProcess(cmd, json.loads(reply)["returncode"], stdout, stderr)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        for name in ("sock", "server.log"):
            try:
                os.unlink(os.path.join(self.dir, name))
            except FileNotFoundError:
                pass
        os.rmdir(self.dir)


def server_for(python: str, env: dict[str, str]) -> ForkServer | None:
    """This process's server for ``python`` with ``env``'s PYTHONPATH; None when it cannot start (the
    snippet then runs as a process of its own: the reason is printed)."""
    key = (python, env.get("PYTHONPATH", ""))
    with _lock:
        srv = _servers.get(key)
        if srv is not None and srv.alive():
            return srv
        try:
            srv = ForkServer(python, env)
        except ForkServerError as exc:
            print(exc, file=sys.stderr)
            return None
        _servers[key] = srv
        return srv


def run_snippet(python: str, script: str, argv: list[str], cwd: str, env: dict[str, str],
                timeout: float) -> subprocess.CompletedProcess:
    srv = server_for(python, env)
    if srv is None:
        return subprocess.run([python, script, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    return srv.run(script, argv, cwd, env, timeout)


@atexit.register
def _close_all() -> None:
    for srv in _servers.values():
        srv.close()
    _servers.clear()
