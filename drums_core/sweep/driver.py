"""The sweep over a ledger root (:func:`sweep`): the live context, then one :class:`RunSweep` per dead
run (or the named one, or one session's entries with ``select``). What one run's sweep does:
:mod:`drums_core.sweep.run`; a stopped instance's whole state: :mod:`drums_core.sweep.instance`."""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import InvalidArgument
from ..reasons import Reason
from ..host import procs
from .hostops import KILL_TIMEOUT, MAX_PASSES
from .ledger import Entry, Ledger, check_run
from .live import live_context
from .report import RunStatus, SweepReport
from .run import RunSweep

log = logging.getLogger("drums.sweep")


def clean_stale_creates(root: Path, report: SweepReport) -> None:
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
        raise InvalidArgument("sweep(select=...) needs run", reason=Reason.INVALID_ARGUMENT)
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
    live = live_context(root, [r for r in all_runs if r != run])
    report.global_errors.extend(live.errors)
    if not dry_run:
        clean_stale_creates(root, report)
    for name in targets:
        rr = RunSweep(root, name, live, dry_run=dry_run, kill_timeout=kill_timeout, max_passes=max_passes,
                       only_dead=only_dead, select=select).run_sweep()
        report.runs.append(rr)
        if rr.status == RunStatus.SKIPPED_ALIVE:
            log.debug(rr.summary())
        elif rr.errors or rr.survivors:
            log.warning(rr.summary())
        else:
            log.info(rr.summary())
    return report


def session_selector(sid: str) -> Callable[[Entry], bool]:
    """Entries of one session, as the Supervisor records them: the ``session`` and ``process`` entries
    keyed by ``sid`` and every entry whose data has ``session=sid``."""
    def select(e: Entry) -> bool:
        if e.kind in ("session", "process") and e.key == sid:
            return True
        return e.data.get("session") == sid

    return select
