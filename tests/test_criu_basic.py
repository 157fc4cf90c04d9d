"""Dump and restore a small process tree in new pid/mount/net/uts/ipc namespaces.

Uses the provisioned CRIU through pycriu's RPC (``criu swrk``), never the criu CLI. The tree is a
counting process (the namespace's init, a session leader) and one counting child; each appends
consecutive integers to its own file on the session's private /tmp. After a restore both files
must go on with the next integer: the counters live only in the processes' memory, so a restart
from scratch, a lost or a repeated tick all break the sequence.

Self-contained on purpose: it proves the platform (CRIU 4.2 + pycriu + this kernel) rather than
the engine's own modules.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.wait import WaitTimeout, wait_until

CRIU_BIN = Path(os.environ.get("DRUMS_CRIU", "/opt/drums/criu/usr/sbin/criu"))
PYTHON = "/usr/bin/python3"  # the host's; the session sees it through the overlay root

# Run as pid 1 of the new namespaces, by /bin/sh, before anything of the tree is dumpable: mount a
# minimal world inside the overlay root, pivot into it, drop the host's mounts, re-open stdio
# inside (an fd on a host file opened before the namespace existed cannot be dumped), then exec
# the workload so that nothing stays mapped from the host's root.
SETUP = r"""
set -eu
root=$1
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,size=64k dev "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3
mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/urandom" c 1 9
mount -t tmpfs -o mode=1777,size=16m tmp "$root/tmp"
mkdir -p "$root/.oldroot"
cd "$root"
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
hostname drums-criu-test
exec "$2" /drums-test/workload.py </dev/null >/dev/null 2>&1
"""

WORKLOAD = r"""
import os, time

