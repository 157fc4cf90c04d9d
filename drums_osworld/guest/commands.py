"""Running commands for clients: as the desktop user, in its home, with the desktop environment.

The server normally runs as the desktop user (``user``, uid 1000) and its commands run as itself.
When it runs as root, commands drop to the account named by ``--run-as-user`` or the environment
variable ``DRUMS_GUEST_USER``; when neither is set, or the account does not exist, they run as the
server's own user (this is what happens on a development host, which has no ``user`` account).

Every command gets its own session (process group), so a timeout kills the whole group and a
launched application is not hit by signals meant for the server.
"""
from __future__ import annotations

import logging
import os
import pwd
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .warm_python import WarmPython, python_mode

log = logging.getLogger("drums.guest")


class CommandTimeout(Exception):
    def __init__(self, timeout: float, output: str, error: str) -> None:
        super().__init__(f"command timed out after {timeout:g} seconds")
        self.timeout = timeout
        self.output = output
        self.error = error


@dataclass
class Result:
    returncode: int
    output: str
    error: str


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_until_eof(chunks: dict[int, list[bytes]], deadline: float) -> bool:
    """Read the pipes of ``chunks`` until each is at its end (True) or ``deadline`` (False)."""
    open_fds = [fd for fd in chunks]
    with selectors.DefaultSelector() as sel:
        for fd in open_fds:
            sel.register(fd, selectors.EVENT_READ)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
                    open_fds.remove(key.fd)
    return True


def _text(b: bytes | None) -> str:
    """Decode like ``subprocess.run(text=True)`` does (universal newlines), never failing."""
    if not b:
        return ""
    return b.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


