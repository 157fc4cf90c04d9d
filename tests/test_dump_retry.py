"""A dump that meets a transient state in the desktop is tried again.

In a real session a program queues a message on a socketpair whose receiver asked for
credentials (SO_PASSCRED, as D-Bus does) and reads it when told to: CRIU refuses while the
message is queued ("Control messages in queue"), the checkpoint is
retried and succeeds once the message is read, and the restored sibling runs. A program that
never reads it makes every attempt fail: CRIU_FAILED, and the session goes on unharmed.

The same holds for a process whose main thread has ended while another thread runs on (CRIU:
"Zombies with threads are not supported"): a multi-threaded program that exits passes through
that state for a moment (a LibreOffice launcher did, during an OSWorld task's setup), and for a
connection to a listening unix socket that sent data before the server accepted it (CRIU:
"Non-empty write queue on an in-flight socket"; Chromium's processes connect so while it starts).
And for a socket passed in a message (SCM_RIGHTS) that its receiver has not read yet, after the
sender closed it: CRIU 4.2 dumps that but cannot always restore it (a restore that failed so, or a
Chromium that never showed its window): the dump is refused (SOCKET_IN_FLIGHT) and tried again.
And for a connection from the host to one of the session's unix sockets (CRIU: "Unix socket N not
found": the session's end of it is a socket of the host's network namespace): the daemon's own X
connections are ended before it goes on, so its screenshots and window lists leave none behind.
And for a netlink socket holding a message its program has not read yet (CRIU: "netlink: The socket
has data to read"; Chromium asks the kernel about its links while it starts, and an OSWorld task's
checkpoint met that).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from pathlib import Path

import pytest

from drums_core.host import procs, safepath
from tests.support.wait import wait_until

from drums_core.errors import Internal, Unavailable

BARE = {"image": "default", "programs": []}

# Each program below reaches its transient state, writes /tmp/sent, and passes the state only when
# the test tells it to (SIGUSR1, sent once the daemon's log says a dump attempt met the state:
# :func:`_go_once_a_dump_met_it`), or never ("never"). A timer would race the checkpoint: under load
# the checkpoint call can begin after any fixed delay, and its first attempt would meet nothing.
GO = r"""
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # before any thread: all of them block it

def wait_go():
    if sys.argv[1] == "never":
        time.sleep(3600)
    signal.sigwait({signal.SIGUSR1})
"""

HOLDER = GO + r"""
import os, socket
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # as D-Bus does: each message carries creds
a.send(b"x")
open("/tmp/sent", "w").close()
wait_go()
b.recvmsg(16, 256)
open("/tmp/read", "w").close()
time.sleep(3600)
"""


def _start_program(client, sid: str, name: str, source: str, passes: bool) -> None:
    """Run ``source`` as /tmp/<name>.py in the session, in the background, once it has written /tmp/sent;
    it passes its transient state on SIGUSR1 when ``passes``, else never."""
    client.exec(sid, ["bash", "-c", f"cat > /tmp/{name}.py <<'EOF'\n{source}EOF"])
    how = "go" if passes else "never"
    r = client.exec(sid, ["bash", "-c", f"setsid -f python3 /tmp/{name}.py {how} >/dev/null 2>&1 </dev/null; "
                                        "for i in $(seq 200); do [ -e /tmp/sent ] && exit 0; sleep 0.02; done; exit 1"])
    assert r["returncode"] == 0, f"{name}.py never got to its transient state: {r}"


def _start_holder(client, sid: str, passes: bool) -> None:
    _start_program(client, sid, "holder", HOLDER, passes)


class _GoOnceADumpMetIt(threading.Thread):
    """Calls ``go()`` once the daemon's log (past byte ``since``) says a dump attempt met a transient
    state, or gives up when :meth:`stop` is called first (the checkpoint call returned) or after
    ``timeout`` seconds. Its ``error`` is what ``go`` raised."""

    def __init__(self, log: Path, since: int, go, timeout: float = 120.0) -> None:
        super().__init__(name="go-once-a-dump-met-it", daemon=True)
        self.log, self.since, self.go, self.timeout = log, since, go, timeout
        self.stopped = threading.Event()
        self.went = False
        self.error: BaseException | None = None

    def met(self) -> bool:
        with self.log.open("rb") as f:
            f.seek(self.since)
            return b"met a transient state (attempt 1)" in f.read()

    def run(self) -> None:
        try:
            wait_until(lambda: self.stopped.is_set() or self.met(), self.timeout, "a dump attempt meeting the state")
            if not self.stopped.is_set():
                self.go()
                self.went = True
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


def _runs_script(pid: int, script: str) -> bool:
    """Whether a thread of ``pid`` runs ``script`` (a leader that is a zombie has no command line of
    its own; its live thread has)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/cmdline", "rb") as f:
            if script.encode() in f.read().split(b"\0"):
                return True
    return False


