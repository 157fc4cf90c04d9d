"""A warm interpreter for the guest's Python commands: ``python -c CODE`` and ``python SCRIPT``.

Every OSWorld action is ``python -c "import pyautogui; ..."`` sent to ``/execute`` (and
``/run_python`` runs a script): a new interpreter each time, which spends most of its CPU importing
what pyautogui imports (PIL, tkinter, Xlib: about 180 ms of CPU at rest, 300 ms on a busy host),
on every step of every rollout. Here a *zygote* interpreter, started by the guest at the first such
command, has imported those modules once; each command is a ``fork`` of it that runs the code as a
new interpreter would, as its own process:

* the same interpreter (the guest's own venv, only used when the command names it through PATH),
  user, environment, working directory, ``sys.argv`` and ``sys.path[0]`` as ``python -c``/``python
  SCRIPT`` would have, a fresh ``__main__``, its own session (process group: a timeout kills it
  all), the runner's stdin/stdout/stderr;
* the same outcome: exit status (``SystemExit`` as Python handles it; an uncaught exception printed
  by ``sys.excepthook`` from the code's own frame, status 1; killed by a signal: ``-signal``), the
  interpreter's normal shutdown (non-daemon threads joined, ``atexit``, flushed output);
* its own randomness: ``random`` reseeds itself in a forked child (``os.register_at_fork``), so do
  ``tempfile``'s names; the string-hash seed is the zygote's (per process as before, but shared by
  the commands of one desktop).

Nothing the zygote imports at start may touch the display (pyautogui and mouseinfo open an X
connection when imported, and a connection shared by forked children would interleave their
requests): those are imported by each command, as before, and cost a few milliseconds. Code too
large for one message, or a command with other interpreter options, runs the old way; so does
everything when the zygote cannot be started or has died (it is started again at the next command).
"""
from __future__ import annotations

import array
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

log = logging.getLogger("drums.guest")

# What the zygote imports once (those present): pyautogui's dependencies that open no display.
PRELOAD = ("time", "json", "subprocess", "PIL.Image", "PIL.ImageGrab", "pyscreeze", "tkinter", "pymsgbox",
           "pytweening", "pyperclip", "Xlib.display", "Xlib.X", "Xlib.XK", "Xlib.ext.xtest")
MAX_MESSAGE = 200_000     # a request larger than this (code inline) runs the old way
START_TIMEOUT = 30.0      # the zygote's imports on a busy host


