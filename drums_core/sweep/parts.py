"""What a ledger entry holds (:class:`Part`: a process, mount, directory, link, nft table, X11 link,
cgroup or host setting), read from the entry's data and refused (ValueError) where the sweep must not
act on it; and what an entry of a live run claims (:func:`claims_of`), for the sweep to leave alone."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..host import ownedpaths
from ..session import cgroups
from .ledger import Entry

NFT_FAMILIES = frozenset({"ip", "ip6", "inet", "arp", "bridge", "netdev"})
_NFT_NAME_RE = re.compile(r"^drums[A-Za-z0-9_.-]{0,250}$")
_IFNAME_RE = re.compile(r"^dvh[A-Za-z0-9_.-]{0,12}$")


@dataclass(frozen=True)
class Part:
    """One resource held by an entry: ``proc`` (pid, starttime), ``mount`` (path,), ``dir`` (path,),
    ``link`` (ifname, ifindex|None), ``nft`` (family, name), ``x11`` (path, target|None),
    ``cgroup`` (controller directory,)."""

    kind: str
    value: tuple


def _path_field(data: dict, key: str, *names: str) -> str:
    for name in names:
        v = data.get(name)
        if v is not None:
            return ownedpaths.check_owned_path(str(v))
    return ownedpaths.check_owned_path(key)


def int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _link_part(ifname: Any, ifindex: Any) -> Part:
    if not isinstance(ifname, str) or not _IFNAME_RE.match(ifname):
        raise ValueError(f"link name {ifname!r} is not a dvh* interface name")
    return Part("link", (ifname, int_or_none(ifindex)))


def _cgroup_parts(key: str, data: dict) -> list[Part]:
    try:
        cgroups.parse_group_name(key)
    except InvalidArgument as exc:
        raise ValueError(f"cgroup entry {key!r}: {exc.message}") from None
    if data.get("driver") not in ("v1", "v2"):
        raise ValueError(f"cgroup entry {key!r}: driver {data.get('driver')!r} is not v1 or v2")
    paths = data.get("paths")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise ValueError(f"cgroup entry {key!r}: paths must be a non-empty list of directories")
    out = []
    for p in paths:
        ownedpaths.check_owned_path(p)
        if not p.endswith("/" + key):
            raise ValueError(f"cgroup entry {key!r}: path {p!r} is not <hierarchy>/{key}")
        out.append(Part("cgroup", (p,)))
    return out


def parts_of(entry: Entry) -> list[Part]:
    """The resources ``entry`` holds. Raises ValueError for data the sweep must not act on."""
    d, k = entry.data, entry.key
    if entry.kind == "process":
        pid, start = int_or_none(d.get("pid")), int_or_none(d.get("starttime"))
        if pid is None or start is None or pid <= 1:
            raise ValueError(f"process entry {k!r} lacks a valid pid/starttime")
        return [Part("proc", (pid, start))]
    if entry.kind == "session":
        out: list[Part] = []
        pid, start = int_or_none(d.get("init_pid")), int_or_none(d.get("starttime"))
        if pid is not None and start is not None and pid > 1:
            out.append(Part("proc", (pid, start)))
        if d.get("root"):
            out.append(Part("mount", (ownedpaths.check_owned_path(str(d["root"])),)))
        if d.get("dir"):
            out.append(Part("dir", (ownedpaths.check_owned_path(str(d["dir"])),)))
        if d.get("ifname"):
            out.append(_link_part(d["ifname"], d.get("ifindex")))
        return out
    if entry.kind == "mount":
        return [Part("mount", (_path_field(d, k, "path"),))]
    if entry.kind == "dir":
        return [Part("dir", (_path_field(d, k, "path"),))]
    if entry.kind == "link":
        return [_link_part(d.get("ifname", k), d.get("ifindex"))]
    if entry.kind == "nft":
        family = d.get("family", "inet")
        name = d.get("name", d.get("table"))
        if name is None:
            family, _, name = k.rpartition("/") if "/" in k else ("inet", "", k)
            family = family or "inet"
        if family not in NFT_FAMILIES or not isinstance(name, str) or not _NFT_NAME_RE.match(name):
            raise ValueError(f"nft entry {k!r}: table {family} {name!r} is not a drums* table")
        return [Part("nft", (family, name))]
    if entry.kind == "x11link":
        target = d.get("target")
        return [Part("x11", (_path_field(d, k, "path"), str(target) if target else None))]
    if entry.kind == "cgroup":
        return _cgroup_parts(k, d)
    if entry.kind == "hostnet":
        from ..host.hostnet import parse_entry

        return [Part("hostnet", (parse_entry(k, d),))]
    if entry.kind == "snapshot":
        sdir = d.get("dir") or d.get("path")
        if not sdir:
            return []
        sdir = ownedpaths.check_owned_path(str(sdir))
        if snapshot_published(sdir):
            return []
        return [Part("dir", (sdir,))]
    return []  # op: holds nothing itself


def snapshot_published(sdir: str) -> bool:
    """A snapshot directory with a manifest or commit marker belongs to the store, not to a run."""
    return any(os.path.lexists(os.path.join(sdir, m)) for m in ("manifest.json", "COMMITTED"))


def claims_of(entry: Entry) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """(paths, link names, nft tables) an entry of a live run claims; tolerant of odd data."""
    paths: set[str] = set()
    links: set[str] = set()
    tables: set[tuple[str, str]] = set()
    try:
        parts = parts_of(entry)
    except ValueError:
        parts = []
        for v in (entry.key, *(str(x) for x in entry.data.values() if isinstance(x, str))):
            if v.startswith("/"):
                paths.add(ownedpaths.norm_path(v))
    for p in parts:
        if p.kind in ("mount", "dir", "x11", "cgroup"):
            paths.add(p.value[0])
        elif p.kind == "link":
            links.add(p.value[0])
        elif p.kind == "nft":
            tables.add(p.value)
    return paths, links, tables