def _signal_program(session: dict, name: str) -> None:
    """SIGUSR1 to the session's ``python3 /tmp/<name>.py`` (found from the host: a process of the
    session's pid namespace running that script)."""
    ns = os.readlink(f"/proc/{session['init_pid']}/ns/pid")
    found = []
    for pid in procs.list_pids():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") == ns and _runs_script(pid, f"/tmp/{name}.py"):
                found.append(pid)
    assert len(found) == 1, f"{name}.py in the session: {found}"
    os.kill(found[0], signal.SIGUSR1)


def _checkpoint_passing_once_met(client, session: dict, go):
    """Checkpoint ``session`` (leaving it running), calling ``go()`` once the first dump attempt has met
    the transient state; the state passes on ``go`` alone. Returns the snapshot."""
    log = client.instance.log_file
    watcher = _GoOnceADumpMetIt(log, log.stat().st_size, go)
    watcher.start()
    try:
        snap = client.checkpoint(session["id"], leave_running=True)
    finally:
        watcher.stop()
    assert watcher.error is None, f"passing the state failed: {watcher.error!r}"
    assert watcher.went, "the first dump did not meet the state"
    return snap


def _dump_retried_until_it_passes(client, name: str, start, criu_says: bytes, passed: list[str],
                                  in_sibling: list[str] | None = None) -> None:
    """``start(client, sid)`` makes a state that program ``name`` passes on SIGUSR1: the first dump
    attempt meets it (``criu_says`` in the daemon log), the program is signalled, a later attempt
    succeeds once the state has passed (``passed`` runs true in the session), and the snapshot
    restores (``in_sibling`` runs true in the sibling)."""
    s = client.create(BARE)
    snap = None
    try:
        log = client.instance.log_file
        seen = log.stat().st_size
        start(client, s["id"])
        snap = _checkpoint_passing_once_met(client, s, lambda: _signal_program(s, name))
        with log.open("rb") as f:
            f.seek(seen)
            assert criu_says in f.read(), f"the first dump did not meet {criu_says!r}"
        assert client.exec(s["id"], passed)["returncode"] == 0
        (sib,) = client.restore(snap["id"], wait_live=True)
        try:
            if in_sibling:
                assert client.exec(sib["id"], in_sibling)["returncode"] == 0
        finally:
            client.destroy(sib["id"])
    finally:
        client.destroy(s["id"])
    if snap is not None:
        client.delete_snapshot(snap["id"])


def test_dump_retried_until_the_message_is_read(client):
    _dump_retried_until_it_passes(client, "holder", lambda c, sid: _start_holder(c, sid, True),
                                  b"Control messages in queue", ["test", "-e", "/tmp/read"],
                                  ["pgrep", "-f", "holder.py"])


