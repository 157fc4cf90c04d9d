"""The one adapter between Drums and CRIU: pycriu's RPC over ``criu swrk`` with the provisioned binary.

CRIU's log goes to a FIFO in the operation's work directory; a thread drains it, so a failure
carries CRIU's own error lines (pycriu itself only reports an errno). Options are pinned here and
nowhere else.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import CRIU_BIN, PYCRIU_PATH
from ..errors import Internal, Unavailable
from ..reasons import Reason
from ..host import bounded
from ..host import kernel_budget

try:
    import pycriu  # noqa: F401
except ImportError:  # the venv's .pth normally provides it; fall back to the prefix
    import sys

    sys.path.append(str(PYCRIU_PATH))
    import pycriu  # noqa: F401
import sys as _sys  # noqa: E402

from pycriu import rpc_pb2 as rpc  # noqa: E402

_pycriu_mod = _sys.modules["pycriu.criu"]  # the module; ``pycriu.criu`` is shadowed by the class

LOG_NAME = "criu.log"
LOG_HEAD = 1 << 20   # bytes of a CRIU log kept from its start ...
LOG_TAIL = 4 << 20   # ... and from its end (the middle of a longer one is dropped, and said)
log_module = logging.getLogger("drums.criu")


@dataclass
class CriuResult:
    seconds: float
    log: list[str] = field(default_factory=list)
    pid: int | None = None


class _LogPipe:
    """A FIFO CRIU writes its log into, drained by a thread into memory."""

    def __init__(self, work_dir: Path, on_giving_up=None) -> None:
        self.on_giving_up = on_giving_up  # called once CRIU logs GIVING_UP
        self.path = work_dir / LOG_NAME
        if self.path.exists():
            self.path.unlink()
        os.mkfifo(self.path, 0o600)
        self._rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(self.path, os.O_WRONLY)  # keeps the reader from seeing EOF before CRIU opens it
        os.set_blocking(self._rfd, True)
        self.lines: list[str] = []
        # the log is drained whole (CRIU must never block on it) but kept bounded: a session shapes
        # its length (one line per mapping, file, socket...), so only its head and tail stay
        self._kept = bounded.HeadTail(head=LOG_HEAD, tail=LOG_TAIL)
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        last = b""
        while True:
            try:
                chunk = os.read(self._rfd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._kept.add(chunk)
            if self.on_giving_up is not None and GIVING_UP in last + chunk:
                self.on_giving_up()
                self.on_giving_up = None
            last = chunk[-len(GIVING_UP):]
        self.lines = self._kept.value().decode("utf-8", "replace").splitlines()

    def close(self) -> list[str]:
        os.close(self._keep)
        self._thread.join(timeout=5)
        os.close(self._rfd)
        try:
            self.path.unlink()
        except OSError:
            pass
        return self.lines


# Lines every CRIU run logs as errors on this kind of host, whatever it does: its probes for an
# iptables(-legacy)-save/-restore binary ("... -V failed", and the execvp that failed) even when the
# images hold no rules, kerndat's probes of tun and of its own RLIMIT_NOFILE, and `ip`'s word on the
# loopback addresses a restored namespace already has. They say nothing about a failure, and as the
# last error lines they hid its cause.
_NOISE = re.compile(r'ip6?tables(-legacy)?-(save|restore)(\ -V failed|", \.\.\.\) failed)'
                    r"|tun: Unable to create tun: Operation not permitted"
                    r"|Error: ipv[46]: [Aa]ddress already assigned"
                    r"|rlimit: Can't setup RLIMIT_NOFILE for self")


def error_lines(log: list[str], limit: int = 12) -> list[str]:
    """The lines of a CRIU log that report errors, the first and the last ones when there are more
    than ``limit`` (the first says the cause, the last what it ended); the log's tail when none does."""
    errs = [line for line in log if ("Error" in line or "error" in line.lower() and "rlimit" not in line)
            and not _NOISE.search(line)]
    if not errs:
        return log[-limit:]
    return errs if len(errs) <= limit else errs[:limit // 2] + errs[-(limit - limit // 2):]


def summary(lines: list[str]) -> str:
    """One line for an error message: the first three error lines (the cause comes first: CRIU's
    later lines are what it did about it) and the last one."""
    if len(lines) <= 4:
        return " | ".join(lines)
    return " | ".join([*lines[:3], f"... {len(lines) - 4} more", lines[-1]])


# How CRIU checks, at a restore, that a file a task had mapped or open is the one it dumped
# (``--file-validation``; the RPC has no field for it, so it goes in a CRIU config file of the
# package's, ``criu-<method>.conf``). CRIU's default, ``buildid``, reads the ELF build-id of every
# mapped executable and library at the dump and again at the restore; ``filesize`` compares sizes.
# A session's files come from an image the restore checks by its content hash first
# (``check_snapshot_image``) and from layers nothing writes after the checkpoint, so the build-id
# adds no safety here. None: CRIU's default. What it saves (``drums bench restore-costs``, 2026-12-07,
# p50 of 15 interleaved rounds): 2 to 15 ms of CPU per restore, 8 to 19 ms per leave-running checkpoint.
FILE_VALIDATION: str | None = "filesize"
_CONFIG_DIR = Path(__file__).resolve().parent


def _base_opts(images_dir: Path, work_fd: int, log_level: int) -> "rpc.criu_opts":
    opts = rpc.criu_opts()
    if FILE_VALIDATION is not None:
        opts.config_file = str(_CONFIG_DIR / f"criu-{FILE_VALIDATION}.conf")
    opts.images_dir_fd = -1
    opts.images_dir = str(images_dir)
    opts.work_dir_fd = work_fd
    opts.log_file = LOG_NAME
    opts.log_level = log_level
    opts.manage_cgroups = True
    opts.manage_cgroups_mode = rpc.IGNORE
    opts.network_lock = rpc.SKIP
    opts.auto_ext_mnt = True
    opts.ext_sharing = True
    opts.ext_masters = True
    opts.file_locks = True
    opts.evasive_devices = True
    return opts


# What CRIU logs when a restore failed after the restored tasks ran: it kills the tree and waits for
# its init, which cannot end while tasks CRIU still traces are dying (their tracer is CRIU, waiting):
# CRIU then waits until it is killed. It is given GIVING_UP_GRACE seconds to end by itself.
GIVING_UP = b"Killing processes because of failure on restore"
GIVING_UP_GRACE = 2.0


class _Watchdog:
    """Kills CRIU's top process if the call outlives ``timeout`` (a wedged CRIU must not wedge the
    daemon), or :data:`GIVING_UP_GRACE` seconds after :meth:`giving_up`. ``fired``: why it killed."""

    def __init__(self, client, timeout: float) -> None:
        self.client = client
        self.fired: str | None = None
        self._lock = threading.Lock()
        self._timer = self._start(timeout, "timeout")

    def _start(self, seconds: float, why: str) -> threading.Timer:
        timer = threading.Timer(seconds, self._fire, args=(why,))
        timer.daemon = True
        timer.start()
        return timer

    def _fire(self, why: str) -> None:
        with self._lock:
            pid = getattr(self.client._comm, "swrk", None)
            if pid and self.fired is None:
                self.fired = why
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass

    def giving_up(self) -> None:
        with self._lock:
            if self.fired is None:
                self._timer.cancel()
                self._timer = self._start(GIVING_UP_GRACE, "giving_up")

    def cancel(self) -> None:
        with self._lock:
            self._timer.cancel()


MAX_FD = 1 << 20  # above any descriptor a process here may hold (fs.nr_open)


class _Swrk(_pycriu_mod._criu_comm_bin):
    """``criu swrk`` started the way pycriu starts it, except that:

    * the child joins ``cgroup_paths`` (the session's groups) before it execs CRIU (with
      ``--manage-cgroups=ignore`` CRIU leaves restored tasks where ``criu swrk`` runs, so the restored
      tree is born in the group);
    * no descriptor is ever inheritable in the daemon: CRIU's end of the socket and the
      ``inherit`` descriptors (its work directory) are made inheritable in the forked child alone,
      which closes every other one (a library's descriptor opened without close-on-exec too)
      before it tells its pid, so not even the moment between fork and exec holds another's;
      pycriu clears close-on-exec in the parent, so another thread's CRIU started meanwhile inherited
      them: it held another session's work directory, and that session's teardown (which kills
      every process holding a file under its directory) SIGKILLed it mid-restore (CI: a neighbour's
      restore failed with "criu swrk closed the connection" and an empty log);
    * the forked child can never return into the daemon's code: any failure there ends it with
      ``os._exit``. (pycriu's own child lets an exec error propagate; a script written per call
      could meet ETXTBSY when another thread forked meanwhile.)"""

    def __init__(self, bin_path: str, cgroup_paths: list[str] | None, inherit: tuple[int, ...] = ()) -> None:
        super().__init__(bin_path)
        self._procs = [p.rstrip("/") + "/cgroup.procs" for p in cgroup_paths or ()]
        self._inherit = inherit

    def connect(self, daemon):
        css = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # both close-on-exec
        self.daemon = False
        pid = os.fork()
        if pid == 0:
            try:
                for path in self._procs:
                    fd = os.open(path, os.O_WRONLY)
                    os.write(fd, b"0")
                    os.close(fd)
                keep = sorted({css[0].fileno(), *self._inherit})
                low = 3  # every other descriptor goes before the pid is told, inheritable or not
                for fd in keep:
                    os.closerange(low, fd)
                    low = fd + 1
                os.closerange(low, MAX_FD)
                for fd in keep:
                    os.set_inheritable(fd, True)
                for fd in (0, 1, 2):
                    os.close(fd)
                css[0].send(struct.pack("i", os.getpid()))
                os.execv(self.comm, [self.comm, "swrk", str(css[0].fileno())])
            finally:
                os._exit(1)
        css[0].close()
        try:
            self.swrk = struct.unpack("i", css[1].recv(4))[0]
        except struct.error:  # the child died before it could say its pid: CRIU never ran
            os.waitpid(pid, 0)
            css[1].close()
            raise _pycriu_mod.CRIUExceptionInternal(rpc.RESTORE,
                                                    "criu swrk did not start (cgroup join failed)") from None
        self.sk = css[1]
        return self.sk


def _notified(client, req_type: int, hooks: dict, what: str, reason: Reason):
    """One request over ``criu swrk`` that answers CRIU's notifications: at each notification named
    in ``hooks`` its function runs with the notification's pid; an exception from it answers
    "failed" (CRIU then fails the request: a dump resumes the tasks, a restore rolls back) and is
    raised here, a Drums error as itself, anything else as Unavailable ``reason`` (``what`` failed)."""
    req = rpc.criu_req()
    req.type = req_type
    req.opts.MergeFrom(client.opts)
    req.opts.notify_scripts = True
    failure: BaseException | None = None
    sk = client._comm.connect(False)
    try:
        sk.send(req.SerializeToString())
        while True:
            size = len(sk.recv(1, socket.MSG_TRUNC | socket.MSG_PEEK))
            if size == 0:
                raise _pycriu_mod.CRIUExceptionInternal(req_type, "criu swrk closed the connection")
            resp = rpc.criu_resp()
            resp.ParseFromString(sk.recv(size))
            if resp.type != rpc.NOTIFY:
                break
            ok = True
            hook = hooks.get(resp.notify.script)
            if hook is not None and failure is None:
                try:
                    hook(resp.notify.pid)
                except BaseException as exc:  # noqa: BLE001 - answered to CRIU, raised below
                    failure, ok = exc, False
            ack = rpc.criu_req()
            ack.type = rpc.NOTIFY
            ack.notify_success = ok
            sk.send(ack.SerializeToString())
    except OSError as exc:
        raise _pycriu_mod.CRIUExceptionInternal(req_type, str(exc)) from exc
    finally:
        client._comm.disconnect()
    if isinstance(failure, Unavailable):
        raise failure
    if isinstance(failure, Exception):
        raise Unavailable(f"{what} failed: {failure}", reason=reason, detail={"error": str(failure)}) from failure
    if failure is not None:
        raise failure
    if not resp.success:
        raise _pycriu_mod.CRIUExceptionExternal(req_type, resp.type, resp.cr_errno)
    return resp


def _dump_notified(client, post_dump) -> "rpc.criu_dump_resp":
    """A dump that, at CRIU's ``post-dump`` point (every image written, the tasks still frozen; with
    ``leave_running`` CRIU resumes them only after the answer), checks the images for what CRIU
    cannot restore (:func:`check_restorable`), then runs ``post_dump()`` (if any)."""
    def at_post_dump(_pid: int) -> None:
        check_restorable(Path(client.opts.images_dir))
        if post_dump is not None:
            post_dump()

    return _notified(client, rpc.DUMP, {"post-dump": at_post_dump},
                     "the checkpoint's post-dump step (the tasks run on)", Reason.POST_DUMP_FAILED).dump


def _restore_notified(client, setup_namespaces) -> "rpc.criu_restore_resp":
    """A restore that runs ``setup_namespaces(root_pid)`` at CRIU's ``setup-namespaces`` point (the
    restored tree's namespaces exist, none of its tasks runs yet)."""
    return _notified(client, rpc.RESTORE, {"setup-namespaces": setup_namespaces},
                     "the restore's namespace set-up (rolled back)", Reason.RESTORE_SETUP_FAILED).restore


def _call(kind: str, opts, work_dir: Path, timeout: float, cgroup_paths: list[str] | None = None,
          post_dump=None, setup_namespaces=None) -> CriuResult:
    client = pycriu.criu()
    client._comm = _Swrk(str(CRIU_BIN), cgroup_paths, inherit=(opts.work_dir_fd,))
    client.opts.MergeFrom(opts)
    watchdog = _Watchdog(client, timeout)
    pipe = _LogPipe(work_dir, on_giving_up=watchdog.giving_up if kind == "restore" else None)
    t0 = time.monotonic()
    resp = None
    failure: Exception | None = None
    try:
        if kind == "restore" and setup_namespaces is not None:
            resp = _restore_notified(client, setup_namespaces)
        elif kind == "restore":
            resp = client.restore()
        else:
            resp = _dump_notified(client, post_dump)
    except (_pycriu_mod.CRIUExceptionExternal, _pycriu_mod.CRIUExceptionInternal) as exc:
        failure = exc
    finally:
        watchdog.cancel()
        log = pipe.close()
    seconds = time.monotonic() - t0
    if watchdog.fired == "giving_up":
        lines = error_lines(log)
        log_module.warning("criu %s failed, and waited on the tree it was killing until it was killed; the last "
                           "lines of its log:\n%s", kind, "\n".join(log[-60:]))
        raise Unavailable(f"criu {kind} failed (killed {GIVING_UP_GRACE:g}s after it gave up): {summary(lines)}",
                          reason=Reason.CRIU_FAILED, detail={"errno": None, "criu_log": lines, "op": kind})
    if watchdog.fired:
        lines = error_lines(log)
        log_module.warning("criu %s did not finish within %.0fs and was killed; the last lines of its log:\n%s",
                           kind, timeout, "\n".join(log[-60:]))
        raise Unavailable(f"criu {kind} did not finish within {timeout:.0f}s and was killed; last lines: "
                          f"{' | '.join(log[-3:])}", reason=Reason.CRIU_TIMEOUT,
                          detail={"criu_log": lines, "tail": log[-20:], "op": kind})
    if failure is not None:
        errno = getattr(failure, "errno", None)
        lines = error_lines(log)
        log_module.warning("criu %s failed (errno %s); the last lines of its log:\n%s", kind, errno,
                           "\n".join(log[-60:]))
        short = kernel_budget.shortage(log)
        if short is not None:  # a host budget ran out: name it, not CRIU's message
            short.detail["criu_log"] = lines
            raise short from failure
        # without an errno CRIU gave no answer at all (it died, or closed the connection): say so
        how = f"errno {errno}" if errno is not None else str(failure)
        raise Unavailable(f"criu {kind} failed ({how}): {summary(lines)}",
                          reason=Reason.CRIU_FAILED, detail={"errno": errno, "criu_log": lines, "op": kind})
    return CriuResult(seconds=seconds, log=log, pid=getattr(resp, "pid", None))


# Directories a desktop's processes hold inotify watches on (the session bus watches its service and
# config directories). Overlayfs gives CRIU no file handles, so it finds a watch's path by scanning
# directories, /etc first (~50 ms on a Debian /etc); scanning these first finds them at once.
IRMAP_HINTS = ("/etc/dbus-1", "/usr/share/dbus-1")

# A file a process still has open or mapped after it was unlinked (a "ghost") is copied into the
# images, up to this size each (CRIU's default is 1 MiB). Chromium unlinks its 4 MiB
# BrowserMetrics-*.pma a few seconds after it starts and keeps it mapped: without this a desktop
# with Chrome open could only be checkpointed in its first seconds. A larger ghost fails the dump
# (CRIU_FAILED, the session goes on): the images stay bounded.
GHOST_LIMIT = 64 << 20


# A dump that meets a message with control data queued on a unix socket (credentials for a
# receiver with SO_PASSCRED, as D-Bus and Chromium ask) fails with "Control messages in queue": the tasks are
# resumed untouched, and the message is usually read within milliseconds, so the dump is tried
# again after a pause, at most DUMP_ATTEMPTS times in all. So is one that meets a process whose
# main thread has ended while others run on ("Zombies with threads are not supported"): every
# multi-threaded program that exits passes through that state until its last thread is gone (an
# OSWorld task's setup met a LibreOffice launcher in it). So is one that meets a connection to a
# listening unix socket that has sent data before the server accepted it ("Non-empty write queue on
# an in-flight socket"): Chromium's processes connect so while it starts. And so is one whose images
# hold a socket passed in a message not yet read (see check_restorable). And so is one that meets a
# connection made from outside the session to one of its unix sockets ("Unix socket N not found":
# the session's end of it belongs to the connecting side's network namespace, not the session's):
# the daemon's own X connections (screenshots, windows) end before a dump (display.close), but a
# screenshot asked for while a checkpoint starts, or an X server that has not yet closed its end of
# one, is such a state for a moment. So is one that meets a netlink socket with a message not yet
# read ("netlink: The socket has data to read": CRIU 4.2 dumps no netlink queue): the kernel's answer
# to a request, or a notice of a change to the network, waits there until its program reads it, and
# Chromium asks the kernel about its links and addresses while it starts. Patterns, searched in
# CRIU's error lines.
TRANSIENT_DUMP_ERRORS = ("Control messages in queue", "Zombies with threads are not supported",
                         "Non-empty write queue on an in-flight socket", r"Unix socket \d+ not found",
                         "netlink: The socket has data to read",
                         # a watched directory's dentry reclaimed since the attempt's look-up (watched_dirs.py)
                         r"parse_fdinfo_pid_s: error parsing \[inotify wd")
# What a dump error that outlasted the attempts means, added to the error's message
DUMP_ERROR_MEANINGS = {
    r"Unix socket \d+ not found": "a process of the session holds a unix socket of another network namespace, "
                                  "e.g. its end of a connection made from outside the session",
    "netlink: The socket has data to read": "a process of the session holds a netlink socket with a message it "
                                            "has not read, e.g. the kernel's answer to its request",
    r"parse_fdinfo_pid_s: error parsing \[inotify wd": "an inotify watch's directory left the kernel's cache "
                                                        "and was not found again in the session's root",
}
DUMP_ATTEMPTS = 5
DUMP_RETRY_PAUSE = 0.1  # doubled after each attempt


def _said(exc: Unavailable, pattern: str) -> bool:
    """Whether one of CRIU's error lines in ``exc`` matches ``pattern``."""
    lines = (exc.detail or {}).get("criu_log", []) if isinstance(exc.detail, dict) else []
    return any(re.search(pattern, line) for line in lines)


def _transient(exc: Unavailable) -> bool:
    return exc.reason == Reason.SOCKET_IN_FLIGHT or any(_said(exc, marker) for marker in TRANSIENT_DUMP_ERRORS)


def _explained(exc: Unavailable) -> Unavailable:
    """``exc`` with what its CRIU error means added to its message, when :data:`DUMP_ERROR_MEANINGS` knows."""
    for pattern, meaning in DUMP_ERROR_MEANINGS.items():
        if _said(exc, pattern):
            return Unavailable(f"{exc.message} ({meaning})", reason=exc.reason, detail=exc.detail)
    return exc


# A restore CRIU failed because a task ended while CRIU let go of the restored tasks one thread
# after another: a thread it had already let go of ended its process (exit_group, or a signal to
# another restored process), and the next PTRACE_DETACH met a thread that was gone. A process that
# was about to end when it was dumped does that (Chromium's start-up helpers end a second or two
# after its window shows). CRIU then kills the whole tree; a new restore from the same images most
# often wins the race.
RESTORE_RACE = r"Unable to detach \d+: No such process"


def lost_a_race_at_detach(exc: Unavailable) -> bool:
    """Whether ``exc`` is a restore that failed as :data:`RESTORE_RACE` says (worth another try)."""
    return _said(exc, RESTORE_RACE)


def _image(images_dir: Path, name: str) -> list[dict]:
    try:
        with open(images_dir / name, "rb") as f:
            return pycriu.images.load(f)["entries"]
    except FileNotFoundError:
        return []


def check_restorable(images_dir: Path) -> None:
    """Raise ``Unavailable`` ``SOCKET_IN_FLIGHT`` when a dump's images hold what CRIU 4.2 writes but
    cannot reliably restore: a message waiting in a unix socket's queue that carries (SCM_RIGHTS) a
    unix socket no process holds any more. A simple one restores; Chromium's failed in the receiver
    ("skqueue: Failed to send packet: Bad file descriptor", then "Unable to open fd=N": CRIU gave the
    carried socket to the task of the sending socket while another task replayed the queue), or
    restored a Chromium that never mapped its window. Chromium's processes pass
    sockets so while it starts; the receiver reads them within milliseconds, so the dump is a
    transient state and is tried again (:data:`DUMP_ATTEMPTS`). Reads only sk-queues.img when no
    message carries files (every dump)."""
    carrying = [(e["id_for"], right) for e in _image(images_dir, "sk-queues.img")
                for scm in e.get("scm", []) for right in scm.get("rights", [])]
    if not carrying:
        return
    held = {e["id"] for f in images_dir.glob("fdinfo-*.img") for e in _image(images_dir, f.name)}
    sockets = {e["id"] for e in _image(images_dir, "files.img") if e.get("type") == "UNIXSK"}
    flying = [(queue, right) for queue, right in carrying if right in sockets and right not in held]
    if flying:
        said = ", ".join(f"socket {right:#x} in the queue of {queue:#x}" for queue, right in flying)
        raise Unavailable(f"a unix socket's queue holds a message carrying a socket no process holds ({said}): "
                          "CRIU cannot restore that reliably", reason=Reason.SOCKET_IN_FLIGHT,
                          detail={"in_flight": [{"queue": q, "socket": r} for q, r in flying]})


def dump(pid: int, images_dir: Path, work_dir: Path, *, leave_running: bool = False, log_level: int = 2,
         timeout: float = 120.0, post_dump=None, before_attempt=None,
         cgroup_paths: list[str] | None = None) -> CriuResult:
    """Dump the tree under ``pid`` (retried when CRIU met a transient state, see above).

    ``cgroup_paths``: groups ``criu swrk`` joins before it runs (the session's CPU group: a dump's
    CPU is the session's own, so a desktop that is costly to dump slows only itself).
    ``post_dump``: called once the images are written, while the tasks are still frozen (see
    :func:`_dump_notified`); with ``leave_running`` they run on after it returns.
    ``before_attempt``: called before each attempt (what the kernel must show CRIU, put in place)."""
    pause = DUMP_RETRY_PAUSE
    for attempt in range(1, DUMP_ATTEMPTS + 1):
        if before_attempt is not None:
            before_attempt()
        try:
            return _dump_once(pid, images_dir, work_dir, leave_running=leave_running, log_level=log_level,
                              timeout=timeout, post_dump=post_dump, cgroup_paths=cgroup_paths)
        except Unavailable as exc:
            if attempt == DUMP_ATTEMPTS or not _transient(exc):
                err = _explained(exc)
                if err is exc:
                    raise
                raise err from exc
            log_module.info("criu dump of %d met a transient state (attempt %d): %s; again in %.1fs", pid, attempt,
                     exc.message, pause)
            for entry in os.scandir(images_dir):  # the failed attempt's partial images
                if entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


def _dump_once(pid: int, images_dir: Path, work_dir: Path, *, leave_running: bool, log_level: int,
               timeout: float, post_dump=None, cgroup_paths: list[str] | None = None) -> CriuResult:
    work_fd = os.open(work_dir, os.O_DIRECTORY)  # close-on-exec: only CRIU's child inherits it
    try:
        opts = _base_opts(images_dir, work_fd, log_level)
        opts.pid = pid
        opts.leave_running = leave_running
        opts.tcp_established = True
        opts.irmap_scan_paths.extend(IRMAP_HINTS)
        opts.ghost_limit = GHOST_LIMIT
        return _call("dump", opts, work_dir, timeout, cgroup_paths, post_dump=post_dump)
    finally:
        os.close(work_fd)


def restore(images_dir: Path, work_dir: Path, root: Path, veth_pairs: dict[str, str], *, log_level: int = 2,
            timeout: float = 60.0, cgroup_paths: list[str] | None = None, setup_namespaces=None) -> CriuResult:
    """Restore ``images_dir`` into ``root``. ``setup_namespaces(root_pid)``, if given, runs when the
    restored tree's namespaces exist and before any of its tasks runs (CRIU's ``setup-namespaces``)."""
    work_fd = os.open(work_dir, os.O_DIRECTORY)  # close-on-exec: only CRIU's child inherits it
    try:
        opts = _base_opts(images_dir, work_fd, log_level)
        opts.root = str(root)
        opts.tcp_established = True
        opts.tcp_close = True
        opts.rst_sibling = False
        for inner, outer in veth_pairs.items():
            pair = opts.veths.add()
            pair.if_in = inner
            pair.if_out = outer
        res = _call("restore", opts, work_dir, timeout, cgroup_paths, setup_namespaces=setup_namespaces)
        if not res.pid:
            raise Internal("criu restore reported success without a pid",
                           reason=Reason.CRIU_NO_PID, detail=res.log[-10:])
        return res
    finally:
        os.close(work_fd)


def version() -> str:
    import subprocess

    out = subprocess.run([str(CRIU_BIN), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()