def python_mode(argv: list[str], path: str) -> tuple[str, str, list[str]] | None:
    """``("c", code, args)`` for ``[python, "-c", code, *args]`` or ``("file", script, args)`` for
    ``[python, script, *args]`` when ``python`` is found on ``path`` in this interpreter's own bin
    directory; None for anything else."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return None
    import shutil

    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
    if not exe or os.path.dirname(os.path.abspath(exe)) != os.path.dirname(os.path.abspath(sys.executable)):
        return None
    if argv[1] == "-c" and len(argv) >= 3:
        return "c", argv[2], list(argv[3:])
    if not argv[1].startswith("-"):
        return "file", argv[1], list(argv[2:])
    return None


class WarmPython:
    """The guest's side: starts the zygote (``popen_kwargs``: user, environment, session), hands it
    a command with its standard streams, and gets back its pid and, later, its exit status."""

    def __init__(self, popen_kwargs: dict) -> None:
        self._kw = popen_kwargs
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._next = 0
        self._replies: dict = {}          # request id -> pid or error; pid -> wait status
        self._cond = threading.Condition(self._lock)

    # -- the zygote's life ---------------------------------------------------------------------------
    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        boot = ("import sys; sys.path.insert(0, %r); from drums_osworld.guest import warm_python as w; "
                "del sys.path[0]; w.serve(%d)" % (here, theirs.fileno()))
        kw = dict(self._kw)
        kw["close_fds"] = True
        self._proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      pass_fds=(theirs.fileno(),), **kw)
        theirs.close()
        ours.settimeout(START_TIMEOUT)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready":
            ours.close()
            raise OSError("the warm interpreter did not start")
        ours.settimeout(None)
        self._sock = ours
        threading.Thread(target=self._read, args=(ours,), name="warm-python", daemon=True).start()
        return ours

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            with self._cond:
                if not data:  # the zygote ended: nothing more will be told; the next command starts one
                    if self._sock is sock:
                        self._sock = None
                        self._stop_proc()
                    self._replies["dead"] = True
                    self._cond.notify_all()
                    sock.close()
                    return
                msg = json.loads(data)
                if "status" in msg:
                    self._replies[("pid", msg["pid"])] = msg["status"]
                else:
                    pid = msg.get("pid")
                    # a pid comes before its status: an older status of the same (reused) pid is stale
                    self._replies.pop(("pid", pid), None)
                    self._replies[("id", msg["id"])] = pid or OSError(msg.get("error", "fork failed"))
                self._cond.notify_all()

    def _stop_proc(self) -> None:
        """End the zygote (held lock): killed and reaped; its commands' own processes go on."""
        proc, self._proc, self._sock = self._proc, None, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        with self._lock:
            sock = self._sock
            self._stop_proc()
        if sock is not None:
            sock.close()

    # -- one command ---------------------------------------------------------------------------------
    def spawn(self, mode: str, arg: str, args: list[str], cwd: str | None, fds: list[int]) -> int | None:
        """Start one command in a fork of the zygote with ``fds`` as its stdin, stdout and stderr;
        its pid, or None when the zygote could not be asked (the caller runs it the old way);
        OSError when it was asked and the command's fate is unknown (it is not run again)."""
        with self._cond:
            try:
                sock = self._sock or self._start()
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                log.warning("warm interpreter unavailable (%s): Python commands start cold", exc)
                self._stop_proc()
                return None
            self._replies.pop("dead", None)
            self._next += 1
            rid = self._next
            request = json.dumps({"id": rid, "mode": mode, "arg": arg, "args": args, "cwd": cwd}).encode()
            if len(request) > MAX_MESSAGE:
                return None
            try:
                sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            except OSError:  # not sent (a datagram goes whole or not at all): the old way is safe
                return None
            # Sent: from here the command may run (the zygote forks it before it answers), so it is
            # never run the old way too. A zygote that ended first (the command may have killed it
            # before its pid was sent) or never answered leaves the command's fate unknown: it fails.
            deadline = time.monotonic() + START_TIMEOUT
            while ("id", rid) not in self._replies:
                if self._replies.get("dead"):
                    raise OSError("the warm interpreter ended before it said whether the command started")
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise OSError(f"the warm interpreter did not answer in {START_TIMEOUT:g} s")
            pid = self._replies.pop(("id", rid))
        if isinstance(pid, OSError):
            raise pid
        return pid

    def wait(self, pid: int, timeout: float) -> int | None:
        """The command's exit code as ``Popen.returncode`` gives it (``-signal`` if killed), or None
        if it was not told within ``timeout`` (or the zygote died meanwhile)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while ("pid", pid) not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._replies.get("dead"):
                    return None
                self._cond.wait(left)
            status = self._replies.pop(("pid", pid))
        return os.waitstatus_to_exitcode(status)


# ------------------------------------------------------------------------------------ the zygote
def serve(fd: int) -> None:
    """The zygote's loop (runs as ``python -c`` started by :class:`WarmPython`)."""
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - an absent module is simply not preloaded
            pass
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sock.send(b"ready")
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(sock)
                continue
            fds: list[int] = []
            msg, anc, _, _ = sock.recvmsg(MAX_MESSAGE + 1024, socket.CMSG_SPACE(3 * 4))
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += array.array("i", data[:len(data) - len(data) % 4]).tolist()
            if not msg:
                return  # the guest closed its end
            req = json.loads(msg)
            try:
                if len(fds) != 3:
                    raise OSError(f"a command needs 3 standard streams, {len(fds)} came")
                pid = os.fork()
            except OSError as exc:
                sock.send(json.dumps({"id": req["id"], "error": str(exc)}).encode())
                pid = -1
            if pid == 0:
                sel.close()
                for f in (sock.fileno(), wake_r, wake_w):
                    os.close(f)
                _child(req, fds)  # never returns: ends the process as the command's interpreter would
            for f in fds:
                os.close(f)
            if pid > 0:
                sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())
            _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"pid": pid, "status": status}).encode())


def _child(req: dict, fds: list[int]) -> None:
    import types

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    try:
        if req.get("cwd"):
            os.chdir(req["cwd"])
        if req["mode"] == "c":
            source, filename = req["arg"], "<string>"
            sys.argv = ["-c", *req["args"]]
            sys.path[0] = ""
        else:
            filename = req["arg"]
            with open(filename, "rb") as f:
                source = f.read()
            sys.argv = [filename, *req["args"]]
            sys.path[0] = os.path.dirname(os.path.abspath(filename))
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {req['arg']!r}: [Errno {exc.errno}] {exc.strerror}\n")
        os._exit(_shut_down(2))
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if req["mode"] == "file":
        main.__file__ = filename
    sys.modules["__main__"] = main
    try:
        exec(compile(source, filename, "exec"), main.__dict__)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - printed as the interpreter prints it, from the code's frame
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        code = 1
    os._exit(_shut_down(code))


def _exit_code(exc: SystemExit) -> int:
    """The status the interpreter exits with for ``exc`` (a non-integer code is printed)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        sys.stderr.write(f"{exc.code}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _shut_down(code: int) -> int:
    """What the interpreter does at its exit that a command can see (non-daemon threads joined,
    ``atexit`` functions, output flushed: 120 if that fails, as Python's own exit), without tearing
    down every module the zygote preloaded one by one, which took longer than the command."""
    threading_mod = sys.modules.get("threading")
    if threading_mod is not None:
        threading_mod._shutdown()  # noqa: SLF001 - what Py_FinalizeEx calls first
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            code = 120
    return code
