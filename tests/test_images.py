"""Desktop images (drums_core.host.images): spec validation, real builds, the id shift, crash safety.

The builds are real (mmdebstrap, apt, chroot) and need root and the network (deb.debian.org,
PyPI). The default image is built once if the store lacks it (CI's first run) and reused
otherwise; every other image a test makes is removed afterwards, also when the test fails.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from drums_core import config

from drums_core.host import idshift, image_recipe, image_store, images, procs
from drums_core.errors import FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable

from tests.support.wait import wait_until

CHECKOUT = Path(__file__).resolve().parent.parent


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("image builds need root (mmdebstrap, chroot, chown)")


def _write_spec(tmp_path: Path, doc: object, name: str = "spec.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _images_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "drums_core.cli", *args], cwd=CHECKOUT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _cleanup(name: str) -> None:
    """Remove every trace of a test image: the image, interrupted builds, its lock file."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if f"drums-image-test-{name}" in point:
            subprocess.run(["umount", "-l", point], check=False)
    target = config.IMAGE_STORE / name
    if target.exists():
        shutil.rmtree(target)
    for d in image_store.stale_builds(name):
        shutil.rmtree(d, ignore_errors=True)
    (config.IMAGE_STORE / ".locks" / name).unlink(missing_ok=True)
    (config.IMAGE_STORE / ".locks" / f"{name}@use").unlink(missing_ok=True)
    shutil.rmtree(config.IMAGE_STORE / f".staged-{name}", ignore_errors=True)


@pytest.fixture
def image_name() -> Iterator[str]:
    name = f"test-{secrets.token_hex(4)}"
    try:
        yield name
    finally:
        _cleanup(name)


@pytest.fixture(scope="session")
def default_image() -> images.Manifest:
    _require_root()
    try:
        return images.check_usable(config.DEFAULT_IMAGE)
    except NotFound:
        return images.build(images.default_spec(), progress=print)


# ----------------------------------------------------------------------------- spec validation
def _hello(tmp_path: Path) -> Path:
    src = tmp_path / "hello.txt"
    src.write_text("hello from the host\n")
    return src


@pytest.mark.parametrize("doc, message", [
    ({"name": "x", "colour": "red"}, "unknown field"),
    ({"name": "../etc"}, "invalid image name"),
    ({"name": "a/b"}, "invalid image name"),
    ({"base": "default"}, "needs a 'name'"),
    ({"name": "x", "base": "x"}, "its own base"),
    ({"name": "x", "base": "../default"}, "invalid base image"),
    ({"name": "x", "packages": ["jq; rm -rf /"]}, "invalid Debian package name"),
    ({"name": "x", "packages": "jq"}, "must be a list"),
    ({"name": "x", "commands": [1]}, "non-empty strings"),
    ({"name": "x", "files": [{"src": "/nonexistent/file", "dest": "/etc/x"}]}, "does not exist"),
    ({"name": "x", "files": [{"src": "HELLO", "dest": "etc/x"}]}, "absolute"),
    ({"name": "x", "files": [{"src": "HELLO", "dest": "/etc/../root/x"}]}, "no '..'"),
    ({"name": "x", "files": [{"src": "HELLO", "dest": "/etc/"}]}, "no trailing"),
    ({"name": "x", "files": [{"src": "HELLO", "dest": "/etc/x", "mode": "rw"}]}, "octal"),
    ({"name": "x", "files": [{"src": "HELLO", "dest": "/etc/x", "owner": "me"}]}, "unknown field"),
    (["name", "x"], "JSON object"),
])
def test_load_spec_rejects_malformed_specs(tmp_path: Path, doc: object, message: str) -> None:
    hello = str(_hello(tmp_path))
    doc = json.loads(json.dumps(doc).replace("HELLO", hello))
    with pytest.raises(InvalidArgument, match=re.escape(message)) as info:
        images.load_spec(_write_spec(tmp_path, doc))
    assert info.value.reason in ("INVALID_IMAGE_SPEC", "INVALID_NAME")


