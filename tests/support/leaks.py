"""What Drums could have left on this host: per instance, per test process, per run."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from drums_core.config import STATE_ROOT, X11_DIR, Instance, display_number, host_ifname


def host_leaks(state_dir: Path | None = None) -> dict:
    """What Drums could have left on this host: tagged processes, mounts, links, tables, X links."""
    from drums_core.host.procs import scan_processes

    procs = [(p.pid, tag) for p in scan_processes().values() if not p.zombie
             for tag in p.tags if tag.startswith("drums:")]
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point.startswith(str(STATE_ROOT) + "/") or point.startswith("/tmp/.criu."):
                if state_dir is None or point.startswith(str(state_dir)):
                    mounts.append(point)
    links = [ln.split(":")[1].strip().split("@")[0] for ln in
             subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
             if ln.split(":")[1].strip().startswith("dvh") and not ln.split(":")[1].strip().startswith("dvhdoc")]
    tables = [ln for ln in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.splitlines()
              if " drums" in ln]
    xlinks = [p.name for p in X11_DIR.glob("X*") if p.is_symlink()] if X11_DIR.exists() else []
    return {"processes": procs, "mounts": mounts, "links": links, "nft": tables, "x11links": xlinks}


def no_leaks(report: dict) -> bool:
    return not any(report.values())


def instance_links(instance: Instance) -> list[str]:
    """The session links of this instance's slot range that exist on the host."""
    mine = {host_ifname(s) for s in range(instance.slot_base, instance.slot_base + instance.slot_count)}
    return [ln for ln in host_leaks()["links"] if ln in mine]


def _token(pid: int) -> re.Pattern:
    # the suite names every instance it starts with its process's pid (pytest-<pid>, clipurge-<pid>,
    # fw<pid>-03, ...); runs are <instance>-<12 hex>, nft tables drums_<run> with '-' as '_'
    return re.compile(rf"(?<![0-9a-f]){pid}(?![0-9a-f])")


def state_files(pids: Iterable[int]) -> list[str]:
    """What the instances of these test processes left in the state root (files, directories)."""
    if not STATE_ROOT.is_dir():
        return []
    tokens = [_token(p) for p in pids]
    return sorted(p.name for p in STATE_ROOT.iterdir() if any(t.search(p.name) for t in tokens))


def run_leaks(pids: Iterable[int], slots: Iterable[int]) -> dict:
    """Everything on the host that the test processes ``pids`` left: processes of their instances'
    runs, mounts, nftables tables and state-root files naming one of the pids, and links and X11
    links of their slots. Other daemons on the host (not of this run) do not count."""
    pids = list(pids)
    slots = set(slots)
    tokens = [_token(p) for p in pids]
    ours = lambda text: any(t.search(text) for t in tokens)  # noqa: E731
    found = host_leaks()
    return {"processes": [(pid, tag) for pid, tag in found["processes"] if ours(tag.split(":", 1)[1])],
            "mounts": [m for m in found["mounts"] if m.startswith(str(STATE_ROOT) + "/") and ours(m)],
            "links": [ln for ln in found["links"] if ln in {host_ifname(s) for s in slots}],
            "nft": [t for t in found["nft"] if ours(t)],
            "x11links": [x for x in found["x11links"] if x in {f"X{display_number(s)}" for s in slots}],
            "state_files": state_files(pids)}
