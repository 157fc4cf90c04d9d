"""The sweep: delete exactly what dead runs' ledgers own, and nothing else.

    python -m drums_core.sweep --ledger DIR [--run RUN] [--json] [--dry-run] [--force]

For every run whose owner is dead (or the named run), in this order, each step re-discovering
from the system so the sweep is safe to SIGKILL at any point and to rerun:

1. processes. SIGKILL, by pidfd, (a) every process with ``--tag drums:<run>`` in its argv (whole
   elements), (b) every recorded pid whose start time still matches, (c) every ``criu`` process
   (or task CRIU forked, which has no tag yet) whose argv, cwd, root or open files name one of the
   run's recorded directories or mounts (whole path components), (d) every process in a foreign
   mount namespace that holds a mount of its own under those paths, and every descendant of
   these, (e) every member of the run's recorded cgroups (``cgroup`` entries; only directories
   ``<cgroup mount>/drums/<run>/<session>``). Targets are stopped first, their descendants
   re-collected, then killed, so no child escapes by being reparented. Processes of live runs
   (their tag, their recorded pids, their owners, and everything below them), this process and
   its ancestors are never touched.
   For (d), a mount in the foreign namespace that is only a copy of a host mount (same dev, root
   and mount point as a mount of the host table, or one the sweep unmounted before, or one recorded
   as ``mount_key`` on a mount/session entry) does not make it a holder; the namespace's own root
   naming the run's paths (a session's overlay) always does.
   Discovery repeats until a pass finds nothing new (at most five passes); what is still alive
   ~5 s after SIGKILL is a *survivor* (a zombie counts as dead).
2. mounts at or under every recorded mount and directory, deepest first, ``MNT_DETACH``.
3. recorded cgroups: each group is frozen, whatever is still in it (and in groups nested under it)
   is SIGKILLed by pidfd, it is thawed, and this repeats until a pass finds it empty (at most
   ``--kill-timeout``); then every directory is removed (nested ones first, EBUSY retried), and
   ``drums/<run>`` when empty. A path that is not directly under a mounted cgroup hierarchy (or
   goes through a symlink) is never read nor removed: it is reported and its entry kept; a group
   holding a protected process is not emptied and kept.
4. recorded ``dvh*`` links. 4b. recorded host settings (``hostnet``: forwarding on a ``nat``
   upstream): the run lets go of its hold, and the last holder on the host puts the prior value back
   (:func:`drums_core.host.hostnet.release`), before its table's guard goes. 5. recorded ``drums*``
   nftables tables. 6. recorded X11 symlinks.
7. recorded directories, in two phases: rename to ``<parent>/.rm-<name>-<16 hex>`` (the new name
   written to the entry first), then delete; leftovers are finished by the next pass. A directory
   with a mount under it is never deleted.
8. each entry is forgotten once everything it holds is confirmed gone. Entries of survivors stay
   (a survivor found without an entry gets one), so a ledger holding only survivors is kept and
   reported; an empty ledger is removed.

Fail closed: a run whose ledger (owner or any entry) or whose host mount table cannot be read,
or whose entries name a path no ledger may own (``/``, ``/tmp``, ``..``), or a cgroup not named
``drums/<this run>/<session>`` with paths ending so, is reported and nothing of it is touched.
A path that holds the ledger root or something a live run has recorded, and a link, table, X11
link or cgroup a live run has recorded, is left alone and its entry forgotten (noted).

``DRUMS_FAULT_AT=<window>`` SIGKILLs the sweeping process at that point (for the fault-window
tests): ``sweep-after-kill``, ``sweep-after-unmount``, ``sweep-before-cgroup-remove`` (groups
emptied, not removed), ``sweep-after-cgroup-remove`` (removed, entries not forgotten),
``sweep-after-links``.
"""
from __future__ import annotations

import argparse
import enum
import errno
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..session import cgroups
from ..host import procs
from ..config import Instance
from ..errors import Busy, DrumsError, InvalidArgument
from .ledger import Entry, Ledger, LedgerCorrupt, check_run

log = logging.getLogger("drums.sweep")

MAX_PASSES = 5
KILL_TIMEOUT = 5.0
FAULT_WINDOWS = ("sweep-after-kill", "sweep-after-unmount", "sweep-before-cgroup-remove",
                 "sweep-after-cgroup-remove", "sweep-after-links")
NFT_FAMILIES = frozenset({"ip", "ip6", "inet", "arp", "bridge", "netdev"})
_NFT_NAME_RE = re.compile(r"^drums[A-Za-z0-9_.-]{0,250}$")
_IFNAME_RE = re.compile(r"^dvh[A-Za-z0-9_.-]{0,12}$")
RETIRE_KEY = "sweep_retiring"
HOST_MOUNTS_KEY = "sweep/host-mounts"
COUNTS = ("processes_killed", "mounts_unmounted", "cgroups_removed", "links_deleted", "nft_deleted",
          "x11links_removed", "hostnet_released", "dirs_removed", "entries_forgotten")


def _collect_into(errs: list[str]):
    def onerror(_fn: Any, path: str, exc_info: Any) -> None:
        errs.append(f"{path}: {exc_info[1]}")
    return onerror


def _fault(window: str) -> None:
    if os.environ.get("DRUMS_FAULT_AT") == window:
        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# reports


class RunStatus(enum.StrEnum):
    """What the sweep did to one run (see :class:`RunReport`); serialises as its value."""

    PENDING = "pending"
    SWEPT = "swept"
    SURVIVORS = "survivors"
    INCOMPLETE = "incomplete"
    FAILED_CLOSED = "failed-closed"
    SKIPPED_ALIVE = "skipped-alive"
    BUSY = "busy"
    ABSENT = "absent"
    DRY_RUN = "dry-run"


