"""A probe of what Drums-looking state the host holds, for tests, benchmarks and the fault-window harness.

:func:`snapshot_host_state` returns plain JSON data; :func:`run_leaks` turns it into the list
of problems criteria P1-P3 care about for one run; :func:`instance_leaks` lists what one
daemon instance left anywhere on the host. Read-only: it never changes the host.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..session import cgroups
from . import mounttable, ownedpaths, procs
from ..config import X11_DIR, Instance, display_number, host_ifname, nft_table_name
from .hostnet import held_records

CRIU_TMP_PREFIX = "/tmp/.criu."


def _proc_dict(p: procs.ProcInfo, why: str | None = None) -> dict:
    out = {"pid": p.pid, "ppid": p.ppid, "starttime": p.starttime, "state": p.state, "comm": p.comm,
           "cmd": p.describe()}
    if why:
        out["why"] = why
    return out


def _norm_dirs(run_dirs: Mapping[str, Iterable[str | os.PathLike]] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for run, dirs in (run_dirs or {}).items():
        out[run] = sorted({ownedpaths.norm_path(os.fspath(d)) for d in dirs})
    return out


def _nft_drums_tables(errors: list[str]) -> list[dict]:
    try:
        res = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, timeout=15)
        items = json.loads(res.stdout or "{}").get("nftables", []) if res.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        errors.append(f"nft: {exc}")
        return []
    if items is None:
        errors.append(f"nft: {res.stderr.strip()}")
        return []
    return sorted(({"family": i["table"]["family"], "name": i["table"]["name"]} for i in items
                   if "table" in i and i["table"]["name"].startswith("drums")),
                  key=lambda t: (t["family"], t["name"]))


def snapshot_host_state(run_dirs: Mapping[str, Iterable[str | os.PathLike]] | None = None, *,
                        x11_dir: str | os.PathLike = X11_DIR) -> dict:
    """What the host holds that a Drums run could have left behind.

    ``run_dirs`` maps run ids to their directories (state dir of the run, session dirs...).
    Returns::

        {"tagged":   {run: [proc...]},     live processes with --tag drums:<run>, for every run seen
         "criu":     [proc...],            live criu processes; "runs" lists whose dirs they name
         "ns_holders": {run: [proc...]},   processes of foreign mount namespaces with a mount under a run's dirs
         "mounts":   {run: [mount...]},    host mounts at or under each run's dirs
         "criu_mounts": [mount...],        host mounts under /tmp/.criu.*
         "links":    [name...],            dvh* links of the host namespace
         "nft_tables": [{family, name}],   tables whose name starts with "drums"
         "x11_links": [{path, target}],    symlinks in /tmp/.X11-unix
         "cgroups":  {run: [path...]},     Drums cgroups (``<hierarchy>/drums/<run>/...``) of every run
         "hostnet":  [record...],          host settings Drums holds for nat sessions (drums_core.host.hostnet:
                                           ifname, prior, holders {run: ledger root}, now)
         "errors":   [str...]}             what could not be read
    """
    dirs = _norm_dirs(run_dirs)
    errors: list[str] = []
    table = procs.scan_processes()
    tagged: dict[str, list[dict]] = {}
    criu: list[dict] = []
    for p in table.values():
        if p.zombie:
            continue
        for tag in p.tags:
            if tag.startswith(procs.TAG_PREFIX):
                tagged.setdefault(tag[len(procs.TAG_PREFIX):], []).append(_proc_dict(p))
        if p.is_criu:
            names = [a for arg in p.argv for a in ownedpaths.arg_paths(arg)] + procs.proc_paths(p.pid).all()
            d = _proc_dict(p)
            d["runs"] = sorted(run for run, ds in dirs.items() if any(ownedpaths.within_any(n, ds) for n in names))
            criu.append(d)

    try:
        host_mounts = mounttable.read_mountinfo()
    except (OSError, ValueError) as exc:
        errors.append(f"mountinfo: {exc}")
        host_mounts = []
    mounts = {run: [{"mountpoint": m.mountpoint, "fstype": m.fstype, "source": m.source}
                    for m in mounttable.mounts_within(host_mounts, ds)] for run, ds in dirs.items()}
    criu_mounts = [{"mountpoint": m.mountpoint, "fstype": m.fstype, "source": m.source}
                   for m in host_mounts if m.mountpoint.startswith(CRIU_TMP_PREFIX)]

    own_ns = procs.mnt_ns("self")
    # a namespace that only holds a copy of a host mount (same identity, or a peer of it) is not a holder
    host_keys = {(m.dev, m.root, m.mountpoint) for m in host_mounts}
    host_groups = {g for m in host_mounts for g in m.shared_groups}
    holders: dict[str, list[dict]] = {}
    seen_ns: dict[str, list[mounttable.MountInfo] | None] = {}
    for p in table.values():
        if p.zombie:
            continue
        ns = procs.mnt_ns(p.pid)
        if not ns or ns == own_ns:
            continue
        if ns not in seen_ns:
            try:
                seen_ns[ns] = mounttable.read_mountinfo(p.pid)
            except (OSError, ValueError):
                seen_ns[ns] = None
        ns_mounts = seen_ns[ns]
        if not ns_mounts:
            continue
        for run, ds in dirs.items():
            if any(any(ownedpaths.within_any(ref, ds) for ref in m.referenced_paths())
                   and (m.mountpoint == "/" or ((m.dev, m.root, m.mountpoint) not in host_keys
                                                and not m.peer_groups & host_groups))
                   for m in ns_mounts):
                holders.setdefault(run, []).append(_proc_dict(p))

    try:
        links = sorted(n for n in os.listdir("/sys/class/net") if n.startswith("dvh"))
    except OSError as exc:
        errors.append(f"links: {exc}")
        links = []

    x11 = []
    try:
        for name in sorted(os.listdir(x11_dir)):
            path = os.path.join(x11_dir, name)
            if os.path.islink(path):
                x11.append({"path": path, "target": procs.readlink(path)})
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(f"x11: {exc}")

    return {"tagged": tagged, "criu": criu, "ns_holders": holders, "mounts": mounts, "criu_mounts": criu_mounts,
            "links": links, "nft_tables": _nft_drums_tables(errors), "x11_links": x11,
            "cgroups": _cgroups(host_mounts, errors), "hostnet": held_records(), "errors": errors}


def _cgroups(mounts: list[mounttable.MountInfo], errors: list[str]) -> dict[str, list[str]]:
    try:
        return cgroups.list_run_groups(mounts)
    except OSError as exc:
        errors.append(f"cgroups: {exc}")
        return {}


def run_leaks(state: dict, run: str, *, links: Iterable[str] = (), nft_tables: Iterable[str] = (),
              x11_links: Iterable[str] = ()) -> list[str]:
    """Problems (P1-P3) ``state`` shows for ``run``; ``links``/``nft_tables``/``x11_links`` name the
    run's own (e.g. from its ledger before the sweep). Empty when the run left nothing."""
    out: list[str] = []
    out += [f"process {p['cmd']}" for p in state["tagged"].get(run, [])]
    out += [f"criu {p['cmd']}" for p in state["criu"] if run in p.get("runs", [])]
    out += [f"mount-namespace holder {p['cmd']}" for p in state["ns_holders"].get(run, [])]
    out += [f"mount {m['mountpoint']} ({m['fstype']})" for m in state["mounts"].get(run, [])]
    out += [f"criu mount {m['mountpoint']}" for m in state["criu_mounts"]]
    out += [f"link {n}" for n in set(links) & set(state["links"])]
    names = {t["name"] for t in state["nft_tables"]}
    out += [f"nft table {n}" for n in set(nft_tables) & names]
    paths = {x["path"] for x in state["x11_links"]}
    out += [f"x11 link {p}" for p in set(map(str, x11_links)) & paths]
    out += [f"cgroup {p}" for p in state.get("cgroups", {}).get(run, [])]
    out += [f"hostnet forwarding on {r.get('ifname')} (now {r.get('now')}, was {r.get('prior')})"
            for r in state.get("hostnet", []) if run in (r.get("holders") or {})]
    return out


