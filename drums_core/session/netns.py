"""Session networking: one veth pair per session, a link-local /30 per slot, one nftables table per run.

Links and addresses go through pyroute2; the nftables table through ``nft`` (pyroute2's nftables
support does not cover rule building). The inner side of a namespace is reached through
``/proc/<pid>/ns/net`` with ``flags=0`` so a probe never creates a namespace.
"""
from __future__ import annotations

import json
import subprocess
import time

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import Internal, Unavailable
from ..reasons import Reason

GUEST_IFNAME = "eth0"


def _ns_path(pid: int) -> str:
    return f"/proc/{pid}/ns/net"


def link_exists(ifname: str) -> bool:
    with IPRoute() as ipr:
        return bool(ipr.link_lookup(ifname=ifname))


def wait_link_gone(ifname: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while link_exists(ifname):
        if time.monotonic() > deadline:
            raise Unavailable(f"link {ifname} is still present after {timeout}s", reason=Reason.LINK_BUSY)
        time.sleep(0.02)


def create_veth(ifname: str, pid: int) -> None:
    """Create ``ifname`` on the host with its peer ``eth0`` already inside the session's netns."""
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": GUEST_IFNAME, "net_ns_pid": pid})
        except NetlinkError as exc:
            raise Unavailable(f"cannot create veth {ifname}: {exc}", reason=Reason.NETLINK,
                              detail={"errno": exc.code}) from exc


def configure_host_side(ifname: str, host_addr: str) -> None:
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise Unavailable(f"link {ifname} vanished", reason=Reason.LINK_MISSING)
        try:
            ipr.flush_addr(index=idx[0])
            ipr.addr("add", index=idx[0], address=host_addr, prefixlen=30)
            ipr.link("set", index=idx[0], state="up")
        except NetlinkError as exc:
            raise Unavailable(f"cannot configure {ifname}: {exc}", reason=Reason.NETLINK,
                              detail={"errno": exc.code}) from exc


def in_namespaces(pid: int, kinds: dict, fn):
    """Run ``fn()`` in a fresh thread that has joined ``pid``'s namespaces (``{"net": CLONE_NEWNET}``).

    Network and UTS namespaces are per thread, so a short-lived thread can join them without a
    fork and without touching the rest of the process; the thread ends with ``fn``.
    """
    import os
    import threading

    from ..host import linux

    box: dict = {}

    def run() -> None:
        try:
            for kind, flag in kinds.items():
                fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    linux.setns(fd, flag)
                finally:
                    os.close(fd)
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"ns-{pid}")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def configure_guest_side(pid: int, guest_addr: str, host_addr: str, default_route: bool = False) -> None:
    """Give the session's eth0 its slot address (replacing any address it was dumped with) and,
    for a ``nat`` session, its default route through the host side of its link."""
    gateway = host_addr if default_route else None
    in_namespaces(pid, {"net": 0x40000000}, lambda: _configure_guest_here(pid, guest_addr, gateway))


def _configure_guest_here(pid: int, guest_addr: str, gateway: str | None = None) -> None:
    try:
        with IPRoute() as ipr:
            lo = ipr.link_lookup(ifname="lo")
            if lo:
                ipr.link("set", index=lo[0], state="up")
            idx = ipr.link_lookup(ifname=GUEST_IFNAME)
            if not idx:
                raise Unavailable(f"session netns of pid {pid} has no {GUEST_IFNAME}", reason=Reason.LINK_MISSING)
            ipr.flush_addr(index=idx[0])
            ipr.addr("add", index=idx[0], address=guest_addr, prefixlen=30)
            ipr.link("set", index=idx[0], state="up")
            if gateway:
                ipr.route("replace", dst="0.0.0.0/0", gateway=gateway, oif=idx[0])
    except NetlinkError as exc:
        raise Unavailable(f"cannot configure guest side of pid {pid}: {exc}", reason=Reason.NETLINK,
                          detail={"errno": exc.code}) from exc


