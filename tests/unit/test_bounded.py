"""drums_core.host.bounded (no root): files, pipes, procfs and HTTP replies are read within a byte cap
and a total deadline, and fail with SESSION_REPLY_TOO_LARGE / SESSION_REPLY_TIMEOUT; argv is read
whole-elements-only up to its cap; a tag counts only where the user namespace agrees. Servers are
on loopback; every thread, process and socket a test starts is ended by it."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest
import requests

from drums_core.errors import Unavailable
from drums_core.host import bounded, procs

MiB = 1 << 20


# ------------------------------------------------------------------------------------------ files and pipes
def test_a_file_within_its_cap_is_read_whole(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 1000)
    got = bounded.read_path(str(p), limit=1000, timeout=1)
    assert got.data == b"x" * 1000 and not got.truncated


def test_a_file_over_its_cap_fails_or_is_cut(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 1001)
    with pytest.raises(Unavailable) as exc:
        bounded.read_path(str(p), limit=1000, timeout=1)
    assert exc.value.reason == bounded.TOO_LARGE
    got = bounded.read_path(str(p), limit=10, timeout=1, truncate=True)
    assert got.data == b"x" * 10 and got.truncated


def test_a_pipe_that_drips_fails_at_its_deadline():
    r, w = os.pipe()
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.2):
            try:
                os.write(w, b"x")
            except OSError:
                return

    t = threading.Thread(target=drip)
    t.start()
    try:
        start = time.monotonic()
        with pytest.raises(Unavailable) as exc:
            bounded.read_fd(r, limit=1 << 20, timeout=1.0, what="drip")
        took = time.monotonic() - start
    finally:
        stop.set()
        t.join()
        os.close(w)
        os.close(r)
    assert exc.value.reason == bounded.TIMEOUT
    assert 0.9 < took < 5, took


def test_a_pipe_that_floods_fails_at_its_cap_with_memory_flat():
    r, w = os.pipe()
    stop = threading.Event()

    def flood() -> None:
        block = b"y" * 65536
        while not stop.is_set():
            try:
                os.write(w, block)
            except OSError:
                return

    t = threading.Thread(target=flood)
    t.start()
    tracemalloc.start()
    try:
        with pytest.raises(Unavailable) as exc:
            bounded.read_fd(r, limit=2 * MiB, timeout=30, what="flood")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stop.set()
        os.close(r)  # the writer then fails with EPIPE
        t.join()
        os.close(w)
    assert exc.value.reason == bounded.TOO_LARGE
    assert peak < 8 * MiB, peak


def test_head_tail_keeps_both_ends_and_says_what_it_dropped():
    sink = bounded.HeadTail(head=10, tail=10)
    for i in range(100):
        sink.add(f"{i:03d}\n".encode())
    out = sink.value()
    assert out.startswith(b"000\n001\n00") and out.endswith(b"098\n099\n")
    assert sink.dropped == 400 - 20 and b"380 bytes of a 400-byte stream dropped" in out
    small = bounded.HeadTail(head=10, tail=10)
    small.add(b"abc")
    assert small.value() == b"abc"


# ------------------------------------------------------------------------------------------ argv
BOMB = r'''
import ctypes, mmap, os, sys, time
size, tag = int(sys.argv[1]), sys.argv[2].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.sbrk.restype = ctypes.c_void_p
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
class Map(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("start_code", "end_code", "start_data", "end_data", "start_brk",
                "brk", "start_stack", "arg_start", "arg_end", "env_start", "env_end", "auxv")] + \
               [("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]
region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
head = b"--tag\0" + tag + b"\0"
region[:len(head)] = head
unit = b"A\0" * 4096
for i in range(len(head), size - len(unit), len(unit)):
    region[i:i + len(unit)] = unit
region[size - 1:size] = b"\0"
addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
field = lambda n: int(f[n - 3])
m = Map(field(26), field(27), field(45), field(46), field(47), libc.sbrk(0), field(28), addr, addr + size,
        field(50), field(51), 0, 0, 0xFFFFFFFF)
if libc.prctl(35, 14, ctypes.byref(m), ctypes.sizeof(m), 0) != 0:
    print("fail", os.strerror(ctypes.get_errno()), flush=True)
    raise SystemExit(1)
print("ok", flush=True)
sys.stdin.read()
'''


@contextlib.contextmanager
def _bomb(size: int, tag: str, prefix: list[str] = ()) -> Iterator[int]:
    p = subprocess.Popen([*prefix, sys.executable, "-c", BOMB, str(size), tag], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        if line != "ok":
            pytest.fail(f"the bomb could not set its argument area: {line!r}")
        yield p.pid
    finally:
        p.stdin.close()
        p.kill()
        p.wait()
        p.stdout.close()


def test_read_cmdline_keeps_whole_elements_within_its_cap():
    with _bomb(8 * MiB, "drums:unit-0123456789ab") as pid:
        tracemalloc.start()
        try:
            argv = procs.read_cmdline(pid)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert argv[:2] == ["--tag", "drums:unit-0123456789ab"]
        assert sum(len(a) + 1 for a in argv) <= procs.CMDLINE_LIMIT
        assert set(argv[2:]) == {"A"}  # the element the cap cut is left out, not kept in part
        assert peak < 4 * MiB, peak
        info = procs.read_proc(pid)
        assert info is not None and info.claimed_tags == ["drums:unit-0123456789ab"]
        assert info.tags == ["drums:unit-0123456789ab"]  # a host process outside every Drums group


def test_a_tag_from_another_user_namespace_outside_drums_groups_counts_for_nobody():
    probe = subprocess.run(["unshare", "--user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail("this test needs unprivileged user namespaces, which are off here: "
                    f"{probe.stderr.decode().strip()}")
    with _bomb(1 * MiB, "drums:unit-0123456789ab", prefix=["unshare", "--user"]) as outer:
        inner = next((p for p in procs.scan_processes().values() if p.ppid == outer or p.pid == outer
                      if p.claimed_tags), None)
        assert inner is not None, "the tagged process in the user namespace was not seen"
        assert inner.foreign_userns and not inner.cgroup_runs
        assert inner.claimed_tags == ["drums:unit-0123456789ab"] and inner.tags == []
        assert not [p for p in procs.find_tagged("drums:unit-0123456789ab") if p.pid == inner.pid]


def test_tags_follow_the_drums_group_a_process_is_in():
    forged = procs.ProcInfo(pid=1, ppid=0, comm="x", state="S", starttime=1,
                            argv=("x", "--tag", "drums:victim-1", "--tag", "drums:mine-1"),
                            cgroup_runs=frozenset({"mine-1"}), foreign_userns=True)
    assert forged.tags == ["drums:mine-1"]
    torn = procs.ProcInfo(pid=1, ppid=0, comm="x", state="S", starttime=1, argv=("--tag", "drums:a-1"),
                          cgroup_runs=frozenset({"a-1", "b-1"}))
    assert torn.tags == []


# ------------------------------------------------------------------------------------------ HTTP
@contextlib.contextmanager
def _server(mode: str) -> Iterator[int]:
    """A loopback server answering every connection as ``mode`` says: ok, huge (no length), big
    (Content-Length 1 GiB), drip (one byte every 0.5 s), slowheaders (a header line a byte at a time)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve(c: socket.socket) -> None:
        try:
            c.recv(65536)
            if mode == "ok":
                c.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\n{"draw": 1}')
            elif mode in ("huge", "big"):
                c.sendall(b"HTTP/1.0 200 OK\r\n" + (b"Content-Length: 1073741824\r\n" if mode == "big" else b"")
                          + b"\r\n")
                block = b" " * 65536
                for _ in range(16384):
                    if stop.is_set():
                        return
                    c.sendall(block)
            elif mode == "drip":
                c.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
                while not stop.wait(0.5):
                    c.sendall(b" ")
            elif mode == "slowheaders":
                c.sendall(b"HTTP/1.0 200 OK\r\nX-Slow: ")
                while not stop.wait(0.5):
                    c.sendall(b"a")
        except OSError:
            pass
        finally:
            c.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            conns.append(c)
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            lsock.shutdown(socket.SHUT_RDWR)
        lsock.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        t.join(5)