def ledger_claims(ledger_root: str | Path, run: str) -> dict:
    """Links, nft tables and X11 links a run's ledger names (read before a sweep, for :func:`run_leaks`)."""
    from ..sweep.ledger import Ledger
    from ..sweep.parts import parts_of

    out: dict[str, list[str]] = {"links": [], "nft_tables": [], "x11_links": [], "paths": []}
    for e in Ledger(ledger_root, run).entries():
        try:
            parts = parts_of(e)
        except ValueError:
            continue
        for p in parts:
            if p.kind == "link":
                out["links"].append(p.value[0])
            elif p.kind == "nft":
                out["nft_tables"].append(p.value[1])
            elif p.kind == "x11":
                out["x11_links"].append(p.value[0])
            elif p.kind in ("mount", "dir"):
                out["paths"].append(p.value[0])
    return {k: sorted(set(v)) for k, v in out.items()}


def instance_leaks(instance: Instance) -> dict[str, list]:
    """Everything on this host that belongs to ``instance``, by kind; every list is empty when it
    left nothing. Its runs are named ``<instance>-<12 hex>`` (processes are tagged ``drums:<run>``,
    nftables tables are ``drums_<run>`` with ``-`` as ``_``, cut at 60 characters, cgroups are
    ``<hierarchy>/drums/<run>/...``); its links and X11 links are those of its slot range; its
    mounts are at or under its state directory; ``hostnet`` lists the host settings its runs still
    hold for ``nat`` sessions (forwarding on an upstream, see :mod:`drums_core.host.hostnet`).
    """
    run_re = re.compile(re.escape(instance.name) + r"-[0-9a-f]{12}")
    table_prefix = nft_table_name(instance.name + "-")        # every table of its runs starts so
    table_re = re.compile(re.escape(table_prefix) + r"[0-9a-f]{12}")
    cut = len(nft_table_name(instance.name + "-" + "0" * 12)) == 60   # its names are cut: match what is left

    def own_table(name: str) -> bool:
        return bool(table_re.fullmatch(name)) or (cut and len(name) == 60 and name.startswith(table_prefix))

    slots = range(instance.slot_base, instance.slot_base + instance.slot_count)
    state_dir = str(instance.state_dir)
    processes = [[p.pid, tag] for p in procs.scan_processes().values() if not p.zombie
                 for tag in p.tags if tag.startswith("drums:") and run_re.fullmatch(tag[len("drums:"):])]
    errors: list[str] = []
    try:
        table = mounttable.read_mountinfo()
    except (OSError, ValueError) as exc:
        errors.append(f"mountinfo: {exc}")
        table = []
    mounts = [m.mountpoint for m in mounttable.mounts_within(table, [state_dir])]
    groups = sorted(p for run, paths in _cgroups(table, errors).items() if run_re.fullmatch(run) for p in paths)
    own_links = {host_ifname(s) for s in slots}
    links = sorted(n for n in os.listdir("/sys/class/net") if n in own_links)
    tables = [t["name"] for t in _nft_drums_tables(errors) if own_table(t["name"])]
    own_x11 = {f"X{display_number(s)}" for s in slots}
    try:
        x11 = sorted(n for n in os.listdir(X11_DIR) if n in own_x11 and os.path.islink(os.path.join(X11_DIR, n)))
    except FileNotFoundError:
        x11 = []
    hostnet = [f"forwarding on {r.get('ifname')} (now {r.get('now')}, was {r.get('prior')}) held by {run}"
               for r in held_records() for run in (r.get("holders") or {}) if run_re.fullmatch(run)]
    return {"processes": processes, "mounts": mounts, "links": links, "nft": tables, "x11links": x11,
            "cgroups": groups, "hostnet": hostnet, "probe_errors": errors}
