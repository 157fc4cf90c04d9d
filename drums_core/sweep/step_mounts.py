"""Steps 2 and 3 of a run's sweep: unmount (``MNT_DETACH``, deepest first) what is mounted at or under
the run's recorded paths, remembering the host mounts' identities first; then empty (freeze, kill,
thaw) and remove the run's recorded cgroups."""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable

from ..host import mounttable, ownedpaths, procs
from ..session import cgroups

log = logging.getLogger("drums.sweep")

HOST_MOUNTS_KEY = "sweep/host-mounts"


class MountStep:
    """Mixin of :class:`drums_core.sweep.run.RunSweep`: step 2, mounts."""

    def _unmounted_keys(self) -> set[tuple[str, str, str]]:
        """Identities (dev, root, mount point) of the run's host mounts that may be gone from the host
        table: those this sweep unmounted, and those the engine recorded as ``mount_key``."""
        e = self.entries.get(("op", HOST_MOUNTS_KEY))
        keys = list(e.data.get("keys", [])) if e else []
        keys += [x.data.get("mount_key") for x in self.entries.values() if x.kind in ("mount", "session")]
        return {tuple(k) for k in keys if isinstance(k, list) and len(k) == 3 and all(isinstance(i, str) for i in k)}

    def _remember_host_mounts(self, hits: list[mounttable.MountInfo]) -> None:
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
                mounts = mounttable.read_mountinfo()
            except (OSError, ValueError) as exc:
                self.report.errors.append(f"cannot read /proc/self/mountinfo: {exc}")
                return
            hits = [m for m in mounttable.mounts_within(mounts, roots)
                    if not ownedpaths.within_any(m.mountpoint, claims) and m.mountpoint not in failed]
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
                    mounttable.umount_detach(m.mountpoint)
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



class CgroupStep:
    """Mixin of :class:`drums_core.sweep.run.RunSweep`: step 3, cgroups."""

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
