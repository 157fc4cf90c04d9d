"""The sweep of one run (:class:`RunSweep`): its steps in order, the entries it forgets, its status.

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

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import Busy, DrumsError
from ..reasons import Reason
from ..host import mounttable, ownedpaths, procs
from . import hostops
from .hostops import fault
from .ledger import Entry, Ledger, LedgerCorrupt
from .live import Live, sweeps_own, with_claims
from .parts import Part, parts_of
from .report import RunReport, RunStatus
from .step_dirs import DirStep
from .step_links import LinkStep
from .step_mounts import CgroupStep, MountStep
from .step_processes import ProcessStep


class RunSweep(ProcessStep, MountStep, CgroupStep, LinkStep, DirStep):
    """Sweeps one run of a ledger root; :meth:`run_sweep` returns its :class:`RunReport`."""

    def __init__(self, root: Path, run: str, live: Live, *, dry_run: bool, kill_timeout: float,
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
        self.host_mounts: list[mounttable.MountInfo] = []
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
                    r.status = RunStatus.ABSENT if exc.reason == Reason.LEDGER_NOT_FOUND else RunStatus.INCOMPLETE
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
            keep = [e for e in entries if not (self.select(e) or sweeps_own(e))]
            entries = [e for e in entries if self.select(e) or sweeps_own(e)]
            self.live = with_claims(self.live, keep)
        for e in entries:
            try:
                self.parts[(e.kind, e.key)] = parts_of(e)
            except ValueError as exc:
                return self._fail_closed(f"{e.kind} {e.key!r}: {exc}")
            if e.kind == "cgroup" and e.key.split("/")[1] != self.run:
                return self._fail_closed(f"cgroup {e.key!r} is not a group of run {self.run}")
            self.entries[(e.kind, e.key)] = e
        try:
            host_mounts = mounttable.read_mountinfo()
        except (OSError, ValueError) as exc:
            return self._fail_closed(f"cannot read /proc/self/mountinfo: {exc}")
        self.host_mounts = host_mounts
        self._mark_superseded()

        self._processes(host_mounts)
        fault("sweep-after-kill")
        self._forget_done()
        self._mounts()
        fault("sweep-after-unmount")
        self._forget_done()
        self._cgroup_kill()
        fault("sweep-before-cgroup-remove")
        self._cgroup_remove()
        fault("sweep-after-cgroup-remove")
        self._forget_done()
        self._links()
        fault("sweep-after-links")
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
        ledger_root = ownedpaths.norm_path(str(self.root.resolve()))
        for _, p in self._all_parts("mount") + self._all_parts("dir") + self._all_parts("x11"):
            path = p.value[0]
            if ownedpaths.path_within(ledger_root, path):
                self.superseded.add(p)
                self._note(f"{path} holds the ledger root: left alone")
                continue
            for claim in self.live.paths:
                if ownedpaths.path_within(claim, path):
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

    # -------------------------------------------------------------- step 8: forget
    def _part_done(self, p: Part, mounts: list[mounttable.MountInfo] | None, tables: set | None) -> bool:
        if p in self.superseded:
            return True
        if p.kind == "proc":
            return not procs.is_alive(*p.value)
        if p.kind == "mount":
            return mounts is not None and not mounttable.mounts_within(mounts, [p.value[0]])
        if p.kind == "dir":
            return not os.path.lexists(p.value[0]) and not self._leftovers(p.value[0], [])
        if p.kind == "cgroup":
            return not os.path.lexists(p.value[0])
        if p.kind == "link":
            idx = hostops.link_index(p.value[0])
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
            mounts: list[mounttable.MountInfo] | None = mounttable.read_mountinfo()
        except (OSError, ValueError):
            mounts = None
        tables = None
        if any(p.kind == "nft" and p not in self.superseded for ps in self.parts.values() for p in ps):
            try:
                tables = hostops.nft_tables()
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
