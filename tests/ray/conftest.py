"""Fixtures for the Ray rollout-farm tests: a local Ray cluster of two logical nodes, each with its
own Drums daemon instance on this machine.

Nodes ``a`` (the head) and ``b`` (a worker node) serve instances ``pytest-<pid>-ra`` and
``pytest-<pid>-rb``: own state tmpfs, socket, nftables table and two slots each, taken from this
run's spare slots (``SPARE_SLOTS[8:12]``; the suite's daemon keeps running on its own range, and
the other tests that borrow spare slots do not run while this module's daemons are up). Ray runs
on 127.0.0.1 only, without dashboard or usage stats, and is shut down at the end of the module;
then both daemons are stopped, their ledgers swept and state unmounted, and nothing of either
instance may be left on the host.

Ray is an optional extra (``drums[ray]``); scripts/provision installs it. Without it these tests
fail with the reason, they do not skip.
"""
from __future__ import annotations

import subprocess

import pytest

from tests.support.raylib import require_ray


def _ray_processes(session_dir: str | None) -> list[str]:
    if not session_dir:
        return []
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln.strip()[:200] for ln in out.splitlines() if session_dir in ln]


@pytest.fixture(scope="module")
def ray_cluster():
    """(LocalCluster, DrumsPool, {"a": Instance, "b": Instance}) for the module."""
    from drums_core.host.hoststate import instance_leaks
    from tests.support.suite import INSTANCE, SPARE_SLOTS, SUITE_DAEMON_ENV, require_root, stop_instance

    require_root()
    require_ray()
    from drums_core.config import Instance
    from drums_osworld.farm.local import LocalCluster
    from drums_osworld.farm.pool import DrumsPool

    insts = {"a": Instance(name=f"{INSTANCE.name}-ra", slot_base=SPARE_SLOTS[8], slot_count=2),
             "b": Instance(name=f"{INSTANCE.name}-rb", slot_base=SPARE_SLOTS[10], slot_count=2)}
    for inst in insts.values():
        stop_instance(inst)  # a previous run of this pid's instances that died
    lc = LocalCluster(nodes=2)
    pool = None
    session_dir = None
    try:
        lc.start()
        session_dir = lc.cluster.head_node.get_session_dir_path()
        pool = DrumsPool(lc.node_configs([insts["a"], insts["b"]], daemon_env=SUITE_DAEMON_ENV))
        yield lc, pool, insts
    finally:
        try:
            if pool is not None:
                pool.close(destroy_sessions=True)
        finally:
            lc.shutdown()
            reports = {name: stop_instance(inst) for name, inst in insts.items()}
    left = _ray_processes(session_dir)
    assert not left, f"Ray processes of the test cluster still running: {left}"
    from drums_core.store.transfer import SPOOL_ROOT

    spools = [str(SPOOL_ROOT / inst.name) for inst in insts.values() if (SPOOL_ROOT / inst.name).exists()]
    assert not spools, f"transfer spools left behind: {spools}"
    for name, inst in insts.items():
        leaked = instance_leaks(inst)
        assert not any(leaked.values()), f"node {name} ({inst.name}) left resources: {leaked}; sweep {reports[name]}"
