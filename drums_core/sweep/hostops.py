"""The sweep's actions on the host that are not files: kill pinned processes, list and delete
``dvh*`` links and nftables tables; plus the fault windows (``DRUMS_FAULT_AT``). Kept small so tests
can replace them (``monkeypatch.setattr(hostops, "kill_processes", ...)``)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from typing import Any

from ..host import procs

MAX_PASSES = 5
KILL_TIMEOUT = 5.0
FAULT_WINDOWS = ("sweep-after-kill", "sweep-after-unmount", "sweep-before-cgroup-remove",
                 "sweep-after-cgroup-remove", "sweep-after-links")


def collect_into(errs: list[str]):
    def onerror(_fn: Any, path: str, exc_info: Any) -> None:
        errs.append(f"{path}: {exc_info[1]}")
    return onerror


def fault(window: str) -> None:
    if os.environ.get("DRUMS_FAULT_AT") == window:
        os.kill(os.getpid(), signal.SIGKILL)



def link_index(ifname: str) -> int | None:
    """ifindex of ``ifname`` in the host namespace, or None."""
    try:
        with open(f"/sys/class/net/{ifname}/ifindex") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def delete_link(ifname: str, ifindex: int) -> bool:
    """Delete the link by index; False if it was already gone."""
    try:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError
    except ImportError:
        out = subprocess.run(["ip", "link", "delete", "dev", ifname], capture_output=True, text=True, timeout=15)
        if out.returncode != 0 and link_index(ifname) is not None:
            raise OSError(errno.EIO, f"ip link delete {ifname}: {out.stderr.strip()}") from None
        return out.returncode == 0
    with IPRoute() as ipr:
        try:
            ipr.link("del", index=ifindex)
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:
                return False
            raise OSError(exc.code, f"delete link {ifname}: {exc}") from exc
    return True


def nft_tables() -> set[tuple[str, str]]:
    """(family, name) of every nftables table. Raises OSError when nft cannot list them."""
    try:
        out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(errno.EIO, f"nft list tables: {exc}") from exc
    if out.returncode != 0:
        raise OSError(errno.EIO, f"nft list tables: {out.stderr.strip()}")
    try:
        items = json.loads(out.stdout or "{}").get("nftables", [])
    except ValueError as exc:
        raise OSError(errno.EIO, f"nft list tables: bad JSON: {exc}") from exc
    return {(i["table"]["family"], i["table"]["name"]) for i in items if "table" in i}


def nft_delete(family: str, name: str) -> None:
    out = subprocess.run(["nft", "delete", "table", family, name], capture_output=True, text=True, timeout=15)
    if out.returncode != 0 and (family, name) in nft_tables():
        raise OSError(errno.EIO, f"nft delete table {family} {name}: {out.stderr.strip()}")


def kill_processes(handles: list[procs.Handle], timeout: float) -> list[procs.Handle]:
    """SIGKILL every pinned process and wait; return those still alive after ``timeout``."""
    for h in handles:
        procs.send_signal(h, signal.SIGKILL)
    return procs.wait_dead(handles, timeout)