def delete_link(ifname: str) -> bool:
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            return False
        try:
            ipr.link("del", index=idx[0])
        except NetlinkError as exc:
            if exc.code != 19:  # ENODEV: already gone
                raise
        return True


def nft_table_exists(family: str, name: str) -> bool:
    out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return False
    for item in json.loads(out.stdout).get("nftables", []):
        t = item.get("table")
        if t and t.get("family") == family and t.get("name") == name:
            return True
    return False


def create_nft_table(name: str, links: list[str] | None = None) -> None:
    """Host root reaches sessions; sessions reach neither each other nor the host; ``nat`` sessions
    reach what their policy grants (:mod:`drums_core.session.nat` fills the ``nat_*`` sets and chains).

    Only sockets of host uid 0 (the daemon, its clients, root's tools) may send to a session's
    link: the guest server's ``/execute`` is not a way in for the host's other users. The forward
    chain drops what crosses this run's own links (``links``: every link of its slot range) unless a
    session's ``nat`` chain accepted it: rules on every ``dvh*`` link would drop the forwarded
    traffic of other runs' ``nat`` sessions (every table's base chains must accept a packet)."""
    from .netpolicy import BLOCKED

    own = ", ".join(f'"{n}"' for n in (links or []))
    links_set = f"set links {{ type ifname; elements = {{ {own} }} }}" if own else "set links { type ifname; }"
    ruleset = f"""
table inet {name} {{
    {links_set}
    set blocked {{ type ipv4_addr; flags interval; elements = {{ {", ".join(BLOCKED)} }} }}
    set guarded {{ type ifname; }}
    set nat_addrs {{ type ipv4_addr; }}
    map nat_links {{ type ifname : verdict; }}
    chain output {{
        type filter hook output priority -10; policy accept;
        oifname "dvh*" meta skuid != 0 reject
    }}
    chain forward {{
        type filter hook forward priority -10; policy accept;
        iifname vmap @nat_links
        oifname @links ip daddr @nat_addrs ct state established,related accept
        iifname @links drop
        oifname @links drop
        iifname @guarded oifname != "dvh*" drop
    }}
    chain input {{
        type filter hook input priority -10; policy accept;
        iifname "dvh*" ct state established,related accept
        iifname "dvh*" drop
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr @nat_addrs oifname != "dvh*" masquerade
    }}
}}
"""
    out = subprocess.run(["nft", "-f", "-"], input=ruleset, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise Internal(f"nft could not create table {name}: {out.stderr.strip()}", reason=Reason.NFT_FAILED)


def delete_nft_table(name: str) -> bool:
    if not nft_table_exists("inet", name):
        return False
    subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True, check=False)
    return True


def blocking_tables(own: str) -> list[str]:
    """Other runs' tables (of Drums before network policies) whose forward chain drops every ``dvh*``
    link's traffic: while one exists, no ``nat`` session on this host can reach its upstream."""
    out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return []
    names = [t["table"]["name"] for t in json.loads(out.stdout).get("nftables", [])
             if "table" in t and t["table"].get("family") == "inet" and t["table"]["name"].startswith("drums")
             and t["table"]["name"] != own]
    blocking = []
    for name in names:
        chain = subprocess.run(["nft", "-j", "list", "chain", "inet", name, "forward"], capture_output=True,
                               text=True, check=False)
        if chain.returncode != 0:
            continue
        for item in json.loads(chain.stdout).get("nftables", []):
            expr = item.get("rule", {}).get("expr", [])
            if len(expr) == 2 and "drop" in expr[1] and expr[0].get("match", {}).get("op") == "==" \
                    and expr[0]["match"].get("right") == "dvh*" \
                    and expr[0]["match"].get("left", {}).get("meta", {}).get("key") in ("iifname", "oifname"):
                blocking.append(name)
                break
    return blocking
