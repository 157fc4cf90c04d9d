"""``drums_core.host.hoststate.instance_leaks`` finds each kind of resource an instance can leave, and
only that instance's: real tagged processes, a tmpfs mount, a link, nftables tables, an X11 link, a
cgroup and a held host setting (a ``nat`` upstream's shared record), next to decoys of a
neighbouring instance whose name starts with this one's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from drums_core.session import cgroups

from drums_core.host import hostnet
from drums_core.config import Instance, display_number, host_ifname, nft_table_name
from drums_core.host.hoststate import X11_DIR, instance_leaks
from drums_core.host.procs import run_tag

from tests.support.suite import SPARE_SLOTS, require_root

EMPTY = {"processes": [], "mounts": [], "links": [], "nft": [], "x11links": [], "cgroups": [], "hostnet": [],
         "probe_errors": []}


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True)


def test_instance_leaks_sees_each_kind_and_only_its_own(tmp_path: Path) -> None:
    require_root()
    inst = Instance(name=f"hoststate-{os.getpid()}", slot_base=SPARE_SLOTS[14], slot_count=1)
    neighbour = Instance(name=f"{inst.name}-nb", slot_base=SPARE_SLOTS[15], slot_count=1)
    long = Instance(name=f"hoststate-{os.getpid()}-" + "l" * 40, slot_base=SPARE_SLOTS[15], slot_count=1)
    assert instance_leaks(inst) == EMPTY and instance_leaks(neighbour) == EMPTY

    run, other_run = f"{inst.name}-{uuid.uuid4().hex[:12]}", f"{neighbour.name}-{uuid.uuid4().hex[:12]}"
    long_run = f"{long.name}-{uuid.uuid4().hex[:12]}"
    table, other_table, long_table = nft_table_name(run), nft_table_name(other_run), nft_table_name(long_run)
    assert len(long_table) == 60 and len(table) < 60   # the long instance's names are cut
    link, other_link = host_ifname(inst.slot_base), host_ifname(neighbour.slot_base)
    x11 = Path(X11_DIR) / f"X{display_number(inst.slot_base)}"
    record = hostnet.hostnet_dir() / f"forwarding-hoststate{os.getpid()}.json"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)", "--tag"]
    procs = []
    driver = cgroups.detect()
    groups = [driver.plan(run, "s1"), driver.plan(other_run, "s1")]
    try:
        for g in groups:
            driver.create(g.run, g.session, cgroups.Limits(memory_max=64 << 20))
        procs = [subprocess.Popen(sleeper + [run_tag(run)]), subprocess.Popen(sleeper + [run_tag(other_run)])]
        inst.state_dir.mkdir(parents=True)
        _run("mount", "-t", "tmpfs", "-o", "size=1m", "hoststate-test", str(inst.state_dir))
        for name in (link, other_link):   # a veth pair, as a session's link is (its peer is dvp*)
            _run("ip", "link", "add", name, "type", "veth", "peer", "name", "dvp" + name[3:])
        for name in (table, other_table, long_table):
            _run("nft", "add", "table", "inet", name)
        Path(X11_DIR).mkdir(mode=0o1777, exist_ok=True)
        os.symlink("/nonexistent-drums-test", x11)
        # a shared record of a host setting (drums_core.host.hostnet) that one of its runs still holds
        hostnet.hostnet_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        record.write_text(json.dumps({"ifname": link, "ifindex": None, "prior": "0",
                                      "holders": {run: str(inst.ledger_root)}}))

        leaks = instance_leaks(inst)
        assert leaks["processes"] == [[procs[0].pid, run_tag(run)]]
        assert leaks["mounts"] == [str(inst.state_dir)]
        assert leaks["links"] == [link]
        assert leaks["nft"] == [table]
        assert leaks["x11links"] == [x11.name]
        assert leaks["cgroups"] == groups[0].paths
        assert len(leaks["hostnet"]) == 1 and link in leaks["hostnet"][0] and run in leaks["hostnet"][0]
        assert leaks["probe_errors"] == []

        theirs = instance_leaks(neighbour)
        assert theirs["processes"] == [[procs[1].pid, run_tag(other_run)]]
        assert theirs["links"] == [other_link] and theirs["nft"] == [other_table]
        assert theirs["mounts"] == [] and theirs["x11links"] == []
        assert theirs["cgroups"] == groups[1].paths
        assert theirs["hostnet"] == []
        assert instance_leaks(long)["nft"] == [long_table]   # a table name cut at 60 is still found
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for g in groups:
            g.remove()
        if x11.is_symlink():
            x11.unlink()
        record.unlink(missing_ok=True)
        for name in (table, other_table, long_table):
            subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True)
        for name in (link, other_link):   # deleting one end deletes its peer
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        subprocess.run(["umount", str(inst.state_dir)], capture_output=True)
        if inst.state_dir.exists():
            inst.state_dir.rmdir()
    assert instance_leaks(inst) == EMPTY and instance_leaks(neighbour) == EMPTY
    assert instance_leaks(long) == EMPTY