def test_load_spec_rejects_bad_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n')
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        images.load_spec(bad)
    with pytest.raises(InvalidArgument, match="cannot read"):
        images.load_spec(tmp_path / "missing.json")


def test_load_spec_accepts_a_user_spec(tmp_path: Path) -> None:
    _hello(tmp_path)
    spec = images.load_spec(_write_spec(tmp_path, {
        "name": "mine", "base": "default", "packages": ["tree"],
        "files": [{"src": "hello.txt", "dest": "/etc/hello.txt", "mode": "0640"}],
        "commands": ["true"]}))
    assert spec.base == "default" and spec.derived and spec.packages == ("tree",)
    assert spec.files[0].src == str(tmp_path / "hello.txt") and spec.files[0].mode == 0o640
    assert spec.to_json()["files"][0]["mode"] == "0640"


def test_default_spec_and_missing_images() -> None:
    spec = images.default_spec()
    assert spec.name == "default" and not spec.derived
    assert {"sudo", "xvfb", "libreoffice-calc", "python3-flask"} <= set(spec.packages)
    assert "dbus-user-session" not in spec.packages  # pulls systemd and pam_systemd
    with pytest.raises(NotFound, match="drums image build"):
        images.get("no-such-image")
    with pytest.raises(InvalidArgument):
        images.get("../default")
    with pytest.raises(InvalidArgument, match="no built-in spec"):
        images.builtin_spec("mine")


# ------------------------------------------------------------------------------------ id shift
def test_shift_ids_keeps_setuid_and_caps_never_follows_symlinks(tmp_path: Path) -> None:
    _require_root()
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    suid = root / "bin" / "su"
    suid.write_bytes(b"#!/bin/sh\n")
    os.chmod(suid, 0o4755)
    os.link(suid, root / "bin" / "su-hardlink")  # shifted once, not twice
    capped = root / "bin" / "ping"
    capped.write_bytes(b"x")
    subprocess.run(["setcap", "cap_net_raw+ep", str(capped)], check=True)
    host_file = tmp_path / "host-file"
    host_file.write_text("host")
    os.symlink(host_file, root / "escape")
    os.lchown(root / "bin", 0, 1000)

    report = images.shift_ids(root, config.ID_BASE)
    assert report.files == 6  # root, bin, su, su-hardlink, ping, escape
    assert os.lstat(root).st_uid == config.ID_BASE
    assert os.lstat(root / "bin").st_gid == config.ID_BASE + 1000
    st = os.stat(suid)
    assert st.st_uid == config.ID_BASE and st.st_mode & stat.S_ISUID
    assert os.lstat(root / "escape").st_uid == config.ID_BASE
    assert os.stat(host_file).st_uid == 0  # the symlink's target is untouched
    assert report.caps == [{"path": str(capped), "restored": True}]
    caps = subprocess.run(["getcap", "-n", str(capped)], capture_output=True, text=True).stdout
    assert "cap_net_raw" in caps and f"rootid={config.ID_BASE}" in caps

    back = images.shift_ids(root, -config.ID_BASE)
    assert os.stat(suid).st_uid == 0 and os.stat(suid).st_mode & stat.S_ISUID and back.files == 6
    os.lchown(root / "escape", 70000, 0)
    with pytest.raises(Unavailable, match="outside 0..65535"):
        images.shift_ids(root, config.ID_BASE)


# ---------------------------------------------------------------------------------- real builds
# Each derived build copies the 1.4 GB default image (cp -a: ~10 CPU-s on this machine, no reflinks on
# ext4), so the checks that need a user image share the few builds below: one image goes through
# its whole life (build, no-op, a rebuild kept then swapped in, users, removal), and the interrupted
# builds share one build that succeeds after them.
def _user_spec(tmp_path: Path, name: str, commands: list[str] | None = None) -> Path:
    src = _hello(tmp_path)
    return _write_spec(tmp_path, {
        "name": name, "base": "default", "packages": ["tree"],
        "files": [{"src": str(src), "dest": "/etc/drums-test/hello.txt", "mode": "0640"}],
        "commands": commands if commands is not None else ["echo from-a-command >/etc/drums-test/cmd.txt"]})


