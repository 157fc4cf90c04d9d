"""Step 7 of a run's sweep: the run's recorded directories go in two phases, renamed to
``<parent>/.rm-<name>-<16 hex>`` (the new name written to the entry first), then deleted; leftovers
of a killed sweep are finished. A directory with a mount under it is never deleted."""
from __future__ import annotations

import os
import re
import secrets
import shutil

from ..host import mounttable
from .hostops import collect_into

RETIRE_KEY = "sweep_retiring"


class DirStep:
    """Mixin of :class:`drums_core.sweep.run.RunSweep`: step 7, directories."""

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
            mounts = mounttable.read_mountinfo()
        except (OSError, ValueError) as exc:
            self.report.errors.append(f"cannot read /proc/self/mountinfo, no directory removed: {exc}")
            return
        for path in sorted(by_path, key=lambda s: s.count("/"), reverse=True):
            eks = by_path[path]
            todo = self._leftovers(path, eks)
            if os.path.lexists(path):
                busy = mounttable.mounts_within(mounts, [path])
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
                if mounttable.mounts_within(mounts, [victim]):
                    self.report.errors.append(f"{victim} has a mount under it: kept")
                    continue
                errs: list[str] = []
                try:
                    if os.path.isdir(victim) and not os.path.islink(victim):
                        shutil.rmtree(victim, onerror=collect_into(errs))
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