def _checkpoint_fails_and_the_session_goes_on(client, start, criu_says: str, still_there: list[str]) -> Unavailable:
    """``start(client, sid)`` makes a state that never passes: every dump attempt meets it, the
    checkpoint fails with CRIU's words (the error is returned), and the session runs on with the
    program still there."""
    s = client.create(BARE)
    try:
        start(client, s["id"])
        with pytest.raises(Unavailable) as exc:
            client.checkpoint(s["id"], leave_running=True)
        assert exc.value.reason == "CRIU_FAILED" and criu_says in exc.value.message
        assert client.exec(s["id"], still_there)["returncode"] == 0
        assert client.get(s["id"])["state"] == "RUNNING"
    finally:
        client.destroy(s["id"])
    return exc.value


def test_an_fd_never_read_fails_the_checkpoint_and_the_session_goes_on(client):
    _checkpoint_fails_and_the_session_goes_on(client, lambda c, sid: _start_holder(c, sid, False),
                                              "Control messages in queue", ["pgrep", "-f", "holder.py"])


ZOMBIE_LEADER = GO + r"""
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)

def last_thread():
    while not os.path.exists("/tmp/leader-gone"):
        time.sleep(0.01)
    wait_go()
    os._exit(0)

threading.Thread(target=last_thread).start()
with open("/tmp/zleader.pid", "w") as f:
    f.write(str(os.getpid()))
open("/tmp/leader-gone", "w").close()
libc.syscall(60, 0)  # exit(2) of the main thread alone: the leader is a zombie, its thread runs on
"""


def _start_zombie_leader(client, sid: str, passes: bool) -> None:
    client.exec(sid, ["bash", "-c", f"cat > /tmp/zleader.py <<'EOF'\n{ZOMBIE_LEADER}EOF"])
    r = client.exec(sid, ["bash", "-c", "setsid -f python3 /tmp/zleader.py %s >/dev/null 2>&1 </dev/null; "
                                        "for i in $(seq 200); do [ -e /tmp/leader-gone ] && "
                                        "grep -q '^State:.*Z' /proc/$(cat /tmp/zleader.pid)/status && exit 0; "
                                        "sleep 0.02; done; "
                                        "exit 1" % ("go" if passes else "never")])
    assert r["returncode"] == 0, f"the leader never became a zombie with a live thread: {r}"


def test_dump_retried_until_a_zombie_leaders_last_thread_has_ended(client):
    _dump_retried_until_it_passes(client, "zleader", lambda c, sid: _start_zombie_leader(c, sid, True),
                                  b"Zombies with threads", ["bash", "-c", "test ! -e /proc/$(cat /tmp/zleader.pid)"])


def test_a_zombie_leader_whose_thread_never_ends_fails_the_checkpoint_and_the_session_goes_on(client):
    _checkpoint_fails_and_the_session_goes_on(
        client, lambda c, sid: _start_zombie_leader(c, sid, False), "Zombies with threads",
        ["bash", "-c", "grep -q '^Threads:.*2' /proc/$(cat /tmp/zleader.pid)/status"])


# A connection to a listening unix socket that has sent data before the server accepted it: while it
# waits in the accept queue, CRIU calls it "in flight" and cannot take the data out of it
INFLIGHT = GO + r"""
import os, socket, sys, time
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("/tmp/inflight.sock")
server.listen(4)
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect("/tmp/inflight.sock")
client.send(b"hello before accept")
open("/tmp/sent", "w").close()
wait_go()
conn, _ = server.accept()
conn.recv(64)
open("/tmp/read", "w").close()
time.sleep(3600)
"""


def test_dump_retried_until_a_connection_sent_on_is_accepted(client):
    _dump_retried_until_it_passes(client, "inflight", lambda c, sid: _start_program(c, sid, "inflight", INFLIGHT, True),
                                  b"in-flight socket", ["test", "-e", "/tmp/read"], ["pgrep", "-f", "inflight.py"])


def test_a_connection_never_accepted_fails_the_checkpoint_and_the_session_goes_on(client):
    _checkpoint_fails_and_the_session_goes_on(
        client, lambda c, sid: _start_program(c, sid, "inflight", INFLIGHT, False),
        "Non-empty write queue on an in-flight socket", ["pgrep", "-f", "inflight.py"])


