"""Ownership and clean-up: the write-ahead ledger (:mod:`.ledger`) and the sweep that deletes exactly
what dead runs' ledgers own. ``python -m drums_core.sweep --ledger DIR`` runs the sweep (:mod:`.cli`).

The sweep's modules: :mod:`.driver` (:func:`sweep` over a ledger root), :mod:`.instance` (:func:`sweep_instance`),
:mod:`.run` (one run's sweep, its steps in order: :mod:`.step_processes`, :mod:`.step_mounts`,
:mod:`.step_links`, :mod:`.step_dirs`), :mod:`.parts` (what an entry holds), :mod:`.live` (what live
runs claim), :mod:`.hostops` (links, nft tables, killing; fault windows), :mod:`.report`.
The name ``sweep`` in this package is the function.
"""
from __future__ import annotations

from .cli import main
from .driver import session_selector, sweep
from .instance import sweep_instance
from .report import RunReport, RunStatus, SweepReport

__all__ = ["sweep", "sweep_instance", "session_selector", "RunReport", "RunStatus", "SweepReport", "main"]
