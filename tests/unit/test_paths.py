"""Ownership evidence without root: path components, tags, /proc parsing, mountinfo, entry validation."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from drums_core.host import mounttable, ownedpaths, procs
from drums_core.sweep.ledger import Entry
from drums_core.sweep.parts import Part, parts_of, snapshot_published

from tests.support.wait import wait_until


# ------------------------------------------------------------------ path components
@pytest.mark.parametrize("path,root,expected", [
    ("/x/run1", "/x/run1", True),
    ("/x/run1/a/b", "/x/run1", True),
    ("/x/run10", "/x/run1", False),
    ("/x/run10/a", "/x/run1", False),
    ("/x/run1-old", "/x/run1", False),
    ("/x/run1", "/x/run10", False),
    ("/x/run1/", "/x/run1", True),
    ("/x/run1", "/x/run1/", True),
    ("//x//run1/./a", "/x/run1", True),
    ("/x/run1/../run10", "/x/run1", False),
    ("/x", "/x/run1", False),
    ("relative/run1", "/x/run1", False),
    ("", "/x/run1", False),
])
def test_path_within_by_components(path, root, expected):
    assert ownedpaths.path_within(path, root) is expected


def test_within_any_picks_the_holding_root_only():
    roots = ["/s/sessions/run1", "/s/staging/abc"]
    assert ownedpaths.within_any("/s/sessions/run1/root/tmp", roots) == "/s/sessions/run1"
    assert ownedpaths.within_any("/s/sessions/run10/root", roots) is None
    assert ownedpaths.within_any("/s/staging/abcd", roots) is None
    assert ownedpaths.within_any(None, roots) is None


@pytest.mark.parametrize("arg,expected", [
    ("/x/run1/images", ["/x/run1/images"]),
    ("--root=/x/run1/root", ["/x/run1/root"]),
    ("lowerdir=/a/l1:/a/l2,upperdir=/x/run1/upper,workdir=/x/run1/work",
     ["/a/l1", "/a/l2", "/x/run1/upper", "/x/run1/work"]),
    ("swrk", []),
    ("3", []),
    ("--tag", []),
    ("drums:run1", []),
])
def test_arg_paths(arg, expected):
    assert ownedpaths.arg_paths(arg) == expected


def test_criu_swrk_cmdline_names_no_path():
    argv = ["/opt/drums/criu/usr/sbin/criu", "swrk", "3"]
    assert [p for a in argv[1:] for p in ownedpaths.arg_paths(a)] == []


@pytest.mark.parametrize("bad", ["/", "/tmp", "/run", "/run/drums", "/var/tmp", "/tmp/.X11-unix", "/x",
                                 "relative/dir", "/x/../etc", "/x/./y", "/x//y", "/x/y/", "", "/x/y\0z"])
def test_check_owned_path_refuses_broad_or_unnormalised(bad):
    with pytest.raises(ValueError):
        ownedpaths.check_owned_path(bad)


@pytest.mark.parametrize("good", ["/run/drums/default/sessions/abc", "/tmp/.criu.mntns.Ab12", "/x/run1",
                                  "/tmp/.X11-unix/X103", "/run/drums/default"])
def test_check_owned_path_accepts(good):
    assert ownedpaths.check_owned_path(good) == good


def test_clean_link_target():
    assert ownedpaths.clean_link_target("/x/run1/log (deleted)") == "/x/run1/log"
    assert ownedpaths.clean_link_target("socket:[1234]") is None
    assert ownedpaths.clean_link_target("anon_inode:[eventfd]") is None
    assert ownedpaths.clean_link_target(None) is None


# ------------------------------------------------------------------ tags
def test_tag_exact_element_match():
    argv = ["python", "-m", "drums_core.session.init", "--tag", "drums:run1", "--session", "s"]
    assert procs.has_tag(argv, "drums:run1")
    assert not procs.has_tag(argv, "drums:run")
    assert not procs.has_tag(argv, "drums:run10")
    assert not procs.has_tag(["x", "--tag", "drums:run10"], "drums:run1")
    assert procs.has_tag(["x", "--tag=drums:run1"], "drums:run1")


def test_tag_must_follow_the_flag():
    assert not procs.has_tag(["echo", "drums:run1"], "drums:run1")
    assert not procs.has_tag(["echo", "--tag drums:run1"], "drums:run1")
    assert not procs.has_tag(["sh", "-c", "sleep 1 --tag drums:run1"], "drums:run1")
    assert not procs.has_tag(["x", "--tag"], "drums:run1")
    assert procs.tags_of(["a", "--tag", "drums:r", "--tag", "other"]) == ["drums:r", "other"]


def test_run_tag():
    assert procs.run_tag("default-abc") == "drums:default-abc"


# ------------------------------------------------------------------ /proc parsing
def test_parse_stat_with_hostile_comm():
    fields = " ".join(["S", "77"] + [str(i) for i in range(5, 22)] + ["123456"] + ["0"] * 30)
    st = procs.parse_stat(f"4242 (a) (b c) {fields}")
    assert (st.pid, st.comm, st.state, st.ppid, st.starttime) == (4242, "a) (b c", "S", 77, 123456)
    assert not st.zombie
    assert procs.parse_stat(f"1 (x) Z 0 {' '.join(['0'] * 17)} 9 0").zombie


def test_starttime_of_self_is_field_22():
    raw = open("/proc/self/stat").read()
    expected = int(raw[raw.rindex(")") + 2:].split()[19])
    # /proc/self is the reader itself; compare with our pid.
    assert procs.starttime(os.getpid()) == expected
    assert procs.starttime(10**9) is None


def test_zombie_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = procs.starttime(child.pid)
        assert procs.is_alive(child.pid, start)
        assert not procs.is_alive(child.pid, start + 1)
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: procs.read_stat(child.pid).state == "Z", 5, "the killed child to be a zombie", every=0.01)
        assert procs.read_stat(child.pid).zombie  # not reaped yet: still in /proc
        assert not procs.is_alive(child.pid, start)
        assert procs.open_handle(child.pid, start) is None
    finally:
        child.kill()
        child.wait()
    assert not procs.is_alive(child.pid)


def test_handle_refuses_a_reused_pid():
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = procs.starttime(child.pid)
        assert procs.open_handle(child.pid, start + 7) is None
        h = procs.open_handle(child.pid, start)
        assert h is not None
        assert procs.send_signal(h, signal.SIGKILL)
        assert procs.wait_dead([h], 5) == []
        h.close()
    finally:
        child.kill()
        child.wait()


def test_read_cmdline_and_scan():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--tag", "drums:paths-unit"])
    try:
        wait_until(lambda: procs.read_cmdline(child.pid)[-1:] == ["drums:paths-unit"], 5, "the child's tag",
                   every=0.01)
        assert procs.read_cmdline(child.pid)[-2:] == ["--tag", "drums:paths-unit"]
        found = procs.find_tagged("drums:paths-unit")
        assert [p.pid for p in found] == [child.pid]
        table = procs.scan_processes()
        assert child.pid in procs.descendants(table, [os.getpid()])
        assert os.getpid() in procs.ancestors(table, child.pid)
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------ mountinfo
OVERLAY_OPTS = "rw,lowerdir=/l/a:/l/b,upperdir=/x/run1/upper,workdir=/x/run1/work"
MOUNTINFO = f"""\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
100 27 0:50 / /x/run1 rw,relatime - tmpfs drums rw,size=4k
101 100 0:51 / /x/run1/root rw,relatime master:7 - overlay overlay {OVERLAY_OPTS}
102 27 0:52 / /x/run10 rw - tmpfs decoy rw
103 100 0:53 / /x/run1/with\\040space rw - tmpfs t rw
104 100 0:54 / /x/run1/gone//deleted rw - tmpfs t rw
"""


def test_parse_mountinfo_fields_and_escapes():
    ms = mounttable.parse_mountinfo(MOUNTINFO)
    by_id = {m.mount_id: m for m in ms}
    assert by_id[103].mountpoint == "/x/run1/with space"
    assert by_id[104].mountpoint == "/x/run1/gone" and by_id[104].deleted
    assert by_id[27].shared_groups == {1}
    assert by_id[101].peer_groups == {7}
    assert by_id[101].referenced_paths() == ["/x/run1/root", "/l/a", "/l/b", "/x/run1/upper", "/x/run1/work"]
    assert by_id[100].referenced_paths() == ["/x/run1"]


def test_mounts_within_deepest_first_and_no_prefix_collision():
    ms = mounttable.parse_mountinfo(MOUNTINFO)
    hits = mounttable.mounts_within(ms, ["/x/run1"])
    assert [m.mount_id for m in hits][-1] == 100
    assert {m.mount_id for m in hits} == {100, 101, 103, 104}
    assert 102 not in {m.mount_id for m in hits}
    depths = [m.depth for m in hits]
    assert depths == sorted(depths, reverse=True)


def test_parse_mountinfo_rejects_garbage():
    with pytest.raises(ValueError):
        mounttable.parse_mountinfo("this is not mountinfo\n")


def test_read_own_mountinfo():
    ms = mounttable.read_mountinfo()
    assert any(m.mountpoint == "/" for m in ms)


def test_split_superopts_respects_escapes():
    assert mounttable.split_superopts(r"rw,lowerdir=/a\,b:/c,upperdir=/u") == \
        ["rw", r"lowerdir=/a\,b:/c", "upperdir=/u"]


# ------------------------------------------------------------------ what entries hold
def _e(kind, key, **data):
    return Entry(kind=kind, key=key, data=data, created=0.0)


def test_parts_of_each_kind(tmp_path):
    assert parts_of(_e("process", "s1", pid=1234, starttime=99)) == [Part("proc", (1234, 99))]
    assert parts_of(_e("mount", "/x/run1/root")) == [Part("mount", ("/x/run1/root",))]
    assert parts_of(_e("dir", "/x/run1")) == [Part("dir", ("/x/run1",))]
    assert parts_of(_e("link", "dvh3")) == [Part("link", ("dvh3", None))]
    assert parts_of(_e("link", "dvh3", ifindex=12)) == [Part("link", ("dvh3", 12))]
    assert parts_of(_e("nft", "inet/drums_r1", family="inet", name="drums_r1")) == [Part("nft", ("inet", "drums_r1"))]
    assert parts_of(_e("nft", "ip/drums_r2")) == [Part("nft", ("ip", "drums_r2"))]
    assert parts_of(_e("x11link", "/tmp/.X11-unix/X103")) == [Part("x11", ("/tmp/.X11-unix/X103", None))]
    assert parts_of(_e("op", "checkpoint/abc", phase="staging")) == []
    s = parts_of(_e("session", "s1", root="/x/run1/root", dir="/x/run1", ifname="dvh1", init_pid=55, starttime=7))
    assert s == [Part("proc", (55, 7)), Part("mount", ("/x/run1/root",)), Part("dir", ("/x/run1",)),
                 Part("link", ("dvh1", None))]
    # a session recorded before its init started holds no process yet
    assert [p.kind for p in parts_of(_e("session", "s2", dir="/x/run2", init_pid=None, starttime=None))] == ["dir"]


def test_parts_of_snapshot_published_is_not_the_runs(tmp_path):
    staged = tmp_path / "staging" / "snap1"
    staged.mkdir(parents=True)
    assert parts_of(_e("snapshot", "snap1", dir=str(staged))) == [Part("dir", (str(staged),))]
    (staged / "manifest.json").write_text("{}")
    assert snapshot_published(str(staged))
    assert parts_of(_e("snapshot", "snap1", dir=str(staged))) == []


@pytest.mark.parametrize("entry", [
    _e("process", "p", pid=1, starttime=5),
    _e("process", "p", pid="12", starttime=5),
    _e("process", "p", pid=12),
    _e("mount", "/"),
    _e("mount", "/tmp"),
    _e("dir", "/x/run1/../../etc"),
    _e("dir", "relative"),
    _e("link", "eth0"),
    _e("link", "dvh0; rm -rf /"),
    _e("nft", "inet/filter", family="inet", name="filter"),
    _e("nft", "x/drums_a", family="bogus", name="drums_a"),
    _e("x11link", "/tmp"),
    _e("session", "s", dir="/"),
])
def test_parts_of_refuses_what_must_not_be_touched(entry):
    with pytest.raises(ValueError):
        parts_of(entry)
