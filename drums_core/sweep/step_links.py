"""Steps 4 to 6 of a run's sweep: the run's named things on the host: ``dvh*`` links (by recorded
index), host settings it holds (``hostnet``), its ``drums*`` nftables tables and its X11 symlinks."""
from __future__ import annotations

import os
import subprocess

from ..host import procs
from . import hostops


class LinkStep:
    """Mixin of :class:`drums_core.sweep.run.RunSweep`: steps 4-6, links, host settings, nft, X11."""

    def _links(self) -> None:
        for p in self._active("link"):
            ifname, want = p.value
            idx = hostops.link_index(ifname)
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
                if hostops.delete_link(ifname, idx):
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
            tables = hostops.nft_tables()
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
                hostops.nft_delete(family, name)
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
