"""Shipping a snapshot chain between two daemons' stores (drums_core.store.transfer), without Ray.

Two daemon instances on this machine (``pytest-<pid>-ta`` and ``-tb``, two spare slots each).
On ``ta``: the task's post-setup checkpoint (the parent), one sibling of it that writes a marker
file, checkpointed again (the child: its layers are its own and the parent's). The bundle of the
child carries both (or the child alone when the receiver has the parent); the receiver verifies
the sha256 before touching its store, rewrites the layer paths, and restores the child with the
marker file in place. A corrupt, inconsistent or hostile bundle changes nothing in the store.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.support.raylib import TASK

from drums_core.config import ID_BASE

pytestmark = pytest.mark.timeout(600)

MARKER = "/home/user/child-marker.txt"


@pytest.fixture(scope="module")
def daemons():
    from drums_core.client import Client
    from drums_core.config import Instance
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import INSTANCE, SPARE_SLOTS, SUITE_DAEMON_ENV, require_root, stop_instance

    require_root()
    insts = {"a": Instance(name=f"{INSTANCE.name}-ta", slot_base=SPARE_SLOTS[8], slot_count=2),
             "b": Instance(name=f"{INSTANCE.name}-tb", slot_base=SPARE_SLOTS[10], slot_count=2)}
    for inst in insts.values():
        stop_instance(inst)
    try:
        clients = {k: Client(v, daemon_env=SUITE_DAEMON_ENV) for k, v in insts.items()}
        for c in clients.values():
            c.ping()
        yield insts, clients
    finally:
        reports = {k: stop_instance(v) for k, v in insts.items()}
    for k, inst in insts.items():
        leaked = instance_leaks(inst)
        assert not any(leaked.values()), f"{inst.name} left resources: {leaked}; sweep {reports[k]}"


@pytest.fixture(scope="module")
def chain(daemons):
    """(parent, child) snapshot records on daemon a."""
    from drums_osworld.desktop import Desktop
    from drums_osworld.evaluation import run_task_setup

    _, clients = daemons
    ca = clients["a"]
    d = Desktop.boot(ca)
    run_task_setup(TASK, d.guest)
    parent = d.checkpoint(name="transfer-parent", leave_running=False)
    sib = Desktop.restore(ca, parent["id"])[0]
    sib.guest.execute(f"echo child > {MARKER}", shell=True)
    child = sib.checkpoint(name="transfer-child", leave_running=False)
    yield parent, child
    for c in clients.values():
        for sid in (child["id"], parent["id"]):
            try:
                c.delete_snapshot(sid)
            except Exception:  # noqa: BLE001 - absent on that daemon
                pass


def _stores(daemons):
    from drums_core.store.snapshots import SnapshotStore

    insts, _ = daemons
    return SnapshotStore(insts["a"].snapshots_dir), SnapshotStore(insts["b"].snapshots_dir)


def _listing(store) -> dict:
    return {"snapshots": sorted((s.id, s.state) for s in store.list()),
            "staging": sorted(p.name for p in store.staging_root.iterdir())}


@pytest.fixture
def spool():
    with tempfile.TemporaryDirectory(prefix="drums-transfer-test-", dir="/var/tmp") as d:
        yield Path(d)


def test_chain_ships_with_its_parent_and_restores_there(daemons, chain, spool):
    from drums_core.store.transfer import IMPORTED, import_snapshot, pack, sha256_file, snapshot_chain
    from drums_osworld.desktop import Desktop

    insts, clients = daemons
    parent, child = chain
    sa, sb = _stores(daemons)
    assert child["layers"] == [str(sa.path(child["id"]) / "layer"), str(sa.path(parent["id"]) / "layer")]
    assert [s.id for s in snapshot_chain(sa, child["id"])] == [parent["id"], child["id"]]
    b = pack(sa, child["id"], spool / "chain.tar")
    assert b.sent == [parent["id"], child["id"]] and b.sha256 == sha256_file(b.path)
    assert oct(os.stat(b.path).st_mode & 0o777) == "0o600"
    res = import_snapshot(sb, b.path, b.sha256)
    print(json.dumps({k: v for k, v in res.items() if k != "snapshot"}, indent=1))
    assert res["verified"] and res["sha256"] == b.sha256
    assert res["imported"] == [parent["id"], child["id"]] and res["present"] == []
    got = clients["b"].snapshot(child["id"])
    assert got["state"] == "committed"
    assert got["layers"] == [str(sb.path(child["id"]) / "layer"), str(sb.path(parent["id"]) / "layer")]
    prov = json.loads((sb.path(child["id"]) / IMPORTED).read_text())
    assert prov["sha256"] == b.sha256 and prov["source_layers"] == child["layers"]
    # overlay's marks survive (the parent's setup made ~/scripts in the upper: an opaque or
    # origin-marked directory), and so do the session user's files
    layer = sb.path(parent["id"]) / "layer" / "home/user/scripts"
    assert os.listxattr(layer), "overlay xattrs were lost in transit"
    assert (layer / "backup.sh").stat().st_uid == ID_BASE + 1000  # the session user, on the host
    # the child restores on b with its own change and its parent's setup in place
    d = Desktop.restore(clients["b"], child["id"])[0]
    try:
        assert clients["b"].wait_live(d.id)["liveness"] == "ok"
        out = d.guest.execute(f"cat {MARKER}; ls -l ~/scripts/backup.sh", shell=True)
        assert "child" in out.output and "backup.sh" in out.output, out
    finally:
        d.close()
    # importing the same bundle again changes nothing
    again = import_snapshot(sb, b.path, b.sha256)
    assert again["imported"] == [] and again["present"] == [parent["id"], child["id"]]


def test_skip_what_the_receiver_has_and_refuse_a_missing_parent(daemons, chain, spool):
    from drums_core.errors import FailedPrecondition
    from drums_core.store.transfer import import_snapshot, pack

    _, clients = daemons
    parent, child = chain
    sa, sb = _stores(daemons)
    full = pack(sa, child["id"], spool / "full.tar")
    if not sb.path(parent["id"]).exists():  # b holds the parent, not the child
        import_snapshot(sb, full.path, full.sha256)
    if sb.path(child["id"]).exists():
        clients["b"].delete_snapshot(child["id"])
    small = pack(sa, child["id"], spool / "small.tar", skip=[parent["id"]])
    assert small.sent == [child["id"]] and small.bytes < full.bytes
    res = import_snapshot(sb, small.path, small.sha256)
    assert res["imported"] == [child["id"]] and res["present"] == [parent["id"]]
    # a receiver without the parent refuses the child alone, and keeps nothing of it
    clients["b"].delete_snapshot(child["id"])
    clients["b"].delete_snapshot(parent["id"])
    before = _listing(sb)
    with pytest.raises(FailedPrecondition) as exc:
        import_snapshot(sb, small.path, small.sha256)
    assert exc.value.reason == "PARENT_MISSING"
    assert _listing(sb) == before


def test_corrupt_or_hostile_bundles_change_nothing(daemons, chain, spool):
    from drums_core.errors import Internal, InvalidArgument, Unavailable
    from drums_core.store.transfer import BUNDLE_MANIFEST, dispatch, import_snapshot, pack, sha256_file

    _, clients = daemons
    parent, child = chain
    sa, sb = _stores(daemons)
    for sid in (child["id"], parent["id"]):
        if sb.path(sid).exists():
            clients["b"].delete_snapshot(sid)
    before = _listing(sb)
    b = pack(sa, parent["id"], spool / "p.tar")
    # one flipped byte in the middle of the stream (inside the images)
    bad = spool / "bad.tar"
    data = bytearray(Path(b.path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(Unavailable) as exc:
        import_snapshot(sb, bad, b.sha256)
    assert exc.value.reason == "CHECKSUM_MISMATCH"
    assert exc.value.detail["actual"] == sha256_file(bad)
    assert _listing(sb) == before
    # a member outside the snapshots the bundle declares (sha256 right: the sender is hostile)
    hostile = spool / "hostile.tar"
    with tarfile.open(hostile, "w", format=tarfile.PAX_FORMAT) as tf:
        manifest = json.dumps({"format": 1, "top": parent["id"], "chain": [parent["id"]],
                               "sent": [parent["id"]]}).encode()
        for name, payload in ((BUNDLE_MANIFEST, manifest), ("../escape.txt", b"x"),
                              (f"{parent['id']}/manifest.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    with pytest.raises(Internal) as exc:
        import_snapshot(sb, hostile, sha256_file(hostile))
    assert exc.value.reason == "BUNDLE_CORRUPT"
    assert _listing(sb) == before and not Path("/var/tmp/escape.txt").exists()
    # the daemon operation's argument checks
    for args in ({"path": "relative.tar", "sha256": b.sha256}, {"path": b.path, "sha256": "abc"},
                 {"path": "/var/tmp/../etc/x.tar", "sha256": b.sha256}):
        with pytest.raises(InvalidArgument):
            dispatch(sb, "import_snapshot", args)
    assert _listing(sb) == before