@dataclass
class RunReport:
    """What the sweep did (or, with ``dry_run``, would do) to one run.

    ``status``: ``swept`` (ledger removed), ``survivors`` (only survivors' entries kept),
    ``incomplete`` (errors; entries kept for the next pass), ``failed-closed`` (nothing touched),
    ``skipped-alive`` (owner alive), ``busy`` (another sweep holds it), ``absent``, ``dry-run``.
    """

    run: str
    status: RunStatus = RunStatus.PENDING
    owner: str = ""
    processes_killed: int = 0
    mounts_unmounted: int = 0
    cgroups_removed: int = 0
    links_deleted: int = 0
    nft_deleted: int = 0
    x11links_removed: int = 0
    hostnet_released: int = 0
    dirs_removed: int = 0
    entries_forgotten: int = 0
    ledger_removed: bool = False
    passes: int = 0
    survivors: list[dict] = field(default_factory=list)
    spared: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        line = (f"sweep run={self.run} status={self.status} owner={self.owner or '-'} "
                f"killed={self.processes_killed} unmounted={self.mounts_unmounted} cgroups={self.cgroups_removed} "
                f"links={self.links_deleted} hostnet={self.hostnet_released} "
                f"nft={self.nft_deleted} x11={self.x11links_removed} dirs={self.dirs_removed} "
                f"forgotten={self.entries_forgotten} survivors={len(self.survivors)} errors={len(self.errors)} "
                f"passes={self.passes} {self.seconds:.2f}s")
        if self.errors:
            line += f" first_error={self.errors[0]!r}"
        return line


