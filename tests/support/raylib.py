"""Helpers of the Ray rollout-farm tests (tests/ray/conftest.py has the fixtures)."""
from __future__ import annotations

import os

import pytest

from . import REPO

TASK = REPO / "tasks" / "os" / "drums-os-make-executable.json"


def require_ray():
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"Ray is not installed ({exc}): pip install 'drums[ray]' (scripts/provision installs the extra)")
    return ray


def node_leftovers(instance) -> dict:
    """What of ``instance``'s sessions is on the host.

    Processes by the run tag, or whose mount namespace's root is an overlay under the state
    directory (a restored sibling carries the tag of the run that made the checkpoint, possibly
    another instance's); mounts under the state directory (not the state tmpfs itself); links,
    nftables tables and X11 links of its slots; cgroups of its runs; the ledgers of its runs."""
    from drums_core.host.hoststate import instance_leaks

    from drums_core.host import mounttable, ownedpaths, procs

    rep = instance_leaks(instance)
    state = os.path.realpath(instance.state_dir)
    own_ns = procs.mnt_ns("self")
    verdict: dict[str, bool] = {}
    rooted = []
    for pid, p in procs.scan_processes().items():
        ns = procs.mnt_ns(pid)
        if p.zombie or not ns or ns == own_ns:
            continue
        if ns not in verdict:  # a session's namespace: its "/" is an overlay under the state directory
            try:
                roots = [m for m in mounttable.read_mountinfo(pid) if m.mountpoint == "/"]
            except (OSError, ValueError):
                continue
            verdict[ns] = any(ownedpaths.within_any(ref, [state]) for m in roots for ref in m.referenced_paths()[1:])
        if verdict[ns]:
            rooted.append((pid, p.describe()))
    runs = sorted(p.name for p in instance.ledger_root.iterdir()) if instance.ledger_root.exists() else []
    return {"processes": rep["processes"] + rooted, "mounts": [m for m in rep["mounts"] if m != state],
            "links": rep["links"], "nft": rep["nft"], "x11links": rep["x11links"], "cgroups": rep["cgroups"],
            "ledger_runs": runs,
            "probe_errors": rep["probe_errors"]}