class Runner:
    """Who commands run as, where, and with which environment."""

    def __init__(self, run_as: str | None = None) -> None:
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.drop: pwd.struct_passwd | None = None
        self.groups: list[int] = []
        if run_as is None:
            run_as = os.environ.get("DRUMS_GUEST_USER") or None
        if os.geteuid() == 0 and run_as:
            try:
                pw = pwd.getpwnam(run_as)
            except KeyError:
                log.warning("user %r does not exist; commands run as uid %d", run_as, self.uid)
            else:
                if pw.pw_uid != 0:
                    self.drop = pw
                    self.uid, self.gid = pw.pw_uid, pw.pw_gid
                    try:
                        self.groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
                    except OSError:
                        self.groups = [pw.pw_gid]
        if self.drop is not None:
            self.home = self.drop.pw_dir
        else:
            self.home = os.environ.get("HOME") or self._pw_home(self.uid) or "/"
        self.env = self._build_env()
        self.warm = WarmPython(self._popen_kwargs(None))
        self._children: list[subprocess.Popen] = []
        self._exited: dict[int, int] = {}
        self._children_lock = threading.Lock()

    @staticmethod
    def _pw_home(uid: int) -> str | None:
        try:
            return pwd.getpwuid(uid).pw_dir
        except KeyError:
            return None

    @property
    def user_name(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    def _build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for k in [k for k in env if k.startswith("WERKZEUG_")]:
            del env[k]
        env.setdefault("DISPLAY", ":0")
        if self.drop is not None:
            env.update(HOME=self.drop.pw_dir, USER=self.drop.pw_name, LOGNAME=self.drop.pw_name,
                       SHELL=self.drop.pw_shell or "/bin/sh")
            env["XDG_RUNTIME_DIR"] = f"/run/user/{self.uid}"
            env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path=/run/user/{self.uid}/bus"
        else:
            env.setdefault("XDG_RUNTIME_DIR", f"/run/user/{self.uid}")
            bus = os.path.join(env["XDG_RUNTIME_DIR"], "bus")
            if "DBUS_SESSION_BUS_ADDRESS" not in env and os.path.exists(bus):
                env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={bus}"
        # `python -c "import pyautogui ..."` must find an interpreter that has pyautogui: ours.
        bindir = os.path.dirname(sys.executable)
        path = env.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
        if bindir and bindir not in path.split(os.pathsep):
            env["PATH"] = bindir + os.pathsep + path
        return env

    # -- helpers --------------------------------------------------------------------------------
    def expand_home(self, arg: str) -> str:
        """OSWorld expands a leading ``~/`` in every argument of a list command."""
        if arg.startswith("~/"):
            return self.home.rstrip("/") + arg[1:]
        return arg

    def expand_path(self, path: str) -> str:
        """``~`` and ``$VARS`` in a path, against the command user's home and environment."""
        if path == "~" or path.startswith("~/"):
            path = self.home.rstrip("/") + path[1:]
        elif path.startswith("~"):
            path = os.path.expanduser(path)
        return os.path.expandvars(path)

    def cwd(self) -> str | None:
        return self.home if os.path.isdir(self.home) else None

    def chown(self, path: str) -> None:
        """Give a file the server created on the user's behalf to that user."""
        if self.drop is not None:
            try:
                os.chown(path, self.uid, self.gid)
            except OSError:
                pass

    def _popen_kwargs(self, cwd: str | None) -> dict:
        kw: dict = {"env": self.env, "cwd": cwd if cwd is not None else self.cwd(),
                    "start_new_session": True, "close_fds": True}
        if self.drop is not None:
            kw.update(user=self.uid, group=self.gid, extra_groups=self.groups)
        return kw

    # -- running --------------------------------------------------------------------------------
    def run(self, command: list[str] | str, shell: bool, timeout: float,
            merge_stderr: bool = False, cwd: str | None = None) -> Result:
        """Run to completion. Raises OSError (e.g. not found) or :class:`CommandTimeout`. A command
        that runs this guest's own Python (``python -c CODE``, ``python SCRIPT``) is a fork of the warm
        interpreter (:mod:`.warm_python`) when it can be."""
        mode = None if shell or isinstance(command, str) else python_mode(command, self.env.get("PATH", ""))
        if mode is not None:
            r = self._run_warm(mode, timeout, merge_stderr, cwd)
            if r is not None:
                return r
        p = subprocess.Popen(
            command, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            **self._popen_kwargs(cwd),
        )
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(p)
            try:
                out, err = p.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                # Something escaped the group and still holds our pipes: stop reading.
                out, err = b"", b""
                for f in (p.stdout, p.stderr):
                    if f is not None:
                        f.close()
                p.kill()
                p.wait()
            raise CommandTimeout(timeout, _text(out), _text(err)) from None
        except BaseException:
            self._kill_group(p)
            p.wait()
            raise
        return Result(p.returncode, _text(out), _text(err))

    def _run_warm(self, mode: tuple[str, str, list[str]], timeout: float, merge_stderr: bool,
                  cwd: str | None) -> Result | None:
        """:meth:`run` in a fork of the warm interpreter; None if it could not take the command."""
        deadline = time.monotonic() + timeout
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = (None, None) if merge_stderr else os.pipe2(os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        reads = [out_r] + ([err_r] if err_r is not None else [])
        try:
            pid = self.warm.spawn(*mode, cwd if cwd is not None else self.cwd(),
                                  [null, out_w, err_w if err_w is not None else out_w])
        except BaseException:
            for fd in reads:
                os.close(fd)
            raise
        finally:
            for fd in (null, out_w, err_w):
                if fd is not None:
                    os.close(fd)
        if pid is None:
            for fd in reads:
                os.close(fd)
            return None
        chunks: dict[int, list[bytes]] = {fd: [] for fd in reads}
        timed_out = not _read_until_eof(chunks, deadline)
        if timed_out:
            _killpg(pid)
            _read_until_eof(chunks, time.monotonic() + 5)  # what escaped the group keeps them: stop there
        for fd in reads:
            os.close(fd)
        out = b"".join(chunks[out_r])
        err = b"".join(chunks[err_r]) if err_r is not None else b""
        if timed_out:
            self.warm.wait(pid, 5)
            raise CommandTimeout(timeout, _text(out), _text(err))
        code = self.warm.wait(pid, max(0.0, deadline - time.monotonic()))
        if code is None:
            _killpg(pid)
            if self.warm.wait(pid, 5) is None:
                raise OSError(f"the warm interpreter ended before telling the exit status of {pid}")
            raise CommandTimeout(timeout, _text(out), _text(err))
        return Result(code, _text(out), _text(err))

    def close(self) -> None:
        self.warm.close()

    @staticmethod
    def _kill_group(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                p.kill()
            except ProcessLookupError:
                pass

    def launch(self, command: list[str] | str, shell: bool, cwd: str | None = None) -> int:
        """Start without waiting (OSWorld's ``/setup/launch``); returns the pid."""
        p = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL,
                             **self._popen_kwargs(cwd))
        with self._children_lock:
            self._children.append(p)
        self.reap()
        return p.pid

    def reap(self) -> None:
        """Collect launched children that exited, so they do not linger as zombies."""
        with self._children_lock:
            alive = []
            for c in self._children:
                rc = c.poll()
                if rc is None:
                    alive.append(c)
                else:
                    self._exited[c.pid] = rc
            self._children = alive
            while len(self._exited) > 256:
                self._exited.pop(next(iter(self._exited)))

    def exit_status(self, pid: int) -> int | None:
        """Exit status of a launched child; None while it runs or when it is not ours."""
        self.reap()
        with self._children_lock:
            return self._exited.get(pid)

    def children(self) -> list[int]:
        self.reap()
        with self._children_lock:
            return [c.pid for c in self._children]