@dataclass
class SweepReport:
    """Totals over every run looked at, plus one :class:`RunReport` each (``runs``)."""

    ledger_root: str
    dry_run: bool = False
    runs: list[RunReport] = field(default_factory=list)
    global_errors: list[str] = field(default_factory=list)

    def _sum(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.runs)

    @property
    def processes_killed(self) -> int:
        return self._sum("processes_killed")

    @property
    def mounts_unmounted(self) -> int:
        return self._sum("mounts_unmounted")

    @property
    def cgroups_removed(self) -> int:
        return self._sum("cgroups_removed")

    @property
    def links_deleted(self) -> int:
        return self._sum("links_deleted")

    @property
    def nft_deleted(self) -> int:
        return self._sum("nft_deleted")

    @property
    def x11links_removed(self) -> int:
        return self._sum("x11links_removed")

    @property
    def hostnet_released(self) -> int:
        return self._sum("hostnet_released")

    @property
    def dirs_removed(self) -> int:
        return self._sum("dirs_removed")

    @property
    def entries_forgotten(self) -> int:
        return self._sum("entries_forgotten")

    @property
    def ledgers_removed(self) -> int:
        return sum(1 for r in self.runs if r.ledger_removed)

    @property
    def survivors(self) -> int:
        return sum(len(r.survivors) for r in self.runs)

    @property
    def errors(self) -> int:
        return sum(len(r.errors) for r in self.runs) + len(self.global_errors)

    def counts(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in COUNTS}
        out.update(ledgers_removed=self.ledgers_removed, survivors=self.survivors, errors=self.errors)
        return out

    def is_noop(self) -> bool:
        """True when this sweep changed nothing and met no error (a second sweep must be one)."""
        c = self.counts()
        return all(v == 0 for k, v in c.items() if k != "survivors")

    def to_dict(self) -> dict[str, Any]:
        return {"ledger_root": self.ledger_root, "dry_run": self.dry_run, **self.counts(),
                "global_errors": list(self.global_errors), "runs": [asdict(r) for r in self.runs]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# what an entry holds


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
            return procs.check_owned_path(str(v))
    return procs.check_owned_path(key)


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _link_part(ifname: Any, ifindex: Any) -> Part:
    if not isinstance(ifname, str) or not _IFNAME_RE.match(ifname):
        raise ValueError(f"link name {ifname!r} is not a dvh* interface name")
    return Part("link", (ifname, _int_or_none(ifindex)))


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
        procs.check_owned_path(p)
        if not p.endswith("/" + key):
            raise ValueError(f"cgroup entry {key!r}: path {p!r} is not <hierarchy>/{key}")
        out.append(Part("cgroup", (p,)))
    return out


def parts_of(entry: Entry) -> list[Part]:
    """The resources ``entry`` holds. Raises ValueError for data the sweep must not act on."""
    d, k = entry.data, entry.key
    if entry.kind == "process":
        pid, start = _int_or_none(d.get("pid")), _int_or_none(d.get("starttime"))
        if pid is None or start is None or pid <= 1:
            raise ValueError(f"process entry {k!r} lacks a valid pid/starttime")
        return [Part("proc", (pid, start))]
    if entry.kind == "session":
        out: list[Part] = []
        pid, start = _int_or_none(d.get("init_pid")), _int_or_none(d.get("starttime"))
        if pid is not None and start is not None and pid > 1:
            out.append(Part("proc", (pid, start)))
        if d.get("root"):
            out.append(Part("mount", (procs.check_owned_path(str(d["root"])),)))
        if d.get("dir"):
            out.append(Part("dir", (procs.check_owned_path(str(d["dir"])),)))
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
        sdir = procs.check_owned_path(str(sdir))
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
                paths.add(procs.norm_path(v))
    for p in parts:
        if p.kind in ("mount", "dir", "x11", "cgroup"):
            paths.add(p.value[0])
        elif p.kind == "link":
            links.add(p.value[0])
        elif p.kind == "nft":
            tables.add(p.value)
    return paths, links, tables


# ---------------------------------------------------------------------------------------------
# host access (links, nft) kept small so tests can replace them


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


# ---------------------------------------------------------------------------------------------
# the context of one sweep call: who is alive, and what they claim


@dataclass
class _Live:
    runs: dict[str, dict] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    proc_keys: set[tuple[int, int]] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    links: set[str] = field(default_factory=set)
    tables: set[tuple[str, str]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def _sweeps_own(e: Entry) -> bool:
    """Entries a sweep wrote itself (derived CRIU dirs, survivors, unmounted-mount memory)."""
    return ((e.kind == "op" and e.key.startswith("sweep/")) or (e.kind == "dir" and "derived_from" in e.data)
            or (e.kind == "process" and e.key.startswith("survivor/")))


def _with_claims(live: _Live, entries: Iterable[Entry]) -> _Live:
    """``live`` plus what ``entries`` claim (the entries a selective sweep must leave alone)."""
    out = _Live(runs=dict(live.runs), tags=set(live.tags), proc_keys=set(live.proc_keys), paths=set(live.paths),
                links=set(live.links), tables=set(live.tables), errors=list(live.errors))
    _add_claims(out, entries)
    return out


def _add_claims(live: _Live, entries: Iterable[Entry]) -> None:
    for e in entries:
        d = e.data
        if e.kind == "process" and _int_or_none(d.get("pid")) and _int_or_none(d.get("starttime")):
            live.proc_keys.add((d["pid"], d["starttime"]))
        if e.kind == "session" and _int_or_none(d.get("init_pid")) and _int_or_none(d.get("starttime")):
            live.proc_keys.add((d["init_pid"], d["starttime"]))
        paths, links, tables = claims_of(e)
        live.paths |= paths
        live.links |= links
        live.tables |= tables


def _other_instances(root: Path) -> list[tuple[Path, str]]:
    """(ledger root, run) of every other Drums instance on this host.

    A restored process keeps the tag of the run that made its checkpoint, which may belong to
    another instance (a snapshot shipped between daemons): a live run anywhere on the host must be
    protected from this sweep, not only the runs under ``root``.
    """
    from ..config import STATE_ROOT

    out: list[tuple[Path, str]] = []
    try:
        states = [p for p in STATE_ROOT.iterdir() if p.is_dir()]
    except OSError:
        return out
    for state in states:
        other = state / "ledger"
        try:
            if other.resolve() == root.resolve() or not other.is_dir():
                continue
            out.extend((other, r) for r in Ledger.runs(other))
        except OSError:
            continue
    return out


def _live_context(root: Path, runs: Iterable[str]) -> _Live:
    live = _Live()
    own = [(root, r, True) for r in runs]
    # Another instance's live run is protected by what it recorded (pids, paths, links), not by its
    # tag: a session this run restored from that instance's snapshot carries that tag yet is ours.
    others = [(r_root, r, False) for r_root, r in _other_instances(root)]
    for run_root, run, same_root in own + others:
        led = Ledger(run_root, run)
        try:
            rec = led.owner()
            alive = led.owner_status() == "alive"
        except LedgerCorrupt as exc:
            # Unknown owner: protect its tag as if it were alive; its entries cannot be read.
            if same_root:
                live.tags.add(led.tag)
            live.errors.append(f"run {run}: {exc.message}")
            continue
        if not alive:
            continue
        live.runs[run] = rec or {}
        if same_root:
            live.tags.add(led.tag)
        live.proc_keys.add((rec["pid"], rec["starttime"]))
        try:
            entries = led.entries()
        except LedgerCorrupt as exc:
            live.errors.append(f"live run {run}: {exc.message}")
            continue
        _add_claims(live, entries)
    return live


# ---------------------------------------------------------------------------------------------
# one run


class _RunSweep:
    def __init__(self, root: Path, run: str, live: _Live, *, dry_run: bool, kill_timeout: float,
                 max_passes: int, only_dead: bool, select: Callable[[Entry], bool] | None = None) -> None:
        self.root = root
        self.ledger = Ledger(root, run)
        self.run = run
        self.live = live
        self.dry_run = dry_run
        self.kill_timeout = kill_timeout
        self.max_passes = max_passes
        self.only_dead = only_dead
        self.select = select
        self.report = RunReport(run=run)
        self.entries: dict[tuple[str, str], Entry] = {}
        self.parts: dict[tuple[str, str], list[Part]] = {}
        self.superseded: set[Part] = set()
        self.derived_dirs: set[str] = set()
        self.owner_rec: dict | None = None
        self.host_mounts: list[procs.MountInfo] = []
        self.cgroups_kept: set[tuple[str, str]] = set()
        self.hostnet_done: set[Part] = set()

    # -------------------------------------------------------------- driver
    def run_sweep(self) -> RunReport:
        t0 = time.monotonic()
        r = self.report
        try:
            if not self.ledger.exists():
                r.status = RunStatus.ABSENT
                return r
            try:
                with self.ledger.locked(blocking=False):
                    self._locked()
            except Busy:
                r.status = RunStatus.BUSY
            except DrumsError as exc:
                if r.status == RunStatus.PENDING:
                    r.status = RunStatus.ABSENT if exc.reason == "LEDGER_NOT_FOUND" else RunStatus.INCOMPLETE
                if r.status != RunStatus.ABSENT:
                    r.errors.append(str(exc))
        finally:
            r.seconds = time.monotonic() - t0
        return r

    def _fail_closed(self, why: str) -> None:
        self.report.status = RunStatus.FAILED_CLOSED
        self.report.errors.append(why)

    def _locked(self) -> None:
        r = self.report
        try:
            self.owner_rec = self.ledger.owner()
            r.owner = self.ledger.owner_status()
        except LedgerCorrupt as exc:
            r.owner = "corrupt"
            return self._fail_closed(exc.message)
        if r.owner == "alive" and self.only_dead:
            r.status = RunStatus.SKIPPED_ALIVE
            return None
        try:
            entries = self.ledger.entries()
        except LedgerCorrupt as exc:
            return self._fail_closed(exc.message)
        if self.select is not None:
            keep = [e for e in entries if not (self.select(e) or _sweeps_own(e))]
            entries = [e for e in entries if self.select(e) or _sweeps_own(e)]
            self.live = _with_claims(self.live, keep)
        for e in entries:
            try:
                self.parts[(e.kind, e.key)] = parts_of(e)
            except ValueError as exc:
                return self._fail_closed(f"{e.kind} {e.key!r}: {exc}")
            if e.kind == "cgroup" and e.key.split("/")[1] != self.run:
                return self._fail_closed(f"cgroup {e.key!r} is not a group of run {self.run}")
            self.entries[(e.kind, e.key)] = e
        try:
            host_mounts = procs.read_mountinfo()
        except (OSError, ValueError) as exc:
            return self._fail_closed(f"cannot read /proc/self/mountinfo: {exc}")
        self.host_mounts = host_mounts
        self._mark_superseded()

        self._processes(host_mounts)
        _fault("sweep-after-kill")
        self._forget_done()
        self._mounts()
        _fault("sweep-after-unmount")
        self._forget_done()
        self._cgroup_kill()
        _fault("sweep-before-cgroup-remove")
        self._cgroup_remove()
        _fault("sweep-after-cgroup-remove")
        self._forget_done()
        self._links()
        _fault("sweep-after-links")
        self._forget_done()
        self._hostnet()
        self._forget_done()
        self._nft()
        self._x11()
        self._forget_done()
        self._dirs()
        self._finish()
        return None

    # -------------------------------------------------------------- helpers
    def _all_parts(self, kind: str) -> list[tuple[tuple[str, str], Part]]:
        return [(ek, p) for ek, ps in self.parts.items() for p in ps if p.kind == kind]

    def _active(self, kind: str) -> list[Part]:
        seen: list[Part] = []
        for _, p in self._all_parts(kind):
            if p not in self.superseded and p not in seen:
                seen.append(p)
        return seen

    def _owned_roots(self) -> list[str]:
        roots = {p.value[0] for p in self._active("mount")} | {p.value[0] for p in self._active("dir")}
        return sorted(roots | self.derived_dirs)

    def _note(self, msg: str) -> None:
        if msg not in self.report.notes:
            self.report.notes.append(msg)

    def _mark_superseded(self) -> None:
        ledger_root = procs.norm_path(str(self.root.resolve()))
        for _, p in self._all_parts("mount") + self._all_parts("dir") + self._all_parts("x11"):
            path = p.value[0]
            if procs.path_within(ledger_root, path):
                self.superseded.add(p)
                self._note(f"{path} holds the ledger root: left alone")
                continue
            for claim in self.live.paths:
                if procs.path_within(claim, path):
                    self.superseded.add(p)
                    self._note(f"{path} holds {claim}, recorded by a live run: left alone")
                    break
        for _, p in self._all_parts("cgroup"):
            if p.value[0] in self.live.paths:
                self.superseded.add(p)
                self._note(f"cgroup {p.value[0]} is recorded by a live run: left alone")
        for _, p in self._all_parts("link"):
            if p.value[0] in self.live.links:
                self.superseded.add(p)
                self._note(f"link {p.value[0]} is recorded by a live run: left alone")
        for _, p in self._all_parts("nft"):
            if p.value in self.live.tables:
                self.superseded.add(p)
                self._note(f"nft table {p.value[0]} {p.value[1]} is recorded by a live run: left alone")

    # -------------------------------------------------------------- step 1: processes
    def _protected(self, table: dict[int, procs.ProcInfo]) -> set[int]:
        exact = procs.self_and_ancestors() | {1}
        if self.owner_rec and procs.is_alive(self.owner_rec["pid"], self.owner_rec["starttime"]):
            exact.add(self.owner_rec["pid"])
        roots = [p.pid for p in table.values()
                 if p.key in self.live.proc_keys or any(t in self.live.tags for t in p.tags)]
        return exact | set(roots) | procs.descendants(table, roots)

    def _holder_namespaces(self, table: dict[int, procs.ProcInfo], roots: list[str],
                           host_mounts: list[procs.MountInfo]) -> dict[str, list[int]]:
        """Foreign mount namespaces holding a mount of their own under ``roots``: ns -> pids."""
        own_ns = procs.mnt_ns("self")
        by_ns: dict[str, list[int]] = {}
        for p in table.values():
            if p.zombie:
                continue
            ns = procs.mnt_ns(p.pid)
            if ns and ns != own_ns:
                by_ns.setdefault(ns, []).append(p.pid)
        host_keys = {(m.dev, m.root, m.mountpoint) for m in host_mounts} | self._unmounted_keys()
        host_groups: set[int] = set()
        for m in host_mounts:
            host_groups |= m.shared_groups
        out: dict[str, list[int]] = {}
        for ns, pids in by_ns.items():
            mounts = None
            for pid in pids:
                try:
                    mounts = procs.read_mountinfo(pid)
                    break
                except (OSError, ValueError):
                    continue
            if not mounts:
                continue
            for m in mounts:
                if not any(procs.within_any(ref, roots) for ref in m.referenced_paths()):
                    continue
                if m.mountpoint != "/":
                    if m.peer_groups & host_groups:
                        continue  # propagated from the host: goes when the host's copy goes
                    if (m.dev, m.root, m.mountpoint) in host_keys:
                        continue  # a copy of a host mount taken when the namespace was made
                out[ns] = pids
                break
        return out

    def _discover(self, table: dict[int, procs.ProcInfo], host_mounts: list[procs.MountInfo]) -> dict[int, str]:
        # A selective sweep leaves the run's other sessions alone: they carry the same tag.
        tag = procs.run_tag(self.run) if self.select is None else None
        recorded = {p.value for p in self._active("proc")}
        roots = self._owned_roots()
        found: dict[int, str] = {}
        for p in table.values():
            if p.zombie:
                continue
            if tag is not None and tag in p.tags:
                found[p.pid] = "tag"
            elif p.key in recorded:
                found[p.pid] = "recorded"
            elif p.is_criu and roots:
                names = [a for arg in p.argv for a in procs.arg_paths(arg)] + procs.proc_paths(p.pid).all()
                hit = next((n for n in names if procs.within_any(n, roots)), None)
                if hit:
                    found[p.pid] = f"criu names {hit}"
        for path in self._cgroup_dirs():
            for pid in cgroups.members([path]):
                if pid in table and not table[pid].zombie:
                    found.setdefault(pid, f"in cgroup {path}")
        if roots:
            for ns, pids in self._holder_namespaces(table, roots, host_mounts).items():
                for pid in pids:
                    found.setdefault(pid, f"mount namespace {ns} holds a mount under the run's paths")
        for pid in procs.descendants(table, list(found)):
            if not table[pid].zombie:
                found.setdefault(pid, f"descendant of {table[pid].ppid}")
        return found

    def _derive_criu_dirs(self, table: dict[int, procs.ProcInfo], pids: Iterable[int]) -> None:
        """Record (write-ahead) the ``/tmp/.criu.*`` directories the run's CRIU processes use."""
        own_ns = procs.mnt_ns("self")
        for pid in pids:
            p = table.get(pid)
            if p is None or procs.mnt_ns(pid) != own_ns:
                continue  # paths seen from another mount namespace are not host paths
            names = procs.proc_paths(pid).all() + [a for arg in p.argv for a in procs.arg_paths(arg)]
            for n in names:
                parts = n.split("/")
                if len(parts) >= 3 and parts[1] == "tmp" and parts[2].startswith(".criu."):
                    d = f"/tmp/{parts[2]}"
                    if d in self.derived_dirs or ("dir", d) in self.entries:
                        continue
                    self.derived_dirs.add(d)
                    if not self.dry_run:
                        e = self.ledger.record("dir", d, path=d, derived_from=p.describe())
                        self.entries[("dir", d)] = e
                        self.parts[("dir", d)] = [Part("dir", (d,))]

    def _processes(self, host_mounts: list[procs.MountInfo]) -> None:
        r = self.report
        seen: set[tuple[int, int]] = set()
        killed: set[tuple[int, int]] = set()
        survivors: dict[tuple[int, int], tuple[procs.ProcInfo, str]] = {}
        spared: set[tuple[int, int]] = set()
        for _ in range(self.max_passes):
            table = procs.scan_processes()
            protected = self._protected(table)
            found = self._discover(table, host_mounts)
            for pid in [pid for pid in found if pid in protected]:
                p = table[pid]
                if p.key not in spared:
                    spared.add(p.key)
                    r.spared.append({"pid": pid, "starttime": p.starttime, "cmd": p.describe(), "why": found[pid]})
                del found[pid]
            if not found:
                break
            r.passes += 1
            keys = {table[pid].key for pid in found}
            if keys <= seen:
                break  # nothing new: only survivors of an earlier pass
            if self.dry_run:
                r.processes_killed += len(keys)
                for pid in found:
                    self._note(f"would kill {table[pid].describe()} ({found[pid]})")
                break
            seen |= keys
            self._derive_criu_dirs(table, [pid for pid, why in found.items() if why != "tag"])
            handles = self._stop_and_collect(found, protected)
            alive = kill_processes(handles, self.kill_timeout)
            alive_keys = {(h.pid, h.starttime) for h in alive}
            for h in handles:
                k = (h.pid, h.starttime)
                if k in alive_keys:
                    info = table.get(h.pid) or procs.read_proc(h.pid)
                    survivors[k] = (info, found.get(h.pid, "descendant"))
                else:
                    killed.add(k)
                    survivors.pop(k, None)
                h.close()
        for k in list(survivors):
            if not procs.is_alive(*k):
                killed.add(k)
                del survivors[k]
        r.processes_killed += len(killed)
        recorded = {p.value for p in self._active("proc")}
        for (pid, start), (info, why) in survivors.items():
            cmd = info.describe() if info else str(pid)
            r.survivors.append({"pid": pid, "starttime": start, "cmd": cmd, "why": why})
            if (pid, start) not in recorded:
                key = f"survivor/{pid}-{start}"
                e = self.ledger.record("process", key, pid=pid, starttime=start, survivor=True, why=why, cmd=cmd)
                self.entries[("process", key)] = e
                self.parts[("process", key)] = [Part("proc", (pid, start))]
            log.warning("sweep run=%s survivor pid=%d (%s): %s", self.run, pid, why, cmd)

    def _stop_and_collect(self, found: dict[int, str], protected: set[int]) -> list[procs.Handle]:
        """SIGSTOP the targets, then their descendants, until the set is closed; return the handles."""
        handles: dict[int, procs.Handle] = {}
        pending = dict(found)
        for _ in range(8):
            table = procs.scan_processes()
            for pid in pending:
                p = table.get(pid)
                if p is None or pid in handles or p.zombie:
                    continue
                h = procs.open_handle(pid, p.starttime)
                if h is not None:
                    handles[pid] = h
                    procs.send_signal(h, signal.SIGSTOP)
            table = procs.scan_processes()
            pending = {pid: f"descendant of {table[pid].ppid}"
                       for pid in procs.descendants(table, list(handles))
                       if pid not in handles and pid not in protected and not table[pid].zombie}
            if not pending:
                break
            found.update({k: v for k, v in pending.items() if k not in found})
        return list(handles.values())

    # -------------------------------------------------------------- step 2: mounts
    def _unmounted_keys(self) -> set[tuple[str, str, str]]:
        """Identities (dev, root, mount point) of the run's host mounts that may be gone from the host
        table: those this sweep unmounted, and those the engine recorded as ``mount_key``."""
        e = self.entries.get(("op", HOST_MOUNTS_KEY))
        keys = list(e.data.get("keys", [])) if e else []
        keys += [x.data.get("mount_key") for x in self.entries.values() if x.kind in ("mount", "session")]
        return {tuple(k) for k in keys if isinstance(k, list) and len(k) == 3 and all(isinstance(i, str) for i in k)}

    def _remember_host_mounts(self, hits: list[procs.MountInfo]) -> None:
        """Write-ahead: the identity of host mounts about to go, so that a rerun still knows copies
        of them in other mount namespaces (cloned while they existed) are copies, not holders."""
        known = self._unmounted_keys()
        new = {(m.dev, m.root, m.mountpoint) for m in hits} - known
        if new:
            keys = sorted(known | new)
            entry = self.ledger.record("op", HOST_MOUNTS_KEY, keys=[list(k) for k in keys])
            self.entries[("op", HOST_MOUNTS_KEY)] = entry
            self.parts.setdefault(("op", HOST_MOUNTS_KEY), [])

    def _mounts(self) -> None:
        roots = self._owned_roots()
        if not roots:
            return
        claims = sorted(self.live.paths)
        failed: dict[str, str] = {}
        for _ in range(64):
            try:
                mounts = procs.read_mountinfo()
            except (OSError, ValueError) as exc:
                self.report.errors.append(f"cannot read /proc/self/mountinfo: {exc}")
                return
            hits = [m for m in procs.mounts_within(mounts, roots)
                    if not procs.within_any(m.mountpoint, claims) and m.mountpoint not in failed]
            if not hits:
                break
            progress = False
            if not self.dry_run:
                self._remember_host_mounts(hits)
            for m in hits:
                if self.dry_run:
                    self.report.mounts_unmounted += 1
                    self._note(f"would unmount {m.mountpoint} ({m.fstype})")
                    continue
                try:
                    procs.umount_detach(m.mountpoint)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOENT):
                        failed[m.mountpoint] = str(exc)
                    continue
                self.report.mounts_unmounted += 1
                progress = True
            if self.dry_run or not progress:
                if not self.dry_run:
                    for m in hits:
                        failed.setdefault(m.mountpoint, f"{m.fstype} mount could not be unmounted")
                break
        for point, why in failed.items():
            self.report.errors.append(f"mount {point}: {why}")

    # -------------------------------------------------------------- step 3: cgroups
    def _cgroup_groups(self) -> dict[tuple[str, str], list[str]]:
        """Entry key -> its recorded controller directories (not superseded)."""
        out: dict[tuple[str, str], list[str]] = {}
        for ek, p in self._all_parts("cgroup"):
            if p not in self.superseded:
                out.setdefault(ek, []).append(p.value[0])
        return out

    def _cgroup_dirs(self) -> list[str]:
        """Recorded cgroup directories that exist and are safe to read (see :func:`cgroups.check_group_dir`)."""
        return [p for paths in self._cgroup_groups().values() for p in paths
                if os.path.isdir(p) and cgroups.check_group_dir(p, self.host_mounts) is None]

    def _cgroup_unsafe(self, ek: tuple[str, str], paths: list[str]) -> bool:
        bad = [why for p in paths if os.path.lexists(p) and (why := cgroups.check_group_dir(p, self.host_mounts))]
        for why in bad:
            self.report.errors.append(f"cgroup {ek[1]}: {why}: kept")
        return bool(bad)

    def _spare(self, table: dict[int, procs.ProcInfo]) -> Callable[[int], bool]:
        protected = self._protected(table)

        def spare(pid: int) -> bool:
            info = table.get(pid) or procs.read_proc(pid)
            return pid in protected or (info is not None and info.ppid in protected)

        return spare

    def _cgroup_kill(self) -> None:
        groups = self._cgroup_groups()
        if not groups:
            return
        spare = self._spare(procs.scan_processes())
        for ek, paths in groups.items():
            if self._cgroup_unsafe(ek, paths):
                self.cgroups_kept.add(ek)
                continue
            present = [p for p in paths if os.path.isdir(p)]
            if not present:
                continue
            if self.dry_run:
                for pid in sorted(cgroups.members(present)):
                    self._note(f"would kill pid {pid} in cgroup {ek[1]}")
                continue
            res = cgroups.kill_members(present, self.kill_timeout, spare=spare)
            self.report.processes_killed += res.killed
            for pid in res.spared:
                self.report.errors.append(f"cgroup {ek[1]} holds protected process {pid}: kept")
            known = {s["pid"] for s in self.report.survivors}
            for pid in res.left:
                info = procs.read_proc(pid)
                if pid not in known:
                    self.report.survivors.append({"pid": pid, "starttime": info.starttime if info else None,
                                                  "cmd": info.describe() if info else str(pid),
                                                  "why": f"in cgroup {ek[1]}"})
                log.warning("sweep run=%s survivor pid=%d in cgroup %s", self.run, pid, ek[1])
            if res.spared or res.left:
                self.cgroups_kept.add(ek)

    def _cgroup_remove(self) -> None:
        for ek, paths in self._cgroup_groups().items():
            if ek in self.cgroups_kept:
                continue
            present = [p for p in paths if os.path.lexists(p)]
            if self.dry_run:
                self.report.cgroups_removed += len(present)
                for p in present:
                    self._note(f"would remove cgroup {p}")
                continue
            removed, failed = cgroups.remove_dirs(present)
            self.report.cgroups_removed += len(removed)
            for d, why in failed.items():
                self.report.errors.append(f"cgroup {d}: {why}")
            if failed:
                continue
            for p in paths:   # also when a killed sweep already removed the groups themselves
                try:
                    cgroups.remove_run_dir(p)
                except OSError as exc:
                    self.report.errors.append(f"cgroup {os.path.dirname(p)}: {exc}")

    # -------------------------------------------------------------- step 4-6: links, nft, x11
    def _links(self) -> None:
        for p in self._active("link"):
            ifname, want = p.value
            idx = link_index(ifname)
            if idx is None:
                continue
            if want is not None and idx != want:
                self._note(f"link {ifname} has index {idx}, not the recorded {want}: not ours")
                continue
            if self.dry_run:
                self.report.links_deleted += 1
                self._note(f"would delete link {ifname}")
                continue
            try:
                if delete_link(ifname, idx):
                    self.report.links_deleted += 1
            except OSError as exc:
                self.report.errors.append(f"link {ifname}: {exc}")

    def _hostnet(self) -> None:
        from ..host.hostnet import sweep_release

        for p in self._active("hostnet"):
            if sweep_release(self.ledger, p.value[0], self.report, dry_run=self.dry_run):
                self.hostnet_done.add(p)

    def _nft(self) -> None:
        parts = self._active("nft")
        if not parts:
            return
        try:
            tables = nft_tables()
        except OSError as exc:
            self.report.errors.append(str(exc))
            return
        for p in parts:
            family, name = p.value
            if (family, name) not in tables:
                continue
            if self.dry_run:
                self.report.nft_deleted += 1
                self._note(f"would delete nft table {family} {name}")
                continue
            try:
                nft_delete(family, name)
                self.report.nft_deleted += 1
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.report.errors.append(str(exc))

    def _x11(self) -> None:
        for p in self._active("x11"):
            path, target = p.value
            if not os.path.islink(path):
                continue
            if target is not None and procs.readlink(path) != target:
                self._note(f"{path} points elsewhere than recorded: not ours")
                continue
            if self.dry_run:
                self.report.x11links_removed += 1
                continue
            try:
                os.unlink(path)
                self.report.x11links_removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.report.errors.append(f"x11 link {path}: {exc}")

    # -------------------------------------------------------------- step 7: dirs
    @staticmethod
    def _retire_prefix(path: str) -> tuple[str, re.Pattern[str]]:
        parent, name = os.path.split(path)
        short = name[:200]
        return parent, re.compile(r"^\.rm-" + re.escape(short) + r"-[0-9a-f]{16}$")

    def _leftovers(self, path: str, entry_keys: list[tuple[str, str]]) -> list[str]:
        parent, pattern = self._retire_prefix(path)
        out = []
        for ek in entry_keys:
            e = self.entries.get(ek)
            v = e.data.get(RETIRE_KEY) if e else None
            if isinstance(v, str) and os.path.dirname(v) == parent and pattern.match(os.path.basename(v)) \
                    and os.path.lexists(v):
                out.append(v)
        try:
            names = os.listdir(parent)
        except OSError:
            names = []
        out += [os.path.join(parent, n) for n in names if pattern.match(n)]
        return sorted(set(out))

    def _dirs(self) -> None:
        by_path: dict[str, list[tuple[str, str]]] = {}
        for ek, p in self._all_parts("dir"):
            if p not in self.superseded:
                by_path.setdefault(p.value[0], []).append(ek)
        if not by_path:
            return
        try:
            mounts = procs.read_mountinfo()
        except (OSError, ValueError) as exc:
            self.report.errors.append(f"cannot read /proc/self/mountinfo, no directory removed: {exc}")
            return
        for path in sorted(by_path, key=lambda s: s.count("/"), reverse=True):
            eks = by_path[path]
            todo = self._leftovers(path, eks)
            if os.path.lexists(path):
                busy = procs.mounts_within(mounts, [path])
                if busy:
                    self.report.errors.append(f"dir {path} still has a mount at {busy[0].mountpoint}: kept")
                    continue
                if self.dry_run:
                    self.report.dirs_removed += 1
                    self._note(f"would remove {path}")
                    continue
                parent, name = os.path.split(path)
                dest = os.path.join(parent, f".rm-{name[:200]}-{secrets.token_hex(8)}")
                try:
                    for ek in eks:
                        self.entries[ek] = self.ledger.update(ek[0], ek[1], **{RETIRE_KEY: dest})
                    os.rename(path, dest)
                except OSError as exc:
                    self.report.errors.append(f"dir {path}: rename for removal failed: {exc}")
                    continue
                todo.append(dest)
            elif self.dry_run:
                self.report.dirs_removed += len(todo)
                continue
            for victim in todo:
                if procs.mounts_within(mounts, [victim]):
                    self.report.errors.append(f"{victim} has a mount under it: kept")
                    continue
                errs: list[str] = []
                try:
                    if os.path.isdir(victim) and not os.path.islink(victim):
                        shutil.rmtree(victim, onerror=_collect_into(errs))
                    else:
                        os.unlink(victim)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    errs.append(str(exc))
                if errs or os.path.lexists(victim):
                    self.report.errors.append(f"dir {path}: removing {victim} failed: {(errs or ['still there'])[0]}")
                else:
                    self.report.dirs_removed += 1

    # -------------------------------------------------------------- step 8: forget
    def _part_done(self, p: Part, mounts: list[procs.MountInfo] | None, tables: set | None) -> bool:
        if p in self.superseded:
            return True
        if p.kind == "proc":
            return not procs.is_alive(*p.value)
        if p.kind == "mount":
            return mounts is not None and not procs.mounts_within(mounts, [p.value[0]])
        if p.kind == "dir":
            return not os.path.lexists(p.value[0]) and not self._leftovers(p.value[0], [])
        if p.kind == "cgroup":
            return not os.path.lexists(p.value[0])
        if p.kind == "link":
            idx = link_index(p.value[0])
            return idx is None or (p.value[1] is not None and idx != p.value[1])
        if p.kind == "nft":
            return tables is not None and p.value not in tables
        if p.kind == "hostnet":
            return p in self.hostnet_done
        if p.kind == "x11":
            path, target = p.value
            return not os.path.islink(path) or (target is not None and procs.readlink(path) != target)
        return False

    def _forget_done(self, final: bool = False) -> None:
        if self.dry_run:
            return
        try:
            mounts: list[procs.MountInfo] | None = procs.read_mountinfo()
        except (OSError, ValueError):
            mounts = None
        tables = None
        if any(p.kind == "nft" and p not in self.superseded for ps in self.parts.values() for p in ps):
            try:
                tables = nft_tables()
            except OSError:
                tables = None
        for ek in list(self.entries):
            kind, key = ek
            parts = self.parts.get(ek, [])
            if kind == "op" and not final:
                continue
            if kind == "op" and self.report.errors:
                continue
            if not all(self._part_done(p, mounts, tables) for p in parts):
                continue
            self.ledger.forget(kind, key)
            del self.entries[ek]
            self.parts.pop(ek, None)
            self.report.entries_forgotten += 1

    def _finish(self) -> None:
        r = self.report
        if self.dry_run:
            r.status = RunStatus.DRY_RUN
            return
        self._forget_done(final=True)
        if not self.entries and self.select is None:
            try:
                r.ledger_removed = self.ledger.remove_if_empty()
            except OSError as exc:
                r.errors.append(f"cannot remove ledger {self.ledger.path}: {exc}")
        if r.ledger_removed or (self.select is not None and not self.entries and not r.errors):
            r.status = RunStatus.SWEPT
        elif r.errors:
            r.status = RunStatus.INCOMPLETE
        elif r.survivors:
            r.status = RunStatus.SURVIVORS
        else:
            r.status = RunStatus.INCOMPLETE
            r.errors.append(f"entries left: {sorted(f'{k}:{v}' for k, v in self.entries)[:5]}")


# ---------------------------------------------------------------------------------------------
# public entry points


def _clean_stale_creates(root: Path, report: SweepReport) -> None:
    """Remove ``.tmp.<run>.*`` directories left by a Ledger.create that died before its rename."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for n in names:
        p = root / n
        if not n.startswith(".tmp.") or not p.is_dir() or p.is_symlink():
            continue
        try:
            rec = json.loads((p / "owner.json").read_text())
            alive = procs.is_alive(int(rec["pid"]), int(rec["starttime"]))
        except (OSError, ValueError, KeyError, TypeError):
            try:
                alive = time.time() - p.stat().st_mtime < 60
            except OSError:
                continue
        if alive:
            continue
        try:
            for f in os.listdir(p):
                os.unlink(p / f)
            os.rmdir(p)
        except OSError as exc:
            report.global_errors.append(f"stale ledger temp dir {p}: {exc}")


def sweep(ledger_root: Path | str, run: str | None = None, dry_run: bool = False, only_dead: bool = True, *,
          select: Callable[[Entry], bool] | None = None, kill_timeout: float = KILL_TIMEOUT,
          max_passes: int = MAX_PASSES) -> SweepReport:
    """Sweep every dead run under ``ledger_root`` (or only ``run``); see the module docstring.

    ``only_dead=False`` sweeps ``run`` even if its owner is alive (the owner process itself is
    never killed). ``dry_run`` changes nothing and reports what would be done.

    ``select`` (needs ``run``; usually with ``only_dead=False`` after :meth:`Ledger.adopt`) sweeps
    only the entries it accepts, e.g. ``session_selector(sid)`` for a half-restored session while
    the run's other sessions are adopted: processes are then found by recorded pids and paths,
    not by the run's tag, and whatever the other entries record (pids and their descendants,
    paths, links, tables) is protected. The ledger itself is kept.

    Never raises for a run's trouble: it is in the report (``errors``, ``status``). Raises
    InvalidArgument for a bad ``run`` or a ``select`` without ``run``.
    """
    root = Path(ledger_root)
    if select is not None and run is None:
        raise InvalidArgument("sweep(select=...) needs run", reason="INVALID_ARGUMENT")
    report = SweepReport(ledger_root=str(root), dry_run=dry_run)
    try:
        all_runs = Ledger.runs(root)
    except OSError as exc:
        report.global_errors.append(f"cannot list ledger root {root}: {exc}")
        log.error("sweep: cannot list ledger root %s: %s", root, exc)
        return report
    if run is not None:
        check_run(run)
        targets = [run]
    else:
        targets = all_runs
    live = _live_context(root, [r for r in all_runs if r != run])
    report.global_errors.extend(live.errors)
    if not dry_run:
        _clean_stale_creates(root, report)
    for name in targets:
        rr = _RunSweep(root, name, live, dry_run=dry_run, kill_timeout=kill_timeout, max_passes=max_passes,
                       only_dead=only_dead, select=select).run_sweep()
        report.runs.append(rr)
        if rr.status == RunStatus.SKIPPED_ALIVE:
            log.debug(rr.summary())
        elif rr.errors or rr.survivors:
            log.warning(rr.summary())
        else:
            log.info(rr.summary())
    return report


def sweep_instance(instance: Instance) -> dict:
    """What a stopped instance left on the host, gone: its dead runs swept (:func:`sweep`), its state
    tmpfs unmounted, its daemon files (``instance.daemon_files``) and its emptied state directory
    removed. Its log stays, to be read. Only once its daemon has stopped: under a live daemon this
    would unmount the state it works in. Returns ``{"sweep": <report, {} without ledgers>, "unmounted": n}``.
    """
    from ..session.rootfs import is_mountpoint, unmount_tree

    report = sweep(instance.ledger_root) if instance.ledger_root.exists() else None
    state = instance.state_dir
    unmounted = unmount_tree(state) if state.exists() and is_mountpoint(state) else 0
    for path in instance.daemon_files:
        path.unlink(missing_ok=True)
    try:
        state.rmdir()
    except OSError:
        pass
    return {"sweep": report.to_dict() if report is not None else {}, "unmounted": unmounted}


def session_selector(sid: str) -> Callable[[Entry], bool]:
    """Entries of one session, as the Supervisor records them: the ``session`` and ``process`` entries
    keyed by ``sid`` and every entry whose data has ``session=sid``."""
    def select(e: Entry) -> bool:
        if e.kind in ("session", "process") and e.key == sid:
            return True
        return e.data.get("session") == sid

    return select


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m drums_core.sweep",
                                 description="Delete what dead Drums runs' ledgers own (and nothing else).")
    ap.add_argument("--ledger", required=True, help="ledger root, e.g. /run/drums/default/ledger")
    ap.add_argument("--run", help="sweep only this run")
    ap.add_argument("--force", action="store_true", help="with --run: sweep it even if its owner is alive")
    ap.add_argument("--dry-run", action="store_true", help="change nothing; report what would be done")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    ap.add_argument("--kill-timeout", type=float, default=KILL_TIMEOUT, help="seconds to wait for killed processes")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.force and not args.run:
        ap.error("--force needs --run")
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        report = sweep(args.ledger, run=args.run, dry_run=args.dry_run, only_dead=not args.force,
                       kill_timeout=args.kill_timeout)
    except DrumsError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(indent=2))
    elif not any(r.status != RunStatus.SKIPPED_ALIVE for r in report.runs):
        print(f"sweep: nothing to do under {args.ledger}", file=sys.stderr)
    if report.errors:
        return 1
    return 3 if report.survivors else 0


if __name__ == "__main__":
    sys.exit(main())
