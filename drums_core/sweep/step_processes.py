"""Step 1 of a run's sweep: find the run's processes (tag, recorded pids, CRIU helpers naming the run's
paths, holders of its mounts in other mount namespaces, members of its cgroups, and their
descendants), stop them with their children, SIGKILL them by pidfd, and record survivors."""
from __future__ import annotations

import logging
import signal
from collections.abc import Iterable

from ..host import mounttable, ownedpaths, procs
from ..session import cgroups
from . import hostops
from .parts import Part

log = logging.getLogger("drums.sweep")


class ProcessStep:
    """Mixin of :class:`drums_core.sweep.run.RunSweep`: step 1, processes."""

    def _protected(self, table: dict[int, procs.ProcInfo]) -> set[int]:
        exact = procs.self_and_ancestors() | {1}
        if self.owner_rec and procs.is_alive(self.owner_rec["pid"], self.owner_rec["starttime"]):
            exact.add(self.owner_rec["pid"])
        roots = [p.pid for p in table.values()
                 if p.key in self.live.proc_keys or any(t in self.live.tags for t in p.tags)]
        return exact | set(roots) | procs.descendants(table, roots)

    def _holder_namespaces(self, table: dict[int, procs.ProcInfo], roots: list[str],
                           host_mounts: list[mounttable.MountInfo]) -> dict[str, list[int]]:
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
                    mounts = mounttable.read_mountinfo(pid)
                    break
                except (OSError, ValueError):
                    continue
            if not mounts:
                continue
            for m in mounts:
                if not any(ownedpaths.within_any(ref, roots) for ref in m.referenced_paths()):
                    continue
                if m.mountpoint != "/":
                    if m.peer_groups & host_groups:
                        continue  # propagated from the host: goes when the host's copy goes
                    if (m.dev, m.root, m.mountpoint) in host_keys:
                        continue  # a copy of a host mount taken when the namespace was made
                out[ns] = pids
                break
        return out

    def _discover(self, table: dict[int, procs.ProcInfo], host_mounts: list[mounttable.MountInfo]) -> dict[int, str]:
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
                names = [a for arg in p.argv for a in ownedpaths.arg_paths(arg)] + procs.proc_paths(p.pid).all()
                hit = next((n for n in names if ownedpaths.within_any(n, roots)), None)
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
            names = procs.proc_paths(pid).all() + [a for arg in p.argv for a in ownedpaths.arg_paths(arg)]
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

    def _processes(self, host_mounts: list[mounttable.MountInfo]) -> None:
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
            alive = hostops.kill_processes(handles, self.kill_timeout)
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
