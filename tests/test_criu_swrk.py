"""Two CRIU calls at once hold nothing of each other (drums_core.session.criu._Swrk).

A CI run failed a restore with "criu swrk closed the connection" and an empty log while another
session's restore failed and was torn down beside it. pycriu makes CRIU's end of its socket
inheritable in the parent, and the engine made the work directory's descriptor inheritable for the
whole call: a ``criu swrk`` forked by another thread meanwhile inherited them, so it held the first
session's work directory, and that session's teardown (which SIGKILLs every process holding a file
under the session's directory) killed it mid-restore. Here two ``criu swrk`` run at once, each given
its own work directory the way :func:`criu.restore` gives it: each holds its own and not the other's,
and the daemon's copies stay close-on-exec.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from drums_core.host import procs
from drums_core.session import criu

from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def _held(pid: int) -> set[str]:
    """What every descriptor of ``pid`` points at, sockets included (``procs.proc_paths`` leaves them out)."""
    return {t for fd in os.listdir(f"/proc/{pid}/fd") if (t := procs.readlink(f"/proc/{pid}/fd/{fd}"))}


def _execed(pid: int) -> bool:
    """``pid`` runs CRIU with its arguments in place: the kernel points ``/proc/<pid>/exe`` at the new
    program before it has set up the new arguments (``cmdline`` reads empty for that moment)."""
    return (procs.readlink(f"/proc/{pid}/exe") == os.path.realpath(criu.CRIU_BIN)
            and len(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")) >= 3)


def _swrk_socket(pid: int) -> str:
    """The socket ``criu swrk <fd>`` was started with."""
    fd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[2].decode()
    return os.readlink(f"/proc/{pid}/fd/{fd}")


def _cloexec(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)


def test_concurrent_criu_calls_inherit_only_their_own_work_directory(tmp_path: Path) -> None:
    if not os.access(criu.CRIU_BIN, os.X_OK):
        pytest.fail(f"this test needs the CRIU binary at {criu.CRIU_BIN} (scripts/provision installs it)")
    dirs = [tmp_path / "a", tmp_path / "b"]
    fds, comms = [], []
    # a descriptor some library of the daemon opened without close-on-exec (Ray's core does)
    leaky = os.open(tmp_path / "leaky", os.O_CREAT | os.O_WRONLY, 0o600)
    os.set_inheritable(leaky, True)
    fds.append(leaky)
    try:
        for d in dirs:
            d.mkdir()
            fd = os.open(d, os.O_DIRECTORY)  # as criu.restore and criu.dump open it
            fds.append(fd)
            comm = criu._Swrk(str(criu.CRIU_BIN), None, inherit=(fd,))
            comm.connect(False)  # CRIU runs and waits for its request
            comms.append(comm)
            assert _cloexec(fd) and _cloexec(comm.sk.fileno()), "a CRIU call's descriptor is inheritable here"
        for c in comms:  # its pid is told before the exec (after the child closed what it must not hold)
            wait_until(lambda c=c: _execed(c.swrk), 10, f"criu swrk {c.swrk} to exec")
        a, b = (_held(c.swrk) for c in comms)
        assert str(dirs[0]) in a and str(dirs[1]) in b, f"a CRIU lacks its own work directory: {a}, {b}"
        assert str(dirs[1]) not in a and str(dirs[0]) not in b, f"a CRIU holds the other's work directory: {a}, {b}"
        # each holds its own end of its socket (``criu swrk <fd>``) and not the other call's
        own = [_swrk_socket(c.swrk) for c in comms]
        assert all(t.startswith("socket:") for t in own), own
        assert own[0] in a and own[1] not in a and own[1] in b and own[0] not in b, (own, a, b)
        # and nothing else of this process (a worker that ran Ray holds log files Ray opened without
        # close-on-exec: a CRIU started the way pycriu starts it inherits them)
        ours = _held(os.getpid())
        assert str(tmp_path / "leaky") in ours
        for held, mine in ((a, {own[0], str(dirs[0])}), (b, {own[1], str(dirs[1])})):
            assert not (held - mine) & ours, f"a CRIU holds this process's {(held - mine) & ours}"
    finally:
        for c in comms:
            c.disconnect()  # CRIU sees its socket close and exits; disconnect reaps it
        for fd in fds:
            os.close(fd)
    for c in comms:
        assert not os.path.exists(f"/proc/{c.swrk}"), f"criu swrk {c.swrk} outlived its call"