def _assert_ids_in_range(rootfs: Path) -> None:
    low, high = config.ID_BASE, config.ID_BASE + config.ID_COUNT
    bad = [p for p, st in idshift.walk(rootfs) if not (low <= st.st_uid < high and low <= st.st_gid < high)]
    assert not bad, f"{len(bad)} files outside the session's id range, e.g. {bad[:5]}"


def _build_in_background(spec: images.ImageSpec) -> tuple[threading.Thread, list[BaseException]]:
    """``images.build(spec)`` started in a thread; what it raises lands in the returned list."""
    errors: list[BaseException] = []

    def build() -> None:
        try:
            images.build(spec)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    return worker, errors


def _wait_at_command(alive: Callable[[], bool], why_not: Callable[[], object], name: str, what: str) -> None:
    """Wait until the build of ``name`` (running while ``alive()``) has reached a command that touched
    /tmp/at-command."""
    def at_command() -> bool:
        assert alive(), f"{what} ended early: {why_not()}"
        return any((d / "rootfs/tmp/at-command").exists() for d in image_store.stale_builds(name))

    wait_until(at_command, 600, f"{what} to reach its command", every=0.2)


@contextmanager
def _session_overlay(tmp_path: Path, name: str, label: str | None = None) -> Iterator[Path]:
    """An overlay over the image, mounted as a session launcher mounts it (under images.mounting);
    its mount point is named after ``label`` (default: the image), which _cleanup finds."""
    mnt = tmp_path / f"drums-image-test-{label or name}-{secrets.token_hex(2)}"
    for d in ("upper", "work", "merged"):
        (mnt / d).mkdir(parents=True)
    with images.mounting(name) as lower:
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={mnt}/upper,workdir={mnt}/work", str(mnt / "merged")],
                       check=True)
    try:
        yield lower
    finally:
        subprocess.run(["umount", str(mnt / "merged")], check=True)