# A socket passed over another one and closed by its sender: until the receiver reads the message,
# no process holds it (Chromium's processes hand each other sockets so while it starts)
FLYING = GO + r"""
import array, os, socket, sys, time
carrier_out, carrier_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
carrier_out.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [x.fileno()]))])
x.close()
open("/tmp/sent", "w").close()
wait_go()
msg, anc, flags, addr = carrier_in.recvmsg(1, socket.CMSG_SPACE(4))
got = array.array("i"); got.frombytes(anc[0][2])
x = socket.socket(fileno=got[0])
open("/tmp/read", "w").close()
time.sleep(3600)
"""


def test_dump_retried_until_a_socket_in_flight_is_received(client):
    _dump_retried_until_it_passes(client, "flying", lambda c, sid: _start_program(c, sid, "flying", FLYING, True),
                                  b"carrying a socket no process holds", ["test", "-e", "/tmp/read"],
                                  ["pgrep", "-f", "flying.py"])


def test_a_socket_in_flight_for_good_fails_the_checkpoint_and_the_session_goes_on(client):
    s = client.create(BARE)
    try:
        _start_program(client, s["id"], "flying", FLYING, False)
        before = {x["id"] for x in client.snapshots()}      # the worker's instance holds others' snapshots
        with pytest.raises(Unavailable) as exc:
            client.checkpoint(s["id"])                   # not leave_running: the desktop must survive anyway
        assert exc.value.reason == "SOCKET_IN_FLIGHT", exc.value
        assert "no process holds" in exc.value.message
        assert client.exec(s["id"], ["pgrep", "-f", "flying.py"])["returncode"] == 0
        assert client.get(s["id"])["state"] == "RUNNING"
        assert {x["id"] for x in client.snapshots()} == before, "a refused dump left a snapshot"
    finally:
        client.destroy(s["id"])


def test_a_failed_dump_whose_network_cannot_be_put_back_marks_the_session_broken(client):
    """After a failed dump the session's link is made again; if that fails too the session cannot be
    used: it is marked broken (never left CHECKPOINTING), the error says so, and destroy removes it."""
    s = client.create(BARE)
    try:
        _start_holder(client, s["id"], False)
        client.call("inject", point="checkpoint-rewire", times=1)
        with pytest.raises(Internal) as exc:
            client.checkpoint(s["id"], leave_running=True)
        assert exc.value.reason == "CHECKPOINT_FAILED", exc.value
        assert "network could not be put back" in exc.value.message
        assert "Control messages in queue" in exc.value.message
        got = client.get(s["id"])
        assert got["state"] == "BROKEN" and "network could not be put back" in got["broken"], got
    finally:
        client.destroy(s["id"])
    assert s["id"] not in {x["id"] for x in client.list()}


# A netlink socket holding the kernel's answer to a request its program has not read yet (CRIU 4.2
# dumps no netlink queue); Chromium asks the kernel about its links and addresses so while it starts
NETLINK_ASKER = GO + r"""
import socket, struct, sys, time
RTM_GETLINK, NLM_F_REQUEST, NLM_F_DUMP = 18, 1, 0x300
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
s.bind((0, 0))
request = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)  # struct ifinfomsg: every link
s.send(struct.pack("=IHHII", 16 + len(request), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request)
open("/tmp/sent", "w").close()
wait_go()
s.setblocking(False)
try:
    while s.recv(65536):
        pass
except BlockingIOError:
    pass
open("/tmp/read", "w").close()
time.sleep(3600)
"""


def test_dump_retried_until_a_netlink_answer_is_read(client):
    _dump_retried_until_it_passes(client, "asker", lambda c, sid: _start_program(c, sid, "asker", NETLINK_ASKER, True),
                                  b"netlink: The socket has data to read", ["test", "-e", "/tmp/read"],
                                  ["pgrep", "-f", "asker.py"])


