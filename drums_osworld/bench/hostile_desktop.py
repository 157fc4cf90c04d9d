"""The hostile tenant of ``drums bench density``: issue 31's attacks, in a loop, as the desktop user.

This file runs *inside* a session (Debian's ``python3``, the standard library only): the density
suite copies it into the desktop user's home with ``drums exec`` and starts it there in a session
of its own (``setsid``), so it holds no pipe of the exec. It never talks to the network.

Once, at the start:

- **sparse**: a file of ``--sparse-tib`` TiB (20) made with ``truncate``: no block is written;
- **links**: one file of ``--link-mib`` MiB (64) and ``--links`` (3,000) hard links to it;
- **argv**: a child process that maps ``--argv-mib`` MiB (16), fills it, and points its argument
  area at it with ``prctl(PR_SET_MM, PR_SET_MM_MAP)`` (no privilege needed): every host scan that
  reads its ``/proc/<pid>/cmdline`` whole reads all of it. It then sleeps, held.

Then, cycle after cycle until killed (or ``--cycles``):

- **inotify**: ``inotify_init1`` until refused (or ``--inotify-cap``), each with one watch on the
  home directory; all held;
- **pids**: threads until refused (or ``--pids-cap``). Threads are tasks: the pids controller,
  ``kernel.pid_max`` and ``RLIMIT_NPROC`` count them as forked processes are counted, at a few
  KiB of memory each instead of a process's copied pages (a fork loop of Python processes would
  cost the host gigabytes at a 2,048-task limit); all held;
- the status file (``--status``, JSON, replaced atomically) says what this cycle got and why it
  stopped (the errno's name), then everything is held ``--hold`` seconds, let go, and the next
  cycle begins ``--pause`` seconds later.

The bench checkpoints this desktop while it holds (the sparse file and the links are in its
writable layer then).
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import json
import mmap
import os
import resource
import signal
import sys
import threading
import time

PR_SET_MM = 35
PR_SET_MM_MAP = 14
IN_ALL_EVENTS = 0x00000FFF


class PrctlMmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (include/uapi/linux/prctl.h)."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("start_code", "end_code", "start_data", "end_data", "start_brk",
                                               "brk", "start_stack", "arg_start", "arg_end", "env_start",
                                               "env_end", "auxv")] + [("auxv_size", ctypes.c_uint32),
                                                                      ("exe_fd", ctypes.c_uint32)]


libc = ctypes.CDLL(None, use_errno=True)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]


def _errname(e: int) -> str:
    return errno.errorcode.get(e, str(e))


def write_status(path: str, status: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------- once
def make_sparse(directory: str, tib: int) -> dict:
    path = os.path.join(directory, "sparse")
    try:
        with open(path, "wb") as f:
            f.truncate(tib << 40)
        st = os.stat(path)
        return {"ok": True, "size": st.st_size, "blocks_bytes": st.st_blocks * 512}
    except OSError as exc:
        return {"ok": False, "error": _errname(exc.errno or 0), "message": str(exc)}


def make_links(directory: str, mib: int, links: int) -> dict:
    base = os.path.join(directory, "linked")
    made = 0
    try:
        with open(base, "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(mib):
                f.write(chunk)
        ldir = os.path.join(directory, "links")
        os.makedirs(ldir, exist_ok=True)
        for i in range(links):
            target = os.path.join(ldir, f"l{i}")
            if not os.path.exists(target):
                os.link(base, target)
            made += 1
        return {"ok": True, "file_mib": mib, "links": made, "nlink": os.stat(base).st_nlink}
    except OSError as exc:
        return {"ok": False, "links": made, "error": _errname(exc.errno or 0), "message": str(exc)}


def _stat_fields() -> list[str]:
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # index 0 is field 3 (state)


def argv_bomb(mib: int, report_fd: int) -> None:
    """In a forked child: point the argument area at ``mib`` MiB, report, then sleep until killed."""
    result: dict
    try:
        size = mib << 20
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.write(b"drums-hostile-argv\0" + b"A" * (size - 20) + b"\0")
        addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
        f = _stat_fields()
        field = lambda n: int(f[n - 3])  # noqa: E731 - proc(5) numbers the fields from 1
        m = PrctlMmMap(start_code=field(26), end_code=field(27), start_data=field(45), end_data=field(46),
                       start_brk=field(47), brk=libc.sbrk(0), start_stack=field(28), arg_start=addr,
                       arg_end=addr + size, env_start=field(50), env_end=field(51), auxv=0, auxv_size=0,
                       exe_fd=0xFFFFFFFF)
        rc = libc.prctl(ctypes.c_int(PR_SET_MM), ctypes.c_ulong(PR_SET_MM_MAP), ctypes.byref(m),
                        ctypes.c_ulong(ctypes.sizeof(m)), ctypes.c_ulong(0))
        if rc != 0:
            e = ctypes.get_errno()
            result = {"ok": False, "error": _errname(e), "message": os.strerror(e)}
        else:
            with open("/proc/self/cmdline", "rb") as c:
                got = len(c.read())
            result = {"ok": True, "argv_mib": mib, "cmdline_bytes": got, "pid": os.getpid()}
    except Exception as exc:  # noqa: BLE001 - reported to the parent, whatever it was
        result = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    os.write(report_fd, json.dumps(result).encode())
    os.close(report_fd)
    while True:
        signal.pause()


def start_argv_bomb(mib: int) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            argv_bomb(mib, w)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    try:
        return json.loads(data)
    except ValueError:
        return {"ok": False, "error": "no report", "message": data[:200].decode(errors="replace")}


# ----------------------------------------------------------------------------------- each cycle
def grab_inotify(cap: int, watch: str) -> tuple[list[int], dict]:
    fds: list[int] = []
    stop = "cap"
    watches = 0
    while not cap or len(fds) < cap:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        if fd < 0:
            stop = _errname(ctypes.get_errno())
            break
        fds.append(fd)
        if libc.inotify_add_watch(fd, watch.encode(), IN_ALL_EVENTS) >= 0:
            watches += 1
    return fds, {"instances": len(fds), "watches": watches, "stopped_by": stop}


def grab_tasks(cap: int) -> tuple[list[threading.Thread], threading.Event, dict]:
    release = threading.Event()
    threads: list[threading.Thread] = []
    stop = "cap"
    threading.stack_size(64 << 10)
    while not cap or len(threads) < cap:
        t = threading.Thread(target=release.wait, daemon=True)
        try:
            t.start()
        except RuntimeError as exc:  # "can't start new thread": EAGAIN from clone
            stop = f"EAGAIN ({exc})"
            break
        threads.append(t)
    return threads, release, {"tasks": len(threads), "stopped_by": stop}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="where the files go (in the desktop user's home)")
    p.add_argument("--status", required=True, help="the JSON status file")
    p.add_argument("--hold", type=float, default=5.0)
    p.add_argument("--pause", type=float, default=0.5)
    p.add_argument("--cycles", type=int, default=0, help="0: until killed")
    p.add_argument("--sparse-tib", type=int, default=20)
    p.add_argument("--link-mib", type=int, default=64)
    p.add_argument("--links", type=int, default=3000)
    p.add_argument("--argv-mib", type=int, default=16)
    p.add_argument("--inotify-cap", type=int, default=0, help="0: until refused")
    p.add_argument("--pids-cap", type=int, default=0, help="0: until refused")
    a = p.parse_args(argv)
    os.makedirs(a.dir, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inotify is what refuses, not this
    status: dict = {"pid": os.getpid(), "cycle": 0, "holding": False, "started": time.time()}
    try:
        with open("/proc/sys/user/max_inotify_instances") as f:
            status["ns_max_inotify_instances"] = int(f.read())
    except (OSError, ValueError):
        pass
    status["sparse"] = make_sparse(a.dir, a.sparse_tib)
    status["links"] = make_links(a.dir, a.link_mib, a.links)
    status["argv"] = start_argv_bomb(a.argv_mib) if a.argv_mib else {"ok": False, "error": "off"}
    write_status(a.status, status)
    cycle = 0
    while not a.cycles or cycle < a.cycles:
        cycle += 1
        fds, ino = grab_inotify(a.inotify_cap, os.path.expanduser("~"))
        threads, release, tasks = grab_tasks(a.pids_cap)
        status.update(cycle=cycle, holding=True, inotify=ino, pids=tasks, at=time.time())
        try:
            write_status(a.status, status)
        except OSError as exc:  # a full writable layer is one more refusal, not an end
            status["status_error"] = str(exc)
        time.sleep(a.hold)
        release.set()
        for t in threads:
            t.join()
        for fd in fds:
            os.close(fd)
        status.update(holding=False)
        try:
            write_status(a.status, status)
        except OSError:
            pass
        time.sleep(a.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