def test_http_request_reads_an_answer():
    with _server("ok") as port:
        r = bounded.http_request("POST", "127.0.0.1", port, "/x", limit=1024, timeout=5, body=b"")
    assert r.status == 200 and r.body == b'{"draw": 1}'


@pytest.mark.parametrize("mode", ["huge", "big"])
def test_http_request_fails_over_its_cap_with_memory_flat(mode):
    with _server(mode) as port:
        tracemalloc.start()
        try:
            with pytest.raises(Unavailable) as exc:
                bounded.http_request("GET", "127.0.0.1", port, "/", limit=1 * MiB, timeout=30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert exc.value.reason == bounded.TOO_LARGE
    assert peak < 8 * MiB, peak


@pytest.mark.parametrize("mode", ["drip", "slowheaders"])
def test_http_request_has_a_total_deadline(mode):
    with _server(mode) as port:
        start = time.monotonic()
        with pytest.raises(Unavailable) as exc:
            bounded.http_request("GET", "127.0.0.1", port, "/", limit=1 * MiB, timeout=1.5)
        took = time.monotonic() - start
    assert exc.value.reason == bounded.TIMEOUT
    assert took < 6, took  # each byte came within 0.5 s: a per-read timeout would never have fired


@pytest.mark.parametrize("mode", ["drip", "slowheaders"])
def test_a_deadline_session_bounds_headers_and_body(mode):
    with _server(mode) as port, bounded.deadline_session() as s:
        start = time.monotonic()
        with pytest.raises((Unavailable, requests.RequestException)):
            with bounded.deadline(start + 1.5):
                resp = s.get(f"http://127.0.0.1:{port}/", timeout=(2, 30), stream=True)
                bounded.read_response(resp, limit=1 * MiB, timeout=1.5, what="drip", started=start)
        took = time.monotonic() - start
    assert took < 6, took


def test_read_response_fails_over_its_cap():
    with _server("huge") as port, requests.Session() as s:
        resp = s.get(f"http://127.0.0.1:{port}/", timeout=(2, 30), stream=True)
        with pytest.raises(Unavailable) as exc:
            bounded.read_response(resp, limit=1 * MiB, timeout=30, what="huge")
    assert exc.value.reason == bounded.TOO_LARGE


# ------------------------------------------------------------------------------------------ commands
def test_run_returns_a_commands_output_and_feeds_its_input():
    r = bounded.run(["sh", "-c", "cat; echo err >&2; exit 3"], limit=1024, timeout=10, what="cat", input=b"hello")
    assert (r.returncode, r.stdout, r.stderr) == (3, b"hello", b"err\n")


def test_run_kills_a_command_that_prints_too_much():
    start = time.monotonic()
    with pytest.raises(Unavailable) as exc:
        bounded.run(["yes"], limit=1 * MiB, timeout=30, what="yes")
    assert exc.value.reason == bounded.TOO_LARGE
    assert time.monotonic() - start < 10


def test_run_has_a_total_deadline_also_for_a_left_behind_pipe_holder():
    start = time.monotonic()
    with pytest.raises(Unavailable) as exc:
        # the shell ends at once; its background child keeps stdout open and drips into it
        bounded.run(["sh", "-c", "(while :; do echo x; sleep 0.2; done) & exit 0"], limit=1 * MiB, timeout=1.5,
                    what="drip")
    assert exc.value.reason == bounded.TIMEOUT
    assert time.monotonic() - start < 6


# ------------------------------------------------------------------------------------------ adapters
@pytest.mark.parametrize("mode,said", [("huge", "larger than 4 MiB"), ("drip", bounded.TIMEOUT)])
def test_the_setup_journal_reads_the_guests_log_within_bounds(mode, said):
    from drums_osworld.setup_journal import Journal

    with _server(mode) as port:
        j = Journal(f"http://127.0.0.1:{port}", timeout=1.0)
        try:
            start = time.monotonic()
            report = j.read(label="setup")
            took = time.monotonic() - start
        finally:
            j.close()
    assert said in (report.read_error or ""), report
    assert took < 8, took