def test_a_netlink_answer_never_read_fails_the_checkpoint_and_the_session_goes_on(client):
    exc = _checkpoint_fails_and_the_session_goes_on(
        client, lambda c, sid: _start_program(c, sid, "asker", NETLINK_ASKER, False),
        "netlink: The socket has data to read", ["pgrep", "-f", "asker.py"])
    assert "netlink socket with a message it has not read" in exc.message, exc.message


def _x_connection_from_the_host(session):
    """A connection from this (host) process to the session's X server, as the daemon makes them."""
    return safepath.connect_unix(f"/proc/{session['init_pid']}/root", "tmp/.X11-unix/X0", timeout=10)


def test_dump_retried_until_a_host_connection_to_the_session_ends(client):
    s = client.create(BARE)
    snap = None
    try:
        log = client.instance.log_file
        seen = log.stat().st_size
        conn = _x_connection_from_the_host(s)
        try:
            snap = _checkpoint_passing_once_met(client, s, conn.close)
        finally:
            conn.close()
        with log.open("rb") as f:
            f.seek(seen)
            assert re.search(rb"Unix socket \d+ not found", f.read()), "the first dump did not meet the connection"
        (sib,) = client.restore(snap["id"], wait_live=True)
        client.destroy(sib["id"])
    finally:
        client.destroy(s["id"])
    if snap is not None:
        client.delete_snapshot(snap["id"])


def test_a_host_connection_held_for_good_fails_the_checkpoint_and_the_session_goes_on(client):
    s = client.create(BARE)
    try:
        with _x_connection_from_the_host(s):
            with pytest.raises(Unavailable) as exc:
                client.checkpoint(s["id"], leave_running=True)
        assert exc.value.reason == "CRIU_FAILED", exc.value
        assert re.search(r"Unix socket \d+ not found", exc.value.message), exc.value.message
        assert "another network namespace" in exc.value.message, exc.value.message
        assert client.get(s["id"])["state"] == "RUNNING"
        assert client.exec(s["id"], ["true"])["returncode"] == 0
    finally:
        client.destroy(s["id"])


def _foreign_sockets_of(pid: int) -> list[str]:
    """Inodes of the sockets process ``pid`` holds that are not of its network namespace (read from
    the host at once: its fds, then its namespace's /proc/net tables)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed since the listing
            pass
    own = set()
    for table, column in (("unix", 6), ("tcp", 9), ("tcp6", 9), ("udp", 9), ("udp6", 9)):
        with open(f"/proc/{pid}/net/{table}") as f:
            own |= {row.split()[column] for row in f.read().splitlines()[1:] if len(row.split()) > column}
    return [h[len("socket:["):-1] for h in held if h.startswith("socket:[") and h[len("socket:["):-1] not in own]


def test_the_daemons_x_connections_are_gone_from_the_x_server_when_it_answers(client):
    """A screenshot or a window list from the daemon leaves no connection behind in the session's X
    server: the next checkpoint must not meet one (it did once, in an OSWorld task's setup)."""
    s = client.create(BARE)
    try:
        (xvfb,) = [p["pid"] for p in client.processes(s["id"]) if p["comm"] == "Xvfb"]
        with _x_connection_from_the_host(s):  # the check sees a connection from the host, once accepted
            wait_until(lambda: _foreign_sockets_of(xvfb), 10, "the X server holding a connection from the host")
        # this test's own connection was closed from this side only: the X server lets go of it when
        # it gets to it (under load, after a screenshot's whole connection had come and gone)
        wait_until(lambda: _foreign_sockets_of(xvfb) == [], 10, "the X server letting go of the test's connection")
        for _ in range(10):
            client.screenshot(s["id"])
            assert _foreign_sockets_of(xvfb) == [], "a screenshot left its connection in the X server"
            client.windows(s["id"])
            assert _foreign_sockets_of(xvfb) == [], "a window list left its connection in the X server"
    finally:
        client.destroy(s["id"])