@contextmanager
def _watching_base_copies(image_name: str) -> Iterator[list[tuple[int, bool]]]:
    """Every ``cp -a`` of a build of ``image_name`` seen while the block runs, as (pid, whether it
    runs in this process's mount namespace)."""
    ours = os.stat("/proc/self/ns/mnt").st_ino
    seen: list[tuple[int, bool]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if argv[:2] == [b"cp", b"-a"] and any(image_name.encode() in a for a in argv):
                        seen.append((int(pid), os.stat(f"/proc/{pid}/ns/mnt").st_ino == ours))
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


@pytest.mark.timeout(1800)
def test_build_user_image_shift_noop_rebuild_users_and_remove(tmp_path: Path, image_name: str,
                                                               default_image: images.Manifest) -> None:
    """One user image through its whole life, in two builds:

    - The build: its manifest, its tree (ids shifted onto the session's range, setuid and file
      capabilities kept, the spec's package, file and commands in), an unchanged spec a no-op
      through the CLI, an image of another id base refused.
    - The copy of a derived image's base mounts nothing, so it gets no mount namespace of its own:
      one would hold a copy of every host mount for the copy's duration (run G: another worker's
      copy held a test's unmounted overlay, and a rebuild was refused as IMAGE_IN_USE).
    - A build step tries to change a host kernel setting, as tracker-miner-fs's maintainer script
      does (``systemd-sysctl 30-tracker.conf`` set the host's ``fs.inotify.max_user_watches`` to
      65,536 under the slots' need): refused, the host unchanged.
    - A rebuild that finishes while a session has started on the image is kept, not swapped in; the
      same build again, once no session uses the image, swaps the kept build in without building.
    - users_of counts a namespace that lives on the image (a session's, pivoted into its overlay),
      also once the host has unmounted the overlay; a copy of the host's table that still holds the
      unmounted overlay (a CRIU restore or a session launch in flight: under the parallel lane one
      made a rebuild fail as IMAGE_IN_USE) is no user. rm (and a forced build) is refused while an
      overlay or a pivoted namespace uses the image, and removes it while only such a copy lives."""
    knob = Path("/proc/sys/fs/inotify/max_queued_events")
    before = knob.read_text()
    spec = images.load_spec(_user_spec(tmp_path, image_name, commands=[
        "echo from-a-command >/etc/drums-test/cmd.txt",
        f"if echo {int(before) + 1} > {knob}; then echo wrote > /sysctl-probe; else echo refused > /sysctl-probe; fi"]))
    lines: list[str] = []
    try:
        with _watching_base_copies(image_name) as copies:
            m = images.build(spec, progress=lines.append)
        after = knob.read_text()
    finally:
        knob.write_text(before)
    assert any("shifting ids" in line for line in lines) and "done in" in lines[-1]
    assert copies, "the copy of the base was never seen running"
    assert all(same for _, same in copies), f"the copy ran in a mount namespace of its own: {copies[:3]}"
    root = images.rootfs_path(image_name)
    probe = (root / "sysctl-probe").read_text().strip()
    assert (probe, after) == ("refused", before), \
        f"a build step changed a host sysctl: {probe}, {before.strip()} -> {after.strip()}"

    # The manifest.
    assert m.name == image_name and m.base == "default" and m.id_base == config.ID_BASE
    assert m.spec == spec.to_json() and m.spec_hash == images.spec_hash(spec)
    assert "tree" in m.packages and "sudo" in m.packages and "libreoffice-calc" in m.packages
    assert m.content_hash == images.content_hash(m.spec_hash, m.packages)
    assert m.size_bytes > default_image.size_bytes // 2 and m.files_count > 10000
    assert "PyAutoGUI" in m.guest_pip
    # File capabilities came through the copy, the unshift and the shift (v3, root id = ID_BASE).
    assert [c["path"] for c in m.file_caps] == [c["path"] for c in default_image.file_caps]
    assert all(c["restored"] for c in m.file_caps)
    assert images.get(image_name) == m
    assert image_name in [i.name for i in images.list_images()]
    assert images.check_usable(image_name) == m

    # Ownership shifted onto the session's id range; setuid survived the chown.
    assert root == config.IMAGE_STORE / image_name / "rootfs"
    assert os.stat(root / "etc/passwd").st_uid == config.ID_BASE
    home = os.stat(root / "home/user")
    assert (home.st_uid, home.st_gid) == (config.ID_BASE + 1000, config.ID_BASE + 1000)
    sudo = os.stat(root / "usr/bin/sudo")
    assert sudo.st_uid == config.ID_BASE and sudo.st_mode & stat.S_ISUID
    hello = root / "etc/drums-test/hello.txt"
    assert hello.read_text() == "hello from the host\n"
    assert stat.S_IMODE(os.stat(hello).st_mode) == 0o640 and os.stat(hello).st_uid == config.ID_BASE
    assert (root / "etc/drums-test/cmd.txt").read_text() == "from-a-command\n"
    assert (root / "usr/bin/tree").is_file()
    _assert_ids_in_range(root)
    assert not image_store.stale_builds(image_name)

    # Unchanged spec: a no-op through the CLI, which says so in JSON.
    inode = os.stat(root).st_ino
    t0 = time.monotonic()
    res = _images_cli("--json", "image", "build", image_name, "--spec", str(tmp_path / "spec.json"))
    noop_seconds = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["built"] is False and doc["image"]["built_at"] == m.built_at and "unchanged" in res.stderr
    assert os.stat(root).st_ino == inode
    assert noop_seconds < 5, f"a no-op rebuild took {noop_seconds:.1f}s"  # a real one takes minutes

    # An image built for another id base is refused.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "ID_BASE", config.ID_BASE + 65536)
        with pytest.raises(FailedPrecondition, match="id base"):
            images.check_usable(image_name)

    spec, m = _rebuild_kept_while_a_session_started_then_swapped_in(tmp_path, image_name, m)
    _users_refusals_and_removal(tmp_path, image_name, spec, m)


def _rebuild_kept_while_a_session_started_then_swapped_in(tmp_path: Path, image_name: str,
                                                          first: images.Manifest
                                                          ) -> tuple[images.ImageSpec, images.Manifest]:
    """A rebuild finished while a session started on the image is kept (the image in use is not
    replaced), then swapped in by the same build once no session uses it; its spec and manifest."""
    # The second build waits in its command until the test has started a "session" on the image.
    spec = images.load_spec(_user_spec(tmp_path, image_name, commands=[
        "touch /tmp/at-command; while [ ! -e /tmp/session-started ]; do sleep 0.2; done"]))
    worker, errors = _build_in_background(spec)
    try:
        _wait_at_command(worker.is_alive, lambda: errors, image_name, "the rebuild")
        with _session_overlay(tmp_path, image_name):
            for d in image_store.stale_builds(image_name):
                (d / "rootfs/tmp/session-started").touch()
            worker.join(timeout=600)
            assert len(errors) == 1 and isinstance(errors[0], FailedPrecondition), errors
            assert "the new build is kept" in str(errors[0])
            assert images.get(image_name) == first  # the image in use was not replaced
            staged = config.IMAGE_STORE / f".staged-{image_name}"
            assert (staged / "manifest.json").is_file() and not image_store.stale_builds(image_name)
        # No session uses it any more: the same build again swaps the kept build in, no rebuild.
        lines: list[str] = []
        m = images.build(spec, progress=lines.append)
        assert any("swapping in the kept build" in line for line in lines), lines
        assert not any("copying image" in line for line in lines), f"the kept build was built again: {lines}"
        assert m.spec_hash == images.spec_hash(spec) != first.spec_hash and images.get(image_name) == m
        assert not staged.exists() and not image_store.stale_builds(image_name)
        return spec, m
    finally:
        for d in image_store.stale_builds(image_name):  # never leave the worker waiting
            (d / "rootfs/tmp").mkdir(parents=True, exist_ok=True)
            (d / "rootfs/tmp/session-started").touch()
        worker.join(timeout=600)


def _users_refusals_and_removal(tmp_path: Path, image_name: str, spec: images.ImageSpec,
                                m: images.Manifest) -> None:
    """rm and a forced build are refused while an overlay uses the image, and rm while a namespace
    pivoted into it lives; an unpivoted copy of the host's table is no user: rm (the CLI) then removes it."""
    root = images.rootfs_path(image_name)
    holders: list[subprocess.Popen] = []
    try:
        with _session_overlay(tmp_path, image_name) as lower:
            assert lower == root
            with pytest.raises(FailedPrecondition, match="mounted by") as info:
                images.remove(image_name)
            assert info.value.reason == "IMAGE_IN_USE"
            with pytest.raises(FailedPrecondition, match="mounted by"):
                images.build(spec, force=True)
            assert images.get(image_name) == m and not image_store.stale_builds(image_name)
            merged = next(p for p in _mount_points(os.getpid()) if f"drums-image-test-{image_name}-" in p)
            for r in ("-", merged):  # one at a time: a holder that fails to start leaves none behind
                holders.append(_namespace_holder(r))
            copy, pivoted = holders
            assert any(merged in p for p in _mount_points(copy.pid)), "the copy does not hold the overlay"
        users = images.users_of(image_name)
        assert users == [f"/ (overlay lower; {pivoted.pid})"], users
        with pytest.raises(FailedPrecondition, match="IMAGE_IN_USE"):
            images.remove(image_name)
        pivoted.kill()
        pivoted.wait()
        assert any(merged in p for p in _mount_points(copy.pid)), "the copy let the overlay go"
        assert images.users_of(image_name) == []
        res = _images_cli("image", "rm", image_name)
        assert res.returncode == 0, res.stderr
        assert not (config.IMAGE_STORE / image_name).exists() and not image_store.stale_builds(image_name)
        with pytest.raises(NotFound):
            images.get(image_name)
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
            proc.stdout.close()


def _leftovers(build_dirs: list[Path]) -> list[str]:
    """Processes whose root, cwd or command line is inside a build dir, and mounts under one."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            where = [os.readlink(f"/proc/{pid}/root"), os.readlink(f"/proc/{pid}/cwd"),
                     Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
        except OSError:
            continue
        if any(str(d) in w for d in build_dirs for w in where):
            found.append(f"pid {pid}: {where}")
    mountinfo = Path("/proc/self/mountinfo").read_text()
    found += [line for line in mountinfo.splitlines() if any(str(d) in line for d in build_dirs)]
    return found


def _build_process(spec_file: Path, err: Path) -> subprocess.Popen:
    """``python -m drums_core.host.images build --spec`` in a process of its own, stderr to ``err``."""
    with open(err, "w") as errf:
        return subprocess.Popen([sys.executable, "-m", "drums_core.host.images", "build", "--spec", str(spec_file)],
                                cwd=CHECKOUT, stderr=errf, stdout=subprocess.DEVNULL, text=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _assert_killed_build_left_no_image(image_name: str, when: str) -> list[Path]:
    """The killed build left its .build-* directory, no image, and (soon) no process or mount."""
    build_dirs = image_store.stale_builds(image_name)
    assert build_dirs, f"the build interrupted at {when} left no .build-* directory (was it killed mid-way?)"
    assert not (config.IMAGE_STORE / image_name).exists()
    with pytest.raises(NotFound):
        images.get(image_name)
    # SIGKILL delivery is asynchronous
    wait_until(lambda: not _leftovers(build_dirs), 10, "the killed build's leftovers to go", every=0.2)
    return build_dirs


@pytest.mark.timeout(1800)
def test_interrupted_builds_leave_no_image_and_the_next_build_succeeds(
        tmp_path: Path, image_name: str, default_image: images.Manifest) -> None:
    """A build SIGKILLed while it copies its base, and one SIGKILLed while a command runs in its
    chroot (with that chroot's mounts), leave no image, no process and no mount: only their build
    directories, which the next build of the name removes; that build succeeds.

    The command of the second runs while a session's overlay of another image (``default``) is
    mounted on the host, then unmounted: a build step runs in a mount namespace whose root is the
    image's own, so the overlay is gone from it. With a chroot the step's namespace kept a copy of
    every host mount: under the parallel lane another worker's apt-get held a test's overlay, and a
    rebuild was refused as IMAGE_IN_USE. (users_of now passes over such unpivoted copies, so this
    reads the step's own mount tables.)"""
    # 1. Killed mid-way through the copy of its base.
    spec_file = _user_spec(tmp_path, image_name, commands=["sleep 600"])
    proc = subprocess.Popen([sys.executable, "-m", "drums_core.host.images", "build", "--spec", str(spec_file)],
                            cwd=CHECKOUT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        seen = []
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "copying image" in line:
                break
        else:
            pytest.fail(f"the build ended before it copied its base: {''.join(seen)}")
        time.sleep(3)  # mid-way: cp copying
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    copy_dirs = _assert_killed_build_left_no_image(image_name, "the copy")

    # 2. Killed while its command runs in the chroot, after an overlay was unmounted under it.
    spec_file = _user_spec(tmp_path, image_name, commands=["touch /tmp/at-command; sleep 600"])
    err = tmp_path / "build.err"
    overlay_dir = f"drums-image-test-{image_name}-"
    proc = None
    try:
        with _session_overlay(tmp_path, config.DEFAULT_IMAGE, label=image_name):
            proc = _build_process(spec_file, err)
            _wait_at_command(lambda: proc.poll() is None, lambda: err.read_text(), image_name, "the build")
            assert any(overlay_dir in u for u in images.users_of(config.DEFAULT_IMAGE)), \
                "the session overlay is not seen as a user"
            step = _namespaces_of_descendants()
            assert step, "the build step runs in no mount namespace of its own"
        held = {pid: point for pid in step for point in _mount_points(pid) if overlay_dir in point}
        assert not held, f"a build step's namespace holds the unmounted overlay: {held}"
        assert proc.poll() is None, f"the build ended early: {err.read_text()}"
    finally:
        if proc is not None:
            _kill(proc)
    command_dirs = _assert_killed_build_left_no_image(image_name, "its command")
    assert not any(d.exists() for d in copy_dirs)  # removed by the second build

    # 3. The next build succeeds.
    spec = images.load_spec(_user_spec(tmp_path, image_name, commands=["true"]))
    m = images.build(spec)
    assert images.get(image_name) == m and (images.rootfs_path(image_name) / "usr/bin/tree").is_file()
    assert not any(d.exists() for d in copy_dirs + command_dirs)


def test_build_of_a_missing_base_says_how_to_build_it(tmp_path: Path, image_name: str) -> None:
    _require_root()
    spec = images.ImageSpec(name=image_name, base="no-such-base")
    with pytest.raises(NotFound, match="drums image build no-such-base --spec FILE"):
        images.build(spec)
    assert not (config.IMAGE_STORE / image_name).exists() and not image_store.stale_builds(image_name)
    assert not list((config.IMAGE_STORE / ".locks").glob(f"{image_name}*"))  # nothing was created


def _namespaces_of_descendants() -> list[int]:
    """One pid per mount namespace, other than ours, among this test process's descendants."""
    ours = procs.mnt_ns("self")
    found: dict[str, int] = {}
    for pid in sorted(procs.descendants(procs.scan_processes(), [os.getpid()])):
        ns = procs.mnt_ns(pid)
        if ns and ns != ours:
            found.setdefault(ns, pid)
    return list(found.values())


def _mount_points(pid: int) -> list[str]:
    try:
        return [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
    except OSError:
        return []


_HOLDER = """
import signal, sys
from drums_core.host import image_root, linux
linux.unshare(linux.CLONE_NEWNS)
linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
if sys.argv[1] != "-":
    image_root.enter(sys.argv[1])
print("in", flush=True)
signal.pause()
"""


def _namespace_holder(root: str) -> subprocess.Popen:
    """A process in a mount namespace of its own, copied from ours: pivoted into ``root`` (a
    mount point), as a session's init is, or left a copy of the host's table (``-``)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, root], cwd=CHECKOUT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    if proc.stdout.readline() != "in\n":
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"the holder of {root} did not start (exit {proc.returncode})")
    return proc


def test_strip_dev_nodes_removes_only_the_images_own_top_level_nodes(tmp_path: Path) -> None:
    """The image's /dev loses its device nodes but the six a session keeps; a /dev that is a mount
    (inside a build's chroot it is the host's /dev) is refused and nothing in it is touched."""
    root = tmp_path / "rootfs"
    (root / "dev" / "pts").mkdir(parents=True)
    for name, dev in (("console", (5, 1)), ("ptmx", (5, 2)), ("null", (1, 3)), ("pts/deep", (5, 1))):
        os.mknod(root / "dev" / name, 0o600 | stat.S_IFCHR, os.makedev(*dev))
    (root / "dev" / "fd").symlink_to("/proc/self/fd")
    assert image_recipe.strip_dev_nodes(root) == 2
    assert sorted(p.name for p in (root / "dev").iterdir()) == ["fd", "null", "pts"]
    assert (root / "dev" / "pts" / "deep").exists()  # never descends

    decoy = tmp_path / "hostdev"
    decoy.mkdir()
    os.mknod(decoy / "vda", 0o600 | stat.S_IFBLK, os.makedev(254, 0))
    target = tmp_path / "bound"
    (target / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(decoy), str(target / "dev")], check=True)
    try:
        with pytest.raises(Internal, match="not a plain directory"):
            image_recipe.strip_dev_nodes(target)
        assert (decoy / "vda").exists()
    finally:
        subprocess.run(["umount", str(target / "dev")], check=True)
