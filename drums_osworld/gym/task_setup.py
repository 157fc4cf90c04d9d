"""A task's setup on a ``drums/Desktop-v0`` desktop, journaled in its guest, and the report of it.

The guest keeps the journal (:mod:`drums_osworld.setup_journal`), so a desktop restored from a
saved state still reports the setup that state was made with (:func:`read_report`).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from drums_core.config import SESSION_PASSWORD

if TYPE_CHECKING:
    from pathlib import Path

    from ..desktop import Desktop
    from ..setup_journal import Journal, SetupReport
    from ..tasks import Task

log = logging.getLogger("drums.osworld.gym")

__all__ = ["begin_postconfig", "read_report", "run"]


def _journal(desktop: Desktop) -> Journal:
    from ..setup_journal import Journal

    return Journal(desktop.guest.base_url)


def _image(desktop: Desktop) -> str | None:
    try:
        return str(desktop.session["spec"]["image"])
    except (KeyError, TypeError):
        return None


def read_report(desktop: Desktop, task: Task | None) -> SetupReport:
    """How the last setup on ``desktop`` went (a failed one names the apps its image lacks)."""
    from ..setup_journal import missing_apps_for

    journal = _journal(desktop)
    try:
        report = journal.read(label="setup")
    finally:
        journal.close()
    if not report.ok:
        report.missing_apps = missing_apps_for(task.raw if task else None, _image(desktop))
    return report


def run(desktop: Desktop, task: Task, *, task_cache: Path, screen_size: tuple[int, int],
        strict: bool) -> SetupReport:
    """The task's setup on ``desktop``, journaled in its guest; raises what run_setup raises (after
    noting it), and :class:`~drums_osworld.setup_journal.SetupFailed` when ``strict`` and a step failed."""
    from ..evaluation import SetupError, run_setup
    from ..setup_journal import SetupFailed, SetupReport, missing_apps_for

    journal = _journal(desktop)
    try:
        mark = journal.begin("setup") if task.config else None
        try:
            run_setup(task.config, desktop.guest, task_cache_dir=task_cache,
                      client_password=SESSION_PASSWORD, screen_size=screen_size,
                      on_step=journal.step if mark is not None else None)
        except SetupError as exc:
            if mark is not None:
                journal.note(exc.step_index, exc.step_type, str(exc))
            raise
        if mark is None:
            return SetupReport(label="no setup")
        report = journal.read(mark)
    finally:
        journal.close()
    if not report.ok:
        report.missing_apps = missing_apps_for(task.raw, _image(desktop))
        log.warning("task %s: %s", task.id, report.describe())
        if strict:
            raise SetupFailed(report, task.id)
    return report


def begin_postconfig(desktop: Desktop) -> None:
    """Open a ``postconfig`` section of the journal, so postconfig calls do not land in the setup's record."""
    journal = _journal(desktop)
    journal.begin("postconfig")
    journal.close()