def count(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    n = 0
    while True:
        n += 1
        os.write(fd, b"%d\n" % n)
        time.sleep(0.02)

if os.fork() == 0:
    count("/tmp/child.count")
count("/tmp/init.count")
"""


def _require_root_and_criu() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (namespaces, mounts, CRIU); run it as root")
    if not os.access(CRIU_BIN, os.X_OK):
        pytest.fail(f"CRIU binary missing at {CRIU_BIN}: run scripts/provision")
    for tool in ("unshare", "setsid", "pivot_root", "mount", "mknod", "hostname"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found on PATH (util-linux/coreutils/hostname)")


def _mount_lines(fragment: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if fragment in line]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def _read_counts(path: Path) -> list[int]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [int(x) for x in text.split("\n")[:-1]]  # the last line may be half written


def _assert_consecutive(values: list[int], what: str) -> None:
    bad = [(i, v) for i, v in enumerate(values) if v != i + 1]
    assert not bad, f"{what}: expected 1..{len(values)}, first mismatch at line {bad[0][0] + 1}: " \
                    f"{bad[0][1]} (tail: {values[-5:]})"


class Scratch:
    """A private tmpfs holding an overlay root (lower = host /), images and logs.

    Everything it starts or mounts is undone by :meth:`cleanup`, which is safe to call twice.
    """

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="drums-criu-test-", dir="/run"))
        self.root = self.base / "root"
        self.images = self.base / "images"
        self.pids: list[int] = []  # host pids to SIGKILL at cleanup (namespace inits)
        self.popens: list[subprocess.Popen] = []
        self.mounted: list[Path] = []

    def mount(self) -> None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=700,size=256m", "drums-test",
                        str(self.base)], check=True)
        self.mounted.append(self.base)
        subprocess.run(["mount", "--make-private", str(self.base)], check=True)
        for d in ("upper", "work", "root", "images"):
            (self.base / d).mkdir()
        opts = (f"lowerdir=/,upperdir={self.base}/upper,workdir={self.base}/work,"
                "redirect_dir=on")
        subprocess.run(["mount", "-t", "overlay", "-o", opts, "drums-test-root", str(self.root)],
                       check=True)
        self.mounted.append(self.root)
        (self.root / "drums-test").mkdir()
        (self.root / "drums-test/workload.py").write_text(WORKLOAD)

    def cleanup(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for pid in self.pids:
            try:
                os.waitpid(pid, 0)  # ours only when CRIU restored it as our child
            except ChildProcessError:
                pass
            with contextlib.suppress(WaitTimeout):  # cleanup goes on to the unmounts either way, as before
                wait_until(lambda pid=pid: not _alive(pid), 10, f"{pid} to exit")
        self.pids.clear()
        for target in reversed(self.mounted):
            try:  # a dying namespace lets go of its root a moment later
                wait_until(lambda target=target: subprocess.run(["umount", str(target)], capture_output=True)
                           .returncode == 0, 5, f"{target} to unmount", every=0.1)
            except WaitTimeout:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
        self.mounted.clear()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def scratch(request):
    _require_root_and_criu()
    s = Scratch()
    request.addfinalizer(s.cleanup)
    s.mount()
    return s


def _criu_client(images_fd: int, log_name: str):
    import pycriu
    from pycriu import rpc_pb2 as rpc

    c = pycriu.criu()
    c.use_binary(str(CRIU_BIN))
    c.opts.images_dir_fd = images_fd
    c.opts.log_file = log_name
    c.opts.log_level = 4
    c.opts.manage_cgroups = True
    c.opts.manage_cgroups_mode = rpc.IGNORE
    c.opts.network_lock = rpc.SKIP
    c.opts.auto_ext_mnt = True
    c.opts.ext_sharing = True
    c.opts.ext_masters = True
    return c


def _criu_log_tail(images: Path, log_name: str) -> str:
    try:
        lines = (images / log_name).read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no CRIU log: {exc})"
    errors = [line for line in lines if "Error" in line or "error" in line.lower()]
    return "\n".join((errors or lines)[-15:])


@pytest.mark.timeout(120)
def test_dump_and_restore_keeps_counting(scratch: Scratch) -> None:
    import pycriu

    log = open(scratch.base / "launch.log", "wb")
    launcher = subprocess.Popen(
        ["unshare", "--pid", "--mount", "--net", "--uts", "--ipc", "--fork", "--kill-child",
         "--propagation", "private",
         "setsid", "/bin/sh", "-c", SETUP, "setup", str(scratch.root), PYTHON],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    scratch.popens.append(launcher)
    init = wait_until(lambda: _children(launcher.pid)[:1], 10, "the namespace's init")[0]
    scratch.pids.append(init)

    counts = Path(f"/proc/{init}/root/tmp")
    def ready() -> bool:
        if launcher.poll() is not None:
            pytest.fail(f"the session died during set-up: "
                        f"{(scratch.base / 'launch.log').read_text(errors='replace')}")
        return (len(_read_counts(counts / "init.count")) >= 20
                and len(_read_counts(counts / "child.count")) >= 20)
    wait_until(ready, 20, "both counters to reach 20")

    ns = {k: os.readlink(f"/proc/{init}/ns/{k}") for k in ("pid", "mnt", "net", "uts", "ipc")}
    host_ns = {k: os.readlink(f"/proc/self/ns/{k}") for k in ns}
    assert all(ns[k] != host_ns[k] for k in ns), f"not in new namespaces: {ns} vs {host_ns}"
    with open(f"/proc/{init}/stat") as f:
        stat = f.read().rsplit(")", 1)[1].split()
    assert int(stat[3]) == init, "the namespace's init is not a session leader"

    images_fd = os.open(scratch.images, os.O_DIRECTORY)
    try:
        os.set_inheritable(images_fd, True)
        c = _criu_client(images_fd, "dump.log")
        c.opts.pid = init
        try:
            c.dump()
        except pycriu.CRIUException as exc:
            pytest.fail(f"criu dump via pycriu failed: {exc}\n"
                        f"{_criu_log_tail(scratch.images, 'dump.log')}")
    finally:
        os.close(images_fd)

    # The dump killed the tree; the launcher (outside the namespaces) then exits too.
    wait_until(lambda: not _alive(init), 10, "the dumped tree to go away")
    launcher.wait(timeout=10)
    scratch.pids.remove(init)

    images_fd = os.open(scratch.images, os.O_DIRECTORY)
    try:
        os.set_inheritable(images_fd, True)
        c = _criu_client(images_fd, "restore.log")
        c.opts.root = str(scratch.root)
        c.opts.rst_sibling = True  # the restored init becomes our child: we reap it
        try:
            resp = c.restore()
        except pycriu.CRIUException as exc:
            pytest.fail(f"criu restore via pycriu failed: {exc}\n"
                        f"{_criu_log_tail(scratch.images, 'restore.log')}")
    finally:
        os.close(images_fd)
    restored = resp.pid
    assert restored > 0, "criu restore reported no pid"
    scratch.pids.append(restored)

    counts = Path(f"/proc/{restored}/root/tmp")
    dumped = {name: len(_read_counts(counts / name)) for name in ("init.count", "child.count")}
    for name, n in dumped.items():
        assert n >= 20, f"{name} restored with only {n} lines"

    def advanced() -> bool:
        return all(len(_read_counts(counts / name)) >= n + 25 for name, n in dumped.items())
    wait_until(advanced, 20, "the restored counters to advance by 25")

    assert _alive(restored), "the restored init died"
    kids = _children(restored)
    assert len(kids) == 1 and _alive(kids[0]), f"the restored child is gone (children: {kids})"
    for name in dumped:
        _assert_consecutive(_read_counts(counts / name), f"restored {name}")
    assert os.readlink(f"/proc/{restored}/ns/pid") != host_ns["pid"]
    assert os.readlink(f"/proc/{restored}/ns/net") != host_ns["net"]

    scratch.cleanup()
    leftovers = _mount_lines(str(scratch.base))
    assert not leftovers, f"mounts left behind: {leftovers}"
