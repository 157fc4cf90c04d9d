"""What a sweep reports: one :class:`RunReport` a run (its :class:`RunStatus` and counters) and the
:class:`SweepReport` over every run looked at (totals, ``--json`` document)."""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any

COUNTS = ("processes_killed", "mounts_unmounted", "cgroups_removed", "links_deleted", "nft_deleted",
          "x11links_removed", "hostnet_released", "dirs_removed", "entries_forgotten")


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
